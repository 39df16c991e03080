"""Read scalars back from TensorBoard event files (shared by the tests)."""

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} of every scalar in the event files of `run_dir`."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

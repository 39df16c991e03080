"""How far the first minibatch's probability ratio is from 1: the rollout's and the update's forward passes agree?

    python benchmark/first_ratio.py ppo_atari_envpool.py --total-timesteps 16384            # float32
    python benchmark/first_ratio.py ppo_atari_envpool.py --total-timesteps 16384 --bf16     # bfloat16 autocast

Runs the script in this process with its ppo_loss observed. The first minibatch of each update sees the weights the
rollout used, so its ratio is 1 up to the rounding of the two forward passes (batch sizes differ, so do kernels);
prints that gap (mean and max of |ratio - 1|) and the clip fraction of all minibatches."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from _common import checked_args, exit_with, find_script, load_script, script_error  # noqa: E402  (tools/_common.py)


def main(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return
    if not argv or argv[0].startswith("-"):
        sys.exit("error: give a variant script first, e.g. python benchmark/first_ratio.py ppo_atari_envpool.py --bf16")
    script = find_script(argv[0])
    error = script_error(script, needs=("Args", "check_args", "main", "ppo_loss"))
    checked, error = (None, error) if error else checked_args(script, argv[1:])
    if not error and checked.target_kl is not None:
        error = "--target-kl can cut an update short, and the next update's first minibatch would be miscounted: drop it"
    if error:
        sys.exit(f"error: {error}")
    module = load_script(script)
    loss, first, clipfracs, seen = module.ppo_loss, [], [], {"n": 0}
    per_update = None

    def observed(newlogprob, entropy, newvalue, oldlogprob, *args, **kwargs):
        out = loss(newlogprob, entropy, newvalue, oldlogprob, *args, **kwargs)
        if seen["n"] % per_update == 0:  # the update's first minibatch
            gap = ((newlogprob - oldlogprob).detach().exp() - 1).abs()
            first.append((gap.mean().item(), gap.max().item()))
        clipfracs.append(out[-1].item())
        seen["n"] += 1
        return out

    module.ppo_loss = observed
    per_update = checked.num_minibatches * checked.update_epochs  # minibatches of an update (no --target-kl here)
    sys.argv = [str(script), *argv[1:], "--exp-name", "first_ratio"]
    try:
        module.main()
    except SystemExit as e:
        if e.code:
            raise
    gaps = np.array(first)
    print(
        f"{len(gaps)} updates: first minibatch |ratio - 1| mean {gaps[:, 0].mean():.2e}, max {gaps[:, 1].max():.2e}; "
        f"clip fraction over all minibatches {np.mean(clipfracs):.4f}"
    )


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])

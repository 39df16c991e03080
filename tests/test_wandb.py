"""--track, checked in wandb's offline mode by reading the offline run folders (wandb/offline-run-*/): the run carries
its own script, its videos at their steps, its group and tags; a resumed run continues the same wandb run with no
duplicated points; an evaluation gets a run of its own; benchmark/ablate.py groups and tags its runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_dirs, run_python

pytest.importorskip("wandb")
from wandbutil import offline_runs  # noqa: E402

OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(*args, cwd, script="ppo.py", env=None):
    res = run_python(ROOT / script, *args, cwd=cwd, env={**os.environ, **OFFLINE, **(env or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def steps_of(wandb_run, key):
    return [row["global_step"] for row in wandb_run["rows"] if key in row]


def test_a_tracked_run_holds_its_script_videos_group_and_tags(tmp_path):
    # started from another folder than the script's (the case where wandb saved no code)
    run("--total-timesteps", 1024, "--track", "--capture-video", "--wandb-group", "g1", "--wandb-tags", "a", "b", cwd=tmp_path)
    (tracked,) = offline_runs(tmp_path)
    (run_dir,) = run_dirs(tmp_path)
    assert tracked["name"] == run_dir.name and (tracked["group"], tracked["tags"]) == ("g1", ["a", "b"])
    assert "code/ppo.py" in tracked["files"] and tracked["config"]["_wandb"]["code_path"] == "code/ppo.py"
    (folder,) = Path(tmp_path, "wandb").glob("offline-run-*")
    assert (folder / "files/code/ppo.py").read_text() == (ROOT / "ppo.py").read_text()  # the very file that ran
    assert steps_of(tracked, "losses/value_loss") == [512, 1024]  # TensorBoard's scalars still synced
    recorded = sorted(Path(tmp_path, "videos", run_dir.name).glob("*.mp4"))
    assert len(recorded) >= 3  # RecordVideo's episodes 0, 1, 8 of the first env, and the last, cut short by close()
    assert len(tracked["videos"]) == len(recorded)  # each video once
    assert all(row["global_step"] in (512, 1024) for row in tracked["videos"])  # at the iteration its episode ended
    assert steps_of(tracked, "videos")[0] == 512  # episode 0 ends in the first rollout
    for row in tracked["videos"]:
        assert row["videos"]["_type"] == "video-file" and (folder / "files" / row["videos"]["path"]).is_file()


def test_without_track_no_wandb_run(tmp_path):
    run("--total-timesteps", 512, "--wandb-group", "g1", cwd=tmp_path)
    assert not Path(tmp_path, "wandb").exists()


def test_a_resumed_run_continues_the_same_wandb_run_without_duplicated_points(tmp_path):
    group = {"WANDB_RUN_GROUP": "from-env", "WANDB_TAGS": "t1,t2"}  # wandb's own variables, where no flag is given
    run("--total-timesteps", 512, "--save-model", "--track", cwd=tmp_path, env=group)
    (run_dir,) = run_dirs(tmp_path)
    run("--resume", run_dir / "checkpoint.pt", "--total-timesteps", 1536, "--track", cwd=tmp_path)
    first, resumed = offline_runs(tmp_path)
    assert (first["group"], first["tags"]) == ("from-env", ["t1", "t2"])
    assert first["id"] == resumed["id"] and resumed["name"] == run_dir.name
    assert steps_of(first, "losses/value_loss") == [512]
    assert steps_of(resumed, "losses/value_loss") == [1024, 1536]  # from the checkpoint on, nothing twice
    # an evaluation of the checkpoint: a run of its own, labelled, with each episode's return and its videos
    run("--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 2, "--capture-video", "--track", cwd=tmp_path)
    evaluation = offline_runs(tmp_path)[-1]
    assert evaluation["id"] != first["id"] and evaluation["name"] == run_dir.name + "-eval"
    assert evaluation["job_type"] == "eval" and "code/ppo.py" in evaluation["files"]
    assert [row["episode"] for row in evaluation["rows"] if "eval/episodic_return" in row] == [0, 1]
    assert len(evaluation["videos"]) == 2  # RecordVideo's episodes 0 and 1


def test_an_evaluation_with_track_but_no_credentials_says_what_to_set(tmp_path):
    run("--total-timesteps", 512, "--save-model", cwd=tmp_path)
    (run_dir,) = run_dirs(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"HOME": str(tmp_path), "NETRC": str(tmp_path / "netrc"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "ppo.py"), "--eval-checkpoint", str(run_dir / "checkpoint.pt"), "--track"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and lines[-1].startswith("error: --track: ") and "wandb login" in lines[-1], res.stderr


def test_ablate_groups_and_tags_tracked_runs(tmp_path):
    ablate = [sys.executable, str(ROOT / "benchmark" / "ablate.py"), "ppo.py", "--env-id", "CartPole-v1"]
    ablate += ["--total-timesteps", "1024", "--seeds", "1", "--details", "core-4", "--dry-run"]
    tracked = subprocess.run([*ablate, "--", "--track"], cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout
    commands = [line for line in tracked.splitlines() if not line.startswith("#")]
    assert len(commands) == 2
    for line, tag in zip(commands, ["default", "off-core-4"]):
        assert "--wandb-group ppo__CartPole-v1" in line and f"--wandb-tags ablation {tag}" in line, line
    plain = subprocess.run(ablate, cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout
    assert "--wandb-group" not in plain and "--wandb-tags" not in plain

"""No lost or mixed-up work (issue 23): run folders, resume, videos, a full disk, and signals in every phase.

The plumbing below the fence is the same in every script (tools/lineage.py --check-shared), so these run ppo.py, with
an Atari script where its code paths differ. A full disk is simulated with RLIMIT_FSIZE (no root needed): a write past
the limit fails with EFBIG, as one on a full disk fails with ENOSPC. A signal at a given phase: the script runs under a
launcher that pauses there (printing @<phase>) while the test sends the signals.
"""

import os
import resource
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_script
from tbutil import read_scalars
from test_ppo import small_checkpoint

TINY = ["--num-envs", 2, "--num-steps", 128]  # 256 steps an iteration


def limited_run(script, *args, cwd, max_bytes):
    """Run a script whose files cannot grow past `max_bytes` (a full disk, simulated)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    cmd = [sys.executable, str(ROOT / script), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env, preexec_fn=limit)


# ---- a full disk


def test_a_final_checkpoint_that_cannot_be_written_says_none_is_kept_and_exits_1(tmp_path):
    res = limited_run("ppo.py", *TINY, "--total-timesteps", 512, "--save-model", cwd=tmp_path, max_bytes=30000)
    (run_dir,) = run_dirs(tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr  # not 0: a pipeline must not take it for a success
    assert lines[0].startswith(f"error: cannot write the checkpoint runs/{run_dir.name}/checkpoint.pt (")
    assert lines[0].endswith("; there is no earlier one"), lines[0]  # not "the previous one is kept"
    assert not list(run_dir.glob("checkpoint.pt*"))


@pytest.mark.parametrize("script", ["ppo.py", "ppo_continuous_action.py"])  # the latter's save_checkpoint is its own
def test_a_checkpoint_write_on_a_full_disk_says_so_though_torch_does_not(script, tmp_path, monkeypatch, capsys):
    module = load_script(script)
    net = torch.nn.Linear(2, 1)
    envs = [SimpleNamespace(state_dict=dict)] if script == "ppo_continuous_action.py" else []  # its statistics

    def full_disk(obj, target):  # what torch raises when the disk fills during the write
        with open(target, "wb") as f:
            f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(module.torch, "save", full_disk)
    monkeypatch.setattr(module, "disk_free", lambda folder: 4096)
    path = tmp_path / "checkpoint.pt"
    optimizer = torch.optim.Adam(net.parameters())
    assert module.save_checkpoint(str(path), net, optimizer, *envs, module.Args(), "run", 1, module.rng_states()) is False
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: cannot write the checkpoint {path} (No space left on device); there is no earlier one"]
    assert not list(tmp_path.iterdir())  # no temporary file left


def test_a_full_disk_while_logging_is_one_line_without_a_traceback(tmp_path):
    res = limited_run("ppo.py", *TINY, "--total-timesteps", 25600, cwd=tmp_path, max_bytes=6000)
    (run_dir,) = run_dirs(tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and "Traceback" not in res.stdout, res.stderr
    assert lines[0].startswith(f"error: cannot write the TensorBoard events in runs/{run_dir.name} ([Errno 27] File too")
    assert "stopped at iteration " in lines[0] and lines[0].endswith(": there is no checkpoint"), lines[0]


def test_a_videos_folder_that_cannot_be_written_is_one_line_and_leaves_no_run_folder(tmp_path):
    (tmp_path / "videos").write_text("a file where the videos folder should be\n")
    res = run_script("ppo.py", *TINY, "--total-timesteps", 512, "--capture-video", cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: cannot write a video in videos/ ([Errno 20] Not a directory: "), lines[0]
    assert lines[0].endswith("; stopped before training: there is no checkpoint") and not (tmp_path / "runs").exists()


# ---- names that are taken


@pytest.mark.parametrize("script", ["ppo.py", "ppo_atari.py"])
def test_runs_started_in_the_same_second_each_claim_their_own_folder(script, tmp_path, monkeypatch):
    module = load_script(script)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module.time, "time", lambda: 1700000000.5)  # a sweep launched with &: the same second
    args = module.Args()
    base = f"{args.env_id}__{args.exp_name}__{args.seed}"
    first, second = module.Run(args), module.Run(args)
    assert first.name == f"{base}__1700000000" and second.name == f"{base}__1700000001"  # report.py still reads both
    assert first.checkpoint_path == f"runs/{base}__1700000000/checkpoint.pt"
    assert second.checkpoint_path == f"runs/{base}__1700000001/checkpoint.pt"
    assert (tmp_path / "runs" / first.name).is_dir() and (tmp_path / "runs" / second.name).is_dir()
    (tmp_path / "videos" / f"{base}__1700000002").mkdir(parents=True)  # videos of a run whose runs/ folder was deleted
    assert module.Run(args).name == f"{base}__1700000003"  # its videos are not mixed with a new run's


def test_a_run_that_fails_before_it_starts_leaves_no_folder(ppo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = ppo.Run(ppo.Args(env_id="ALE/Pong-v5"))  # an id with a slash: runs/ALE/Pong-v5__ppo__1__<time>
    assert (tmp_path / run.dir).is_dir()
    with pytest.raises(SystemExit):
        run.fail("an env this script cannot take")
    assert not (tmp_path / "runs").exists()


def test_resume_from_another_folder_goes_on_in_the_checkpoints_folder_and_keeps_its_videos(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    res = run_script("ppo.py", *TINY, "--total-timesteps", 512, "--save-model", "--capture-video", cwd=home)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(home)
    videos = home / "videos" / run_dir.name
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in videos.glob("*.mp4")}
    assert "rl-video-episode-0.mp4" in before, sorted(before)

    ckpt = os.path.relpath(run_dir / "checkpoint.pt", elsewhere)  # ../home/runs/<run>/checkpoint.pt
    res = run_script("ppo.py", "--resume", ckpt, "--total-timesteps", 2560, cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert f"{run_dir.name} goes on in its own folder, {run_dir}" in res.stdout
    assert not (elsewhere / "runs").exists() and not (elsewhere / "videos").exists()  # not a second, half folder
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["iteration"] == 10  # the run's own checkpoint
    assert [s for s, _ in read_scalars(run_dir)["charts/learning_rate"]] == [256 * k for k in range(1, 11)]
    # the videos recorded before the resume are kept; the new ones are numbered on after them
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in videos.glob("*.mp4")}
    assert {name: after.get(name) for name in before} == before
    numbers = lambda names: {int(n[len("rl-video-episode-") : -len(".mp4")]) for n in names}  # noqa: E731
    assert min(numbers(set(after) - set(before)), default=-1) > max(numbers(before)), sorted(after)


def test_under_torchrun_only_rank_0_records_videos(tmp_path, monkeypatch):
    mg = load_script("ppo_atari_multigpu.py")
    monkeypatch.chdir(tmp_path)
    args = mg.Args(capture_video=True, num_envs=2)
    ranks = [mg.Run(args, None, rank=0), mg.Run(args, None, rank=1)]
    ranks[1].name = ranks[0].name  # torchrun: rank 0's name, broadcast
    for run in ranks:
        run.check_env(mg.make_envs(args, run.name, num_envs=1))
    assert ranks[0].recorder.episode_trigger(0) and not ranks[1].recorder.episode_trigger(0)  # one file per episode
    for run in ranks:
        run.envs.close()


# ---- signals in every phase

LAUNCH = """
import runpy, sys, time
phase, seconds, script = sys.argv[1], float(sys.argv[2]), sys.argv[3]
calls = {"n": 0}

def paused(f, at=1):
    def g(*args, **kwargs):
        calls["n"] += 1
        print(f"+{phase}", flush=True)  # each call
        if calls["n"] == at or (calls["n"] > at and phase == "close"):  # once; each close (the second signal's too)
            print(f"@{phase}", flush=True)
            time.sleep(seconds)
        return f(*args, **kwargs)
    return g

import gymnasium as gym, torch, torch.utils.tensorboard as tb
if phase == "make":
    gym.make = paused(gym.make)
elif phase == "reset":
    gym.vector.SyncVectorEnv.reset = paused(gym.vector.SyncVectorEnv.reset)
elif phase == "step":  # the first iteration's rollout (an evaluation: a few episodes in)
    gym.vector.SyncVectorEnv.step = paused(gym.vector.SyncVectorEnv.step, at=int(sys.argv[4]))
elif phase == "save":
    torch.save = paused(torch.save)
elif phase == "close":
    tb.SummaryWriter.close = paused(tb.SummaryWriter.close)
elif phase == "finish":  # wandb's
    import wandb
    wandb.finish = paused(wandb.finish)
sys.argv = [script] + sys.argv[5:]
runpy.run_path(script, run_name="__main__")
"""


def signalled(tmp_path, phase, signals, *args, at=1, pause=2.0, gap=0.5):
    """Run ppo.py paused at `phase`; send `signals` there, `gap` seconds apart; (exit code, stdout and stderr)."""
    cmd = [sys.executable, "-c", LAUNCH, phase, str(pause), str(ROOT / "ppo.py"), str(at), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.strip() == f"@{phase}":
            for sig in signals:
                proc.send_signal(sig)
                time.sleep(gap)
            break
    out.extend(proc.stdout)
    proc.wait(timeout=120)
    return proc.returncode, "".join(out)


def no_checkpoint_left(tmp_path):
    return not list(tmp_path.rglob("checkpoint.pt*"))


@pytest.mark.parametrize("phase, sig", [("make", signal.SIGTERM), ("reset", signal.SIGTERM), ("step", signal.SIGINT)])
def test_a_signal_before_the_first_iteration_is_whole_promises_no_checkpoint(tmp_path, phase, sig):
    rc, out = signalled(tmp_path, phase, [sig], *TINY, "--total-timesteps", 512)
    assert rc == 128 + sig and "Traceback" not in out, out
    assert f"{sig.name} received: stopping before iteration 1 is whole: there is no checkpoint" in out, out
    assert "stopping after a checkpoint" not in out and "continue with" not in out
    assert "stopped before iteration 1 was whole: there is no checkpoint" in out, out
    assert no_checkpoint_left(tmp_path)


def test_a_signal_during_the_final_checkpoint_write_writes_it_once_and_says_the_run_is_complete(tmp_path):
    rc, out = signalled(tmp_path, "save", [signal.SIGTERM], *TINY, "--total-timesteps", 512, "--save-model")
    assert rc == 128 + signal.SIGTERM and "Traceback" not in out, out
    (run_dir,) = run_dirs(tmp_path)
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["iteration"] == 2
    assert out.count("+save") == 1, out  # not written a second time
    assert "checkpoint of iteration 2 (step 512) written to" in out and "continue with" not in out, out  # complete
    assert not list(run_dir.glob("*.tmp*"))


def test_a_second_signal_during_the_final_checkpoint_write_says_what_is_kept(tmp_path):
    rc, out = signalled(tmp_path, "save", [signal.SIGTERM] * 2, *TINY, "--total-timesteps", 512, "--save-model")
    assert rc == 128 + signal.SIGTERM and "Traceback" not in out, out
    assert "stopped at once: there is no checkpoint" in out, out
    assert no_checkpoint_left(tmp_path)  # neither a checkpoint nor its temporary file


def test_a_third_signal_while_closing_exits_at_once_without_a_traceback(tmp_path):
    rc, out = signalled(tmp_path, "close", [signal.SIGINT] * 3, *TINY, "--total-timesteps", 256, pause=3.0, gap=1.0)
    assert rc == 128 + signal.SIGINT and "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_a_second_signal_while_wandb_finishes_exits_without_a_traceback(tmp_path):
    rc, out = signalled(tmp_path, "finish", [signal.SIGINT] * 2, *TINY, "--total-timesteps", 256, "--track")
    assert rc == 128 + signal.SIGINT and "Traceback" not in out and "KeyboardInterrupt" not in out, out


def test_an_interrupted_evaluation_reports_the_episodes_it_played(ppo, tmp_path):
    small_checkpoint(ppo, tmp_path / "ckpt.pt", 1)
    rc, out = signalled(tmp_path, "step", [signal.SIGINT], "--eval-checkpoint", "ckpt.pt", "--eval-episodes", 1000, at=300)
    assert rc == 128 + signal.SIGINT and "Traceback" not in out, out
    (stopped,) = [line for line in out.splitlines() if line.startswith("eval: stopped by SIGINT after ")]
    played = int(stopped.split()[5])
    assert 1 <= played < 1000 and stopped.endswith(f"after {played} of 1000 episodes"), out
    (returns,) = [line for line in out.splitlines() if line.startswith("eval: each episode's return")]
    assert len(returns.split(":")[-1].split()) == played


def test_a_second_evaluation_with_videos_keeps_the_first_ones(ppo, tmp_path):
    small_checkpoint(ppo, tmp_path / "ckpt.pt", 1)  # the run's name: "run"
    flags = ["--eval-checkpoint", "ckpt.pt", "--eval-episodes", 1, "--capture-video"]
    res = run_script("ppo.py", *flags, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    first = (tmp_path / "videos" / "run-eval" / "rl-video-episode-0.mp4").stat()
    res = run_script("ppo.py", *flags, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "the videos of an earlier evaluation are kept in videos/run-eval-1/" in res.stdout
    kept = (tmp_path / "videos" / "run-eval-1" / "rl-video-episode-0.mp4").stat()
    assert (kept.st_ino, kept.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # the same file, not written over
    assert [p.name for p in (tmp_path / "videos" / "run-eval").iterdir()] == ["rl-video-episode-0.mp4"]  # this one's

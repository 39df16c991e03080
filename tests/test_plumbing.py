"""The plumbing's contract (issue 61): what a run does with a mistake in its flags, a signal, a checkpoint, a resume.

The plumbing below the fence is the same in every script (tools/lineage.py --check-shared), so most of these run ppo.py;
each script's own checks (its env, its optional pieces) are tested with it. A full disk is simulated with RLIMIT_FSIZE
(no root needed): a write past the limit fails with EFBIG, as one on a full disk fails with ENOSPC."""

import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_python, run_script
from tbutil import read_scalars
from test_multidiscrete import needs_microrts

TINY = ["--num-envs", 2, "--num-steps", 128]  # 256 steps an iteration
REVISION = "3209b37"  # the last commit before the plumbing became plain functions (issue 61)


def one_error_line(res, *words):
    """The run failed with one line on stderr, `error: ...`, holding each of `words`."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def script_at(rev, script, folder):
    """The file `script` as it was at git revision `rev`, written into `folder` (skip where the clone lacks it)."""
    shown = subprocess.run(["git", "show", f"{rev}:{script}"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"revision {rev} is not in this clone (a shallow clone?): {shown.stderr.strip()}")
    folder.mkdir(exist_ok=True)
    (folder / script).write_text(shown.stdout, encoding="utf-8")
    return folder / script


# ---------------------------------------------------------------------------------------- mistakes: one line, nothing run


@pytest.mark.parametrize(
    "script, args, words",
    [
        ("ppo.py", ["--env-id", "Pendulum-v1"], ["use ppo_continuous_action.py"]),
        ("ppo.py", ["--env-id", "BreakoutNoFrameskip-v4"], ["doesn't exist", "(Atari: the Atari scripts)"]),
        ("ppo_continuous_action.py", ["--env-id", "CartPole-v1"], ["Discrete actions: ppo.py"]),
        ("ppo_atari.py", ["--env-id", "CartPole-v1"], ["needs an Atari id", "not 'CartPole-v1'"]),
        ("ppo.py", ["--env-id", "CartPol-v1"], ["CartPol-v1", "Did you mean", "CartPole"]),
        ("ppo.py", ["--env-id", "NoSuchEnv-v0"], ["NoSuchEnv-v0", "doesn't exist"]),
        ("ppo.py", ["--num-minibatches", 3], ["--num-minibatches 3 does not divide the batch (512)"]),
        ("ppo_atari_lstm.py", ["--num-minibatches", 3], ["does not divide --num-envs 8"]),
        ("ppo.py", ["--total-timesteps", 100], ["--total-timesteps 100 is below one batch (512)"]),
        ("ppo_atari_envpool.py", ["--noop-max", 0], ["--noop-max 0"]),
        ("ppo_atari_envpool.py", ["--capture-video"], ["ppo_atari.py --capture-video"]),
        ("ppo_atari_multigpu.py", ["--local-num-envs", 4], ["CleanRL's envs per process", "--num-envs is the total"]),
    ],
)
def test_a_mistake_is_one_line_and_leaves_no_run_folder(script, args, words, tmp_path):
    one_error_line(run_script(script, *args, cwd=tmp_path), *words)
    assert not list(tmp_path.glob("runs/*")), list(tmp_path.rglob("*"))  # nothing started (or its folder removed)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--learning-rate", "-1"], ["--learning-rate -1.0 is not allowed", "at least 0"]),
        (["--num-envs", "0"], ["--num-envs 0 is not allowed", "above 0"]),
        (["--max-grad-norm", "nan"], ["--max-grad-norm nan is not allowed"]),
        (["--gamma", "inf"], ["--gamma inf is not allowed", "finite"]),
        (["--seed", "-1"], ["--seed -1 is not allowed"]),
        (["--batch-size", "64"], ["--batch-size"]),  # computed from the other flags: not a flag
    ],
)
def test_a_flag_outside_its_domain_is_a_command_line_error(args, words, tmp_path):
    res = run_script("ppo.py", *args, cwd=tmp_path)
    said = " ".join(res.stderr.replace("│", " ").split())  # tyro's box, its lines joined
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    for word in words:
        assert word in said, said
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", sorted(p.name for p in ROOT.glob("ppo*.py")))
def test_every_script_checks_the_same_domains_in_args(script):
    """Each number in Args at least 0 and finite, the main ones above 0: tried on every numeric field of every script."""
    module = load_script(script)
    checked = 0
    for field, value in vars(module.Args()).items():
        if type(value) not in (int, float):
            continue
        for bad in (-1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} .* is not allowed"):
                module.Args(**{field: type(value)(bad) if bad == -1 else bad})
            checked += 1
    assert checked >= 30
    for field in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        with pytest.raises(ValueError, match="above 0"):
            module.Args(**{field: 0})


def test_a_missing_video_encoder_is_named(tmp_path):
    """--capture-video without moviepy: gymnasium's line (it names the install), then nothing left behind."""
    (tmp_path / "nomoviepy").mkdir()
    (tmp_path / "nomoviepy" / "moviepy.py").write_text("raise ImportError('No module named moviepy')\n")
    env = {"PYTHONPATH": str(tmp_path / "nomoviepy")}
    line = one_error_line(run_script("ppo.py", "--capture-video", cwd=tmp_path, env=env), "moviepy", "pip install")
    assert "CartPole-v1" in line
    assert not list(tmp_path.glob("runs/*"))


def test_track_without_wandb_credentials_says_what_to_do(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"HOME": str(tmp_path), "NETRC": str(tmp_path / "none"), "PYTHONUNBUFFERED": "1"}
    res = run_python(ROOT / "ppo.py", "--track", cwd=tmp_path, env=env)
    one_error_line(res, "--track", "wandb login", "WANDB_MODE=offline")
    assert not list(tmp_path.glob("runs/*"))


@needs_microrts
def test_microrts_without_java_names_the_install(tmp_path):
    env = {"PATH": os.path.dirname(sys.executable), "JAVA_HOME": ""}
    one_error_line(run_script("ppo_multidiscrete.py", cwd=tmp_path, env=env), "tools/install_microrts.sh")


def test_bf16_without_native_bfloat16_is_refused(monkeypatch):
    atari = load_script("ppo_atari.py")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    args = atari.Args(bf16=True, cuda=False)
    assert "--bf16 needs native bfloat16" in atari.check_args(args)
    assert atari.check_args(atari.Args(bf16=True, cuda=False, eval_checkpoint="x.pt")) is None  # evaluations: float32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert atari.check_args(atari.Args(bf16=True, cuda=False)) is None


# ---------------------------------------------------------------------------------------- Ctrl-C and SIGTERM


def start_and_signal(tmp_path, signals, *args, gap=0.0, launcher=None, when="step "):
    """Start ppo.py, send `signals` once a line starting with `when` shows (`gap` seconds apart); (exit code, output)."""
    cmd = [sys.executable, *(["-c", launcher] if launcher else []), str(ROOT / "ppo.py"), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith(when):
            break
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(gap)
    out.extend(proc.stdout)
    proc.wait(timeout=120)
    return proc.returncode, "".join(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_after_the_iteration_with_a_checkpoint_and_the_resume_command(sig, tmp_path):
    rc, out = start_and_signal(tmp_path, [sig], "--total-timesteps", 10_000_000)
    assert rc == 128 + sig and "Traceback" not in out, out
    (run_dir,) = run_dirs(tmp_path)
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    k = ckpt["iteration"]
    assert k >= 1 and ckpt["global_step"] == 512 * k
    assert f"go on with: python ppo.py --resume {run_dir.relative_to(tmp_path)}/checkpoint.pt" in out, out
    assert max(s for s, _ in read_scalars(run_dir)["charts/learning_rate"]) == 512 * k  # the logs up to it, flushed


# pauses the second save of a run inside torch.save (after the file is opened), printing @save
PAUSE_IN_SAVE = r"""
import runpy, sys, time, torch
save, calls = torch.save, []
def paused(obj, f, *a, **k):
    calls.append(f)
    if len(calls) == 2:
        with open(f, "wb") as out:
            out.write(b"half a checkpoint")
        print("@save", flush=True)
        time.sleep(30)
    return save(obj, f, *a, **k)
torch.save = paused
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_second_signal_stops_at_once_and_keeps_the_last_checkpoint_whole(tmp_path):
    args = ["--total-timesteps", 10_000_000, "--save-model", "--save-every", 1]
    rc, out = start_and_signal(tmp_path, [signal.SIGINT] * 2, *args, gap=0.5, launcher=PAUSE_IN_SAVE, when="@save")
    assert rc != 0 and "stopped at once" in out and "Traceback" not in out, out
    (run_dir,) = run_dirs(tmp_path)
    assert [p.name for p in run_dir.glob("checkpoint*")] == ["checkpoint.pt"]  # no temporary file left
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["iteration"] == 1  # the first, whole


# ---------------------------------------------------------------------------------------- checkpoints


def limited_run(*args, cwd, max_bytes):
    """Run ppo.py with files that cannot grow past `max_bytes` (a full disk, simulated)."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    cmd = [sys.executable, str(ROOT / "ppo.py"), *map(str, args)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env, preexec_fn=limit)


def test_a_checkpoint_that_cannot_be_written_ends_the_run_with_one_line(tmp_path):
    res = limited_run(*TINY, "--total-timesteps", 512, "--save-model", cwd=tmp_path, max_bytes=20_000)
    line = one_error_line(res, "cannot write the checkpoint", "the previous one stays")
    (run_dir,) = run_dirs(tmp_path)
    assert str(run_dir.relative_to(tmp_path)) in line
    assert not list(run_dir.glob("checkpoint*"))  # no half-written file
    assert "charts/learning_rate" in read_scalars(run_dir)  # the logs are kept


def test_a_folder_that_is_gone_at_checkpoint_time_is_one_line(ppo, tmp_path):
    agent, args = torch.nn.Linear(2, 2), ppo.Args()
    args.batch_size = 512
    with pytest.raises(SystemExit, match="cannot write the checkpoint .* the previous one stays"):
        ppo.save_checkpoint(
            str(tmp_path / "gone" / "checkpoint.pt"), agent, torch.optim.Adam(agent.parameters()), None, args, "r", 1
        )
    assert not list(tmp_path.iterdir())


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", self.marker],))


def test_a_checkpoint_holding_code_or_of_another_script_is_refused(tmp_path):
    torch.save({"script": "ppo.py", "model": Exploit(str(tmp_path / "pwned"))}, tmp_path / "evil.pt")
    (tmp_path / "corrupt.pt").write_bytes(b"\x80\x02not a checkpoint at all")
    for flag in ("--eval-checkpoint", "--resume"):
        one_error_line(run_script("ppo.py", flag, "evil.pt", cwd=tmp_path), "cannot load the checkpoint evil.pt")
        one_error_line(run_script("ppo.py", flag, "corrupt.pt", cwd=tmp_path), "cannot load the checkpoint corrupt.pt")
        one_error_line(run_script("ppo.py", flag, "missing.pt", cwd=tmp_path), "No such file")
    assert not (tmp_path / "pwned").exists()
    res = run_script("ppo.py", *TINY, "--total-timesteps", 256, "--save-model", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    one_error_line(
        run_script("ppo_shared.py", "--eval-checkpoint", run_dir / "checkpoint.pt", cwd=tmp_path),
        "is not a checkpoint of ppo_shared.py but of ppo.py",
    )


def test_runs_started_in_the_same_second_each_take_their_own_folder(tmp_path):
    launcher = "import runpy, sys, time; t, t0 = time.time, time.time(); time.time = lambda: 1800000000 + (t() - t0) / 1e3; "
    launcher += "sys.argv = sys.argv[1:]; "  # a clock in the same second for the two runs
    launcher += "runpy.run_path(sys.argv[0], run_name='__main__')"
    for _ in range(2):
        cmd = [sys.executable, "-c", launcher, str(ROOT / "ppo.py"), *map(str, [*TINY, "--total-timesteps", 256])]
        assert subprocess.run(cmd, cwd=tmp_path, capture_output=True).returncode == 0
    assert [d.name for d in run_dirs(tmp_path)] == [f"CartPole-v1__ppo__1__{t}" for t in (1800000000, 1800000001)]


# ---------------------------------------------------------------------------------------- resume


def test_resume_goes_on_exactly_extends_and_refuses_a_changed_setting(tmp_path):
    res = run_script("ppo.py", *TINY, "--total-timesteps", 1024, "--save-model", "--save-every", 2, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    ckpt = run_dir / "checkpoint.pt"
    one_error_line(run_script("ppo.py", "--resume", ckpt, "--learning-rate", 1e-3, cwd=tmp_path), "--learning-rate 0.001")
    one_error_line(run_script("ppo.py", "--resume", ckpt, cwd=tmp_path), "has done 1024 steps", "--total-timesteps")
    res = run_script("ppo.py", "--resume", ckpt, "--total-timesteps", 1536, "--save-model", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    scalars = read_scalars(run_dir)
    assert [s for s, _ in scalars["charts/learning_rate"]] == [256, 512, 768, 1024, 1280, 1536]  # one point a step
    saved = torch.load(ckpt, weights_only=True)
    assert saved["iteration"] == 6 and saved["args"]["total_timesteps"] == 1536
    # the LR schedule of the extended run: annealed over its 6 iterations from iteration 5 on
    assert scalars["charts/learning_rate"][4][1] == pytest.approx(2.5e-4 * (1 - 4 / 6))


def test_resume_restores_the_state_that_was_saved(tmp_path):
    """Weights, Adam's state and every RNG state as they were at the checkpoint, when the resumed run's loop begins."""
    ppo = load_script("ppo.py")
    res = run_script("ppo.py", *TINY, "--total-timesteps", 512, "--save-model", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    args = ppo.Args(**ckpt["args"])
    envs = ppo.make_envs(args, None)
    agent = ppo.Agent(envs)
    optimizer = ppo.make_optimizer(agent, args)
    np.random.seed(123), torch.manual_seed(123)
    assert ppo.restore(ckpt, agent, optimizer, envs) == 3
    for name, value in agent.state_dict().items():
        assert torch.equal(value, ckpt["model"][name])
    assert optimizer.state_dict()["state"][0]["step"] == ckpt["optimizer"]["state"][0]["step"] == 32  # 2 x 4 epochs x 4
    assert torch.equal(torch.get_rng_state(), ckpt["rng"]["torch"])
    assert np.array_equal(np.random.get_state()[1], ckpt["rng"]["numpy"][1].numpy())
    envs.close()


@pytest.mark.parametrize(
    "script, flags, batch",
    [("ppo.py", [], 512), ("ppo_continuous_action.py", ["--env-id", "Pendulum-v1", "--num-steps", 128], 128)],
)
def test_a_checkpoint_of_the_previous_revision_resumes_and_plays_as_there(script, flags, batch, tmp_path):
    """A checkpoint written before issue 61 goes on here with the very losses the previous revision logs from it."""
    old = script_at(REVISION, script, tmp_path / "rev")
    env = {"OMP_NUM_THREADS": "1"}
    res = run_python(
        old, *flags, "--total-timesteps", batch, "--save-model", "--torch-threads", 1, cwd=tmp_path, env={**os.environ, **env}
    )
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path)
    losses = {}
    for name, path in (("old", old), ("now", ROOT / script)):
        work = tmp_path / name
        shutil.copytree(tmp_path / "runs", work / "runs")
        checkpoint = f"runs/{run_dir.name}/checkpoint.pt"
        res = run_python(path, "--resume", checkpoint, "--total-timesteps", 3 * batch, cwd=work, env={**os.environ, **env})
        assert res.returncode == 0, res.stderr[-2000:]
        scalars = read_scalars(work / "runs" / run_dir.name)
        losses[name] = {tag: values for tag, values in scalars.items() if tag.startswith("losses/")}
        res = run_python(path, "--eval-checkpoint", checkpoint, "--eval-episodes", 2, cwd=work, env={**os.environ, **env})
        assert res.returncode == 0, res.stderr[-2000:]
        losses[name]["eval"] = [line for line in res.stdout.splitlines() if line.startswith("eval: each")]
    assert [step for step, _ in losses["now"]["losses/value_loss"]] == [batch, 2 * batch, 3 * batch]
    assert losses["old"] == losses["now"]  # iterations 2 and 3 after the restore, to the bit; the same evaluation


def test_a_resumed_run_with_videos_keeps_the_earlier_ones(tmp_path):
    res = run_script("ppo.py", *TINY, "--total-timesteps", 512, "--save-model", "--capture-video", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    videos = tmp_path / "videos" / run_dir.name
    before = {p.name: p.stat().st_mtime_ns for p in videos.glob("*.mp4")}
    assert before
    res = run_script("ppo.py", "--resume", run_dir / "checkpoint.pt", "--total-timesteps", 1024, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert {p.name: p.stat().st_mtime_ns for p in videos.glob("*.mp4")} == before  # none written over
    assert list((videos / "resumed-3").glob("*.mp4"))  # this segment's, beside them


# ---------------------------------------------------------------------------------------- in-process use


def test_two_runs_in_one_process(tmp_path):
    """A tuner (runpy, Optuna) calls main() in a loop: a run that ends normally returns, and, as CleanRL's tuner reads
    it, the globals runpy returns hold the run's name."""
    code = (
        "import runpy, sys\n"
        "for seed in (1, 2):\n"
        "    sys.argv = ['ppo.py', '--num-envs', '2', '--num-steps', '128', '--total-timesteps', '256', '--seed', str(seed)]\n"
        f"    experiment = runpy.run_path({str(ROOT / 'ppo.py')!r}, run_name='__main__')\n"
        "    print('run', experiment['run_name'])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    names = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("run ")]
    assert len(names) == 2 and sorted(tmp_path / "runs" / n for n in names) == run_dirs(tmp_path), res.stdout


def test_an_exp_name_with_a_slash_makes_nested_folders_not_a_traceback(tmp_path):
    res = run_script("ppo.py", *TINY, "--total-timesteps", 256, "--exp-name", "sweep/a", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.parent.name == "CartPole-v1__sweep" and run_dir.name.startswith("a__1__")

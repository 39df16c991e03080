"""benchmark/gpu_check.py, the GPU check, here without a GPU: its time limits, probe, table and stops; its bit-level
checks are tests/test_bf16.py's (benchmark/bit_checks.py). The whole check on the CPU (`GPU_CHECK_EXPECT=cpu python
benchmark/gpu_check.py`, about 4 minutes on 2 busy cores) is too long for the suite: real runs of its torchrun row and
of its Pong step stand for it."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmark" / "gpu_check.py")
gpu_check_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check_module)
spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "benchmark" / "gpu_kit.py")
gpu_kit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_kit)


def check_env(tmp_path, env):
    """The check's environment: the GPU hidden, its kept logs in tmp_path, this python first on PATH."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "", **env}
    if "PATH" not in env:  # this python (a venv's called by path, not activated) is the one a `python` finds
        full["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), full.get("PATH", "")])
    return full


def gpu_check(env, tmp_path, timeout=600):
    cmd = [sys.executable, str(ROOT / "benchmark" / "gpu_check.py")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=check_env(tmp_path, env), cwd=ROOT)


def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    res = gpu_check({}, tmp_path)
    assert res.returncode == 0 and res.stdout.strip().splitlines() == [
        "gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False): nothing checked"
    ], res.stdout + res.stderr
    assert not list(tmp_path.glob("gpu_check.*"))  # no empty log folder left behind


@pytest.mark.parametrize("var", ["CHECK_SECONDS", "PROBE_SECONDS", "PONG_SECONDS"])
def test_gpu_check_refuses_a_time_limit_that_is_not_a_whole_number(tmp_path, var):
    res = gpu_check({var: "3m"}, tmp_path, timeout=60)
    assert res.returncode == 2 and res.stdout == "", res.stdout + res.stderr
    assert res.stderr.strip() == f"gpu_check: {var} must be a whole number of seconds above 0, not '3m'"


def test_gpu_check_stops_a_hung_torch_import_and_says_where_not_no_gpu(tmp_path):
    """A first `import torch` that hangs (a stuck driver, a slow file system) fails with the stack where it hung; it
    is not reported as a machine without a GPU."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import time\n\ntime.sleep(600)  # hung_import_marker\n")
    env = {"PROBE_SECONDS": "2", "PYTHONPATH": str(fake.parent)}
    t0 = time.time()
    res = gpu_check(env, tmp_path, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL probe: importing torch and asking for CUDA still ran after 2 s, stopped" in res.stdout
    assert str(fake / "__init__.py") in res.stdout and "no CUDA GPU" not in res.stdout and time.time() - t0 < 30


REPORT = {"cuda": False, "missing": [], "said": {"device": "CPU", "torch": "x", "CUDA": None, "cuDNN": None}}
PRINT = [sys.executable, "-c"]


def test_the_table_goes_on_past_failures_and_a_hang_and_the_check_fails(tmp_path, monkeypatch, capsys):
    """Each run is a row: ok with its SPS and warnings; FAIL for an exit status, a run on another device, a line it did
    not print, and a hang, which is stopped after CHECK_SECONDS with the stack of each of its Python processes (a
    worker that a torchrun-like launcher started in a session of its own too, which is not left running); skip with its
    reason; the check goes on after each, prints the table, and exits 1. A bit check that raises fails its row alone."""
    worker, pid_file = tmp_path / "hung_worker.py", tmp_path / "worker.pid"
    worker.write_text(f"import os, time\n\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    launcher = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(worker)!r}], start_new_session=True)\n"
    launcher += "time.sleep(600)\n"
    ok = "import warnings\nprint('training r on cpu from step 0')\nwarnings.warn('mind the gap')\nprint('x | SPS 1234')"
    plan = [
        ("fails", [*PRINT, "import sys; print('training r on cpu'); sys.exit('boom')"], None, ()),
        ("hangs", [*PRINT, launcher], None, ()),
        ("elsewhere", [*PRINT, "print('training r on cuda:0 from step 0')"], None, ()),
        ("no group", [*PRINT, "print('training r on cpu from step 0')"], None, ("rank 0: parameters bit-identical",)),
        ("skipped", ["false"], "no mujoco", ()),
        ("passes", [*PRINT, ok], None, ()),
    ]
    fake_checks = type(sys)("bit_checks")
    fake_checks.CHECKS = {"same": lambda module, device: None, "differs": lambda module, device: 1 / 0}
    monkeypatch.setitem(sys.modules, "bit_checks", fake_checks)
    monkeypatch.setattr(gpu_check_module, "load", lambda script: None)
    monkeypatch.setattr(gpu_check_module, "probe", lambda *args: REPORT)
    monkeypatch.setattr(gpu_check_module, "runs", lambda report, expect: plan)
    for var, value in {"GPU_CHECK_EXPECT": "cpu", "CHECK_SECONDS": "3", "TMPDIR": str(tmp_path)}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("GPU_CHECK_ONLY", "bits ppo_atari,fails,hangs,elsewhere,no group,skipped,passes")
    t0 = time.time()
    code = gpu_check_module.main()
    out = capsys.readouterr().out
    assert code == 1 and time.time() - t0 < 60, out
    table = out[out.index("gpu_check: 2 ok, 5 FAIL, 1 skipped") :].splitlines()
    rows = [line.split()[:2] for line in table[1:] if not line.startswith(" ")]
    assert rows == [["ok", "probe"], ["FAIL", "bits"], ["FAIL", "fails"], ["FAIL", "hangs"], ["FAIL", "elsewhere"]] + [
        ["FAIL", "no"],
        ["skip", "skipped"],
        ["ok", "passes"],
    ], table
    assert "differs: ZeroDivisionError" in out and "same" not in out.split("differs")[0].split("bits ppo_atari")[-1]
    assert "exit status 1: training r on cpu | boom" in out
    assert "hangs" in out and "still running after 3 s, stopped; where it was:" in out
    assert f'File "{worker}", line 4' in out and "most recent call first" in out  # the worker's stack
    worker_pid = int(pid_file.read_text())
    assert not Path(f"/proc/{worker_pid}").exists() or "Z" in Path(f"/proc/{worker_pid}/stat").read_text().split()[2]
    assert "it did not train on cpu (training r on cuda:0 from step 0)" in out
    assert "it did not say 'rank 0: parameters bit-identical'" in out and "no mujoco" in out
    (passes,) = [line for line in table if line.startswith("ok    passes")]
    assert "SPS   1234" in passes and "warning: " in passes and "UserWarning: mind the gap" in passes


def test_on_the_cpu_torchrun_makes_its_process_group(tmp_path):
    """The real row on the CPU (GPU_CHECK_EXPECT=cpu): ppo_atari_multigpu.py under torchrun makes its process group
    (gloo here) and trains; its logs are kept under $TMPDIR."""
    res = gpu_check({"GPU_CHECK_EXPECT": "cpu", "GPU_CHECK_ONLY": "torchrun gloo"}, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"logs in {tmp_path}/gpu_check." in res.stdout  # $TMPDIR is honoured: nothing left behind in /tmp
    table = res.stdout[res.stdout.index("\ngpu_check: 2 ok, 0 FAIL") :]
    assert "\nok    probe" in table and "\nok    torchrun gloo " in table and "SPS" in table


# Pong's short games (100 steps) in 20 envs: 20 games end in the first iteration
SHORT_PONG = "--max-episode-frames 400 --num-envs 20 --num-steps 100 --num-minibatches 4 --update-epochs 1"


def test_the_pong_monitor_stops_the_run_once_the_mean_of_20_games_reaches_the_target(tmp_path):
    """The Pong step (GPU_CHECK_PONG=1) reads the run's events and stops it once the mean of the last 20 games reaches
    the target (-21 here: any 20 games)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    row = gpu_check_module.pong(logs, -21, 120, SHORT_PONG, check_env(tmp_path, {"PYTHONFAULTHANDLER": "1"}))
    assert row.status == "ok" and "the mean of the last 20 games reached" in row.note and "game 20)" in row.note, row.note


def test_the_pong_step_fails_when_the_target_is_not_reached_in_its_time(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    env = check_env(tmp_path, {"PYTHONFAULTHANDLER": "1"})
    tiny = "--num-envs 2 --num-steps 16 --num-minibatches 2 --update-epochs 1"  # stopped within a second of its 3 s
    row = gpu_check_module.pong(logs, 21, 3, tiny, env)
    assert row.status == "FAIL" and row.note.startswith("the mean of the last 20 games did not reach 21 in 3 s"), row.note
    assert "exit status" not in row.note  # stopped by its SIGINT, not crashed


def test_the_device_commands_start_with_the_kits_install_line_and_fit_a_call():
    commands = gpu_kit.check_commands()
    assert len(commands) == 2
    for command in commands:
        assert len(command) <= 2000 and gpu_kit.install_line() in command
        assert "PYTHONUNBUFFERED=1" in command and "python3 benchmark/gpu_check.py" in command
        assert "| tee $OUT/gpu_check.log" in command and command.startswith("set -o pipefail;")
    assert "GPU_CHECK_PONG=1" in commands[1] and "GPU_CHECK_PONG" not in commands[0]

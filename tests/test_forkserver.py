"""The tests' fork server (conftest.run_python) runs a script as `python script.py` does: a probe script and ppo.py,
each run both ways, must give the same exit code, output and results."""

import os
import subprocess
import time

import pytest
from conftest import ROOT, run_dirs, run_python
from tbutil import read_scalars

PROBE = """
import atexit, os, sys, threading, time
import torch
print("argv", sys.argv[1:])
print("cwd", os.getcwd())
print("path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print("name", __name__, os.path.basename(__file__))
print("threads", torch.get_num_threads())
print("env", os.environ.get("PROBE_VALUE"), os.environ.get("WANDB_MODE"))
print("stdin", repr(sys.stdin.read()))
print("err line", file=sys.stderr)
atexit.register(print, "atexit ran")
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
if sys.argv[1] == "raise":
    raise ValueError("probe failed")
if sys.argv[1] == "sleep":
    open("pid", "w").write(str(os.getpid()))
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("env", [{}, {"OMP_NUM_THREADS": "1", "PROBE_VALUE": "x", "WANDB_MODE": "offline"}])
@pytest.mark.parametrize("how", ["0", "3", "raise"])
def test_a_forked_run_is_a_plain_run(tmp_path, how, env):
    probe = tmp_path / "folder" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE)
    full = {**os.environ, **env}
    plain, forked = (run_python(probe, how, cwd=tmp_path, env=full, fork=fork) for fork in (False, True))
    assert forked.returncode == plain.returncode == {"0": 0, "3": 3, "raise": 1}[how]
    assert forked.stdout == plain.stdout, (forked.stdout, plain.stdout)
    assert "threads 1" in forked.stdout or not env  # the run's OMP_NUM_THREADS reached torch's import
    assert "atexit ran" in forked.stdout and "thread joined" in forked.stdout and "stdin ''" in forked.stdout
    err, plain_err = forked.stderr.splitlines(), plain.stderr.splitlines()
    assert err[0] == plain_err[0] == "err line" and err[-1] == plain_err[-1]  # a traceback's frames differ (runpy's)


def test_a_forked_run_past_its_timeout_is_killed_and_the_next_run_works(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(probe, "sleep", cwd=tmp_path, timeout=3, fork=True)
    pid = int((tmp_path / "pid").read_text())
    for _ in range(50):  # killed, and reaped by init once its server is gone
        if not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split(")")[-1][:3]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the timed-out run {pid} is still running")
    assert run_python(probe, "0", cwd=tmp_path, fork=True).returncode == 0


def test_ppo_forked_logs_the_same_losses_as_ppo_run_plainly(tmp_path):
    losses = {}
    for fork in (False, True):
        name = f"fork{fork}"
        res = run_python(ROOT / "ppo.py", "--total-timesteps", 1024, "--exp-name", name, cwd=tmp_path, fork=fork)
        assert res.returncode == 0, res.stderr
        (run_dir,) = [d for d in run_dirs(tmp_path) if f"__{name}__" in d.name]
        losses[fork] = {k: v for k, v in read_scalars(run_dir).items() if k.startswith("losses/")}
    assert losses[True] and losses[True] == losses[False]

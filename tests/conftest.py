"""Shared fixtures: import a variant script as a module, and run one as `python script.py ...` would.

Runs go through a fork server (a Python that has already imported torch, numpy, gymnasium, tyro, TensorBoard and, where
installed, envpool, and forks once per run), because those imports take 1-2 s of each run's time and the suite makes
hundreds of runs. The child is a fresh run in every respect the scripts can see: its own argv, sys.path[0], working
directory, environment, standard streams (the import's own warnings included) and exit code, and it ends through the
interpreter's normal exit (atexit, threads, flush). The server is keyed by the environment, apart from variables its
imports do not read (WANDB_*, PYTEST_CURRENT_TEST), so an OMP_NUM_THREADS or MUJOCO_GL given to a run reaches the
imports as it would. What differs: all forked runs share one hash seed. PPO_TESTS_FORK=0 runs every script as a plain
subprocess instead. Under pytest-xdist (`-n 2`, README's command) each worker process has servers of its own.
"""

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORK = os.environ.get("PPO_TESTS_FORK", "1") != "0"
LATE_VARIABLES = ("WANDB_", "PYTEST_CURRENT_TEST")  # not read by the server's imports: a run may change them

SERVER = r"""
import json, os, sys
err = os.dup(2)
with open(sys.argv[1], "w+b") as f:  # what the imports print (warnings) is printed again by each run
    os.dup2(f.fileno(), 2)
    import gymnasium, numpy, torch, torch._dynamo, torch.utils.tensorboard, tyro  # noqa: F401 (Adam imports _dynamo: 1.3 s)
    try:
        import envpool  # noqa: F401 (2-3 s measured beside two runs: it imports matplotlib for its jumanji envs)
    except Exception:  # absent or broken: each envpool run then imports it (and fails) as it would alone
        pass
    sys.stderr.flush()
    os.dup2(err, 2)
    f.seek(0)
    said = f.read()
os.close(err)


def serve():
    for line in sys.stdin:
        run = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return run
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
    os._exit(0)


run = serve()  # in the child from here on
for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, run["out"], os.O_WRONLY), (2, run["err"], os.O_WRONLY)):
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)
os.write(2, said)
os.chdir(run["cwd"])
os.environ.clear()
os.environ.update(run["env"])
sys.argv = run["argv"]
sys.path[0] = os.path.dirname(os.path.abspath(run["argv"][0]))
import runpy

runpy.run_path(run["argv"][0], run_name="__main__")
"""


class ForkServer:
    def __init__(self, env):
        self.said = tempfile.NamedTemporaryFile(prefix="fork-server-", suffix=".err", delete=False).name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, self.said],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.fd, self.buffer = self.proc.stdout.fileno(), b""

    def run(self, argv, cwd, env, timeout):
        with tempfile.TemporaryDirectory(prefix="fork-run-") as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            out.touch()
            err.touch()
            request = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            pid = self._reply(time.monotonic() + 300)["pid"]  # once the server has made its imports (its first run)
            try:
                rc = self._reply(time.monotonic() + timeout)["rc"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)  # as subprocess.run kills its child; the server is closed
                self.close()
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
            return subprocess.CompletedProcess(
                [sys.executable, *argv], rc, out.read_text(errors="replace"), err.read_text(errors="replace")
            )

    def _reply(self, deadline):
        """The server's next line (JSON), waiting until `deadline` at most."""
        while b"\n" not in self.buffer:
            if not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise subprocess.TimeoutExpired("fork server", 0)
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise RuntimeError("the tests' fork server ended unexpectedly")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()  # its running child, if any, is killed by the timeout's caller below
        self.proc.wait()
        Path(self.said).unlink(missing_ok=True)


_servers = {}


def _server(env):
    key = tuple(sorted((k, v) for k, v in env.items() if not k.startswith(LATE_VARIABLES)))
    server = _servers.pop(key, None)
    if server is None or server.proc.poll() is not None:
        server = ForkServer(env)
    _servers[key] = server  # the most recently used last
    while len(_servers) > 3:  # environments made for one test (a PATH, a HOME) are not kept
        _servers.pop(next(iter(_servers))).close()
    return server


def run_python(path, *args, cwd, timeout=300, env=None, fork=None):
    """`python path args...` in `cwd` with `env` (os.environ if None); returns the CompletedProcess (text output).

    Through the fork server unless `fork` is False or PPO_TESTS_FORK=0: then a plain subprocess."""
    full_env = dict(os.environ if env is None else env)
    argv = [str(path), *map(str, args)]
    if not (FORK if fork is None else fork):
        cmd = [sys.executable, *argv]
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    return _server(full_env).run(argv, cwd, full_env, timeout)


def load_script(name):
    """Import `ROOT/name` (e.g. "ppo.py") as a module without running its training loop."""
    path = ROOT / name
    spec = importlib.util.spec_from_file_location(name[: -len(".py")], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name, *args, cwd, timeout=300, env=None):
    """Run a variant script with arguments in `cwd`; returns the CompletedProcess (text output)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", **(env or {})}
    return run_python(ROOT / name, *args, cwd=cwd, timeout=timeout, env=full_env)


def run_dirs(cwd):
    """The run directories (those holding event files) under cwd/runs."""
    return sorted({p.parent for p in Path(cwd, "runs").rglob("events.out.tfevents.*")})


@pytest.fixture(scope="session")
def ppo():
    return load_script("ppo.py")


def pytest_sessionfinish(session):
    for server in _servers.values():
        server.close()

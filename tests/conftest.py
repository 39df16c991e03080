"""Shared fixtures: import a variant script as a module, and run one in a subprocess."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
    return subprocess.run(
        [sys.executable, str(ROOT / name), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def run_dirs(cwd):
    """The run directories (those holding event files) under cwd/runs."""
    return sorted({p.parent for p in Path(cwd, "runs").rglob("events.out.tfevents.*")})


@pytest.fixture(scope="session")
def ppo():
    return load_script("ppo.py")

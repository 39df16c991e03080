"""benchmark/gpu_kit.py: the wheels for the bare GPU machine install offline into a fresh Python 3.12 and import there.

Needs the network (marked `network`; skipped cleanly offline): the kit's wheels (~58 MB once, cached in .whl-cache/;
a kit already in .whl/ is used as it is) and the venv's numpy come from PyPI. Needs a Python 3.12 (the machine's:
$PYTHON312, python3.12 on PATH, or pyenv's), else skipped. The venv stands for the machine's image with numpy alone:
torch (a multi-GB CUDA wheel) is not installed, and none of the four imports needs it.
"""

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import sys

import numpy
import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "benchmark" / "gpu_kit.py")
gpu_kit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_kit)


def python312():
    """A Python 3.12 that runs and can make a venv: $PYTHON312, python3.12 on PATH (a pyenv shim may not run), or
    pyenv's own; None if none."""
    candidates = [os.environ.get("PYTHON312"), shutil.which("python3.12")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    for python in filter(None, candidates):
        try:
            res = subprocess.run([python, "-c", "import ensurepip, venv"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if res.returncode == 0:
            return python
    return None


PYTHON312 = python312()


def online():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


# a Pong step in envpool (its Atari engine and ROMs from the kit) and in gymnasium (ale-py's), the versions pinned
IMPORTS = """
import sys
import ale_py, envpool, gymnasium, numpy, tyro
print(*(m.__version__ for m in (gymnasium, ale_py, envpool, tyro)))
assert "torch" not in sys.modules and all(m.__file__.startswith(sys.argv[1]) for m in (gymnasium, ale_py, envpool, tyro))
envs = envpool.make("Pong-v5", env_type="gymnasium", num_envs=2, episodic_life=True, reward_clip=True)
envs.reset(seed=0)
obs, *_ = envs.step(numpy.zeros(2, dtype=int))
assert obs.shape == (2, 4, 84, 84), obs.shape
env = gymnasium.make("PongNoFrameskip-v4")
obs, _ = env.reset(seed=0)
assert obs.shape == (210, 160, 3), obs.shape
"""


@pytest.mark.network
@pytest.mark.skipif(PYTHON312 is None, reason="no Python 3.12 here (the GPU machine's Python)")
def test_the_kit_installs_offline_into_a_fresh_python312_venv_and_imports(tmp_path):
    if not online():
        pytest.skip("offline: the kit's wheels and the venv's numpy come from PyPI")
    if not gpu_kit.built():  # else the kit in .whl/ as it is
        res = subprocess.run([sys.executable, str(ROOT / "benchmark" / "gpu_kit.py")], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "one call" in res.stdout and 'carry: [".whl"]' in res.stdout, res.stdout
    venv = tmp_path / "venv"
    subprocess.run([PYTHON312, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    image = [f"numpy=={numpy.__version__}"]  # the machine's image, as far as the kit relies on it
    with open(next((ROOT / ".whl").glob("envpool-*.whl")), "rb") as f:
        if b"Atari engine alone" not in f.read():  # --whole: envpool's other envs import matplotlib
            image.append("matplotlib")
    res = subprocess.run([python, "-m", "pip", "install", "-q", *image], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    site = tmp_path / "site"
    line = gpu_kit.install_line(target=site).replace("python3 -m pip", f"{python} -m pip", 1)
    script = tmp_path / "imports.py"
    script.write_text(IMPORTS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = ["bash", "-c", f"{line} {python} {script} {site}"]  # the device's command line, this venv's python
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    pins = gpu_kit.pins()
    assert res.stdout.split()[:4] == [pins[n] for n in ("gymnasium", "ale-py", "envpool", "tyro")], res.stdout

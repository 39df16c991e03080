"""The scripts where researchers already are (issue 63): their own env by gymnasium's `module:EnvId`, Dict observations,
dm_control, envpool's own ids, and a checkpoint that CleanRL's Agent loads."""

import importlib.metadata
import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import ROOT, load_script, run_dirs, run_script
from tbutil import read_scalars
from test_plumbing import TINY, one_error_line

ENVS = {"PYTHONPATH": str(ROOT / "tests" / "envs")}  # myenvs.py: tiny envs registered on import, as a package does


def returns(run_dir):
    return read_scalars(run_dir)["charts/episodic_return"]


@pytest.mark.parametrize(
    "script, env_id",
    [
        ("ppo.py", "myenvs:DictCartPole-v0"),  # a Dict of a float64 and a float32 Box: flattened, as float32
        ("ppo_shared.py", "myenvs:DictCartPole-v0"),
        ("ppo.py", "FrozenLake-v1"),  # a Discrete observation: one-hot
        ("ppo_continuous_action.py", "myenvs:DictPendulum-v0"),
    ],
)
def test_your_own_env_by_module_and_id_trains_with_dict_observations(script, env_id, tmp_path):
    res = run_script(script, *TINY, "--total-timesteps", 1024, "--env-id", env_id, cwd=tmp_path, env=ENVS)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.name.startswith(f"{env_id}__") and returns(run_dir), run_dir


def test_a_module_that_is_not_there_is_one_line(tmp_path):
    one_error_line(run_script("ppo.py", "--env-id", "nosuchpackage:MyEnv-v0", cwd=tmp_path), "No module named")
    assert not list(tmp_path.glob("runs/*"))


def test_dict_observations_are_one_float32_vector_of_the_same_numbers(ppo):
    sys.path.insert(0, ENVS["PYTHONPATH"])
    try:
        import myenvs  # noqa: F401
    finally:
        sys.path.remove(ENVS["PYTHONPATH"])
    env = ppo.make_env("DictCartPole-v0", 0, False, "unused")()
    plain = ppo.make_env("CartPole-v1", 0, False, "unused")()
    assert env.observation_space.shape == (4,) and env.observation_space.dtype == np.float32
    obs, _ = env.reset(seed=3)
    expected, _ = plain.reset(seed=3)
    assert obs.dtype == np.float32 and np.array_equal(obs, expected)  # Dict keys sorted: head, tail


@pytest.mark.parametrize(
    "script, env_id, name",
    [
        ("ppo_atari.py", "ale_py:BreakoutNoFrameskip-v4", "BreakoutNoFrameskip-v4"),
        ("ppo_atari_envpool.py", "Breakout-v5", "BreakoutNoFrameskip-v4"),  # envpool's (and CleanRL's) id
        ("ppo_atari_envpool.py", "ale_py:ALE/Pong-v5", "ALE/Pong-v5"),
    ],
)
def test_atari_ids_in_gymnasiums_module_form_and_envpools_own(script, env_id, name, tmp_path):
    if "envpool" in script and importlib.util.find_spec("envpool") is None:
        pytest.skip("envpool is not installed")
    flags = ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 64, "--torch-threads", 1]
    res = run_script(script, *flags, "--env-id", env_id, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    assert str(run_dir.relative_to(tmp_path / "runs")).startswith(f"{name}__"), run_dir


def test_an_env_that_cannot_run_on_this_stack_is_one_line(tmp_path):
    import mujoco

    if int(mujoco.__version__.split(".")[0]) < 3:
        pytest.skip("Pusher-v4 runs on mujoco<3")
    res = run_script("ppo_continuous_action.py", "--env-id", "Pusher-v4", cwd=tmp_path)
    last = res.stderr.strip().splitlines()[-1]  # after gymnasium's deprecation warning for a v4 id
    assert res.returncode == 1 and last.startswith("error: Pusher-v4: ") and "mujoco<3" in last, res.stderr
    assert "Traceback" not in res.stderr


def test_dm_control_without_its_install_names_it(monkeypatch):
    cont = load_script("ppo_continuous_action.py")
    args = cont.Args(env_id="dm_control/cartpole-balance-v0")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # as where shimmy is not installed
    assert "pip install -r requirements-dm_control.txt" in cont.check_args(args)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # shimmy there, beside MuJoCo 4.0.0
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"mujoco": "4.0.0"}[name])
    assert "fails on MuJoCo 4" in cont.check_args(args)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"mujoco": "3.17.0"}[name])
    assert cont.check_args(args) is None


@pytest.mark.skipif(
    importlib.util.find_spec("shimmy") is None, reason="dm_control: pip install -r requirements-dm_control.txt"
)
def test_dm_control_task_trains(tmp_path):
    res = run_script(
        "ppo_continuous_action.py",
        *TINY,
        "--total-timesteps",
        2048,
        "--env-id",
        "dm_control/cartpole-balance-v0",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    assert returns(run_dir)  # 1000-step episodes: 2 envs end theirs at step 2000


# ------------------------------------------------------------------------------------ a checkpoint for CleanRL's Agent


class CleanRLContinuousAgent(nn.Module):
    """CleanRL's ppo_continuous_action.py Agent, as its parameters are named (actor_mean, not actor)."""

    def __init__(self, obs_dim, act_dim):
        super().__init__()
        mlp = lambda out: nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out))  # noqa: E731
        self.critic, self.actor_mean = mlp(1), mlp(act_dim)
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))


def test_export_writes_a_state_dict_that_cleanrls_agent_loads(tmp_path):
    res = run_script(
        "ppo_continuous_action.py", *TINY, "--total-timesteps", 256, "--env-id", "Pendulum-v1", "--save-model", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    out = tmp_path / "agent.pt"
    cmd = [sys.executable, ROOT / "tools" / "export_cleanrl.py", run_dir / "checkpoint.pt", out]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "wrote" in res.stdout, res.stderr
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    theirs = CleanRLContinuousAgent(3, 1)
    theirs.load_state_dict(torch.load(out, weights_only=True))  # strict: every name and shape
    assert torch.equal(theirs.actor_mean[0].weight, checkpoint["model"]["actor.0.weight"])
    stats = np.load(f"{out}.normalize.npz")
    assert np.array_equal(stats["mean"], checkpoint["normalize"]["obs"][0].numpy())


def test_export_renames_only_what_differs_from_the_agents_it_targets():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from export_cleanrl import cleanrl_state_dict
    finally:
        sys.path.remove(str(ROOT / "tools"))
    t = torch.zeros(1)
    atari = {"network.0.weight": t, "network.7.bias": t, "actor.weight": t, "critic.bias": t}
    assert cleanrl_state_dict({"script": "ppo_atari.py", "model": atari}).keys() == atari.keys()
    micro = {"network.0.weight": t, "network.2.bias": t, "network.5.weight": t, "actor.weight": t}
    renamed = cleanrl_state_dict({"script": "ppo_multidiscrete_mask.py", "model": micro})
    assert list(renamed) == ["network.1.weight", "network.3.bias", "network.6.weight", "actor.weight"]  # after Transpose


def test_export_refuses_what_is_not_a_checkpoint_in_one_line(tmp_path):
    bad = tmp_path / "x.pt"
    torch.save({"weights": 1}, bad)
    res = subprocess.run(
        [sys.executable, ROOT / "tools" / "export_cleanrl.py", bad, tmp_path / "o.pt"], capture_output=True, text=True
    )
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        f"error: {bad} is not a checkpoint of these scripts (give runs/<run_name>/checkpoint.pt)"
    ]
    good = tmp_path / "c.pt"
    torch.save({"script": "ppo.py", "model": {"actor.0.bias": torch.zeros(2)}}, good)
    res = subprocess.run(
        [sys.executable, ROOT / "tools" / "export_cleanrl.py", good, tmp_path], capture_output=True, text=True
    )
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        f"error: {tmp_path} is a folder; give the path of the file to write, e.g. agent.pt"
    ]

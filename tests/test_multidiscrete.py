"""ppo_multidiscrete.py and ppo_multidiscrete_mask.py: MultiDiscrete components (multidiscrete-1), invalid action
masking (aux-4), the MicroRTS adapter and both scripts on gym-microrts (the JVM runs only in subprocesses)."""

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_script
from tbutil import read_scalars
from torch.distributions.categorical import Categorical

PLAIN, MASK = "ppo_multidiscrete.py", "ppo_multidiscrete_mask.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # small networks: one thread is much faster on a shared 2-core machine
PLANE = [6, 4, 4, 4, 4, 7, 49]  # gym-microrts 0.6: the components of one map cell
HAVE_JAVA = bool(shutil.which("java") or os.environ.get("JAVA_HOME"))
needs_microrts = pytest.mark.skipif(
    importlib.util.find_spec("gym_microrts") is None or importlib.util.find_spec("jpype") is None or not HAVE_JAVA,
    reason="gym-microrts, JPype1 or Java is not installed (bash tools/install_microrts.sh installs them)",
)


def load(name):
    """Import a script without leaving its `gym` alias (gym -> gymnasium) in this process."""
    saved = sys.modules.get("gym")
    try:
        return load_script(name)
    finally:
        if saved is None:
            sys.modules.pop("gym", None)
        else:
            sys.modules["gym"] = saved


@pytest.fixture(scope="module")
def plain():
    return load(PLAIN)


@pytest.fixture(scope="module")
def masked():
    return load(MASK)


def fake_envs(cells=100):
    return SimpleNamespace(
        single_observation_space=gym.spaces.Box(0, 1, (27, 10, 10), np.uint8),
        single_action_space=gym.spaces.MultiDiscrete(np.tile(PLANE, (cells, 1))),
    )


def random_mask(generator, batch, cells=100, empty_cells=30):
    """A (batch, cells, 78) bool mask: each component of a cell keeps a random non-empty subset; some cells have none."""
    mask = torch.rand(batch, cells, sum(PLANE), generator=generator) < 0.4
    start = 0
    for n in PLANE:  # at least one valid value per component
        first = torch.randint(n, (batch, cells), generator=generator)
        mask[..., start : start + n].scatter_(-1, first.unsqueeze(-1), True)
        start += n
    mask[:, :empty_cells] = False  # cells without a unit that can act: nothing is valid
    return mask


def top_level_sources(name):
    source = (ROOT / name).read_text()
    return {node.name: ast.get_source_segment(source, node) for node in ast.parse(source).body if hasattr(node, "name")}


def changed_lines(parent, child):
    diff = subprocess.run(["diff", "-u", parent, child], cwd=ROOT, capture_output=True, text=True).stdout
    return [line for line in diff.splitlines() if re.match(r"[-+][^-+]", line)]  # grep -c '^[-+][^-+]'


# ---------------------------------------------------------------- settings, tags, lineage


def test_defaults_are_the_blogs_microrts_settings(plain, masked):
    for module in (plain, masked):
        args = module.Args()
        assert (args.env_id, args.num_envs, args.num_steps, args.total_timesteps) == ("MicrortsMining-v1", 8, 128, 2000000)
        assert (args.learning_rate, args.anneal_lr, args.clip_coef, args.ent_coef) == (2.5e-4, True, 0.1, 0.01)
        assert (args.num_minibatches, args.update_epochs, args.gamma, args.gae_lambda) == (4, 4, 0.99, 0.95)
        assert module.MAP == "maps/10x10/basesWorkers10x10.xml"
        assert set(module.SCENARIOS) == {
            "MicrortsMining-v1",
            "MicrortsProduceCombatUnitsShapedReward-v1",
            "MicrortsAttackShapedReward-v1",
            "MicrortsRandomEnemyShapedReward3-v1",
        }
        bot, weights, ticks = module.SCENARIOS["MicrortsMining-v1"]  # mining: resources gathered, nothing else
        assert (bot, weights, ticks) == ("passiveAI", [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 2000)
        assert all(len(w) == 7 for _, w, _ in module.SCENARIOS.values())
        assert module.SCENARIOS["MicrortsRandomEnemyShapedReward3-v1"][0] == "randomAI"


def test_bad_settings_are_refused_in_one_line(plain):
    error = plain.check_args(plain.Args(env_id="BreakoutNoFrameskip-v4"))
    assert "unknown MicroRTS scenario 'BreakoutNoFrameskip-v4'" in error and "MicrortsAttackShapedReward-v1" in error
    assert "--num-minibatches 3" in plain.check_args(plain.Args(num_minibatches=3))
    assert "\n" not in error


def test_every_detail_is_tagged_once():
    for name, ids in ((PLAIN, ["multidiscrete-1", "core-13"]), (MASK, ["multidiscrete-1", "core-13"])):
        source = (ROOT / name).read_text()
        for detail in ids:
            assert source.count(f"# detail {detail}: ") == 1, (name, detail)
        assert "# detail atari-" not in source, name  # the Atari wrappers and pixel scaling do not apply
    assert (ROOT / MASK).read_text().count("# detail aux-4: ") >= 3  # logits, entropy, stored masks


def test_shared_passages_are_identical_to_the_parents():
    atari, plain, masked = top_level_sources("ppo_atari.py"), top_level_sources(PLAIN), top_level_sources(MASK)
    shared = ["layer_init", "compute_gae", "ppo_loss", "make_optimizer", "gradient_step", "open_run", "open_logs"]
    shared += ["catch_signals", "save_checkpoint", "load_checkpoint", "restore", "resume_args"]
    for name in shared:
        assert plain[name] == atari[name], name
    for name in shared + ["Args", "check_args", "MicroRTSVecEnv", "make_envs"]:
        assert masked[name] == plain[name], name
    assert len(changed_lines(PLAIN, MASK)) < 60


# ---------------------------------------------------------------- the agent (no JVM)


def test_the_blogs_small_cnn_with_logits_for_every_component(plain):
    torch.manual_seed(0)
    agent = plain.Agent(fake_envs())
    convs = [m for m in agent.network if isinstance(m, torch.nn.Conv2d)]
    shapes = [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs]
    assert shapes == [(27, 16, (3, 3), (2, 2)), (16, 32, (2, 2), (1, 1))]
    linears = [m for m in agent.network if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(32 * 3 * 3, 128)]
    assert any(isinstance(m, torch.nn.ReLU) for m in agent.network)
    assert agent.actor.out_features == 100 * sum(PLANE) and agent.critic.out_features == 1
    # core-2: orthogonal rows scaled by the gain (policy head 0.01), zero biases
    w = agent.actor.weight.detach().double()
    assert torch.allclose(w.T @ w, 0.01**2 * torch.eye(128, dtype=torch.float64), atol=1e-9)
    assert not agent.actor.bias.any() and not agent.critic.bias.any()
    obs = torch.randint(0, 2, (5, 27, 10, 10), dtype=torch.uint8)
    action, logprob, entropy, value = agent.get_action_and_value(obs)
    assert action.shape == (5, 100, 7) and logprob.shape == entropy.shape == (5,) and value.shape == (5, 1)
    assert (action >= 0).all() and (action < torch.tensor(PLANE)).all()


def manual_logprob_and_entropy(logits, action, mask=None, units=None):
    """Sum over the acting cells (all without `units`) and their components of log p(a) and of the entropy."""
    logprob, entropy = torch.zeros(len(logits), dtype=torch.float64), torch.zeros(len(logits), dtype=torch.float64)
    for b in range(len(logits)):
        for cell in range(logits.shape[1]):
            if units is not None and not units[b, cell]:
                continue  # the env executes nothing in this cell
            start = 0
            for k, n in enumerate(PLANE):
                part = logits[b, cell, start : start + n].double()
                valid = mask[b, cell, start : start + n] if mask is not None else torch.ones(n, dtype=torch.bool)
                start += n
                if not valid.any():  # no valid value: logits all -1e8, a constant log-prob (0 in float32), no entropy
                    continue
                logp = torch.full((n,), -np.inf, dtype=torch.float64)
                logp[valid] = torch.log_softmax(part[valid], -1)
                logprob[b] += logp[action[b, cell, k]]
                entropy[b] -= (logp[valid].exp() * logp[valid]).sum()
    return logprob, entropy


def test_logprob_of_a_stored_action_is_the_sum_over_components(plain, masked):
    generator = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 2, (3, 27, 10, 10), dtype=torch.uint8, generator=generator)
    for module in (plain, masked):
        torch.manual_seed(2)
        agent = module.Agent(fake_envs())
        torch.nn.init.normal_(agent.actor.weight, std=0.5)  # far from uniform, so a wrong sum shows
        mask = random_mask(generator, 3) if module is masked else None
        kwargs = {"mask": mask} if mask is not None else {}
        with torch.no_grad():
            sampled, *_ = agent.get_action_and_value(obs, **kwargs)
            stored = sampled.float().long()  # the rollout buffer keeps actions as floats
            _, logprob, entropy, _ = agent.get_action_and_value(obs, stored, **kwargs)
            logits = agent.actor(agent.network(obs.float())).view(3, 100, -1)
            expected_logprob, expected_entropy = manual_logprob_and_entropy(logits, stored, mask)
            assert torch.allclose(logprob.double(), expected_logprob, rtol=1e-4), module.__name__
            assert torch.allclose(entropy.double(), expected_entropy, rtol=1e-4), module.__name__
            if module is plain:
                other = stored.clone()
                other[:, 50, 6] = (other[:, 50, 6] + 1) % 49  # another attack target in one cell changes the sum
                assert not torch.allclose(agent.get_action_and_value(obs, other)[1], logprob)


# multidiscrete-1 (fidelity issue): only the cells whose unit can act count, in both scripts
def test_logprob_and_entropy_count_only_the_cells_the_env_executes(plain, masked):
    generator = torch.Generator().manual_seed(3)
    obs = torch.randint(0, 2, (3, 27, 10, 10), dtype=torch.uint8, generator=generator)
    units = torch.rand(3, 100, generator=generator) < 0.05  # a few acting units, as in a MicroRTS game
    units[:, 7] = True
    for module in (plain, masked):
        torch.manual_seed(2)
        agent = module.Agent(fake_envs())
        torch.nn.init.normal_(agent.actor.weight, std=0.5)
        mask = random_mask(generator, 3) if module is masked else None
        mask_kw = {"mask": mask} if mask is not None else {}
        with torch.no_grad():
            action = agent.get_action_and_value(obs, **mask_kw)[0]
            _, logprob, entropy, _ = agent.get_action_and_value(obs, action, units, **mask_kw)
            logits = agent.actor(agent.network(obs.float())).view(3, 100, -1)
            expected_logprob, expected_entropy = manual_logprob_and_entropy(logits, action, mask, units)
            assert torch.allclose(logprob.double(), expected_logprob, rtol=1e-4), module.__name__
            assert torch.allclose(entropy.double(), expected_entropy, rtol=1e-4), module.__name__
            idle = int(torch.nonzero(~units[0])[0])  # a cell the env ignores: its action changes nothing
            other = action.clone()
            other[:, idle, 6] = (other[:, idle, 6] + 1) % 49
            assert torch.equal(agent.get_action_and_value(obs, other, units, **mask_kw)[1], logprob)
            other[:, 7, 6] = (other[:, 7, 6] + 1) % 49  # an acting unit's does
            if module is plain:
                assert not torch.allclose(agent.get_action_and_value(obs, other, units, **mask_kw)[1], logprob)
            everything = agent.get_action_and_value(obs, action, None, **mask_kw)[2]
            assert (everything > entropy).all()  # without `units` every cell counts (the former, noisy sum)


# ---------------------------------------------------------------- invalid action masking (no JVM)


def test_masked_components_are_never_sampled(masked):
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 20, sum(PLANE), generator=generator)
    mask = random_mask(generator, 1, cells=20, empty_cells=0)
    mask[0, :, :6] = False
    mask[0, :, 0] = True  # NOOP is the only valid action type
    logits[..., 1:6] += 10.0  # and the invalid ones would be chosen almost always without the mask
    draws, start = 4000, 0
    for n in PLANE:
        part, valid = logits[..., start : start + n], mask[..., start : start + n]
        start += n
        samples = masked.CategoricalMasked(part.expand(draws, -1, -1), valid.expand(draws, -1, -1)).sample()
        picked = torch.zeros_like(valid[0]).scatter_(-1, samples.T, True)  # (cells, n): values drawn at least once
        assert not (picked & ~valid[0]).any(), f"an invalid value of a {n}-way component was sampled"
        assert (picked == valid[0]).all() or n == 49  # every valid value shows up (49-way: too many to be sure)
    # through the agent: sampled actions respect the mask of every cell
    agent = masked.Agent(fake_envs())
    obs = torch.randint(0, 2, (1, 27, 10, 10), dtype=torch.uint8, generator=generator).expand(2000, -1, -1, -1)
    full_mask = random_mask(generator, 1, empty_cells=0).expand(2000, -1, -1)
    with torch.no_grad():
        action, *_ = agent.get_action_and_value(obs, mask=full_mask)
    offsets = torch.tensor(np.cumsum([0] + PLANE[:-1]))
    chosen = torch.gather(full_mask, 2, action + offsets)  # the mask bit of every sampled value
    assert chosen.all()


def test_masked_entropy_equals_the_entropy_of_the_renormalized_valid_subset(masked):
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 49, generator=generator) * 2
    mask = torch.rand(64, 49, generator=generator) < 0.3
    mask[:, 0] = True
    mask[-1] = False  # a row without valid actions has entropy 0
    entropy = masked.CategoricalMasked(logits, mask).entropy()
    for row in range(63):
        expected = Categorical(logits=logits[row][mask[row]]).entropy()
        assert entropy[row].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert entropy[-1].item() == 0.0
    # the masked values add nothing even where their probabilities are not exactly 0 (float64: uniform -1e8 logits)
    assert masked.CategoricalMasked(logits.double(), mask).entropy()[-1].item() == 0.0
    probs = masked.CategoricalMasked(logits, mask).probs
    assert (probs[:63][~mask[:63]] == 0).all() and torch.allclose(probs[:63].sum(-1), torch.ones(63))


def test_no_gradient_reaches_masked_logits(masked):
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(32, 78, generator=generator, requires_grad=True)
    mask = random_mask(generator, 1, cells=32, empty_cells=4)[0]
    start, loss = 0, 0.0
    for n in PLANE:
        dist = masked.CategoricalMasked(logits[:, start : start + n], mask[:, start : start + n])
        loss = loss + dist.log_prob(dist.sample()).sum() + dist.entropy().sum()
        start += n
    loss.backward()
    assert (logits.grad[~mask] == 0).all()
    assert (logits.grad[mask] != 0).float().mean() > 0.8  # valid ones do (not those alone in their component)


# ---------------------------------------------------------------- gym-microrts absent (simulated)


def test_clear_error_without_gym_microrts(tmp_path):
    hidden = tmp_path / "hide"
    (hidden / "gym_microrts").mkdir(parents=True)  # shadows the installed package, as if it were absent
    (hidden / "gym_microrts" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'gym_microrts'\")\n")
    for name in (PLAIN, MASK):
        result = run_script(name, "--total-timesteps", "1024", cwd=tmp_path, env={"PYTHONPATH": str(hidden), **ONE_THREAD})
        assert result.returncode != 0
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: MicroRTS needs gym-microrts and Java"), result.stderr
        assert "tools/install_microrts.sh" in lines[0]
        assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(importlib.util.find_spec("gym_microrts") is None, reason="gym-microrts is not installed")
def test_clear_error_without_java(tmp_path):
    env = {"PATH": str(tmp_path), "JAVA_HOME": "", **ONE_THREAD}  # no `java` on PATH (the script runs as sys.executable)
    result = run_script(PLAIN, "--total-timesteps", "1024", cwd=tmp_path, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: MicroRTS needs gym-microrts and Java"), (
        result.stderr
    )


# ---------------------------------------------------------------- on gym-microrts (subprocesses: one JVM each)

ADAPTER_CHECK = """
import importlib.util, json, sys
import numpy as np, torch
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
m.SCENARIOS["MicrortsMining-v1"] = ("passiveAI", [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 30)  # 30-tick episodes
envs = m.make_envs(m.Args(num_envs=2), "test")
obs, _ = envs.reset(seed=1)
mask = envs.get_action_mask()
out = {"obs": [list(obs.shape), str(obs.dtype), int(obs.max())], "nvec": envs.single_action_space.nvec.tolist()[:2],
       "nvec_shape": list(envs.single_action_space.nvec.shape), "mask": list(mask.shape),
       "valid_cells": int(mask.any(-1).sum()), "dones": [], "episodes": [], "rewards": [], "invalid": 0,
       "units": list(envs.get_unit_mask().shape), "unit_cells": int(envs.get_unit_mask().sum()),
       "units_are_the_envs": bool((envs.get_unit_mask() == envs.source_unit_mask).all())}
torch.manual_seed(0)
agent = m.Agent(envs)
for t in range(75):
    mask = torch.as_tensor(envs.get_action_mask()).bool()
    with torch.no_grad():
        kwargs = {"mask": mask} if hasattr(m, "CategoricalMasked") else {}
        action, *_ = agent.get_action_and_value(torch.as_tensor(obs), **kwargs)
    nvec = envs.single_action_space.nvec[0].tolist()
    offsets = torch.tensor(np.cumsum([0] + nvec[:-1]))
    has_valid = torch.stack([part.any(-1) for part in torch.split(mask, nvec, dim=-1)], -1)  # (envs, cells, 7)
    out["invalid"] += int((~torch.gather(mask, 2, action + offsets))[has_valid].sum())  # picked a value the game forbids
    obs, reward, term, trunc, infos = envs.step(action.numpy())
    out["rewards"].append(reward.tolist())
    out["dones"].append([bool(d) for d in np.logical_or(term, trunc)])
    if "episode" in infos.get("final_info", {}):
        ended = infos["final_info"]["_episode"]
        ep = infos["final_info"]["episode"]
        out["episodes"].append([t, ended.tolist(), ep["r"][ended].tolist(), ep["l"][ended].tolist()])
print(json.dumps(out))
envs.close()
"""


def run_adapter_check(tmp_path, name):
    result = subprocess.run(
        [sys.executable, "-c", ADAPTER_CHECK, str(ROOT / name)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, **ONE_THREAD},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_microrts
@pytest.mark.parametrize("name", [PLAIN, MASK])
def test_microrts_adapter_spaces_dones_and_episode_statistics(tmp_path, name):
    out = run_adapter_check(tmp_path, name)
    assert out["obs"] == [[2, 27, 10, 10], "uint8", 1]  # channels first, one-hot planes
    assert out["nvec_shape"] == [100, 7] and out["nvec"] == [PLANE, PLANE]
    assert out["mask"] == [2, 100, 78] and out["valid_cells"] >= 2  # at least a base and a worker per env can act
    assert out["units"] == [2, 100] and out["unit_cells"] >= 2 and out["units_are_the_envs"]  # the cells it executes
    dones = np.array(out["dones"])
    assert dones[[29, 59]].all() and dones.sum() == 4  # both games end at tick 30 and 60, and only then (ppo2's dones)
    rewards = np.array(out["rewards"])
    assert [e[0] for e in out["episodes"]] == [29, 59]
    for t, ended, returns, lengths in out["episodes"]:
        assert ended == [True, True] and lengths == [30, 30]
        np.testing.assert_allclose(returns, rewards[t - 29 : t + 1].sum(0))  # one return per finished episode
    if name == MASK:
        assert out["invalid"] == 0  # the masked agent only picks values the game allows
    else:
        assert out["invalid"] > 0  # without masks, invalid values are picked (the test can tell them apart)


@needs_microrts
@pytest.mark.parametrize("name", [PLAIN, MASK])
def test_smoke_run_on_the_default_scenario(tmp_path, name):
    result = run_script(
        name, "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "256", "--num-minibatches", "2",
        "--update-epochs", "2", "--save-model", cwd=tmp_path, env=ONE_THREAD, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.name.startswith(f"MicrortsMining-v1__{name[:-3]}__1__")
    scalars = read_scalars(run_dir)
    for tag in ["charts/learning_rate", "charts/SPS", "losses/value_loss", "losses/policy_loss", "losses/entropy",
                "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"]:  # fmt: skip
        assert [step for step, _ in scalars[tag]] == [128, 256], tag
    entropy = scalars["losses/entropy"][0][1]
    cell = float(np.log(PLANE).sum())  # a near-uniform first policy (policy head gain 0.01): a cell's 7 components
    # only the cells whose unit can act now (a base or a worker when idle; 0.2 cells a step here), not all 100 cells
    assert 0 < entropy < 5 * cell  # masked: besides, only the valid values of those cells
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["script"] == name and checkpoint["iteration"] == 2
    plays = []
    # one 2,000-tick game; seeded, so played alike twice, each in its own JVM: by the masked script, whose evaluate()
    # is the other's plus the mask, twice; by the other once
    for _ in range(2 if name == MASK else 1):
        res = run_script(name, "--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 1, cwd=tmp_path,
                         env=ONE_THREAD, timeout=300)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        (line,) = [line for line in res.stdout.splitlines() if line.startswith("eval: each episode's return")]
        plays.append([float(r) for r in line.split(":")[-1].split()])
    assert len(plays[0]) == 1 and plays[0] == plays[-1]

"""ppo_continuous_action.py: the 9 continuous details, normalization in checkpoints, truncation bootstrapping."""

import ast
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_script
from tbutil import read_scalars

SCRIPT = "ppo_continuous_action.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # tiny networks: one thread is much faster on a shared 2-core machine
ONE_THREAD_ENV = {**os.environ, "PYTHONUNBUFFERED": "1", **ONE_THREAD}


@pytest.fixture(scope="module")
def cont():
    return load_script(SCRIPT)


def make_envs(cont, env_id="Pendulum-v1", num_envs=1, **kwargs):
    args = cont.Args(env_id=env_id, num_envs=num_envs, **kwargs)
    assert cont.check_args(args) is None
    return args, cont.make_envs(args, "test")


def test_defaults_are_ppo2_mujoco(cont):
    args = cont.Args()
    assert cont.check_args(args) is None
    assert (args.env_id, args.num_envs, args.num_steps, args.total_timesteps) == ("HalfCheetah-v4", 1, 2048, 1000000)
    assert (args.learning_rate, args.anneal_lr, args.num_minibatches, args.update_epochs) == (3e-4, True, 32, 10)
    assert (args.clip_coef, args.ent_coef, args.vf_coef, args.gae_lambda, args.gamma) == (0.2, 0.0, 0.5, 0.95, 0.99)
    assert args.bootstrap_truncated is False and args.minibatch_size == 64


def test_every_continuous_detail_is_tagged_once():
    source = (ROOT / SCRIPT).read_text()
    for n in range(1, 10):
        assert source.count(f"# detail continuous-{n}: ") == 1, f"continuous-{n}"


def top_level_sources(name):
    source = (ROOT / name).read_text()
    return {node.name: ast.get_source_segment(source, node) for node in ast.parse(source).body if hasattr(node, "name")}


def test_shared_passages_are_identical_to_ppo():
    ppo, cont = top_level_sources("ppo.py"), top_level_sources(SCRIPT)
    shared = ["layer_init", "compute_gae", "ppo_loss", "make_optimizer", "gradient_step", "open_run"]  # check_args: dm_control
    for name in shared + ["open_logs", "catch_signals", "save_checkpoint", "load_checkpoint", "restore", "resume_args"]:
        assert cont[name] == ppo[name], name


def test_diff_against_ppo_stays_under_budget():
    diff = subprocess.run(["diff", "-u", "ppo.py", SCRIPT], cwd=ROOT, capture_output=True, text=True).stdout
    changed = [line for line in diff.splitlines() if re.match(r"[-+][^-+]", line)]  # grep -c '^[-+][^-+]'
    assert 0 < len(changed) < 155, len(changed)  # 117 before ppo2's RunningMeanStd (issue 9), 135 before the ablation flags


def test_logstd_parameter_initialised_to_zero_and_state_independent(cont):
    args, envs = make_envs(cont, "HalfCheetah-v4")
    agent = cont.Agent(envs)
    envs.close()
    assert isinstance(agent.actor_logstd, torch.nn.Parameter) and agent.actor_logstd.shape == (1, 6)
    assert torch.equal(agent.actor_logstd.data, torch.zeros(1, 6))
    optimized = {id(p) for group in cont.make_optimizer(agent, args).param_groups for p in group["params"]}
    assert id(agent.actor_logstd) in optimized  # learned with the rest
    # separate 64-64 tanh actor and critic; heads orthogonal with std 0.01 (actor mean) and 1.0 (critic)
    for net, head_std in [(agent.actor, 0.01), (agent.critic, 1.0)]:
        assert [type(m).__name__ for m in net] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
        assert net[0].out_features == 64 and net[2].out_features == 64
        w = net[4].weight.data
        assert torch.allclose(w @ w.T, head_std**2 * torch.eye(w.shape[0]), atol=1e-6 * max(head_std**2, 1e-4))
    assert set(agent.actor.parameters()).isdisjoint(agent.critic.parameters())
    # the spread does not depend on the state: the same entropy for every observation, set by log std alone
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-1.0, -0.5, 0.0, 0.3, 0.7, 1.2]]))
        obs = torch.randn(32, 17) * 5
        _, _, entropy, _ = agent.get_action_and_value(obs)
    expected = 6 * 0.5 * (1 + math.log(2 * math.pi)) + agent.actor_logstd.sum().item()
    assert torch.allclose(entropy, torch.full((32,), expected), atol=1e-5)


def test_logprob_of_stored_unclipped_actions(cont):
    _, envs = make_envs(cont, "HalfCheetah-v4")
    agent = cont.Agent(envs)
    envs.close()
    torch.manual_seed(0)
    with torch.no_grad():
        agent.actor_logstd.fill_(1.0)  # std e: many samples fall outside the action bounds [-1, 1]
        obs = torch.randn(64, 17)
        action, logprob, _, _ = agent.get_action_and_value(obs)
        assert (action.abs() > 1).any(), "the sample is stored unclipped"
        mean, std = agent.actor(obs), torch.full_like(action, math.e)
        by_hand = (-((action - mean) ** 2) / (2 * std**2) - std.log() - 0.5 * math.log(2 * math.pi)).sum(1)
        assert torch.allclose(logprob, by_hand, atol=1e-5)  # Normal log-prob, summed over the 6 dimensions
        _, relogprob, _, _ = agent.get_action_and_value(obs, action)  # what training recomputes from storage
        assert torch.equal(relogprob, logprob)
        _, clipped_logprob, _, _ = agent.get_action_and_value(obs, action.clamp(-1, 1))
        assert not torch.allclose(clipped_logprob, logprob)


def test_policy_is_torch_normal_bit_for_bit(cont):
    """The written-out Normal samples, scores and differentiates exactly as torch's Normal(mean, std)."""
    from torch.distributions.normal import Normal

    _, envs = make_envs(cont, "HalfCheetah-v4")
    torch.manual_seed(0)
    agent = cont.Agent(envs)
    envs.close()
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-1.0, -0.5, 0.0, 0.3, 0.7, 1.2]]))
    obs = torch.randn(64, 17)

    def torch_normal():
        mean = agent.actor(obs)
        return Normal(mean, agent.actor_logstd.expand_as(mean).exp())

    with torch.no_grad():
        torch.manual_seed(1)
        action, logprob, entropy, _ = agent.get_action_and_value(obs)
        torch.manual_seed(1)
        dist = torch_normal()
        expected = dist.sample()
        assert torch.equal(action, expected)
        assert torch.equal(logprob, dist.log_prob(expected).sum(1)) and torch.equal(entropy, dist.entropy().sum(1))

    weights = torch.randn(2, 64)
    grads = []
    for written_out in (True, False):
        agent.zero_grad()
        if written_out:
            _, logprob, entropy, _ = agent.get_action_and_value(obs, expected)
        else:
            dist = torch_normal()
            logprob, entropy = dist.log_prob(expected).sum(1), dist.entropy().sum(1)
        ((weights[0] * logprob).sum() + (weights[1] * entropy).sum()).backward()
        grads.append([p.grad.clone() for p in [*agent.actor.parameters(), agent.actor_logstd]])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_env_clips_actions_to_bounds(cont):
    # HalfCheetah's control cost uses the action as given, so the reward tells what the env received
    env = cont.make_env("HalfCheetah-v4", 0, False, "test")()
    raw, ref = gym.make("HalfCheetah-v4"), gym.make("HalfCheetah-v4")
    for e in (env, raw, ref):
        e.reset(seed=3)
    big = np.array([5.0, -3.0, 0.5, 2.0, -0.2, -9.0], dtype=np.float32)
    obs, reward, *_ = env.step(big)
    obs_ref, reward_ref, *_ = ref.step(np.clip(big, -1, 1))
    _, reward_raw, *_ = raw.step(big)
    assert reward == reward_ref and np.array_equal(obs, obs_ref)
    assert reward_raw < reward_ref - 5  # unclipped, the control cost would be far larger
    for e in (env, raw, ref):
        e.close()


def lockstep(cont, gamma=0.99, num_envs=2):
    """The script's Pendulum-v1 envs and plain ones (no wrappers), to be stepped with the same seeds and actions."""
    args, envs = make_envs(cont, num_envs=num_envs, gamma=gamma)
    ref = gym.vector.SyncVectorEnv(
        [lambda: gym.make("Pendulum-v1")] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    return args, envs, ref


def test_observation_normalization_and_clipping(cont):
    _, envs, ref = lockstep(cont)
    obs, _ = envs.reset(seed=5)
    raw, _ = ref.reset(seed=5)
    assert envs.obs_rms.count == pytest.approx(1e-4 + 2)  # one set of statistics for both envs
    rng = np.random.default_rng(0)
    for _ in range(20):
        mean = envs.obs_rms.mean
        actions = rng.uniform(-2, 2, (2, 1)).astype(np.float32)
        obs, *_ = envs.step(actions)
        raw, *_ = ref.step(actions)
        new_mean = mean + (raw.mean(0) - mean) * 2 / (envs.obs_rms.count)  # the update before normalizing
        assert np.allclose(envs.obs_rms.mean, new_mean)
        expected = np.clip((raw - envs.obs_rms.mean) / np.sqrt(envs.obs_rms.var + 1e-8), -10, 10)
        assert obs.dtype == np.float32 and np.allclose(obs, expected, atol=1e-5)
    # with a tiny variance, normalized observations would be huge: they are clipped to [-10, 10]
    envs.obs_rms.mean, envs.obs_rms.var, envs.training = np.zeros(3), np.full(3, 1e-6), False
    obs, *_ = envs.step(np.zeros((2, 1), np.float32))
    raw, *_ = ref.step(np.zeros((2, 1), np.float32))
    assert obs.min() >= -10 and obs.max() <= 10 and (np.abs(obs) == 10).any()
    assert np.allclose(obs, np.clip(raw / np.sqrt(1e-6 + 1e-8), -10, 10), atol=1e-4)
    envs.close()
    ref.close()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, n", [((17,), 1), ((17,), 4), ((), 1), ((), 8), ((4, 3), 3)])
def test_running_mean_std_is_ppo2s_bit_for_bit(cont, dtype, shape, n):
    # the written-out statistics must give exactly the numbers of ppo2's RunningMeanStd (gymnasium's is the same code)
    from gymnasium.wrappers.utils import RunningMeanStd

    ref, ours, rng = RunningMeanStd(shape=shape), cont.RunningMeanStd(shape=shape), np.random.default_rng(0)
    for _ in range(500):
        x = (rng.normal(size=(n, *shape)) * rng.uniform(0.1, 100) + rng.normal()).astype(dtype)
        ref.update(x)
        ours.update(x)
        assert np.array_equal(ours.mean, ref.mean) and np.array_equal(ours.var, ref.var) and ours.count == ref.count
        assert ours.mean.dtype == ref.mean.dtype and ours.var.dtype == ref.var.dtype


def test_reward_scaling_by_discounted_return_std_and_clipping(cont):
    gamma = 0.9  # the script's gamma is the one used
    _, envs, ref = lockstep(cont, gamma=gamma)
    envs.reset(seed=5)
    ref.reset(seed=5)
    ret, rets, rng = np.zeros(2), [], np.random.default_rng(1)
    for _ in range(30):
        actions = rng.uniform(-2, 2, (2, 1)).astype(np.float32)
        _, reward, *_ = envs.step(actions)
        _, raw, *_ = ref.step(actions)
        ret = ret * gamma + raw
        rets.append(ret.copy())
        all_rets = np.concatenate(rets)
        # running variance (starting from count 1e-4, var 1) of every discounted return seen
        count = 1e-4 + len(all_rets)
        var = (1e-4 * 1.0 + len(all_rets) * all_rets.var() + all_rets.mean() ** 2 * 1e-4 * len(all_rets) / count) / count
        assert envs.ret_rms.var == pytest.approx(var, rel=1e-6)
        assert np.allclose(reward, np.clip(raw / np.sqrt(var + 1e-8), -10, 10), rtol=1e-5)
    # a tiny return std makes scaled rewards huge: they are clipped to [-10, 10]
    envs.ret_rms.var, envs.training = 1e-6, False
    _, reward, *_ = envs.step(np.full((2, 1), 2.0, np.float32))
    _, raw, *_ = ref.step(np.full((2, 1), 2.0, np.float32))
    assert (raw < -0.01).all() and np.array_equal(reward, np.full(2, -10.0))
    envs.close()
    ref.close()


def test_final_obs_normalized_without_updating_statistics(cont):
    _, envs, ref = lockstep(cont, num_envs=1)
    envs.reset(seed=7)
    ref.reset(seed=7)
    for _ in range(200):  # Pendulum-v1 is truncated after 200 steps
        count = envs.obs_rms.count
        obs, _, terminations, truncations, infos = envs.step(np.ones((1, 1), np.float32))
        _, _, _, _, ref_infos = ref.step(np.ones((1, 1), np.float32))
    assert truncations[0] and not terminations[0] and infos["_final_obs"][0]
    assert envs.obs_rms.count == count + 1  # the new episode's first obs counts, the final one does not
    raw_final = ref_infos["final_obs"][0]
    expected = np.clip((raw_final - envs.obs_rms.mean) / np.sqrt(envs.obs_rms.var + 1e-8), -10, 10)
    assert np.allclose(infos["final_obs"][0], expected, atol=1e-5) and not np.allclose(raw_final, expected, atol=1e-2)
    envs.close()
    ref.close()


def final_obs_infos(final):
    """gymnasium's infos for one step of 2 envs: `final` maps an env index to its final observation."""
    if not final:
        return {}
    final_obs, mask = np.full(2, None, dtype=object), np.zeros(2, dtype=bool)
    for i, o in final.items():
        final_obs[i], mask[i] = np.array(o, dtype=np.float32), True
    return {"final_obs": final_obs, "_final_obs": mask}


def test_bootstrap_truncated_on_a_constructed_sequence(cont):
    gamma = 0.5
    # env 0: truncated (time limit) at t=2 with final obs [10]; terminated at the time limit at t=4; env 1 never ends
    raw_rewards = np.array([[1, 10], [2, 10], [3, 10], [4, 10], [5, 10], [6, 10]], dtype=np.float64)
    terms = [[0, 0], [0, 0], [0, 0], [0, 0], [1, 0], [0, 0]]
    truncs = [[0, 0], [0, 0], [1, 0], [0, 0], [1, 0], [0, 0]]
    finals = [{}, {}, {0: [10.0]}, {}, {0: [99.0]}, {}]
    seen = []

    def value_fn(o):  # V(obs) = obs[0]
        seen.append(o.copy())
        return o[:, 0].astype(np.float64)

    def returns(bootstrap):
        rewards = []
        for r, te, tr, fo in zip(raw_rewards, terms, truncs, finals):
            te, tr = np.array(te, dtype=bool), np.array(tr, dtype=bool)
            rewards.append(cont.bootstrap_truncated(r, te, tr, final_obs_infos(fo), value_fn, gamma) if bootstrap else r)
        dones = torch.tensor([[0, 0], [0, 0], [0, 0], [1, 0], [0, 0], [1, 0]], dtype=torch.float32)
        values = torch.randn(6, 2)  # lambda = 1: returns are Monte Carlo returns, whatever the values
        next_value = torch.tensor([[7.0, 0.0]])
        _, ret = cont.compute_gae(
            torch.tensor(np.array(rewards), dtype=torch.float32), values, dones, next_value, torch.zeros(2), gamma, 1.0
        )
        return ret[:, 0]

    assert torch.allclose(returns(True), torch.tensor([4.0, 6.0, 8.0, 6.5, 5.0, 9.5]))  # 3 + 0.5 * V([10]) = 8
    assert len(seen) == 1 and seen[0].shape == (1, 1) and seen[0][0, 0] == 10.0  # only the truncated env's final obs
    assert torch.allclose(returns(False), torch.tensor([2.75, 3.5, 3.0, 6.5, 5.0, 9.5]))  # ppo2: treated as terminal


def test_normalization_stats_checkpoint_round_trip(cont, tmp_path):
    args, envs = make_envs(cont, num_envs=2)
    envs.reset(seed=1)
    for _ in range(50):
        envs.step(envs.action_space.sample())
    agent = cont.Agent(envs)
    cont.save_checkpoint(tmp_path / "c.pt", agent, cont.make_optimizer(agent, args), envs, args, "run", 1)
    checkpoint = cont.load_checkpoint(str(tmp_path / "c.pt"))  # weights_only=True
    _, restored = make_envs(cont, num_envs=1)
    restored.load_state_dict(checkpoint["normalize"])
    for a, b in [(envs.obs_rms, restored.obs_rms), (envs.ret_rms, restored.ret_rms)]:
        for key in ("mean", "var", "count"):
            x, y = np.asarray(getattr(a, key)), np.asarray(getattr(b, key))
            assert x.dtype == y.dtype == np.float64 and np.array_equal(x, y), key
    assert restored.obs_rms.count == pytest.approx(1e-4 + 2 + 100) and restored.ret_rms.count == pytest.approx(1e-4 + 100)
    envs.close()
    restored.close()


def test_resume_restores_stats_and_eval_freezes_them(cont, tmp_path, monkeypatch):
    common = ["--env-id", "Pendulum-v1", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "1"]
    # 2 iterations of 128 steps, through a truncation at step 200 with --bootstrap-truncated
    first = run_script(
        SCRIPT, *common, "--total-timesteps", "256", "--save-model", "--bootstrap-truncated", cwd=tmp_path, env=ONE_THREAD
    )
    assert first.returncode == 0, first.stderr[-2000:]
    path = next(Path(tmp_path, "runs").rglob("checkpoint.pt"))
    before = torch.load(path, weights_only=True)
    assert before["iteration"] == 2 and before["args"]["bootstrap_truncated"]
    before["args"]["total_timesteps"] = 384  # one more iteration on resume
    torch.save(before, path)
    second = run_script(SCRIPT, "--resume", path, cwd=tmp_path, env=ONE_THREAD)
    assert second.returncode == 0, second.stderr[-2000:]
    after = torch.load(path, weights_only=True)
    assert after["iteration"] == 3
    # continued from the saved statistics: + 1 reset observation + 128 steps (a fresh start would count 1e-4 + 129)
    assert after["normalize"]["obs"][2].item() == pytest.approx(before["normalize"]["obs"][2].item() + 129, abs=1e-9)
    assert after["normalize"]["ret"][2].item() == pytest.approx(before["normalize"]["ret"][2].item() + 128, abs=1e-9)

    original, built = cont.make_envs, []  # keep the envs evaluate() builds, to look at their statistics
    monkeypatch.setattr(cont, "make_envs", lambda *a, **k: built.append(original(*a, **k)) or built[-1])
    returns = cont.evaluate(cont.Args(eval_episodes=2), cont.load_checkpoint(str(path)), torch.device("cpu"), None)
    assert len(returns) == 2 and all(-2000 < r <= 0 for r in returns)
    (envs,) = built
    assert envs.training is False
    saved = after["normalize"]
    for name, rms in (("obs", envs.obs_rms), ("ret", envs.ret_rms)):  # loaded, and unchanged by 400 eval steps
        for i, key in enumerate(["mean", "var", "count"]):
            assert np.array_equal(np.asarray(getattr(rms, key)), saved[name][i].numpy()), f"{name} {key}"


def test_interrupt_mid_rollout_saves_statistics_of_the_completed_iterations(tmp_path):
    # long rollouts and a one-minibatch update: a signal after iteration 1 almost surely lands in a rollout
    cmd = [sys.executable, str(ROOT / SCRIPT), "--env-id", "Pendulum-v1", "--num-steps", "4096", "--num-minibatches", "1",
           "--update-epochs", "1", "--total-timesteps", "409600"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ONE_THREAD_ENV)
    out = []
    for line in proc.stdout:  # the first status line comes after iteration 1
        out.append(line)
        if line.startswith("step "):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out.extend(proc.stdout)
    assert proc.wait(timeout=120) == 130, "".join(out)
    ckpt = torch.load(next(Path(tmp_path, "runs").rglob("checkpoint.pt")), weights_only=True)
    k = ckpt["iteration"]
    assert k >= 1, "".join(out)
    # after k whole iterations: the reset observation + 4096 per iteration; the cut rollout's steps are not counted
    assert ckpt["normalize"]["obs"][2].item() == pytest.approx(1e-4 + 1 + 4096 * k, abs=1e-9)
    assert ckpt["normalize"]["ret"][2].item() == pytest.approx(1e-4 + 4096 * k, abs=1e-9)


def test_smoke_run_logs_tensorboard(tmp_path):
    result = run_script(
        SCRIPT, "--total-timesteps", "256", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "1",
        cwd=tmp_path, env=ONE_THREAD,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.name.startswith("HalfCheetah-v4__ppo_continuous_action__1__")
    scalars = read_scalars(run_dir)
    for tag in ["charts/learning_rate", "charts/SPS", "losses/value_loss", "losses/policy_loss", "losses/entropy",
                "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"]:  # fmt: skip
        assert [step for step, _ in scalars[tag]] == [128, 256], tag
    assert scalars["losses/entropy"][0][1] == pytest.approx(6 * 0.5 * (1 + math.log(2 * math.pi)), rel=1e-3)  # log std 0


def test_v5_with_headless_video(tmp_path, monkeypatch):
    monkeypatch.delenv("MUJOCO_GL", raising=False)  # the script picks EGL itself (16 frames: software rendering is slow)
    result = run_script(
        SCRIPT, "--env-id", "HalfCheetah-v5", "--capture-video", "--total-timesteps", "16", "--num-steps", "16",
        "--num-minibatches", "2", "--update-epochs", "1", cwd=tmp_path, env=ONE_THREAD,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    videos = list(Path(tmp_path, "videos").rglob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000
    assert run_dirs(tmp_path)[0].name.startswith("HalfCheetah-v5__")


def test_discrete_env_is_refused_with_one_line(cont, tmp_path):
    result = run_script(SCRIPT, "--env-id", "CartPole-v1", cwd=tmp_path, env=ONE_THREAD)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Box" in lines[0] and "ppo.py" in lines[0], result.stderr
    assert not list(Path(tmp_path).glob("runs/*"))  # refused before training starts: its folder removed again
    args = cont.Args(num_minibatches=3)
    assert "--num-minibatches 3" in cont.check_args(args)
    res = run_script(SCRIPT, "--env-id", "HalfCheetah-v99", cwd=tmp_path, env=ONE_THREAD)  # gymnasium's own line
    assert res.returncode == 1 and "HalfCheetah-v99" in res.stderr.strip().splitlines()[-1]


def test_learns_inverted_pendulum(tmp_path):
    result = run_script(
        SCRIPT, "--env-id", "InvertedPendulum-v4", "--total-timesteps", "8192", "--num-steps", "1024",
        "--num-minibatches", "16", "--update-epochs", "5", cwd=tmp_path, env=ONE_THREAD,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    returns = [r for _, r in read_scalars(run_dirs(tmp_path)[0])["charts/episodic_return"]]
    first, last = np.mean(returns[:10]), np.mean(returns[-10:])
    assert last > 4 * first and last > 40, (first, last)  # measured: 6.9 -> 74.7 (seed 1), 8.3 -> 125.0 (seed 2)

"""ppo.py and ppo_shared.py: each core detail checked directly, then whole runs in subprocesses."""

import difflib
import math
import os
import select
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_python, run_script
from tbutil import read_scalars
from torch import nn

SCRIPTS = ["ppo.py", "ppo_shared.py"]


def small_args(module, **overrides):
    args = module.Args(**overrides)
    assert module.check_args(args) is None
    return args


def cartpole_envs(module, num_envs=2):
    return module.make_envs(small_args(module, num_envs=num_envs), None)


def assert_orthogonal(weight, gain):
    w = weight.detach().double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    torch.testing.assert_close(gram, gain**2 * torch.eye(gram.shape[0], dtype=torch.double), atol=1e-5, rtol=1e-4)


# core-2 (and core-13: which layers exist)
@pytest.mark.parametrize("script", SCRIPTS)
def test_orthogonal_init_scales(script):
    module = load_script(script)
    envs = cartpole_envs(module)
    agent = module.Agent(envs)
    envs.close()
    if script == "ppo.py":
        hidden = [agent.actor[0], agent.actor[2], agent.critic[0], agent.critic[2]]
        policy_head, value_head = agent.actor[4], agent.critic[4]
    else:
        hidden = [agent.network[0], agent.network[2]]
        policy_head, value_head = agent.actor, agent.critic
    for layer in hidden:
        assert_orthogonal(layer.weight, math.sqrt(2))
    assert_orthogonal(policy_head.weight, 0.01)
    assert_orthogonal(value_head.weight, 1.0)
    for layer in [*hidden, policy_head, value_head]:
        assert torch.count_nonzero(layer.bias) == 0
    n_linear = sum(isinstance(m, nn.Linear) for m in agent.modules())
    assert n_linear == (6 if script == "ppo.py" else 4)  # core-13: separate vs shared trunk


CATEGORICAL_SCRIPTS = ["ppo.py", "ppo_shared.py", "ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py"]
CATEGORICAL_SCRIPTS += ["ppo_atari_multigpu.py"]


def written_out_categorical(script):
    """The lines of a script's policy from its 'Categorical distribution written out' comment to its return."""
    lines = (ROOT / script).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "the Categorical written out" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("return "))
    return lines[start:end]


def test_written_out_categorical_is_the_same_in_every_script():
    reference = written_out_categorical("ppo.py")
    assert len(reference) >= 5
    for script in CATEGORICAL_SCRIPTS[1:]:
        assert written_out_categorical(script) == reference, script


def policy_logits(agent, x):
    if hasattr(agent, "network"):  # the Nature-CNN scales the pixels inside the network
        return agent.actor(agent.network(x / 255.0))
    return agent.actor(x)


@pytest.mark.parametrize("script", ["ppo.py", "ppo_atari.py"])
def test_policy_is_torch_categorical_bit_for_bit(script):
    """The written-out policy samples, scores and differentiates exactly as torch's Categorical(logits=...)."""
    from torch.distributions.categorical import Categorical

    module = load_script(script)
    if script == "ppo.py":
        obs_space, x = gym.spaces.Box(-1, 1, (3,)), torch.randn(64, 3)
    else:
        obs_space, x = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    envs = SimpleNamespace(single_observation_space=obs_space, single_action_space=gym.spaces.Discrete(6))
    torch.manual_seed(0)
    agent = module.Agent(envs)
    for p in agent.actor.parameters():  # sharper logits than the 0.01-scaled head gives, so samples vary
        p.data.mul_(300.0)

    torch.manual_seed(1)
    action, logprob, entropy, value = agent.get_action_and_value(x)
    torch.manual_seed(1)
    dist = Categorical(logits=policy_logits(agent, x))
    expected_action = dist.sample()
    assert torch.equal(action, expected_action) and len(set(action.tolist())) > 1
    assert torch.equal(logprob, dist.log_prob(expected_action)) and torch.equal(entropy, dist.entropy())
    assert action.shape == logprob.shape == entropy.shape == (x.shape[0],)

    # training path: given actions (stored as floats), same values and same gradients
    weights = torch.randn(2, x.shape[0])
    grads = []
    for written_out in (True, False):
        agent.zero_grad()
        if written_out:
            _, logprob, entropy, _ = agent.get_action_and_value(x, expected_action.float())
        else:
            dist = Categorical(logits=policy_logits(agent, x))
            logprob, entropy = dist.log_prob(expected_action.float()), dist.entropy()
        ((weights[0] * logprob).sum() + (weights[1] * entropy).sum()).backward()
        grads.append([p.grad.clone() for p in agent.parameters() if p.grad is not None])  # the CNN trunk's too
    assert len(grads[0]) == len(grads[1]) >= 6 and all(torch.equal(a, b) for a, b in zip(*grads))


# core-3
def test_adam_epsilon(ppo):
    envs = cartpole_envs(ppo)
    optimizer = ppo.make_optimizer(ppo.Agent(envs), small_args(ppo, learning_rate=1e-3))
    envs.close()
    assert isinstance(optimizer, torch.optim.Adam)
    assert optimizer.defaults["eps"] == 1e-5
    assert optimizer.defaults["lr"] == 1e-3


def reference_gae(rewards, values, dones, next_value, next_done, gamma, lam):
    """Plain per-environment GAE: sum of (gamma*lam)^l * delta_{t+l}, stopping at the end of the episode."""
    T, N = rewards.shape
    values_ext = np.vstack([values, next_value])
    dones_ext = np.vstack([dones, next_done])  # dones_ext[t] = 1: obs t starts a new episode
    adv = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                ends_after_k = dones_ext[k + 1, n] == 1
                delta = rewards[k, n] + (0.0 if ends_after_k else gamma * values_ext[k + 1, n]) - values_ext[k, n]
                total += discount * delta
                if ends_after_k:
                    break
                discount *= gamma * lam
            adv[t, n] = total
    return adv


# core-5
def test_gae_against_plain_reference(ppo):
    rng = np.random.default_rng(0)
    T, N = 16, 3
    rewards = rng.normal(size=(T, N))
    values = rng.normal(size=(T, N))
    dones = (rng.random((T, N)) < 0.2).astype(float)
    dones[5, 0] = 1.0  # make sure there are boundaries
    next_value = rng.normal(size=(1, N))
    next_done = np.array([1.0, 0.0, 0.0])
    adv, ret = ppo.compute_gae(
        torch.tensor(rewards),
        torch.tensor(values),
        torch.tensor(dones),
        torch.tensor(next_value),
        torch.tensor(next_done),
        0.99,
        0.95,
    )
    expected = reference_gae(rewards, values, dones, next_value, next_done[None], 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), expected + values, rtol=1e-10, atol=1e-10)


def ppo2_gae_loop(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """ppo2's GAE loop as CleanRL writes it, every quantity computed inside the loop."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


def test_gae_bit_identical_to_the_per_step_loop(ppo):
    # the TD errors are computed for all steps at once (speed): the float32 results must not change at all
    gen = torch.Generator().manual_seed(0)
    for steps, envs in [(128, 4), (2048, 1), (7, 3)]:
        rewards, values = 3 * torch.randn(steps, envs, generator=gen), torch.randn(steps, envs, generator=gen)
        dones = (torch.rand(steps, envs, generator=gen) < 0.1).float()
        next_value, next_done = torch.randn(1, envs, generator=gen), (torch.rand(envs, generator=gen) < 0.5).float()
        adv, ret = ppo.compute_gae(rewards, values, dones, next_value, next_done, 0.99, 0.95)
        expected = ppo2_gae_loop(rewards, values, dones, next_value, next_done, 0.99, 0.95)
        assert adv.dtype == torch.float32 and torch.equal(adv, expected) and torch.equal(ret, expected + values)


def test_gae_hand_computed_boundary(ppo):
    # one env, 3 steps; the episode ends after step 1 (obs 2 starts a new one)
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [2.0]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    adv, _ = ppo.compute_gae(rewards, values, dones, torch.tensor([[4.0]]), torch.tensor([0.0]), 0.5, 0.5)
    d2 = 3.0 + 0.5 * 4.0 - 2.0  # bootstraps from next_value
    d1 = 2.0 - 1.0  # terminal: no bootstrap
    d0 = 1.0 + 0.5 * 1.0 - 0.5
    torch.testing.assert_close(adv, torch.tensor([[d0 + 0.25 * d1], [d1], [d2]]))


# core-6
@pytest.mark.parametrize("shuffle", [True, False])
def test_each_epoch_takes_the_batch_in_a_new_order_in_whole_minibatches(shuffle, tmp_path, monkeypatch):
    """train() shuffles the batch indices once an epoch (not with --no-shuffle-minibatches) and steps once a minibatch."""
    ppo = load_script("ppo.py")
    shuffled, steps, real_shuffle, real_step = [], [], np.random.shuffle, ppo.gradient_step
    monkeypatch.setattr(np.random, "shuffle", lambda x: (real_shuffle(x), shuffled.append(x.copy())))
    monkeypatch.setattr(ppo, "gradient_step", lambda *a: (steps.append(1), real_step(*a)))
    monkeypatch.setattr(ppo, "catch_signals", lambda: SimpleNamespace(requested=0))  # pytest keeps its own handlers
    monkeypatch.chdir(tmp_path)
    args = small_args(ppo, num_envs=2, num_steps=64, total_timesteps=256, shuffle_minibatches=shuffle)
    ppo.train(args)
    assert len(steps) == 2 * 4 * 4  # 2 iterations x 4 epochs x 4 minibatches
    if not shuffle:
        assert shuffled == []  # each epoch takes the batch in its order, 0..127
        return
    assert len(shuffled) == 2 * 4
    for order in shuffled:
        np.testing.assert_array_equal(np.sort(order), np.arange(128))  # a permutation: every sample once an epoch
    assert len({tuple(order) for order in shuffled}) == 8 and tuple(shuffled[0]) != tuple(range(128))


def loss_parts(ppo, ratios, advantages, norm_adv=False, clip_vloss=True, newvalue=None, oldvalues=None, returns=None):
    n = len(ratios)
    args = small_args(ppo, norm_adv=norm_adv, clip_vloss=clip_vloss)
    oldlogprob = torch.full((n,), -1.0)
    newlogprob = oldlogprob + torch.log(torch.tensor(ratios))
    entropy = torch.full((n,), 0.5)
    newvalue = torch.zeros(n, 1) if newvalue is None else torch.tensor(newvalue)[:, None]
    oldvalues = torch.zeros(n) if oldvalues is None else torch.tensor(oldvalues)
    returns = torch.zeros(n) if returns is None else torch.tensor(returns)
    return ppo.ppo_loss(newlogprob, entropy, newvalue, oldlogprob, torch.tensor(advantages), returns, oldvalues, args, 0.2)


# core-8 and core-12 (clip fraction)
def test_clipped_surrogate_hand_computed(ppo):
    _, pg_loss, _, _, _, _, clipfrac = loss_parts(ppo, [0.5, 1.0, 1.5], [1.0, -1.0, 2.0])
    # max(-A*r, -A*clip(r, 0.8, 1.2)): max(-0.5, -0.8) = -0.5; max(1, 1) = 1; max(-3, -2.4) = -2.4
    assert pg_loss.item() == pytest.approx((-0.5 + 1.0 - 2.4) / 3, abs=1e-6)
    assert clipfrac.item() == pytest.approx(2 / 3)


# core-7
def test_advantage_normalization_per_minibatch(ppo):
    adv = [0.3, -1.2, 2.0, 0.7]
    ratios = [0.9, 1.1, 1.3, 0.7]
    pg = loss_parts(ppo, ratios, adv, norm_adv=True)[1].item()
    a = np.array(adv)
    normalized = (a - a.mean()) / (a.std() + 1e-8)  # ppo2: np.std, the population std (ddof=0)
    r = np.array(ratios)
    expected = np.maximum(-normalized * r, -normalized * np.clip(r, 0.8, 1.2)).mean()
    assert pg == pytest.approx(expected, rel=1e-5)
    # the statistics are the minibatch's own: an affine change of its advantages changes nothing
    shifted = loss_parts(ppo, ratios, [10 * x + 5 for x in adv], norm_adv=True)[1].item()
    assert shifted == pytest.approx(pg, rel=1e-4)
    assert loss_parts(ppo, ratios, adv, norm_adv=False)[1].item() != pytest.approx(pg, rel=1e-3)


# core-9 and core-10
def test_value_loss_clipping_and_total_loss(ppo):
    kw = dict(newvalue=[2.0, 0.0], oldvalues=[1.0, 1.0], returns=[3.0, 0.5])
    loss, pg, v_loss, ent, *_ = loss_parts(ppo, [1.0, 1.0], [0.0, 0.0], **kw)
    # sample 1: max((2-3)^2, (1.2-3)^2) = 3.24; sample 2: max((0-0.5)^2, (0.8-0.5)^2) = 0.25
    assert v_loss.item() == pytest.approx(0.5 * (3.24 + 0.25) / 2)
    _, _, v_unclipped, *_ = loss_parts(ppo, [1.0, 1.0], [0.0, 0.0], clip_vloss=False, **kw)
    assert v_unclipped.item() == pytest.approx(0.5 * (1.0 + 0.25) / 2)
    args = small_args(ppo)
    assert loss.item() == pytest.approx(pg.item() - args.ent_coef * ent.item() + args.vf_coef * v_loss.item())
    assert ent.item() == pytest.approx(0.5)


# core-11
def test_global_gradient_clipping(ppo):
    torch.manual_seed(0)
    envs = cartpole_envs(ppo)
    agent = ppo.Agent(envs)
    envs.close()
    optimizer = ppo.make_optimizer(agent, small_args(ppo))
    x = torch.randn(64, 4)

    def big_loss():
        _, logprob, _, value = agent.get_action_and_value(x, torch.zeros(64, dtype=torch.long))
        return 1e3 * (value.pow(2).mean() - logprob.mean())

    big_loss().backward()
    norm_before = torch.norm(torch.stack([p.grad.norm() for p in agent.parameters()]))
    assert norm_before > 0.5
    ppo.gradient_step(optimizer, big_loss(), 0.5)
    norm_after = torch.norm(torch.stack([p.grad.norm() for p in agent.parameters()]))
    assert norm_after <= 0.5 + 1e-5
    assert norm_after == pytest.approx(0.5, rel=1e-3)


def test_check_args_and_check_env_messages(ppo):
    assert "does not divide the batch (512)" in ppo.check_args(ppo.Args(num_minibatches=3))
    assert "below one batch (512)" in ppo.check_args(ppo.Args(total_timesteps=100))
    args = ppo.Args(num_envs=2, num_steps=64, total_timesteps=1000)
    assert ppo.check_args(args) is None and (args.batch_size, args.minibatch_size, args.num_iterations) == (128, 32, 7)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")])
    with pytest.raises(SystemExit, match="use ppo_continuous_action.py"):
        ppo.check_env(envs)
    envs.close()
    discrete = gym.spaces.Discrete(4)
    images = SimpleNamespace(single_action_space=discrete, single_observation_space=gym.spaces.Box(0, 255, (84, 84, 3)))
    with pytest.raises(SystemExit, match="for images use ppo_atari.py"):
        ppo.check_env(images)
    ppo.check_env(SimpleNamespace(single_action_space=discrete, single_observation_space=gym.spaces.Box(0, 1, (8,))))


# --- whole runs -------------------------------------------------------------------------------------------


DEBUG_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/learning_rate",
    "charts/SPS",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]


# core-1, core-4, core-12
@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run_logs_and_lr_schedule(script, tmp_path):
    res = run_script(script, "--total-timesteps", 2048, "--num-envs", 2, "--num-steps", 128, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for tag in DEBUG_TAGS:
        assert tag in scalars, tag
    lrs = scalars["charts/learning_rate"]
    assert [s for s, _ in lrs] == [256 * k for k in range(1, 9)]
    # detail core-4: lr_k = lr * (1 - (k-1)/K); after the last of the K iterations the schedule is at 0
    expected = [2.5e-4 * (1 - k / 8) for k in range(8)]
    np.testing.assert_allclose([v for _, v in lrs], expected, rtol=1e-6)
    assert expected[-1] - 2.5e-4 / 8 == pytest.approx(0.0)
    # aux-1 and aux-3 are off by default: constant clip coefficient, every epoch runs
    assert [v for _, v in scalars["charts/clip_coef"]] == [pytest.approx(0.2)] * 8
    assert {v for _, v in scalars["charts/update_epochs"]} == {4.0}


# aux-1 and aux-3
def test_clip_annealing_and_target_kl_early_stopping(tmp_path):
    args = ["--total-timesteps", 2048, "--num-envs", 2, "--anneal-clip", "--target-kl", 1e-12]
    res = run_script("ppo.py", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    scalars = read_scalars(run_dirs(tmp_path)[0])
    clip = [v for _, v in scalars["charts/clip_coef"]]
    np.testing.assert_allclose(clip, [0.2 * (1 - k / 8) for k in range(8)], rtol=1e-6)  # one step from 0 at the end
    # the KL is checked once per epoch, on the epoch's last minibatch (the blog's and CleanRL's place): after the
    # first epoch's steps it exceeds 1e-12, so each update runs exactly 1 of its 4 epochs (all 4 minibatches of it)
    assert [v for _, v in scalars["charts/update_epochs"]] == [1.0] * 8
    res = run_script("ppo.py", *args[:-1], "1e9", "--exp-name", "loose", cwd=tmp_path)  # a target never reached
    assert res.returncode == 0, res.stderr
    (loose,) = [d for d in run_dirs(tmp_path) if "__loose__" in d.name]
    assert [v for _, v in read_scalars(loose)["charts/update_epochs"]] == [4.0] * 8


def test_learns_cartpole(tmp_path):
    res = run_script("ppo.py", "--seed", 1, "--total-timesteps", 100000, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr
    returns = [v for _, v in read_scalars(run_dirs(tmp_path)[0])["charts/episodic_return"]]
    assert np.mean(returns[-20:]) >= 150, returns[-20:]


def losses_of(run_dir):
    scalars = read_scalars(run_dir)
    return {tag: scalars[tag] for tag in scalars if tag.startswith("losses/") or tag == "charts/episodic_return"}


def test_same_seed_same_losses(tmp_path):
    logs = []
    for name in ["a", "b"]:
        res = run_script("ppo.py", "--total-timesteps", 3072, "--exp-name", name, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        (run_dir,) = [d for d in run_dirs(tmp_path) if f"__{name}__" in d.name]
        logs.append(losses_of(run_dir))
    assert logs[0] and logs[0] == logs[1]


def test_save_model_then_evaluate(tmp_path):
    res = run_script("ppo.py", "--total-timesteps", 2048, "--save-model", "--save-every", 2, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["iteration"] == 4 and ckpt["global_step"] == 2048
    assert set(ckpt) >= {"script", "model", "optimizer", "args", "rng", "run_name", "iteration", "global_step", "wandb_id"}
    assert not list(run_dir.glob("*.tmp*"))  # written atomically, no leftovers
    res = run_script("ppo.py", "--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 3, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "eval: 3 episodes, mean return" in res.stdout


def test_evaluate_records_videos_and_plays_the_same_episodes_again(tmp_path):
    res = run_script("ppo.py", "--total-timesteps", 1024, "--save-model", "--track", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    wandb_runs = len(list((tmp_path / "wandb").glob("offline-run-*")))
    ckpt = run_dir / "checkpoint.pt"
    plays = []
    for flags in [["--capture-video"], []]:
        res = run_script("ppo.py", "--eval-checkpoint", ckpt, "--eval-episodes", 3, *flags, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        (line,) = [line for line in res.stdout.splitlines() if line.startswith("eval: each episode's return")]
        plays.append([float(r) for r in line.split(":")[-1].split()])
    assert len(plays[0]) == 3 and plays[0] == plays[1]  # sampled actions, yet seeded: the same three episodes
    (folder,) = (tmp_path / "videos").glob(f"{run_dir.name}-eval-*")  # videos/<run_name>-eval-<unix time>/
    videos = sorted(p.name for p in folder.glob("*.mp4"))
    assert videos == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]  # RecordVideo's schedule: 0, 1, 8, ...
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == wandb_runs  # the run's --track is not replayed


def test_shared_differs_from_ppo_by_under_40_lines():
    a = (ROOT / "ppo.py").read_text().splitlines()
    b = (ROOT / "ppo_shared.py").read_text().splitlines()
    changed = [
        line for line in difflib.unified_diff(a, b, lineterm="") if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert 0 < len(changed) < 40


def test_status_line_reaches_a_log_file_while_the_run_goes_on(tmp_path):
    """`nohup python ppo.py > log`: stdout is a file or pipe (block-buffered), yet each status line shows at once."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    cmd = [sys.executable, str(ROOT / "ppo.py"), "--total-timesteps", "100000000", "--save-every", "0"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    lines, deadline = b"", time.time() + 120
    try:
        while b"| SPS" not in lines and time.time() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                lines += os.read(proc.stdout.fileno(), 4096)
    finally:
        proc.kill()
        proc.wait()
    assert b"training CartPole-v1" in lines and b"| SPS" in lines, lines  # the first iteration's line, run still going


def run_without(tmp_path, *args, drop=(), extra=None):
    """Run ppo.py in tmp_path with the environment variables `drop` removed (run_script sets WANDB_MODE=offline)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return run_python(ROOT / "ppo.py", *args, cwd=tmp_path, timeout=120, env=env)


def test_env_whose_optional_dependency_is_missing_is_named_in_one_line(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "Box2D.py").write_text("raise ImportError('simulated: Box2D is absent')\n")  # absent even where installed
    res = run_script("ppo.py", "--env-id", "LunarLander-v3", cwd=tmp_path, env={"PYTHONPATH": str(fake)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: LunarLander-v3: ") and "box2d" in lines[0]
    assert not list(tmp_path.glob("runs/*"))


def small_checkpoint(ppo, path, iteration):
    envs = cartpole_envs(ppo)
    agent = ppo.Agent(envs)
    args = small_args(ppo)
    ppo.save_checkpoint(str(path), agent, ppo.make_optimizer(agent, args), envs, args, "run", iteration)
    envs.close()


KILL_DURING_WRITE = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from conftest import load_script
from test_ppo import small_checkpoint
ppo = load_script("ppo.py")
save = ppo.torch.save
def dying_save(obj, path):  # half the bytes on disk, then SIGKILL: no Python cleanup can run
    save(obj, path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    os.kill(os.getpid(), signal.SIGKILL)
ppo.torch.save = dying_save
small_checkpoint(ppo, sys.argv[1], 7)
"""


def test_sigkill_while_writing_a_checkpoint_keeps_the_previous_one(ppo, tmp_path):
    path = tmp_path / "checkpoint.pt"
    small_checkpoint(ppo, path, 6)
    res = subprocess.run([sys.executable, "-c", KILL_DURING_WRITE, str(path), str(ROOT / "tests")], capture_output=True)
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert list(tmp_path.glob("checkpoint.pt.tmp*"))  # the write was cut short...
    assert ppo.load_checkpoint(str(path))["iteration"] == 6  # ...and the previous checkpoint is whole


def test_a_second_signal_during_a_checkpoint_write_leaves_no_temporary_file(ppo, tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    small_checkpoint(ppo, path, 6)

    def interrupted_save(obj, target):  # the second Ctrl-C / SIGTERM arrives mid-write (the handler raises)
        with open(target, "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ppo.torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):  # main() says it stopped at once
        small_checkpoint(ppo, path, 7)
    monkeypatch.undo()
    assert ppo.load_checkpoint(str(path))["iteration"] == 6 and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]

"""ppo_atari_lstm.py: the 5 LSTM details, exact replay of the rollout in training, env-wise minibatches."""

import ast
import math
import subprocess
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_script
from tbutil import read_scalars

SCRIPT, PARENT = "ppo_atari_lstm.py", "ppo_atari.py"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # small batches: one thread is much faster on a shared 2-core machine
NUM_ENVS, NUM_STEPS, WARMUP = 4, 24, 5
# dones[t, e] = 1 when obs[t] of env e begins a new episode (the previous step ended one)
DONES = {(0, 0), (7, 0), (3, 1), (16, 1), (9, 2), (10, 2), (23, 2)}  # env 3 plays one episode through


@pytest.fixture(scope="module")
def lstm():
    return load_script(SCRIPT)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fake_envs(channels=1, n_actions=4):
    obs_space = gym.spaces.Box(0, 255, (channels, 84, 84), np.uint8)
    return SimpleNamespace(single_observation_space=obs_space, single_action_space=gym.spaces.Discrete(n_actions))


def make_agent(lstm, seed=0):
    torch.manual_seed(seed)
    agent = lstm.Agent(fake_envs())
    with torch.no_grad():
        agent.actor.weight.mul_(100)  # a sharp policy, so that a wrong LSTM state shows in the log-probs too
    return agent


def collect_rollout(lstm, agent, seed=0):
    """A rollout as the training loop makes it (synthetic frames, episode ends at DONES), from a non-zero state."""
    gen = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (WARMUP + NUM_STEPS, NUM_ENVS, 1, 84, 84), generator=gen, dtype=torch.uint8)
    state, no_done = agent.initial_state(NUM_ENVS), torch.zeros(NUM_ENVS)
    for t in range(WARMUP):  # earlier rollouts: the state carried into this one is not zero
        _, _, _, state = lstm.rollout_step(agent, frames[t], state, no_done)
    initial_state = (state[0].clone(), state[1].clone())
    dones = torch.zeros(NUM_STEPS, NUM_ENVS)
    for t, e in DONES:
        dones[t, e] = 1.0
    obs = frames[WARMUP:]
    actions, logprobs, values = (torch.zeros(NUM_STEPS, NUM_ENVS) for _ in range(3))
    for step in range(NUM_STEPS):
        action, logprobs[step], values[step], state = lstm.rollout_step(agent, obs[step], state, dones[step])
        actions[step] = action
    batch = {"b_obs": obs.reshape(-1, 1, 84, 84), "b_dones": dones.reshape(-1), "b_actions": actions.reshape(-1).long()}
    return batch, initial_state, logprobs.reshape(-1), values.reshape(-1)


def replay(lstm, agent, batch, initial_state, splits):
    """Log-probs and values recomputed by the training pass, minibatch by minibatch: splits = [(mb_inds, mbenvinds)]."""
    newlogprobs, newvalues = torch.full((NUM_STEPS * NUM_ENVS,), math.nan), torch.full((NUM_STEPS * NUM_ENVS,), math.nan)
    for mb_inds, mbenvinds in splits:
        mb_inds = torch.from_numpy(mb_inds)
        _, newlogprob, _, newvalue, _ = lstm.replay_minibatch(
            agent, batch["b_obs"], batch["b_dones"], batch["b_actions"], initial_state, mb_inds, mbenvinds
        )
        newlogprobs[mb_inds], newvalues[mb_inds] = newlogprob.detach(), newvalue.detach().view(-1)
    return newlogprobs, newvalues


def test_training_pass_reproduces_rollout_distributions(lstm, one_thread):
    # detail lstm-3, lstm-4, lstm-5: with no update in between, the ratio of new to old probabilities is exactly 1
    agent = make_agent(lstm)
    batch, initial_state, logprobs, values = collect_rollout(lstm, agent)
    np.random.seed(0)
    for num_minibatches in (1, 2, 4):
        splits = lstm.minibatches(np.arange(NUM_ENVS), num_minibatches, NUM_STEPS)
        newlogprobs, newvalues = replay(lstm, agent, batch, initial_state, splits)
        assert torch.allclose(newlogprobs, logprobs, atol=1e-5, rtol=0), (newlogprobs - logprobs).abs().max()
        assert torch.allclose(newvalues, values, atol=1e-5, rtol=0), (newvalues - values).abs().max()


def flat(t, e):
    return t * NUM_ENVS + e


@pytest.mark.parametrize("mistake", ["start from zeros", "no reset in training", "split over time"])
def test_replay_check_catches_each_mistake(lstm, one_thread, mistake):
    # the equality above is not trivially true: each way of getting lstm-3..5 wrong breaks it where expected
    agent = make_agent(lstm)
    batch, initial_state, logprobs, values = collect_rollout(lstm, agent)
    splits = lstm.minibatches(np.arange(NUM_ENVS), 2, NUM_STEPS)
    if mistake == "start from zeros":  # lstm-5 wrong: the stored rollout-start state is not used
        initial_state = agent.initial_state(NUM_ENVS)
        wrong = [flat(t, e) for e in (1, 2, 3) for t in range(3)]  # env 0 is reset at t = 0: right there
        right = [flat(t, 0) for t in range(NUM_STEPS)] + [flat(t, e) for e in (1, 2) for t in range(17, NUM_STEPS)]
    elif mistake == "no reset in training":  # lstm-3 wrong in training only
        batch = {**batch, "b_dones": torch.zeros_like(batch["b_dones"])}
        wrong = [flat(t, e) for t, e in DONES]
        right = [flat(t, 3) for t in range(NUM_STEPS)] + [
            flat(t, e) for e in range(3) for t in range(3) if (0, e) not in DONES
        ]
    else:  # lstm-4 wrong: the second half of the rollout replayed from the rollout-start state
        flatinds = np.arange(NUM_STEPS * NUM_ENVS).reshape(NUM_STEPS, NUM_ENVS)
        half, envinds = NUM_STEPS // 2, np.arange(NUM_ENVS)
        splits = [(flatinds[:half].ravel(), envinds), (flatinds[half:].ravel(), envinds)]
        wrong = [flat(half, e) for e in range(NUM_ENVS)]  # no env starts an episode at t = half
        right = [flat(t, e) for e in range(NUM_ENVS) for t in range(half)]
    newlogprobs, newvalues = replay(lstm, agent, batch, initial_state, splits)
    value_err, logprob_err = (newvalues - values).abs(), (newlogprobs - logprobs).abs()
    assert (value_err[wrong] > 1e-3).all() and (logprob_err[wrong] > 1e-4).all(), (value_err[wrong], logprob_err[wrong])
    assert (value_err[right] < 1e-5).all() and (logprob_err[right] < 1e-5).all()


def test_state_reset_at_episode_end(lstm, one_thread):
    # detail lstm-3: where done = 1 the step sees a zero state (rollout and training share get_states)
    agent = make_agent(lstm)
    torch.manual_seed(1)
    x = torch.randint(0, 256, (3, 1, 84, 84), dtype=torch.uint8)
    state = (torch.randn(1, 3, 128), torch.randn(1, 3, 128))
    done = torch.tensor([1.0, 0.0, 1.0])
    torch.manual_seed(2)  # the same draws: the same actions where the distributions are the same
    action, logprob, value, (h, c) = lstm.rollout_step(agent, x, state, done)
    torch.manual_seed(2)
    action0, logprob0, value0, (h0, c0) = lstm.rollout_step(agent, x, agent.initial_state(3), torch.zeros(3))
    assert torch.equal(action[[0, 2]], action0[[0, 2]])
    for got, from_zero in [(logprob, logprob0), (value, value0), (h[0], h0[0]), (c[0], c0[0])]:
        assert torch.allclose(got[[0, 2]], from_zero[[0, 2]], atol=1e-6)
        assert not torch.allclose(got[1], from_zero[1], atol=1e-3)


def test_minibatches_are_whole_env_sequences(lstm):
    # detail lstm-4: each minibatch holds every step of a subset of envs, time-major (as get_states reads it)
    num_envs, num_steps = 8, 5
    rng = np.random.default_rng(0)
    for _epoch in range(5):
        order = rng.permutation(num_envs)  # train() shuffles the env indices before each epoch (core-6)
        splits = lstm.minibatches(order, 4, num_steps)
        assert len(splits) == 4
        for mb_inds, mbenvinds in splits:
            assert len(mbenvinds) == 2
            assert list(mb_inds) == [t * num_envs + e for t in range(num_steps) for e in mbenvinds]
        envs = np.concatenate([mbenvinds for _, mbenvinds in splits])
        assert list(envs) == list(order)  # every env once an epoch, in the order given


def test_check_args_requires_num_minibatches_to_divide_num_envs(lstm):
    args = lstm.Args(num_envs=6, num_minibatches=4)  # the batch of 768 divides by 4, the envs do not
    error = lstm.check_args(args)
    assert error and "--num-minibatches 4 does not divide --num-envs 6" in error and "\n" not in error
    assert lstm.check_args(lstm.Args(num_envs=6, num_minibatches=3)) is None
    with pytest.raises(ValueError, match="--frame-stack"):
        lstm.Args(frame_stack=-1)


def test_init_scales_and_zero_initial_state(lstm):
    agent = lstm.Agent(fake_envs(n_actions=6))
    # detail lstm-1: orthogonal LSTM weights with gain 1, zero biases
    assert (agent.lstm.input_size, agent.lstm.hidden_size, agent.lstm.num_layers) == (512, 128, 1)
    w_ih, w_hh = agent.lstm.weight_ih_l0.data, agent.lstm.weight_hh_l0.data
    assert w_ih.shape == (512, 512) and torch.allclose(w_ih @ w_ih.T, torch.eye(512), atol=1e-4)
    assert w_hh.shape == (512, 128) and torch.allclose(w_hh.T @ w_hh, torch.eye(128), atol=1e-4)
    assert not agent.lstm.bias_ih_l0.any() and not agent.lstm.bias_hh_l0.any()
    # heads on the LSTM output: actor std 0.01, critic std 1
    for head, std in [(agent.actor, 0.01), (agent.critic, 1.0)]:
        w = head.weight.data
        assert w.shape[1] == 128 and torch.allclose(w @ w.T, std**2 * torch.eye(w.shape[0]), atol=1e-4 * std**2)
        assert not head.bias.any()
    assert agent.network[0].in_channels == 1  # frame stack 1 by default
    # detail lstm-2: the LSTM state starts at zero
    h, c = agent.initial_state(3)
    assert h.shape == c.shape == (1, 3, 128) and not h.any() and not c.any()


def test_frame_stack_flag_and_defaults(lstm):
    args = lstm.Args()
    assert args.frame_stack == 1
    parent = load_script(PARENT).Args()
    own = ("exp_name", "frame_stack", "reset_lstm_state", "fused_lstm")
    assert {k: v for k, v in vars(args).items() if k not in own} == {
        k: v for k, v in vars(parent).items() if k not in ("exp_name", "frame_stack")
    }
    for k in (1, 4):
        env = lstm.make_env(args.env_id, 0, False, "test", lstm.Args(frame_stack=k))()
        assert env.observation_space.shape == (k, 84, 84)
        env.close()


def test_every_lstm_detail_is_tagged():
    source = (ROOT / SCRIPT).read_text()
    for n in range(1, 6):
        assert f"# detail lstm-{n}: " in source, f"lstm-{n}"


def top_level_sources(name):
    source = (ROOT / name).read_text()
    return {node.name: ast.get_source_segment(source, node) for node in ast.parse(source).body if hasattr(node, "name")}


def test_shared_passages_identical_to_ppo_atari():
    # everything but what the LSTM details change is the parent's, byte for byte (the Atari wrappers especially)
    parent, child = top_level_sources(PARENT), top_level_sources(SCRIPT)
    changed = {"Args", "check_args", "make_env", "make_envs", "Agent", "train", "evaluate"}
    assert {"NoopResetEnv", "MaxAndSkipEnv", "EpisodicLifeEnv", "FireResetEnv", "layer_init", "ppo_loss"} <= set(parent)
    for name in set(parent) - changed:
        assert child.get(name) == parent[name], name
    assert set(child) - set(parent) == {"rollout_step", "minibatches", "replay_minibatch"}


def test_diff_against_ppo_atari_stays_under_budget():
    diff = subprocess.run(["diff", "-u", PARENT, SCRIPT], cwd=ROOT, capture_output=True, text=True).stdout
    changed = [line for line in diff.splitlines()[2:] if line[:1] in "-+"]
    assert 0 < len(changed) < 160, len(changed)


def test_rollout_replayed_exactly_in_the_training_loop(tmp_path):
    # end to end: with one minibatch and one epoch the only gradient step sees the rollout's own distributions,
    # so the approx KL is 0 in every iteration (the 2nd and 3rd start from a carried, non-zero LSTM state)
    args = ["--num-envs", 2, "--num-steps", 64, "--num-minibatches", 1, "--update-epochs", 1, "--total-timesteps", 384]
    res = run_script(SCRIPT, *args, cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    assert len(scalars["charts/episodic_return"]) >= 1  # a whole game (5 lives: 5 episode ends) inside the rollouts
    assert [step for step, _ in scalars["losses/approx_kl"]] == [128, 256, 384]
    for tag, bound in [("losses/approx_kl", 1e-10), ("losses/old_approx_kl", 1e-8), ("losses/clipfrac", 0.0)]:
        assert all(abs(v) <= bound for _, v in scalars[tag]), (tag, scalars[tag])


def test_smoke_run_checkpoint_and_eval(tmp_path):
    args = ["--num-envs", 2, "--num-steps", 16, "--num-minibatches", 2, "--total-timesteps", 64, "--save-model"]
    res = run_script(SCRIPT, *args, cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for tag in ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl", "charts/SPS"]:
        assert [step for step, _ in scalars[tag]] == [32, 64] and all(math.isfinite(v) for _, v in scalars[tag]), tag
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["iteration"] == 2 and "lstm.weight_hh_l0" in ckpt["model"]
    res = run_script(
        SCRIPT, "--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 1, cwd=tmp_path, env=ONE_THREAD
    )
    assert res.returncode == 0, res.stderr
    assert "eval: 1 episodes, mean return" in res.stdout


def test_bad_input_one_clear_line(tmp_path):
    res = run_script(SCRIPT, "--num-minibatches", 3, cwd=tmp_path, env=ONE_THREAD)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "does not divide --num-envs 8" in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_fused_lstm_replays_the_same_and_calls_the_lstm_once_per_stretch(lstm, one_thread):
    """--fused-lstm (speed, opt-in): one LSTM call per stretch of steps without an episode end, in any env of the
    minibatch; the same log-probs and values as step by step, gradients equal up to the order of their sums."""
    agent = make_agent(lstm)
    batch, initial_state, logprobs, values = collect_rollout(lstm, agent)
    np.random.seed(0)
    splits = lstm.minibatches(np.arange(NUM_ENVS), 2, NUM_STEPS)
    results = {}
    for fused in (False, True):
        agent.fused, calls = fused, []
        hook = agent.lstm.register_forward_hook(lambda module, inputs, output, calls=calls: calls.append(len(inputs[0])))
        agent.zero_grad()
        newlogprobs, newvalues = replay(lstm, agent, batch, initial_state, splits)
        hook.remove()
        mb_inds = torch.from_numpy(splits[0][0])
        _, newlogprob, _, newvalue, _ = lstm.replay_minibatch(
            agent, batch["b_obs"], batch["b_dones"], batch["b_actions"], initial_state, mb_inds, splits[0][1]
        )
        (newlogprob.sum() + newvalue.sum()).backward()
        results[fused] = newlogprobs, newvalues, [p.grad.clone() for p in agent.parameters()], calls
    agent.fused = False
    (lp0, v0, g0, calls0), (lp1, v1, g1, calls1) = results[False], results[True]
    assert torch.allclose(lp1, logprobs, atol=1e-5, rtol=0) and torch.allclose(v1, values, atol=1e-5, rtol=0)
    assert torch.allclose(lp1, lp0, atol=1e-6, rtol=0) and torch.allclose(v1, v0, atol=1e-6, rtol=0)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a - b).abs().max()
    assert calls0 == [1] * (NUM_STEPS * len(splits))  # step by step
    stretches = []
    for _, mbenvinds in splits:  # a new stretch at each step t > 0 where an env of the minibatch starts an episode
        starts = [0] + [t for t in range(1, NUM_STEPS) if any((t, e) in DONES for e in mbenvinds)]
        stretches += [b - a for a, b in zip(starts, starts[1:] + [NUM_STEPS])]
    assert calls1 == stretches and len(calls1) < len(calls0) / 4
    assert lstm.Args().fused_lstm is False  # opt-in: the default stays bit-identical


def test_without_orthogonal_init_the_lstm_keeps_its_own_and_the_flag_says_so(lstm):
    # core-2 off (--no-orthogonal-init) resets the linear and conv layers only: the LSTM keeps lstm-1's orthogonal init
    envs = lstm.make_envs(lstm.Args(num_envs=1), "test")
    torch.manual_seed(0)
    agent = lstm.Agent(envs)
    envs.close()
    before = {n: p.detach().clone() for n, p in agent.named_parameters()}
    lstm.torch_default_init(agent)
    for name, param in agent.named_parameters():
        assert torch.equal(param, before[name]) == name.startswith("lstm."), name
    w = agent.lstm.weight_hh_l0.detach()  # (4 * 128, 128), orthogonal columns with gain 1
    assert torch.allclose(w.T @ w, torch.eye(128), atol=1e-4)
    doc = (ROOT / SCRIPT).read_text().split("    orthogonal_init: bool = True\n")[1].split('"""')[1]
    assert "lstm-1" in doc and "every layer" not in doc, doc

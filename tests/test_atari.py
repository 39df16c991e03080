"""ppo_atari.py: each Atari wrapper on a real ROM, the Nature-CNN, whole runs in subprocesses, the diff budget."""

import copy
import re
import shutil
import subprocess
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_script
from tbutil import read_scalars

BREAKOUT = "BreakoutNoFrameskip-v4"
FAST = {"OMP_NUM_THREADS": "1"}  # the CPU is shared: one torch thread is faster than two fighting


@pytest.fixture(scope="module")
def atari():
    return load_script("ppo_atari.py")


class Recorder(gym.Wrapper):
    """Records the actions it passes down, its resets and the rewards coming up."""

    def __init__(self, env):
        super().__init__(env)
        self.actions, self.rewards, self.resets = [], [], 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.actions.append(int(action))
        self.rewards.append(reward)
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        self.resets += 1
        return self.env.reset(**kwargs)


def raw(env_id=BREAKOUT):
    """The unwrapped game as the script makes it: one frame per step, ALE's grayscale screen."""
    return gym.make(env_id, frameskip=1, obs_type="grayscale")


def chain(env):
    """Class names of a wrapper chain, outermost first."""
    names = []
    while True:
        names.append(type(env).__name__)
        if not hasattr(env, "env"):
            return names
        env = env.env


# atari-1
def test_noop_reset_count_bounds(atari):
    counts, recorder = set(), Recorder(raw())
    env = atari.NoopResetEnv(recorder, noop_max=30)
    for seed in [0] + [None] * 39:  # reseeding reloads the ROM (slow): one seed, then the env's own random stream
        recorder.actions.clear()
        env.reset(seed=seed)
        frames = env.unwrapped.ale.getEpisodeFrameNumber()
        assert recorder.actions == [0] * frames  # only no-ops, one per frame
        counts.add(frames)
    assert min(counts) >= 1 and max(counts) <= 30
    assert len(counts) >= 10  # random, not a constant
    env = atari.NoopResetEnv(raw(), noop_max=1)
    env.reset(seed=0)
    assert env.unwrapped.ale.getEpisodeFrameNumber() == 1


# atari-2
def test_max_and_skip_pools_the_last_two_frames(atari):
    env, ref = atari.MaxAndSkipEnv(raw(), skip=4), raw()
    env.reset(seed=3)
    ref.reset(seed=3)
    rng = np.random.default_rng(0)
    pooled_differs = 0
    for _ in range(60):
        action = int(rng.integers(4))
        obs, reward, terminated, truncated, _ = env.step(action)
        frames, total = [], 0.0
        for _ in range(4):
            frame, r, *_ = ref.step(action)
            frames.append(frame)
            total += r
        np.testing.assert_array_equal(obs, np.maximum(frames[2], frames[3]))
        assert reward == total
        assert ref.unwrapped.ale.getEpisodeFrameNumber() == env.unwrapped.ale.getEpisodeFrameNumber()
        pooled_differs += bool((obs != frames[3]).any())
        assert not (terminated or truncated)
    assert pooled_differs > 0  # the ball moves: the max is not just the last frame


def lose_a_life(env, rng, max_steps=2000):
    """Step random actions until a step reports termination; returns that step's number."""
    for step in range(max_steps):
        *_, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            return step
    raise AssertionError("no life lost")


# atari-3
def test_episodic_life_ends_the_episode_not_the_game(atari):
    recorder = Recorder(atari.MaxAndSkipEnv(raw(), skip=4))
    env = atari.EpisodicLifeEnv(recorder)
    env.reset(seed=1)
    assert recorder.resets == 1 and env.lives == 5
    rng = np.random.default_rng(1)
    lose_a_life(env, rng)
    assert env.unwrapped.ale.lives() == 4 and not env.real_done
    frames = env.unwrapped.ale.getEpisodeFrameNumber()
    env.reset()
    assert recorder.resets == 1  # no real reset: the game goes on
    assert recorder.actions[-1] == 0 and env.unwrapped.ale.getEpisodeFrameNumber() == frames + 4  # one no-op step
    assert env.lives == 4
    for _ in range(4):  # the remaining lives
        lose_a_life(env, rng)
        if env.real_done:
            break
        env.reset()
    assert env.real_done and env.unwrapped.ale.lives() == 0
    env.reset()
    assert recorder.resets == 2 and env.lives == 5  # the game is over: a real reset


# atari-4
def test_fire_reset_presses_fire(atari):
    recorder = Recorder(atari.MaxAndSkipEnv(raw(), skip=4))
    env = atari.FireResetEnv(recorder)
    env.reset(seed=0)
    assert recorder.actions == [1, 2] and recorder.resets == 1
    # the ball is served: doing nothing loses a life; without FIRE nothing happens
    lives = [5, 5]
    for i, e in enumerate([env, atari.MaxAndSkipEnv(raw(), skip=4)]):
        e.reset(seed=0)
        for _ in range(100):
            e.step(0)
        lives[i] = e.unwrapped.ale.lives()
    assert lives == [4, 5]


def test_wrapper_order_as_baselines(atari):
    names = chain(atari.make_env(BREAKOUT, 0, False, "test", atari.Args())())
    want = ["FrameStackObservation", "TransformReward", "ResizeObservation", "FireResetEnv", "EpisodicLifeEnv"]
    want += ["RecordEpisodeStatistics", "MaxAndSkipEnv", "NoopResetEnv"]
    assert [n for n in names if n in want] == want, names
    assert names[-1] == "AtariEnv"
    # no FIRE in Freeway: no FireReset
    assert "FireResetEnv" not in chain(atari.make_env("FreewayNoFrameskip-v4", 0, False, "test", atari.Args())())


def area_average(frame, height, width):
    """Exact area average by replication: repeat each pixel up to a common multiple, then average blocks."""
    h, w = frame.shape
    rows = np.repeat(frame.astype(np.float64), np.lcm(h, height) // h, axis=0)
    rows = rows.reshape(height, -1, w).mean(1)
    cols = np.repeat(rows, np.lcm(w, width) // w, axis=1)
    return cols.reshape(height, width, -1).mean(2)


# atari-5
def test_warp_frame_is_an_84x84_area_average():
    env = gym.wrappers.ResizeObservation(raw(), (84, 84))  # as make_env builds it
    assert env.observation_space.shape == (84, 84) and env.observation_space.dtype == np.uint8
    rng = np.random.default_rng(0)
    for frame in [rng.integers(0, 256, (210, 160), dtype=np.uint8), raw().reset(seed=0)[0]]:
        out = env.observation(frame)
        assert out.dtype == np.uint8 and out.shape == (84, 84)
        assert np.abs(out - area_average(frame, 84, 84)).max() <= 0.5 + 1e-3  # rounded to the nearest
    # the gray screen is ALE's own
    rgb = gym.make(BREAKOUT, frameskip=1).reset(seed=0)[0]
    gray = raw().reset(seed=0)[0]
    assert gray.shape == (210, 160) and rgb.shape == (210, 160, 3)
    luma = rgb @ np.array([0.299, 0.587, 0.114])
    assert np.abs(luma - gray).max() <= 2


# atari-5, atari-7
def test_observations_84x84x4_uint8_stacked(atari):
    env = atari.make_env(BREAKOUT, 0, False, "test", atari.Args())()
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert not obs[:3].any() and obs[3].any()  # reset: zeros before the first frame, as ppo2's VecFrameStack
    previous = obs
    for _ in range(10):
        obs, *_ = env.step(3)
        np.testing.assert_array_equal(obs[:3], previous[1:])  # rolling: the newest frame last
        previous = obs
    assert (obs[0] != obs[3]).any()
    rng = np.random.default_rng(0)
    while not env.step(int(rng.integers(4)))[2]:  # until a life is lost
        pass
    obs, _ = env.reset()
    assert env.unwrapped.ale.lives() == 4 and not obs[:3].any() and obs[3].any()  # the new life starts from zeros too


# atari-6 and the logged return
def test_rewards_clipped_logged_return_real(atari, monkeypatch):
    raw_rewards = []

    class SpyMaxAndSkip(atari.MaxAndSkipEnv):
        def step(self, action):
            out = super().step(action)
            raw_rewards.append(out[1])
            return out

    monkeypatch.setattr(atari, "MaxAndSkipEnv", SpyMaxAndSkip)
    args = atari.Args(env_id="SpaceInvadersNoFrameskip-v4", num_envs=1)
    assert atari.check_args(args) is None
    envs = atari.make_envs(args, "test")
    envs.reset(seed=1)
    rng = np.random.default_rng(0)
    clipped, learning_episodes, logged = [], 0, None
    for _ in range(5000):
        _, reward, terminated, truncated, infos = envs.step(rng.integers(6, size=1))
        clipped.append(float(reward[0]))
        learning_episodes += int(terminated[0] or truncated[0])
        if "episode" in infos.get("final_info", {}) and infos["final_info"]["_episode"][0]:
            logged = infos["final_info"]["episode"]["r"][0]
            break
    envs.close()
    assert logged is not None
    assert set(clipped) <= {-1.0, 0.0, 1.0} and 1.0 in clipped
    assert learning_episodes >= 2  # 3 lives: several learning episodes, 1 logged game
    assert logged == pytest.approx(sum(raw_rewards))  # every life, unclipped
    assert logged > sum(clipped)  # Space Invaders scores 5 to 30 a hit


# atari-8
def test_nature_cnn_shapes_and_init(atari):
    envs = SimpleNamespace(
        single_observation_space=gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), single_action_space=gym.spaces.Discrete(6)
    )
    torch.manual_seed(0)
    agent = atari.Agent(envs)
    convs = [m for m in agent.network if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (4, 32, (8, 8), (4, 4)),
        (32, 64, (4, 4), (2, 2)),
        (64, 64, (3, 3), (1, 1)),
    ]
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    shapes, h = [], x / 255.0
    for m in agent.network:
        h = m(h)
        shapes.append(tuple(h.shape[1:]))
    assert shapes[:6:2] == [(32, 20, 20), (64, 9, 9), (64, 7, 7)] and shapes[-1] == (512,)
    assert all(isinstance(m, torch.nn.ReLU) for m in agent.network[1:6:2]) and isinstance(agent.network[-1], torch.nn.ReLU)
    action, logprob, entropy, value = agent.get_action_and_value(x)
    assert action.shape == logprob.shape == entropy.shape == (5,) and value.shape == (5, 1)
    assert agent.get_value(x).shape == (5, 1)
    # orthogonal init: gain sqrt(2) in the trunk, 0.01 policy head, 1 value head; zero biases
    layers = [*convs, agent.network[-2], agent.actor, agent.critic]
    for layer, gain in zip(layers, [np.sqrt(2)] * 4 + [0.01, 1.0]):
        w = layer.weight.detach().double().flatten(1)
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        torch.testing.assert_close(gram, gain**2 * torch.eye(gram.shape[0], dtype=torch.double), atol=1e-5, rtol=1e-4)
        assert torch.count_nonzero(layer.bias) == 0
    # shared: one trunk under both heads
    assert sum(isinstance(m, torch.nn.Linear) for m in agent.modules()) == 3


# atari-9
def test_pixels_scaled_inside_the_network(atari):
    envs = SimpleNamespace(
        single_observation_space=gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), single_action_space=gym.spaces.Discrete(4)
    )
    agent = atari.Agent(envs)
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    expected = agent.critic(agent.network(x.float() / 255.0))
    torch.testing.assert_close(agent.get_value(x), expected)
    torch.testing.assert_close(agent.get_action_and_value(x, torch.zeros(3))[3], expected)
    assert not torch.allclose(agent.critic(agent.network(x.float())), expected)
    # the rollout buffer keeps observations as uint8
    source = (ROOT / "ppo_atari.py").read_text()
    assert re.search(r"\n    obs = torch\.zeros\(.*dtype=torch\.uint8\)", source)


def test_channels_last_computes_the_same_function(atari):
    envs = SimpleNamespace(
        single_observation_space=gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), single_action_space=gym.spaces.Discrete(4)
    )
    agent = atari.Agent(envs)
    fast = copy.deepcopy(agent).to(memory_format=torch.channels_last)  # what --channels-last does
    fast.frames_format = torch.channels_last
    convs = [m for m in fast.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs)
    assert not agent.network[0].weight.is_contiguous(memory_format=torch.channels_last)
    x, action = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8), torch.randint(0, 4, (16,))
    for a, b in zip(agent.get_action_and_value(x, action)[1:], fast.get_action_and_value(x, action)[1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # the same math, rounded differently
    fast.get_value(x).sum().backward()
    assert all(m.weight.grad.shape == m.weight.shape for m in convs)
    assert atari.Args().channels_last is False  # off by default: it changes float rounding


def test_env_ids_and_errors(atari):
    for env_id in [BREAKOUT, "PongNoFrameskip-v4", "ALE/Breakout-v5"]:
        assert atari.check_args(atari.Args(env_id=env_id)) is None
    for env_id in ["CartPole-v1", "Breakout-v4", "BreakoutNoFrameskip-v0"]:
        error = atari.check_args(atari.Args(env_id=env_id))
        assert "needs an Atari id" in error and env_id in error
    # v5: frameskip 1 (MaxAndSkip skips), sticky actions kept
    env = atari.make_env("ALE/Pong-v5", 0, False, "test", atari.Args())()
    assert env.unwrapped._frameskip == 1
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    assert env.reset(seed=0)[0].shape == (4, 84, 84)


def test_bad_env_id_one_clear_line(tmp_path):
    res = run_script("ppo_atari.py", "--env-id", "CartPole-v1", cwd=tmp_path, env=FAST)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "needs an Atari id" in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()
    res = run_script("ppo_atari.py", "--env-id", "NoSuchGameNoFrameskip-v4", cwd=tmp_path, env=FAST)  # gymnasium says it
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and lines[-1].startswith("error: NoSuchGameNoFrameskip-v4: ") and "doesn't exist" in lines[-1]
    assert not list(tmp_path.glob("runs/*"))


TAGS = ["charts/learning_rate", "charts/SPS", "losses/policy_loss", "losses/value_loss", "losses/entropy"]
TAGS += ["losses/approx_kl", "losses/clipfrac", "losses/explained_variance"]


def test_smoke_run_video_checkpoint_eval(tmp_path):
    args = ["--num-envs", 2, "--num-steps", 32, "--total-timesteps", 128, "--save-model", "--capture-video"]
    res = run_script("ppo_atari.py", *args, "--channels-last", cwd=tmp_path, env=FAST)  # evaluated below without it
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path)
    assert run_dir.name.startswith(f"{BREAKOUT}__ppo_atari__1__")
    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert [step for step, _ in scalars[tag]] == [64, 128], tag
    lr = [v for _, v in scalars["charts/learning_rate"]]
    assert lr == pytest.approx([2.5e-4, 1.25e-4])
    assert list((tmp_path / "videos").rglob("*.mp4"))
    res = run_script(
        "ppo_atari.py", "--eval-checkpoint", run_dir / "checkpoint.pt", "--eval-episodes", 1, cwd=tmp_path, env=FAST
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"eval: 1 episodes, mean return \d", res.stdout)


def changed_lines(parent, child):
    """`diff -u parent child | grep -c '^[-+][^-+]'`: changed lines, blank ones and the file headers excluded."""
    if shutil.which("diff"):
        out = subprocess.run(["diff", "-u", parent, child], cwd=ROOT, capture_output=True, text=True).stdout
    else:
        import difflib

        a, b = ((ROOT / p).read_text().splitlines() for p in (parent, child))
        out = "\n".join(difflib.unified_diff(a, b, parent, child, lineterm=""))
    return len(re.findall(r"^[-+][^-+\n]", out, flags=re.M))


def test_diff_from_ppo_under_175_lines():
    n = changed_lines("ppo.py", "ppo_atari.py")
    assert 50 < n <= 230, n  # 160 before the 400k-frame game length flag (fidelity issue), 175 before the ablation flags,
    # 185 before the game length per game (issue 25), 195 before --bf16 (issue 26), 205 before bf16_native became the
    # Atari scripts' own plumbing (issue 61)


# ppo2's game length (fidelity): gym 0.21's NoFrameskip-v4 cut a game at 100,000 x its frameskip frames, 400,000, and
# 300,000 for SpaceInvaders (frameskip 3 there); ale-py registers 108,000
@pytest.mark.parametrize("script", ["ppo_atari.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py", "ppo_atari_envpool.py"])
def test_episode_frame_limit_defaults_to_ppo2s(script):
    module = load_script(script)
    assert module.Args().max_episode_frames is None  # left out: the game's own ppo2 limit
    frames = {g: module.game_frames(g) for g in ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"]}
    frames.update({g: module.game_frames(g) for g in ["SpaceInvadersNoFrameskip-v4", "ALE/Pong-v5"]})
    assert frames == {
        "BreakoutNoFrameskip-v4": 400000,
        "PongNoFrameskip-v4": 400000,
        "SpaceInvadersNoFrameskip-v4": 300000,
        "ALE/Pong-v5": 400000,
    }
    assert module.game_frames("SpaceInvadersNoFrameskip-v4", 108000) == 108000
    text = (ROOT / script).read_text()
    doc = text[text.index("    max_episode_frames: int | None = None\n") :].splitlines()[1:3]
    assert "108000" in " ".join(doc) and "ppo2" in doc[0] and "300000" in doc[0], doc  # both protocols named
    for bad in [-1, -5]:
        with pytest.raises(ValueError, match="--max-episode-frames"):
            module.Args(max_episode_frames=bad)


def test_episode_frame_limit_truncates_the_game(atari):
    env = atari.make_env("PongNoFrameskip-v4", 0, False, "test", atari.Args())()
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 400000  # not ale-py's registered 108,000
    env.close()
    env = atari.make_env("SpaceInvadersNoFrameskip-v4", 0, False, "test", atari.Args())()
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 300000  # gym 0.21: 100,000 x frameskip 3
    env.close()
    env = atari.make_env("PongNoFrameskip-v4", 0, False, "test", atari.Args(max_episode_frames=400))()
    env.reset(seed=0)
    steps = 0
    for _ in range(200):
        _, _, terminated, truncated, _ = env.step(0)
        steps += 1
        if terminated or truncated:
            break
    assert truncated and not terminated and env.unwrapped.ale.getEpisodeFrameNumber() == 400
    assert 90 <= steps <= 100  # 400 frames less the no-ops and the FIRE presses, 4 frames a step

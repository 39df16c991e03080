"""ppo_atari_envpool.py: envpool's C++ Atari envs made to play ppo2's game, checked on real ROMs against the wrappers."""

import gymnasium as gym
import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv
from conftest import load_script, run_dirs, run_script
from tbutil import read_scalars
from test_atari import TAGS, changed_lines

BREAKOUT = "BreakoutNoFrameskip-v4"
FAST = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def pool():
    return load_script("ppo_atari_envpool.py")


@pytest.fixture(scope="module")
def atari():
    return load_script("ppo_atari.py")


def make(module, env_id=BREAKOUT, num_envs=2, **kwargs):
    args = module.Args(env_id=env_id, num_envs=num_envs, **kwargs)
    assert module.check_args(args) is None
    return module.make_envs(args, "test")


class Captured(Exception):
    pass


@pytest.mark.parametrize(
    "env_id, task, sticky",
    [
        (BREAKOUT, "Breakout-v5", 0.0),
        ("ALE/Breakout-v5", "Breakout-v5", 0.25),
        ("MsPacmanNoFrameskip-v4", "MsPacman-v5", 0.0),
        ("SpaceInvadersNoFrameskip-v4", "SpaceInvaders-v5", 0.0),
    ],
)
def test_details_are_the_envpool_options(pool, monkeypatch, env_id, task, sticky):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, **kwargs)
        raise Captured

    monkeypatch.setattr(pool.envpool, "make", fake)
    with pytest.raises(Captured):
        make(pool, env_id, num_envs=3)
    assert seen["args"] == (task,) and seen["num_envs"] == 3 and seen["repeat_action_probability"] == sticky
    # ppo2's 400,000 frames (SpaceInvaders: 300,000, gym 0.21's 100,000 x frameskip 3), in envpool's steps of 4 frames
    assert seen["max_episode_steps"] == (75000 if "SpaceInvaders" in env_id else 100000)
    expected = dict(noop_max=30, use_fire_reset=False, frame_skip=4, episodic_life=True, reward_clip=False, stack_num=1)
    expected.update(img_height=84, img_width=84, gray_scale=True, use_inter_area_resize=True, env_type="gymnasium")
    assert {k: seen[k] for k in expected} == expected


def test_shapes_and_dtypes_as_the_wrapper_pipeline(pool, atari):
    envs, ref = make(pool), make(atari)
    assert envs.single_observation_space == ref.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert envs.single_action_space == ref.single_action_space
    obs, _ = envs.reset(seed=1)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert not obs[:, :3].any() and obs[:, 3].any(axis=(1, 2)).all()  # reset: zeros before the first frame, as ppo_atari.py
    next_obs, reward, terminated, truncated, _ = envs.step(np.array([1, 3]))
    np.testing.assert_array_equal(next_obs[:, :3], obs[:, 1:])
    assert reward.shape == terminated.shape == truncated.shape == (2,) and terminated.dtype == bool
    envs.close()
    ref.close()


def test_game_start_and_first_life_as_the_wrappers(pool, atari):
    """One no-op frame on both sides (noop_max=1): envpool's start, then FIRE and action 2 of 4 frames each, gives the
    frames, rewards and life loss of baselines' NoopReset -> MaxAndSkip -> EpisodicLife -> FireReset on the same ROM."""
    envs = pool.EnvpoolAtari("Breakout-v5", 1, True, **{**pool_options(pool), "noop_max": 1})
    env = gym.make(BREAKOUT, frameskip=1, obs_type="grayscale")
    env = atari.FireResetEnv(atari.EpisodicLifeEnv(atari.MaxAndSkipEnv(atari.NoopResetEnv(env, noop_max=1), skip=4)))
    env = gym.wrappers.FrameStackObservation(gym.wrappers.ResizeObservation(env, (84, 84)), 4, padding_type="zero")
    vobs, _ = envs.reset(seed=3)
    obs, _ = env.reset(seed=3)
    assert env.unwrapped.ale.getEpisodeFrameNumber() == 1 + 4 + 4  # the wrappers: 1 no-op frame, FIRE, action 2
    assert np.abs(obs.astype(int) - vobs[0]).max() <= 1  # the same area resize, rounded apart at most by 1
    rng = np.random.default_rng(0)
    rewards = 0.0
    for _ in range(300):
        action = int(rng.integers(4))
        vobs, vreward, vterminated, vtruncated, _ = envs.step(np.array([action]))
        obs, reward, terminated, truncated, _ = env.step(action)
        assert np.sign(reward) == vreward[0] and terminated == vterminated[0] and truncated == vtruncated[0] == 0
        rewards += reward
        if terminated:  # the first life lost at the same step; after it ppo2 takes a no-op step, envpool 1 no-op frame
            break
        assert np.abs(obs.astype(int) - vobs[0]).max() <= 1
    assert terminated and env.unwrapped.ale.lives() == 4 and rewards > 0
    envs.close()


def pool_options(pool):
    """The options make_envs gives envpool, read back through a fake envpool.make."""
    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise Captured

    real, pool.envpool.make = pool.envpool.make, fake
    try:
        with pytest.raises(Captured):
            make(pool, num_envs=1)
    finally:
        pool.envpool.make = real
    return {k: v for k, v in seen.items() if k not in ("env_type", "num_envs", "seed")}


def play(envs, actions, steps):
    """Step with a fixed action (or random ones); yields each step's outputs."""
    rng = np.random.default_rng(0)
    for _ in range(steps):
        a = rng.integers(envs.single_action_space.n, size=envs.num_envs) if actions is None else actions
        yield envs.step(np.asarray(a, dtype=np.int64))


# atari-3 and atari-4: ppo2's EpisodicLife + FireReset, the fidelity issue's test
def test_after_a_life_loss_the_ball_is_back_in_play_without_fire(pool):
    """Doing nothing (NOOP only) loses every life of a Breakout game, then of the next: after each life loss and at
    each game start the ball was served for the agent. ale-py's AtariVectorEnv (FIRE only at a game start) stalls."""
    envs = make(pool, num_envs=2)
    _, infos = envs.reset(seed=1)
    life_losses, games = 0, 0
    for next_obs, _, terminated, truncated, infos in play(envs, [0, 0], 2000):
        assert not truncated.any()
        life_losses += int(terminated.sum())
        if terminated.any():
            assert not next_obs[terminated, :3].any() and next_obs[terminated, 3].any()  # the stack restarts from zeros
        if "final_info" in infos:
            ended = infos["final_info"]["_episode"]
            assert (infos["lives"][ended] == 5).all()  # a game over: the next game is already on
            games += int(ended.sum())
        if games >= 4:
            break
    envs.close()
    assert games >= 4 and life_losses >= 4 * 5
    stalled = AtariVectorEnv("breakout", 1, use_fire_reset=True, life_loss_info=True, episodic_life=False)
    stalled.reset(seed=1)
    lives = [int(stalled.step(np.zeros(1, dtype=np.int64))[4]["lives"][0]) for _ in range(2000)]
    assert lives[-1] == 4  # one life lost, then the ball is never served again


def test_game_over_statistics_and_frame_limit(pool):
    """A game over ends a logged game (all lives, real return); the frame limit truncates, and a new game starts."""
    envs = make(pool, num_envs=1, max_episode_frames=400)  # 100 steps of 4 frames
    envs.reset(seed=2)
    steps, starts = 0, 1
    for _, _, terminated, truncated, step_infos in play(envs, None, 200):
        steps, infos = steps + 1, step_infos
        if truncated[0]:
            break
        starts += int(terminated[0])  # a life lost: FIRE and action 2 again
    assert truncated[0] and steps + 2 * starts == 100  # envpool counts the presses, not its no-op steps after a life loss
    assert "final_info" in infos and infos["final_info"]["_episode"][0] and infos["lives"][0] == 5
    # the logged game counts them too: each life loss's no-op step, as ppo2's Monitor counts EpisodicLife's no-op step
    assert starts > 1 and infos["final_info"]["episode"]["l"][0] == 100 + (starts - 1)
    envs.close()


# atari-6 and the statistics across lives
def test_rewards_clipped_logged_return_real(pool, monkeypatch):
    raw_rewards, after_life_loss = [], set()
    substep = pool.EnvpoolAtari.substep

    def spy(self, actions, ids):
        out = substep(self, actions, ids)
        for k, i in enumerate(ids):  # points scored in envpool's no-op frames after a life loss (rare in real games)
            if i in after_life_loss:
                out[1][k] += 1000.0
                after_life_loss.discard(i)
            if out[2][k] and not out[4][k]:  # a life lost, the game goes on: the next substep is envpool's no-ops
                after_life_loss.add(i)
        raw_rewards.extend(out[1].tolist())
        return out

    monkeypatch.setattr(pool.EnvpoolAtari, "substep", spy)
    envs = make(pool, "SpaceInvadersNoFrameskip-v4", num_envs=1)
    envs.reset(seed=1)
    clipped, learning_episodes, logged = [], 0, None
    for _, reward, terminated, truncated, infos in play(envs, None, 5000):
        clipped.append(float(reward[0]))
        learning_episodes += int(terminated[0] or truncated[0])
        if "final_info" in infos and infos["final_info"]["_episode"][0]:
            logged, length = infos["final_info"]["episode"]["r"][0], infos["final_info"]["episode"]["l"][0]
            break
    envs.close()
    assert logged is not None
    assert set(clipped) <= {-1.0, 0.0, 1.0} and 1.0 in clipped
    assert learning_episodes >= 2  # 3 lives: several learning episodes, 1 logged game
    assert logged == sum(raw_rewards) and logged > sum(clipped)  # every life, unclipped, the no-op frames' points too
    assert logged >= 1000 * (learning_episodes - 1)
    # the agent's steps, the FIRE presses and the no-op step after each life loss (ppo2's Monitor counts them all)
    assert length == len(clipped) + 2 * learning_episodes + (learning_episodes - 1)


def test_no_fire_presses_for_games_without_fire(pool):
    envs = make(pool, "FreewayNoFrameskip-v4", num_envs=1)
    assert envs.fire is False
    assert make(pool, num_envs=1).fire is True


def test_bad_input(pool, tmp_path):
    assert "needs an Atari id" in pool.check_args(pool.Args(env_id="CartPole-v1"))
    assert "renders no video" in pool.check_args(pool.Args(capture_video=True))
    res = run_script("ppo_atari_envpool.py", "--capture-video", cwd=tmp_path, env=FAST)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "ppo_atari.py" in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()


def test_smoke_run_checkpoint_eval(tmp_path):
    args = ["--num-envs", 2, "--num-steps", 32, "--total-timesteps", 128, "--save-model"]
    res = run_script("ppo_atari_envpool.py", *args, cwd=tmp_path, env=FAST)
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert [step for step, _ in scalars[tag]] == [64, 128], tag
    ckpt = run_dir / "checkpoint.pt"
    res = run_script("ppo_atari_envpool.py", "--eval-checkpoint", ckpt, "--eval-episodes", 2, cwd=tmp_path, env=FAST)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "eval: 2 episodes, mean return" in res.stdout
    # the C++ env renders nothing: an evaluation asked to record says so in one line, before playing
    res = run_script("ppo_atari_envpool.py", "--eval-checkpoint", ckpt, "--capture-video", cwd=tmp_path, env=FAST)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        "error: the C++ vector env renders no video; record with ppo_atari.py --capture-video"
    ], res.stderr[-2000:]
    assert "eval:" not in res.stdout and not (tmp_path / "videos").exists()


def test_diff_from_ppo_atari():
    n = changed_lines("ppo_atari.py", "ppo_atari_envpool.py")
    assert 50 < n < 215, n  # 200 before the ablation flags (issue 17): the envpool options take them too


def test_without_envpool_one_line_says_what_to_install(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "envpool.py").write_text("raise ImportError('simulated: envpool is absent')\n")
    res = run_script("ppo_atari_envpool.py", cwd=tmp_path, env={**FAST, "PYTHONPATH": str(fake)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and lines == [
        "error: ppo_atari_envpool.py needs envpool: pip install envpool==1.2.5 (as in requirements.txt)"
    ]
    assert not (tmp_path / "runs").exists()

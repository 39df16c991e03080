"""ppo_atari_ale_vector.py: the 9 Atari details as AtariVectorEnv arguments, checked against the wrapper pipeline."""

import gymnasium as gym
import numpy as np
import pytest
from ale_py.vector_env import AtariVectorEnv
from conftest import load_script, run_dirs, run_script
from tbutil import read_scalars
from test_atari import TAGS, changed_lines

BREAKOUT = "BreakoutNoFrameskip-v4"
SAME_STEP = gym.vector.AutoresetMode.SAME_STEP
FAST = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def vec():
    return load_script("ppo_atari_ale_vector.py")


@pytest.fixture(scope="module")
def atari():
    return load_script("ppo_atari.py")


def make(module, env_id=BREAKOUT, num_envs=2):
    args = module.Args(env_id=env_id, num_envs=num_envs)
    assert module.check_args(args) is None
    return module.make_envs(args, "test")


class Captured(Exception):
    pass


@pytest.mark.parametrize(
    "env_id, game, sticky",
    [(BREAKOUT, "breakout", 0.0), ("ALE/Breakout-v5", "breakout", 0.25), ("MsPacmanNoFrameskip-v4", "ms_pacman", 0.0)],
)
def test_details_are_the_vector_env_arguments(vec, monkeypatch, env_id, game, sticky):
    seen = {}

    def fake(*args, **kwargs):
        seen.update(args=args, **kwargs)
        raise Captured

    monkeypatch.setattr("ale_py.vector_env.AtariVectorEnv", fake)
    with pytest.raises(Captured):
        make(vec, env_id, num_envs=3)
    assert seen["args"] == (game, 3) and seen["repeat_action_probability"] == sticky
    assert seen["max_num_frames_per_episode"] == 108000
    assert seen["autoreset_mode"] == SAME_STEP  # ppo2: the next obs of a done is the new start
    expected = dict(noop_max=30, frameskip=4, maxpool=True, life_loss_info=True, episodic_life=False, use_fire_reset=True)
    expected.update(img_height=84, img_width=84, grayscale=True, stack_num=4, reward_clipping=False)
    assert {k: seen[k] for k in expected} == expected


def test_shapes_and_dtypes_as_the_wrapper_pipeline(vec, atari):
    envs, ref = make(vec), make(atari)
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


def test_same_frames_rewards_and_life_losses_as_the_wrappers(atari):
    """Same seed, same actions: the C++ pipeline and the wrappers see the same game (no-ops and FIRE off on both sides)."""
    venv = AtariVectorEnv(
        "breakout",
        1,
        noop_max=1,
        use_fire_reset=False,
        life_loss_info=True,
        reward_clipping=False,
        autoreset_mode=SAME_STEP,
    )
    vobs, vinfo = venv.reset(seed=3)
    assert vinfo["episode_frame_number"][0] == 0  # noop_max=1: ale-py draws 0 no-ops
    env = gym.make(BREAKOUT, frameskip=1, obs_type="grayscale")
    env = atari.EpisodicLifeEnv(atari.MaxAndSkipEnv(env, skip=4))
    env = gym.wrappers.FrameStackObservation(gym.wrappers.ResizeObservation(env, (84, 84)), 4, padding_type="zero")
    obs, _ = env.reset(seed=3)
    np.testing.assert_array_equal(obs, vobs[0])
    rng = np.random.default_rng(0)
    differing, rewards, life_losses = 0, 0.0, 0
    for _ in range(150):
        action = int(rng.integers(4))
        vobs, vreward, vterminated, _, _ = venv.step(np.array([action]))
        obs, reward, terminated, truncated, _ = env.step(action)
        assert reward == vreward[0] and terminated == vterminated[0] and not truncated
        diff = np.abs(obs.astype(int) - vobs[0])
        assert diff.max() <= 1  # the same area resize, rounded apart at most by 1
        differing += int((diff > 0).sum())
        rewards += reward
        life_losses += int(terminated)
    assert differing < 100  # of 150 * 4 * 84 * 84 pixels
    assert rewards > 0 and life_losses >= 2  # the comparison saw points and life losses


def random_play(envs, steps, seed=0):
    """Random actions; yields (obs, reward, terminated, truncated, infos) after each step."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield envs.step(rng.integers(envs.single_action_space.n, size=envs.num_envs))


# atari-3 (and core-5's dones: what GAE sees)
def test_life_loss_terminates_but_the_game_goes_on(vec):
    envs = make(vec, num_envs=2)
    obs, infos = envs.reset(seed=1)
    lives, frames = infos["lives"].copy(), infos["episode_frame_number"].copy()
    life_losses = game_overs = 0
    for next_obs, _, terminated, truncated, infos in random_play(envs, 400):
        assert not truncated.any()
        for i in np.flatnonzero(terminated):
            if infos["episode_frame_number"][i] > frames[i]:  # the game went on
                assert infos["lives"][i] == lives[i] - 1
                np.testing.assert_array_equal(next_obs[i, :3], obs[i, 1:])  # no reset: the frame stack rolls on
                life_losses += 1
            else:  # a new game: the stack restarts from zeros
                assert lives[i] == 1 and infos["lives"][i] == 5
                assert not next_obs[i, :3].any() and next_obs[i, 3].any()
                game_overs += 1
        assert (infos["lives"][~terminated] == lives[~terminated]).all()  # no life lost without a termination
        obs, lives, frames = next_obs, infos["lives"].copy(), infos["episode_frame_number"].copy()
    envs.close()
    assert life_losses >= 4 and game_overs >= 1


# atari-6 and the statistics across lives
def test_rewards_clipped_logged_return_real(vec, monkeypatch):
    raw_rewards = []

    class Spy(vec.RecordGameStatistics):
        def step(self, actions):
            out = super().step(actions)
            raw_rewards.append(out[1][0])
            return out

    monkeypatch.setattr(vec, "RecordGameStatistics", Spy)
    envs = make(vec, "SpaceInvadersNoFrameskip-v4", num_envs=1)
    envs.reset(seed=1)
    clipped, learning_episodes, logged = [], 0, None
    for _, reward, terminated, truncated, infos in random_play(envs, 5000):
        clipped.append(float(reward[0]))
        learning_episodes += int(terminated[0] or truncated[0])
        if "episode" in infos.get("final_info", {}) and infos["final_info"]["_episode"][0]:
            logged, length = infos["final_info"]["episode"]["r"][0], infos["final_info"]["episode"]["l"][0]
            break
    envs.close()
    assert logged is not None
    assert set(clipped) <= {-1.0, 0.0, 1.0} and 1.0 in clipped
    assert learning_episodes >= 2  # 3 lives: several learning episodes, 1 logged game
    assert logged == sum(raw_rewards) and length == len(raw_rewards)  # every life, unclipped
    assert logged > sum(clipped)


# atari-4
def test_fire_on_reset_like_the_wrappers(vec, atari):
    """Breakout waits for FIRE: doing nothing loses a life only when FIRE was pressed at reset, in both pipelines."""
    lost = {}
    for name, envs in [("vector", make(vec, num_envs=1)), ("wrappers", make(atari, num_envs=1))]:
        envs.reset(seed=0)
        lost[name] = any(envs.step(np.zeros(1, dtype=np.int64))[2][0] for _ in range(100))
        envs.close()
    no_fire = AtariVectorEnv("breakout", 1, use_fire_reset=False, life_loss_info=True, autoreset_mode=SAME_STEP)
    no_fire.reset(seed=0)
    lost["vector without FIRE"] = any(no_fire.step(np.zeros(1, dtype=np.int64))[2][0] for _ in range(100))
    assert lost == {"vector": True, "wrappers": True, "vector without FIRE": False}


def test_bad_input(vec, tmp_path):
    assert "needs an Atari id" in vec.check_args(vec.Args(env_id="CartPole-v1"))
    assert "renders no video" in vec.check_args(vec.Args(capture_video=True))
    res = run_script("ppo_atari_ale_vector.py", "--capture-video", cwd=tmp_path, env=FAST)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "ppo_atari.py" in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()


def test_smoke_run_checkpoint_eval(tmp_path):
    args = ["--num-envs", 2, "--num-steps", 32, "--total-timesteps", 128, "--save-model"]
    res = run_script("ppo_atari_ale_vector.py", *args, cwd=tmp_path, env=FAST)
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for tag in TAGS:
        assert [step for step, _ in scalars[tag]] == [64, 128], tag
    ckpt = run_dir / "checkpoint.pt"
    res = run_script("ppo_atari_ale_vector.py", "--eval-checkpoint", ckpt, "--eval-episodes", 2, cwd=tmp_path, env=FAST)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "eval: 2 episodes, mean return" in res.stdout


def test_diff_from_ppo_atari():
    n = changed_lines("ppo_atari.py", "ppo_atari_ale_vector.py")
    assert 50 < n < 160, n

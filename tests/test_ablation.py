"""The ablation flags (each detail that can be switched off) and benchmark/ablate.py.

Each flag is checked to change what it names, a run with each flag off to differ from the default, and the default
to log the very same losses as the scripts did before the flags existed (read with git show)."""

import csv
import gzip
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_python, run_script
from tbutil import read_scalars
from test_atari import chain
from test_multidiscrete import needs_microrts

sys.path[:0] = [str(ROOT / "benchmark"), str(ROOT / "tools")]
import ablate  # noqa: E402
from _common import ABLATIONS, off_flags  # noqa: E402

# the last commit before the plumbing became plain functions (issue 61). Until 2026-12-06 the defaults were compared
# with 2b9b42a, the last commit before the fence (issue 22), and before 2026-12-02 also with 19cbb2e, the last commit
# before the ablation flags (issue 17); all held: they are fixed history, so matching 3209b37 is matching all three
PRE_FENCE_REV = "3209b37"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
ATARI_TINY = ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 128, "--torch-threads", 1]
TINY = {
    "ppo.py": ["--total-timesteps", 1024],
    "ppo_shared.py": ["--total-timesteps", 1024],
    "ppo_continuous_action.py": ["--env-id", "Pendulum-v1", "--num-steps", 128, "--total-timesteps", 256],
    "ppo_atari.py": ATARI_TINY,
    "ppo_atari_envpool.py": ATARI_TINY,
    "ppo_atari_lstm.py": ATARI_TINY,
    "ppo_atari_multigpu.py": ATARI_TINY,
    "ppo_multidiscrete.py": ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 128],
    "ppo_multidiscrete_mask.py": ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 128],
}
MICRORTS = {"ppo_multidiscrete.py", "ppo_multidiscrete_mask.py"}


def tiny_losses(script, cwd, *flags, path=None, name="run"):
    """The losses/* scalars of a tiny run of `script` (or of the file `path`) with `flags`."""
    args = [*TINY[script], "--exp-name", name, *flags]
    res = run_python(path or ROOT / script, *args, cwd=cwd, env={**ONE_THREAD, **_env()})
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = [d for d in run_dirs(cwd) if f"__{name}__" in d.name]
    scalars = read_scalars(run_dir)
    return {tag: values for tag, values in scalars.items() if tag.startswith("losses/")}


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}


# ------------------------------------------------------------------------ defaults: the same losses as before


def scripts_with_microrts_mark():
    return [pytest.param(s, marks=needs_microrts) if s in MICRORTS else s for s in TINY]


def script_at(rev, script, folder):
    """The file `script` as it was at git revision `rev`, written into `folder` (skip where the clone lacks it)."""
    if shutil.which("git") is None:
        pytest.fail("git is needed to read the scripts as they were at an earlier revision")
    old = folder / f"old_{script}"
    shown = subprocess.run(["git", "show", f"{rev}:{script}"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"revision {rev} is not in this clone (a shallow clone?): {shown.stderr.strip()}")
    old.write_text(shown.stdout, encoding="utf-8")
    return old


@pytest.mark.parametrize("script", ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"])
def test_bf16_channels_last_is_bit_identical_to_an_earlier_revision(script, tmp_path):
    """--bf16 --channels-last too logs the very losses it did before issue 61 (where bfloat16 is native)."""
    if not load_script("ppo_atari.py").bf16_native(load_script("ppo_atari.py").Args(cuda=False)):
        pytest.skip("this CPU has no AVX512-BF16 or AMX-BF16 (--bf16 is refused)")
    flags = ["--bf16", "--channels-last"]
    before = tiny_losses(script, tmp_path, *flags, path=script_at(PRE_FENCE_REV, script, tmp_path), name="before")
    after = tiny_losses(script, tmp_path, *flags, name="after")
    assert before and before == after


@pytest.mark.parametrize("script", scripts_with_microrts_mark())
def test_with_every_flag_at_its_default_the_losses_are_bit_identical_to_an_earlier_revision(script, default_losses, tmp_path):
    before = tiny_losses(script, tmp_path, path=script_at(PRE_FENCE_REV, script, tmp_path), name="before")
    after = default_losses(script, [])  # the run the flags below are set against
    assert before and set(before) == set(after)
    assert before == after  # every loss at every step, to the bit


# ------------------------------------------------------------------------ each flag off: the run changes


def own_ablations(script):
    defaults = ablate.script_defaults(ROOT / script)
    return ablate.applicable(defaults, (ROOT / script).read_text(encoding="utf-8"))


# where a tiny run on the default env would not reach the detail, an env where it does act
ACTIVE_ENV = {
    "atari-6": ["--env-id", "SpaceInvadersNoFrameskip-v4"],  # Breakout's first points are 1s: the sign changes nothing
    "continuous": ["--env-id", "HalfCheetah-v4"],  # Pendulum clips its own actions and rarely meets the other clips
}
WIRED = [("ppo.py", d) for d in own_ablations("ppo.py")]
WIRED += [(s, d) for s in ["ppo_atari.py", "ppo_atari_envpool.py"] for d in own_ablations(s) if d.startswith("atari-")]
# continuous-7: the [-10, 10] clip of normalized observations is not reached in a tiny run of any MuJoCo env (random
# play, 512 steps: at most 6.4 std on HalfCheetah); test_continuous_flags_... checks its flag reaches the wrapper
WIRED += [("ppo_continuous_action.py", d) for d in own_ablations("ppo_continuous_action.py") if d.startswith("cont")]
WIRED.remove(("ppo_continuous_action.py", "continuous-7"))
WIRED += [("ppo_atari_lstm.py", "lstm-3")]


@pytest.fixture(scope="module")
def default_losses(tmp_path_factory):
    cache = {}

    def get(script, env_flags):
        key = (script, tuple(env_flags))
        if key not in cache:
            cache[key] = tiny_losses(script, tmp_path_factory.mktemp("default"), *env_flags, name="default")
        return cache[key]

    return get


@pytest.mark.parametrize("script, detail", WIRED)
def test_each_flag_off_changes_the_run(script, detail, default_losses, tmp_path):
    env_flags = ACTIVE_ENV.get(detail, ACTIVE_ENV.get(detail.split("-")[0], []))
    flags = off_flags(detail, script)
    off = tiny_losses(script, tmp_path, *env_flags, *flags, name="off")
    assert off != default_losses(script, env_flags), f"{' '.join(flags)} left every loss of {script} unchanged"


# ------------------------------------------------------------------------ each flag changes what it names


@pytest.fixture(scope="module")
def ppo():
    return load_script("ppo.py")


def test_core2_off_gives_every_layer_pytorchs_default_init(ppo):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    torch.manual_seed(0)
    agent = ppo.Agent(envs)
    head = agent.actor[-1].weight.detach().clone()
    assert torch.allclose(head @ head.T, 0.01**2 * torch.eye(2), atol=1e-6)  # orthogonal rows of norm 0.01
    ppo.torch_default_init(agent)
    for layer in [m for m in agent.modules() if isinstance(m, torch.nn.Linear)]:
        bound = 1 / math.sqrt(layer.in_features)  # nn.Linear's own: weights and biases uniform in +-1/sqrt(fan_in)
        assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound and layer.bias.abs().sum() > 0
    assert agent.actor[-1].weight.norm(dim=1).min() > 0.1  # no longer the 0.01 head
    envs.close()


def test_core3_core6_core10_core11_flags(ppo):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    agent = ppo.Agent(envs)
    assert ppo.make_optimizer(agent, ppo.Args()).param_groups[0]["eps"] == 1e-5
    assert ppo.make_optimizer(agent, ppo.Args(adam_eps=1e-8)).param_groups[0]["eps"] == 1e-8
    # core-6 off: tests/test_ppo.py's test_each_epoch_takes_the_batch_in_a_new_order_in_whole_minibatches
    # core-10 at 0: the loss has no entropy term
    n = 16
    parts = [torch.randn(n), torch.rand(n), torch.randn(n), torch.randn(n), torch.randn(n), torch.randn(n), torch.randn(n)]
    loss0, pg, v, _, _, _, _ = ppo.ppo_loss(*parts, ppo.Args(ent_coef=0.0), 0.2)
    assert torch.equal(loss0, pg + v * 0.5)
    # core-11 off: a gradient far above max_grad_norm is left whole
    for clip in (True, False):
        layer = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(layer.parameters(), lr=0.0)
        ppo.gradient_step(opt, (layer(torch.full((1, 4), 100.0)) * 100).sum(), 0.5, clip)
        norm = torch.cat([p.grad.flatten() for p in layer.parameters()]).norm()
        assert (norm <= 0.5 + 1e-5) if clip else (norm > 1000)
    envs.close()


@pytest.fixture(scope="module")
def atari():
    return load_script("ppo_atari.py")


def test_atari_flags_remove_their_wrapper_or_change_the_stack(atari):
    default = chain(atari.make_env("BreakoutNoFrameskip-v4", 0, False, "test", atari.Args())())
    for wrapper in ("NoopResetEnv", "EpisodicLifeEnv", "FireResetEnv", "TransformReward"):
        assert wrapper in default
    off = {
        "NoopResetEnv": atari.Args(noop_max=0),
        "EpisodicLifeEnv": atari.Args(episodic_life=False),
        "FireResetEnv": atari.Args(fire_reset=False),
        "TransformReward": atari.Args(clip_reward=False),
    }
    for wrapper, args in off.items():
        names = chain(atari.make_env("BreakoutNoFrameskip-v4", 0, False, "test", args)())
        assert wrapper not in names and len(names) == len(default) - 1, (wrapper, names)
    env = atari.make_env("BreakoutNoFrameskip-v4", 0, False, "test", atari.Args(frame_stack=2))()
    assert env.observation_space.shape == (2, 84, 84) and env.reset(seed=0)[0].shape == (2, 84, 84)
    env.close()
    args = atari.Args(noop_max=0, env_id="BreakoutNoFrameskip-v4", num_envs=1)
    assert atari.check_args(args) is None  # 0 no-ops is allowed; -1 is not
    with pytest.raises(ValueError, match="--noop-max -1 is not allowed"):
        atari.Args(noop_max=-1)


def test_atari_without_reward_clipping_learns_from_the_games_reward(atari):
    class Scored(gym.Wrapper):  # a reward of 7 at every step, as a Breakout top row gives
        def step(self, action):
            obs, _, terminated, truncated, info = self.env.step(action)
            return obs, 7.0, terminated, truncated, info

    for clip, expected in ((True, 1.0), (False, 7.0)):
        env = atari.make_env("PongNoFrameskip-v4", 0, False, "test", atari.Args(clip_reward=clip))()
        inner = env
        while type(inner.env).__name__ != "MaxAndSkipEnv":
            inner = inner.env
        inner.env = Scored(inner.env)  # under RecordEpisodeStatistics: what the agent learns from is changed
        env.reset(seed=0)
        assert env.step(0)[1] == expected
        env.close()


@pytest.fixture(scope="module")
def pool():
    return load_script("ppo_atari_envpool.py")


def test_envpool_flags(pool):
    assert "envpool takes at least one no-op frame" in pool.check_args(pool.Args(noop_max=0))  # 0 would crash envpool
    assert off_flags("atari-1", "ppo_atari_envpool.py") == ["--noop-max", "1"]  # its ablation: the least it takes
    args = pool.Args(num_envs=2, noop_max=1, episodic_life=False, fire_reset=False, clip_reward=False, frame_stack=2)
    assert pool.check_args(args) is None
    envs = pool.make_envs(args, "test")
    assert (envs.fire, envs.clip_reward, envs.options["noop_max"], envs.options["episodic_life"]) == (False, False, 1, False)
    obs, infos = envs.reset(seed=1)
    assert obs.shape == (2, 2, 84, 84) and envs.single_observation_space.shape == (2, 84, 84)
    lives, rng = infos["lives"].copy(), np.random.default_rng(0)
    lost = False
    for _ in range(3000):  # random play loses a life: without EpisodicLife the episode goes on
        obs, _, terminated, _, infos = envs.step(rng.integers(4, size=2))
        lost_now = infos["lives"] < lives
        if lost_now.any() and (infos["lives"] > 0).all():
            assert not terminated[lost_now].any()
            lost = True
            break
        lives = infos["lives"].copy()
    envs.close()
    assert lost
    default = pool.make_envs(pool.Args(num_envs=1), "test")
    assert (default.fire, default.clip_reward, default.options["noop_max"], default.options["episodic_life"]) == (
        True,
        True,
        30,
        True,
    )
    default.close()


@pytest.fixture(scope="module")
def cont():
    return load_script("ppo_continuous_action.py")


def test_continuous_flags_off_give_the_envs_own_observations_rewards_and_actions(cont):
    raw = gym.vector.SyncVectorEnv(
        [cont.make_env("Pendulum-v1", 0, False, "test")], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    off = cont.Args(env_id="Pendulum-v1", norm_obs=False, clip_obs=False, norm_reward=False, clip_reward=False)
    envs = cont.make_envs(off, "test")
    scaled = cont.make_envs(cont.Args(env_id="Pendulum-v1", clip_reward=False), "test")
    o1, _ = raw.reset(seed=4)
    o2, _ = envs.reset(seed=4)
    scaled.reset(seed=4)
    assert np.array_equal(o1.astype(np.float32), o2)
    for _ in range(20):
        a = np.array([[1.5]], dtype=np.float32)
        s1, s2, s3 = raw.step(a), envs.step(a), scaled.step(a)
        assert np.array_equal(s1[0].astype(np.float32), s2[0]) and np.array_equal(s1[1], s2[1])  # the env's own
        assert not np.array_equal(s1[1], s3[1])  # reward scaling on: divided by the return's running std
    # each clip lives inside its normalization, as in ppo2's VecNormalize: normalization off, no clipping either
    only_clip = cont.VecNormalize(raw, 0.99, switches=(False, True, False, False))
    big = np.array([[12.0, -30.0, 0.5]])
    assert np.array_equal(only_clip.normalize(big), big.astype(np.float32))  # raw observations are never clipped
    clipped = cont.VecNormalize(raw, 0.99, switches=(True, True, True, True))
    clipped.obs_rms.var[:] = 1e-6
    assert np.abs(clipped.normalize(big, update=False)).max() == 10  # normalized ones are
    raw_again, unscaled = raw, cont.make_envs(cont.Args(env_id="Pendulum-v1", norm_reward=False), "test")  # clip on
    raw_again.reset(seed=4), unscaled.reset(seed=4)
    raw_rewards, kept = [], []
    for _ in range(200):
        a = np.array([[1.5]], dtype=np.float32)
        raw_rewards.append(raw_again.step(a)[1][0]), kept.append(unscaled.step(a)[1][0])
    assert min(raw_rewards) < -10 and kept == raw_rewards  # Pendulum's rewards below -10 reach the agent unclipped
    unscaled.close()
    unclipped = cont.VecNormalize(raw, 0.99, switches=(True, False, True, True))
    unclipped.obs_rms.var[:] = 1e-6  # a tiny running std: normalized values far beyond 10 are kept
    assert np.abs(unclipped.normalize(big, update=False)).max() > 10
    switched = cont.make_envs(cont.Args(env_id="Pendulum-v1", norm_obs=False, clip_obs=False, norm_reward=False), "test")
    assert (switched.norm_obs, switched.clip_obs, switched.norm_reward, switched.clip_reward) == (False, False, False, True)
    switched.close()
    # continuous-5 off: the env receives the raw sample
    assert "ClipAction" in chain(cont.make_env("Pendulum-v1", 0, False, "test")())
    assert "ClipAction" not in chain(cont.make_env("Pendulum-v1", 0, False, "test", clip_action=False)())
    for e in (raw, envs, scaled):
        e.close()


def test_lstm3_off_carries_the_state_across_episode_ends():
    lstm = load_script("ppo_atari_lstm.py")
    args = lstm.Args(num_envs=2)
    envs = lstm.make_envs(args, "test")
    x = torch.randint(0, 255, (2, 1, 84, 84)).float()
    for reset, same in ((True, False), (False, True)):
        torch.manual_seed(0)
        agent = lstm.Agent(envs, reset_state=reset)
        state = tuple(torch.randn(1, 2, 128) for _ in range(2))
        h_done, _ = agent.get_states(x, state, torch.ones(2))
        h_going, _ = agent.get_states(x, state, torch.zeros(2))
        assert torch.equal(h_done, h_going) == same
    envs.close()


# ------------------------------------------------------------------------ benchmark/ablate.py


def test_the_ablation_table_names_real_flags_of_every_script_that_tags_the_detail():
    for script in ROOT.glob("ppo*.py"):
        module = load_script(script.name)
        for detail in ablate.applicable(ablate.script_defaults(script), script.read_text(encoding="utf-8")):
            field, off = ABLATIONS[detail]
            assert field in module.Args.__dataclass_fields__ and getattr(module.Args(), field) != off
            assert f"({detail}" in script.read_text(encoding="utf-8").split(f"    {field}:")[1].split('"""')[1]  # docstring
    assert off_flags("core-2") == ["--no-orthogonal-init"] and off_flags("core-3") == ["--adam-eps", "1e-08"]
    assert off_flags("atari-7") == ["--frame-stack", "1"]


def tool(*args, cwd=ROOT, timeout=120):
    cmd = [sys.executable, str(ROOT / "benchmark/ablate.py"), *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**_env(), **ONE_THREAD})


def test_dry_run_prints_the_default_and_one_run_per_detail_off():
    res = tool("ppo.py", "--env-id", "CartPole-v1", "Acrobot-v1", "--total-timesteps", 500000, "--dry-run")
    assert res.returncode == 0, res.stderr
    commands = [line for line in res.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == 2 * 3 * 9 and "54 runs: 8 details off" in res.stdout
    first = commands[0].split()
    assert first[1:] == ["ppo.py", "--env-id", "CartPole-v1", "--seed", "1", "--total-timesteps", "500000"] + [
        "--exp-name",
        "ppo__default",
    ]
    assert any(c.endswith("--exp-name ppo__off-core-2 --no-orthogonal-init") for c in commands)
    assert any(c.endswith("--exp-name ppo__off-core-3 --adam-eps 1e-08") for c in commands)
    res = tool("ppo_continuous_action.py", "--env-id", "Hopper-v4", "--total-timesteps", 9, "--details", "continuous-8",
               "--dry-run", "--", "--cuda")  # fmt: skip
    assert res.stdout.splitlines()[1].endswith("--exp-name ppo_continuous_action__off-continuous-8 --no-norm-reward --cuda")


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope.py", "--env-id", "X", "--total-timesteps", 1], "no such script: nope.py"),
        (["ppo.py", "--env-id", "X", "--total-timesteps", 1, "--details", "core-99"], "no ablation for core-99"),
        (
            ["ppo.py", "--env-id", "X", "--total-timesteps", 1, "--details", "atari-1"],
            "cannot switch off atari-1 (not a detail of it)",
        ),
        (["ppo_continuous_action.py", "--env-id", "X", "--total-timesteps", 1, "--details", "core-10"], "already the 'off'"),
        (["ppo.py", "--env-id", "X", "--total-timesteps", 0], "--total-timesteps, --jobs"),
    ],
)
def test_bad_input_one_clear_line(args, message):
    res = tool(*args, "--dry-run")
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_runs_source_that_is_not_an_episodes_file_gets_one_line(tmp_path):
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    res = tool(
        "ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", 1000, "--report-only", "--runs", "bad.csv.gz", cwd=tmp_path
    )
    assert res.returncode == 2 and "error: cannot read the runs of bad.csv.gz" in res.stderr and "Traceback" not in res.stderr


def test_bootstrap_interval_and_verdict():
    low, high = ablate.bootstrap_interval([10.0, 10.0, 10.0], [4.0, 5.0, 6.0])
    assert 4.0 <= low < 5.0 < high <= 6.0  # 10 - mean of a resample of {4, 5, 6}: within [4, 6]
    assert ablate.bootstrap_interval([1.0, 2.0], [1.0, 2.0]) == ablate.bootstrap_interval([1.0, 2.0], [1.0, 2.0])
    assert ablate.verdict(0.5, 2) == "better off" and ablate.verdict(-3, -1) == "worse off"
    assert ablate.verdict(-1, 1) == "no measurable difference"


def test_tiny_ablation_runs_reports_and_continues_where_it_stopped(tmp_path):
    args = ["ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", 1024, "--seeds", 1, 2]
    args += ["--details", "core-4", "core-11", "--jobs", 2, "--out", "report", "--last", 10]
    res = tool(*args, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    names = sorted(d.name.rsplit("__", 1)[0] for d in run_dirs(tmp_path))
    assert names == sorted(f"CartPole-v1__ppo__{c}__{s}" for c in ("default", "off-core-4", "off-core-11") for s in (1, 2))
    lr = {d.name.split("__")[2]: read_scalars(d)["charts/learning_rate"] for d in run_dirs(tmp_path) if "__1__" in d.name}
    assert lr["off-core-4"][-1][1] == lr["off-core-4"][0][1] and lr["default"][-1][1] < lr["default"][0][1]
    text = (tmp_path / "report/README.md").read_text()
    assert (tmp_path / "report/CartPole-v1.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "report/summary.csv", newline="") as f:
        rows = {r["detail_off"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"default", "core-4", "core-11"} and rows["core-4"]["flags"] == "--no-anneal-lr"
    finals = {}
    for run_dir in run_dirs(tmp_path):  # each seed's final return: the mean of its last 10 episodes, from the events
        returns = [v for _, v in read_scalars(run_dir)["charts/episodic_return"]][-10:]
        finals.setdefault(run_dir.name.split("__")[2], []).append(np.mean(returns))
    for detail, row in rows.items():
        config = "default" if detail == "default" else f"off-{detail}"
        assert float(row["mean"]) == pytest.approx(np.mean(finals[config]), rel=1e-5)
        if detail != "default":
            diff = np.mean(finals[config]) - np.mean(finals["default"])
            assert float(row["diff"]) == pytest.approx(diff, rel=1e-5)
            assert float(row["low"]) <= float(row["diff"]) + 1e-6 and float(row["diff"]) - 1e-6 <= float(row["high"])
            line = next(x for x in text.splitlines() if x.startswith(f"| {detail} |"))
            assert f"`{row['flags']}`" in line and f"{float(row['diff']):.2f}" in line
    with gzip.open(tmp_path / "report/episodes.csv.gz", "rt") as f:
        assert {r["exp"] for r in csv.DictReader(f)} == {"ppo__default", "ppo__off-core-4", "ppo__off-core-11"}
    again = tool(*args, cwd=tmp_path, timeout=300)  # complete runs are not made again
    assert again.returncode == 0 and "6 of 6 runs are already complete" in again.stdout and "started" not in again.stdout
    assert len(run_dirs(tmp_path)) == 6
    other = run_script("ppo.py", "--total-timesteps", 1024, "--exp-name", "ppo__off-core-9", cwd=tmp_path)
    assert other.returncode == 0  # a run of another config is not in this ablation's report
    assert tool(*args, "--report-only", cwd=tmp_path).returncode == 0
    assert "core-9" not in (tmp_path / "report/README.md").read_text()


def test_report_only_from_an_episodes_file(tmp_path):
    """The committed episodes.csv.gz makes the report again without the event files."""
    src = ROOT / "docs/results/ablations/ppo/episodes.csv.gz"
    if not src.is_file() or importlib.util.find_spec("matplotlib") is None:
        pytest.skip("no committed ablation report yet")
    args = ["ppo.py", "--env-id", "CartPole-v1", "Acrobot-v1", "--total-timesteps", 500000, "--report-only"]
    res = tool(*args, "--runs", src, "--out", tmp_path / "again", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    committed = (ROOT / "docs/results/ablations/ppo/summary.csv").read_text()
    assert (tmp_path / "again/summary.csv").read_text() == committed


def test_incomplete_runs_are_left_out_and_one_seed_gets_no_interval(tmp_path):
    import report

    def run(exp, seed, last_step, value):
        r = report.Run("CartPole-v1", exp, seed, 1000 + seed, tmp_path, start_time=0.0, last_step=last_step, last_time=9.0)
        r.returns = [(s, 1.0, value + seed) for s in range(100, last_step + 1, 100)]
        return r

    runs = [run("ppo__default", 1, 1000, 100.0), run("ppo__default", 2, 1000, 100.0), run("ppo__off-core-4", 1, 1000, 50.0)]
    runs += [
        run("ppo__off-core-4", 2, 500, 50.0),
        run("ppo__off-core-9", 1, 1000, 80.0),
        run("ppo__off-core-9", 2, 1000, 80.0),
    ]
    source = tmp_path / "episodes.csv.gz"
    report.write_episodes(runs, source)
    notes = []
    groups = ablate.load_groups([source], "ppo", {"CartPole-v1"}, ["core-4", "core-9"], {1, 2}, 1000, notes)
    assert notes == ["ppo__off-core-4 CartPole-v1 seed 2 stopped at step 500: left out"]
    assert [r.seed for r in groups["CartPole-v1", "ppo__off-core-4"]] == [1]
    rows = {r["detail"]: r for r in ablate.ablation_rows(groups, "ppo", ["core-4", "core-9"], last=100)}
    assert rows["core-4"]["diff"] == pytest.approx(51.0 - 101.5) and math.isnan(rows["core-4"]["low"])  # one seed
    assert rows["core-9"]["diff"] == pytest.approx(-20.0) and rows["core-9"]["low"] <= -20.0 <= rows["core-9"]["high"]


def test_sigterm_stops_the_runs_and_says_how_to_go_on(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmark/ablate.py"), "ppo.py", "--env-id", "CartPole-v1", "--seeds", 7771, 7772]
    cmd += ["--total-timesteps", 200000, "--details", "core-4", "--jobs", 2]
    proc = subprocess.Popen(list(map(str, cmd)), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(run_dirs(tmp_path)) < 2 and time.time() < deadline:  # both runs have begun logging
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err  # the signal's own exit status, as the runs'
    assert err.strip().splitlines()[-1].startswith("interrupted: 2 run(s) stopped, 2 not started; the same command goes on")
    assert "Traceback" not in err
    left = subprocess.run(["pgrep", "-f", "--", "--seed 777[12]"], capture_output=True, text=True)
    assert left.returncode == 1 and left.stdout == "", left  # pgrep: 1 = no process matched (no run outlives the command)

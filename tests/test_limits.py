"""Flags against what their backends take (issue 23): non-finite floats, ALE's, envpool's, numpy's and torch's limits, a
rollout larger than the memory, --noop-max, names that make no folder or that wandb refuses; torchrun's launch (one
line, once); --eval-checkpoint's flags; a ppo_atari_envpool.py checkpoint recorded by ppo_atari.py; the MicroRTS tests
without gym-microrts."""

import os
import subprocess
import sys
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_python, run_script
from test_atari_multigpu import torchrun

SCRIPTS = sorted(p.name for p in ROOT.glob("ppo*.py"))
ATARI = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"]
ATARI_TINY = ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 64, "--update-epochs", 1]
FAST = {"OMP_NUM_THREADS": "1"}
BREAKOUT = "BreakoutNoFrameskip-v4"
SPACE = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # the Atari scripts' observations


@pytest.fixture(scope="module")
def modules():
    return {}


def script(modules, name):
    if name not in modules:
        modules[name] = load_script(name)
    return modules[name]


def one_line_error(res, tmp_path):
    """The run's stderr: exactly one line, `error: ...`; nonzero exit; no run folder made."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), res.stdout[-2000:] + res.stderr[-3000:]
    assert not (tmp_path / "runs").exists()
    return lines[0]


# ---------------------------------------------------------------- non-finite floats


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_float_flag_refuses_inf_and_nan_in_one_line(name, modules):
    module = script(modules, name)
    floats = [f for f, t in module.Args.__annotations__.items() if t in (float, float | None)]
    assert {"learning_rate", "ent_coef", "vf_coef", "max_grad_norm", "adam_eps", "target_kl"} <= set(floats)
    for field in floats:
        for value in (float("inf"), float("-inf"), float("nan")):
            error = module.domain_error(module.Args(**{field: value}))
            flag = "--" + field.replace("_", "-")
            assert error and error.startswith(f"{flag} {value} is not allowed: it must be "), (name, field, error)
            assert "\n" not in error


# ---------------------------------------------------------------- the backends' integer limits


def test_ale_takes_frame_limits_below_2_to_the_31_and_so_do_the_atari_scripts(modules):
    kwargs = dict(frameskip=1, obs_type="grayscale")
    gym.make(BREAKOUT, max_num_frames_per_episode=2**31 - 1, **kwargs).close()  # ALE's setInt: a C int
    with pytest.raises(TypeError):
        gym.make(BREAKOUT, max_num_frames_per_episode=2**31, **kwargs)
    for name in ATARI:
        module = script(modules, name)
        assert module.check_args(module.Args(max_episode_frames=2**31 - 1)) is None
        error = module.check_args(module.Args(max_episode_frames=2**31))
        assert error.startswith("--max-episode-frames 2147483648 is not allowed: it must be in [1, 2**31)"), (name, error)


def test_envpool_takes_an_int32_seed_and_so_does_its_script(modules):
    import envpool

    options = dict(env_type="gymnasium", num_envs=1, img_height=84, img_width=84, stack_num=1)
    envpool.make("Breakout-v5", seed=2**31 - 1, **options).close()
    with pytest.raises(AssertionError, match="int32"):
        envpool.make("Breakout-v5", seed=2**31, **options)
    pool, atari = script(modules, "ppo_atari_envpool.py"), script(modules, "ppo_atari.py")
    assert pool.check_args(pool.Args(seed=2**31 - 1)) is None
    assert pool.check_args(pool.Args(seed=2**31)).startswith("--seed 2147483648 is not allowed: envpool takes an int32 seed")
    assert atari.check_args(atari.Args(seed=2**32 - 1)) is None  # ale-py and numpy: below 2**32


def test_torch_threads_at_most_the_cpus_and_total_timesteps_within_tensorboards_int64(modules):
    ppo = script(modules, "ppo.py")
    cpus = os.cpu_count()
    assert ppo.check_args(ppo.Args(torch_threads=cpus)) is None
    error = ppo.check_args(ppo.Args(torch_threads=cpus + 1))
    assert error == f"--torch-threads {cpus + 1} is not allowed: it must be in [0, {cpus}], the CPUs (0: torch's)"
    assert ppo.check_args(ppo.Args(total_timesteps=2**63)).startswith("--total-timesteps 9223372036854775808 is not allowed")
    assert ppo.check_args(ppo.Args(total_timesteps=2**63 - 1)) is None


# ---------------------------------------------------------------- --noop-max


@pytest.mark.parametrize("name", ATARI)
def test_noop_max_stays_below_the_games_frame_limit(name, modules):
    module = script(modules, name)
    assert module.check_args(module.Args(noop_max=399999)) is None  # ppo2's game: 400,000 frames
    error = module.check_args(module.Args(noop_max=400000))
    assert error == "--noop-max 400000 is not allowed: it must be below a game's 400000 frames (--max-episode-frames)"
    assert module.check_args(module.Args(noop_max=99, max_episode_frames=100)) is None
    assert "below a game's 100 frames" in module.check_args(module.Args(noop_max=100, max_episode_frames=100))


# ---------------------------------------------------------------- the rollout's memory


def test_a_rollout_larger_than_memory_is_refused_with_its_size(tmp_path):
    flags = ["--num-steps", 10**7, "--num-envs", 8, "--total-timesteps", 8 * 10**7, "--no-cuda"]  # the RAM, GPU or not
    res = run_script("ppo_atari.py", *flags, cwd=tmp_path)
    line = one_line_error(res, tmp_path)
    assert line.startswith("error: the rollout needs 2104.9 GiB of RAM (--num-steps 10000000 x --num-envs 8 x 28252 bytes)")
    assert line.endswith("GiB is available; lower --num-steps or --num-envs")


def test_the_estimate_is_what_the_rollout_stores(modules, monkeypatch):
    atari = script(modules, "ppo_atari.py")
    args = atari.Args(num_envs=1, num_steps=8, num_minibatches=1, total_timesteps=8)
    assert atari.check_args(args) is None
    envs = atari.make_envs(args, "test")
    # obs (uint8, 4x84x84) + action, log-prob, reward, done, value, advantage and return (float32): the check_args estimate
    assert atari.step_bytes(envs) == 4 * 84 * 84 + 7 * 4 == 28252
    envs.close()
    ppo = script(modules, "ppo.py")  # float observations: counted from the envs once made (CartPole: 4 floats)
    args = ppo.Args(num_envs=1, num_steps=1000, num_minibatches=1, total_timesteps=1000, cuda=False)
    assert ppo.check_args(args) is None
    run = ppo.Run(args)
    monkeypatch.setattr(ppo, "available_ram", lambda: 43_000)  # below 1000 steps x 44 bytes
    with pytest.raises(SystemExit, match=r"the rollout needs .* x 44 bytes\) but 0.0 GiB is available"):
        run.check_env(ppo.make_envs(args, "test"))


def test_on_a_gpu_its_free_memory_counts_and_torchruns_ranks_split_the_envs(modules, monkeypatch):
    atari = script(modules, "ppo_atari.py")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: asked.append(device) or (2**30, 2**34))
    args = atari.Args(num_envs=64, num_steps=1024, total_timesteps=2**16)  # 64 x 1024 x 28252 bytes: 1.7 GiB
    assert "1.7 GiB of GPU memory" in atari.limits_error(args) and "1.0 GiB is available" in atari.limits_error(args)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert atari.limits_error(args) is None and asked[-1] == 1  # half of it on each rank's GPU, this rank's GPU asked
    args.cuda = False
    monkeypatch.setattr(atari, "available_ram", lambda: 2**30)
    assert "1.7 GiB of RAM" in atari.limits_error(args)  # the ranks' envs share one machine's RAM


# ---------------------------------------------------------------- names


def test_names_that_make_no_folder_or_that_wandb_refuses(modules, tmp_path):
    ppo = script(modules, "ppo.py")
    for kwargs, message in [
        (dict(exp_name="a/b"), "--exp-name 'a/b' is not allowed: it names the run's folder"),
        (dict(exp_name=""), "--exp-name '' is not allowed"),
        (dict(exp_name="tab\there"), "so it must be printable, without '/'"),
        (dict(exp_name="x" * 250), "keep that name within 255 bytes"),
        (dict(track=True, wandb_project_name="p" * 129), "wandb takes at most 128 characters"),
        (dict(track=True, wandb_tags=("ok", "")), "--wandb-tags '' is not allowed: wandb takes tags of 1 to 64 characters"),
        (dict(track=True, wandb_tags=("t" * 65,)), "wandb takes tags of 1 to 64 characters"),
    ]:
        error = ppo.check_args(ppo.Args(**kwargs))
        assert error and message in error and "\n" not in error, (kwargs, error)
    fine = ppo.Args(track=True, exp_name="x" * 200, wandb_project_name="p" * 128, wandb_tags=("t" * 64,))
    assert ppo.limits_error(fine) is None
    # an evaluation and a resumed run make no new folder: a checkpoint's name is not judged again
    assert ppo.limits_error(ppo.Args(exp_name="a/b", resume="c.pt")) is None
    assert ppo.limits_error(ppo.Args(exp_name="a/b", eval_checkpoint="c.pt")) is None
    tiny = ["--total-timesteps", 128, "--num-envs", 1, "--num-steps", 128]
    res = run_script("ppo.py", "--exp-name", "a/b", *tiny, cwd=tmp_path)  # it made runs/<env>__a/b__...: nested folders
    assert "--exp-name 'a/b' is not allowed" in one_line_error(res, tmp_path)
    res = run_script("ppo.py", "--track", "--wandb-project-name", "team/project", *tiny, cwd=tmp_path)  # wandb's traceback
    assert "--wandb-project-name 'team/project' is not allowed: wandb" in one_line_error(res, tmp_path)


# ---------------------------------------------------------------- torchrun and the distributed environment


def test_under_torchrun_a_bad_flag_is_said_once_by_rank_0(tmp_path):
    # rank 1 would seed numpy with 2**32 (a ValueError traceback); the flags are checked before the process group
    res = torchrun(2, "--seed", 2**32 - 1, *ATARI_TINY, cwd=tmp_path, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    said = "--seed 4294967295 is not allowed with 2 ranks: rank k seeds numpy with seed + k, below 2**32"
    assert errors == [f"error: {said}"], out
    # torchrun's own report (printed whenever a worker fails) names rank 0 alone, with the line
    assert "<NO_OTHER_FAILURES>" in out and "rank      : 1" not in out and "SIGTERM" not in out, out
    assert f"traceback : error: {said}" in out and "ValueError" not in out, out
    res = torchrun(2, "--no-such-flag", cwd=tmp_path, timeout=120)  # tyro's own message, once too
    assert res.returncode != 0 and (res.stdout + res.stderr).count("Unrecognized options: --no-such-flag") == 1
    assert not (tmp_path / "runs").exists()


def test_a_half_set_distributed_environment_is_one_line(modules, tmp_path, monkeypatch):
    names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    full = {k: v for k, v in {**os.environ, **FAST, "WANDB_MODE": "offline"}.items() if k not in names}
    args = [ROOT / "ppo_atari_multigpu.py", *ATARI_TINY]
    res = run_python(*args, cwd=tmp_path, timeout=120, env={**full, "MASTER_ADDR": "x"})
    line = one_line_error(res, tmp_path)
    assert (
        line
        == "error: a half-set distributed environment (MASTER_ADDR='x'): start with torchrun, or unset them for one process"
    )
    mg = script(modules, "ppo_atari_multigpu.py")
    args = mg.Args(num_envs=4, num_steps=32, num_minibatches=2, total_timesteps=128)
    for env, said in [
        ({"RANK": "1", "WORLD_SIZE": "2"}, "(RANK='1', WORLD_SIZE='2')"),
        ({"RANK": "0", "WORLD_SIZE": "two", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}, "WORLD_SIZE='two'"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}, "RANK='2', WORLD_SIZE='2'"),
        ({"LOCAL_RANK": "-1"}, "(LOCAL_RANK='-1')"),
    ]:
        for name in names:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        *_, error = mg.setup_distributed(args)  # returns before any process group is made
        assert error.startswith("a half-set distributed environment (") and said in error, (env, error)
        assert not torch.distributed.is_initialized()


def test_a_resumed_run_is_split_over_the_ranks_with_its_own_num_envs(modules, tmp_path):
    """The ranks' split was checked with the command line's --num-envs (8), not the run's (3), before --resume loaded it."""
    mg = script(modules, "ppo_atari_multigpu.py")
    args = mg.Args(num_envs=3, num_steps=32, num_minibatches=1, total_timesteps=96)
    assert mg.check_args(args) is None
    agent = mg.Agent(SimpleNamespace(single_observation_space=SPACE, single_action_space=gym.spaces.Discrete(4)))
    path = tmp_path / "three.pt"
    assert mg.save_checkpoint(str(path), agent, mg.make_optimizer(agent, args), args, "three-envs", 1, mg.rng_states())
    res = torchrun(2, "--resume", path, "--total-timesteps", 192, cwd=tmp_path, timeout=120)
    errors = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("error: ")]
    assert res.returncode != 0 and errors == [
        "error: --num-envs 3 must split evenly over 2 ranks, each rank's batch over the minibatches"
    ], res.stdout + res.stderr


# ---------------------------------------------------------------- --eval-checkpoint


@pytest.fixture(scope="module")
def cartpole_checkpoint(tmp_path_factory):
    ppo = load_script("ppo.py")
    args = ppo.Args(num_envs=1, num_steps=128, num_minibatches=1, total_timesteps=128)
    assert ppo.check_args(args) is None
    envs = ppo.make_envs(args, "test")
    agent = ppo.Agent(envs)
    envs.close()
    path = tmp_path_factory.mktemp("trained") / "checkpoint.pt"
    optimizer = ppo.make_optimizer(agent, args)
    assert ppo.save_checkpoint(str(path), agent, optimizer, args, "CartPole-v1__ppo__1__0", 1, ppo.rng_states())
    return path


def test_eval_refuses_flags_it_cannot_honour(cartpole_checkpoint, tmp_path):
    res = run_script("ppo.py", "--eval-checkpoint", cartpole_checkpoint, "--env-id", "Acrobot-v1", cwd=tmp_path)
    line = one_line_error(res, tmp_path)  # it played CartPole, the checkpoint's env
    drop = "an evaluation plays the checkpoint with the settings it was trained with; drop them"
    assert line == f"error: --env-id Acrobot-v1 (the checkpoint's: CartPole-v1): {drop}" and "eval:" not in res.stdout
    ppo = load_script("ppo.py")
    for argv, said in [
        (["--seed", "7", "--num-envs", "4"], "--num-envs 4 (the checkpoint's: 1), --seed 7 (the checkpoint's: 1)"),
        (["--no-anneal-lr"], "--anneal-lr False (the checkpoint's: True)"),
        (["--learning-rate=0.1"], "--learning-rate 0.1 (the checkpoint's: 0.00025)"),
    ]:
        argv = ["--eval-checkpoint", str(cartpole_checkpoint), *argv]
        assert ppo.eval_args_error(ppo.tyro.cli(ppo.Args, args=argv), argv) == f"{said}: {drop}"
    # the flags it honours, and others given at the checkpoint's own values
    argv = ["--eval-checkpoint", str(cartpole_checkpoint), "--eval-episodes", "3", "--capture-video", "--no-cuda"]
    argv += ["--torch-threads", "1", "--wandb-tags", "eval", "--env-id", "CartPole-v1", "--num-envs", "1", "--seed", "1"]
    assert ppo.eval_args_error(ppo.tyro.cli(ppo.Args, args=argv), argv) is None
    argv = ["--eval-checkpoint", str(cartpole_checkpoint), "--eval-episodes", "0"]
    assert "--eval-episodes 0 is not allowed" in ppo.eval_args_error(ppo.tyro.cli(ppo.Args, args=argv), argv)


def test_eval_takes_torch_threads(cartpole_checkpoint, tmp_path, monkeypatch):
    """--torch-threads applies to an evaluation (it was silently ignored)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: no other thread count to set")
    ppo = load_script("ppo.py")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    argv = ["ppo.py", "--eval-checkpoint", str(cartpole_checkpoint), "--eval-episodes", "1", "--torch-threads", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(tmp_path)
    try:
        with pytest.raises(SystemExit) as stop:
            ppo.main()
        assert stop.value.code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_eval_of_a_bf16_checkpoint_needs_no_bf16_cpu_nor_its_threads(modules, tmp_path, monkeypatch):
    """An evaluation plays in float32 with its own threads: a checkpoint trained with --bf16 (and more threads than this
    machine has) plays on a CPU without bfloat16."""
    atari = script(modules, "ppo_atari.py")
    args = atari.Args(num_envs=1, num_steps=8, num_minibatches=1, total_timesteps=8, max_episode_frames=100)
    assert atari.check_args(args) is None
    agent = atari.Agent(SimpleNamespace(single_observation_space=SPACE, single_action_space=gym.spaces.Discrete(4)))
    args.bf16, args.torch_threads = True, (os.cpu_count() or 1) + 1  # as trained elsewhere
    path = tmp_path / "bf16.pt"
    assert atari.save_checkpoint(str(path), agent, atari.make_optimizer(agent, args), args, "bf16-run", 1, atari.rng_states())
    monkeypatch.setattr(atari, "cpu_flags", lambda: set())  # no AVX512-BF16 / AMX-BF16
    monkeypatch.chdir(tmp_path)
    assert len(atari.evaluate(str(path), 1, torch.device("cpu"))) == 1


def test_ppo_atari_plays_and_records_a_ppo_atari_envpool_checkpoint(modules, tmp_path):
    trained = [*ATARI_TINY, "--save-model", "--max-episode-frames", 400, "--torch-threads", 1]
    res = run_script("ppo_atari_envpool.py", *trained, cwd=tmp_path, env=FAST)
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = run_dirs(tmp_path)
    ckpt = run_dir / "checkpoint.pt"
    flags = ["--eval-checkpoint", ckpt, "--capture-video", "--eval-episodes", 1]
    res = run_script("ppo_atari.py", *flags, cwd=tmp_path, env=FAST)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "playing a ppo_atari_envpool.py checkpoint with ppo_atari.py: ale-py's games, not envpool's" in res.stdout
    assert "eval: 1 episodes" in res.stdout
    assert list((tmp_path / "videos" / f"{run_dir.name}-eval").glob("*.mp4"))
    atari = script(modules, "ppo_atari.py")
    with pytest.raises(SystemExit, match="was written by ppo_atari_envpool.py; load it with that script"):
        atari.load_checkpoint(str(ckpt))  # --resume: training goes on with its own script only


# ---------------------------------------------------------------- the MicroRTS tests without gym-microrts

HIDE = '''import sys


class Absent:
    """gym_microrts and jpype not found, as on a fresh venv with only requirements.txt."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("gym_microrts", "jpype"):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(self.finder, name)


sys.meta_path[:] = [Absent(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
'''


def test_without_the_optional_pieces_every_test_of_them_skips_or_passes(tmp_path):
    """A fresh venv (requirements.txt only): the tests that touch MicroRTS skip or pass, none fails; run with gym_microrts
    and jpype hidden (a sitecustomize on PYTHONPATH)."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    code = "import importlib.util as u; print(u.find_spec('gym_microrts'), u.find_spec('jpype'), u.find_spec('numpy') is None)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.stdout.split() == ["None", "None", "False"], res.stderr  # hidden, and only they
    # the tests over every script (ids naming a MicroRTS script) and those named for MicroRTS; left out: the tests of
    # the algorithm in test_multidiscrete.py (the CNN, log-probs, masks) and of the source text, which run no env
    select = "(multidiscrete and not test_multidiscrete) or microrts"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select, str(ROOT / "tests")]
    cmd += ["--ignore", "tests/test_tools.py", "--ignore", "tests/test_reading.py"]
    cmd += ["--deselect", "tests/test_multidiscrete.py::test_clear_error_without_gym_microrts"]  # it hides them itself
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    summary = res.stdout.strip().splitlines()[-1]
    assert res.returncode == 0 and "skipped" in summary, res.stdout[-4000:]
    assert "failed" not in summary and "error" not in summary, res.stdout[-4000:]

"""--bf16 in the four Atari scripts: the CNN under bfloat16 autocast, everything from its output on in float32."""

import importlib.util
import json
import math
import os

import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_python
from tbutil import read_scalars

spec = importlib.util.spec_from_file_location("bit_checks", ROOT / "benchmark" / "bit_checks.py")
bit_checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bit_checks)  # the bit-level checks that benchmark/gpu_check.py runs on the GPU

ATARI = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"]
TINY = ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 128, "--torch-threads", 1]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def native_bf16():
    return load_script("ppo_atari.py").bf16_native(load_script("ppo_atari.py").Args(cuda=False))


@pytest.mark.parametrize("script", ATARI)
def test_autocast_reaches_the_convolutions_and_the_rest_stays_float32(script):
    module = load_script(script)
    args = module.Args(num_envs=2)
    envs = module.make_envs(args, "test")
    torch.manual_seed(0)
    lstm = script == "ppo_atari_lstm.py"
    agent = module.Agent(envs, bf16=True)
    envs.close()
    seen = []
    for layer in agent.network:
        if isinstance(layer, torch.nn.Conv2d | torch.nn.Linear):
            layer.register_forward_hook(lambda m, inputs, out: seen.append((inputs[0].dtype, out.dtype, m.weight.dtype)))
    x = torch.randint(0, 255, (2,) + envs.single_observation_space.shape, dtype=torch.uint8)
    state = (agent.initial_state(2), torch.zeros(2)) if lstm else ()
    action, logprob, entropy, value, *_ = agent.get_action_and_value(x, *state)
    assert len(seen) == 4 and all(s == (torch.bfloat16, torch.bfloat16, torch.float32) for s in seen), seen
    assert logprob.dtype == entropy.dtype == value.dtype == torch.float32  # log-softmax, the ratio's inputs, the value
    assert all(p.dtype == torch.float32 for p in agent.parameters())  # the weights (and so Adam's state) stay float32
    ratio = (logprob - logprob.detach()).exp()
    assert ratio.dtype == torch.float32
    assert not module.Agent(envs).bf16 and module.Args().bf16 is False  # off by default


@pytest.mark.parametrize("script", ATARI)
def test_bf16_scales_the_frames_to_the_bits_autocast_gives_x_over_255(script):
    """--bf16 scales the uint8 frames in bfloat16 (a float32 x / 255.0 cast by autocast took about a fifth of a CPU
    minibatch): each of the 256 values, and so the CNN's output, to the bit as autocast's cast of x / 255.0."""
    every = torch.arange(256, dtype=torch.uint8)
    scaled = (every.to(torch.bfloat16) / 255.0).view(torch.int16)
    assert torch.equal(scaled, (every / 255.0).to(torch.bfloat16).view(torch.int16))
    reciprocal = torch.tensor(1 / 255.0).to(torch.bfloat16)  # a scaling that rounds otherwise: 1/255 in bfloat16
    assert not torch.equal(scaled, (every.to(torch.bfloat16) * reciprocal).view(torch.int16))
    module = load_script(script)
    envs = module.make_envs(module.Args(num_envs=2), "test")
    torch.manual_seed(0)
    agent = module.Agent(envs, bf16=True)
    envs.close()
    x = torch.randint(0, 256, (64,) + envs.single_observation_space.shape, dtype=torch.uint8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = agent.network(x / 255.0).float()
    assert torch.equal(agent.trunk(x), before)


@pytest.mark.parametrize("script", ATARI)
def test_channels_last_frames_are_laid_out_once_to_the_same_bits(script):
    """--channels-last lays the frames out NHWC in trunk (with --bf16's cast) instead of leaving each convolution to
    reorder them in its forward and again in its backward: the first convolution gets NHWC frames, and the output and
    every gradient are those of the NCHW frames, to the bit, in float32 and in bfloat16 (benchmark/bit_checks.py: the
    same check runs on the GPU in benchmark/gpu_check.py)."""
    source = (ROOT / script).read_text()
    assert "agent.to(memory_format=torch.channels_last)\n        agent.frames_format = torch.channels_last\n" in source
    bit_checks.channels_last_trunk_same_bits(load_script(script), "cpu")


@pytest.mark.parametrize("script", ATARI)
def test_the_bf16_rollout_copy_acts_to_the_bit_as_autocast_does(script):
    """--bf16's rollout acts with a copy of the agent whose CNN weights were cast to bfloat16 once (autocast casts them
    in every forward pass): the same actions, log-probabilities, entropies, values (and LSTM states) to the bit, NCHW
    and NHWC; the heads (and the LSTM) stay float32, the agent itself is untouched; without --bf16, the agent itself
    (benchmark/bit_checks.py, also run on the GPU)."""
    bit_checks.rollout_copy_acts_as_autocast(load_script(script), "cpu")


@pytest.mark.parametrize("script", ATARI)
def test_the_nhwc_minibatch_gather_gives_the_rows_to_the_bit_laid_out_nhwc(script):
    """The update's index_select gather of frames stored NHWC: b_obs[mb_inds] to the bit, NHWC (bit_checks.py)."""
    bit_checks.nhwc_gather_same_bits(load_script(script), "cpu")


# records what reaches Agent.trunk in a run of the script: inference mode, grad mode, batch, dtype, layouts, CNN dtype
TRUNK_RECORDER = """
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
trunk = module.Agent.trunk
def recording_trunk(self, x):
    modes = torch.is_inference_mode_enabled(), torch.is_grad_enabled()
    layouts = x.is_contiguous(memory_format=torch.channels_last), x.is_contiguous()
    with open("trunk.jsonl", "a") as f:
        f.write(json.dumps([*modes, len(x), str(x.dtype), *layouts, str(self.network[0].weight.dtype)]) + "\\n")
    return trunk(self, x)
module.Agent.trunk = recording_trunk
sys.argv = sys.argv[1:]
module.main()
"""


@pytest.mark.parametrize("script", ATARI)
def test_channels_last_stores_the_frames_nhwc_and_bf16_acts_with_the_cast_copy(script, tmp_path):
    """In a run of the script: with --channels-last each update minibatch reaches the network as NHWC uint8 frames
    (stored so, gathered so: trunk's layout change has nothing to reorder); with --bf16 every rollout step acts with
    bfloat16 CNN weights (the cast copy) and every update pass with the float32 agent. Without them: NCHW, float32."""
    driver = tmp_path / "record_trunk.py"
    driver.write_text(TRUNK_RECORDER)
    one_frame = load_script(script).Args().frame_stack == 1  # the LSTM's: NCHW and NHWC are then the same layout
    for flags in ([], ["--channels-last"] + (["--bf16"] if native_bf16() else [])):
        folder = tmp_path / ("fast" if flags else "default")
        folder.mkdir()
        res = run_python(driver, ROOT / script, *TINY, *flags, cwd=folder, env={**os.environ, **ONE_THREAD})
        assert res.returncode == 0, res.stderr[-2000:]
        seen = [json.loads(line) for line in (folder / "trunk.jsonl").read_text().splitlines()]
        rollout, update = [s for s in seen if s[0]], [s for s in seen if s[1]]
        assert len(rollout) == 2 * 32 and {s[2] for s in rollout} == {2}  # 2 iterations x 32 steps, of the 2 envs
        assert len(update) == 2 * 4 * 2 and {s[2] for s in update} == {32}  # x 4 epochs x 2 minibatches of 32
        assert {s[3] for s in seen} == {"torch.uint8"}
        channels_last, bf16 = "--channels-last" in flags, "--bf16" in flags
        assert {tuple(s[4:6]) for s in update} == {(channels_last or one_frame, not channels_last or one_frame)}
        assert {s[6] for s in update} == {"torch.float32"}  # the agent itself (under autocast with --bf16)
        assert {s[6] for s in rollout} == {"torch.bfloat16" if bf16 else "torch.float32"}


# a run of the script with --bf16 let through where bfloat16 is only emulated (this CPU, likely: slower, the same bits;
# the script's own refusal is tested below), acting in its rollout as MODE says: "script" (its own rollout_copy(), as
# written), "fresh" (the agent itself, whose CNN weights autocast casts in every forward pass: the bits of a copy made
# fresh at every step, wherever the script calls rollout_copy()), "once" (the first copy kept for the whole run, as if
# rollout_copy() were called before the iteration loop: the stale copy these tests must catch)
BF16_RUN = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.bf16_native = lambda args: True
first_copy, kept = module.Agent.rollout_copy, []
if sys.argv[2] == "fresh":
    module.Agent.rollout_copy = lambda self: self
elif sys.argv[2] == "once":
    module.Agent.rollout_copy = lambda self: kept[0] if kept else kept.append(first_copy(self)) or kept[0]
sys.argv = [sys.argv[1], *sys.argv[3:]]
module.main()
"""
# three iterations (the rollout of the second and third acts with updated weights), kept small: bfloat16 emulated on
# the CPU is slow
BF16_TINY = ["--num-envs", 2, "--num-steps", 8, "--num-minibatches", 1, "--update-epochs", 2, "--torch-threads", 1]
BF16_TINY += ["--total-timesteps", 48]
ONE_THREAD_ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", **ONE_THREAD}


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    """bf16_runs(script, mode, name, *flags): the losses/* scalars of that run ({tag: [(step, value), ...]}), each run
    made once in this module (in its own process, through the fork server)."""
    folder, done = tmp_path_factory.mktemp("bf16_runs"), {}
    driver = folder / "bf16_run.py"
    driver.write_text(BF16_RUN)

    def run(script, mode, name, *flags):
        if (script, mode, name, flags) not in done:
            cwd = folder / f"{script[:-3]}-{mode}-{name}"
            cwd.mkdir()
            args = [*BF16_TINY, "--bf16", *flags, "--exp-name", name]
            res = run_python(driver, ROOT / script, mode, *args, cwd=cwd, env=ONE_THREAD_ENV)
            assert res.returncode == 0, res.stderr[-2000:]
            (run_dir,) = run_dirs(cwd)
            losses = {t: v for t, v in read_scalars(run_dir).items() if t.startswith("losses/")}
            assert len(losses) >= 6 and all(len(v) == 3 for v in losses.values()), losses  # three iterations
            done[script, mode, name, flags] = losses
        return done[script, mode, name, flags]

    return run


@pytest.mark.parametrize("script", ATARI)
def test_a_tiny_bf16_run_trains_and_is_deterministic(script, bf16_runs):
    """Two separate runs (two processes) with the same seed: the same bfloat16 losses, to the bit, all finite."""
    a, b = bf16_runs(script, "script", "a"), bf16_runs(script, "script", "b")
    assert all(math.isfinite(v) for values in a.values() for _, v in values)
    assert a is not b and a == b


def test_a_tiny_bf16_run_is_not_the_float32_run(bf16_runs):
    assert bf16_runs("ppo_atari.py", "script", "a") != bf16_runs("ppo_atari.py", "script", "fp32", "--no-bf16")


@pytest.mark.parametrize("script", ATARI)
def test_each_bf16_rollout_acts_with_a_copy_of_the_current_weights(script, bf16_runs):
    """Three iterations with --bf16: the script's run equals, to the bit, the run that acts with the agent itself under
    autocast (a copy made fresh at every step), and a copy made once for the whole run (rollout_copy() moved out of the
    iteration loop) gives other losses from the second iteration on: this comparison catches a stale copy."""
    run, fresh = (bf16_runs(script, mode, "a") for mode in ("script", "fresh"))
    assert run == fresh
    if script not in ("ppo_atari.py", "ppo_atari_lstm.py"):  # the envpool and multigpu scripts: ppo_atari.py's copy
        return
    once = bf16_runs(script, "once", "a")
    assert once != fresh
    first = {tag: values[0] for tag, values in once.items()}
    assert first == {tag: values[0] for tag, values in fresh.items()}  # the first iteration: the same copy


def test_bf16_refused_before_anything_starts(tmp_path):
    # the script's own check, told the CPU has no bfloat16
    script = tmp_path / "ppo_atari.py"
    source = (ROOT / "ppo_atari.py").read_text()
    script.write_text(source.replace("torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()", "False"))
    res = run_python(script, "--bf16", "--no-cuda", cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: --bf16 needs native bfloat16"), res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_bf16_run_resumed_where_bf16_is_not_native_is_told_to_add_no_bf16_and_then_goes_on(tmp_path):
    # the script told the CPU has no bfloat16; the checkpoint says --bf16, as if it had been
    # written on a machine with AVX512-BF16 (this test must pass on any CPU, so the run itself is float32)
    script = tmp_path / "ppo_atari.py"
    source = (ROOT / "ppo_atari.py").read_text()
    script.write_text(source.replace("torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()", "False"))
    res = run_python(script, *TINY, "--save-model", "--no-cuda", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    ckpt = run_dir / "checkpoint.pt"
    saved = torch.load(ckpt, weights_only=True)
    saved["args"]["bf16"] = True
    torch.save(saved, ckpt)

    res = run_python(script, "--resume", ckpt, "--total-timesteps", 256, cwd=tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: --bf16 needs native bfloat16"), res.stderr
    assert "with --resume add --no-bf16" in lines[0]
    assert torch.load(ckpt, weights_only=True)["global_step"] == 128  # nothing started

    res = run_python(script, "--resume", ckpt, "--total-timesteps", 256, "--no-bf16", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    saved = torch.load(ckpt, weights_only=True)
    assert saved["global_step"] == 256 and saved["args"]["bf16"] is False

"""--bf16 in the four Atari scripts: the CNN under bfloat16 autocast, everything from its output on in float32."""

import copy
import json
import math
import os

import pytest
import torch
from conftest import ROOT, load_script, run_dirs, run_python, run_script
from tbutil import read_scalars

ATARI = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"]
TINY = ["--num-envs", 2, "--num-steps", 32, "--num-minibatches", 2, "--total-timesteps", 128, "--torch-threads", 1]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def native_bf16():
    return load_script("ppo_atari.py").bf16_native(load_script("ppo_atari.py").Args(cuda=False))


needs_bf16 = pytest.mark.skipif(not native_bf16(), reason="this CPU has no AVX512-BF16 or AMX-BF16 (--bf16 is refused)")


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
    every gradient are those of the NCHW frames, to the bit, in float32 and in bfloat16."""
    module = load_script(script)
    envs = module.make_envs(module.Args(num_envs=2), "test")
    envs.close()
    x = torch.randint(0, 256, (16,) + envs.single_observation_space.shape, dtype=torch.uint8)
    source = (ROOT / script).read_text()
    assert "agent.to(memory_format=torch.channels_last)\n        agent.frames_format = torch.channels_last\n" in source
    for bf16 in (False, True):
        torch.manual_seed(0)
        agent = module.Agent(envs, bf16=bf16).to(memory_format=torch.channels_last)
        before = copy.deepcopy(agent)  # NCHW frames into NHWC weights: the convolutions reorder them
        agent.frames_format = torch.channels_last  # what train does with --channels-last
        seen = []
        for net in (agent, before):
            net.network[0].register_forward_pre_hook(lambda m, inputs, seen=seen: seen.append(inputs[0]))
        out, ref = agent.trunk(x), before.trunk(x)
        assert seen[0].is_contiguous(memory_format=torch.channels_last) and seen[1].is_contiguous()
        assert not x.is_contiguous(memory_format=torch.channels_last) or x.shape[1] == 1  # the LSTM's one frame: alike
        assert out.dtype == torch.float32 and torch.equal(out, ref)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        (ref * torch.linspace(-1, 1, ref.shape[-1])).sum().backward()
        for (name, p), q in zip(agent.network.named_parameters(), before.network.parameters()):
            assert torch.equal(p.grad, q.grad), (bf16, name)


@pytest.mark.parametrize("script", ATARI)
def test_the_bf16_rollout_copy_acts_to_the_bit_as_autocast_does(script):
    """--bf16's rollout acts with a copy of the agent whose CNN weights were cast to bfloat16 once (autocast casts them
    in every forward pass): the same actions, log-probabilities, entropies, values (and LSTM states) to the bit, NCHW
    and NHWC; the heads (and the LSTM) stay float32, the agent itself is untouched; without --bf16, the agent itself."""
    module = load_script(script)
    envs = module.make_envs(module.Args(num_envs=2), "test")
    envs.close()
    lstm = script == "ppo_atari_lstm.py"
    x = torch.randint(0, 256, (8,) + envs.single_observation_space.shape, dtype=torch.uint8)
    state = (module.Agent(envs).initial_state(8), torch.tensor([0.0, 1.0] * 4)) if lstm else ()
    torch.manual_seed(0)
    plain = module.Agent(envs)
    assert plain.rollout_copy() is plain
    for channels_last in (False, True):
        torch.manual_seed(0)
        agent = module.Agent(envs, bf16=True)
        if channels_last:  # what train does with --channels-last
            agent = agent.to(memory_format=torch.channels_last)
            agent.frames_format = torch.channels_last
        weights = {name: p.detach().clone() for name, p in agent.named_parameters()}
        policy = agent.rollout_copy()
        assert policy is not agent and policy.bf16 and policy.frames_format == agent.frames_format
        for name, p in policy.named_parameters():
            assert p.dtype == (torch.bfloat16 if name.startswith("network.") else torch.float32), name
            assert torch.equal(p, weights[name].to(p.dtype)), name  # autocast's own rounding for the CNN's
        assert all(p.dtype == torch.float32 and torch.equal(p, weights[n]) for n, p in agent.named_parameters())
        assert not {p.data_ptr() for p in policy.parameters()} & {p.data_ptr() for p in agent.parameters()}
        if channels_last:
            assert policy.network[0].weight.is_contiguous(memory_format=torch.channels_last)
        outputs = []
        for net in (agent, policy):
            torch.manual_seed(1)  # the same draws for the sampled actions
            with torch.inference_mode():
                outputs.append(net.get_action_and_value(x, *state))
        flat = [[t for out in outs for t in (out if isinstance(out, tuple) else (out,))] for outs in outputs]
        assert len(flat[0]) == (6 if lstm else 4)
        for a, b in zip(*flat):
            assert a.dtype == b.dtype and torch.equal(a, b), channels_last


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


@needs_bf16
@pytest.mark.parametrize("script", ATARI)
def test_a_tiny_bf16_run_trains_and_is_deterministic(script, tmp_path):
    losses = []
    for name in ("a", "b") if script == "ppo_atari.py" else ("a",):
        res = run_script(script, *TINY, "--bf16", "--exp-name", name, cwd=tmp_path, env=ONE_THREAD)
        assert res.returncode == 0, res.stderr[-2000:]
        (run_dir,) = [d for d in run_dirs(tmp_path) if f"__{name}__" in d.name]
        scalars = {t: v for t, v in read_scalars(run_dir).items() if t.startswith("losses/")}
        assert all(math.isfinite(v) for values in scalars.values() for _, v in values)
        losses.append(scalars)
    assert losses[0] == losses[-1]  # the same seed, the same bfloat16 run, to the bit
    if script == "ppo_atari.py":  # and not the float32 run
        res = run_script(script, *TINY, "--exp-name", "fp32", cwd=tmp_path, env=ONE_THREAD)
        (run_dir,) = [d for d in run_dirs(tmp_path) if "__fp32__" in d.name]
        fp32 = {t: v for t, v in read_scalars(run_dir).items() if t.startswith("losses/")}
        assert fp32 != losses[0]


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

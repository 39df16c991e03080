"""The bit-level checks of --bf16 and --channels-last in the four Atari scripts, on any device.

tests/test_bf16.py runs them on the CPU and benchmark/gpu_check.py on the GPU (`cuda`): one copy of each, so the two
cannot drift apart. Each takes a script imported as a module (importlib, as the tests' load_script does) and a device,
and raises AssertionError at the first difference. They run under the scripts' own settings: cuDNN deterministic (the
default --torch-deterministic), TF32 off (main()).
"""

import contextlib
import copy
from pathlib import Path

import torch

ATARI = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"]


@contextlib.contextmanager
def script_settings():
    """cuDNN and matmul settings as a script's run has them (restored after)."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def spaces(module):
    """The script's vector env, closed: its single observation and action spaces (what Agent reads)."""
    envs = module.make_envs(module.Args(num_envs=2), "test")
    envs.close()
    return envs


def frames(envs, n, device, seed=0):
    """n random uint8 frame stacks of the env's shape, NCHW, on device (the same on every device)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,) + envs.single_observation_space.shape, dtype=torch.uint8, generator=g).to(device)


def channels_last_trunk_same_bits(module, device="cpu"):
    """--channels-last lays the frames out NHWC in trunk (with --bf16's cast) instead of leaving each convolution to
    reorder them in its forward and again in its backward: the first convolution gets NHWC frames, and the output and
    every gradient are those of the NCHW frames, to the bit, in float32 and in bfloat16."""
    envs = spaces(module)
    x = frames(envs, 16, device)
    with script_settings():
        for bf16 in (False, True):
            torch.manual_seed(0)
            agent = module.Agent(envs, bf16=bf16).to(device).to(memory_format=torch.channels_last)
            before = copy.deepcopy(agent)  # NCHW frames into NHWC weights: the convolutions reorder them
            agent.frames_format = torch.channels_last  # what train does with --channels-last
            seen = []
            for net in (agent, before):
                net.network[0].register_forward_pre_hook(lambda m, inputs, seen=seen: seen.append(inputs[0]))
            out, ref = agent.trunk(x), before.trunk(x)
            assert seen[0].is_contiguous(memory_format=torch.channels_last) and seen[1].is_contiguous(), bf16
            assert not x.is_contiguous(memory_format=torch.channels_last) or x.shape[1] == 1  # the LSTM's one frame: alike
            assert out.dtype == torch.float32 and torch.equal(out, ref), f"trunk output, bf16={bf16}"
            weights = torch.linspace(-1, 1, out.shape[-1], device=device)
            (out * weights).sum().backward()
            (ref * weights).sum().backward()
            for (name, p), q in zip(agent.network.named_parameters(), before.network.parameters()):
                assert torch.equal(p.grad, q.grad), f"gradient of network.{name}, bf16={bf16}"


def rollout_copy_acts_as_autocast(module, device="cpu"):
    """--bf16's rollout acts with a copy of the agent whose CNN weights were cast to bfloat16 once (autocast casts them
    in every forward pass): the same actions, log-probabilities, entropies, values (and LSTM states) to the bit, NCHW
    and NHWC; the heads (and the LSTM) stay float32, the agent itself is untouched; without --bf16, the agent itself."""
    envs = spaces(module)
    lstm = hasattr(module.Agent, "initial_state")
    x = frames(envs, 8, device)
    state = ()
    if lstm:
        state = (module.Agent(envs).to(device).initial_state(8), torch.tensor([0.0, 1.0] * 4, device=device))
    torch.manual_seed(0)
    plain = module.Agent(envs).to(device)
    assert plain.rollout_copy() is plain
    with script_settings():
        for channels_last in (False, True):
            torch.manual_seed(0)
            agent = module.Agent(envs, bf16=True).to(device)
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
            for i, (a, b) in enumerate(zip(*flat)):
                assert a.dtype == b.dtype and torch.equal(a, b), f"output {i}, channels_last={channels_last}"


# the scripts' lines that store the rollout's frames NHWC (--channels-last) and gather a minibatch's frames
STORE_NHWC = "obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)"
GATHER = "torch.index_select(b_obs, 0, mb_inds, out=torch.empty_like(b_obs[: len(mb_inds)]))"


def nhwc_gather_same_bits(module, device="cpu"):
    """The update's minibatch gather (index_select into an empty_like of the batch's first rows) on frames stored NHWC,
    as the script stores them with --channels-last: the rows of b_obs[mb_inds] to the bit, laid out NHWC (the layout the
    convolutions take), and the same frames as the NCHW storage gives."""
    source = Path(module.__file__).read_text()
    assert STORE_NHWC in source and GATHER in source, f"{Path(module.__file__).name}: the lines checked here changed"
    envs = spaces(module)
    num_steps, num_envs, shape = 16, 4, envs.single_observation_space.shape
    obs = frames(envs, num_steps * num_envs, device).view((num_steps, num_envs) + shape)
    nhwc = obs.movedim(2, -1).contiguous().movedim(-1, 2)  # STORE_NHWC
    mb_inds = torch.randperm(num_steps * num_envs, generator=torch.Generator().manual_seed(0))[:32].to(device)
    gathered = []
    for stored in (obs, nhwc):
        b_obs = stored.reshape((-1,) + shape)
        mb_obs = torch.index_select(b_obs, 0, mb_inds, out=torch.empty_like(b_obs[: len(mb_inds)]))  # GATHER
        assert torch.equal(mb_obs, b_obs[mb_inds]), "the gathered rows"
        gathered.append(mb_obs)
    assert gathered[0].is_contiguous() and torch.equal(gathered[0], gathered[1])
    assert gathered[1].is_contiguous(memory_format=torch.channels_last), "the NHWC gather's layout"
    assert shape[0] == 1 or not gathered[1].is_contiguous(), "NHWC, not NCHW"


CHECKS = {
    "rollout copy = autocast": rollout_copy_acts_as_autocast,
    "NHWC trunk = NCHW, grads too": channels_last_trunk_same_bits,
    "NHWC index_select gather": nhwc_gather_same_bits,
}

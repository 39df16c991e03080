"""How far the update's gradient under --bf16 is from float32's, against how far two minibatches' gradients are apart.

    python benchmark/bf16_gradients.py ppo_atari_envpool.py                                   # at initialization
    python benchmark/bf16_gradients.py ppo_atari_envpool.py --checkpoint runs/<run>/checkpoint.pt
    python benchmark/bf16_gradients.py ppo_atari.py --checkpoint ckpt.pt -- --channels-last   # flags for the script

The script's own pieces (make_envs, Agent, compute_gae, ppo_loss) play one rollout of its defaults with the float32
network (the checkpoint's weights, or a fresh network), then, for each minibatch of the first epoch, the loss's gradient
on every parameter is computed twice on the same weights and samples: in float32, and with the CNN under bfloat16
autocast (--bf16). Each pass is the update's first minibatch, where the ratio is 1: the old log-probabilities and values
are that pass's own. Printed per minibatch: the cosine of the bf16 and float32 gradients and the relative error
|g_bf16 - g_fp32| / |g_fp32|, over all parameters and for the CNN alone; and, as the scale of the noise SGD lives with
anyway, the same two measures between this minibatch's float32 gradient and the next one's; and the cosine of this
minibatch's bf16 error (g_bf16 - g_fp32) with the next one's. Where bf16's error is far below the minibatch-to-minibatch
difference and the errors are unalike, bf16's rounding is a small part of the update's noise; errors alike would be a
bias that adds up over the update's minibatches. Last, the same for the whole batch: the sum of the minibatches'
gradients, bf16 against float32 (what an epoch follows, its noise averaged out and a bias kept)."""

import argparse
import inspect
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from _common import checked_args, exit_with, find_script, load_script, script_error  # noqa: E402  (tools/_common.py)

NEEDS = ("Args", "check_args", "main", "make_envs", "Agent", "compute_gae", "ppo_loss")


def measures(a, b):
    """(cosine, |a - b| / |b|) of two flat gradients (in float64: a cosine of float32 rounding can pass 1)."""
    a, b = a.double(), b.double()
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item(), ((a - b).norm() / b.norm()).item()


def flat_grad(loss, params):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


def rollout(m, args, agent, envs):
    """One rollout of the float32 policy: the flattened batch the update would see (obs, actions, advantages, returns)."""
    n, e = args.num_steps, args.num_envs
    obs = torch.zeros((n, e) + envs.single_observation_space.shape, dtype=torch.uint8)
    actions, rewards, dones, values = (torch.zeros((n, e)) for _ in range(4))
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs, next_done = torch.as_tensor(next_obs), torch.zeros(e)
    for step in range(n):
        obs[step], dones[step] = next_obs, next_done
        with torch.inference_mode():
            action, _, _, value = agent.get_action_and_value(next_obs)
        actions[step], values[step] = action, value.flatten()
        next_obs, reward, terminations, truncations, _ = envs.step(action.numpy())
        rewards[step] = torch.as_tensor(reward)
        next_obs = torch.as_tensor(next_obs)
        next_done = torch.as_tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
    with torch.no_grad():
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages, returns = m.compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
    shape = envs.single_observation_space.shape
    return obs.reshape((-1,) + shape), actions.reshape(-1).long(), advantages.reshape(-1), returns.reshape(-1)


def gradient(m, args, agent, batch, inds, bf16):
    """The loss's gradient on the minibatch `inds`, the CNN in bfloat16 or not, as the update's first minibatch."""
    obs, actions, advantages, returns = batch
    agent.bf16 = bf16
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs[inds], actions[inds])
    old_logprob, old_value = newlogprob.detach(), newvalue.detach().view(-1)  # this pass's own: the ratio is 1
    loss = m.ppo_loss(
        newlogprob, entropy, newvalue, old_logprob, advantages[inds], returns[inds], old_value, args, args.clip_coef
    )[0]
    params = list(agent.parameters())
    trunk = len(list(agent.network.parameters()))
    g = flat_grad(loss, params)
    return g, g[: sum(p.numel() for p in params[:trunk])]  # agent.network's parameters come first


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="ppo_atari.py, ppo_atari_envpool.py or ppo_atari_multigpu.py")
    parser.add_argument("--checkpoint", default=None, help="the weights to measure at (default: a fresh network)")
    parser.add_argument("--seed", type=int, default=1, help="the rollout's and the fresh network's seed (default: 1)")
    opts = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    script = find_script(opts.script)
    error = script_error(script, needs=NEEDS)
    checked, error = (None, error) if error else checked_args(script, ["--seed", str(opts.seed), *extra])
    if not error and checked.num_minibatches < 2:
        error = f"--num-minibatches {checked.num_minibatches}: two minibatches at least, to set one beside the next"
    if not error and checked.cuda and torch.cuda.is_available():
        error = "this measure runs on the CPU: drop --cuda"
    if error:
        sys.exit(f"error: {error}")
    m = load_script(script)
    feedforward = list(inspect.signature(m.Agent.get_action_and_value).parameters) == ["self", "x", "action"]
    if not (hasattr(m.Agent, "trunk") and feedforward):  # a CNN under --bf16, without a recurrent state
        name = Path(script).name
        sys.exit(
            f"error: {name} has no feed-forward CNN agent: give ppo_atari.py, ppo_atari_envpool.py or ppo_atari_multigpu.py"
        )
    args = checked
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    envs = m.make_envs(args, "bf16_gradients")
    try:
        agent = m.Agent(envs, False)
        if opts.checkpoint:
            checkpoint = m.load_checkpoint(opts.checkpoint)
            try:
                agent.load_state_dict(checkpoint["model"])
            except (KeyError, RuntimeError) as e:
                sys.exit(f"error: {opts.checkpoint} does not fit {Path(script).name}'s network ({str(e).splitlines()[0]})")
        if args.channels_last:
            agent = agent.to(memory_format=torch.channels_last)
        batch = rollout(m, args, agent, envs)
    finally:
        envs.close()
    inds = [torch.arange(start, start + args.minibatch_size) for start in range(0, args.batch_size, args.minibatch_size)]
    grads = [(gradient(m, args, agent, batch, mb, bf16=False), gradient(m, args, agent, batch, mb, bf16=True)) for mb in inds]
    rows = []
    for i, ((g32, t32), (g16, t16)) in enumerate(grads):
        (n32, nt32), (n16, _) = grads[(i + 1) % len(grads)]
        error_alike = measures(g16 - g32, n16 - n32)[0]
        rows.append([*measures(g16, g32), *measures(t16, t32), *measures(n32, g32), *measures(nt32, t32), error_alike])
    where = opts.checkpoint or f"a fresh network (seed {opts.seed})"
    print(f"{Path(script).name} at {where}; one rollout of {args.batch_size} steps, minibatches of {args.minibatch_size}\n")
    print("| minibatch | bf16 vs fp32: cosine | rel. error | CNN: cosine | CNN: rel. error |", end="")
    print(" next minibatch vs this: cosine | rel. difference | CNN: cosine | CNN: rel. difference |", end="")
    print(" bf16's error vs the next one's: cosine |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, row in enumerate(rows):
        print(f"| {i + 1} | " + " | ".join(f"{x:.4f}" for x in row) + " |")
    mean = np.mean(rows, axis=0)
    print("| mean | " + " | ".join(f"{x:.4f}" for x in mean) + " |")
    whole = measures(sum(g for _, (g, _) in grads), sum(g for (g, _), _ in grads))  # the batch's mean gradient
    print(
        f"\nthe whole batch (the sum of its minibatches' gradients, what an epoch follows): bf16 vs fp32 cosine "
        f"{whole[0]:.4f}, rel. error {whole[1]:.4f}"
    )
    print(
        f"bf16's relative error {mean[1]:.4f} (CNN {mean[3]:.4f}) against {mean[5]:.4f} (CNN {mean[7]:.4f}) between two "
        f"minibatches: {mean[1] / mean[5]:.3f} of it; the errors of two minibatches alike at cosine {mean[8]:.3f} (0: "
        "independent, they average out over an update; near 1: a bias, they add up)"
    )
    return 0


if __name__ == "__main__":
    exit_with(main)

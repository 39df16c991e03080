"""How much of ppo_shared.py's trunk gradient comes from the policy and how much from the value loss (core-13).

    python benchmark/shared_gradients.py                                   # CartPole, Acrobot, MountainCar, seeds 1-3
    python benchmark/shared_gradients.py --env-ids Acrobot-v1 --vf-coef 0.01

For each env and seed: a freshly initialized ppo_shared.py agent plays one rollout of the script's defaults
(num_envs x num_steps), GAE gives the advantages and returns, and the minibatch loss of the whole rollout is split into
its policy part (pg_loss - ent_coef * entropy) and its value part (vf_coef * v_loss). Printed: the norm of each part's
gradient on the shared trunk's parameters, their ratio and their cosine. Adam scales each parameter's step by the
running size of its whole gradient, so where the value part's gradient is thousands of times the policy part's, the
trunk is in effect trained for the value alone and the policy has only its head on top of the value's features.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import exit_with  # noqa: E402  (tools/_common.py)


def load(script):
    spec = importlib.util.spec_from_file_location(script[:-3], ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trunk_gradients(m, env_id, seed, vf_coef=None):
    """(policy-part norm, value-part norm, cosine) of the gradients on the trunk, for one rollout at initialization."""
    args = m.Args(env_id=env_id, seed=seed)
    if vf_coef is not None:
        args.vf_coef = vf_coef
    torch.manual_seed(seed)
    np.random.seed(seed)
    envs = m.make_envs(args, "shared_gradients")
    try:
        m.check_env(envs)  # exits with one line where the script cannot take the env
        agent = m.Agent(envs)
        steps, n = args.num_steps, args.num_envs
        obs = torch.zeros((steps, n) + envs.single_observation_space.shape)
        actions, logprobs, rewards, dones, values = (torch.zeros((steps, n)) for _ in range(5))
        next_obs, _ = envs.reset(seed=seed)
        next_obs, next_done = torch.tensor(next_obs, dtype=torch.float32), torch.zeros(n)
        with torch.no_grad():
            for t in range(steps):
                obs[t], dones[t] = next_obs, next_done
                actions[t], logprobs[t], _, value = agent.get_action_and_value(next_obs)
                values[t] = value.view(-1)
                o, r, terminations, truncations, _ = envs.step(actions[t].long().numpy())
                rewards[t] = torch.tensor(r, dtype=torch.float32)
                next_obs = torch.tensor(o, dtype=torch.float32)
                next_done = torch.tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
            next_value = agent.get_value(next_obs).view(-1)
        advantages, returns = m.compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs, actions.reshape(-1).long())
        batch = (logprobs.reshape(-1), advantages.reshape(-1), returns.reshape(-1), values.reshape(-1))
        _, pg_loss, v_loss, entropy_loss, *_ = m.ppo_loss(newlogprob, entropy, newvalue, *batch, args, args.clip_coef)
        trunk = list(agent.network.parameters())

        def flat_grad(loss):
            return torch.cat([g.flatten() for g in torch.autograd.grad(loss, trunk, retain_graph=True)])

        g_policy = flat_grad(pg_loss - args.ent_coef * entropy_loss)
        g_value = flat_grad(args.vf_coef * v_loss)
        cosine = torch.nn.functional.cosine_similarity(g_policy, g_value, dim=0).item()
        return g_policy.norm().item(), g_value.norm().item(), cosine
    finally:
        envs.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-ids", nargs="+", default=["CartPole-v1", "Acrobot-v1", "MountainCar-v0"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--vf-coef", type=float, default=None, help="value-loss coefficient (default: the script's)")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    m = load("ppo_shared.py")
    given = {} if opts.vf_coef is None else {"vf_coef": opts.vf_coef}
    for env_id in opts.env_ids:  # the script's own checks (an unknown id names the script to use): one line, no table
        for seed in opts.seeds:
            try:
                error = m.check_args(m.Args(env_id=env_id, seed=seed, **given))
            except ValueError as e:  # Args refuses a flag outside its domain
                error = str(e)
            if error:
                sys.exit(f"error: --env-ids {env_id} --seeds {seed}: {error}")
        try:  # its spaces: a Box action space is for another script
            envs = m.make_envs(m.Args(env_id=env_id), "shared_gradients")
        except m.gym.error.Error as e:  # an unknown id
            sys.exit(f"error: --env-ids {env_id}: {e} (Atari ids run with ppo_atari.py)")
        try:
            m.check_env(envs)
        except SystemExit as e:
            sys.exit(f"error: --env-ids {env_id}: {str(e.code).removeprefix('error: ')}")
        finally:
            envs.close()
    vf_coef = m.Args().vf_coef if opts.vf_coef is None else opts.vf_coef
    print(f"ppo_shared.py at initialization, vf_coef {vf_coef}: gradient norms on the shared trunk, one rollout\n")
    print("| env | seed | policy part | value part | value / policy | cosine |")
    print("|---|---|---|---|---|---|")
    for env_id in opts.env_ids:
        for seed in opts.seeds:
            p, v, cos = trunk_gradients(m, env_id, seed, opts.vf_coef)
            ratio = f"{v / p:,.0f}" if v / p >= 100 else f"{v / p:.2f}"
            print(f"| {env_id} | {seed} | {p:.5f} | {v:.5f} | {ratio} | {cos:.3f} |")


if __name__ == "__main__":
    exit_with(main)

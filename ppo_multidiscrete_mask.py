# PPO on MicroRTS with invalid action masking (aux-4). Parent: ppo_multidiscrete.py.
import atexit
import collections
import contextlib
import itertools
import os
import random
import shutil
import signal
import sys
import time
import types
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

# speed: distributions skip their argument checks (our inputs are valid; the checks cost more than the math)
torch.distributions.Distribution.set_default_validate_args(False)
try:  # gym-microrts 0.6 imports gym 0.21 but uses only gym.spaces, which gymnasium has:
    sys.modules["gym"] = gym  # alias gym to gymnasium before importing gym-microrts
    from gym_microrts import microrts_ai
    from gym_microrts.envs.vec_env import MicroRTSGridModeVecEnv
    from jpype.types import JArray
except ImportError:  # check_args tells how to install it
    microrts_ai, MicroRTSGridModeVecEnv = None, object

# the blog's scenarios (gym-microrts 0.3 ids) on gym-microrts 0.6: opponent bot, weights of the rewards [win-loss,
# resources gathered, workers, buildings, attacks, combat units, closer to the enemy base], episode length in game ticks
# (0.3 decided every 10 ticks for 200, 400 or 600 decisions; 0.6 decides every tick, for every unit at once)
SCENARIOS = {
    "MicrortsMining-v1": ("passiveAI", [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], 2000),
    "MicrortsProduceCombatUnitsShapedReward-v1": ("passiveAI", [0.0, 1.0, 0.0, 1.0, 0.0, 7.0, 0.0], 4000),
    "MicrortsAttackShapedReward-v1": ("passiveAI", [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0], 4000),
    "MicrortsRandomEnemyShapedReward3-v1": ("randomAI", [5.0, 1.0, 1.0, 0.2, 1.0, 7.0, 0.2], 6000),
}
MAP = "maps/10x10/basesWorkers10x10.xml"

PPOLoss = collections.namedtuple("PPOLoss", "loss pg_loss v_loss entropy_loss old_approx_kl approx_kl clipfrac")  # ppo_loss's


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch and the environments)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda is used when available"""
    torch_threads: int = 0
    """CPU threads for torch (0: torch's own, all cores, the CNN scripts' default); 1 suits MLPs and shared machines"""
    channels_last: bool = False
    """if toggled, the convolutions' weights are stored channels-last (NHWC): faster on CPUs, float rounding differs"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases (set WANDB_MODE=offline to work without network)"""
    wandb_project_name: str = "ppo-details"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    wandb_group: str | None = None
    """the wandb group of the run (benchmark/ablate.py: one per script and env); with --track"""
    wandb_tags: tuple[str, ...] = ()
    """wandb tags of the run (benchmark/ablate.py: the detail switched off); with --track"""
    capture_video: bool = False
    """if toggled, videos of the first environment's episodes are saved under `videos/` (also of an `--eval-checkpoint` run)"""
    save_model: bool = False
    """if toggled, a checkpoint is written to `runs/{run_name}/checkpoint.pt` (at the end and every `save_every` iterations)"""
    save_every: int = 50
    """with `--save-model`: write a checkpoint every this many iterations (0: only at the end)"""
    resume: str | None = None
    """path of a checkpoint to continue (the run's own settings are taken from it)"""
    eval_checkpoint: str | None = None
    """path of a checkpoint to evaluate instead of training"""
    eval_episodes: int = 10
    """with `--eval-checkpoint`: how many episodes to play"""

    # Algorithm specific arguments
    env_id: str = "MicrortsMining-v1"
    """the id of the environment"""
    total_timesteps: int = 2000000
    """total timesteps of the experiments"""
    orthogonal_init: bool = True
    """if toggled, orthogonal weight init, constant 0 bias (core-2; off: PyTorch's default init of linear and conv layers)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-5
    """the epsilon of Adam (core-3; ppo2: 1e-5, PyTorch's default: 1e-8)"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """if toggled, learning rate annealing for policy and value networks (core-4)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    shuffle_minibatches: bool = True
    """if toggled, shuffling before each epoch's mini-batches (core-6; off: the same order every epoch)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """if toggled, the advantages are normalized per minibatch (core-7)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    anneal_clip: bool = False
    """if toggled, annealing of the clipping coefficient to 0 with the learning-rate schedule (aux-1)"""
    clip_vloss: bool = True
    """if toggled, the value loss is clipped, as in ppo2 (core-9)"""
    ent_coef: float = 0.01
    """coefficient of the entropy (core-10; 0: no entropy bonus)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    clip_grad_norm: bool = True
    """if toggled, global gradient clipping to max_grad_norm (core-11; off: no clipping)"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL: the update's remaining epochs are skipped once an epoch's last minibatch exceeds it (aux-3)"""

    # to be filled in runtime
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (computed in runtime)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (computed in runtime)"""

    def __post_init__(self):  # tyro shows a ValueError from here as a command-line error, before anything starts
        above_0 = {"total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "max_grad_norm", "adam_eps"}
        for field, value in vars(self).items():  # every number finite and at least 0 (NaN is refused too), those above 0
            rule = "above 0" if field in above_0 else "at least 0"
            if type(value) in (int, float) and not (np.isfinite(value) and (value > 0 if field in above_0 else value >= 0)):
                raise ValueError(f"--{field.replace('_', '-')} {value} is not allowed: it must be a finite number {rule}")


class MicroRTSVecEnv(MicroRTSGridModeVecEnv):
    """gym-microrts' own vector env adapted to the loop: gymnasium's reset/step (it has the old 4-tuple API),
    channels-first uint8 observations, the statistics of the episodes that ended in final_info."""

    def __init__(self, env_id, num_envs):
        bot, reward_weight, max_steps = SCENARIOS[env_id]
        ai2s, weights = [getattr(microrts_ai, bot)] * num_envs, np.array(reward_weight)
        super().__init__(0, num_envs, max_steps=max_steps, ai2s=ai2s, map_paths=[MAP], reward_weight=weights)
        height, width, planes = self.observation_space.shape
        self.single_observation_space = gym.spaces.Box(0, 1, (planes, height, width), np.uint8)
        # one row of components (action type, its parameters, the attack target) per map cell
        self.single_action_space = gym.spaces.MultiDiscrete(np.tile(self.action_space_dims, (height * width, 1)))

    def start_client(self):  # gym-microrts 0.3's 7th reward function, used by the blog's shaped rewards
        from ai.rewardfunction import CloserToEnemyBaseRewardFunction, RewardFunctionInterface

        self.rfs = JArray(RewardFunctionInterface)([*self.rfs, CloserToEnemyBaseRewardFunction()])
        super().start_client()

    def reset(self, seed=None):  # no seed: the map is fixed, the game deterministic, only randomAI is not seeded
        self.returns, self.lengths = np.zeros(self.num_envs), np.zeros(self.num_envs, dtype=int)
        obs, self.action_mask = super().reset(), super().get_action_mask()
        return obs.transpose(0, 3, 1, 2).astype(np.uint8), {}

    def step(self, actions):
        # the env acts for the units that the last get_action_mask() found able to act, then resets finished games
        obs, reward, done, _ = super().step(actions)
        self.action_mask, infos = super().get_action_mask(), {}
        self.returns, self.lengths = self.returns + reward, self.lengths + 1
        if done.any():  # dones as ppo2: obs is already the first observation of the next episode
            episode = {"r": self.returns.copy(), "l": self.lengths.copy()}
            infos["final_info"] = {"episode": episode, "_episode": done.astype(bool)}
            self.returns[done], self.lengths[done] = 0, 0
        return obs.transpose(0, 3, 1, 2).astype(np.uint8), reward, done, np.zeros_like(done), infos

    def get_action_mask(self):
        """(num_envs, cells, sum of a cell's nvec) 0/1: the valid values of every component in the current state."""
        return self.action_mask

    def get_unit_mask(self):
        """(num_envs, cells) 0/1: the cells holding a unit that can act now, the only cells whose components the env
        executes (a fact of the env, as the 0.3 env's single source unit; not invalid action masking)."""
        return self.source_unit_mask


def make_envs(args, run_name, num_envs=None):
    # detail core-1: vectorized architecture (N envs stepped together; ppo2 autoreset: same step)
    return MicroRTSVecEnv(args.env_id, num_envs or args.num_envs)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    # detail core-2: orthogonal weight init, constant 0 bias
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def torch_default_init(agent):
    """core-2 switched off (--no-orthogonal-init): every linear and convolutional layer gets PyTorch's own init."""
    for module in agent.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            module.reset_parameters()


class CategoricalMasked(Categorical):
    """A Categorical restricted to the valid actions of `mask` (bool, the shape of `logits`)."""

    def __init__(self, logits, mask):
        self.mask = mask
        # detail aux-4: invalid action masking, the logits of invalid actions become -1e8 before the softmax
        super().__init__(logits=torch.where(mask, logits, torch.tensor(-1e8, device=logits.device)))

    def entropy(self):
        # detail aux-4: the entropy sums over the valid actions only (0 for a component without any)
        return -torch.where(self.mask, self.logits * self.probs, 0.0).sum(-1)


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        # the blog's small CNN for 10x10 maps (16 3x3/2, 32 2x2/1, 128 fc, ReLU)
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(envs.single_observation_space.shape[0], 16, 3, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(16, 32, 2)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(32 * 3 * 3, 128)),
            nn.ReLU(),
        )
        # detail core-13: one trunk shared by the policy and value heads
        self.actor = layer_init(nn.Linear(128, int(envs.single_action_space.nvec.sum())), std=0.01)
        self.critic = layer_init(nn.Linear(128, 1), std=1.0)
        self.nvec = envs.single_action_space.nvec  # (cells, components of a cell)

    def get_value(self, x):
        return self.critic(self.network(x.float()))

    def get_action_and_value(self, x, action=None, units=None, mask=None):
        hidden = self.network(x.float())
        logits = self.actor(hidden).view(len(x), len(self.nvec), -1)  # (batch, cells, logits of a cell)
        # detail multidiscrete-1: one Categorical per component (7 per cell); log-probs, entropies summed over acting cells
        split = self.nvec[0].tolist()
        parts = zip(torch.split(logits, split, dim=-1), torch.split(mask, split, dim=-1))
        probs = [CategoricalMasked(part, valid) for part, valid in parts]
        if action is None:
            action = torch.stack([p.sample() for p in probs], dim=-1)
        logprob = torch.stack([p.log_prob(a) for p, a in zip(probs, action.unbind(-1))], dim=-1)
        entropy = torch.stack([p.entropy() for p in probs], dim=-1)
        # the env executes the components of the cells whose unit can act (`units`, batch x cells); None: every cell
        executed = torch.ones(logprob.shape[:2], dtype=torch.bool, device=x.device) if units is None else units
        logprob, entropy = torch.where(executed[..., None], logprob, 0.0), torch.where(executed[..., None], entropy, 0.0)
        return action, logprob.sum((1, 2)), entropy.sum((1, 2)), self.critic(hidden)


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE over a (num_steps, num_envs) rollout; dones[t] = 1 when obs[t] begins a new episode."""
    # detail core-5: generalized advantage estimation, returns = advantages + values
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done.view(1, -1)])  # 0 where obs t+1 begins a new episode
    nextvalues = torch.cat([values[1:], next_value.view(1, -1)])
    deltas = rewards + gamma * nextvalues * nextnonterminal - values  # the TD errors of all steps at once
    decays = gamma * gae_lambda * nextnonterminal
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(rewards.shape[0])):  # A_t = delta_t + gamma * lambda * A_t+1, within an episode
        advantages[t] = lastgaelam = deltas[t] + decays[t] * lastgaelam
    return advantages, advantages + values  # and the returns, advantages + values


def ppo_loss(newlogprob, entropy, newvalue, oldlogprob, advantages, returns, oldvalues, args, clip_coef):
    """One minibatch's loss and the statistics logged of it (core-12), as a PPOLoss."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        # detail core-12: debug variables (approx KL, http://joschu.net/blog/kl-approx.html, and clip fraction)
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()

    if args.norm_adv:
        # detail core-7: advantage normalization, per minibatch (population std, ddof=0, as ppo2's np.std)
        advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)

    # detail core-8: clipped surrogate objective, max(-A*r, -A*clip(r, 1-eps, 1+eps))
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    newvalue = newvalue.view(-1)
    if args.clip_vloss:
        # detail core-9: value loss clipping, 0.5*max((V-R)^2, (V_old + clip(V-V_old, -eps, eps) - R)^2)
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = oldvalues + torch.clamp(newvalue - oldvalues, -clip_coef, clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

    entropy_loss = entropy.mean()
    # detail core-10: overall loss = policy loss - ent_coef * entropy + vf_coef * value loss
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    return PPOLoss(loss, pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac)


def make_optimizer(agent, args):
    # detail core-3: Adam epsilon 1e-5 (ppo2's value, not PyTorch's 1e-8; --adam-eps); foreach: same math in fewer ops
    return optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps, foreach=True)


def gradient_step(optimizer, loss, max_grad_norm, clip=True):
    optimizer.zero_grad()
    loss.backward()
    # detail core-11: global gradient clipping, the norm over all parameters at most max_grad_norm (0.5)
    if clip:
        nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], max_grad_norm, foreach=True)
    optimizer.step()


def train(args):
    """The PPO loop in CleanRL's order; the run's folder, logs, checkpoints and Ctrl-C: below the fence."""
    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    checkpoint, run_name, run_dir, videos = open_run(args)  # runs/{run_name}: a new folder, or the --resume run's

    # env setup
    envs = make_envs(args, videos)

    agent = Agent(envs).to(device)
    if not args.orthogonal_init:  # core-2 switched off: PyTorch's own init
        torch_default_init(agent)
    if args.channels_last:  # speed: oneDNN's NHWC convolution kernels (the same math, rounded differently)
        agent = agent.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(agent, args)
    start_iteration = restore(checkpoint, agent, optimizer, envs) if checkpoint else 1  # weights, Adam, RNGs
    global_step = (start_iteration - 1) * args.batch_size
    writer = open_logs(args, run_name, run_dir, checkpoint, device)  # TensorBoard (+ wandb with --track); curves go on
    stop = catch_signals()  # Ctrl-C / SIGTERM: the run stops after the current iteration, with a checkpoint

    # ALGO LOGIC: storage setup
    # observations stored as uint8, as ppo2 does (4x less memory than float32)
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape, dtype=torch.uint8).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    units = torch.zeros((args.num_steps, args.num_envs, len(envs.single_action_space.nvec)), dtype=torch.bool).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    # detail aux-4: the masks of the rollout are stored with it and reused in training
    mask_shape = (len(envs.single_action_space.nvec), int(envs.single_action_space.nvec[0].sum()))  # (cells, 78)
    masks = torch.zeros((args.num_steps, args.num_envs) + mask_shape, dtype=torch.bool).to(device)

    # TRY NOT TO MODIFY: start the game
    start_time, start_step, last_print, recent_returns = time.time(), global_step, 0.0, []
    next_obs, _ = envs.reset(seed=int(np.random.randint(2**31 - 1)) if checkpoint else args.seed)  # resumed: a seed drawn now
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.zeros(args.num_envs).to(device)
    next_units = torch.as_tensor(envs.get_unit_mask(), device=device).bool()
    next_mask = torch.as_tensor(envs.get_action_mask(), device=device).bool()

    for iteration in range(start_iteration, args.num_iterations + 1):
        # detail core-4: learning-rate annealing, linearly from lr to 0 over the iterations
        frac = 1.0 - (iteration - 1.0) / args.num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        # detail aux-1: clip-range annealing, same schedule as the learning rate (off by default)
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            units[step] = next_units
            masks[step] = next_mask

            # ALGO LOGIC: action logic
            with torch.inference_mode():
                action, logprob, _, value = agent.get_action_and_value(next_obs, units=next_units, mask=next_mask)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, device=device)
            next_obs = torch.as_tensor(next_obs, device=device)
            next_done = torch.as_tensor(np.logical_or(terminations, truncations), device=device, dtype=torch.float32)
            next_units = torch.as_tensor(envs.get_unit_mask(), device=device).bool()
            next_mask = torch.as_tensor(envs.get_action_mask(), device=device).bool()

            if "episode" in infos.get("final_info", {}):  # an episode ended (Atari: a game, not a life)
                ended, episode = infos["final_info"]["_episode"], infos["final_info"]["episode"]
                for r, length in zip(episode["r"][ended], episode["l"][ended]):
                    writer.add_scalar("charts/episodic_return", r, global_step)
                    writer.add_scalar("charts/episodic_length", length, global_step)
                    recent_returns = (recent_returns + [float(r)])[-20:]

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape).long()
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_units = units.reshape((-1,) + units.shape[2:])
        b_masks = masks.reshape((-1,) + masks.shape[2:])

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        stats = []
        for _epoch in range(args.update_epochs):
            if args.shuffle_minibatches:  # detail core-6: mini-batch updates, shuffled each epoch, each sample once an epoch
                np.random.shuffle(b_inds)
            for start in range(0, len(b_inds), args.minibatch_size):
                mb_inds = torch.from_numpy(b_inds[start : start + args.minibatch_size]).to(device)
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions[mb_inds], b_units[mb_inds], b_masks[mb_inds]
                )
                mb = ppo_loss(
                    newlogprob,
                    entropy,
                    newvalue,
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    b_values[mb_inds],
                    args,
                    clip_coef,
                )
                gradient_step(optimizer, mb.loss, args.max_grad_norm, args.clip_grad_norm)
                stats.append(torch.stack(mb[1:]))  # the statistics, the loss left out

            # detail aux-3: target-KL early stopping, once per epoch: the epoch's last minibatch's KL > target ends it
            if args.target_kl is not None and mb.approx_kl.item() > args.target_kl:
                break

        # detail core-12: debug variables, means over the update's minibatches (as ppo2 logs them)
        pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac = torch.stack(stats).mean(0).tolist()
        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/clip_coef", clip_coef, global_step)
        writer.add_scalar("charts/update_epochs", len(stats) / args.num_minibatches, global_step)
        writer.add_scalar("losses/value_loss", v_loss, global_step)
        writer.add_scalar("losses/policy_loss", pg_loss, global_step)
        writer.add_scalar("losses/entropy", entropy_loss, global_step)
        writer.add_scalar("losses/old_approx_kl", old_approx_kl, global_step)
        writer.add_scalar("losses/approx_kl", approx_kl, global_step)
        writer.add_scalar("losses/clipfrac", clipfrac, global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        sps = int((global_step - start_step) / (time.time() - start_time))
        writer.add_scalar("charts/SPS", sps, global_step)
        if time.time() - last_print > 10 or iteration == args.num_iterations:
            last_print = time.time()
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            print(
                f"step {global_step}/{args.num_iterations * args.batch_size} | return {recent} (last 20) | SPS {sps}",
                flush=True,
            )
        upload_videos(args, videos, {"global_step": global_step})  # --capture-video --track: new videos to wandb

        at_save_point = iteration == args.num_iterations or args.save_every and iteration % args.save_every == 0
        if stop.requested or args.save_model and at_save_point:  # --save-model; after Ctrl-C / SIGTERM in any case
            save_checkpoint(f"{run_dir}/checkpoint.pt", agent, optimizer, envs, args, run_name, iteration)
        if stop.requested:
            break

    envs.close()
    writer.close()
    finish(stop, f"{run_dir}/checkpoint.pt", global_step)  # after Ctrl-C / SIGTERM: how to go on; exit 128 + signal
    return run_name


# ==== plumbing, not PPO: checks, checkpoints, resume, signals, evaluation ====
# this script's own plumbing; the rest of this section is the same in every script (tools/lineage.py --check-shared)
OWN_PLUMBING = ["check_args", "evaluate", "INSTALL"]

INSTALL = "bash tools/install_microrts.sh (gym-microrts 0.6.0 and JPype1 without dependencies, and Java if missing)"

# with --resume, these flags may be given; any other flag must keep the run's value (it would change what is learned)
RESUME_MAY_CHANGE = ["cuda", "torch_threads", "channels_last", "bf16", "track", "wandb_project_name", "wandb_entity"]
RESUME_MAY_CHANGE += ["wandb_group", "wandb_tags", "capture_video", "save_model", "save_every", "resume", "total_timesteps"]
UPLOADED = set()  # the videos sent to wandb (upload_videos)


def check_args(args):
    """Fill the computed fields; return one line for settings that cannot train, else None (Args checks each flag)."""
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.batch_size % args.num_minibatches != 0:
        return f"--num-minibatches {args.num_minibatches} does not divide the batch ({args.batch_size}); pick a divisor of it"
    if args.total_timesteps < args.batch_size:
        return f"--total-timesteps {args.total_timesteps} is below one batch ({args.batch_size}); raise it to at least that"
    if args.env_id not in SCENARIOS:
        return f"unknown MicroRTS scenario '{args.env_id}'; choose one of {', '.join(SCENARIOS)}"
    if microrts_ai is None or not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        return f"MicroRTS needs gym-microrts and Java: {INSTALL}"
    if args.capture_video:
        return "--capture-video is not supported: MicroRTS renders only in a Java window (X display); drop the flag"
    return None


def open_run(args):
    """(checkpoint, run_name, folder, videos): --resume's, its new videos in a subfolder (none is overwritten), or a new
    runs/{env_id}__{exp_name}__{seed}__{unix time} by os.mkdir (atomic: a sweep's runs each take one), gone if left empty."""
    if args.resume:
        checkpoint = load_checkpoint(args.resume)
        name = checkpoint["run_name"]
        return checkpoint, name, os.path.dirname(args.resume) or ".", f"{name}/resumed-{checkpoint['iteration'] + 1}"
    os.makedirs(os.path.dirname(f"runs/{args.env_id}__{args.exp_name}"), exist_ok=True)  # runs/, or runs/ALE/ for ALE/Pong-v5
    for stamp in itertools.count(int(time.time())):
        name = f"{args.env_id}__{args.exp_name}__{args.seed}__{stamp}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(f"runs/{name}")
            break
    atexit.register(lambda p=os.path.abspath(f"runs/{name}"): os.path.isdir(p) and not os.listdir(p) and os.rmdir(p))
    return None, name, f"runs/{name}", name


def open_logs(args, run_name, run_dir, checkpoint, device):
    """wandb with --track, then TensorBoard; a resumed run's curves go on from its checkpoint (later points purged)."""
    step = checkpoint["global_step"] if checkpoint else 0
    if args.track:  # a resumed run goes on in the same wandb run
        wandb = wandb_init(args, sync_tensorboard=True, name=run_name, id=(checkpoint or {}).get("wandb_id"))
        wandb.define_metric("videos", step_metric="global_step")  # at the step their episode ended
    writer = SummaryWriter(run_dir, purge_step=step + 1 if checkpoint else None)
    atexit.register(writer.close)  # an exit on an error keeps what was logged
    table = "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])  # each segment's settings, at its start
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}", global_step=step)
    print(f"training {run_name} on {device} from step {step} to {args.num_iterations * args.batch_size}", flush=True)
    return writer


def wandb_init(args, **kwargs):
    """wandb.init with the wandb flags and the script's code; one line naming the fix without credentials."""
    import wandb

    kwargs = {"project": args.wandb_project_name, "entity": args.wandb_entity, "group": args.wandb_group, **kwargs}
    kwargs = {"config": vars(args), "tags": list(args.wandb_tags) or None, "resume": "allow", "save_code": True, **kwargs}
    where = wandb.Settings(program_abspath=os.path.abspath(__file__), program_relpath=os.path.basename(__file__))
    try:
        wandb.init(**kwargs, settings=where)
    except wandb.errors.UsageError as e:
        sys.exit(f"error: --track: {e} Or set WANDB_API_KEY, or WANDB_MODE=offline to sync later")
    return wandb


def upload_videos(args, videos, step):
    """--capture-video --track: the videos written since the last call, to wandb at `step` (global step, or episode)."""
    if args.track and args.capture_video:
        wandb = sys.modules["wandb"]  # imported by wandb_init
        for path in sorted({f"videos/{videos}/{f}" for f in os.listdir(f"videos/{videos}")} - UPLOADED, key=os.path.getmtime):
            wandb.log({"videos": wandb.Video(path, format="mp4"), **step})
            UPLOADED.add(path)


def catch_signals():
    """Ctrl-C or SIGTERM sets `stop.requested` (the signal): the run stops after this iteration; a second one: at once."""
    stop = types.SimpleNamespace(requested=0)

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt
        stop.requested = signum
        print(f"\n{signal.Signals(signum).name}: stopping after this iteration, with a checkpoint (again: now)", flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def save_checkpoint(path, agent, optimizer, envs, args, run_name, iteration):
    """Write the state after `iteration` to a temporary file, then rename it: the previous one stays whole until then."""
    np_state = np.random.get_state()  # the RNG states as tensors and plain types: loadable with weights_only=True
    rng = {"python": random.getstate(), "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]]}
    rng |= {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    checkpoint = {"script": os.path.basename(__file__), "model": agent.state_dict(), "optimizer": optimizer.state_dict()}
    checkpoint |= {"args": asdict(args), "run_name": run_name, "iteration": iteration, "rng": rng}
    checkpoint |= {"global_step": iteration * args.batch_size, "wandb_id": sys.modules["wandb"].run.id if args.track else None}
    checkpoint["normalize"] = envs.state_dict() if hasattr(envs, "state_dict") else None  # VecNormalize's statistics
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # a full disk, a read-only folder (torch says RuntimeError): one line
        sys.exit(f"error: cannot write the checkpoint {path} ({str(e).strip().splitlines()[0]}); the previous one stays")
    finally:
        if os.path.exists(tmp):  # after a failed write, or a second Ctrl-C during it
            os.remove(tmp)


def load_checkpoint(path):
    """A checkpoint of this script, loaded as tensors and plain types only (a file cannot run code); one line if not."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # no such file, not a checkpoint, cut short, or holding code (refused by weights_only)
        sys.exit(f"error: cannot load the checkpoint {path}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    script = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if script != os.path.basename(__file__):
        sys.exit(f"error: {path} is not a checkpoint of {os.path.basename(__file__)}" + f" but of {script}" * bool(script))
    return checkpoint


def restore(checkpoint, agent, optimizer, envs):
    """--resume: the weights, Adam's state, the RNG states (and VecNormalize's) loaded; returns the next iteration."""
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if checkpoint.get("normalize"):
        envs.load_state_dict(checkpoint["normalize"])
    random.setstate(checkpoint["rng"]["python"])
    np.random.set_state(tuple(np.asarray(s) if torch.is_tensor(s) else s for s in checkpoint["rng"]["numpy"]))
    torch.set_rng_state(checkpoint["rng"]["torch"])
    if checkpoint["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(checkpoint["rng"]["cuda"])
    return checkpoint["iteration"] + 1


def resume_args(cli, checkpoint):
    """The run's own settings, but for the RESUME_MAY_CHANGE flags given now; one line if another flag would differ."""
    args = Args(**{k: v for k, v in checkpoint["args"].items() if k in Args.__dataclass_fields__})
    given = {a[2:].split("=")[0].replace("-", "_") for a in sys.argv[1:] if a.startswith("--")}
    given = {f if f in Args.__dataclass_fields__ else f.removeprefix("no_") for f in given} & Args.__dataclass_fields__.keys()
    changed = [f for f in sorted(given - set(RESUME_MAY_CHANGE)) if getattr(cli, f) != getattr(args, f)]
    if changed:
        said = ", ".join(f"--{f.replace('_', '-')} {getattr(cli, f)} (the run's: {getattr(args, f)})" for f in changed)
        sys.exit(f"error: {said}: a resumed run keeps the settings it learned with; drop them, or start a new run")
    for field in given & set(RESUME_MAY_CHANGE):
        setattr(args, field, getattr(cli, field))
    if args.total_timesteps <= checkpoint["global_step"]:
        sys.exit(f"error: the run has done {checkpoint['global_step']} steps; a larger --total-timesteps extends it")
    return args


def finish(stop, checkpoint_path, global_step):
    """After Ctrl-C / SIGTERM: how to go on, then exit with 128 + the signal (wandb notes it)."""
    if stop.requested:
        print(f"stopped at step {global_step}; go on with: python {os.path.basename(__file__)} --resume {checkpoint_path}")
        sys.exit(128 + stop.requested)


def evaluate(args, checkpoint, device, videos):
    """The returns of --eval-episodes episodes of a checkpoint's policy (actions sampled), recorded into videos/{videos}/."""
    trained = Args(**{k: v for k, v in checkpoint["args"].items() if k in Args.__dataclass_fields__})
    trained.capture_video = videos is not None
    torch.manual_seed(trained.seed)  # the actions are sampled: the same checkpoint plays the same episodes
    envs = make_envs(trained, videos, num_envs=1)
    agent = Agent(envs).to(device)
    agent.load_state_dict(checkpoint["model"])
    returns = []
    obs, _ = envs.reset(seed=trained.seed)
    while len(returns) < args.eval_episodes:
        mask = torch.as_tensor(envs.get_action_mask(), device=device).bool()
        with torch.no_grad():
            action, _, _, _ = agent.get_action_and_value(torch.Tensor(obs).to(device), mask=mask)
        obs, _, _, _, infos = envs.step(action.cpu().numpy())
        if "episode" in infos.get("final_info", {}) and infos["final_info"]["_episode"].any():
            returns.append(float(infos["final_info"]["episode"]["r"][0]))
    envs.close()
    return returns


def report_evaluation(args):
    """--eval-checkpoint: print its returns; with --track, log them and the videos to a wandb run `<run_name>-eval`."""
    checkpoint = load_checkpoint(args.eval_checkpoint)
    videos = f"{checkpoint['run_name']}-eval-{int(time.time())}" if args.capture_video else None
    returns = evaluate(args, checkpoint, torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu"), videos)
    print(f"eval: {len(returns)} episodes, mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
    print("eval: each episode's return, in order:", " ".join(f"{r:g}" for r in returns))
    if args.track:
        group, name = args.wandb_group or checkpoint["args"]["wandb_group"], f"{checkpoint['run_name']}-eval"
        wandb = wandb_init(args, group=group, job_type="eval", name=name, config=checkpoint["args"])
        for episode, r in enumerate(returns):
            wandb.log({"eval/episodic_return": r, "episode": episode})
        upload_videos(args, videos, {"episode": len(returns)})


def main():
    args = tyro.cli(Args)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    args = resume_args(args, checkpoint) if checkpoint else args  # its own settings, but for RESUME_MAY_CHANGE
    if error := check_args(args):
        sys.exit(f"error: {error}")
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)  # speed: tiny matmuls lose more to thread hand-offs than they gain
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 is float32 on GPUs too
    try:
        return report_evaluation(args) if args.eval_checkpoint else train(args)  # the run's name (CleanRL's tuner)
    except KeyboardInterrupt:  # a second Ctrl-C / SIGTERM: at once (a checkpoint is renamed into place whole, or not at all)
        sys.exit("stopped at once; the last checkpoint written stays whole")
    except (gym.error.Error, ImportError) as e:  # an unknown env id, its module:EnvId's module, Box2D, moviepy, Pusher-v4
        sys.exit(f"error: {args.env_id}: {e}" + " (Atari: the Atari scripts)" * isinstance(e, gym.error.NameNotFound))


if __name__ == "__main__":
    run_name = main()  # in the globals runpy returns, as CleanRL's tuner reads it

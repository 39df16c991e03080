# PPO on Atari with the gradient update parallelized over processes (aux-2, torch.distributed). Parent: ppo_atari.py.
# One process: python ppo_atari_multigpu.py. K processes on one machine: torchrun --standalone --nproc_per_node K
# ppo_atari_multigpu.py. Each rank steps num_envs / K envs; gradients are averaged over the ranks before each step.
import atexit
import collections
import contextlib
import copy
import itertools
import os
import random
import signal
import sys
import time
import types
from dataclasses import asdict, dataclass

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter

gym.register_envs(ale_py)

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
    bf16: bool = False
    """speed: the CNN's forward and backward in bfloat16 (autocast; needs AVX512-BF16/AMX-BF16 or a bf16 GPU)"""
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
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    max_episode_frames: int | None = None
    """frames after which a game is cut (truncated); left out: ppo2's (gym 0.21), 400000 (SpaceInvaders 300000); 108000:
    the 30-minute protocol"""
    noop_max: int = 30
    """the most no-op frames at a game's start, 1 to noop_max drawn at random (atari-1; 0: none)"""
    episodic_life: bool = True
    """if toggled, ending the learning episode at a life loss, the game going on (atari-3)"""
    fire_reset: bool = True
    """if toggled, pressing FIRE, then action 2, at reset in games that have FIRE (atari-4)"""
    clip_reward: bool = True
    """if toggled, learning from the sign of the reward (atari-6; the logged return is the game's either way)"""
    frame_stack: int = 4
    """the number of last frames stacked into an observation (atari-7; 1: no stacking)"""
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


class NoopResetEnv(gym.Wrapper):
    """On reset, take a random number of no-op frames in [1, noop_max]."""

    def __init__(self, env, noop_max=30):
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.unwrapped.np_random.integers(1, self.noop_max + 1)):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class MaxAndSkipEnv(gym.Wrapper):
    """Repeat the action `skip` frames, sum the rewards, observe the pixel-wise max of the last two frames."""

    def __init__(self, env, skip=4):
        super().__init__(env)
        self.skip = skip
        self.frames = np.zeros((2,) + env.observation_space.shape, dtype=env.observation_space.dtype)

    def step(self, action):
        total_reward = 0.0
        for i in range(self.skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i >= self.skip - 2:
                self.frames[i - (self.skip - 2)] = obs
            total_reward += reward
            if terminated or truncated:
                break
        return self.frames.max(axis=0), total_reward, terminated, truncated, info


class EpisodicLifeEnv(gym.Wrapper):
    """A life loss ends the episode for learning; the game itself is reset only when it is really over."""

    lives, real_done = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.real_done = terminated or truncated
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.real_done:
            obs, info = self.env.reset(**kwargs)
        else:  # after a life loss: a no-op step instead of a reset, the game goes on
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.unwrapped.ale.lives()
        return obs, info


class FireResetEnv(gym.Wrapper):
    """On reset, press FIRE (then action 2) for games that wait for it."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def game_frames(env_id, max_episode_frames=None):
    """--max-episode-frames, else ppo2's game length: gym 0.21's 100,000 x the game's frameskip (4; SpaceInvaders 3)."""
    return max_episode_frames or 100000 * (3 if gym.spec(env_id).kwargs["game"] == "space_invaders" else 4)


def make_env(env_id, idx, capture_video, run_name, args):
    def thunk():
        # frameskip=1 as MaxAndSkip skips; ALE/<Game>-v5 keeps its sticky actions (0.25), NoFrameskip-v4 and ppo2 have none
        # game length: ppo2's (game_frames: 400,000 frames, SpaceInvaders 300,000); ale-py registers 108,000
        kwargs = dict(
            frameskip=1, obs_type="grayscale", max_num_frames_per_episode=game_frames(env_id, args.max_episode_frames)
        )
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", **kwargs)
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id, **kwargs)
        # detail atari-1: NoopReset, 1 to 30 no-op frames at reset
        env = NoopResetEnv(env, noop_max=args.noop_max) if args.noop_max else env
        # detail atari-2: MaxAndSkip, repeat each action 4 frames, observe the max of the last 2
        env = MaxAndSkipEnv(env, skip=4)
        # below EpisodicLife and ClipReward (as baselines' Monitor): logs the real, unclipped, all-lives game return
        env = gym.wrappers.RecordEpisodeStatistics(env)
        # detail atari-3: EpisodicLife, a life loss ends the learning episode, the game goes on
        env = EpisodicLifeEnv(env) if args.episodic_life else env
        # detail atari-4: FireReset, press FIRE at reset for games that wait for it
        env = FireResetEnv(env) if args.fire_reset and "FIRE" in env.unwrapped.get_action_meanings() else env
        # detail atari-5: WarpFrame, 84x84 grayscale (ALE's gray screen, resized by area averaging as baselines' cv2)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        # detail atari-6: ClipReward, the sign of the reward (learning only; the logged return is unclipped)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r))) if args.clip_reward else env
        # detail atari-7: FrameStack, the last 4 frames (zeros before an episode's first, as ppo2's VecFrameStack)
        env = gym.wrappers.FrameStackObservation(env, args.frame_stack, padding_type="zero")
        return env

    return thunk


def make_envs(args, run_name, num_envs=None):
    # detail core-1: vectorized architecture (N envs stepped together; ppo2 autoreset: same step)
    return gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name, args) for i in range(num_envs or args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


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


class Agent(nn.Module):
    def __init__(self, envs, bf16=False):
        super().__init__()
        # detail atari-8: shared Nature-CNN (32 8x8/4, 64 4x4/2, 64 3x3/1, 512 fc, ReLU) under policy and value heads
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(envs.single_observation_space.shape[0], 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        # detail core-13: one trunk shared by the policy and value heads
        self.actor = layer_init(nn.Linear(512, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)
        self.bf16 = bf16  # --bf16: the CNN in bfloat16 (its output, the heads, log-softmax, ratio and loss in float32)
        self.frames_format = torch.contiguous_format  # --channels-last: torch.channels_last (set in train)

    def trunk(self, x):
        # detail atari-9: scale pixels to [0, 1] inside the network (observations stay uint8)
        # speed: --bf16 scales in bfloat16 (same bits, half the bytes); --channels-last lays out the frames once, here
        x = x.to(torch.bfloat16 if self.bf16 else x.dtype, memory_format=self.frames_format)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=self.bf16):  # speed: --bf16 (float32 output)
            return self.network(x / 255.0).float()

    def rollout_copy(self):
        """The agent the rollout acts with: itself, or with --bf16 a copy whose CNN weights are cast to bfloat16 once."""
        if not self.bf16:
            return self
        policy = copy.deepcopy(self)
        policy.network.to(torch.bfloat16)  # the bits autocast's cast gives, which it would redo in every forward pass
        return policy

    def get_value(self, x):
        return self.critic(self.trunk(x))

    def get_action_and_value(self, x, action=None):
        hidden = self.trunk(x)
        logits = self.actor(hidden)
        # the Categorical written out: torch's formulas, sampler and order of operations (the same bits), without its overhead
        log_p = logits - logits.logsumexp(-1, keepdim=True)  # normalized log-probabilities
        if action is None:
            action = torch.multinomial(log_p.softmax(-1), 1, True).view(-1)
        logprob = log_p.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p * log_p.softmax(-1)).sum(-1)
        return action, logprob, entropy, self.critic(hidden)


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
    if dist.is_initialized():
        # detail aux-2: parallelized gradient update, the gradients averaged over all ranks before clipping and the step
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for g, averaged in zip(grads, torch.split(flat / dist.get_world_size(), [g.numel() for g in grads])):
            g.copy_(averaged.view_as(g))
    # detail core-11: global gradient clipping, the norm over all parameters at most max_grad_norm (0.5)
    if clip:
        nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], max_grad_norm, foreach=True)
    optimizer.step()


def mean_over_ranks(x):
    if dist.is_initialized():
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        x /= dist.get_world_size()
    return x


def train(args):
    """The PPO loop in CleanRL's order; the run's folder, logs, checkpoints and Ctrl-C: below the fence."""
    rank, world_size, device = setup_distributed(args)  # torchrun's ranks and their process group; else one process
    local_num_envs = args.num_envs // world_size
    # TRY NOT TO MODIFY: seeding (each rank its own seed; rank 0's initial parameters are sent to all)
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    checkpoint, run_name, run_dir, videos = open_run(args, rank)  # rank 0's new folder, or the --resume run's

    # env setup
    envs = make_envs(args, videos, num_envs=local_num_envs)

    agent = Agent(envs, args.bf16).to(device)
    if not args.orthogonal_init:  # core-2 switched off: PyTorch's own init
        torch_default_init(agent)
    if args.channels_last:  # speed: oneDNN's NHWC convolution kernels (the same math, rounded differently)
        agent = agent.to(memory_format=torch.channels_last)
        agent.frames_format = torch.channels_last
    for param in agent.parameters() if world_size > 1 else []:
        dist.broadcast(param.data, src=0)
    optimizer = make_optimizer(agent, args)
    start_iteration = restore(checkpoint, agent, optimizer, envs) if checkpoint else 1  # weights, Adam, RNGs
    if checkpoint and world_size > 1:  # the checkpoint holds rank 0's generators: each rank draws its own stream again
        torch.manual_seed(int(torch.randint(2**31 - 1, ())) + rank)
    global_step = (start_iteration - 1) * args.batch_size
    writer = open_logs(args, run_name, run_dir, checkpoint, device) if rank == 0 else NullWriter()  # rank 0 logs
    stop = catch_signals()  # Ctrl-C / SIGTERM: the run stops after the current iteration, with a checkpoint

    # ALGO LOGIC: storage setup
    # observations stored as uint8, as ppo2 does (4x less memory than float32)
    obs = torch.zeros((args.num_steps, local_num_envs) + envs.single_observation_space.shape, dtype=torch.uint8).to(device)
    if args.channels_last:  # speed: each frame stack stored NHWC, the layout the convolutions take (no reorder)
        obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)
    actions = torch.zeros((args.num_steps, local_num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, local_num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, local_num_envs)).to(device)
    dones = torch.zeros((args.num_steps, local_num_envs)).to(device)
    values = torch.zeros((args.num_steps, local_num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    start_time, start_step, last_print, recent_returns = time.time(), global_step, 0.0, []
    next_obs, _ = envs.reset(seed=(int(np.random.randint(2**31 - 1)) if checkpoint else args.seed) + rank * local_num_envs)
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.zeros(local_num_envs).to(device)

    for iteration in range(start_iteration, args.num_iterations + 1):
        # detail core-4: learning-rate annealing, linearly from lr to 0 over the iterations
        frac = 1.0 - (iteration - 1.0) / args.num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        # detail aux-1: clip-range annealing, same schedule as the learning rate (off by default)
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef

        policy = agent.rollout_copy()  # speed: --bf16 casts the CNN's weights here, once a rollout
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.inference_mode():
                action, logprob, _, value = policy.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, device=device)
            next_obs = torch.as_tensor(next_obs, device=device)
            next_done = torch.as_tensor(np.logical_or(terminations, truncations), device=device, dtype=torch.float32)

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

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size // world_size)
        stats = []
        for _epoch in range(args.update_epochs):
            if args.shuffle_minibatches:  # detail core-6: mini-batch updates, shuffled each epoch, each sample once an epoch
                np.random.shuffle(b_inds)
            for start in range(0, len(b_inds), args.minibatch_size // world_size):
                mb_inds = torch.from_numpy(b_inds[start : start + args.minibatch_size // world_size]).to(device)
                # speed: b_obs[mb_inds] copied as whole rows (index_select, ~7x faster), in b_obs's layout (NCHW, or NHWC)
                mb_obs = torch.index_select(b_obs, 0, mb_inds, out=torch.empty_like(b_obs[: len(mb_inds)]))
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, b_actions[mb_inds])
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
            if args.target_kl is not None and mean_over_ranks(mb.approx_kl).item() > args.target_kl:
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
        if rank == 0 and (time.time() - last_print > 10 or iteration == args.num_iterations):
            last_print = time.time()
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            print(
                f"step {global_step}/{args.num_iterations * args.batch_size} | return {recent} (last 20) | SPS {sps}",
                flush=True,
            )
        upload_videos(args, videos, {"global_step": global_step})  # --capture-video --track: new videos to wandb

        stopping = all_ranks_stop(stop, world_size, device)  # a signal seen by any rank stops them all here
        at_save_point = iteration == args.num_iterations or args.save_every and iteration % args.save_every == 0
        if rank == 0 and (stopping or args.save_model and at_save_point):  # --save-model; after a signal in any case
            save_checkpoint(f"{run_dir}/checkpoint.pt", agent, optimizer, envs, args, run_name, iteration)
        if stopping:
            break
    envs.close()
    writer.close()
    close_distributed(agent, rank, world_size, stopping)  # all ranks' parameters compared, the process group ended
    finish(stop, f"{run_dir}/checkpoint.pt", global_step)  # after Ctrl-C / SIGTERM: how to go on; exit 128 + signal
    return run_name


# ==== plumbing, not PPO: checks, checkpoints, resume, signals, evaluation ====
# this script's own plumbing; the rest of this section is the same in every script (tools/lineage.py --check-shared)
OWN_PLUMBING = ["check_args", "bf16_native", "evaluate", "setup_distributed", "all_ranks_stop"]
OWN_PLUMBING += ["NullWriter", "close_distributed", "open_run", "main"]

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
    world_size = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's ranks
    if args.num_envs % world_size or (args.num_envs // world_size * args.num_steps) % args.num_minibatches:
        return f"--num-envs {args.num_envs} must split evenly over {world_size} ranks, each rank's batch over the minibatches"
    if args.total_timesteps < args.batch_size:
        return f"--total-timesteps {args.total_timesteps} is below one batch ({args.batch_size}); raise it to at least that"
    args.env_id = args.env_id.removeprefix("ale_py:")  # gymnasium's module:EnvId form of the same id (ale_py is imported)
    if not (args.env_id.endswith("NoFrameskip-v4") or args.env_id.startswith("ALE/")):
        return f"{os.path.basename(__file__)} needs an Atari id, <Game>NoFrameskip-v4 or ALE/<Game>-v5, not '{args.env_id}'"
    if args.bf16 and not args.eval_checkpoint and not bf16_native(args):  # an evaluation plays in float32
        return "--bf16 needs native bfloat16 (AVX512-BF16, AMX or a bf16 GPU): drop it, or with --resume add --no-bf16"
    return None


def bf16_native(args):
    """Whether bfloat16 is native here, on the GPU or in the CPU (AVX512-BF16, AMX): emulated, it is slower than float32."""
    if args.cuda and torch.cuda.is_available():
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def open_run(args, rank):
    """(checkpoint, run_name, folder, videos) as in the other scripts, the folder made by rank 0: the others take its name
    and record no videos (all ranks' files would have one name)."""
    args.capture_video = args.capture_video and rank == 0
    if args.resume:
        checkpoint = load_checkpoint(args.resume)
        name = checkpoint["run_name"]
        return checkpoint, name, os.path.dirname(args.resume) or ".", f"{name}/resumed-{checkpoint['iteration'] + 1}"
    names = [None]
    if (
        rank == 0
    ):  # runs/{env_id}__{exp_name}__{seed}__{unix time}, taken with os.mkdir (atomic): a sweep's runs each their own
        os.makedirs(os.path.dirname(f"runs/{args.env_id}__{args.exp_name}"), exist_ok=True)
        for stamp in itertools.count(int(time.time())):
            names[0] = f"{args.env_id}__{args.exp_name}__{args.seed}__{stamp}"
            with contextlib.suppress(FileExistsError):
                os.mkdir(f"runs/{names[0]}")
                break
        atexit.register(lambda p=os.path.abspath(f"runs/{names[0]}"): os.path.isdir(p) and not os.listdir(p) and os.rmdir(p))
    if dist.is_initialized():
        dist.broadcast_object_list(names, src=0)
    return None, names[0], f"runs/{names[0]}", names[0]


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


def setup_distributed(args):
    """(rank, world size, device): under torchrun a process group over its ranks (gloo on CPUs, nccl on GPUs, a GPU a
    rank), also for one rank; without torchrun one process, rank 0 of 1."""
    rank, world_size, local_rank = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)))
    use_cuda = torch.cuda.is_available() and args.cuda
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if "MASTER_ADDR" in os.environ:  # torchrun
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    return rank, world_size, device


def all_ranks_stop(stop, world_size, device):
    """A signal seen by any rank stops every rank after the same iteration (so no rank waits in an all-reduce)."""
    if world_size > 1:
        flag = torch.tensor([stop.requested], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop.requested = int(flag.item())
    return stop.requested


class NullWriter:  # ranks other than 0 log nothing
    add_scalar = add_text = close = staticmethod(lambda *args, **kwargs: None)


def close_distributed(agent, rank, world_size, stopped):
    """All-reduced gradients and equal steps: every rank holds the same parameters, checked at the end; the group ends."""
    if not dist.is_initialized():
        return
    if not stopped:
        flat = torch.cat([p.detach().flatten() for p in agent.parameters()])
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            sys.exit(f"error: rank {rank}'s parameters differ from another rank's (max gap {(high - low).max():.3g})")
        print(f"rank {rank}: parameters bit-identical on all {world_size} ranks", flush=True)
    dist.destroy_process_group()  # gloo's and nccl's threads end before the interpreter does


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
        with torch.no_grad():
            action, _, _, _ = agent.get_action_and_value(torch.Tensor(obs).to(device))
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
    if any(a.split("=")[0] in ("--local-num-envs", "--local_num_envs") for a in sys.argv):  # CleanRL's flag
        sys.exit("error: --local-num-envs is CleanRL's envs per process; here --num-envs is the total over the processes")
    args = tyro.cli(Args)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    args = resume_args(args, checkpoint) if checkpoint else args  # its own settings, but for RESUME_MAY_CHANGE
    if error := check_args(args):
        sys.exit(f"error: {error}")
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)  # speed: tiny matmuls lose more to thread hand-offs than they gain
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 is float32 on GPUs too
    code = run_name = None
    try:
        run_name = report_evaluation(args) if args.eval_checkpoint else train(args)
    except KeyboardInterrupt:  # a second Ctrl-C / SIGTERM: at once (a checkpoint is renamed into place whole, or not at all)
        code = "stopped at once; the last checkpoint written stays whole"
    except (gym.error.Error, ImportError) as e:  # an unknown env id, a package missing (moviepy for videos)
        code = f"error: {args.env_id}: {e}"
    except SystemExit as e:
        code = e.code
    if "MASTER_ADDR" not in os.environ:
        return sys.exit(code) if code else run_name  # a run that ends normally returns (runpy, tuners)
    # under torchrun all is written: exit now, without the interpreter's teardown (gloo's worker thread may still be
    # freeing the last all-reduce's tensors, which takes the GIL: during the teardown that aborts the process, SIGABRT)
    if isinstance(code, str):
        print(code, file=sys.stderr)
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(1 if isinstance(code, str) else code or 0)


if __name__ == "__main__":
    run_name = main()  # in the globals runpy returns, as CleanRL's tuner reads it

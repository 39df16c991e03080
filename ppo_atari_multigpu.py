# PPO on Atari with the gradient update parallelized over processes (aux-2, torch.distributed). Parent: ppo_atari.py.
# One process: python ppo_atari_multigpu.py. K processes on one machine: torchrun --standalone --nproc_per_node K
# ppo_atari_multigpu.py. Each rank steps num_envs / K envs; gradients are averaged over the ranks before each step.
import copy
import importlib.util
import json
import netrc
import os
import pickle
import random
import signal
import sys
import tempfile
import time
import urllib.parse
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
    """CPU threads for torch (0: torch's default); 1 is fastest for small networks and for runs sharing a machine"""
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
    """Toggle ending the learning episode at a life loss, the game going on (atari-3)"""
    fire_reset: bool = True
    """Toggle pressing FIRE, then action 2, at reset in games that have FIRE (atari-4)"""
    clip_reward: bool = True
    """Toggle learning from the sign of the reward (atari-6; the logged return is the game's either way)"""
    frame_stack: int = 4
    """the number of last frames stacked into an observation (atari-7; 1: no stacking)"""
    orthogonal_init: bool = True
    """Toggle orthogonal weight init with constant 0 bias (core-2; off: PyTorch's default init of linear and conv layers)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-5
    """the epsilon of Adam (core-3; ppo2: 1e-5, PyTorch's default: 1e-8)"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks (core-4)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    shuffle_minibatches: bool = True
    """Toggle shuffling before each epoch's mini-batches (core-6; off: the same order every epoch)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization (core-7)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    anneal_clip: bool = False
    """Toggle annealing of the clipping coefficient to 0 with the learning-rate schedule (aux-1)"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper (core-9)."""
    ent_coef: float = 0.01
    """coefficient of the entropy (core-10; 0: no entropy bonus)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    clip_grad_norm: bool = True
    """Toggle global gradient clipping to max_grad_norm (core-11; off: no clipping)"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL: the update's remaining epochs are skipped once an epoch's last minibatch exceeds it (aux-3)"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


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
    return agent


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
        # the Categorical distribution written out: torch's formulas, sampler and order of operations (so the same
        # bits, gradients included) without its per-call overhead
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
    returns = advantages + values
    return advantages, returns


def ppo_loss(newlogprob, entropy, newvalue, oldlogprob, advantages, returns, oldvalues, args, clip_coef):
    """Return (loss, pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac) for one minibatch."""
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
    return loss, pg_loss, v_loss, entropy_loss, old_approx_kl, approx_kl, clipfrac


def make_optimizer(agent, args):
    # detail core-3: Adam epsilon 1e-5 (ppo2's value, not PyTorch's 1e-8; --adam-eps); foreach: same math in fewer ops
    return optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps, foreach=True)


def minibatches(b_inds, minibatch_size, shuffle=True):
    """Shuffle the batch indices in place (if `shuffle`), split them into minibatches that cover the batch once."""
    # detail core-6: mini-batch updates, shuffled, each epoch visits every sample exactly once
    if shuffle:
        np.random.shuffle(b_inds)
    return [b_inds[start : start + minibatch_size] for start in range(0, len(b_inds), minibatch_size)]


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


def train(args, run):
    """The PPO loop, CleanRL's order; `run` (below the fence) does the plumbing: checks, logs, resume, stop, checkpoints."""
    rank, world_size, device = run.rank, run.world_size, run.device  # torchrun's (setup_distributed, below the fence)
    local_num_envs = args.num_envs // world_size
    # TRY NOT TO MODIFY: seeding (each rank its own seed; rank 0's initial parameters are sent to all)
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # env setup
    envs = run.check_env(
        make_envs(args, run.name, num_envs=local_num_envs)
    )  # one line naming the script to use, if this one cannot take them

    agent = Agent(envs, args.bf16).to(device)
    if not args.orthogonal_init:  # core-2 switched off: PyTorch's own init
        torch_default_init(agent)
    if args.channels_last:  # speed: oneDNN's NHWC convolution kernels (the same math, rounded differently)
        agent = agent.to(memory_format=torch.channels_last)
        agent.frames_format = torch.channels_last
    for param in agent.parameters() if world_size > 1 else []:
        dist.broadcast(param.data, src=0)
    optimizer = make_optimizer(agent, args)
    start_iteration = run.restore(agent, optimizer)  # --resume: the weights, Adam's state and the RNG states
    global_step = (start_iteration - 1) * args.batch_size
    writer = run.open_writer()  # TensorBoard in runs/{run_name} (+ wandb with --track); a resumed run's curves go on

    # ALGO Logic: Storage setup
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
    next_obs, _ = envs.reset(seed=run.env_seed() + rank * local_num_envs)  # --seed; on resume a seed drawn now
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.zeros(local_num_envs).to(device)

    for iteration in run.iterations(start_iteration, device):  # ends early after Ctrl-C / SIGTERM
        # detail core-4: learning-rate annealing, linearly from lr to 0 over the iterations
        frac = 1.0 - (iteration - 1.0) / args.num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        # detail aux-1: clip-range annealing, same schedule as the learning rate (off by default)
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef

        policy = agent.rollout_copy()  # speed: --bf16 casts the CNN's weights here, once a rollout
        for step in range(args.num_steps):
            if run.stop.signum:  # Ctrl-C / SIGTERM: this rollout is dropped (the checkpoint is of the iteration before)
                break
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
        if run.stopping():  # a stop request: no update from a partial rollout
            break

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
            for mb_inds in minibatches(b_inds, args.minibatch_size // world_size, args.shuffle_minibatches):
                mb_inds = torch.from_numpy(mb_inds).to(device)
                # speed: b_obs[mb_inds] copied as whole rows (index_select, ~7x faster), in b_obs's layout (NCHW, or NHWC)
                mb_obs = torch.index_select(b_obs, 0, mb_inds, out=torch.empty_like(b_obs[: len(mb_inds)]))
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, b_actions[mb_inds])
                loss, *mb_stats = ppo_loss(
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
                gradient_step(optimizer, loss, args.max_grad_norm, args.clip_grad_norm)
                stats.append(torch.stack(mb_stats))

            # detail aux-3: target-KL early stopping, once per epoch: the epoch's last minibatch's KL > target ends it
            if args.target_kl is not None and mean_over_ranks(mb_stats[4]).item() > args.target_kl:
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
        run.iteration_done(iteration, agent, optimizer)  # --save-model: a checkpoint every --save-every iterations

    run.save_if_stopped(agent, optimizer)  # after Ctrl-C / SIGTERM: the last whole iteration, to continue with --resume
    envs.close()
    writer.close()


# ==== plumbing, not PPO: checks, checkpoints, resume, signals, evaluation ====
# this script's own plumbing; the rest of this section is the same in every script (tools/lineage.py --check-shared)
OWN_PLUMBING = ["check_args", "check_env", "evaluate", "setup_distributed", "all_ranks_stop", "NullWriter", "main"]
OWN_PLUMBING += ["start", "exit_once", "other_workers"]
OWN_PLUMBING += ["Run.__init__", "Run.restore", "Run.open_writer", "Run.stopping", "Run.save", "Run.finish"]


# the domain of each numeric flag, checked before anything starts: (field, test, what is allowed); NaN fails every test
FLAG_DOMAINS = [
    ("seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)"),
    ("total_timesteps", lambda v: 1 <= v < 2**63, "in [1, 2**63) (TensorBoard's steps are int64)"),
    ("num_envs", lambda v: v >= 1, "at least 1"),
    ("num_steps", lambda v: v >= 1, "at least 1"),
    ("num_minibatches", lambda v: v >= 1, "at least 1"),
    ("update_epochs", lambda v: v >= 1, "at least 1"),
    ("learning_rate", lambda v: v >= 0, "at least 0"),
    ("gamma", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("gae_lambda", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("clip_coef", lambda v: v >= 0, "at least 0"),
    ("ent_coef", lambda v: v >= 0, "at least 0"),
    ("vf_coef", lambda v: v >= 0, "at least 0"),
    ("max_grad_norm", lambda v: v > 0, "above 0"),
    ("adam_eps", lambda v: v > 0, "above 0 (ppo2: 1e-5)"),
    ("noop_max", lambda v: v >= 0, "at least 0 (0: no no-op frames)"),
    ("target_kl", lambda v: v is None or v > 0, "above 0 (or left out: no early stopping)"),
    ("torch_threads", lambda v: 0 <= v <= (os.cpu_count() or 1), f"in [0, {os.cpu_count() or 1}], the CPUs (0: torch's)"),
    ("save_every", lambda v: v >= 0, "at least 0 (0: a checkpoint only at the end)"),
    ("eval_episodes", lambda v: v >= 1, "at least 1"),
    ("max_episode_frames", lambda v: v is None or 1 <= v < 2**31, "in [1, 2**31), ALE's int (or left out: ppo2's, 400000)"),
    ("frame_stack", lambda v: v >= 1, "at least 1"),
]


def domain_error(args):
    """A one-line error for the first flag outside its domain (the flag, its value, what is allowed), else None."""
    for field, ok, allowed in FLAG_DOMAINS:
        if hasattr(args, field) and not ok(getattr(args, field)):
            return f"--{field.replace('_', '-')} {getattr(args, field)} is not allowed: it must be {allowed}"
    for field, value in vars(args).items():  # inf in any float flag: the losses would turn into NaN
        if isinstance(value, float) and not np.isfinite(value):
            return f"--{field.replace('_', '-')} {value} is not allowed: it must be a finite number"
    return None


def limits_error(args):
    """A one-line error for settings past what the backends take (a name wandb refuses, a name that makes no run folder,
    a rollout larger than the memory), else None; an evaluation stores no rollout, a resumed run keeps its folder."""
    if args.track and (len(args.wandb_project_name) > 128 or set("/\\#?%:") & set(args.wandb_project_name)):
        name = args.wandb_project_name
        return f"--wandb-project-name {name!r} is not allowed: wandb takes at most 128 characters, none of /\\#?%:"
    for tag in args.wandb_tags if args.track else ():
        if not 1 <= len(tag) <= 64:
            return f"--wandb-tags {tag!r} is not allowed: wandb takes tags of 1 to 64 characters"
    if args.eval_checkpoint:
        return None
    folder = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}".split("/")[-1]  # the run's folder name
    bad_name = not args.exp_name or "/" in args.exp_name or not args.exp_name.isprintable() or len(folder.encode()) > 255
    if bad_name and not args.resume:
        return (
            f"--exp-name {args.exp_name!r} is not allowed: it names the run's folder <env_id>__<exp_name>__<seed>__<time>, "
            "so it must be printable, without '/', and keep that name within 255 bytes"
        )
    # per env step: Atari's uint8 frames (others' observations are counted once the envs are made), the action, 6 floats
    return memory_error(args, (args.frame_stack * 84 * 84 if hasattr(args, "frame_stack") else 0) + 4 + 24)


def memory_error(args, per_step):
    """A one-line error when the rollout's storage, num_steps x num_envs x `per_step` bytes, is larger than the memory
    available for it (with --cuda the GPU's, torchrun's ranks a GPU each; else the RAM's), else None. The envs, the network
    and the update take more on top: this refuses what cannot fit, before anything starts."""
    need, ranks = args.num_steps * args.num_envs * per_step, os.environ.get("WORLD_SIZE", "1")
    if args.cuda and torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0")) if os.environ.get("LOCAL_RANK", "0").isdigit() else 0
        need //= max(int(ranks), 1) if ranks.isdigit() else 1  # the envs split over the ranks' GPUs
        free, where = torch.cuda.mem_get_info(local_rank % torch.cuda.device_count())[0], "GPU memory"
    else:
        free, where = available_ram(), "RAM"
    if free is not None and need > free:
        return (
            f"the rollout needs {need / 2**30:.1f} GiB of {where} (--num-steps {args.num_steps} x --num-envs {args.num_envs} "
            f"x {per_step} bytes) but {free / 2**30:.1f} GiB is available; lower --num-steps or --num-envs"
        )
    return None


def available_ram():
    """Bytes of RAM available (Linux: MemAvailable, within a container's cgroup limit; elsewhere all RAM), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):  # no sysconf (Windows)
            return None
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="utf-8") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            free = free if limit == "max" else min(free, int(limit) - int(g.read()))
    except (OSError, ValueError):  # not in a cgroup v2 container
        pass
    return free


def step_bytes(envs):
    """Bytes the rollout stores per env step (a lower bound): the observation (uint8 images as uint8, others as float32),
    the action and 6 floats (log-prob, reward, done, value, advantage, return); MicroRTS's masks are not counted."""
    obs, action = envs.single_observation_space, envs.single_action_space
    image = obs.dtype == np.uint8 and len(obs.shape) == 3
    return int(np.prod(obs.shape)) * (1 if image else 4) + 4 * int(np.prod(action.shape)) + 24


def missing_piece_error(args):
    """A one-line error naming what to install or set for an optional piece the flags ask for, else None."""
    if getattr(args, "bf16", False) and not args.eval_checkpoint and bf16_error(args):  # an evaluation plays in float32
        return bf16_error(args)
    if args.capture_video and importlib.util.find_spec("moviepy") is None:
        return "--capture-video needs moviepy to encode the videos: pip install moviepy==2.2.1 (as in requirements.txt)"
    if args.track and os.environ.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun"):
        if importlib.util.find_spec("wandb") is None:
            return "--track needs wandb: pip install wandb==0.31.0 (as in requirements.txt)"
        host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
        try:
            logged_in = netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
        except (OSError, netrc.NetrcParseError):
            logged_in = False
        if not (os.environ.get("WANDB_API_KEY") or logged_in):
            return "--track needs wandb credentials: run `wandb login` or set WANDB_API_KEY; or set WANDB_MODE=offline"
    return None


def bf16_error(args):
    """--bf16 where bfloat16 is not native (emulated: slower than float32), a one-line error; else None. A resumed run
    has --bf16 from its checkpoint: the fix is then --no-bf16 (it goes on in float32) or a machine that has bf16."""
    fix = "resume with --no-bf16 (float32 from here on) or where bf16 is native" if args.resume else "drop --bf16"
    if args.cuda and torch.cuda.is_available():
        return None if torch.cuda.is_bf16_supported() else f"--bf16: this GPU has no bfloat16 support; {fix}"
    if cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}:  # x86's AVX512-BF16 or AMX-BF16, Arm's BF16
        return None
    return (
        "--bf16 needs a CPU with AVX512-BF16 or AMX-BF16 (or a GPU): this one has neither, and emulated bfloat16 is "
        f"slower than float32; {fix} (--channels-last alone is the same math, faster)"
    )


def cpu_flags():
    """The CPU's feature flags (/proc/cpuinfo's 'flags' on x86, 'Features' on Arm); empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return {w for line in f if line.startswith(("flags", "Features")) for w in line.split(":", 1)[1].split()}
    except OSError:
        return set()


def check_args(args):
    """Fill the computed fields; return a one-line error for settings that cannot train, else None."""
    batch_size = int(args.num_envs * args.num_steps)
    computed = {"batch_size": batch_size, "minibatch_size": int(batch_size // max(args.num_minibatches, 1))}
    computed["num_iterations"] = args.total_timesteps // max(batch_size, 1)
    for field, value in computed.items():
        if getattr(args, field) not in (0, value):  # given on the command line: it would be silently overwritten
            return f"--{field.replace('_', '-')} is computed from the other flags ({value} here), not set; drop it"
        setattr(args, field, value)
    error = domain_error(args) or limits_error(args) or missing_piece_error(args)
    if error:
        return error
    if args.batch_size % args.num_minibatches != 0:
        return (
            f"--num-minibatches {args.num_minibatches} does not divide the batch of {args.batch_size} "
            f"(num_envs {args.num_envs} x num_steps {args.num_steps}); pick a divisor of {args.batch_size}"
        )
    if args.total_timesteps < args.batch_size:
        return (
            f"--total-timesteps {args.total_timesteps} is smaller than one batch ({args.batch_size} = "
            f"num_envs x num_steps); raise it to at least {args.batch_size}"
        )
    try:
        gym.spec(args.env_id)
    except gym.error.Error:
        return (
            f"unknown environment id '{args.env_id}' (not registered in gymnasium); check its name and version "
            "(Atari ids run with ppo_atari.py, MuJoCo ones with ppo_continuous_action.py)"
        )
    atari = args.env_id.endswith("NoFrameskip-v4") or (args.env_id.startswith("ALE/") and args.env_id.endswith("-v5"))
    if not atari or gym.spec(args.env_id).entry_point != "ale_py.env:AtariEnv":
        return f"{os.path.basename(__file__)} needs an Atari id, <Game>NoFrameskip-v4 or ALE/<Game>-v5, not '{args.env_id}'"
    frames = game_frames(args.env_id, args.max_episode_frames)  # more no-ops than a game's frames: resets that never end
    if args.noop_max >= frames:
        return f"--noop-max {args.noop_max} is not allowed: it must be below a game's {frames} frames (--max-episode-frames)"
    return None


def check_env(envs):
    """Return a one-line error when this script cannot handle the environment, else None."""
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        return (
            f"{os.path.basename(__file__)} needs a Discrete action space, but the environment has "
            f"{envs.single_action_space}; for Box (continuous) actions use ppo_continuous_action.py"
        )
    return None


def setup_distributed(args):
    """(rank, world size, device, error): torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK and
    LOCAL_WORLD_SIZE; with none of the first four a plain run is rank 0 of 1. The process group is made once all is checked."""
    names = "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
    env = {k: os.environ[k] for k in names if k in os.environ}
    numbers = all(v.isdigit() for k, v in env.items() if k != "MASTER_ADDR")
    if not numbers or 0 < len(set(env) & set(names[:4])) < 4 or int(env.get("RANK", 0)) >= int(env.get("WORLD_SIZE", 1)):
        said = ", ".join(f"{k}={v!r}" for k, v in env.items())
        return 0, 1, None, f"a half-set distributed environment ({said}): start with torchrun, or unset them for one process"
    rank, world_size, local_rank = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))  # the same on every rank of the machine
    use_cuda, gpus = torch.cuda.is_available() and args.cuda, torch.cuda.device_count()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    error = None
    if use_cuda and local_world_size > gpus:
        error = f"more ranks on this machine than its {gpus} GPU(s): use --nproc_per_node {gpus}, or --no-cuda (gloo on CPUs)"
    elif args.num_envs % world_size or (args.num_envs // world_size * args.num_steps) % args.num_minibatches:
        error = f"--num-envs {args.num_envs} must split evenly over {world_size} ranks, each rank's batch over the minibatches"
    elif args.seed + world_size > 2**32:  # numpy's seeds are below 2**32
        error = f"--seed {args.seed} is not allowed with {world_size} ranks: rank k seeds numpy with seed + k, below 2**32"
    elif "MASTER_ADDR" in env:  # torchrun (one rank too): gloo on CPUs, nccl on GPUs, a GPU a rank
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    return rank, world_size, device, error


def all_ranks_stop(stop, world_size, device):
    """A signal seen by any rank stops every rank after the same rollout (so no rank waits in an all-reduce)."""
    if world_size > 1:
        flag = torch.tensor([stop.signum or 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop.signum = int(flag.item()) or None
    return stop.signum is not None


class NullWriter:  # ranks other than 0 log nothing
    add_scalar = add_text = close = staticmethod(lambda *args, **kwargs: None)


def rng_states():
    """The RNG states of python, numpy and torch as tensors and plain types (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states):
    random.setstate(tuple(s if not isinstance(s, list) else tuple(s) for s in states["python"]))
    name, key, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, key.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(path, agent, optimizer, args, run_name, iteration, rng, wandb_id=None):
    """Write the state after `iteration` atomically (a temporary file in the same folder, then a rename)."""
    checkpoint = {
        "script": os.path.basename(__file__),
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "args": asdict(args),
        "run_name": run_name,
        "iteration": iteration,
        "global_step": iteration * args.batch_size,
        "rng": rng,
        "wandb_id": wandb_id,
    }
    tmp_path = f"{path}.tmp{os.getpid()}"
    try:  # a kill during the write leaves the previous checkpoint whole; a full disk or read-only folder: one line
        torch.save(checkpoint, tmp_path)
        os.replace(tmp_path, path)
        return True
    except KeyboardInterrupt:  # a second signal during the write: no half-written file is left behind
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    except (OSError, RuntimeError) as e:  # torch reports a failed write as RuntimeError
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if isinstance(e, RuntimeError) and disk_free(os.path.dirname(path)) < 2**20:  # torch's message does not say so
            reason = "No space left on device"
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        kept = "the previous one is kept" if os.path.exists(path) else "there is no earlier one"
        print(f"error: cannot write the checkpoint {path} ({reason}); {kept}", file=sys.stderr, flush=True)
        return False


# checkpoints that a script's --eval-checkpoint plays though another script wrote them (the same network and observations)
PLAYS_ALSO = {
    "ppo_atari.py": {
        "ppo_atari_envpool.py": "ale-py's games, not envpool's: the same 84x84 gray frames (4 stacked) and game settings, "
        "but after a life loss 1 no-op step here, 1 to --noop-max no-op frames in envpool"
    }
}


def disk_free(folder):
    """Bytes free on the disk holding `folder` (infinite if unknown)."""
    import shutil

    try:
        return shutil.disk_usage(folder or ".").free
    except OSError:
        return float("inf")


def load_checkpoint(path, evaluating=False):
    """Load a checkpoint as tensors and plain types only (no code can run); exit with one line if unusable."""
    if os.path.isdir(path):
        sys.exit(f"error: checkpoint '{path}' is a directory; give the file, e.g. runs/<run_name>/checkpoint.pt")
    if not os.path.isfile(path):
        sys.exit(f"error: checkpoint '{path}' does not exist")
    if not os.access(path, os.R_OK):
        sys.exit(f"error: checkpoint '{path}' cannot be read (permission denied)")
    if os.path.getsize(path) == 0:
        sys.exit(f"error: checkpoint '{path}' is empty (0 bytes): not a checkpoint")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refused what it holds, or the file is not a torch file, or cut short
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
            sys.exit(f"error: cannot load checkpoint '{path}': it holds more than tensors and plain types, refused")
        sys.exit(f"error: cannot load checkpoint '{path}': truncated or corrupt ({reason})")
    needed = {"script", "model", "optimizer", "args", "run_name", "iteration", "global_step", "rng"}
    if not isinstance(checkpoint, dict) or not needed <= checkpoint.keys():
        sys.exit(f"error: '{path}' is not a checkpoint written by this project's scripts")
    plays_also = PLAYS_ALSO.get(os.path.basename(__file__), {}) if evaluating else {}
    if checkpoint["script"] != os.path.basename(__file__) and checkpoint["script"] not in plays_also:
        sys.exit(f"error: '{path}' was written by {checkpoint['script']}; load it with that script")
    return checkpoint


def args_from_checkpoint(checkpoint):
    return Args(**{k: v for k, v in checkpoint["args"].items() if k in Args.__dataclass_fields__})


# with --resume, these flags apply when given; any other flag must keep the run's value (it would change what is learned)
RESUME_MAY_CHANGE = ["cuda", "torch_threads", "channels_last", "track", "wandb_project_name", "wandb_entity"]
RESUME_MAY_CHANGE += ["wandb_group", "wandb_tags", "bf16"]
RESUME_MAY_CHANGE += ["capture_video", "save_model", "save_every", "resume", "total_timesteps"]


def resume_args(cli, checkpoint, argv):
    """The run's settings and the RESUME_MAY_CHANGE flags given in `argv`; (args, None) or (args, a one-line error)."""
    args = args_from_checkpoint(checkpoint)
    given = {a.split("=")[0][2:].replace("-", "_") for a in argv if a.startswith("--")}
    given = {f if f in Args.__dataclass_fields__ else f.removeprefix("no_") for f in given} & Args.__dataclass_fields__.keys()
    changed = [f for f in sorted(given - set(RESUME_MAY_CHANGE)) if getattr(cli, f) != getattr(args, f)]
    if changed:
        said = ", ".join(f"--{f.replace('_', '-')} {getattr(cli, f)} (the run's: {getattr(args, f)})" for f in changed)
        return args, f"{said}: a resumed run keeps the settings it learned with; drop them, or start a new run"
    for field in given & set(RESUME_MAY_CHANGE):
        setattr(args, field, getattr(cli, field))
    args.resume, args.batch_size, args.minibatch_size, args.num_iterations = cli.resume, 0, 0, 0  # computed again
    if args.total_timesteps < checkpoint["global_step"]:
        return (
            args,
            f"--total-timesteps {args.total_timesteps} is below the {checkpoint['global_step']} steps the run has done",
        )
    return args, None


class StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop at the next safe point; a second signal stops at once (KeyboardInterrupt),
    a third exits there and then. main() makes it first, so it covers every phase; `plan()` says what the first does."""

    active = None  # the process's, once made

    def __init__(self):
        self.signum, self.raised, self.plan = None, False, lambda: "stopping"
        signal.signal(signal.SIGINT, self.handler)
        signal.signal(signal.SIGTERM, self.handler)
        StopRequest.active = self

    def handler(self, signum, frame):
        if self.raised:  # a third signal while the second one's closing goes on (envs, logs, wandb): exit now
            os._exit(128 + self.signum)
        if self.signum is not None:
            self.raised = True
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\n{signal.Signals(signum).name} received: {self.plan()} (send again to stop now)", flush=True)


def stop_requested():
    """True once Ctrl-C or SIGTERM came (an evaluation stops playing)."""
    return StopRequest.active is not None and StopRequest.active.signum is not None


def evaluate_or_stop(args, device):
    """evaluate(); after Ctrl-C / SIGTERM, the episodes played so far are reported and it exits with 128 + the signal."""
    stop = StopRequest.active or StopRequest()
    stop.plan = lambda: "stopping the evaluation; the episodes played so far are reported"
    if args.capture_video:
        keep_earlier_evaluation(args.eval_checkpoint)
    try:
        returns = evaluate(args.eval_checkpoint, args.eval_episodes, device, capture_video=args.capture_video)
    except KeyboardInterrupt:  # a second signal: at once
        sys.exit(128 + stop.signum)
    if stop.signum:
        print(f"eval: stopped by {signal.Signals(stop.signum).name} after {len(returns)} of {args.eval_episodes} episodes")
        if returns:
            print(f"eval: {len(returns)} episodes, mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
            print("eval: each episode's return, in order:", " ".join(f"{r:g}" for r in returns))
        sys.exit(128 + stop.signum)
    return returns


def keep_earlier_evaluation(checkpoint_path):
    """--capture-video: an earlier evaluation's videos in videos/<run_name>-eval/ are kept, moved to the first free
    videos/<run_name>-eval-<k>/, so that this evaluation records into videos/<run_name>-eval/ (and wandb gets its own)."""
    folder = f"videos/{load_checkpoint(checkpoint_path, evaluating=True)['run_name']}-eval"
    if os.path.isdir(folder) and os.listdir(folder):
        k = 1
        while os.path.exists(f"{folder}-{k}"):
            k += 1
        try:
            os.rename(folder, f"{folder}-{k}")
            print(f"the videos of an earlier evaluation are kept in {folder}-{k}/", flush=True)
        except OSError:  # another evaluation moved it meanwhile
            pass


def resume_folder(resume, run_name):
    """(folder, moved): a resumed run goes on in its checkpoint's folder. When that is <root>/runs/<run_name>, the run
    works from <root> (its videos/ and wandb/ beside its runs/) wherever it was started from: moved tells it went there."""
    folder = os.path.dirname(os.path.abspath(resume))
    tail = os.sep + os.path.join("runs", run_name)
    if folder.endswith(tail) and folder[: -len(tail)] != os.getcwd():
        os.chdir(folder[: -len(tail)] or os.sep)
        return folder, True
    return os.path.dirname(resume) or ".", False


def make_folder(path):
    """os.mkdir, atomic: True if this process made `path`, False if it was there (another run took it first)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path)
        return True
    except FileExistsError:
        return False


def video_recorder(envs):
    """The RecordVideo wrapper of the first environment (--capture-video), or None."""
    env = envs
    while env is not None and not isinstance(getattr(env, "envs", None), list):  # vector wrappers, to the vector env
        env = getattr(env, "env", None)
    env = env.envs[0] if env is not None else None
    while env is not None and not isinstance(env, gym.wrappers.RecordVideo):
        env = getattr(env, "env", None)
    return env


def video_numbers(folder):
    """The episode numbers of RecordVideo's videos in `folder` (rl-video-episode-<n>.mp4)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    stems = [f[len("rl-video-episode-") : -len(".mp4")] for f in names if f.startswith("rl-video-episode-")]
    return [int(s) for s in stems if s.isdigit()]


def quiet_writer_thread():
    """TensorBoard's writer thread stops quietly on a failed write (a full disk): the loop's next write raises the same
    error, which main() says in one line (threading.excepthook, for that thread alone)."""
    import threading

    default = threading.excepthook
    threading.excepthook = lambda hook: None if type(hook.thread).__name__ == "_AsyncWriterThread" else default(hook)


def evaluate(checkpoint_path, eval_episodes, device, capture_video=False):
    """Play `eval_episodes` episodes with a checkpoint's policy (actions sampled) and return their returns.

    With `capture_video`, record them into videos/{run_name}-eval/ (RecordVideo's schedule: episodes 0, 1, 8, 27, ...)."""
    checkpoint = load_checkpoint(checkpoint_path, evaluating=True)
    args = args_from_checkpoint(checkpoint)
    # an evaluation logs nothing, trains nothing (no rollout stored; main() sets the threads) and plays in float32
    args.capture_video, args.track, args.torch_threads, args.eval_checkpoint = capture_video, False, 0, checkpoint_path
    error = check_args(args)  # the training run's checks: e.g. moviepy missing, or an env that renders no video
    if error:
        sys.exit(f"error: {error}")
    torch.manual_seed(args.seed)  # the actions are sampled: the same checkpoint plays the same episodes
    envs = make_envs(args, checkpoint["run_name"] + "-eval", num_envs=1)
    agent = Agent(envs).to(device)
    agent.load_state_dict(checkpoint["model"])
    returns = []
    obs, _ = envs.reset(seed=args.seed)
    while len(returns) < eval_episodes and not stop_requested():  # Ctrl-C / SIGTERM: the episodes played so far
        with torch.no_grad():
            action, _, _, _ = agent.get_action_and_value(torch.Tensor(obs).to(device))
        obs, _, _, _, infos = envs.step(action.cpu().numpy())
        if "episode" in infos.get("final_info", {}) and infos["final_info"]["_episode"].any():
            returns.append(float(infos["final_info"]["episode"]["r"][0]))
    envs.close()
    if capture_video:
        unplayed = f"videos/{checkpoint['run_name']}-eval/rl-video-episode-{len(returns)}.mp4"
        if os.path.exists(unplayed):  # the reset after the last episode began recording one more: a frame, not played
            os.remove(unplayed)
        print(f"videos of the evaluation in videos/{checkpoint['run_name']}-eval/")
    return returns


# with --eval-checkpoint, these flags apply; any other flag given must be the checkpoint's (it plays the trained settings)
EVAL_MAY_CHANGE = ["eval_checkpoint", "eval_episodes", "capture_video", "cuda", "torch_threads", "track"]
EVAL_MAY_CHANGE += ["wandb_project_name", "wandb_entity", "wandb_group", "wandb_tags"]


def eval_args_error(cli, argv):
    """--eval-checkpoint: a one-line error for a flag in `argv` that the evaluation cannot honour (it plays the checkpoint
    with the settings it was trained with) or that is outside its domain, else None; says what differs when the
    checkpoint was written by another script (PLAYS_ALSO)."""
    error = domain_error(cli) or limits_error(cli) or (missing_piece_error(cli) if cli.track else None)
    if error:
        return error
    checkpoint = load_checkpoint(cli.eval_checkpoint, evaluating=True)
    trained = args_from_checkpoint(checkpoint)
    given = {a.split("=")[0][2:].replace("-", "_") for a in argv if a.startswith("--")}
    given = {f if f in Args.__dataclass_fields__ else f.removeprefix("no_") for f in given} & Args.__dataclass_fields__.keys()
    ignored = [f for f in sorted(given - set(EVAL_MAY_CHANGE)) if getattr(cli, f) != getattr(trained, f)]
    if ignored:
        said = [f"--{f.replace('_', '-')} {getattr(cli, f)} (the checkpoint's: {getattr(trained, f)})" for f in ignored]
        return f"{', '.join(said)}: an evaluation plays the checkpoint with the settings it was trained with; drop them"
    if checkpoint["script"] != os.path.basename(__file__):
        note = PLAYS_ALSO[os.path.basename(__file__)][checkpoint["script"]]
        print(f"playing a {checkpoint['script']} checkpoint with {os.path.basename(__file__)}: {note}", flush=True)
    return None


def track_evaluation(args, returns):
    """--eval-checkpoint --track: a wandb run of its own, `<run_name>-eval` (job type "eval", the training run's group),
    with each episode's return and, with --capture-video, the evaluation's videos at their episode."""
    import wandb

    checkpoint = load_checkpoint(args.eval_checkpoint, evaluating=True)
    trained, name = checkpoint["args"], checkpoint["run_name"] + "-eval"
    wandb.init(
        project=args.wandb_project_name,
        entity=args.wandb_entity,
        group=args.wandb_group or trained.get("wandb_group"),
        tags=list(args.wandb_tags) or None,
        job_type="eval",
        name=name,
        config={**trained, "eval_checkpoint": args.eval_checkpoint, "eval_episodes": len(returns)},
        save_code=True,
        settings=wandb.Settings(program_abspath=os.path.abspath(__file__), program_relpath=os.path.basename(__file__)),
    )
    wandb.define_metric("episode")
    wandb.define_metric("eval/*", step_metric="episode")
    wandb.define_metric("videos", step_metric="episode")
    for episode, r in enumerate(returns):
        wandb.log({"eval/episodic_return": r, "episode": episode})
    folder = f"videos/{name}"
    for file in sorted(os.listdir(folder)) if args.capture_video and os.path.isdir(folder) else []:
        if file.startswith("rl-video-episode-") and file.endswith(".mp4"):  # RecordVideo's names: the episode's index
            episode = int(file[len("rl-video-episode-") : -len(".mp4")])
            if episode < len(returns):  # not a video left from an earlier, longer evaluation of the same checkpoint
                wandb.log({"videos": wandb.Video(os.path.join(folder, file), format="mp4"), "episode": episode})
    wandb.run.summary.update({"eval/mean_return": float(np.mean(returns)), "trained_steps": checkpoint["global_step"]})
    wandb.finish()


class Run:
    """The plumbing that train() calls: the run's name and folder, its logs, --resume, the stop request, checkpoints."""

    def __init__(self, args, checkpoint=None, rank=0, world_size=1, device=None):
        self.args, self.checkpoint = args, checkpoint  # checkpoint: the one --resume continues, else None
        self.rank, self.world_size, self.device = rank, world_size, device  # torchrun's (setup_distributed)
        self.envs = self.writer = self.stop = self.at_start = self.signum = self.recorder = None
        self.name, self.dir = None, "runs"  # the other ranks: rank 0's, broadcast below
        self.saved = self.unsaved = self.updating = None  # the iteration last checkpointed, one not written, one updating
        self.tracked, self.videos_seen, self.made = False, set(), []
        self.start_iteration = self.iteration = self.completed = 1
        resumed = os.path.abspath(args.resume) if checkpoint else None
        if checkpoint:  # the run goes on in its checkpoint's folder, wherever it is started from (resume_folder)
            import warnings

            self.name, (self.dir, moved) = checkpoint["run_name"], resume_folder(args.resume, checkpoint["run_name"])
            if moved and not self.rank:
                print(f"{self.name} goes on in its own folder, {self.dir}", flush=True)
            warnings.filterwarnings("ignore", message=".*Overwriting existing videos")  # not so: numbered on (check_env)
        elif not self.rank:  # runs/{env_id}__{exp_name}__{seed}__{unix time}, taken atomically (claim)
            self.claim(f"{args.env_id}__{args.exp_name}__{args.seed}", int(time.time()))
        if not checkpoint and dist.is_initialized():  # the other ranks take rank 0's name (videos, messages)
            names = [self.name]
            dist.broadcast_object_list(names, src=0)
            self.name, self.dir = names[0], f"runs/{names[0]}"
        self.checkpoint_path = os.path.join(self.dir, "checkpoint.pt")
        if checkpoint and os.path.abspath(self.checkpoint_path) == resumed:
            self.saved = checkpoint["iteration"]  # the checkpoint resumed from is the run's own
        self.wandb_id = checkpoint["wandb_id"] if checkpoint else None
        if StopRequest.active:  # main()'s
            self.stop, StopRequest.active.plan = StopRequest.active, self.stop_plan

    def fail(self, error):
        """Exit with a one-line error, the environments and the logs closed (what a full disk lets close); the run folder
        is removed again while it is empty (the run had not started)."""
        for closable in (self.envs, self.writer):
            try:
                if closable is not None:
                    closable.close()
            except OSError:  # a full disk: closing writes the last events or video, which fails again
                pass
        if self.recorder is not None:  # a video not written: no warning about it at exit
            self.recorder.recorded_frames = []
        for folder in self.made:
            try:
                os.rmdir(folder)
            except OSError:  # not empty: the run had started
                break
        sys.exit(f"error: {error}")

    def claim(self, base, stamp):
        """Take runs/{base}__{stamp} with os.mkdir (atomic): of runs started in the same second with the same name (a
        sweep launched with &) one gets it, the next takes the next second's name (or one whose videos/ folder exists
        too), so the name keeps the form {env_id}__{exp_name}__{seed}__{unix time} (benchmark/report.py reads it)."""
        missing, parent = [], os.path.dirname(f"runs/{base}")  # runs/, or runs/ALE/ for an id like ALE/Pong-v5
        while parent and not os.path.isdir(parent):
            missing, parent = missing + [parent], os.path.dirname(parent)
        try:
            while os.path.exists(f"videos/{base}__{stamp}") or not make_folder(f"runs/{base}__{stamp}"):
                stamp += 1
        except OSError as e:
            self.fail(f"cannot write the run directory runs/{base}__{stamp} ({e.strerror or e}); run from a writable folder")
        self.name, self.dir = f"{base}__{stamp}", f"runs/{base}__{stamp}"
        self.made = [self.dir, *missing]  # removed again if the run fails before it starts

    def check_env(self, envs):
        self.envs = envs
        error = check_env(envs) or memory_error(self.args, step_bytes(envs))  # the observations' real size
        if error:
            self.fail(error)
        self.recorder = video_recorder(envs) if self.args.capture_video else None
        if self.recorder is not None and self.rank:  # torchrun: rank 0 records (all ranks' files would have one name)
            self.recorder.episode_trigger = lambda episode: False
        elif self.recorder is not None and self.checkpoint:  # resumed: numbered on after the videos there, none overwritten
            self.recorder.episode_id = max(video_numbers(self.recorder.video_folder), default=-1)
        return envs

    def restore(self, agent, optimizer):
        """The first iteration to run; with --resume, the checkpoint's weights, Adam's state and RNG states loaded."""
        if self.checkpoint:
            try:
                agent.load_state_dict(self.checkpoint["model"])
                optimizer.load_state_dict(self.checkpoint["optimizer"])
            except (RuntimeError, ValueError, KeyError) as e:
                self.fail(f"'{self.args.resume}' does not fit this network: {str(e).strip().splitlines()[0]}")
            self.start_iteration = self.checkpoint["iteration"] + 1
            set_rng_states(self.checkpoint["rng"])
            if self.world_size > 1:  # the checkpoint holds rank 0's generators: each rank draws its own stream again
                torch.manual_seed(int(torch.randint(2**31 - 1, ())) + self.rank)
        self.agent = agent  # the parameters compared over the ranks at the end
        self.completed = self.start_iteration - 1
        return self.start_iteration

    def open_writer(self):
        """The run folder (writable, or one line before anything is trained), wandb with --track, then TensorBoard."""
        folder = self.dir if self.rank == 0 else os.path.dirname(self.dir) or "."
        try:  # rank 0's run folder: the other ranks write nothing
            os.makedirs(folder, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            self.fail(f"cannot write the run directory {self.dir} ({e.strerror or e}); run from a writable folder")
        if self.rank:
            self.writer = NullWriter()
            return self.writer
        if self.args.track:
            import wandb

            wandb.init(
                project=self.args.wandb_project_name,
                entity=self.args.wandb_entity,
                group=self.args.wandb_group,
                tags=list(self.args.wandb_tags) or None,  # None: WANDB_TAGS, if set
                sync_tensorboard=True,
                config=vars(self.args),
                name=self.name,
                id=self.wandb_id,  # on resume the same wandb run goes on
                resume="allow",
                save_code=True,  # the script that ran, wherever it was started from (wandb's code view and comparer)
                settings=wandb.Settings(program_abspath=os.path.abspath(__file__), program_relpath=os.path.basename(__file__)),
            )
            wandb.define_metric("global_step")  # TensorBoard's step
            wandb.define_metric("videos", step_metric="global_step")
            self.wandb_id, self.tracked, self.videos_seen = wandb.run.id, True, set(self.video_files())
        # on resume, the events an interrupted run logged after its checkpoint are purged
        purge_step = (self.start_iteration - 1) * self.args.batch_size + 1 if self.checkpoint else None
        quiet_writer_thread()  # a failed write (a full disk): one line from main(), no thread's traceback
        self.writer = SummaryWriter(self.dir, purge_step=purge_step)
        # each segment's settings at its first step: a resume may change --bf16, --channels-last, --total-timesteps
        self.writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(self.args).items()])),
            global_step=purge_step - 1 if self.checkpoint else 0,
        )
        return self.writer

    def env_seed(self):
        """The seed of the first reset: --seed; on resume one drawn from the restored generator (the episodes restart)."""
        return int(np.random.randint(2**31 - 1)) if self.checkpoint else self.args.seed

    def iterations(self, start_iteration, device):
        """The iterations to run, until the last or a stop request (Ctrl-C / SIGTERM, caught from main()'s start)."""
        if self.stop is None:  # a Run used without main()
            self.stop = StopRequest()
            self.stop.plan = self.stop_plan
        print(
            f"training {self.name} on {device}: iterations {start_iteration}..{self.args.num_iterations} of "
            f"{self.args.batch_size} steps",
            flush=True,
        )
        for iteration in range(start_iteration, self.args.num_iterations + 1):
            if self.stopping():
                return
            # a rollout cut short checkpoints the iteration before it, with the state at its start
            self.iteration, self.at_start, self.updating = iteration, self.snapshot(), None
            yield iteration

    def stopping(self):
        stop = all_ranks_stop(self.stop, self.world_size, self.device)
        self.updating = None if stop else self.iteration  # after its rollout: the iteration will be whole
        return stop

    def stop_plan(self):
        """What a first signal does, said when it comes: a checkpoint only if an iteration is (or will be) whole."""
        if self.at_start is not None and max(self.completed, self.updating or 0) >= self.start_iteration:
            return "stopping after a checkpoint"
        return f"stopping before iteration {self.start_iteration} is whole: {self.kept()}"

    def kept(self):
        """The checkpoint the run keeps, in words."""
        if self.saved is not None:
            return f"the checkpoint of iteration {self.saved} stays ({self.checkpoint_path})"
        if os.path.exists(self.checkpoint_path):
            return f"the checkpoint {self.checkpoint_path} stays"
        return "there is no checkpoint"

    def snapshot(self):
        """What a checkpoint holds beside the weights and Adam's state (the RNG states, ...), taken now."""
        return {"rng": rng_states()}

    def save(self, iteration, agent, optimizer, state):
        """Write a checkpoint of `iteration` with `state` (a snapshot); False if it could not be written."""
        rng, path = state["rng"], self.checkpoint_path
        if self.rank:  # rank 0 writes the checkpoints
            return None
        return save_checkpoint(path, agent, optimizer, self.args, self.name, iteration, rng, self.wandb_id)

    def video_files(self):
        """The videos of the run's first env (--capture-video) as (path, modification time): each a finished episode."""
        folder = f"videos/{self.name}"
        files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        return [(os.path.join(folder, f), os.stat(os.path.join(folder, f)).st_mtime_ns) for f in files if f.endswith(".mp4")]

    def upload_videos(self):
        """With --capture-video --track: each video written since the last call goes to the wandb run, at the global step
        of the iteration in which its episode ended (RecordVideo writes the file then)."""
        if self.tracked and self.args.capture_video:
            import wandb

            for path, mtime in sorted(set(self.video_files()) - self.videos_seen, key=lambda f: (f[1], f[0])):
                wandb.log({"videos": wandb.Video(path, format="mp4"), "global_step": self.completed * self.args.batch_size})
                self.videos_seen.add((path, mtime))

    def iteration_done(self, iteration, agent, optimizer):
        """With --save-model, a checkpoint every --save-every iterations and after the last; the new videos to wandb."""
        self.completed = iteration
        self.upload_videos()
        at_save_point = self.args.save_every and iteration % self.args.save_every == 0
        if self.args.save_model and (at_save_point or iteration == self.args.num_iterations):
            self.write_checkpoint(iteration, agent, optimizer, self.snapshot())

    def write_checkpoint(self, iteration, agent, optimizer, state):
        """save(), remembered: the iteration last written, or one that could not be (finish() then exits 1)."""
        written = self.save(iteration, agent, optimizer, state)
        if written:
            self.saved, self.unsaved = iteration, None
        elif written is False:
            self.unsaved = iteration
        return written

    def save_if_stopped(self, agent, optimizer):
        """After a stop request: a checkpoint of the last completed iteration (no lost work), and how to continue."""
        if not self.stopping() or self.rank:
            return
        if self.at_start is None or self.completed < self.start_iteration:
            print(f"stopped before iteration {self.start_iteration} was whole: {self.kept()}", flush=True)
            return
        if self.saved != self.completed:  # not written yet (a signal during the last write: it is)
            state = self.snapshot() if self.completed == self.iteration else self.at_start
            if not self.write_checkpoint(self.completed, agent, optimizer, state):
                return
        step = self.completed * self.args.batch_size
        print(f"checkpoint of iteration {self.completed} (step {step}) written to {self.checkpoint_path}")
        if self.completed < self.args.num_iterations:
            print(f"continue with: python {os.path.basename(__file__)} --resume {self.checkpoint_path}")

    def close(self):
        """After a second signal (stop at once): the environments and the logs closed, no checkpoint."""
        self.signum = (self.stop.signum if self.stop else None) or signal.SIGINT
        for closable in (self.envs, self.writer):
            if closable is not None:
                closable.close()
        if not self.rank:
            print(f"stopped at once: {self.kept()}", flush=True)

    def write_error(self, e):
        """One line for a write that failed while logging or recording (a full disk, a read-only folder); any other
        error is raised again."""
        import traceback

        code = " ".join(frame.f_code.co_filename for frame, _ in traceback.walk_tb(e.__traceback__))
        if "tensorboard" in code:
            what = f"the TensorBoard events in {self.dir}"
        elif "moviepy" in code or os.path.join("gymnasium", "wrappers", "rendering") in code:
            what = f"a video in {self.recorder.video_folder if self.recorder else 'videos/'}"
        else:
            raise e
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        when = f"at iteration {self.iteration}" if self.at_start is not None else "before training"
        return f"cannot write {what} ({reason}); stopped {when}: {self.kept()}"

    def finish(self):
        """Exit: 0, 1 if the last checkpoint could not be written, or 128 + the signal that stopped the run; wandb is told."""
        signum = self.signum or (self.stop.signum if self.stop else None)
        exit_code = 128 + signum if signum else 1 if self.unsaved else 0  # 1: the last checkpoint was not written
        distributed = dist.is_initialized()
        if distributed and not signum:  # all-reduced gradients, equal steps: every rank holds the same parameters
            flat = torch.cat([p.detach().flatten() for p in self.agent.parameters()])
            low, high = flat.clone(), flat.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            if not torch.equal(low, high):
                sys.exit(f"error: rank {self.rank}'s parameters differ from another rank's (max gap {(high - low).max():.3g})")
            print(f"rank {self.rank}: parameters bit-identical on all {self.world_size} ranks", flush=True)
        if distributed:  # gloo's and nccl's threads end before the interpreter does
            dist.destroy_process_group()
        if self.tracked:
            import wandb

            try:
                self.upload_videos()  # those the envs wrote when closed
                wandb.finish(exit_code=exit_code)
            except KeyboardInterrupt:  # a second signal while wandb finishes: stop there (`wandb sync` sends the rest)
                exit_code = 128 + self.stop.signum
        # all is written: exit now, without the interpreter's teardown (gloo's worker thread may still be freeing the last
        # all-reduce's tensors, which takes the GIL: during the teardown that aborts the process, SIGABRT)
        if distributed:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(exit_code)
        sys.exit(exit_code)


def exit_once(code, rank):
    """Leave before the process group (`code`: an error line, or --help's 0): ranks above 0 at once, with 0 and silent, rank
    0 once they are gone, so torchrun's report of a failed worker (a traceback and a summary, always) names rank 0 alone."""
    if rank or not code:
        sys.exit(0 if rank else code)
    if isinstance(code, str) and os.environ.get("TORCHELASTIC_ERROR_FILE"):  # the summary's message: this line
        info = {"py_callstack": code, "timestamp": str(int(time.time()))}
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w", encoding="utf-8") as f:
            json.dump({"message": {"message": code, "extraInfo": info}}, f)
    deadline = time.time() + 10
    while "TORCHELASTIC_RUN_ID" in os.environ and other_workers() and time.time() < deadline:
        time.sleep(0.05)
    sys.exit(code)


def other_workers():
    """How many of torchrun's other workers still run here: the live children of this one's parent (Linux's /proc)."""
    count = 0
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()] if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            count += int(ppid) == os.getppid() and state != "Z"
        except (OSError, ValueError):  # gone meanwhile
            pass
    return count


def start(rank):
    """main() up to the process group: the flags, an evaluation (rank 0 plays), --resume, the ranks; all checked first."""
    args = tyro.cli(Args)
    if args.eval_checkpoint:
        if rank:  # rank 0 plays
            sys.exit(0)
        error = eval_args_error(args, sys.argv[1:])  # a flag it cannot honour, outside its domain, or wandb missing
        if error:
            sys.exit(f"error: {error}")
        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
        returns = evaluate_or_stop(args, device)  # Ctrl-C / SIGTERM: the episodes played so far, exit 128 + signal
        print(f"eval: {len(returns)} episodes, mean return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
        print("eval: each episode's return, in order:", " ".join(f"{r:g}" for r in returns))
        if args.track:
            track_evaluation(args, returns)
        sys.exit(0)
    checkpoint = None
    if args.resume:  # the run continues with its own settings, but for RESUME_MAY_CHANGE (a larger total extends it)
        checkpoint = load_checkpoint(args.resume)
        args, error = resume_args(args, checkpoint, sys.argv[1:])
        if error:
            sys.exit(f"error: {error}")
    error = check_args(args)
    if error:
        sys.exit(f"error: {error}")
    rank, world_size, device, error = setup_distributed(args)
    if error:
        sys.exit(f"error: {error}")
    return args, checkpoint, rank, world_size, device


def main():
    StopRequest()  # Ctrl-C / SIGTERM from here on: every phase stops cleanly (Run says what the first signal does)
    rank = int(os.environ["RANK"]) if "TORCHELASTIC_RUN_ID" in os.environ else 0  # torchrun's (setup_distributed checks)
    streams = sys.stdout, sys.stderr
    if rank:  # until the process group every rank runs the same checks: rank 0 alone says what they find
        sys.stdout = sys.stderr = open(os.devnull, "w")
    try:
        args, checkpoint, rank, world_size, device = start(rank)
    except SystemExit as e:
        exit_once(e.code, rank)
    sys.stdout, sys.stderr = streams
    run = Run(args, checkpoint, rank, world_size, device)
    if checkpoint and checkpoint["iteration"] >= args.num_iterations:
        print(f"{run.name} is complete ({checkpoint['global_step']} steps); a larger --total-timesteps extends it")
        sys.exit(0)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)  # speed: tiny matmuls lose more to thread hand-offs than they gain
    try:
        train(args, run)
    except gym.error.DependencyNotInstalled as e:  # e.g. Box2D for LunarLander: gymnasium's message says what to install
        run.fail(f"{args.env_id} needs a package that is not installed: {str(e).strip().splitlines()[0]}")
    except KeyboardInterrupt:  # a second signal: stop at once, the logs closed
        run.close()
    except OSError as e:  # a full disk or a read-only folder while logging or recording: one line, what is kept
        run.fail(run.write_error(e))
    run.finish()


if __name__ == "__main__":
    main()

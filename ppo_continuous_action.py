# PPO for continuous actions (MuJoCo): the 13 core details and the 9 continuous ones. Parent: ppo.py.
import atexit
import collections
import contextlib
import importlib.metadata
import importlib.util
import itertools
import math
import os
import random
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
from torch.utils.tensorboard import SummaryWriter

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
    torch_threads: int = 1
    """CPU threads for torch (0: torch's own, all cores, the CNN scripts' default); 1 suits MLPs and shared machines"""
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
    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    orthogonal_init: bool = True
    """if toggled, orthogonal weight init, constant 0 bias (core-2; off: PyTorch's default init of linear and conv layers)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-5
    """the epsilon of Adam (core-3; ppo2: 1e-5, PyTorch's default: 1e-8)"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """if toggled, learning rate annealing for policy and value networks (core-4)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    shuffle_minibatches: bool = True
    """if toggled, shuffling before each epoch's mini-batches (core-6; off: the same order every epoch)"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """if toggled, the advantages are normalized per minibatch (core-7)"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    anneal_clip: bool = False
    """if toggled, annealing of the clipping coefficient to 0 with the learning-rate schedule (aux-1)"""
    clip_vloss: bool = True
    """if toggled, the value loss is clipped, as in ppo2 (core-9)"""
    ent_coef: float = 0.0
    """coefficient of the entropy (core-10; 0: no entropy bonus)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    clip_grad_norm: bool = True
    """if toggled, global gradient clipping to max_grad_norm (core-11; off: no clipping)"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL: the update's remaining epochs are skipped once an epoch's last minibatch exceeds it (aux-3)"""
    clip_action: bool = True
    """if toggled, clipping actions to the action space's bounds before the env (continuous-5; off: the env gets the sample)"""
    norm_obs: bool = True
    """if toggled, observation normalization by the running mean and std (continuous-6; off: no clipping either, as ppo2)"""
    clip_obs: bool = True
    """if toggled, clipping the observations to [-10, 10] (continuous-7)"""
    norm_reward: bool = True
    """if toggled, rewards scaled by the discounted return's running std (continuous-8; off: no clipping either, as ppo2)"""
    clip_reward: bool = True
    """if toggled, clipping the rewards to [-10, 10] after scaling (continuous-9)"""
    bootstrap_truncated: bool = False
    """at a time-limit truncation, bootstrap with the value of the final observation (off: treated as terminal, as ppo2)"""

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


def make_env(env_id, idx, capture_video, run_name, clip_action=True):
    def thunk():
        if capture_video and idx == 0:
            os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; MuJoCo is first imported by gym.make
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        env = env if isinstance(env.observation_space, gym.spaces.Box) else gym.wrappers.FlattenObservation(env)  # Dict: flat
        env = gym.wrappers.RecordEpisodeStatistics(env)
        # detail continuous-5: the env clips actions to its bounds; the unclipped sample is stored and scored
        env = gym.wrappers.ClipAction(env) if clip_action and isinstance(env.action_space, gym.spaces.Box) else env
        return env

    return thunk


def make_envs(args, run_name, num_envs=None):
    if args.env_id.startswith("dm_control/"):  # dm_control's tasks, through shimmy (an optional install: README)
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless; dm_control picks its renderer when imported
        gym.register_envs(importlib.import_module("shimmy"))
    # detail core-1: vectorized architecture (N envs stepped together; ppo2 autoreset: same step)
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name, args.clip_action) for i in range(num_envs or args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return VecNormalize(envs, args.gamma, switches=(args.norm_obs, args.clip_obs, args.norm_reward, args.clip_reward))


class RunningMeanStd:
    """ppo2's running mean and variance of everything seen, merged with each batch x of shape (n, *shape)."""

    def __init__(self, shape=(), epsilon=1e-4):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), epsilon

    def update(self, x):
        n = x.shape[0]
        batch_mean = x.sum(0) / n  # np.mean and np.var bit for bit, without their per-call overhead
        batch_var = ((x - batch_mean) * (x - batch_mean)).sum(0) / n
        delta, tot_count = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / tot_count
        m2 = self.var * self.count + batch_var * n + np.square(delta) * self.count * n / tot_count
        self.var, self.count = m2 / tot_count, tot_count


class VecNormalize(gym.vector.VectorWrapper):
    """ppo2's VecNormalize: one set of running statistics for all envs, frozen while `training` is False."""

    def __init__(self, envs, gamma, clip=10.0, epsilon=1e-8, switches=(True, True, True, True)):
        super().__init__(envs)
        self.norm_obs, self.clip_obs, self.norm_reward, self.clip_reward = switches  # continuous-6 to -9 (ablations)
        self.obs_rms, self.ret_rms = RunningMeanStd(shape=envs.single_observation_space.shape), RunningMeanStd(shape=())
        self.rms = {"obs": self.obs_rms, "ret": self.ret_rms}
        self.returns, self.gamma, self.clip, self.epsilon, self.training = np.zeros(envs.num_envs), gamma, clip, epsilon, True

    def normalize(self, obs, update=True):
        if self.training and update:
            self.obs_rms.update(obs)
        # detail continuous-6: observation normalization, (obs - running mean) / running std
        obs = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon) if self.norm_obs else obs
        # detail continuous-7: observation clipping to [-10, 10] (of normalized observations only, as ppo2's `if self.ob_rms`)
        return (np.clip(obs, -self.clip, self.clip) if self.norm_obs and self.clip_obs else obs).astype(np.float32)

    def reset(self, **kwargs):
        obs, infos = self.env.reset(**kwargs)
        self.returns[:] = 0
        return self.normalize(obs), infos

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        # detail continuous-8: reward scaling, divided by the running std of the discounted return (--gamma; ppo2: 0.99)
        self.returns = self.returns * self.gamma + rewards
        if self.training:
            self.ret_rms.update(self.returns)
        rewards = rewards / np.sqrt(self.ret_rms.var + self.epsilon) if self.norm_reward else rewards
        # detail continuous-9: reward clipping to [-10, 10] (of scaled rewards only, as ppo2's `if self.ret_rms`)
        rewards = np.clip(rewards, -self.clip, self.clip) if self.norm_reward and self.clip_reward else rewards
        self.returns[terminations | truncations] = 0
        obs = self.normalize(obs)
        for i in np.flatnonzero(infos.get("_final_obs", [])):  # an ended episode's last obs: normalized, not counted
            infos["final_obs"][i] = self.normalize(infos["final_obs"][i], update=False)
        return obs, rewards, terminations, truncations, infos

    def state_dict(self):  # float64 tensors: checkpoints load with weights_only=True
        return {n: [torch.tensor(x, dtype=torch.float64) for x in (r.mean, r.var, r.count)] for n, r in self.rms.items()}

    def load_state_dict(self, state):
        for n, r in self.rms.items():
            r.mean, r.var, r.count = (x.numpy() for x in state[n])


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
    def __init__(self, envs):
        super().__init__()
        obs_dim = np.array(envs.single_observation_space.shape).prod()
        # detail core-13: separate MLP networks for policy and value (64-64 tanh each)
        # detail continuous-4: separate 64-64 tanh actor (action mean, head std 0.01) and critic (head std 1.0)
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, int(np.prod(envs.single_action_space.shape))), std=0.01),
        )
        # detail continuous-2: state-independent log standard deviation, a parameter initialised to 0
        self.actor_logstd = nn.Parameter(torch.zeros(1, int(np.prod(envs.single_action_space.shape))))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        action_mean = self.actor(x)
        # detail continuous-1: actions from a Normal distribution (mean from the actor, std = exp(logstd))
        action_std = self.actor_logstd.expand_as(action_mean).exp()
        # the Normal distribution written out: torch's formulas, sampler and order of operations (so the same
        # bits, gradients included) without its per-call overhead
        if action is None:
            action = torch.normal(action_mean, action_std)
        var, log_std = action_std**2, action_std.log()
        logprob = -((action - action_mean) ** 2) / (2 * var) - log_std - math.log(math.sqrt(2 * math.pi))
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + action_std.log()  # the log taken anew, as torch does
        # detail continuous-3: independent action components, log-probs and entropies summed over the dimensions
        return action, logprob.sum(1), entropy.sum(1), self.critic(x)


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


def bootstrap_truncated(rewards, terminations, truncations, infos, value_fn, gamma):
    """Rewards where a time-limit truncation (not a termination) adds gamma * V(final obs): the episode would go on."""
    rewards = np.array(rewards, dtype=np.float64)
    cut = np.flatnonzero(truncations & ~terminations & infos.get("_final_obs", False))
    if len(cut):
        with torch.no_grad():
            rewards[cut] += gamma * value_fn(np.stack(infos["final_obs"][cut]))
    return rewards


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
    check_env(envs)  # one line naming the script to use, if this one cannot take these envs

    agent = Agent(envs).to(device)
    if not args.orthogonal_init:  # core-2 switched off: PyTorch's own init
        torch_default_init(agent)
    optimizer = make_optimizer(agent, args)
    start_iteration = restore(checkpoint, agent, optimizer, envs) if checkpoint else 1  # weights, Adam, RNGs
    global_step = (start_iteration - 1) * args.batch_size
    writer = open_logs(args, run_name, run_dir, checkpoint, device)  # TensorBoard (+ wandb with --track); curves go on
    stop = catch_signals()  # Ctrl-C / SIGTERM: the run stops after the current iteration, with a checkpoint

    # ALGO LOGIC: storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    start_time, start_step, last_print, recent_returns = time.time(), global_step, 0.0, []
    next_obs, _ = envs.reset(seed=int(np.random.randint(2**31 - 1)) if checkpoint else args.seed)  # resumed: a seed drawn now
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.zeros(args.num_envs).to(device)
    value_of = lambda o: agent.get_value(torch.as_tensor(o, device=device)).flatten().cpu().numpy()  # numpy in and out

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

            # ALGO LOGIC: action logic
            with torch.inference_mode():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            if args.bootstrap_truncated:
                reward = bootstrap_truncated(reward, terminations, truncations, infos, value_of, args.gamma)
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
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        stats = []
        for _epoch in range(args.update_epochs):
            if args.shuffle_minibatches:  # detail core-6: mini-batch updates, shuffled each epoch, each sample once an epoch
                np.random.shuffle(b_inds)
            for start in range(0, len(b_inds), args.minibatch_size):
                mb_inds = torch.from_numpy(b_inds[start : start + args.minibatch_size]).to(device)
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
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
OWN_PLUMBING = ["check_args", "check_env", "evaluate"]

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
    if args.env_id.startswith("dm_control/") and not importlib.util.find_spec("shimmy"):
        return "dm_control's tasks need dm_control and shimmy: pip install -r requirements-dm_control.txt"
    if args.env_id.startswith("dm_control/") and int(importlib.metadata.version("mujoco").split(".")[0]) >= 4:
        return "dm_control 1.0.50 fails on MuJoCo 4: pip install -r requirements-dm_control.txt (it installs MuJoCo 3.17)"
    return None


def check_env(envs):
    """Exit with one line naming the script to use when this one cannot take the envs."""
    if not isinstance(envs.single_action_space, gym.spaces.Box) or len(envs.single_observation_space.shape or ()) != 1:
        sys.exit("error: this script takes Box (continuous) actions, flat observations (Discrete actions: ppo.py)")


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
    envs.load_state_dict(checkpoint["normalize"])
    envs.training = False  # the statistics are used frozen
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

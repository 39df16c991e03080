# PPO for discrete-action classic control: the 13 core details. Parent of every other variant (see README.md).
import importlib.util
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

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter


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
    """CPU threads for torch (0: torch's default); 1 is fastest for small networks and for runs sharing a machine"""
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
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    orthogonal_init: bool = True
    """Toggle orthogonal weight init with constant 0 bias (core-2; off: PyTorch's default init of linear and conv layers)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    adam_eps: float = 1e-5
    """the epsilon of Adam (core-3; ppo2: 1e-5, PyTorch's default: 1e-8)"""
    num_envs: int = 4
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
    clip_coef: float = 0.2
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


def make_env(env_id, idx, capture_video, run_name):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return thunk


def make_envs(args, run_name, num_envs=None):
    # detail core-1: vectorized architecture (N envs stepped together; ppo2 autoreset: same step)
    return gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(num_envs or args.num_envs)],
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
    def __init__(self, envs):
        super().__init__()
        obs_dim = np.array(envs.single_observation_space.shape).prod()
        # detail core-13: separate MLP networks for policy and value (64-64 tanh each)
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
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        # the Categorical distribution written out: torch's formulas, sampler and order of operations (so the same
        # bits, gradients included) without its per-call overhead
        log_p = logits - logits.logsumexp(-1, keepdim=True)  # normalized log-probabilities
        if action is None:
            action = torch.multinomial(log_p.softmax(-1), 1, True).view(-1)
        logprob = log_p.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p * log_p.softmax(-1)).sum(-1)
        return action, logprob, entropy, self.critic(x)


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
    # detail core-11: global gradient clipping, the norm over all parameters at most max_grad_norm (0.5)
    if clip:
        nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], max_grad_norm, foreach=True)
    optimizer.step()


def train(args, run):
    """The PPO loop, CleanRL's order; `run` (below the fence) does the plumbing: checks, logs, resume, stop, checkpoints."""
    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = run.check_env(make_envs(args, run.name))  # one line naming the script to use, if this one cannot take them

    agent = Agent(envs).to(device)
    if not args.orthogonal_init:  # core-2 switched off: PyTorch's own init
        torch_default_init(agent)
    optimizer = make_optimizer(agent, args)
    start_iteration = run.restore(agent, optimizer)  # --resume: the weights, Adam's state and the RNG states
    global_step = (start_iteration - 1) * args.batch_size
    writer = run.open_writer()  # TensorBoard in runs/{run_name} (+ wandb with --track); a resumed run's curves go on

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    start_time, start_step, last_print, recent_returns = time.time(), global_step, 0.0, []
    next_obs, _ = envs.reset(seed=run.env_seed())  # --seed; on resume a seed drawn now: the episodes start anew
    next_obs = torch.as_tensor(next_obs, device=device)
    next_done = torch.zeros(args.num_envs).to(device)

    for iteration in run.iterations(start_iteration, device):  # ends early after Ctrl-C / SIGTERM
        # detail core-4: learning-rate annealing, linearly from lr to 0 over the iterations
        frac = 1.0 - (iteration - 1.0) / args.num_iterations
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        # detail aux-1: clip-range annealing, same schedule as the learning rate (off by default)
        clip_coef = frac * args.clip_coef if args.anneal_clip else args.clip_coef

        for step in range(args.num_steps):
            if run.stop.signum:  # Ctrl-C / SIGTERM: this rollout is dropped (the checkpoint is of the iteration before)
                break
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
        b_inds = np.arange(args.batch_size)
        stats = []
        for _epoch in range(args.update_epochs):
            for mb_inds in minibatches(b_inds, args.minibatch_size, args.shuffle_minibatches):
                mb_inds = torch.from_numpy(mb_inds).to(device)
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
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
            if args.target_kl is not None and mb_stats[4].item() > args.target_kl:
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
        run.iteration_done(iteration, agent, optimizer)  # --save-model: a checkpoint every --save-every iterations

    run.save_if_stopped(agent, optimizer)  # after Ctrl-C / SIGTERM: the last whole iteration, to continue with --resume
    envs.close()
    writer.close()


# ==== plumbing, not PPO: checks, checkpoints, resume, signals, evaluation ====
# this script's own plumbing; the rest of this section is the same in every script (tools/lineage.py --check-shared)
OWN_PLUMBING = ["check_args", "check_env", "evaluate"]


# the domain of each numeric flag, checked before anything starts: (field, test, what is allowed); NaN fails every test
FLAG_DOMAINS = [
    ("seed", lambda v: 0 <= v < 2**32, "an integer in [0, 2**32)"),
    ("total_timesteps", lambda v: v >= 1, "at least 1"),
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
    ("torch_threads", lambda v: v >= 0, "at least 0 (0: torch's default)"),
    ("save_every", lambda v: v >= 0, "at least 0 (0: a checkpoint only at the end)"),
    ("eval_episodes", lambda v: v >= 1, "at least 1"),
    ("max_episode_frames", lambda v: v is None or v >= 1, "at least 1 (or left out: ppo2's, 400000; SpaceInvaders 300000)"),
    ("frame_stack", lambda v: v >= 1, "at least 1"),
]


def domain_error(args):
    """A one-line error for the first flag outside its domain (the flag, its value, what is allowed), else None."""
    for field, ok, allowed in FLAG_DOMAINS:
        if hasattr(args, field) and not ok(getattr(args, field)):
            return f"--{field.replace('_', '-')} {getattr(args, field)} is not allowed: it must be {allowed}"
    return None


def missing_piece_error(args):
    """A one-line error naming what to install or set for an optional piece the flags ask for, else None."""
    if getattr(args, "bf16", False) and bf16_error(args):
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
    """--bf16 where bfloat16 is not native (emulated: slower than float32), a one-line error; else None."""
    if args.cuda and torch.cuda.is_available():
        return None if torch.cuda.is_bf16_supported() else "--bf16: this GPU has no bfloat16 support; drop --bf16"
    if cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}:  # x86's AVX512-BF16 or AMX-BF16, Arm's BF16
        return None
    return (
        "--bf16 needs a CPU with AVX512-BF16 or AMX-BF16 (or a GPU): this one has neither, and emulated bfloat16 is "
        "slower than float32; drop --bf16 (--channels-last alone is the same math, faster)"
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
    error = domain_error(args) or missing_piece_error(args)
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
    return None


def check_env(envs):
    """Return a one-line error when this script cannot handle the environment, else None."""
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        return (
            f"{os.path.basename(__file__)} needs a Discrete action space, but the environment has "
            f"{envs.single_action_space}; for Box (continuous) actions use ppo_continuous_action.py"
        )
    if len(envs.single_observation_space.shape) != 1:
        return (
            f"{os.path.basename(__file__)} needs flat (1-D) observations, but the environment's have shape "
            f"{envs.single_observation_space.shape}; for image observations use ppo_atari.py"
        )
    return None


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
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"error: cannot write the checkpoint {path} ({reason}); the previous one is kept", file=sys.stderr, flush=True)
        return False


def load_checkpoint(path):
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
    if checkpoint["script"] != os.path.basename(__file__):
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
    """Ctrl-C or SIGTERM asks the loop to stop at the next safe point; a second signal stops at once."""

    def __init__(self):
        self.signum = None
        signal.signal(signal.SIGINT, self.handler)
        signal.signal(signal.SIGTERM, self.handler)

    def handler(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\n{signal.Signals(signum).name} received: stopping after a checkpoint (send again to stop now)", flush=True)


def evaluate(checkpoint_path, eval_episodes, device, capture_video=False):
    """Play `eval_episodes` episodes with a checkpoint's policy (actions sampled) and return their returns.

    With `capture_video`, record them into videos/{run_name}-eval/ (RecordVideo's schedule: episodes 0, 1, 8, 27, ...)."""
    checkpoint = load_checkpoint(checkpoint_path)
    args = args_from_checkpoint(checkpoint)
    args.capture_video, args.track = capture_video, False  # an evaluation logs nothing
    error = check_args(args)  # the training run's checks: e.g. moviepy missing, or an env that renders no video
    if error:
        sys.exit(f"error: {error}")
    torch.manual_seed(args.seed)  # the actions are sampled: the same checkpoint plays the same episodes
    envs = make_envs(args, checkpoint["run_name"] + "-eval", num_envs=1)
    agent = Agent(envs).to(device)
    agent.load_state_dict(checkpoint["model"])
    returns = []
    obs, _ = envs.reset(seed=args.seed)
    while len(returns) < eval_episodes:
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


def track_evaluation(args, returns):
    """--eval-checkpoint --track: a wandb run of its own, `<run_name>-eval` (job type "eval", the training run's group),
    with each episode's return and, with --capture-video, the evaluation's videos at their episode."""
    import wandb

    checkpoint = load_checkpoint(args.eval_checkpoint)
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

    def __init__(self, args, checkpoint=None):
        self.args, self.checkpoint = args, checkpoint  # checkpoint: the one --resume continues, else None
        run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.name = checkpoint["run_name"] if checkpoint else run_name
        self.checkpoint_path = f"runs/{self.name}/checkpoint.pt"
        self.wandb_id = checkpoint["wandb_id"] if checkpoint else None
        self.envs = self.writer = self.stop = self.at_start = self.signum = None
        self.tracked, self.videos_seen = False, set()
        self.start_iteration = self.iteration = self.completed = 1

    def fail(self, error):
        """Exit with a one-line error, the environments closed."""
        if self.envs is not None:
            self.envs.close()
        sys.exit(f"error: {error}")

    def check_env(self, envs):
        self.envs = envs
        error = check_env(envs)
        if error:
            self.fail(error)
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
        self.completed = self.start_iteration - 1
        return self.start_iteration

    def open_writer(self):
        """The run folder (writable, or one line before anything is trained), wandb with --track, then TensorBoard."""
        try:
            os.makedirs(f"runs/{self.name}", exist_ok=True)
            with tempfile.TemporaryFile(dir=f"runs/{self.name}"):
                pass
        except OSError as e:
            self.fail(f"cannot write the run directory runs/{self.name} ({e.strerror or e}); run from a writable folder")
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
        self.writer = SummaryWriter(f"runs/{self.name}", purge_step=purge_step)
        if not self.checkpoint:
            self.writer.add_text(
                "hyperparameters",
                "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(self.args).items()])),
            )
        return self.writer

    def env_seed(self):
        """The seed of the first reset: --seed; on resume one drawn from the restored generator (the episodes restart)."""
        return int(np.random.randint(2**31 - 1)) if self.checkpoint else self.args.seed

    def iterations(self, start_iteration, device):
        """The iterations to run, until the last or a stop request (Ctrl-C / SIGTERM, caught from here on)."""
        self.stop = StopRequest()
        print(
            f"training {self.name} on {device}: iterations {start_iteration}..{self.args.num_iterations} of "
            f"{self.args.batch_size} steps",
            flush=True,
        )
        for iteration in range(start_iteration, self.args.num_iterations + 1):
            if self.stopping():
                return
            # a rollout cut short checkpoints the iteration before it, with the state at its start
            self.iteration, self.at_start = iteration, self.snapshot()
            yield iteration

    def stopping(self):
        return self.stop.signum is not None

    def snapshot(self):
        """What a checkpoint holds beside the weights and Adam's state (the RNG states, ...), taken now."""
        return {"rng": rng_states()}

    def save(self, iteration, agent, optimizer, state):
        """Write a checkpoint of `iteration` with `state` (a snapshot); False if it could not be written."""
        rng, path = state["rng"], self.checkpoint_path
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
            self.save(iteration, agent, optimizer, self.snapshot())

    def save_if_stopped(self, agent, optimizer):
        """After a stop request: a checkpoint of the last completed iteration (no lost work), and how to continue."""
        if self.stopping() and self.at_start is not None and self.completed >= self.start_iteration:
            state = self.snapshot() if self.completed == self.iteration else self.at_start
            if self.save(self.completed, agent, optimizer, state):
                step = self.completed * self.args.batch_size
                print(f"checkpoint of iteration {self.completed} (step {step}) written to {self.checkpoint_path}")
                print(f"continue with: python {os.path.basename(__file__)} --resume {self.checkpoint_path}")

    def close(self):
        """After a second signal (stop at once): the environments and the logs closed, no checkpoint."""
        self.signum = (self.stop.signum if self.stop else None) or signal.SIGINT
        for closable in (self.envs, self.writer):
            if closable is not None:
                closable.close()

    def finish(self):
        """Exit: 0, or 128 + the signal that stopped the run; wandb is told."""
        signum = self.signum or (self.stop.signum if self.stop else None)
        exit_code = 128 + signum if signum else 0
        if self.tracked:
            import wandb

            self.upload_videos()  # those the envs wrote when closed
            wandb.finish(exit_code=exit_code)
        sys.exit(exit_code)


def main():
    args = tyro.cli(Args)
    error = missing_piece_error(args) if args.eval_checkpoint and args.track else None  # wandb or its credentials
    if error:
        sys.exit(f"error: {error}")
    if args.eval_checkpoint:
        if args.eval_episodes < 1:
            sys.exit(f"error: --eval-episodes is {args.eval_episodes}; evaluate at least 1 episode")
        device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
        returns = evaluate(args.eval_checkpoint, args.eval_episodes, device, args.capture_video)
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
    run = Run(args, checkpoint)
    if checkpoint and checkpoint["iteration"] >= args.num_iterations:
        print(f"{run.name} is complete ({checkpoint['global_step']} steps); a larger --total-timesteps extends it")
        sys.exit(0)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)  # speed: tiny matmuls lose more to thread hand-offs than they gain
    try:
        train(args, run)
    except gym.error.DependencyNotInstalled as e:  # e.g. Box2D for LunarLander: gymnasium's message says what to install
        run.fail(f"{args.env_id} needs a package that is not installed: {str(e).strip().splitlines()[0]}")
    except KeyboardInterrupt:  # a second signal (or Ctrl-C before the loop): stop at once, the logs closed
        run.close()
    run.finish()


if __name__ == "__main__":
    main()

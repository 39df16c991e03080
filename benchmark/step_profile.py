"""Where an Atari training step's time goes: the env, the env wrappers, the network, and the script's own work.

    python benchmark/step_profile.py ppo_atari_envpool.py                      # 8 iterations of the default sizes
    python benchmark/step_profile.py ppo_atari.py --iterations 4
    python benchmark/step_profile.py ppo_atari_envpool.py -- --bf16 --channels-last   # flags for the run
    python benchmark/step_profile.py ppo_atari_envpool.py --against HEAD~1      # the same, of the script at HEAD~1 too
    python benchmark/step_profile.py ppo_atari_envpool.py --iterations 2 --emulate-bf16 -- --bf16 --channels-last
                                  # what --bf16 would cost on a CPU without AVX512-BF16 / AMX-BF16 (the script refuses it)

The script runs in this process, as it is (its own `main()`), with timers wrapped around a few of its pieces: the
game itself (envpool's C++ step; ale-py's `AtariEnv.step` under the gymnasium wrappers), the vector env's `step`, the
agent's forward passes in the rollout and in the update, and `gradient_step` (backward, clipping and Adam). What no
timer covers is the script's own work: in the rollout, storing, conversions, logging; in the update, GAE, the
minibatch gathers, the loss. The first iteration is left out (warm-up). Figures are milliseconds per env step
(one env's step; a vector step is --num-envs of them), so that 1000 / total is the SPS. Keep the machine idle.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import exit_with, machine  # noqa: E402  (tools/_common.py)

SCRIPTS = ("ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py")


class Timers:
    """Seconds spent in each named piece, counted only once the warm-up iterations are over."""

    def __init__(self, warmup):
        self.total, self.warmup, self.iteration, self.depth = defaultdict(float), warmup, 0, defaultdict(int)
        self.marks = {}

    @contextmanager
    def timed(self, name):
        self.depth[name] += 1  # a piece that calls itself (a wrapper's step calling the env's) counts once
        start = time.perf_counter()
        try:
            yield
        finally:
            self.depth[name] -= 1
            if self.depth[name] == 0 and self.iteration > self.warmup:
                self.total[name] += time.perf_counter() - start

    def wrap(self, owner, attribute, name, when=lambda: True):
        original = getattr(owner, attribute)

        def timed_call(*args, **kwargs):
            if not when():
                return original(*args, **kwargs)
            with self.timed(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed_call)

    def mark(self, name):
        """The end of a phase that started at the previous mark (iteration start -> rollout end -> update end)."""
        now = time.perf_counter()
        if self.iteration > self.warmup and "last" in self.marks:
            self.total[name] += now - self.marks["last"]
        self.marks["last"] = now


def profile(path, run_flags, iterations, warmup, emulate_bf16=False):
    """Run the script at `path` for warmup + iterations iterations; return (timers, args, elapsed seconds).
    `emulate_bf16`: the script's CPU check is told the CPU has AVX512-BF16, so that --bf16 runs emulated where it does not."""
    spec = importlib.util.spec_from_file_location(f"profiled_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if emulate_bf16:
        module.bf16_native = lambda args: True
    timers = Timers(warmup)
    inference = torch.is_inference_mode_enabled
    timers.wrap(module.Agent, "get_action_and_value", "rollout forward", when=inference)
    timers.wrap(module.Agent, "get_value", "rollout forward", when=inference)
    timers.wrap(module.Agent, "get_action_and_value", "update forward", when=lambda: not inference())
    timers.wrap(module, "gradient_step", "update backward + Adam")
    if hasattr(module, "EnvpoolAtari"):
        original_make = module.EnvpoolAtari.make

        def make(self, seed):
            original_make(self, seed)
            envs = self.envs

            class Timed:  # envpool's object cannot take new attributes: a proxy whose step is timed
                def __getattr__(self, attribute):
                    return getattr(envs, attribute)

                def step(self, *args):
                    with timers.timed("game (envpool C++)"):
                        return envs.step(*args)

            self.envs = Timed()

        module.EnvpoolAtari.make = make
        timers.wrap(module.EnvpoolAtari, "step", "vector env step")
    else:
        import ale_py
        import gymnasium as gym

        timers.wrap(ale_py.env.AtariEnv, "step", "game (ALE)")
        timers.wrap(gym.vector.SyncVectorEnv, "step", "vector env step")

    # the phases, marked by what train() calls once an iteration: the rollout's copy of the agent at its start, the
    # bootstrap value (outside inference mode) at the rollout's end, the video upload after the update and the logs
    state = {"iteration": 0}
    original_copy, original_value, original_upload, original_logs = (
        module.Agent.rollout_copy,
        module.Agent.get_value,
        module.upload_videos,
        module.open_logs,
    )

    def rollout_copy(self):
        state["iteration"] += 1
        timers.iteration = state["iteration"]
        timers.mark("between iterations")
        return original_copy(self)

    def get_value(self, *args):
        if not inference():
            timers.mark("rollout (all)")
        return original_value(self, *args)

    def upload_videos(*args):
        timers.mark("update (all)")
        return original_upload(*args)

    def open_logs(args, *rest):
        state["args"] = args
        return original_logs(args, *rest)

    module.Agent.rollout_copy, module.Agent.get_value = rollout_copy, get_value
    module.upload_videos, module.open_logs = upload_videos, open_logs
    defaults = module.tyro.cli(module.Args, args=run_flags)  # the run's sizes, for its --total-timesteps
    total = (warmup + iterations) * defaults.num_envs * defaults.num_steps
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(path), "--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", str(total), *run_flags]
        old_argv, old_cwd = sys.argv, Path.cwd()
        sys.argv = argv
        os.chdir(tmp)
        try:
            module.main()
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        finally:
            sys.argv = old_argv
            os.chdir(old_cwd)
    timers.iteration = 0  # the timers stop counting: the env alone is timed by itself
    return timers, state["args"], env_alone(module, run_flags)


def env_alone(module, run_flags, steps=300):
    """ms per env step of the script's vector env under random actions, nothing else running in this process."""
    import numpy as np

    args = module.tyro.cli(module.Args, args=["--env-id", "BreakoutNoFrameskip-v4", *run_flags])
    module.check_args(args)
    envs = module.make_envs(args, "profile")
    envs.reset(seed=1)
    actions = np.random.default_rng(1).integers(envs.single_action_space.n, size=(steps + 20, args.num_envs))
    for t in range(20):
        envs.step(actions[t])
    start = time.perf_counter()
    for t in range(20, steps + 20):
        envs.step(actions[t])
    elapsed = time.perf_counter() - start
    envs.close()
    return 1000 * elapsed / (steps * args.num_envs)


def table(timers, steps):
    t = {k: 1000 * v / steps for k, v in timers.total.items()}
    rows = [("game", t.get("game (envpool C++)", t.get("game (ALE)", 0.0)))]
    rows.append(("vector env's own work (wrappers, restarts, frame stack)", t["vector env step"] - rows[0][1]))
    rows.append(("rollout forward", t["rollout forward"]))
    rows.append(("rollout: the script's own work", t["rollout (all)"] - t["vector env step"] - t["rollout forward"]))
    rows.append(("update forward", t["update forward"]))
    rows.append(("update backward + Adam", t["update backward + Adam"]))
    rows.append(
        (
            "update: the script's own work (GAE, gathers, loss)",
            t["update (all)"] - t["update forward"] - t["update backward + Adam"],
        )
    )
    rows.append(("between iterations (logging, checkpoints)", t.get("between iterations", 0.0)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", help=f"an Atari script: {', '.join(SCRIPTS)}")

    parser.add_argument("--iterations", type=int, default=8, help="iterations measured (after one of warm-up)")
    parser.add_argument("--against", metavar="REV", help="also profile the script as it was at git revision REV")
    parser.add_argument(
        "--emulate-bf16",
        action="store_true",
        help="let --bf16 run where the CPU lacks AVX512-BF16/AMX-BF16 (emulated), to measure what the refusal spares",
    )
    argv = sys.argv[1:]
    run_flags = argv[argv.index("--") + 1 :] if "--" in argv else []  # flags for the run, after --
    opts = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    opts.run_flags = run_flags
    path = Path(opts.script) if Path(opts.script).is_file() else ROOT / opts.script
    if path.name not in SCRIPTS or not path.is_file():
        parser.error(f"{opts.script} is not one of the Atari scripts ({', '.join(SCRIPTS)})")
    if opts.iterations < 1:
        parser.error(f"--iterations {opts.iterations}: measure at least 1")
    paths = [path.resolve()]
    old = tempfile.TemporaryDirectory()
    if opts.against:
        res = subprocess.run(["git", "-C", str(ROOT), "show", f"{opts.against}:{path.name}"], capture_output=True)
        if res.returncode != 0:
            parser.error(f"--against {opts.against}: no {path.name} at that revision")
        paths.insert(0, Path(old.name) / path.name)
        paths[0].write_bytes(res.stdout)
    results, alones = [], []
    for p in paths:
        timers, args, alone = profile(p, opts.run_flags, opts.iterations, warmup=1, emulate_bf16=opts.emulate_bf16)
        steps = opts.iterations * args.num_envs * args.num_steps
        results.append(table(timers, steps))
        alones.append(alone)
    names = [f"{path.name}@{opts.against}", path.name] if opts.against else [path.name]
    print(f"\n{' '.join(opts.run_flags)}: ms per env step over {opts.iterations} iterations after 1 of warm-up")
    print(f"{machine()}{'; --emulate-bf16' if opts.emulate_bf16 else ''}; {time.strftime('%Y-%m-%d')}\n")
    print("| piece | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, (label, _) in enumerate(results[0]):
        print(f"| {label} | " + " | ".join(f"{r[i][1]:.3f}" for r in results) + " |")
    totals = [sum(v for _, v in r) for r in results]
    print("| **total** | " + " | ".join(f"**{t:.3f}**" for t in totals) + " |")
    print("| SPS (1000 / total) | " + " | ".join(f"{1000 / t:,.0f}" for t in totals) + " |")
    print(
        "| vector env step alone, after the run (random actions, no network) | "
        + " | ".join(f"{a:.3f}" for a in alones)
        + " |"
    )
    old.cleanup()


if __name__ == "__main__":
    exit_with(main)

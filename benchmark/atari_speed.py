"""Speed of the two Atari pipelines on this machine: ppo_atari.py (gymnasium wrappers) vs ppo_atari_envpool.py (envpool, C++).

    python benchmark/atari_speed.py                                   # small settings (a few minutes on 2 CPU cores)
    python benchmark/atari_speed.py --num-envs 8 --num-steps 128 --train-iterations 4 --torch-threads 0

Env throughput: each script's own `make_envs` stepped with random actions (no network), steps/s over all envs after a
warm-up. Training SPS: each script run as is (subprocess, its defaults but the sizes below), timed from its own TensorBoard
log: the steps of the iterations after the first (warm-up) divided by their wall time. Each figure is the median of
--repeats runs; the table gives the ratio vector / wrappers.
"""

import argparse
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import Runs, Stopped, exit_with, flag_error, machine  # noqa: E402  (tools/_common.py)

SCRIPTS = {"wrappers": "ppo_atari.py", "vector": "ppo_atari_envpool.py"}


def load(script):
    spec = importlib.util.spec_from_file_location(script[:-3], ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env_throughput(script, env_id, num_envs, warmup, steps, seed):
    """Env steps per second (all envs) of the script's vector env under random actions."""
    module = load(script)
    args = module.Args(env_id=env_id, num_envs=num_envs)
    error = module.check_args(args)
    if error:
        sys.exit(f"error: {script}: {error}")
    envs = module.make_envs(args, "speed")
    envs.reset(seed=seed)
    actions = np.random.default_rng(seed).integers(envs.single_action_space.n, size=(warmup + steps, num_envs))
    for t in range(warmup):
        envs.step(actions[t])
    start = time.perf_counter()
    for t in range(warmup, warmup + steps):
        envs.step(actions[t])
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


def training_flags(env_id, num_envs, num_steps, iterations, seed, threads):
    flags = ["--env-id", env_id, "--seed", str(seed), "--exp-name", "speed", "--num-envs", str(num_envs)]
    flags += ["--num-steps", str(num_steps)] + (["--torch-threads", str(threads)] if threads is not None else [])
    return flags + ["--total-timesteps", str(iterations * num_envs * num_steps)]


def training_sps(script, env_id, num_envs, num_steps, iterations, seed, threads, timeout, runs):
    """Steps per second of a real run after its first iteration, from the wall times of its TensorBoard scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(ROOT / script), *training_flags(env_id, num_envs, num_steps, iterations, seed, threads)]
        with open(Path(tmp, "out.txt"), "w") as out, open(Path(tmp, "err.txt"), "w+") as err:
            try:
                returncode = runs.wait(runs.start(cmd, cwd=tmp, stdout=out, stderr=err, env=env), timeout=timeout)
            except subprocess.TimeoutExpired:
                sys.exit(f"error: {script} took more than --timeout {timeout} s for {iterations} iterations; stopped")
            runs.check()  # a signal came: passed on to the run, which stopped
            err.seek(0)
            stderr = err.read()
        if returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed:\n{stderr[-2000:]}")
        (run_dir,) = Path(tmp, "runs").iterdir()
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("charts/SPS")  # one per iteration, written at its end
    first, last = events[0], events[-1]
    return (last.step - first.step) / (last.wall_time - first.wall_time)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--env-warmup", type=int, default=50, help="env-only: untimed steps per env first")
    parser.add_argument("--env-steps", type=int, default=500, help="env-only: timed steps per env")
    parser.add_argument("--num-steps", type=int, default=32, help="training: steps per env per iteration")
    parser.add_argument("--train-iterations", type=int, default=3, help="training: iterations, the first one untimed")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement (the median is reported)")
    parser.add_argument("--torch-threads", type=int, default=None, help="--torch-threads of the runs (default: the script's)")
    parser.add_argument("--skip-training", action="store_true", help="only the env-only throughput")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed to one training run")
    args = parser.parse_args(argv)
    if args.train_iterations < 2:
        parser.error("--train-iterations must be at least 2 (the first one is the warm-up)")
    small = [
        f"--{k.replace('_', '-')}"
        for k in ("num_envs", "env_steps", "num_steps", "repeats", "timeout")
        if getattr(args, k) < 1
    ]
    if small or args.env_warmup < 0:
        parser.error(f"{(small or ['--env-warmup'])[0]} is too small: counts must be at least 1, --env-warmup at least 0")
    runs = Runs()  # SIGINT / SIGTERM: passed on to the run going, which stops; then one line and 128 + the signal
    try:
        for script in SCRIPTS.values():  # before anything runs: what each script would refuse (env id, sizes, threads)
            sizes = (args.num_envs, args.num_steps, args.train_iterations)
            error = flag_error(ROOT / script, training_flags(args.env_id, *sizes, 1, args.torch_threads))
            if error:
                parser.error(error)
        runs.check()  # a signal during the checks: nothing ran
        measure(args, runs)
    except Stopped as stop:
        name = signal.Signals(stop.signum).name
        print(f"error: stopped by {name}: the run going was stopped, and the measurement with it", file=sys.stderr)
        sys.exit(128 + stop.signum)
    finally:
        runs.restore()


def measure(args, runs):
    start = time.time()
    results = {name: {"env": [], "train": []} for name in SCRIPTS}
    for seed in range(1, args.repeats + 1):  # alternate the two pipelines so that a busy spell hits both
        for name, script in SCRIPTS.items():
            runs.check()
            sps = env_throughput(script, args.env_id, args.num_envs, args.env_warmup, args.env_steps, seed)
            results[name]["env"].append(sps)
            print(f"[{time.time() - start:5.0f} s] env-only  {script:<26} repeat {seed}: {sps:8.0f} steps/s", flush=True)
        if args.skip_training:
            continue
        for name, script in SCRIPTS.items():
            sizes = (args.num_envs, args.num_steps, args.train_iterations)
            sps = training_sps(script, args.env_id, *sizes, seed, args.torch_threads, args.timeout, runs)
            results[name]["train"].append(sps)
            print(f"[{time.time() - start:5.0f} s] training  {script:<26} repeat {seed}: {sps:8.1f} steps/s", flush=True)

    def median(name, kind):
        values = results[name][kind]
        return statistics.median(values) if values else float("nan")

    print()
    print(
        f"{args.env_id}, {args.num_envs} envs; env-only: {args.env_steps} timed steps per env after {args.env_warmup}; "
        f"training: {args.num_steps} steps per env per iteration, iterations 2..{args.train_iterations} timed; "
        f"median of {args.repeats}; --torch-threads {args.torch_threads if args.torch_threads is not None else 'default'}; "
        f"{machine()}"
    )
    print("| pipeline | env-only steps/s | training SPS |\n|-|-|-|")
    for name, script in SCRIPTS.items():
        print(f"| {script} ({name}) | {median(name, 'env'):.0f} | {median(name, 'train'):.1f} |")
    env_ratio = median("vector", "env") / median("wrappers", "env")
    train_ratio = median("vector", "train") / median("wrappers", "train")
    print(f"| ratio vector / wrappers | {env_ratio:.2f}x | {train_ratio:.2f}x |")
    print(f"\ntotal {time.time() - start:.0f} s")


if __name__ == "__main__":
    exit_with(main)

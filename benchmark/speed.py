"""Speed table: env-only throughput vs training steps per second, for each variant script, on this machine.

    python benchmark/speed.py                       # every script that exists, default sizes
    python benchmark/speed.py ppo.py ppo_shared.py  # some scripts
    python benchmark/speed.py --repeats 3 --train-steps 30720 ppo.py
    python benchmark/speed.py --script-args="--torch-threads 2" ppo_atari.py   # flags added to each training run
    python benchmark/speed.py --against HEAD~3 ppo.py ppo_atari.py  # before/after: each script beside its REV version
    python benchmark/speed.py --with-flags=--fused-lstm ppo_atari_lstm.py other/ppo_atari_lstm.py  # also with a flag
    python benchmark/speed.py --with-flags=--channels-last --with-flags=--bf16 --with-flags="--bf16 --channels-last" \
        ppo_atari_envpool.py                        # several modes side by side, one run

`--against REV` takes each script as it was at the git revision REV (`git show REV:<script>` into a temporary folder;
the scripts import nothing of ours) and measures it next to the current one, runs interleaved, with the ratio.
`--with-flags FLAGS` also measures each script of this repository with FLAGS added (e.g. an opt-in speed flag),
interleaved with it (repeat it for several sets of flags, each measured and shown beside the plain run); a script
given by a path outside the repository (e.g. another implementation) runs without them.

For each script: env-only throughput (random actions through the script's own `make_envs`, so the same wrappers
and vector env), and training SPS measured from the TensorBoard events of a run of the script itself, between
the end of its warm-up iterations and its last iteration (imports, env creation and the first iterations are
excluded). Each figure is the median of `--repeats` runs. Runs happen one at a time; keep the machine otherwise idle.
"""

import argparse
import importlib.util
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# script -> (env id, extra training flags, training steps, warm-up iterations)
DEFAULTS = {
    "ppo.py": ("CartPole-v1", [], 30720, 5),
    "ppo_shared.py": ("CartPole-v1", [], 30720, 5),
    "ppo_continuous_action.py": ("HalfCheetah-v4", [], 16384, 1),
    "ppo_atari.py": ("BreakoutNoFrameskip-v4", [], 8192, 1),
    "ppo_atari_envpool.py": ("BreakoutNoFrameskip-v4", [], 8192, 1),
    "ppo_atari_lstm.py": ("BreakoutNoFrameskip-v4", [], 8192, 1),
    "ppo_atari_multigpu.py": ("BreakoutNoFrameskip-v4", [], 8192, 1),
}


def load(path):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def env_only_sps(path, env_id, seconds=5.0):
    """Steps per second of the script's vector env under uniformly random actions."""
    module = load(path)
    args = module.Args(env_id=env_id)
    module.check_args(args)
    envs = module.make_envs(args, "speed")
    envs.reset(seed=1)
    envs.action_space.seed(1)
    for _ in range(20):
        envs.step(envs.action_space.sample())
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(envs.action_space.sample())
        steps += args.num_envs
    envs.close()
    return steps / (time.perf_counter() - start)


def training_sps(path, env_id, flags, total_steps, warmup_iterations):
    """Steps per second of a training run after its warm-up iterations, from its own TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(path), "--env-id", env_id, "--total-timesteps", str(total_steps), *flags]
        res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
        (run_dir,) = {p.parent for p in Path(tmp, "runs").rglob("events.out.tfevents.*")}
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("charts/learning_rate")  # one per iteration, logged at its end
        if len(events) <= warmup_iterations + 1:
            raise RuntimeError(f"{path}: too few iterations ({len(events)}) for {warmup_iterations} warm-up ones")
        first, last = events[warmup_iterations], events[-1]
        return (last.step - first.step) / (last.wall_time - first.wall_time)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scripts", nargs="*", help="script paths (default: every variant that exists)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--train-steps", type=int, help="override each script's training steps")
    parser.add_argument("--env-id", help="override each script's env id")
    parser.add_argument("--env-seconds", type=float, default=5.0, help="seconds per env-only measurement")
    parser.add_argument("--script-args", default="", help="flags added to every training run (one string)")
    parser.add_argument("--against", metavar="REV", help="also measure each script as it was at git revision REV")
    parser.add_argument(
        "--with-flags", action="append", default=[], help="also measure each current script with these flags (repeatable)"
    )
    opts = parser.parse_args()
    if opts.repeats < 1 or not opts.env_seconds > 0 or (opts.train_steps is not None and opts.train_steps < 1):
        parser.error("--repeats and --train-steps must be at least 1, and --env-seconds above 0")
    scripts = opts.scripts or [s for s in DEFAULTS if (ROOT / s).exists()]
    missing = [s for s in scripts if not Path(s).is_file() and not (ROOT / s).is_file()]
    if missing:
        parser.error(f"no such script: {', '.join(missing)} (give a path, or a name at the repository root)")
    old = tempfile.TemporaryDirectory()
    try:
        before = {s: script_at(opts.against, s, Path(old.name)) for s in scripts} if opts.against else {}
    except ValueError as e:
        parser.error(str(e))
    # groups measured together, their runs interleaved so that slow phases of the machine hit all alike
    groups = [[before[s], s] if opts.against else [s] for s in scripts]
    rows = []
    for group in groups:
        paths = [(Path(s) if Path(s).exists() else ROOT / s).resolve() for s in group]
        env_id, flags, steps, warmup = DEFAULTS.get(paths[-1].name, DEFAULTS["ppo.py"])
        env_id, steps = opts.env_id or env_id, opts.train_steps or steps
        flags = [*flags, *shlex.split(opts.script_args)]
        current = opts.with_flags and paths[-1].is_relative_to(ROOT)  # --with-flags: the scripts of this repository
        runs = [(path, "") for path in paths] + ([(paths[-1], f) for f in opts.with_flags] if current else [])
        env_runs, train_runs = {r: [] for r in runs}, {r: [] for r in runs}
        for _ in range(opts.repeats):
            for path, added in runs:
                env_runs[path, added].append(env_only_sps(path, env_id, opts.env_seconds))
                train_runs[path, added].append(training_sps(path, env_id, flags + shlex.split(added), steps, warmup))
        for path, added in runs:
            env_sps, train_sps = statistics.median(env_runs[path, added]), statistics.median(train_runs[path, added])
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            shown = f"{path.name}@{opts.against}" if path.is_relative_to(Path(old.name).resolve()) else shown
            shown = f"{shown} {added}".strip()
            label = f"{shown} {opts.script_args}".strip()
            rows.append((label, env_id, env_sps, train_sps, train_sps / env_sps, train_runs[path, added], path, added))
            print(
                f"measured {shown}: env-only {env_sps:,.0f}, training {train_sps:,.0f} ({train_runs[path, added]})", flush=True
            )
    print(f"\nmedian of {opts.repeats}; {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}\n")
    print("| script | env | env-only steps/s | training SPS | training / env-only |")
    print("|---|---|---|---|---|")
    for script, env_id, env_sps, train_sps, ratio, *_ in rows:
        print(f"| {script} | {env_id} | {env_sps:,.0f} | {train_sps:,.0f} | {ratio:.2f} |")
    old.cleanup()
    flagged = {row[6]: [r for r in rows if r[6] == row[6] and r[7]] for row in rows if not row[7]}  # plain path -> rows
    if any(flagged.values()):
        print("\n| script | env | SPS | " + " | ".join(f"with {f} SPS | with / without" for f in opts.with_flags) + " |")
        print("|---|---|---|" + "---|---|" * len(opts.with_flags))
        for plain in (r for r in rows if not r[7] and flagged[r[6]]):
            cells = [f"{row[3]:,.0f} | {row[3] / plain[3]:.2f}" for row in flagged[plain[6]]]
            print(f"| {plain[0]} | {plain[1]} | {plain[3]:,.0f} | " + " | ".join(cells) + " |")
    pairs = [(b, a) for b, a in zip(rows, rows[1:]) if "@" in b[0].split()[0] and "@" not in a[0].split()[0] and not a[7]]
    if pairs:
        print(f"\n| script | env | before ({opts.against}) SPS | after SPS | after / before |")
        print("|---|---|---|---|---|")
        for before, after in pairs:
            print(f"| {after[0]} | {after[1]} | {before[3]:,.0f} | {after[3]:,.0f} | {after[3] / before[3]:.2f} |")


def script_at(rev, script, folder):
    """Write `script` as it was at git revision `rev` into `folder`; its path as a string (ValueError: one line why)."""
    name = Path(script).name
    try:
        res = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], capture_output=True)
    except OSError as e:  # no git on this machine
        raise ValueError(f"--against {rev}: cannot run git ({e.strerror or e}); install git or drop --against") from e
    if res.returncode != 0:
        reason = (res.stderr.decode(errors="replace").strip().splitlines() or ["git failed"])[0]
        raise ValueError(f"--against {rev}: no {name} at that revision ({reason})")
    path = folder / name
    path.write_bytes(res.stdout)
    return str(path)


if __name__ == "__main__":
    main()

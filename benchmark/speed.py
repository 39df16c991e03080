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
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import Runs, Stopped, checked_args, exit_with, machine, script_error  # noqa: E402  (tools/_common.py)

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
    error = module.check_args(args) if hasattr(module, "check_args") else None
    if error:
        raise RuntimeError(f"{Path(path).name}: {error}")
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


def training_sps(path, env_id, flags, total_steps, warmup_iterations, runs):
    """Steps per second of a training run after its warm-up iterations, from its own TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(path), "--env-id", env_id, "--total-timesteps", str(total_steps), *flags]
        with open(Path(tmp, "out.txt"), "w") as out, open(Path(tmp, "err.txt"), "w+") as err:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            returncode = runs.wait(runs.start(cmd, cwd=tmp, stdout=out, stderr=err, env=env))
            runs.check()  # a signal came: passed on to the run, which stopped; nothing measured is kept
            err.seek(0)
            stderr = err.read()
        if returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{stderr[-2000:]}")
        (run_dir,) = {p.parent for p in Path(tmp, "runs").rglob("events.out.tfevents.*")}
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("charts/learning_rate")  # one per iteration, logged at its end
        if len(events) <= warmup_iterations + 1:
            raise RuntimeError(f"{path}: too few iterations ({len(events)}) for {warmup_iterations} warm-up ones")
        first, last = events[warmup_iterations], events[-1]
        return (last.step - first.step) / (last.wall_time - first.wall_time)


def main(argv=None):
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
    opts = parser.parse_args(argv)
    if opts.repeats < 1 or not 0 < opts.env_seconds < math.inf or (opts.train_steps is not None and opts.train_steps < 1):
        parser.error("--repeats and --train-steps must be at least 1, and --env-seconds above 0 (and finite)")
    for flag, value in [("--script-args", opts.script_args)] + [("--with-flags", f) for f in opts.with_flags]:
        try:
            shlex.split(value)
        except ValueError as e:
            parser.error(f"{flag} {value!r}: {e} (one string of flags, quoted as in a shell)")
    scripts = opts.scripts or [s for s in DEFAULTS if (ROOT / s).exists()]
    missing = [s for s in scripts if not Path(s).exists() and not (ROOT / s).is_file()]
    if missing:
        parser.error(f"no such script: {', '.join(missing)} (give a path, or a name at the repository root)")
    for s in scripts:
        error = script_error(s if Path(s).exists() else ROOT / s, needs=("Args", "make_envs"))
        if error:
            parser.error(error)
    old = tempfile.TemporaryDirectory()
    try:
        before = {s: script_at(opts.against, s, Path(old.name)) for s in scripts} if opts.against else {}
    except ValueError as e:
        parser.error(str(e))
    # groups measured together, their runs interleaved so that slow phases of the machine hit all alike
    groups = [[before[s], s] if opts.against else [s] for s in scripts]
    runs = Runs()  # SIGINT / SIGTERM: passed on to the run going, which stops; then one line and 128 + the signal
    try:
        plans = []  # (env_id, flags, steps, warmup, runs), each run's flags checked before anything is measured
        for group in groups:
            paths = [(Path(s) if Path(s).exists() else ROOT / s).resolve() for s in group]
            env_id, flags, steps, warmup = DEFAULTS.get(paths[-1].name, DEFAULTS["ppo.py"])
            env_id, steps = opts.env_id or env_id, opts.train_steps or steps
            flags = [*flags, *shlex.split(opts.script_args)]
            current = opts.with_flags and paths[-1].is_relative_to(ROOT)  # --with-flags: the scripts of this repository
            measured = [(path, "") for path in paths] + ([(paths[-1], f) for f in opts.with_flags] if current else [])
            for path, added in measured:
                error = run_error(
                    path, ["--env-id", env_id, "--total-timesteps", str(steps), *flags, *shlex.split(added)], warmup
                )
                if error:
                    parser.error(error.replace(str(Path(old.name).resolve()), f"@{opts.against}"))
            plans.append((env_id, flags, steps, warmup, measured))
        runs.check()  # a signal during the checks: nothing ran
        rows = measure(opts, plans, Path(old.name).resolve(), runs)
    except Stopped as stop:
        name = signal.Signals(stop.signum).name
        print(f"error: stopped by {name}: the run going was stopped, and the measurement with it", file=sys.stderr)
        sys.exit(128 + stop.signum)
    except RuntimeError as e:  # a run failed after all: its command and its last words
        sys.exit(f"error: {e}")
    finally:
        runs.restore()
    print(f"\nmedian of {opts.repeats}; {machine()}; {time.strftime('%Y-%m-%d')}\n")
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


def run_error(path, argv, warmup):
    """A one-line error for a measuring run the script would refuse, or one too short to measure, else None."""
    args, error = checked_args(path, argv)
    if error:
        return error
    if 0 < getattr(args, "num_iterations", 0) <= warmup + 1:  # (0: an old revision's check_args does not count them)
        return (
            f"{path.name}: {args.num_iterations} iteration(s) of {args.batch_size} steps is too few to time after "
            f"{warmup} warm-up one(s); give --train-steps of at least {(warmup + 2) * args.batch_size}"
        )
    return None


def measure(opts, plans, old, runs):
    """[(label, env_id, env_sps, train_sps, ratio, train runs, path, added flags)] for the planned groups."""
    rows = []
    for env_id, flags, steps, warmup, group in plans:
        env_runs, train_runs = {r: [] for r in group}, {r: [] for r in group}
        for _ in range(opts.repeats):
            for path, added in group:
                runs.check()
                env_runs[path, added].append(env_only_sps(path, env_id, opts.env_seconds))
                sps = training_sps(path, env_id, flags + shlex.split(added), steps, warmup, runs)
                train_runs[path, added].append(sps)
        for path, added in group:
            env_sps, train_sps = statistics.median(env_runs[path, added]), statistics.median(train_runs[path, added])
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            shown = f"{path.name}@{opts.against}" if path.is_relative_to(old) else shown
            shown = f"{shown} {added}".strip()
            label = f"{shown} {opts.script_args}".strip()
            rows.append((label, env_id, env_sps, train_sps, train_sps / env_sps, train_runs[path, added], path, added))
            print(
                f"measured {shown}: env-only {env_sps:,.0f}, training {train_sps:,.0f} ({train_runs[path, added]})", flush=True
            )
    return rows


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
    exit_with(main)

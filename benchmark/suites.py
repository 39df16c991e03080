"""The runs that reproduce each published table: one named suite per table, seeds 1-3, published step counts.

    python benchmark/suites.py                        # list the suites
    python benchmark/suites.py classic                # print the suite's commands (copy them, or run them elsewhere)
    python benchmark/suites.py classic --run          # run them one after the other, here
    python benchmark/suites.py atari --seeds 1 --envs PongNoFrameskip-v4 --run -- --cuda   # a subset, extra flags

Runs write TensorBoard logs under runs/ of the current directory; then `python benchmark/report.py runs/ --out report/`.
With --run, every command's flags are checked as its script checks them before the first starts. Ctrl-C or SIGTERM
goes on to the run going, which stops after a checkpoint; the suite then says in one line how to go on (--resume that
run, then --from N for the commands after it) and exits with 128 + the signal.
"""

import argparse
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import Runs, Stopped, exit_with, flag_error, given_fields, script_error  # noqa: E402  (tools/_common.py)

_ATARI = ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4", "BeamRiderNoFrameskip-v4"]
_MICRORTS = [
    "MicrortsMining-v1",
    "MicrortsProduceCombatUnitsShapedReward-v1",
    "MicrortsAttackShapedReward-v1",
    "MicrortsRandomEnemyShapedReward3-v1",
]


@dataclass
class Suite:
    scripts: list
    envs: list
    steps: int | None  # None: the script's default
    about: str
    flags: list = field(default_factory=list)  # the same for every command of the suite
    launcher: list = field(default_factory=list)  # e.g. torchrun


SUITES = {
    "classic": Suite(
        ["ppo.py"], ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"], 500_000, "classic control table (ppo2 and CleanRL)"
    ),
    "classic_shared": Suite(
        ["ppo_shared.py"], ["CartPole-v1", "Acrobot-v1", "MountainCar-v0"], 500_000, "shared network (blog: figures only)"
    ),
    "atari": Suite(["ppo_atari.py"], _ATARI, 10_000_000, "Atari table (ppo2 and CleanRL)"),
    "atari_lstm": Suite(["ppo_atari_lstm.py"], _ATARI, 10_000_000, "Atari LSTM table (ppo2 cnn_lstm and CleanRL)"),
    "atari_envpool": Suite(["ppo_atari_envpool.py"], _ATARI, 10_000_000, "Atari on envpool (compare with the Atari table)"),
    "pong_5min": Suite(
        ["ppo_atari_envpool.py"],
        ["PongNoFrameskip-v4"],
        None,
        "the blog's 'Pong in 5 minutes' settings (figures only)",
        flags=[
            "--clip-coef",
            "0.2",
            "--num-envs",
            "16",
            "--num-minibatches",
            "8",
            "--num-steps",
            "128",
            "--update-epochs",
            "3",
        ],
    ),
    "atari_multigpu": Suite(
        ["ppo_atari_multigpu.py"],
        _ATARI,
        10_000_000,
        "data-parallel Atari on 2 processes (compare with the Atari table)",
        launcher=["torchrun", "--standalone", "--nproc_per_node", "2"],
    ),
    "mujoco": Suite(
        ["ppo_continuous_action.py"],
        ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4"],
        1_000_000,
        "MuJoCo table (ppo2 v2, CleanRL v4)",
    ),
    "microrts": Suite(
        ["ppo_multidiscrete.py", "ppo_multidiscrete_mask.py"],
        _MICRORTS,
        2_000_000,
        "MicroRTS, masked vs unmasked (figures only)",
    ),
}


def commands(suite, seeds, envs=None, steps=None, extra=()):
    """[(script, argv)] of a suite; argv starts with 'python' (or the launcher) and the script's path."""
    out = []
    steps = steps if steps is not None else suite.steps
    for script in suite.scripts:
        for env_id in suite.envs:
            if envs and env_id not in envs:
                continue
            for seed in seeds:
                argv = (suite.launcher or ["python"]) + [script, "--env-id", env_id, "--seed", str(seed)]
                argv += ["--total-timesteps", str(steps)] if steps is not None else []
                out.append((script, argv + list(suite.flags) + list(extra)))
    return out


def executable(argv, root=None):
    """The argv to run here: this interpreter instead of 'python', torch's own launcher for torchrun, script paths absolute."""
    root = root or ROOT
    if argv[0] == "torchrun":
        head, rest = [sys.executable, "-m", "torch.distributed.run"], argv[1:]
    else:
        head, rest = [sys.executable], argv[1:]
    return head + [str(root / a) if a.endswith(".py") and (root / a).is_file() else a for a in rest]


SET_BY_THE_SUITE = {"env_id": "--envs", "seed": "--seeds", "total_timesteps": "--steps"}


def input_error(args, extra):
    """A one-line error for arguments that no suite can run, else None (nothing is loaded: the commands may run elsewhere)."""
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        return f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}"
    for flag, values in (("suites", args.suites), ("--seeds", args.seeds), ("--envs", args.envs or [])):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            return f"{flag}: {', '.join(twice)} given twice; give each once"
    bad = [s for s in args.seeds if not 0 <= s < 2**32]
    if bad:
        return f"--seeds {bad[0]} is not allowed: a seed is an integer in [0, 2**32)"
    if args.steps is not None and args.steps < 1:
        return f"--steps {args.steps} is not allowed: it must be at least 1"
    known = [e for name in args.suites for e in SUITES[name].envs]
    strangers = [e for e in args.envs or [] if e not in known]
    if strangers:
        known = ", ".join(dict.fromkeys(known))
        return f"--envs {', '.join(strangers)}: not in {' '.join(args.suites)}, whose env ids are: {known}"
    for name, flag in sorted(given_fields(extra, SET_BY_THE_SUITE).items()):
        return f"{flag} after --: the suite sets it for each command; use {SET_BY_THE_SUITE[name]}"
    return None


def run_error(todo):
    """A one-line error for the first command that its script would refuse (its parser and check_args), else None."""
    checked = set()
    for script, cmd in todo:
        flags = tuple(cmd[cmd.index(script) + 1 :])
        if (script, flags) not in checked:
            checked.add((script, flags))
            error = script_error(ROOT / script) or flag_error(ROOT / script, flags)
            if error:
                return f"{error} (nothing was run)"
    return None


def continue_command(args, first, extra):
    """The command that runs the suite's commands from the `first`-th on."""
    here = Path(__file__).resolve()
    shown = os.path.relpath(here) if here.is_relative_to(Path.cwd()) else str(here)
    argv = ["python", shown, *args.suites, "--run"]
    argv += ["--seeds", *map(str, args.seeds)] if args.seeds != [1, 2, 3] else []
    argv += ["--envs", *args.envs] if args.envs else []
    argv += ["--steps", str(args.steps)] if args.steps is not None else []
    argv += ["--from", str(first)] + (["--", *extra] if extra else [])
    return shlex.join(argv)


def stopped_line(signum, i, total, cmd, rc, start, args, extra):
    """One line: what the signal stopped (the `i`-th command, `cmd`, which exited `rc`; None: it had not started) and how
    to go on: the run from its checkpoint, then the commands after it."""
    name, rest = signal.Signals(signum).name, continue_command(args, i + 1, extra) if i < total else None
    if cmd is None:
        return f"suite stopped by {name} before [{i}/{total}] started; continue with: {continue_command(args, i, extra)}"
    head = f"suite stopped by {name} during [{i}/{total}] (the run exited {rc})"
    if rc == 0:  # it ended by itself
        return head + (f"; continue with: {rest}" if rest else "; it was the last command")
    runs = Path("runs")
    found = [p for p in runs.rglob("checkpoint.pt") if p.stat().st_mtime >= start] if runs.is_dir() else []
    if not found:
        return f"{head} before its first checkpoint; start again from it with: {continue_command(args, i, extra)}"
    checkpoint = max(found, key=lambda p: p.stat().st_mtime)
    script = next(k for k, a in enumerate(cmd) if a.endswith(".py"))
    resume = shlex.join(cmd[:script] + [str(ROOT / cmd[script]), "--resume", str(checkpoint)])
    return f"{head}; continue it with: {resume}" + (f"; then the rest with: {rest}" if rest else "")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Arguments after -- are appended to every command."
    )
    parser.add_argument("suites", nargs="*", help=f"one or more of: {', '.join(SUITES)}")
    parser.add_argument("--run", action="store_true", help="run the commands one after the other instead of printing them")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds (default: 1 2 3)")
    parser.add_argument("--envs", nargs="+", default=None, help="only these env ids of the suite")
    parser.add_argument("--steps", type=int, default=None, help="override the published step count (e.g. a smoke test)")
    parser.add_argument("--from", dest="first", type=int, default=1, help="start at the N-th command (after a stop)")
    args = parser.parse_args(argv)

    if not args.suites:
        width = max(map(len, SUITES))
        for name, suite in SUITES.items():
            steps = f"{suite.steps:,} steps" if suite.steps else "script's default steps"
            print(f"{name.ljust(width)}  {', '.join(suite.scripts)}: {len(suite.envs)} env(s), {steps}; {suite.about}")
        return 0
    error = input_error(args, extra)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    todo = [c for name in args.suites for c in commands(SUITES[name], args.seeds, args.envs, args.steps, extra)]
    if not 1 <= args.first <= len(todo):
        print(f"error: --from {args.first} is not allowed: the suite has commands 1 to {len(todo)}", file=sys.stderr)
        return 2
    missing = sorted({script for script, _ in todo if not (ROOT / script).is_file()})

    if not args.run:
        for script, cmd in todo[args.first - 1 :]:
            print(shlex.join(cmd) + ("  # not yet written" if script in missing else ""))
        return 0
    if missing:
        print(f"error: {', '.join(missing)} not yet written; nothing was run", file=sys.stderr)
        return 2
    runs, failed, i = Runs(), [], args.first
    try:
        error = run_error(todo[args.first - 1 :])  # before anything runs: a flag or env id a run would refuse
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        for i, (_, cmd) in enumerate(todo[args.first - 1 :], args.first):
            runs.check()
            print(f"[{i}/{len(todo)}] {shlex.join(cmd)}", flush=True)
            start = time.time()
            rc = runs.wait(runs.start(executable(cmd)))
            print(f"[{i}/{len(todo)}] exit {rc} after {time.time() - start:.0f} s", flush=True)
            if runs.signum:  # passed on to the run, which stopped (after a checkpoint) or ended
                print(stopped_line(runs.signum, i, len(todo), cmd, rc, start, args, extra), file=sys.stderr, flush=True)
                return 128 + runs.signum
            if rc != 0:
                failed.append(shlex.join(cmd))
    except Stopped as stop:  # before a run started
        print(stopped_line(stop.signum, i, len(todo), None, None, None, args, extra), file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        runs.restore()
    for cmd in failed:
        print(f"failed: {cmd}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    exit_with(main)

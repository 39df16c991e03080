"""The runs that reproduce each published table: one named suite per table, seeds 1-3, published step counts.

    python benchmark/suites.py                        # list the suites
    python benchmark/suites.py classic                # print the suite's commands (copy them, or run them elsewhere)
    python benchmark/suites.py classic --run          # run them one after the other, here
    python benchmark/suites.py atari --seeds 1 --envs PongNoFrameskip-v4 --run -- --cuda   # a subset, extra flags

Runs write TensorBoard logs under runs/ of the current directory; then `python benchmark/report.py runs/ --out report/`.
"""

import argparse
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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
    args = parser.parse_args(argv)

    if not args.suites:
        width = max(map(len, SUITES))
        for name, suite in SUITES.items():
            steps = f"{suite.steps:,} steps" if suite.steps else "script's default steps"
            print(f"{name.ljust(width)}  {', '.join(suite.scripts)}: {len(suite.envs)} env(s), {steps}; {suite.about}")
        return 0
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        print(f"error: unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}", file=sys.stderr)
        return 2
    todo = [c for name in args.suites for c in commands(SUITES[name], args.seeds, args.envs, args.steps, extra)]
    if not todo:
        print("error: no command matches (check --envs against the suite's env ids)", file=sys.stderr)
        return 2
    missing = sorted({script for script, _ in todo if not (ROOT / script).is_file()})

    if not args.run:
        for script, cmd in todo:
            print(shlex.join(cmd) + ("  # not yet written" if script in missing else ""))
        return 0
    if missing:
        print(f"error: {', '.join(missing)} not yet written; nothing was run", file=sys.stderr)
        return 2
    failed = []
    for i, (_, cmd) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {shlex.join(cmd)}", flush=True)
        start = time.time()
        proc, interrupted = subprocess.Popen(executable(cmd)), False
        try:
            rc = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the run too: let it stop cleanly, then stop the suite
            interrupted = True
            print("\ninterrupted: waiting for the run to stop (Ctrl-C again to kill it)", file=sys.stderr, flush=True)
            try:
                rc = proc.wait()
            except KeyboardInterrupt:
                proc.kill()
                rc = proc.wait()
        print(f"[{i}/{len(todo)}] exit {rc} after {time.time() - start:.0f} s", flush=True)
        if rc != 0:
            failed.append(shlex.join(cmd))
        if interrupted:
            print(f"suite stopped: {len(todo) - i} command(s) not run", file=sys.stderr)
            break
    for cmd in failed:
        print(f"failed: {cmd}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

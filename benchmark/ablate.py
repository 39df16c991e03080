"""Ablations: switch each implementation detail off, one at a time, and measure what it adds to the learning.

    python benchmark/ablate.py ppo.py --env-id CartPole-v1 Acrobot-v1 --total-timesteps 500000 --seeds 1 2 3 --jobs 2
    python benchmark/ablate.py ppo_continuous_action.py --env-id Hopper-v4 --details core-2 continuous-8 --dry-run
    python benchmark/ablate.py ppo.py --env-id CartPole-v1 --total-timesteps 500000 --report-only   # the report only

Runs the default (every detail on: ppo2's behaviour) and, for each detail, one run with that detail switched off
(the flags of tools/_common.py's ABLATIONS, e.g. --no-orthogonal-init), for every env and seed. The run names say
what is off: `{env}__{script}__off-{detail}__{seed}__{time}` (the default: `{script}__default`). Runs go to runs/ of
the current directory, one log each under --log-dir; a run already complete there is not run again (so an
interrupted ablation continues where it stopped). Then the report, into --out: one figure per env with every curve
(mean ± std over seeds), and a table of the final return (each seed's mean over its last 100 episodes) with each
detail off, its difference from the default and a 95% bootstrap interval of that difference over seeds.
Flags after `--` go to every run (e.g. `-- --cuda`).
"""

import argparse
import ast
import csv
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tools")]
import report  # noqa: E402  (benchmark/report.py)
from _common import ABLATIONS, off_flags  # noqa: E402  (tools/_common.py)

DEFAULT = "default"
BOOTSTRAP_SAMPLES = 10_000


def script_defaults(path):
    """{field: default} of the literal defaults in the script's `class Args` (read with ast; nothing is imported)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            defaults = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    try:
                        defaults[item.target.id] = ast.literal_eval(item.value)
                    except ValueError:  # not a literal (exp_name): no ablation needs it
                        pass
            return defaults
    raise ValueError(f"{path} has no `class Args`")


def applicable(defaults, source):
    """The details this script can switch off: it tags the detail, and its Args has the flag with another default."""
    tagged = [d for d in ABLATIONS if f"# detail {d}:" in source]
    return [d for d in tagged if ABLATIONS[d][0] in defaults and defaults[ABLATIONS[d][0]] != ABLATIONS[d][1]]


def exp_name(stem, detail):
    return f"{stem}__{DEFAULT}" if detail == DEFAULT else f"{stem}__off-{detail}"


def plan(script, envs, seeds, total_timesteps, details, extra):
    """[(env, detail, seed, exp, argv)] in the order they run: seed by seed, so a cut-short ablation stays balanced."""
    stem = Path(script).stem
    commands = []
    for seed in seeds:
        for env in envs:
            for detail in [DEFAULT] + details:
                flags = [] if detail == DEFAULT else off_flags(detail, script)
                argv = [sys.executable, str(script), "--env-id", env, "--seed", str(seed)]
                argv += ["--total-timesteps", str(total_timesteps), "--exp-name", exp_name(stem, detail), *flags, *extra]
                if "--track" in extra:  # wandb: a group per script and env, a tag naming the detail switched off
                    tag = DEFAULT if detail == DEFAULT else f"off-{detail}"
                    argv += ["--wandb-group", f"{stem}__{report.slug(env)}", "--wandb-tags", "ablation", tag]
                commands.append((env, detail, seed, exp_name(stem, detail), argv))
    return commands


def completed_runs(runs_dir, total_timesteps):
    """{(env, exp, seed)} of the runs under `runs_dir` that logged up to the end (within 1% of the total)."""
    if not Path(runs_dir).is_dir():
        return set()
    found, _ = report.find_runs(runs_dir)
    done = set()
    for run in found:
        try:
            report.load(run)
        except Exception:  # an unreadable event file: the run is made again
            continue
        if run.last_step >= 0.99 * total_timesteps:
            done.add((run.env, run.exp, run.seed))
    return done


def run_all(commands, jobs, log_dir, skip):
    """Run the commands, `jobs` at a time (one torch thread each), skipping those in `skip`; return the failed ones."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    pending = [c for c in commands if (c[0], c[3], c[2]) not in skip]
    if len(pending) < len(commands):
        print(f"{len(commands) - len(pending)} of {len(commands)} runs are already complete under runs/; not run again")
    running, failed, total, started = [], [], len(pending), 0
    signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C
    try:
        _run_pending(pending, running, failed, jobs, log_dir, env, total, started)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop the runs (each keeps its logs), say how to go on
        for proc, *_ in running:
            proc.terminate()
        for proc, *_ in running:
            proc.wait()
        print(
            f"interrupted: {len(running)} run(s) stopped, {len(pending)} not started; the same command goes on (complete "
            "runs are not made again)",
            file=sys.stderr,
            flush=True,
        )
        raise
    return failed


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _run_pending(pending, running, failed, jobs, log_dir, env, total, started):
    while pending or running:
        while pending and len(running) < jobs:
            env_id, detail, seed, exp, argv = pending.pop(0)
            started += 1
            log = log_dir / f"{report.slug(env_id)}__{exp}__{seed}.log"
            with open(log, "w", encoding="utf-8") as f:
                proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
            running.append((proc, (env_id, detail, seed, exp, argv), log, time.time()))
            print(f"[{started}/{total}] started {exp} {env_id} seed {seed}", flush=True)
        time.sleep(0.2)
        for item in list(running):
            proc, command, log, start = item
            if proc.poll() is None:
                continue
            running.remove(item)
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {log})"
            print(f"{command[3]} {command[0]} seed {command[2]}: {status} in {time.time() - start:.0f} s", flush=True)
            if proc.returncode != 0:
                failed.append(command)


def bootstrap_interval(a, b, samples=BOOTSTRAP_SAMPLES, seed=0):
    """95% percentile-bootstrap interval of mean(a) - mean(b), resampling each group's seeds with replacement."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diffs = rng.choice(a, (samples, len(a))).mean(1) - rng.choice(b, (samples, len(b))).mean(1)
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def verdict(low, high):
    if low > 0:
        return "better off"
    if high < 0:
        return "worse off"
    return "no measurable difference"


def ablation_rows(groups, stem, details, last=100):
    """One dict per (env, config): per-seed final returns, their mean and std, the difference from the default."""
    rows = []
    for env in sorted({e for e, _ in groups}):
        base_runs = groups.get((env, exp_name(stem, DEFAULT)), [])
        base = [v for v in (report.last_mean(r, last) for r in base_runs) if not math.isnan(v)]
        for detail in [DEFAULT] + details:
            runs = groups.get((env, exp_name(stem, detail)), [])
            if not runs:
                continue
            finals = [report.last_mean(r, last) for r in runs]
            valid = [v for v in finals if not math.isnan(v)]
            row = {"env": env, "detail": detail, "seeds": [r.seed for r in runs], "finals": finals}
            row["steps"] = min(r.last_step for r in runs)
            row["mean"] = float(np.mean(valid)) if valid else math.nan
            row["std"] = float(np.std(valid)) if valid else math.nan
            row["diff"], row["low"], row["high"] = math.nan, math.nan, math.nan
            if detail != DEFAULT and valid and base:
                row["diff"] = row["mean"] - float(np.mean(base))
                if len(valid) > 1 and len(base) > 1:  # one seed has no spread to resample
                    row["low"], row["high"] = bootstrap_interval(valid, base)
            rows.append(row)
    return rows


def plot(env, groups, stem, details, out_path, window):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for k, detail in enumerate([DEFAULT] + details):
        runs = groups.get((env, exp_name(stem, detail)), [])
        c = report.curve(runs, x="step", window=window) if runs else None
        if c is None:
            continue
        grid, mean, std, _ = c
        label = (
            "default (every detail on)" if detail == DEFAULT else f"{detail} off ({' '.join(off_flags(detail, f'{stem}.py'))})"
        )
        style = {"color": "black", "linewidth": 2.2} if detail == DEFAULT else {"color": f"C{k % 10}", "linewidth": 1.2}
        ax.plot(grid, mean, label=f"{label}: {len(runs)} seeds", **style)
        ax.fill_between(grid, mean - std, mean + std, color=style["color"], alpha=0.12, linewidth=0)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episodic return (trailing mean of {window} episodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"{env}, {stem}.py: one detail off at a time (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def _cell(x):
    return "—" if math.isnan(x) else f"{x:.2f}"


def write_report(rows, images, stem, out, last, notes):
    lines = [
        f"# Ablations of {stem}.py",
        "",
        f"Generated by `python benchmark/ablate.py`. Each row switches one detail off (its flags shown), all else at the "
        f"default. Final return: each seed's mean episodic return over its last {last} episodes; mean ± std (ddof=0) over "
        "seeds. Difference: the row's mean minus the default's, with a 95% percentile-bootstrap interval "
        f"({BOOTSTRAP_SAMPLES:,} resamples of each group's seeds with replacement). With 3 seeds the interval is "
        "coarse and tends to be too narrow: read it as a screen, not a test. One seed: no interval.",
        "",
    ]
    for env in sorted({r["env"] for r in rows}):
        lines += [
            f"## {env}",
            "",
            "| detail off | flags | seeds | steps | final return | difference | 95% interval | verdict |",
        ]
        lines += ["|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["env"] == env):
            flags = (
                "(none: the default)" if r["detail"] == DEFAULT else "`" + " ".join(off_flags(r["detail"], f"{stem}.py")) + "`"
            )
            interval = "—" if math.isnan(r["low"]) else f"[{r['low']:.2f}, {r['high']:.2f}]"
            judged = "" if r["detail"] == DEFAULT or math.isnan(r["low"]) else verdict(r["low"], r["high"])
            cells = [r["detail"], flags, ", ".join(map(str, r["seeds"])), f"{r['steps']:,}"]
            cells += [f"{_cell(r['mean'])} ± {_cell(r['std'])}", _cell(r["diff"]), interval, judged]
            lines.append("| " + " | ".join(cells) + " |")
        image = dict(images).get(env)
        lines += ["", f"![{env}]({image})", ""] if image else [""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["env", "detail_off", "flags", "seeds", "steps", "mean", "std", "diff", "low", "high", "per_seed"])
        for r in rows:
            flags = "" if r["detail"] == DEFAULT else " ".join(off_flags(r["detail"], f"{stem}.py"))
            per_seed = " ".join(f"{v:.4f}" for v in r["finals"])
            w.writerow(
                [
                    r["env"],
                    r["detail"],
                    flags,
                    " ".join(map(str, r["seeds"])),
                    r["steps"],
                    r["mean"],
                    r["std"],
                    r["diff"],
                    r["low"],
                    r["high"],
                    per_seed,
                ]
            )


def load_groups(sources, stem, envs, details, seeds, total_timesteps, notes):
    """{(env, exp): [runs]} of this ablation's complete runs in `sources` (folders of runs or episodes .csv.gz files);
    a run that stopped short of the total (within 1%) is left out, with a note."""
    wanted = {exp_name(stem, d) for d in [DEFAULT] + details}
    latest = {}
    for source in sources:
        if Path(source).is_file():
            found = report.read_episodes(source)
        elif Path(source).is_dir():
            found = [r for r in report.find_runs(source)[0] if r.exp in wanted and r.env in envs and r.seed in seeds]
            found = [report.load(r) for r in found]
        else:
            continue
        for run in found:
            key = (run.env, run.exp, run.seed)
            if run.exp in wanted and run.env in envs and run.seed in seeds:
                if key not in latest or latest[key].timestamp < run.timestamp:
                    latest[key] = run
    groups = {}
    for run in sorted(latest.values(), key=lambda r: (r.env, r.exp, r.seed)):
        if run.last_step < 0.99 * total_timesteps:
            notes.append(f"{run.exp} {run.env} seed {run.seed} stopped at step {run.last_step:,}: left out")
            continue
        groups.setdefault((run.env, run.exp), []).append(run)
    return groups


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="the variant script, e.g. ppo.py")
    parser.add_argument("--env-id", nargs="+", required=True, help="one or more env ids (one figure and table each)")
    parser.add_argument("--total-timesteps", type=int, required=True, help="steps of every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds (default: 1 2 3)")
    parser.add_argument("--details", nargs="+", help="the detail ids to switch off (default: every one the script has)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, one torch thread each (default: 1)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    parser.add_argument("--report-only", action="store_true", help="only write the report from the runs there are")
    parser.add_argument("--runs", nargs="+", default=["runs"], help="where the runs are read (folders or episodes .csv.gz)")
    parser.add_argument("--out", help="report folder (default: ablations/<script stem>)")
    parser.add_argument("--log-dir", default="logs/ablate", help="one log per run (default: logs/ablate)")
    parser.add_argument("--last", type=int, default=100, help="episodes per seed in the final return (default: 100)")
    parser.add_argument("--window", type=int, default=100, help="trailing-mean window of the curves (default: 100)")
    opts = parser.parse_args(argv)

    script = Path(opts.script)
    if not script.is_file() and (ROOT / script.name).is_file():
        script = ROOT / script.name
    if not script.is_file():
        print(f"error: no such script: {opts.script}", file=sys.stderr)
        return 2
    try:
        defaults = script_defaults(script)
    except (ValueError, SyntaxError) as e:
        print(f"error: {opts.script}: {e}", file=sys.stderr)
        return 2
    has = applicable(defaults, script.read_text(encoding="utf-8"))
    details = opts.details or has
    unknown = [d for d in details if d not in ABLATIONS]
    if unknown:
        print(f"error: no ablation for {', '.join(unknown)}; the ones there are: {', '.join(ABLATIONS)}", file=sys.stderr)
        return 2
    missing = [d for d in details if d not in has]
    if missing:
        flag = {d: "--" + ABLATIONS[d][0].replace("_", "-") for d in missing}
        why = [
            f"{d} ({flag[d]} is already the 'off' value)" if ABLATIONS[d][0] in defaults else f"{d} (not a detail of it)"
            for d in missing
        ]
        print(f"error: {script.name} cannot switch off {', '.join(why)}; it can: {', '.join(has)}", file=sys.stderr)
        return 2
    if opts.total_timesteps < 1 or opts.jobs < 1 or opts.last < 1 or opts.window < 1 or min(opts.seeds) < 0:
        print("error: --total-timesteps, --jobs, --last and --window must be at least 1, seeds at least 0", file=sys.stderr)
        return 2
    stem = script.stem
    out = Path(opts.out or f"ablations/{stem}")
    commands = plan(script, opts.env_id, opts.seeds, opts.total_timesteps, details, extra)
    if opts.dry_run:
        for command in commands:
            print(shlex.join(command[4]))
        print(
            f"# {len(commands)} runs: {len(details)} details off, plus the default, x {len(opts.env_id)} env(s) x "
            f"{len(opts.seeds)} seed(s); report into {out}"
        )
        return 0
    failed = []
    if not opts.report_only:
        skip = completed_runs("runs", opts.total_timesteps)
        try:
            failed = run_all(commands, opts.jobs, Path(opts.log_dir), skip)
        except KeyboardInterrupt:
            return 130
    notes = [f"{c[3]} {c[0]} seed {c[2]} failed: see its log" for c in failed]
    try:
        groups = load_groups(opts.runs, stem, set(opts.env_id), details, set(opts.seeds), opts.total_timesteps, notes)
    except (OSError, EOFError, KeyError, ValueError, csv.Error) as e:  # not an episodes file, cut short, other columns
        print(f"error: cannot read the runs of {', '.join(opts.runs)} ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if not groups:
        print(f"error: no complete runs of this ablation under {', '.join(opts.runs)}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    expected = {(e, exp_name(stem, d), s) for e in opts.env_id for d in [DEFAULT] + details for s in opts.seeds}
    have = {(r.env, r.exp, r.seed) for runs in groups.values() for r in runs}
    if expected - have:
        notes.append(
            f"{len(expected - have)} of the {len(expected)} runs are missing: "
            + ", ".join(f"{exp} {env} seed {seed}" for env, exp, seed in sorted(expected - have))
        )
    rows = ablation_rows(groups, stem, details, opts.last)
    images = []
    for env in sorted({e for e, _ in groups}):
        image = f"{report.slug(env)}.png"
        plot(env, groups, stem, details, out / image, opts.window)
        images.append((env, image))
    write_report(rows, images, stem, out, opts.last, notes)
    report.write_episodes([r for runs in groups.values() for r in runs], out / "episodes.csv.gz")
    print(f"wrote {out / 'README.md'}, summary.csv, episodes.csv.gz and {len(images)} figure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

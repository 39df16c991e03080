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
Flags after `--` go to every run (e.g. `-- --cuda`); where they change a setting they are part of each run's name
(`{script}__default__with-<hash of the settings>`), so runs made with other flags are neither skipped nor reported.
Every run's flags are checked as its script checks them before any starts. Ctrl-C or SIGTERM goes on to the runs
going (each stops after a checkpoint, its logs kept); the tool then exits with 128 + the signal.
"""

import argparse
import csv
import hashlib
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
from _common import (  # noqa: E402  (tools/_common.py)
    ABLATIONS,
    Runs,
    Stopped,
    exit_with,
    find_script,
    flag_error,
    folder_error,
    given_fields,
    load_script,
    off_flags,
    parse_flags,
    reason,
    script_error,
    writing_into,
)
from report import script_defaults  # noqa: E402  (the literal defaults of a script's Args)

DEFAULT = "default"
BOOTSTRAP_SAMPLES = 10_000


def applicable(defaults, source):
    """The details this script can switch off: it tags the detail, and its Args has the flag with another default."""
    tagged = [d for d in ABLATIONS if f"# detail {d}:" in source]
    return [d for d in tagged if ABLATIONS[d][0] in defaults and defaults[ABLATIONS[d][0]] != ABLATIONS[d][1]]


def exp_name(stem, detail, tag=""):
    """The exp name of a config: `{stem}__default` or `{stem}__off-{detail}`, then `__{tag}` with flags after --."""
    name = f"{stem}__{DEFAULT}" if detail == DEFAULT else f"{stem}__off-{detail}"
    return f"{name}__{tag}" if tag else name


# the flags this tool gives each run itself (not to be given after --)
SET_HERE = {"env_id": "use --env-id", "seed": "use --seeds", "total_timesteps": "use --total-timesteps"}
SET_HERE |= {"exp_name": "it names the config", "wandb_group": "script and env", "wandb_tags": "ablation and the config"}


def settings_tag(script, extra):
    """'' when the flags after -- leave every setting at the script's default, else `with-` and 8 hex digits of a hash
    of the settings they change: part of each run's name, so that runs made with other flags are not taken for this
    ablation's (neither skipped as complete nor reported)."""
    args, _ = parse_flags(script, extra)
    fields, default = load_script(script).Args.__dataclass_fields__, load_script(script).Args()
    changed = sorted((f, repr(getattr(args, f))) for f in fields if getattr(args, f) != getattr(default, f))
    return "with-" + hashlib.sha1(repr(changed).encode()).hexdigest()[:8] if changed else ""


def plan(script, envs, seeds, total_timesteps, details, extra, tag=""):
    """[(env, detail, seed, exp, argv)] in the order they run: seed by seed, so a cut-short ablation stays balanced."""
    stem = Path(script).stem
    commands = []
    for seed in seeds:
        for env in envs:
            for detail in [DEFAULT] + details:
                flags = [] if detail == DEFAULT else off_flags(detail, script)
                exp = exp_name(stem, detail, tag)
                argv = [sys.executable, str(script), "--env-id", env, "--seed", str(seed)]
                argv += ["--total-timesteps", str(total_timesteps), "--exp-name", exp, *flags, *extra]
                if "--track" in extra:  # wandb: a group per script and env, a tag naming the detail switched off
                    label = DEFAULT if detail == DEFAULT else f"off-{detail}"
                    group = f"{stem}__{report.slug(env)}" + (f"__{tag}" if tag else "")
                    argv += ["--wandb-group", group, "--wandb-tags", "ablation", label]
                commands.append((env, detail, seed, exp, argv))
    return commands


def completed_runs(runs_dir, total_timesteps, wanted=None):
    """{(env, exp, seed)} of the runs under `runs_dir` (of the exp names `wanted`) that logged up to the end: within 1%
    below the total, and not past it (a run made with a larger --total-timesteps anneals over another horizon)."""
    if not Path(runs_dir).is_dir():
        return set()
    found, _ = report.find_runs(runs_dir)
    done = set()
    for run in found:
        if wanted is not None and run.exp not in wanted:
            continue
        try:
            report.load(run)
        except Exception:  # an unreadable event file: the run is made again
            continue
        if 0.99 * total_timesteps <= run.last_step <= total_timesteps:
            done.add((run.env, run.exp, run.seed))
    return done


def run_all(commands, jobs, log_dir, skip):
    """Run the commands, `jobs` at a time (one torch thread each), skipping those in `skip`; return the failed ones.
    Stopped after SIGINT or SIGTERM: passed on to the runs going (each stops after a checkpoint, its logs kept)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    pending = [c for c in commands if (c[0], c[3], c[2]) not in skip]
    if len(pending) < len(commands):
        print(f"{len(commands) - len(pending)} of {len(commands)} runs are already complete under runs/; not run again")
    runs, running, failed, total, started, stopped = Runs(), [], [], len(pending), 0, None
    try:
        while pending or running:
            while pending and len(running) < jobs and not runs.signum:
                env_id, detail, seed, exp, argv = pending[0]
                log = log_dir / f"{report.slug(env_id)}__{exp}__{seed}.log"
                with open(log, "w", encoding="utf-8") as f:
                    proc = runs.start(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
                pending.pop(0)
                started += 1
                running.append((proc, (env_id, detail, seed, exp, argv), log, time.time()))
                print(f"[{started}/{total}] started {exp} {env_id} seed {seed}", flush=True)
            time.sleep(0.2)
            stopped = len(running) if runs.signum and stopped is None else stopped
            for item in list(running):
                proc, command, log, start = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                runs.wait(proc)
                status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {log})"
                print(f"{command[3]} {command[0]} seed {command[2]}: {status} in {time.time() - start:.0f} s", flush=True)
                if proc.returncode != 0 and not runs.signum:
                    failed.append(command)
            if runs.signum and not running:
                raise Stopped(runs.signum)
    except (Stopped, OSError) as e:  # a signal (passed on to the runs going), or a log that cannot be written
        stopped = len(running) if stopped is None else stopped
        for proc, *_ in running:
            if isinstance(e, OSError):
                proc.terminate()  # each stops after a checkpoint, its logs kept
            runs.wait(proc)
        if isinstance(e, OSError):
            raise
        print(
            f"interrupted: {stopped} run(s) stopped, {len(pending)} not started; the same command goes on (complete "
            "runs are not made again)",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        runs.restore()
    return failed


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


def ablation_rows(groups, stem, details, last=100, tag=""):
    """One dict per (env, config): per-seed final returns, their mean and std, the difference from the default."""
    rows = []
    for env in sorted({e for e, _ in groups}):
        base_runs = groups.get((env, exp_name(stem, DEFAULT, tag)), [])
        base = [v for v in (report.last_mean(r, last) for r in base_runs) if not math.isnan(v)]
        for detail in [DEFAULT] + details:
            runs = groups.get((env, exp_name(stem, detail, tag)), [])
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


def plot(env, groups, stem, details, out_path, window, tag=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for k, detail in enumerate([DEFAULT] + details):
        runs = groups.get((env, exp_name(stem, detail, tag)), [])
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


def load_groups(sources, stem, envs, details, seeds, total_timesteps, notes, tag=""):
    """{(env, exp): [runs]} of this ablation's complete runs in `sources` (folders of runs or episodes .csv.gz files);
    a run that stopped short of the total (within 1%), or went past it (another --total-timesteps), is left out, with a
    note."""
    wanted = {exp_name(stem, d, tag) for d in [DEFAULT] + details}
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
        if run.last_step > total_timesteps:
            notes.append(f"{run.exp} {run.env} seed {run.seed} ran to step {run.last_step:,}, past the total: left out")
            continue
        groups.setdefault((run.env, run.exp), []).append(run)
    return groups


def input_error(opts, script, extra):
    """A one-line error for arguments this ablation cannot take (nothing is loaded, nothing created), else None."""
    if opts.total_timesteps < 1 or opts.jobs < 1 or opts.last < 1 or opts.window < 1 or min(opts.seeds) < 0:
        return "--total-timesteps, --jobs, --last and --window must be at least 1, seeds at least 0"
    for flag, values in (("--seeds", opts.seeds), ("--env-id", opts.env_id), ("--details", opts.details or [])):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            return f"{flag}: {', '.join(twice)} given twice; give each once"
    for name, flag in sorted(given_fields(extra, SET_HERE).items()):
        return f"{flag} after --: ablate.py sets it for each run ({SET_HERE[name]}); drop it"
    for flag, folder in (("--out", opts.out or f"ablations/{script.stem}"), ("--log-dir", opts.log_dir)):
        error = folder_error(folder, flag)
        if error:
            return error
    absent = [s for s in opts.runs if not Path(s).exists() and (opts.report_only or s != "runs")]
    if absent:
        return f"--runs {absent[0]}: no such folder or episodes file"
    return None


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

    script = find_script(opts.script)
    error = script_error(script)
    if error:
        print(f"error: {error}", file=sys.stderr)
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
    error = input_error(opts, script, extra)
    switched = sorted(given_fields(extra, {ABLATIONS[d][0] for d in details}).items())
    if not error and switched:
        off = next(d for d in details if ABLATIONS[d][0] == switched[0][0])
        error = f"{switched[0][1]} after --: the flag of {off}, which the ablation switches off itself; drop it"
    error = error or (parse_flags(script, extra)[1] if extra else None)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stem, tag = script.stem, settings_tag(script, extra) if extra else ""
    out = Path(opts.out or f"ablations/{stem}")
    commands = plan(script, opts.env_id, opts.seeds, opts.total_timesteps, details, extra, tag)
    if not (opts.report_only or opts.dry_run):  # each run's flags as its script checks them, before any starts (a
        # dry run prints the commands, which may run on another machine)
        for command in commands:
            error = flag_error(script, command[4][2:])
            if error:
                print(f"error: {error} (nothing was run)", file=sys.stderr)
                return 2
    if tag:
        print(f"# flags after --: {shlex.join(extra)}; this ablation's runs are named {exp_name(stem, DEFAULT, tag)} etc.")
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
        try:
            skip = completed_runs("runs", opts.total_timesteps, {c[3] for c in commands})
        except KeyboardInterrupt:  # Ctrl-C while the runs there are read: nothing started
            print("interrupted before any run started", file=sys.stderr)
            return 128 + signal.SIGINT
        try:
            failed = run_all(commands, opts.jobs, Path(opts.log_dir), skip)
        except Stopped as stop:
            return 128 + stop.signum
        except OSError as e:  # the log folder or a log file cannot be written
            print(f"error: cannot write the logs under {opts.log_dir} ({reason(e)})", file=sys.stderr)
            return 1
    notes = [f"{c[3]} {c[0]} seed {c[2]} failed: see its log" for c in failed]
    if tag:
        notes.append(f"every run had the flags `{shlex.join(extra)}` (the runs named {exp_name(stem, DEFAULT, tag)} etc.)")
    try:
        groups = load_groups(opts.runs, stem, set(opts.env_id), details, set(opts.seeds), opts.total_timesteps, notes, tag)
    except (OSError, EOFError, KeyError, ValueError, csv.Error) as e:  # not an episodes file, cut short, other columns
        print(f"error: cannot read the runs of {', '.join(opts.runs)} ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    if not groups:
        print(f"error: no complete runs of this ablation under {', '.join(opts.runs)}", file=sys.stderr)
        return 1
    expected = {(e, exp_name(stem, d, tag), s) for e in opts.env_id for d in [DEFAULT] + details for s in opts.seeds}
    have = {(r.env, r.exp, r.seed) for runs in groups.values() for r in runs}
    if expected - have:
        notes.append(
            f"{len(expected - have)} of the {len(expected)} runs are missing: "
            + ", ".join(f"{exp} {env} seed {seed}" for env, exp, seed in sorted(expected - have))
        )
    rows = ablation_rows(groups, stem, details, opts.last, tag)
    images = [(env, f"{report.slug(env)}.png") for env in sorted({e for e, _ in groups})]
    try:
        with writing_into(out) as tmp:  # all or nothing: a full disk leaves the report that was there
            for env, image in images:
                plot(env, groups, stem, details, tmp / image, opts.window, tag)
            write_report(rows, images, stem, tmp, opts.last, notes)
            report.write_episodes([r for runs in groups.values() for r in runs], tmp / "episodes.csv.gz")
    except OSError as e:
        print(f"error: cannot write the report into {out} ({reason(e)}); what was there is kept", file=sys.stderr)
        return 1
    print(f"wrote {out / 'README.md'}, summary.csv, episodes.csv.gz and {len(images)} figure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    exit_with(main)

"""Reproduction report from TensorBoard event files: learning curves and a table next to the published numbers.

    python benchmark/report.py runs/ --out report/
    python benchmark/report.py runs/ --out docs/results/ --per 100000   # the committed results (README's Results)
    python benchmark/report.py docs/results/episodes.csv.gz more_runs/ --out docs/results/ --per 100000  # add runs

Reads every run directory under the given folder(s) (names `{env_id}__{exp_name}__{seed}__{timestamp}`; an env id
with a namespace such as ALE/Pong-v5 makes a nested folder), groups the runs by env, script (exp_name) and the
settings they changed from the script's defaults (from the `hyperparameters` text each run logs; shown as the
script's flags, e.g. `ppo_atari_envpool.py --channels-last --bf16`: one script's runs with other settings are other
rows, never averaged together; a run resumed with other settings, such as a --bf16 run resumed with --no-bf16 or a run
extended by a larger --total-timesteps, is named by each segment's, with the step each took over from, and is a row of
its own), and writes into --out: one PNG per env (mean ± std over seeds of the episodic return
against steps and against training time), README.md with a table of the mean ± std over seeds of each seed's
last-100-episode mean return next to the published numbers (benchmark/reference.csv) and their ratio, and
summary.csv. Needs nothing but the event files.

Training time is a run's wall time less its pauses: a gap of over 5 minutes (PAUSE) between two of its logged values
(a run stopped and later resumed with --resume, or suspended) is not training. From the event files every iteration's
values count; from an episodes file, the pauses it recorded (or, in a file written before it recorded them, the gaps
between its episodes).
"""

import argparse
import ast
import csv
import gzip
import math
import re
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from _common import exit_with, folder_error, reason, writing_into  # noqa: E402  (tools/_common.py)

RETURN_TAG = "charts/episodic_return"
# scripts without a published table of their own, compared with the table of the script they reproduce
REFERENCE_SCRIPT = {"ppo_atari_envpool.py": "ppo_atari.py", "ppo_atari_multigpu.py": "ppo_atari.py"}
BASELINES = [("ppo2", "ppo2"), ("cleanrl", "CleanRL")]  # (baseline column of reference.csv, table heading)
PAUSE = 300.0  # seconds: a longer gap between a run's logged values is a pause (every script logs each iteration)
HYPERPARAMETERS_TAG = "hyperparameters/text_summary"  # the `|param|value|` table each script logs at its start
# settings that name, place, watch or save a run but leave what it learns alone: never part of a run's flags
# (total_timesteps: the steps column says it; batch_size etc.: computed from the others)
NOT_FLAGS = {"exp_name", "seed", "env_id", "total_timesteps", "torch_deterministic", "cuda", "torch_threads", "track"}
NOT_FLAGS |= {"wandb_project_name", "wandb_entity", "wandb_group", "wandb_tags", "capture_video", "save_model"}
NOT_FLAGS |= {"save_every", "resume", "eval_checkpoint", "eval_episodes", "batch_size", "minibatch_size", "num_iterations"}


@dataclass
class Run:
    env: str
    exp: str
    seed: int
    timestamp: int
    path: Path
    returns: list = field(default_factory=list)  # [(step, wall_time, value)] in logging order
    start_time: float = 0.0
    last_step: int = 0
    last_time: float = 0.0
    flags: str = ""  # the settings changed from the script's defaults, as flags ('' for none, or where not known)
    pauses: list = field(default_factory=list)  # [(from, to)] wall times of the gaps that were not training

    @property
    def label(self):
        """The script and its changed settings: `ppo_atari_envpool.py --channels-last --bf16`."""
        return f"{self.exp}.py" + (f" {self.flags}" if self.flags else "")


def parse_run_name(rel):
    """'ALE/Pong-v5__ppo_atari__1__1700000000' -> ('ALE/Pong-v5', 'ppo_atari', 1, 1700000000); None if not a run name."""
    parts = rel.split("__")
    if len(parts) < 4 or not parts[-2].isdigit() or not parts[-1].isdigit() or not parts[0] or not all(parts[1:-2]):
        return None
    return parts[0], "__".join(parts[1:-2]), int(parts[-2]), int(parts[-1])


def find_runs(root):
    """The runs under `root` (folders holding event files whose path below `root` is a run name); and skipped folders."""
    root = Path(root)
    runs, skipped = [], []
    for folder in sorted({p.parent for p in root.rglob("events.out.tfevents.*") if p.is_file()}):
        rel = folder.name if folder == root else folder.relative_to(root).as_posix()
        parsed = parse_run_name(rel)
        if parsed is None:
            skipped.append(folder)
        else:
            runs.append(Run(*parsed, path=folder))
    return runs, skipped


EPISODE_COLUMNS = ["env", "exp", "seed", "timestamp", "start_time", "last_step", "last_time", "step", "wall_time", "return"]


def find_pauses(times):
    """[(from, to)] of the gaps of over PAUSE seconds between consecutive wall times (sorted here)."""
    times = sorted(times)
    return [(a, b) for a, b in zip(times, times[1:]) if b - a > PAUSE]


def training_time(run, t):
    """Seconds from the run's start to wall time `t`, less the parts of its pauses before `t`."""
    return t - run.start_time - sum(max(0.0, min(b, t) - a) for a, b in run.pauses)


def write_episodes(runs, path):
    """Every episode of the loaded `runs` as one gzipped CSV: the report can be made again from it (no event files).
    A `flags` column follows where some run changed a setting, and a `pauses` column (`from:to` wall times, separated
    by spaces) where some run paused (files of default, unpaused runs stay as they were)."""
    flagged, paused = any(r.flags for r in runs), any(r.pauses for r in runs)
    with gzip.open(path, "wt", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(EPISODE_COLUMNS + ["flags"] * flagged + ["pauses"] * paused)
        for r in runs:
            head = [r.env, r.exp, r.seed, r.timestamp, f"{r.start_time:.3f}", r.last_step, f"{r.last_time:.3f}"]
            tail = [r.flags] * flagged + [" ".join(f"{a:.3f}:{b:.3f}" for a, b in r.pauses)] * paused
            for step, wall, value in r.returns or [(r.last_step, r.last_time, math.nan)]:  # a run without episodes too
                w.writerow(head + [step, f"{wall:.3f}", repr(value)] + tail)


def parse_pauses(cell):
    """[(from, to)] of a `pauses` cell ('from:to from:to'); ValueError where it is not that."""
    pauses = [tuple(float(t) for t in pair.split(":")) for pair in (cell or "").split()]
    if any(len(p) != 2 or not all(map(math.isfinite, p)) or p[1] < p[0] for p in pauses):
        raise ValueError(f"pauses {cell!r}: not 'from:to' wall times")
    return pauses


def read_episodes(path):
    """The runs of a CSV written by write_episodes, loaded (returns, times, last step and pauses filled in)."""
    runs = {}
    with gzip.open(path, "rt", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        recorded = "pauses" in (reader.fieldnames or [])
        for row in reader:
            key = (row["env"], row["exp"], int(row["seed"]), int(row["timestamp"]), row.get("flags") or "")
            if key not in runs:
                runs[key] = Run(*key[:4], path=Path(f"{path}#{'__'.join(map(str, key[:4]))}"), flags=key[4])
                run = runs[key]
                run.start_time, run.last_step = float(row["start_time"]), int(row["last_step"])
                run.last_time = float(row["last_time"])
                if recorded:
                    run.pauses = parse_pauses(row["pauses"])
            if row["return"] != "nan":
                runs[key].returns.append((int(row["step"]), float(row["wall_time"]), float(row["return"])))
    if not recorded:  # written before pauses were recorded: the gaps between the episodes (all the file has)
        for run in runs.values():
            run.pauses = find_pauses([run.start_time, run.last_time] + [w for _, w, _ in run.returns])
    return list(runs.values())


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
                    except ValueError:  # not a literal (exp_name)
                        pass
            return defaults
    raise ValueError(f"{path} has no `class Args`")


def logged_settings(text):
    """{param: value as logged} of a run's `|param|value|` hyperparameters table."""
    settings = {}
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) >= 4 and cells[0] == "" and cells[-1] == "" and cells[1] not in ("param", "-"):
            settings[cells[1]] = "|".join(cells[2:-1])
    return settings


def changed_flags(settings, defaults):
    """The settings that differ from the defaults, as the script's flags (tyro's: `--bf16`, `--no-anneal-lr`,
    `--clip-coef 0.2`), in the script's order; those without a known literal default and NOT_FLAGS are left out."""
    flags = []
    for name, default in defaults.items():
        if name in NOT_FLAGS or name not in settings or settings[name] == str(default):
            continue
        flag = name.replace("_", "-")
        if isinstance(default, bool) and settings[name] in ("True", "False"):
            flags.append(f"--{flag}" if settings[name] == "True" else f"--no-{flag}")
        else:
            flags.append(f"--{flag} {settings[name]}")
    return " ".join(flags)


_DEFAULTS = {}


def segment_flags(segments, defaults):
    """A run's flags from its segments' settings [(first step, {param: value})]: one segment's changed settings, or,
    where a resume changed them (--no-bf16, --channels-last, a larger --total-timesteps), each segment's, the later
    ones with the step they took over from (`--bf16; from step 6883328: (defaults)`), so that a mixed run is never
    averaged with runs that kept one setting throughout."""
    totals = {settings.get("total_timesteps") for _, settings in segments}
    flags, last = [], None
    for step, settings in segments:
        said = changed_flags(settings, defaults)
        if len(totals) > 1:  # an extended run: its learning-rate schedule was recomputed over the new total
            said = f"{said} --total-timesteps {settings.get('total_timesteps')}".strip()
        if said != last:
            flags.append(said if not flags else f"from step {step}: {said or '(defaults)'}")
        last = said
    if len(flags) > 1 and not flags[0]:
        flags[0] = "(defaults)"
    return "; ".join(flags)


def defaults_of(exp):
    """The defaults of the script the runs of `exp` ran (`{exp}.py` beside benchmark/), or {} where there is none
    (another --exp-name, an ablation's config name): their changed settings are then not named."""
    if exp not in _DEFAULTS:
        script = HERE.parent / f"{exp}.py"
        try:
            _DEFAULTS[exp] = script_defaults(script) if script.is_file() else {}
        except (ValueError, SyntaxError, OSError):
            _DEFAULTS[exp] = {}
    return _DEFAULTS[exp]


def load(run):
    """Fill the run's episodic returns, start time, last step, last time, pauses and changed settings from its event
    files."""
    acc = EventAccumulator(str(run.path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    if HYPERPARAMETERS_TAG in acc.Tags()["tensors"]:  # each segment's (before 2026-12-05, the first segment's only)
        texts = {e.step: e.tensor_proto.string_val[0].decode("utf-8", "replace") for e in acc.Tensors(HYPERPARAMETERS_TAG)}
        run.flags = segment_flags([(step, logged_settings(texts[step])) for step in sorted(texts)], defaults_of(run.exp))
    tags = acc.Tags()["scalars"]
    events = {tag: acc.Scalars(tag) for tag in tags}
    run.returns = [(e.step, e.wall_time, e.value) for e in events.get(RETURN_TAG, [])]
    every = [e for evs in events.values() for e in evs]
    try:
        run.start_time = acc.FirstEventTimestamp()
    except ValueError:
        run.start_time = min((e.wall_time for e in every), default=0.0)
    run.last_step = max((e.step for e in every), default=0)
    run.last_time = max((e.wall_time for e in every), default=run.start_time)
    run.pauses = find_pauses([run.start_time] + [e.wall_time for e in every])
    return run


def last_mean(run, last=100):
    """Mean of the run's last `last` episodic returns (NaN without episodes)."""
    values = [v for _, _, v in run.returns[-last:]]
    return float(np.mean(values)) if values else math.nan


def window_means(run, per):
    """Mean episodic return of the episodes that ended in each window of `per` steps, up to the run's last step."""
    count = max(1, -(-run.last_step // per))
    sums, counts = np.zeros(count), np.zeros(count)
    for step, _, value in run.returns:
        k = min(max(step - 1, 0) // per, count - 1)
        sums[k], counts[k] = sums[k] + value, counts[k] + 1
    with np.errstate(invalid="ignore"):
        return list(sums / counts)  # NaN in a window without a finished episode


def trailing_mean(values, window):
    """At each episode, the mean of the last `window` episodes up to it."""
    c = np.cumsum(np.insert(np.asarray(values, dtype=float), 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def curve(runs, x="step", window=100, points=200):
    """(grid, mean, std, count) over seeds of the trailing-mean return; x = 'step' or 'time' (training_time, s).

    A seed's curve runs from its first episode to the end of its run (its last logged step or time, holding its last
    value). The grid spans the range all seeds cover; where they do not overlap at all, each seed counts only inside
    its own range (count says how many seeds each point averages)."""
    series = []
    for run in runs:
        if not run.returns:
            continue
        xs = [s if x == "step" else training_time(run, w) for s, w, _ in run.returns]
        ys = list(trailing_mean([v for _, _, v in run.returns], window))
        end = run.last_step if x == "step" else training_time(run, run.last_time)
        if end > xs[-1]:
            xs, ys = xs + [end], ys + [ys[-1]]
        series.append((np.array(xs, dtype=float), np.array(ys)))
    if not series:
        return None
    lo, hi = max(xs[0] for xs, _ in series), min(xs[-1] for xs, _ in series)
    if hi < lo:  # the seeds share no range: the union, each seed inside its own range
        lo, hi = min(xs[0] for xs, _ in series), max(xs[-1] for xs, _ in series)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    table = np.full((len(series), len(grid)), np.nan)
    for i, (xs, ys) in enumerate(series):
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        table[i, inside] = np.interp(grid[inside], xs, ys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return grid, np.nanmean(table, axis=0), np.nanstd(table, axis=0), np.sum(~np.isnan(table), axis=0)


def load_reference(path):
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            row["steps"], row["seeds"] = int(row["steps"]), int(row["seeds"])
            row["mean"], row["std"] = float(row["mean"]), float(row["std"])
            rows.append(row)
    return rows


def _family(env_id):
    return re.sub(r"-v\d+$", "", env_id)


def references_for(reference, env, script):
    """{baseline: row} of the published numbers for (env, script): the exact env id first, else another version."""
    script = REFERENCE_SCRIPT.get(script, script)
    found = {}
    for exact in (True, False):
        for row in reference:
            same_env = row["env"] == env if exact else _family(row["env"]) == _family(env)
            if row["script"] == script and same_env and row["baseline"] not in found:
                found[row["baseline"]] = row
    return found


def slug(env):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", env)


def _fmt(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.2f}"


def _steps(n):
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1e6:g}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def _duration(seconds):
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def summarize(groups, reference, last=100):
    """One dict per (env, script, flags) group: seeds, steps, per-seed last-`last` means, their mean and std,
    references (those of the script: its flags change the run, not the published numbers it is set beside)."""
    rows = []
    for (env, exp, _), runs in sorted(groups.items()):
        per_seed = [last_mean(r, last) for r in runs]
        valid = [v for v in per_seed if not math.isnan(v)]
        script = exp + ".py"
        rows.append(
            {
                "env": env,
                "script": script,
                "label": runs[0].label,
                "seeds": [r.seed for r in runs],
                "steps": min(r.last_step for r in runs),
                "episodes": min(len(r.returns) for r in runs),
                "time": float(np.mean([training_time(r, r.last_time) for r in runs])),
                "per_seed": per_seed,
                "mean": float(np.mean(valid)) if valid else math.nan,
                "std": float(np.std(valid)) if valid else math.nan,
                "refs": references_for(reference, env, script),
            }
        )
    return rows


def _betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b) (a continued fraction, modified Lentz; no scipy needed)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point: use the symmetry there
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1.0 + num / c
        c = c if abs(c) > 1e-300 else 1e-300
        f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * (f - 1.0)


def welch(values, ref):
    """Welch's t-test of our per-seed figures against a published mean ± std over ref['seeds'] seeds: (t, two-sided p),
    or None with fewer than 2 seeds a side or no spread at all. Both stds are taken as numpy's (ddof=0), ours as the
    report prints it and the published one assumed alike, and made sample stds (ddof=1) for the test."""
    values = [v for v in values if not math.isnan(v)]
    n1, n2 = len(values), ref["seeds"]
    if n1 < 2 or n2 < 2:
        return None
    v1 = float(np.var(values, ddof=1)) / n1
    v2 = ref["std"] ** 2 * n2 / (n2 - 1) / n2
    if v1 + v2 == 0:
        return None
    t = (float(np.mean(values)) - ref["mean"]) / math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))  # Welch-Satterthwaite
    return t, _betainc(df / 2, 0.5, df / (df + t * t))  # P(|T| >= |t|) for Student's t with df degrees of freedom


def curve_label(exp, runs):
    """The legend of a group's curve: its script, its seeds and the steps of its shortest seed."""
    seeds = ", ".join(str(r.seed) for r in sorted(runs, key=lambda r: r.seed))
    return f"{exp}: seed{'s' if len(runs) > 1 else ''} {seeds}, {_steps(min(r.last_step for r in runs))} steps"


def within_reach(row, runs):
    """Whether the runs got to at least half the published step count; a final return published far past the runs'
    end (Breakout's 409 at 10M beside runs of 1M) would squash their curves flat, so it is named but not drawn."""
    return 2 * max(r.last_step for r in runs) >= row["steps"]


def plot_env(env, groups, refs_by_script, out_path, window):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    longest = max((training_time(r, r.last_time) for runs in groups.values() for r in runs), default=0)
    unit, scale = ("hours", 3600.0) if longest > 2 * 3600 else ("minutes", 60.0) if longest > 120 else ("seconds", 1.0)
    drawn = set()  # the scripts whose published lines are drawn (once, beside several settings of one script)
    for k, ((exp, flags), runs) in enumerate(sorted(groups.items())):
        color = f"C{k % 10}"
        for ax, x in zip(axes, ("step", "time")):
            c = curve(runs, x=x, window=window)
            if c is None:
                continue
            grid, mean, std, count = c
            grid = grid if x == "step" else grid / scale
            ax.plot(grid, mean, color=color, label=curve_label(f"{exp} {flags}".strip(), runs))
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, linewidth=0)
        if exp in drawn:
            continue
        drawn.add(exp)
        for baseline, style in (("ppo2", "--"), ("cleanrl", ":")):
            row = refs_by_script.get(exp, {}).get(baseline)
            label = row and f"{baseline} {row['env']} @ {_steps(row['steps'])}"
            if row and not within_reach(row, runs):  # named in the legend, not drawn
                axes[0].plot([], [], " ", label=f"{label}: {row['mean']:.1f} (not drawn: the runs are shorter)")
            elif row:
                axes[0].axhline(row["mean"], color=color, linestyle=style, linewidth=1, label=label)
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel(f"training time ({unit})")
    axes[0].set_ylabel(f"episodic return (trailing mean of {window} episodes)")
    for ax in axes:
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    rect = (0, 0, 1, 1)
    if len(labels) > 6:  # a long legend would hide the curves: below the panels, in two columns
        extra = 0.18 * math.ceil(len(labels) / 2)  # inches: 0.18 a row of two entries
        fig.set_size_inches(12, 4.2 + extra)
        fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
        rect = (0, extra / (4.2 + extra), 1, 1)
    else:
        axes[0].legend(fontsize=8)
    fig.suptitle(f"{env}: mean ± std over seeds (the curves end where the shortest seed ends)")
    fig.tight_layout(rect=rect)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def window_table(groups, per):
    """Markdown lines: per run, the mean return of the episodes that ended in each window of `per` steps."""
    runs = [r for _, rs in sorted(groups.items()) for r in rs]
    width = max(len(window_means(r, per)) for r in runs)
    heads = [f"{_steps(k * per)}–{_steps((k + 1) * per)}" for k in range(width)]
    lines = ["| env | script | seed | " + " | ".join(heads) + " |", "|---|---|---|" + "---|" * width]
    for r in runs:
        means = window_means(r, per)
        cells = [_fmt(v) if not math.isnan(v) else "—" for v in means] + [""] * (width - len(means))
        lines.append(f"| {r.env} | {r.label} | {r.seed} | " + " | ".join(cells) + " |")
    return lines


def write_readme(rows, out, images, notes, last, per_table=None):
    lines = [
        "# Reproduction report",
        "",
        "Generated by `python benchmark/report.py` from TensorBoard event files. For each seed, the mean episodic "
        f"return (`{RETURN_TAG}`) of its last {last} episodes; then the mean ± std (numpy's, ddof=0) over seeds. "
        "Published: mean ± std over seeds at the step count shown (benchmark/reference.csv); ratio = ours / published "
        "(for negative returns a ratio above 1 is worse); p = Welch's two-sided t-test of the seeds' figures against "
        "the published mean ± std and seed count (both stds taken as numpy's and made sample stds; — : under 2 seeds "
        "a side, no spread, or fewer steps than published). Training time: the mean over seeds of each run's wall time "
        f"less its pauses (gaps of over {PAUSE / 60:g} minutes between its logged values: stopped and resumed, or "
        "suspended).",
        "",
        "| env | script | seeds | steps | training time | return (ours) | "
        + " | ".join(f"{h} | ratio | p" for _, h in BASELINES)
        + " |",
        "|---|---|---|---|---|---|" + "---|---|---|" * len(BASELINES),
    ]
    footnotes = set()
    for row in rows:
        ours = f"{_fmt(row['mean'])} ± {_fmt(row['std'])}" if not math.isnan(row["mean"]) else "no episodes"
        cells = [
            row["env"],
            row["label"],
            ", ".join(map(str, row["seeds"])),
            _steps(row["steps"]),
            _duration(row["time"]),
            ours,
        ]
        for baseline, _ in BASELINES:
            ref = row["refs"].get(baseline)
            if ref is None:
                cells += ["—", "—", "—"]
                continue
            mark = ""
            if ref["env"] != row["env"]:
                mark += f" ({ref['env']})"
            if ref["script"] != row["script"]:
                mark += " †"
                footnotes.add(f"† compared with the published numbers of {ref['script']}, the script it reproduces.")
            cells.append(f"{_fmt(ref['mean'])} ± {_fmt(ref['std'])} @ {_steps(ref['steps'])}{mark}")
            ratio = row["mean"] / ref["mean"] if ref["mean"] != 0 and not math.isnan(row["mean"]) else math.nan
            cells.append(_fmt(ratio))
            test = welch(row["per_seed"], ref) if row["steps"] >= 0.99 * ref["steps"] else None  # like for like only
            cells.append(_fmt(test[1]) if test else "—")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + sorted(footnotes) + ([""] if footnotes else [])
    # shorter by more than one batch or so: 1M steps of 2048-step batches end at 999,424, as ppo2's own runs did
    short = [r for r in rows if any(r["steps"] < 0.99 * ref["steps"] for ref in r["refs"].values())]
    if short:
        lines += [
            "Runs shorter than the published step count (the comparison is not like for like): "
            + ", ".join(f"{r['env']} {r['label']} ({_steps(r['steps'])})" for r in short)
            + ".",
            "",
        ]
    if per_table:
        lines += ["## Mean return per window of steps", "", "The episodes that ended in each window; — : none did.", ""]
        lines += per_table + [""]
    lines += ["## Learning curves", ""]
    for env, image in images:
        lines += [f"### {env}", "", f"![{env}]({image})", ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    sources = sorted({(ref["baseline"], ref["source"]) for row in rows for ref in row["refs"].values()})
    if sources:
        lines += ["## Sources of the published numbers", ""] + [f"- {b}: {s}" for b, s in sources] + [""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def write_summary_csv(rows, out):
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["env", "script", "seeds", "steps", "mean", "std", "per_seed"])
        for r in rows:
            per_seed = " ".join(f"{v:.4f}" for v in r["per_seed"])
            w.writerow([r["env"], r["label"], " ".join(map(str, r["seeds"])), r["steps"], r["mean"], r["std"], per_seed])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="folder(s) holding the run directories (e.g. runs/)")
    parser.add_argument("--out", default="report", help="output folder (default: report/)")
    parser.add_argument("--reference", default=str(HERE / "reference.csv"), help="published numbers (CSV)")
    parser.add_argument("--last", type=int, default=100, help="episodes per seed in the final score (default: 100)")
    parser.add_argument("--window", type=int, default=100, help="trailing-mean window of the curves (default: 100)")
    parser.add_argument("--per", type=int, default=0, help="also tabulate each run's mean return per this many steps")
    args = parser.parse_args(argv)
    if args.last < 1 or args.window < 1 or args.per < 0:
        print("error: --last and --window must be at least 1, --per at least 0 (0: no table)", file=sys.stderr)
        return 2
    error = folder_error(args.out, "--out")
    if not error and not Path(args.reference).is_file():
        error = f"--reference {args.reference}: no such file (the published numbers, a CSV like benchmark/reference.csv)"
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    runs, notes, loaded = [], [], set()
    for root in args.runs:
        if Path(root).is_file() and root.endswith(".csv.gz"):  # episodes exported by an earlier report
            try:
                found = read_episodes(root)
            except (OSError, EOFError, KeyError, ValueError, csv.Error) as e:  # not gzip, cut short, other columns
                print(
                    f"error: {root} is not an episodes file written by this report ({type(e).__name__}: {e})", file=sys.stderr
                )
                return 2
            runs += found
            loaded.update(id(r) for r in found)
            continue
        if not Path(root).is_dir():
            print(f"error: {root} is neither a folder of runs nor an episodes .csv.gz", file=sys.stderr)
            return 2
        found, skipped = find_runs(root)
        if not found:  # a folder given, but nothing in it to report: a wrong path, not an empty result
            named = "{env_id}__{exp_name}__{seed}__{timestamp}"
            print(f"error: {root} holds no run directories (folders named {named} with event files)", file=sys.stderr)
            return 1
        runs += found
        notes += [f"skipped {p}: not named {{env_id}}__{{exp_name}}__{{seed}}__{{timestamp}}" for p in skipped]
    readable = []
    for run in runs:  # loaded first: a run's changed settings (its flags) are in its event files
        try:
            if id(run) not in loaded:
                load(run)
        except Exception as e:  # a corrupt or unreadable event file: skip the run, say so
            notes.append(f"skipped {run.path}: cannot read its event files ({type(e).__name__}: {e})")
            continue
        readable.append(run)
    latest = {}
    for run in readable:  # one run per (env, script, flags, seed): the latest
        key = (run.env, run.exp, run.flags, run.seed)
        if key in latest:
            older, newer = sorted([latest[key], run], key=lambda r: r.timestamp)
            notes.append(f"{older.path}: an older run of the same env, script, flags and seed; the later one is used")
            latest[key] = newer
        else:
            latest[key] = run
    groups = defaultdict(list)
    for run in sorted(latest.values(), key=lambda r: (r.env, r.exp, r.flags, r.seed)):
        groups[(run.env, run.exp, run.flags)].append(run)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not groups:
        print(f"error: no run directories with event files under {', '.join(args.runs)}", file=sys.stderr)
        return 1

    try:
        reference = load_reference(args.reference)
    except (OSError, KeyError, ValueError) as e:
        print(f"error: cannot read the published numbers from {args.reference}: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    rows = summarize(groups, reference, args.last)
    images = [(env, f"{slug(env)}.png") for env in sorted({env for env, _, _ in groups})]
    try:
        with writing_into(out) as tmp:  # all or nothing: a full disk leaves the report that was there
            for env, image in images:
                by_exp = {(exp, flags): rs for (e, exp, flags), rs in groups.items() if e == env}
                refs = {exp: references_for(reference, env, exp + ".py") for exp, _ in by_exp}
                plot_env(env, by_exp, refs, tmp / image, args.window)
            write_readme(rows, tmp, images, notes, args.last, window_table(groups, args.per) if args.per else None)
            write_summary_csv(rows, tmp)
            write_episodes([r for rs in groups.values() for r in rs], tmp / "episodes.csv.gz")
    except OSError as e:
        print(f"error: cannot write the report into {out} ({reason(e)}); what was there is kept", file=sys.stderr)
        return 1
    print(f"wrote {out / 'README.md'}, summary.csv, episodes.csv.gz and {len(images)} figure(s) from {len(latest)} run(s)")
    return 0


if __name__ == "__main__":
    exit_with(main)

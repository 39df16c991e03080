"""Lineage diffs: each variant script against its parent.

    python tools/lineage.py                 # table of each pair's changed lines against its budget (exit 1 if over)
    python tools/lineage.py --diff CHILD    # the unified diff of CHILD against its parent
    python tools/lineage.py --html          # side-by-side HTML page per pair under docs/diffs/, plus an index
    python tools/lineage.py --check-shared  # shared passages identical: layer_init, Atari *Env wrappers, Args fields

Changed lines are the lines starting with + or - in `diff -u PARENT CHILD`, the two file headers excluded.
"""

import argparse
import ast
import difflib
import html
import shutil
import subprocess
import sys
from pathlib import Path

from _common import ATARI_SCRIPTS, PARENTS, ROOT, VARIANTS, script_name

# changed-line budget of each child against its parent
BUDGETS = {
    "ppo_shared.py": 40,
    "ppo_atari.py": 185,  # 160 until the fidelity issue (14): ppo2's 400k-frame game length, a flag (+13); 175 until
    # the ablation flags (issue 17): noop_max, episodic_life, fire_reset, clip_reward and frame_stack (+7)
    "ppo_continuous_action.py": 160,  # 120 until issue 9 wrote the distributions out: a Normal replaces a Categorical
    # (127), and ppo2's RunningMeanStd (15 lines; gymnasium's runs np.mean/np.var with 40 us of overhead per step)
    # (142 until the ablation flags of issue 17: clip_action, norm_obs, clip_obs, norm_reward, clip_reward, +16)
    "ppo_atari_lstm.py": 160,
    "ppo_multidiscrete.py": 285,  # issue 8 set 160; measured 225: removing the Atari wrappers and CNN alone is ~120 lines
    # (230 until the parents wrote their Categorical out, issue 9; 235 until issue 14 gave the parent a frame limit, +9,
    # and had the log-probs count only the cells the env executes, +20; 263 until the parent's Atari ablation flags, +7,
    # which a MicroRTS script drops with the Atari wrappers)
    "ppo_multidiscrete_mask.py": 60,
    "ppo_atari_envpool.py": 235,  # 151 as ale-py's vector env; envpool with ppo2's game (issue 14) 221; +5: no envpool
    "ppo_atari_multigpu.py": 130,  # measured 115 when written; 123 with the run-dir check and the group destroyed (issue 15)
}

# Args fields whose default a child may change (its own details or its domain's published settings);
# every other field present in both parent and child must have the same annotation, default and docstring
_DOMAIN = ["env_id", "total_timesteps", "learning_rate", "num_envs", "num_steps", "num_minibatches", "update_epochs"]
_DOMAIN += ["clip_coef", "ent_coef"]
_CNN = ["torch_threads"]  # the CNN scripts keep torch's default threads (a quiet CPU: 1.4-1.6x the SPS of 1 thread)
ARGS_DEFAULTS_MAY_DIFFER = {
    "ppo_shared.py": [],
    "ppo_atari.py": _DOMAIN + _CNN,
    "ppo_continuous_action.py": _DOMAIN,
    "ppo_atari_lstm.py": ["frame_stack"],  # 1: the blog's "no frame stack" for the LSTM (atari-7)
    "ppo_atari_envpool.py": ["env_id", "total_timesteps", "num_envs", "num_minibatches", "update_epochs", "clip_coef"],
    "ppo_atari_multigpu.py": ["num_envs", "total_timesteps"],
    "ppo_multidiscrete.py": _DOMAIN,
    "ppo_multidiscrete_mask.py": [],
}
# Args fields whose docstring a child may reword (none so far: a reworded docstring is a diff line to justify)
ARGS_DOCSTRINGS_MAY_DIFFER = {}


def pairs(root):
    """[(parent, child)] for every child whose script and parent's script both exist under `root`."""
    return [(PARENTS[c], c) for c in VARIANTS if PARENTS[c] and (root / c).is_file() and (root / PARENTS[c]).is_file()]


def unified_diff(root, parent, child):
    """The lines of `diff -u parent child` (difflib's unified diff where no `diff` program exists)."""
    if shutil.which("diff"):
        proc = subprocess.run(
            ["diff", "-u", "--label", parent, "--label", child, parent, child], cwd=root, capture_output=True, text=True
        )
        if proc.returncode > 1:
            raise RuntimeError(f"diff -u {parent} {child} failed: {proc.stderr.strip()}")
        return proc.stdout.splitlines()
    a = (root / parent).read_text(encoding="utf-8").splitlines()
    b = (root / child).read_text(encoding="utf-8").splitlines()
    return list(difflib.unified_diff(a, b, parent, child, lineterm=""))


def changed_lines(diff_lines):
    """Lines starting with + or - in a unified diff, the '--- a' / '+++ b' file headers excluded."""
    count, in_header = 0, True
    for line in diff_lines:
        if line.startswith("@@"):
            in_header = False
        elif in_header and (line.startswith("--- ") or line.startswith("+++ ")):
            continue
        elif line.startswith(("+", "-")):
            count += 1
    return count


def budget_table(root):
    """(text of the table, list of over-budget children)."""
    rows, over = [("child", "parent", "changed", "budget", "status")], []
    for child in VARIANTS:
        parent = PARENTS[child]
        if parent is None:
            continue
        budget = BUDGETS.get(child)
        if not (root / child).is_file():
            rows.append((child, parent, "-", str(budget), "not yet written"))
            continue
        if not (root / parent).is_file():
            rows.append((child, parent, "-", str(budget), "parent not yet written"))
            continue
        n = changed_lines(unified_diff(root, parent, child))
        status = "ok" if budget is None or n <= budget else f"OVER by {n - budget}"
        if budget is not None and n > budget:
            over.append(child)
        rows.append((child, parent, str(n), str(budget), status))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for r in rows:
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].rjust(widths[2]), r[3].rjust(widths[3]), r[4]]
        lines.append("  ".join(cells))
    return "\n".join(lines), over


def write_html(root, out_dir):
    """One side-by-side page per existing pair under `out_dir`, plus index.html; returns the pages written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    differ = difflib.HtmlDiff(tabsize=4, wrapcolumn=100)
    index_rows, written = [], []
    for parent, child in pairs(root):
        a = (root / parent).read_text(encoding="utf-8").splitlines()
        b = (root / child).read_text(encoding="utf-8").splitlines()
        page = out_dir / f"{child[:-3]}.html"
        title = f"{child} against its parent {parent}"
        text = differ.make_file(a, b, parent, child, context=True, numlines=5)
        page.write_text(text.replace("<title></title>", f"<title>{html.escape(title)}</title>"), encoding="utf-8")
        n, budget = changed_lines(unified_diff(root, parent, child)), BUDGETS.get(child)
        index_rows.append(
            f"<tr><td><a href='{page.name}'>{html.escape(child)}</a></td><td>{html.escape(parent)}</td>"
            f"<td>{n}</td><td>{budget}</td></tr>"
        )
        written.append(page)
    index = out_dir / "index.html"
    index.write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Lineage diffs</title></head><body>\n"
        "<h1>Each variant script against its parent</h1>\n"
        "<p>Generated by <code>python tools/lineage.py --html</code>. Changed lines: lines starting with + or - in "
        "<code>diff -u parent child</code>.</p>\n"
        "<table border='1' cellpadding='4'><tr><th>child</th><th>parent</th><th>changed lines</th><th>budget</th></tr>\n"
        + "\n".join(index_rows)
        + "\n</table></body></html>\n",
        encoding="utf-8",
    )
    return written + [index]


# ---------------------------------------------------------------- shared passages


def _source(text, node):
    """The source lines of a top-level definition, decorators included."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(text.splitlines()[start - 1 : node.end_lineno])


def definitions(path):
    """{name: (source, line)} of the top-level functions and classes of a script."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    return {
        n.name: (_source(text, n), n.lineno)
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def args_fields(path):
    """{field: (annotation, default, docstring, line)} of the top-level `Args` class of a script ({} without one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args"), None)
    fields = {}
    if cls is None:
        return fields
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = None
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                doc = nxt.value.value
            default = ast.unparse(node.value) if node.value is not None else None
            fields[node.target.id] = (ast.unparse(node.annotation), default, doc, node.lineno)
    return fields


def _passage_diff(a_name, a_src, b_name, b_src, limit=12):
    lines = list(difflib.unified_diff(a_src.splitlines(), b_src.splitlines(), a_name, b_name, lineterm="", n=1))
    more = len(lines) - limit
    return "\n".join("    " + x for x in lines[:limit]) + (f"\n    ... ({more} more lines)" if more > 0 else "")


def check_shared(root):
    """Problems (strings) found in the passages that must be identical across scripts; [] when all agree."""
    scripts = [s for s in VARIANTS if (root / s).is_file()]
    defs, problems = {}, []
    for s in scripts:
        try:
            defs[s] = definitions(root / s)
        except SyntaxError as e:
            problems.append(f"{s}: cannot be parsed ({e})")
    scripts = [s for s in scripts if s in defs]

    def compare(name, holders):
        """All of `holders` (scripts) define `name` identically; the first holder is the reference."""
        ref = holders[0]
        for s in holders[1:]:
            if defs[s][name][0] != defs[ref][name][0]:
                problems.append(
                    f"{name} differs between {ref}:{defs[ref][name][1]} and {s}:{defs[s][name][1]}:\n"
                    + _passage_diff(ref, defs[ref][name][0], s, defs[s][name][0])
                )

    # layer_init: the same in every variant that defines it (every variant should)
    holders = [s for s in scripts if "layer_init" in defs[s]]
    for s in scripts:
        if s not in holders:
            problems.append(f"{s}: defines no top-level layer_init")
    if len(holders) > 1:
        compare("layer_init", holders)

    # the Atari wrappers: every class whose name ends in Env, defined in more than one Atari script
    atari = [s for s in ATARI_SCRIPTS if s in defs]
    env_classes = sorted(
        {n for s in atari for n, (src, _) in defs[s].items() if n.endswith("Env") and src.startswith("class")}
    )
    for name in env_classes:
        holders = [s for s in atari if name in defs[s] and defs[s][name][0].startswith("class")]
        if len(holders) > 1:
            compare(name, holders)

    # Args: the fields common to parent and child agree (annotation, default, docstring), except allowed defaults
    for parent, child in pairs(root):
        if parent not in defs or child not in defs:
            continue
        pf, cf = args_fields(root / parent), args_fields(root / child)
        if not pf or not cf:
            problems.append(f"{parent if not pf else child}: no Args dataclass found")
            continue
        may_differ = set(ARGS_DEFAULTS_MAY_DIFFER.get(child, []))
        for field in [f for f in pf if f in cf]:
            (pa, pd, pdoc, pl), (ca, cd, cdoc, cl) = pf[field], cf[field]
            where = f"Args.{field} ({parent}:{pl}, {child}:{cl})"
            if pa != ca:
                problems.append(f"{where}: annotation {pa!r} in the parent, {ca!r} in the child")
            if pd != cd and field not in may_differ:
                problems.append(
                    f"{where}: default {pd} in the parent, {cd} in the child "
                    f"(if the child's detail changes it, add '{field}' to ARGS_DEFAULTS_MAY_DIFFER['{child}'])"
                )
            if pdoc != cdoc and field not in ARGS_DOCSTRINGS_MAY_DIFFER.get(child, []):
                problems.append(
                    f"{where}: docstring {pdoc!r} in the parent, {cdoc!r} in the child "
                    f"(if the child must reword it, add '{field}' to ARGS_DOCSTRINGS_MAY_DIFFER['{child}'])"
                )
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--diff", metavar="CHILD", help="print the unified diff of CHILD (e.g. ppo_atari) against its parent")
    group.add_argument("--html", action="store_true", help="write a side-by-side HTML page per pair, plus an index")
    group.add_argument("--check-shared", action="store_true", help="verify that the shared passages are identical")
    parser.add_argument("--out", default=None, help="with --html: the output folder (default: ROOT/docs/diffs)")
    parser.add_argument("--root", default=str(ROOT), help="the repository root (default: this repository)")
    args = parser.parse_args(argv)
    root = Path(args.root)

    if args.diff:
        child = script_name(args.diff)
        if child not in PARENTS:
            print(f"error: unknown variant '{args.diff}'; known: {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        parent = PARENTS[child]
        if parent is None:
            print(f"error: {child} has no parent (it is the root of the lineage)", file=sys.stderr)
            return 2
        for s in (parent, child):
            if not (root / s).is_file():
                print(f"error: {s} is not yet written", file=sys.stderr)
                return 2
        print("\n".join(unified_diff(root, parent, child)))
        return 0
    if args.html:
        out = Path(args.out) if args.out else root / "docs" / "diffs"
        written = write_html(root, out)
        print(f"wrote {len(written) - 1} pair page(s) and {written[-1]}")
        return 0
    if args.check_shared:
        problems = check_shared(root)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if not problems:
            print("ok: layer_init, the Atari *Env wrappers and the common Args fields agree across the scripts")
        return 1 if problems else 0

    table, over = budget_table(root)
    print(table)
    if over:
        print(f"error: over budget: {', '.join(over)}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

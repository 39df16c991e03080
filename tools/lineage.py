"""Lineage diffs: each variant script against its parent.

    python tools/lineage.py                 # table of each pair's changed lines against its budget (exit 1 if over)
    python tools/lineage.py --diff CHILD    # the unified diff of CHILD against its parent
    python tools/lineage.py --diff CHILD --above-fence  # the same, of the text above the fence lines: the algorithm alone
    python tools/lineage.py --html          # side-by-side HTML pages per pair under docs/diffs/ (whole, above the fence)
    python tools/lineage.py --check-shared  # shared passages identical: layer_init, Atari *Env wrappers, Args fields,
                                            # the fenced plumbing but each script's OWN_PLUMBING; no plumbing above

Changed lines are the lines starting with + or - in `diff -u PARENT CHILD`, the two file headers excluded.

Every script has one fence, a line starting with `# ====`: the PPO algorithm above it, the plumbing below it (checks,
checkpoints, resume, signals, evaluation), the same in every script except the names the script lists in its
`OWN_PLUMBING` right below the fence (top-level names, or "Class.method" for one method).
"""

import argparse
import ast
import difflib
import html
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import (
    ATARI_SCRIPTS,
    PARENTS,
    ROOT,
    VARIANTS,
    exit_with,
    folder_error,
    reason,
    root_error,
    script_name,
    writing_into,
)

# changed-line budget of each child against its parent
BUDGETS = {
    "ppo_shared.py": 40,
    "ppo_atari.py": 235,  # 160 until the fidelity issue (14): ppo2's 400k-frame game length, a flag (+13); 175 until
    # the ablation flags (issue 17): noop_max, episodic_life, fire_reset, clip_reward and frame_stack (+7); 185 until
    # ppo2's game length per game (issue 25: game_frames, SpaceInvaders 300k, +9); 195 until --bf16 (issue 26: the
    # CNN trunk under bfloat16 autocast, its flag and the Agent's parameter, +2 over); 205 until the frames laid out
    # once for --channels-last and a minibatch's frames gathered by rows (issue 26, +2); 208 until the frames stored
    # NHWC for --channels-last and --bf16's rollout copy with its CNN cast once (issue 26, +14); 230 when the plumbing
    # became plain functions (issue 61): bf16_native, no longer dead code shared by every script, is the Atari scripts' own;
    # 235 when the parent's make_env flattened Dict and Tuple observations (issue 63, +3)
    "ppo_continuous_action.py": 165,  # 120 until issue 9 wrote the distributions out: a Normal replaces a Categorical
    # (127), and ppo2's RunningMeanStd (15 lines; gymnasium's runs np.mean/np.var with 40 us of overhead per step)
    # (142 until the ablation flags of issue 17: clip_action, norm_obs, clip_obs, norm_reward, clip_reward, +16)
    # 165: below the fence (issue 22) Run's snapshot/save/restore carry the normalization statistics, +4
    "ppo_atari_lstm.py": 160,
    "ppo_multidiscrete.py": 313,  # issue 8 set 160; measured 225: removing the Atari wrappers and CNN alone is ~120 lines
    # (230 until the parents wrote their Categorical out, issue 9; 235 until issue 14 gave the parent a frame limit, +9,
    # and had the log-probs count only the cells the env executes, +20; 263 until the parent's Atari ablation flags, +7,
    # which a MicroRTS script drops with the Atari wrappers; 285 until the parent's --bf16, which it drops too, +7;
    # 295 until the parent's --noop-max bound, the game's frame limit, which it drops too, +3: issue 23; 298 until
    # the parent's frames laid out once for --channels-last, which it drops too, +2: issue 26; 301 until the parent's
    # frames stored NHWC and --bf16's rollout copy, which it drops too, +12)
    "ppo_multidiscrete_mask.py": 60,
    "ppo_atari_envpool.py": 240,  # 151 as ale-py's vector env; envpool with ppo2's game (issue 14) 221; +5: no envpool
    # 240: the no-op step after a life loss counted in the logged game (issue 25, +3)
    "ppo_atari_multigpu.py": 205,  # measured 115 when written; 123 with the run-dir check and the group destroyed (issue 15)
    # 135 when the plumbing moved below the fence (issue 22): Run's own __init__/restore/open_writer/save/finish, +6
    # 205 (issue 23): the launch checked before the process group, said once by rank 0 (start, exit_once, other_workers;
    # a half-set distributed environment, numpy's seed + rank), +60
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
# Args fields whose docstring a child may reword (a reworded docstring is a diff line to justify)
ARGS_DOCSTRINGS_MAY_DIFFER = {
    "ppo_atari_lstm.py": ["orthogonal_init"],  # says that the LSTM keeps its own orthogonal init (lstm-1) with core-2 off
}


def pairs(root):
    """[(parent, child)] for every child whose script and parent's script both exist under `root`."""
    return [(PARENTS[c], c) for c in VARIANTS if PARENTS[c] and (root / c).is_file() and (root / PARENTS[c]).is_file()]


FENCE = "# ===="  # the fence line starts so: the PPO algorithm above it, the plumbing below it


def fence_lines(text):
    """The 1-based numbers of the lines that start with FENCE."""
    return [i for i, line in enumerate(text.splitlines(), 1) if line.startswith(FENCE)]


def above_fence(root, script):
    """The text of `script` above its fence line; ValueError (a one-line reason naming it) without exactly one fence."""
    text = (root / script).read_text(encoding="utf-8")
    fences = fence_lines(text)
    if len(fences) != 1:
        found = f"{len(fences)} (lines {', '.join(map(str, fences))})" if fences else "none"
        raise ValueError(f"{script} has no single fence line (a line starting with '{FENCE}'): found {found}")
    return "".join(text.splitlines(keepends=True)[: fences[0] - 1])


def unified_diff(root, parent, child, above=False):
    """The lines of `diff -u parent child` (difflib's unified diff where no `diff` program exists).

    With `above`, of the two texts above their fence lines (ValueError for a script without one fence)."""
    if above:
        texts = {s: above_fence(root, s) for s in (parent, child)}
        labels = [f"{s} (above the fence)" for s in (parent, child)]
        if not shutil.which("diff"):
            a, b = texts[parent].splitlines(), texts[child].splitlines()
            return list(difflib.unified_diff(a, b, *labels, lineterm=""))
        with tempfile.TemporaryDirectory() as tmp:
            for i, s in enumerate((parent, child)):
                Path(tmp, f"{i}.py").write_text(texts[s], encoding="utf-8")
            cmd = ["diff", "-u", "--label", labels[0], "--label", labels[1], "0.py", "1.py"]
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode > 1:
            raise RuntimeError(f"diff -u of {parent} and {child} above the fence failed: {proc.stderr.strip()}")
        return proc.stdout.splitlines()
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
    """Side-by-side pages per existing pair under `out_dir` (the whole scripts, and the text above their fences), plus
    index.html; returns the pages written, the index last."""
    out_dir.mkdir(parents=True, exist_ok=True)
    differ = difflib.HtmlDiff(tabsize=4, wrapcolumn=100)

    def page(name, title, a, b, a_label, b_label):
        text = differ.make_file(a, b, a_label, b_label, context=True, numlines=5)
        (out_dir / name).write_text(text.replace("<title></title>", f"<title>{html.escape(title)}</title>"), encoding="utf-8")
        written.append(out_dir / name)

    index_rows, written = [], []
    for parent, child in pairs(root):
        a = (root / parent).read_text(encoding="utf-8").splitlines()
        b = (root / child).read_text(encoding="utf-8").splitlines()
        whole = f"{child[:-3]}.html"
        page(whole, f"{child} against its parent {parent}", a, b, parent, child)
        n, budget = changed_lines(unified_diff(root, parent, child)), BUDGETS.get(child)
        try:
            a_above, b_above = above_fence(root, parent).splitlines(), above_fence(root, child).splitlines()
        except ValueError as e:
            above_cell = f"not written: {html.escape(str(e))}"
        else:
            above = f"{child[:-3]}.above-fence.html"
            title = f"{child} against its parent {parent}, above the fence (the algorithm)"
            page(above, title, a_above, b_above, f"{parent} (above the fence)", f"{child} (above the fence)")
            n_above = changed_lines(unified_diff(root, parent, child, above=True))
            above_cell = f"<a href='{above}'>{n_above} changed lines</a>"
        index_rows.append(
            f"<tr><td><a href='{whole}'>{html.escape(child)}</a></td><td>{html.escape(parent)}</td>"
            f"<td>{n}</td><td>{budget}</td><td>{above_cell}</td></tr>"
        )
    index = out_dir / "index.html"
    index.write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Lineage diffs</title></head><body>\n"
        "<h1>Each variant script against its parent</h1>\n"
        "<p>Generated by <code>python tools/lineage.py --html</code>. Changed lines: lines starting with + or - in "
        "<code>diff -u parent child</code>. Above the fence: the text above each script's <code># ====</code> line, "
        "the algorithm without the plumbing.</p>\n"
        "<table border='1' cellpadding='4'><tr><th>child</th><th>parent</th><th>changed lines</th><th>budget</th>"
        "<th>above the fence</th></tr>\n" + "\n".join(index_rows) + "\n</table></body></html>\n",
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


# ---------------------------------------------------------------- the fence: algorithm above, shared plumbing below

# what is plumbing, not PPO: it belongs below the fence (attributes of modules, and calls of the RNG-state helpers)
PLUMBING_ATTRIBUTES = {("sys", "exit"), ("torch", "save"), ("torch", "load"), ("os", "_exit")}
PLUMBING_MODULES = {"signal", "tempfile", "netrc"}  # any use of these
PLUMBING_CALLS = {"rng_states", "set_rng_states"}


def plumbing_uses(nodes):
    """[(line, what)] for each use of plumbing in the statements `nodes` (code only: strings and comments are no AST)."""
    found, inner = [], set()
    for stmt in nodes:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                pair = (node.value.id, node.attr)
                if pair in PLUMBING_ATTRIBUTES or node.value.id in PLUMBING_MODULES:
                    found.append((node.lineno, f"{pair[0]}.{pair[1]}"))
                    inner.add(id(node.value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PLUMBING_CALLS:
                found.append((node.lineno, f"{node.func.id}(...)"))
                inner.add(id(node.func))
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and node.id in PLUMBING_MODULES and id(node) not in inner:
                found.append((node.lineno, node.id))
    return sorted(set(found))


def _targets(node):
    """The names an assignment target binds (a name, or the names in a tuple or list of them)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [n for elt in node.elts for n in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def defined_names(node):
    """The top-level names a statement defines: a def or class, or the targets of an assignment."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n for t in node.targets for n in _targets(t)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return _targets(node.target)
    return []


def _start(node):
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _with_comments(lines, prev_end, node, end=None):
    """The source of `node` (decorators included), with the comment lines between the previous statement and it."""
    start = _start(node)
    leading = [x for x in lines[prev_end : start - 1] if x.strip()]  # only comments can stand between two statements
    return "\n".join(leading + lines[start - 1 : end if end is not None else node.end_lineno])


def plumbing_units(text, tree, fence):
    """The statements below the fence as units [(name, owners, source, line)]: one per top-level statement, but a class
    gives one unit for its header and non-method body (name: the class) and one per method ('Class.method'). `owners`:
    the OWN_PLUMBING entries that exclude the unit. Each source carries the comment lines right above it."""
    lines, units = text.splitlines(), []
    body = [n for n in tree.body if n.lineno > fence]
    prev_end = fence
    for node in body:
        names = defined_names(node)
        if isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
            rest = [m for m in node.body if m not in methods]
            head = _with_comments(lines, prev_end, node, end=_start(node.body[0]) - 1)
            head_src = "\n".join([head] + [_with_comments(lines, _start(m) - 1, m) for m in rest])
            units.append((node.name, {node.name}, head_src, node.lineno))
            inner_prev = _start(node.body[0]) - 1
            for m in node.body:
                if m in methods:
                    src = _with_comments(lines, inner_prev, m)
                    units.append((f"{node.name}.{m.name}", {node.name, f"{node.name}.{m.name}"}, src, m.lineno))
                inner_prev = m.end_lineno
        else:
            src = _with_comments(lines, prev_end, node)
            name = ", ".join(names) if names else lines[node.lineno - 1].strip()[:60]
            units.append((name, set(names), src, node.lineno))
        prev_end = node.end_lineno
    return units


def read_fenced(path):
    """What --check-shared needs of one script: {fences, above, units, own, own_line, problems} (parse errors raise)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    s, fences, problems = path.name, fence_lines(text), []
    info = {"fences": fences, "above": [], "units": None, "own": None, "own_line": None, "problems": problems}
    if len(fences) != 1:
        if not fences:
            problems.append(f"{s}: no fence line (a line starting with '{FENCE}' between train() and the plumbing)")
        else:
            problems.append(f"{s}: {len(fences)} fence lines (lines {', '.join(map(str, fences))}); exactly one")
        return info
    fence = fences[0]
    info["above"] = [n for n in tree.body if n.lineno < fence]
    below = [n for n in tree.body if n.lineno > fence]
    own_nodes = [n for n in below if "OWN_PLUMBING" in defined_names(n)]
    if not own_nodes:
        problems.append(f"{s}: no OWN_PLUMBING below the fence (line {fence}); declare this script's own plumbing there")
    else:
        node, own = own_nodes[0], []
        for n in own_nodes:  # OWN_PLUMBING = [...], then any OWN_PLUMBING += [...] (a long list over two lines)
            first = n is own_nodes[0] and isinstance(n, ast.Assign) and len(n.targets) == 1
            if not (first or (n is not own_nodes[0] and isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add))):
                own = None
                break
            try:
                value = ast.literal_eval(n.value)
            except ValueError:
                value = None
            if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
                own = None
                break
            own += value
        if own is None:
            problems.append(
                f"{s}:{node.lineno}: OWN_PLUMBING must be a list of strings (names, or 'Class.method'), "
                "assigned once (and extended with += [...] if long)"
            )
        else:
            info["own"], info["own_line"] = own, node.lineno
            info["units"] = [u for u in plumbing_units(text, tree, fence) if "OWN_PLUMBING" not in u[1]]
            defined = {o for u in info["units"] for o in u[1]}
            for entry in own:
                if entry not in defined:
                    problems.append(
                        f"{s}:{node.lineno}: OWN_PLUMBING names '{entry}', which is not defined below the fence "
                        "(a stale declaration: remove it)"
                    )
    # the end of the file: the entry point, nothing else
    last, lines = tree.body[-1] if tree.body else None, text.splitlines()
    ends_well = (
        isinstance(last, ast.If)
        and ast.unparse(last.test) == "__name__ == '__main__'"
        and [ast.unparse(b) for b in last.body] == ["run_name = main()"]  # runpy's globals hold it (CleanRL's tuner)
        and not last.orelse
        and not any(x.strip() for x in lines[last.end_lineno :])
    )
    if not ends_well:
        problems.append(f'{s}: does not end with `if __name__ == "__main__":` whose body is exactly `run_name = main()`')
    return info


def check_fenced(root, scripts):
    """Problems of the fences: one each, no plumbing above, the same plumbing below but each script's OWN_PLUMBING."""
    problems, infos = [], {}
    for s in scripts:
        info = read_fenced(root / s)
        problems += info["problems"]
        for line, what in plumbing_uses(info["above"]):
            problems.append(f"{s}:{line}: {what} above the fence (line {info['fences'][0]}): plumbing goes below it")
        if info["units"] is not None:
            infos[s] = info
    if not infos:
        return problems
    ref = "ppo.py" if "ppo.py" in infos else next(iter(infos))

    def shared(units, excluded):
        """{key: unit} of the units not excluded, in order; a name repeated (x = ...; x += ...) gets '#2', ..."""
        keyed, seen = {}, {}
        for unit in units:
            if unit[1] & excluded:
                continue
            seen[unit[0]] = seen.get(unit[0], 0) + 1
            keyed[unit[0] if seen[unit[0]] == 1 else f"{unit[0]} #{seen[unit[0]]}"] = unit
        return keyed

    for s in [x for x in infos if x != ref]:
        excluded = set(infos[ref]["own"]) | set(infos[s]["own"])  # what either script declares its own
        a, b = shared(infos[ref]["units"], excluded), shared(infos[s]["units"], excluded)
        for key, (name, owners, src, line) in a.items():
            if key not in b:
                problems.append(
                    f"{s}: the shared plumbing {name} ({ref}:{line}) is missing below its fence "
                    "(every script's plumbing has it, but a name one of the two lists in OWN_PLUMBING)"
                )
            elif b[key][2] != src:
                hint = f" (if it is {s}'s own, add '{name}' to its OWN_PLUMBING)" if owners else ""
                problems.append(
                    f"{name} below the fence differs between {ref}:{line} and {s}:{b[key][3]}{hint}:\n"
                    + _passage_diff(ref, src, s, b[key][2])
                )
        for key, (name, owners, _, line) in b.items():
            if key not in a:
                hint = f"; if it is {s}'s own, add '{name}' to its OWN_PLUMBING" if owners else ""
                problems.append(f"{s}:{line}: {name} below the fence is not in {ref}'s plumbing{hint}")
        order_a, order_b = [k for k in a if k in b], [k for k in b if k in a]
        if order_a != order_b:
            i = next(i for i, (x, y) in enumerate(zip(order_a, order_b)) if x != y)
            problems.append(
                f"{s}: the shared plumbing is in another order than in {ref}: {b[order_b[i]][0]} ({s}:{b[order_b[i]][3]}) "
                f"where {ref} has {a[order_a[i]][0]} ({ref}:{a[order_a[i]][3]})"
            )
    return problems


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

    # the fence: one per script, no plumbing above it, the same plumbing below it but each script's OWN_PLUMBING
    problems += check_fenced(root, scripts)
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--diff", metavar="CHILD", help="print the unified diff of CHILD (e.g. ppo_atari) against its parent")
    group.add_argument("--html", action="store_true", help="write a side-by-side HTML page per pair, plus an index")
    group.add_argument(
        "--check-shared",
        action="store_true",
        help="verify that the shared passages are identical, the fenced plumbing included, and no plumbing above a fence",
    )
    parser.add_argument(
        "--above-fence",
        action="store_true",
        help="with --diff: only the text above the fence lines (the algorithm, not the plumbing); --html writes both",
    )
    parser.add_argument("--out", default=None, help="with --html: the output folder (default: ROOT/docs/diffs)")
    parser.add_argument("--root", default=str(ROOT), help="the repository root (default: this repository)")
    args = parser.parse_args(argv)
    if args.above_fence and not (args.diff or args.html):
        parser.error("--above-fence goes with --diff CHILD (or --html, which writes the above-fence pages anyway)")
    root = Path(args.root)
    error = root_error(root)
    if not error and not any((root / s).is_file() for s in VARIANTS):
        error = f"none of the lineage's scripts ({', '.join(VARIANTS)}) is under {root}: nothing to check"
    if not error and not args.diff and not args.check_shared and not pairs(root):  # the table and --html compare pairs
        error = f"no child script beside its parent under {root} (e.g. ppo.py and ppo_shared.py): nothing to compare"
    if not error and args.html:
        error = folder_error(args.out or root / "docs" / "diffs", "--out")
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2

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
        try:
            print("\n".join(unified_diff(root, parent, child, above=args.above_fence)))
        except ValueError as e:  # --above-fence, and a script without a single fence line
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.html:
        out = Path(args.out) if args.out else root / "docs" / "diffs"
        try:
            with writing_into(out) as tmp:  # all or nothing: a full disk leaves the pages that were there
                written = write_html(root, tmp)
        except OSError as e:
            print(f"error: cannot write the pages into {out} ({reason(e)}); what was there is kept", file=sys.stderr)
            return 1
        n_above = sum(p.name.endswith(".above-fence.html") for p in written)
        print(f"wrote {len(written) - 1 - n_above} pair page(s), {n_above} above-fence page(s) and {out / written[-1].name}")
        return 0
    if args.check_shared:
        problems = check_shared(root)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if not problems:
            print(
                "ok: layer_init, the Atari *Env wrappers, the common Args fields and the fenced plumbing (apart from each "
                "script's OWN_PLUMBING) agree across the scripts; one fence each, no plumbing above it"
            )
        return 1 if problems else 0

    table, over = budget_table(root)
    print(table)
    if over:
        print(f"error: over budget: {', '.join(over)}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    exit_with(main)

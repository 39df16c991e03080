"""The researcher's tools: tools/details.py, tools/lineage.py, benchmark/suites.py, benchmark/report.py."""

import csv
import gzip
import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_script, run_dirs, run_python, run_script
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent
BASE_SCRIPTS = ["ppo.py", "ppo_shared.py"]  # the scripts the copies are made of (present from the start)


def load_module(relpath):
    """Import ROOT/relpath (its folder on sys.path, as when it is run as a script)."""
    path = ROOT / relpath
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_tool_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


details = load_module("tools/details.py")
lineage = load_module("tools/lineage.py")
suites = load_module("benchmark/suites.py")
report = load_module("benchmark/report.py")
common = load_module("tools/_common.py")


def tool(relpath, *args, cwd=ROOT, timeout=60):
    return run_python(ROOT / relpath, *args, cwd=cwd, timeout=timeout)


@pytest.fixture
def repo(tmp_path):
    """A temporary repository root holding copies of ppo.py and ppo_shared.py."""
    root = tmp_path / "repo"
    root.mkdir()
    for s in BASE_SCRIPTS:
        shutil.copy(ROOT / s, root / s)
    return root


def edit(path, old, new, count=1):
    text = path.read_text()
    assert text.count(old) >= 1, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new, count))


def drop_tag(path, detail_id):
    lines = path.read_text().splitlines(keepends=True)
    kept = [x for x in lines if not re.match(rf"\s*# detail {detail_id}:", x)]
    assert len(kept) < len(lines), f"no {detail_id} tag in {path.name}"
    path.write_text("".join(kept))


# ------------------------------------------------------------------------------------------- details.py


def test_details_generates_a_checklist_whose_links_point_at_the_tags(repo):
    assert tool("tools/details.py", "--root", repo).returncode == 0
    text = (repo / "DETAILS.md").read_text()
    rows = re.findall(r"^\| ([a-z]+-\d+) \|", text, flags=re.M)
    assert rows == list(details.DETAILS) and len(rows) == 41  # 37 + 4, in the blog's order
    links = re.findall(r"\[(ppo[\w]*\.py)#L(\d+)\]\(\1#L\2\)", text)
    assert len(links) == sum(len(details.read_tags(repo / s)[0]) for s in BASE_SCRIPTS)
    for script, line in links:  # every link lands on a tag line of the detail of its row
        row = next(r for r in text.splitlines() if f"[{script}#L{line}]" in r)
        detail_id = row.split("|")[1].strip()
        assert f"# detail {detail_id}:" in (repo / script).read_text().splitlines()[int(line) - 1]
    assert "| ppo_atari.py | ppo.py | not yet written |" in text
    check = tool("tools/details.py", "--check", "--root", repo)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("script,detail_id", [("ppo_shared.py", "core-7"), ("ppo.py", "aux-3"), ("ppo.py", "core-13")])
def test_details_check_fails_when_a_required_tag_is_missing(repo, script, detail_id):
    drop_tag(repo / script, detail_id)
    tool("tools/details.py", "--root", repo)  # regenerate, so that only the missing tag is wrong
    check = tool("tools/details.py", "--check", "--root", repo)
    assert check.returncode != 0
    assert f"{script}: missing required tag(s) {detail_id}" in check.stderr
    assert "stale" not in check.stderr
    row = next(r for r in (repo / "DETAILS.md").read_text().splitlines() if r.startswith(f"| {detail_id} |"))
    assert f"**missing in {script}**" in row


def test_details_requirements_follow_the_script(repo):
    shutil.copy(repo / "ppo.py", repo / "ppo_atari.py")  # a core-only script in the place of the Atari variants
    shutil.copy(repo / "ppo.py", repo / "ppo_multidiscrete_mask.py")
    _, problems = details.scan(repo)
    assert f"ppo_atari.py: missing required tag(s) {', '.join(f'atari-{i}' for i in range(1, 10))}" in problems
    assert "ppo_multidiscrete_mask.py: missing required tag(s) multidiscrete-1, aux-4" in problems
    assert not [p for p in problems if p.startswith(("ppo.py", "ppo_shared.py"))]


def test_details_flags_unknown_and_malformed_tags_but_not_strings(repo):
    with open(repo / "ppo.py", "a") as f:
        f.write('\nNOTE = "# detail core-99: inside a string, not a tag"\n# detail core-14: no such detail\n')
        f.write("# detail atari-3 EpisodicLife without a colon\n")
    _, problems = details.scan(repo)
    assert len(problems) == 2
    assert "unknown detail id 'core-14'" in problems[0]
    assert "malformed tag" in problems[1] and "atari-3" in problems[1]


def test_details_check_detects_a_stale_details_md(repo):
    assert tool("tools/details.py", "--root", repo).returncode == 0
    edit(repo / "ppo.py", "import os\n", "import os\n\n")  # every tag below moves one line down
    check = tool("tools/details.py", "--check", "--root", repo)
    assert check.returncode != 0 and "DETAILS.md is stale" in check.stderr
    assert tool("tools/details.py", "--root", repo).returncode == 0
    assert tool("tools/details.py", "--check", "--root", repo).returncode == 0
    edit(repo / "DETAILS.md", "Adam epsilon", "Adam eps")
    assert "DETAILS.md is stale" in tool("tools/details.py", "--check", "--root", repo).stderr
    (repo / "DETAILS.md").unlink()
    assert "DETAILS.md does not exist" in tool("tools/details.py", "--check", "--root", repo).stderr


def test_details_check_passes_on_the_repository_quickly():
    start = time.time()
    check = tool("tools/details.py", "--check", timeout=40)
    assert check.returncode == 0, check.stderr
    assert time.time() - start < 20


# ------------------------------------------------------------------------------------------- lineage.py


def test_changed_lines_counts_plus_minus_lines_without_the_headers(tmp_path):
    (tmp_path / "a.py").write_text("a\nb\n-- c\nd\n")
    (tmp_path / "b.py").write_text("a\nB\nd\ne\n")
    diff = lineage.unified_diff(tmp_path, "a.py", "b.py")
    assert diff[0].startswith("--- a.py") and diff[1].startswith("+++ b.py")
    assert "--- c" in diff  # a removed line that looks like a header still counts
    assert lineage.changed_lines(diff) == 4  # -b, --- c, +B, +e


def test_lineage_budgets_hold_on_the_repository():
    result = tool("tools/lineage.py")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    measured = [r for r in rows if r[2].isdigit()]
    assert any(r[0] == "ppo_shared.py" for r in measured)
    for child, _, changed, budget, *_ in measured:
        assert int(changed) <= int(budget) == lineage.BUDGETS[child]


@pytest.mark.parametrize("extra,over", [(40, False), (41, True)])
def test_lineage_fails_on_an_over_budget_pair(repo, extra, over):
    shutil.copy(repo / "ppo.py", repo / "ppo_shared.py")
    with open(repo / "ppo_shared.py", "a") as f:
        f.writelines(f"# added line {i}\n" for i in range(extra))
    result = tool("tools/lineage.py", "--root", repo)
    row = next(line for line in result.stdout.splitlines() if line.startswith("ppo_shared.py"))
    assert row.split()[2] == str(extra)
    assert (result.returncode != 0) == over
    assert ("OVER by 1" in row) == over


def test_lineage_diff_and_html(repo, tmp_path):
    result = tool("tools/lineage.py", "--diff", "ppo_shared", "--root", repo)
    assert result.returncode == 0 and result.stdout.startswith("--- ppo.py\n+++ ppo_shared.py\n@@")
    assert lineage.changed_lines(result.stdout.splitlines()) == lineage.changed_lines(
        lineage.unified_diff(repo, "ppo.py", "ppo_shared.py")
    )
    assert tool("tools/lineage.py", "--diff", "ppo_nothing", "--root", repo).returncode == 2
    assert tool("tools/lineage.py", "--diff", "ppo_atari", "--root", repo).returncode == 2  # not yet written
    out = tmp_path / "html"
    assert tool("tools/lineage.py", "--html", "--out", out, "--root", repo).returncode == 0
    page, index = out / "ppo_shared.html", (out / "index.html").read_text()
    assert "hidden&nbsp;=&nbsp;self.network(x)</span>" in page.read_text()  # an added line, side by side
    assert "href='ppo_shared.html'" in index and "ppo_continuous_action" not in index


def test_shared_passages_agree_on_the_repository():
    result = tool("tools/lineage.py", "--check-shared")
    assert result.returncode == 0, result.stderr


FENCE = "\n\n\n# ==== plumbing, not PPO"  # the blank lines above the fence line, and its start
WRAPPER = """

class NoopResetEnv(gym.Wrapper):
    def __init__(self, env, noop_max=30):
        super().__init__(env)
        self.noop_max = noop_max
"""


@pytest.mark.parametrize(
    "change,expected",
    [
        (("ppo_shared.py", "constant_(layer.bias, bias_const)", "zeros_(layer.bias)"), "layer_init"),
        (("ppo_shared.py", '"""the surrogate clipping coefficient"""', '"""epsilon"""'), "Args.clip_coef"),
        (("ppo_shared.py", "gamma: float = 0.99", "gamma: float = 0.98"), "Args.gamma"),
        (("ppo_shared.py", "num_envs: int = 4", "num_envs: int = 8"), "Args.num_envs"),  # allowed for atari, not here
        (("ppo_shared.py", "seed: int = 1", "seed: float = 1"), "Args.seed"),
        (("ppo_atari_lstm.py", "noop_max=30", "noop_max=20"), "NoopResetEnv differs"),
    ],
)
def test_shared_passages_check_fails_on_a_modified_copy(repo, change, expected):
    for atari in ("ppo_atari.py", "ppo_atari_lstm.py"):  # two Atari scripts sharing a wrapper class (above the fence)
        (repo / atari).write_text((repo / "ppo.py").read_text().replace(FENCE, WRAPPER + FENCE, 1))
        edit(repo / atari, "num_envs: int = 4", "num_envs: int = 8")  # a default the Atari domain may change
    assert tool("tools/lineage.py", "--check-shared", "--root", repo).returncode == 0
    script, old, new = change
    edit(repo / script, old, new)
    result = tool("tools/lineage.py", "--check-shared", "--root", repo)
    assert result.returncode != 0
    assert expected in result.stderr


# the converted scripts: ppo.py and ppo_atari.py; the copies of ppo.py, then of ppo_atari.py, make a repository of nine
PPO_COPIES = ["ppo.py", "ppo_shared.py", "ppo_continuous_action.py"]
OWN = 'OWN_PLUMBING = ["check_args", "bf16_native", "evaluate"]'


@pytest.fixture
def fenced(tmp_path):
    """A repository root whose nine scripts are copies of the converted ppo.py and ppo_atari.py (one fence each)."""
    root = tmp_path / "fenced"
    root.mkdir()
    for s in lineage.VARIANTS:
        shutil.copy(ROOT / ("ppo.py" if s in PPO_COPIES else "ppo_atari.py"), root / s)
    return root


def check_shared(root):
    return tool("tools/lineage.py", "--check-shared", "--root", root)


def test_shared_plumbing_names_a_changed_run_method_until_it_is_declared_own(fenced):
    result = check_shared(fenced)
    assert result.returncode == 0, result.stderr
    assert "the fenced plumbing (apart from each script's OWN_PLUMBING) agree" in result.stdout
    assert "one fence each, no plumbing above it" in result.stdout
    edit(fenced / "ppo_atari_lstm.py", "purge_step=step + 1 if checkpoint else None)", "purge_step=None, flush_secs=30)")
    result = check_shared(fenced)
    assert result.returncode != 0
    assert result.stderr.count("error: ") == 1, result.stderr  # that function only
    assert "error: open_logs below the fence differs between ppo.py:" in result.stderr
    assert "ppo_atari_lstm.py:" in result.stderr and "flush_secs=30)" in result.stderr  # where, and the diff
    edit(fenced / "ppo_atari_lstm.py", OWN, OWN[:-1] + ', "open_logs"]')
    result = check_shared(fenced)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "old,new,expected",
    [
        (OWN, OWN[:-1] + ', "save_everything"]', "'save_everything', which is not defined below the fence"),
        (OWN, OWN[:-1] + ', "Run.save_everything"]', "'Run.save_everything', which is not defined below the fence"),
        (OWN, "# no declaration", "ppo_multidiscrete.py: no OWN_PLUMBING below the fence"),
        (OWN, 'OWN_PLUMBING = "check_args"', "OWN_PLUMBING must be a list of strings"),
        (OWN, OWN + "\n\n\ndef helper():\n    return None", "helper below the fence is not in ppo.py's plumbing"),
        ("def resume_args(", "def resume_arguments(", "the shared plumbing resume_args (ppo.py:"),
        ('"save_every", "resume"', '"save_every", "seed", "resume"', "RESUME_MAY_CHANGE below the fence differs"),
        ("# with --resume, these flags may", "# with --resume these flags may", "RESUME_MAY_CHANGE below the fence"),
        (
            "    stop = types.SimpleNamespace(requested=0)",
            "    stop = types.SimpleNamespace(requested=0)  # Ctrl-C",
            "catch_signals below the",
        ),
        ("def train(", "# ==== the PPO loop ====\ndef train(", "ppo_multidiscrete.py: 2 fence lines (lines "),
        ("# ==== plumbing", "# plumbing", "ppo_multidiscrete.py: no fence line"),
        (
            "    run_name = main()",
            '    run_name = main()\n    print("done")',
            "ppo_multidiscrete.py: does not end with `if __name__",
        ),
    ],
)
def test_shared_plumbing_check_fails_on_a_fenced_section_problem(fenced, old, new, expected):
    edit(fenced / "ppo_multidiscrete.py", old, new)  # a copy of ppo_atari.py, compared with ppo.py
    result = check_shared(fenced)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


@pytest.mark.parametrize(
    "line,found",
    [
        ('    sys.exit("error: no gradient")', "sys.exit"),
        ('    torch.save(optimizer.state_dict(), "optimizer.pt")', "torch.save"),
        ("    signal.signal(signal.SIGINT, signal.SIG_IGN)", "signal.signal"),
        ("    states = rng_states()", "rng_states(...)"),
        ('    _ = "sys.exit(1), torch.save(x), signal.signal, rng_states()"', None),  # a string: no code
        ('    pass  # sys.exit(1), torch.save(x, "x.pt"), tempfile.mkdtemp()', None),  # a comment
    ],
)
def test_shared_plumbing_check_finds_plumbing_above_the_fence_in_code_only(fenced, line, found):
    edit(fenced / "ppo_shared.py", "    optimizer.zero_grad()\n", f"    optimizer.zero_grad()\n{line}\n")  # gradient_step
    lineno = (fenced / "ppo_shared.py").read_text().splitlines().index(line) + 1
    result = check_shared(fenced)
    assert (result.returncode != 0) == (found is not None), result.stderr
    if found:
        assert f"error: ppo_shared.py:{lineno}: {found} above the fence (line " in result.stderr


def test_lineage_diff_above_the_fence_shows_the_algorithm_alone():
    result = tool("tools/lineage.py", "--diff", "ppo_atari", "--above-fence")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("--- ppo.py (above the fence)\n+++ ppo_atari.py (above the fence)\n@@")
    lines = result.stdout.splitlines()
    changed = [x for x in lines[2:] if x.startswith(("+", "-"))]
    assert any("channels_last" in x or "NoopResetEnv" in x for x in changed)  # the child's own algorithm
    assert not any(s in x for x in lines for s in ("def check_args", "class Run", "OWN_PLUMBING"))  # no plumbing
    whole = tool("tools/lineage.py", "--diff", "ppo_atari")
    assert 0 < lineage.changed_lines(lines) < lineage.changed_lines(whole.stdout.splitlines())


def test_lineage_above_the_fence_needs_a_fence_and_a_diff(tmp_path):
    shutil.copy(ROOT / "ppo.py", tmp_path / "ppo.py")
    shutil.copy(ROOT / "ppo_atari.py", tmp_path / "ppo_atari.py")
    edit(tmp_path / "ppo_atari.py", "# ==== plumbing", "# plumbing")
    result = tool("tools/lineage.py", "--diff", "ppo_atari", "--above-fence", "--root", tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "ppo_atari.py has no single fence line" in result.stderr
    assert tool("tools/lineage.py", "--diff", "ppo_atari", "--root", tmp_path).returncode == 0  # the whole: no fence needed
    for flags in (["--above-fence"], ["--check-shared", "--above-fence"]):
        result = tool("tools/lineage.py", *flags, "--root", tmp_path)
        assert result.returncode == 2 and "--above-fence goes with --diff" in result.stderr


def test_lineage_html_writes_the_above_fence_pages(tmp_path):
    root, out = tmp_path / "repo", tmp_path / "html"
    root.mkdir()
    for s in ("ppo.py", "ppo_shared.py", "ppo_atari.py"):
        shutil.copy(ROOT / "ppo.py", root / s)
    edit(root / "ppo_shared.py", "    optimizer.zero_grad()\n", "    optimizer.zero_grad()  # marker-above-the-fence\n")
    edit(root / "ppo_shared.py", "def catch_signals():\n", "def catch_signals():  # marker-below-the-fence\n")
    edit(root / "ppo_atari.py", "# ==== plumbing", "# plumbing")  # a script without its fence: no above-fence page
    result = tool("tools/lineage.py", "--html", "--out", out, "--root", root)
    assert result.returncode == 0, result.stderr
    assert "2 pair page(s), 1 above-fence page(s)" in result.stdout
    whole, above = (out / "ppo_shared.html").read_text(), (out / "ppo_shared.above-fence.html").read_text()
    assert "marker-above-the-fence" in whole and "marker-below-the-fence" in whole
    assert "marker-above-the-fence" in above and "marker-below-the-fence" not in above
    assert "ppo_shared.py&nbsp;(above&nbsp;the&nbsp;fence)" in above or "ppo_shared.py (above the fence)" in above
    index = (out / "index.html").read_text()
    assert "href='ppo_shared.above-fence.html'>2 changed lines</a>" in index  # one line changed: - and +
    assert not (out / "ppo_atari.above-fence.html").exists() and "ppo_atari.py has no single fence line" in index


# ------------------------------------------------------------------------------------- benchmark: suites


def read_reference():
    with open(ROOT / "benchmark" / "reference.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_reference_csv_matches_the_suites():
    rows = read_reference()
    assert list(rows[0])[:6] == ["env", "script", "steps", "seeds", "mean", "std"] and "source" in rows[0]
    assert all(r["source"] and float(r["std"]) >= 0 and not math.isnan(float(r["mean"])) for r in rows)
    assert len({(r["env"], r["script"], r["baseline"]) for r in rows}) == len(rows) == 24  # 4 tables x 3 envs x 2
    family = report._family
    for name in ("classic", "atari", "atari_lstm", "mujoco"):  # the suites that reproduce a published table
        suite = suites.SUITES[name]
        for script in suite.scripts:
            for env in suite.envs:
                refs = [r for r in rows if r["script"] == script and family(r["env"]) == family(env)]
                assert {r["baseline"] for r in refs} == {"ppo2", "cleanrl"}, (name, env)
                assert all(int(r["steps"]) == suite.steps and int(r["seeds"]) == 3 for r in refs)
    for r in rows:  # and every published row is reproduced by a suite
        assert any(r["script"] in s.scripts and family(r["env"]) in map(family, s.envs) for s in suites.SUITES.values())


def test_suites_print_the_commands():
    result = tool("benchmark/suites.py", "classic")
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and len(lines) == 9
    for env in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
        for seed in (1, 2, 3):
            assert f"python ppo.py --env-id {env} --seed {seed} --total-timesteps 500000" in lines
    result = tool("benchmark/suites.py", "atari", "--seeds", "2", "--envs", "PongNoFrameskip-v4", "--", "--cuda")
    assert result.stdout.split("  #")[0].strip() == (
        "python ppo_atari.py --env-id PongNoFrameskip-v4 --seed 2 --total-timesteps 10000000 --cuda"
    )
    assert tool("benchmark/suites.py", "no_such_suite").returncode == 2
    listing = tool("benchmark/suites.py").stdout
    assert all(name in listing for name in suites.SUITES)


def test_suites_run_the_commands_in_order(tmp_path, monkeypatch):
    fake = tmp_path / "fake"
    fake.mkdir()
    log = tmp_path / "calls.txt"
    (fake / "ppo.py").write_text(f"import sys\nopen({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    monkeypatch.setattr(suites, "ROOT", fake)
    monkeypatch.setattr(suites, "run_error", lambda todo: None)  # the fake is no variant script to check the flags of
    monkeypatch.chdir(tmp_path)
    argv = ["classic", "--run", "--seeds", "1", "2", "--envs", "Acrobot-v1", "--steps", "1024", "--", "--no-cuda"]
    assert suites.main(argv) == 0
    assert log.read_text().splitlines() == [
        f"--env-id Acrobot-v1 --seed {seed} --total-timesteps 1024 --no-cuda" for seed in (1, 2)
    ]
    (fake / "ppo.py").write_text("import sys\nsys.exit(3)\n")
    assert suites.main(argv) == 1  # a failed run fails the suite
    assert suites.main(["atari", "--run"]) == 2  # ppo_atari.py is not in the fake repository: nothing runs


# ------------------------------------------------------------------------------------- benchmark: report


def write_run(runs, name, returns, last_step):
    """A run directory with episodic returns [(step, value)] one second apart from 10 s on, and a final loss scalar."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(runs / name))
    t0 = time.time()  # the writer's first event (the file version) was written just now
    for i, (step, value) in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, step, walltime=t0 + 10 + i)
    writer.add_scalar("losses/value_loss", 1.0, last_step, walltime=t0 + 10 + len(returns))
    writer.close()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    runs = tmp_path_factory.mktemp("report") / "runs"
    for seed in (1, 2, 3):  # 150 episodes, values i + 10*seed
        write_run(runs, f"CartPole-v1__ppo__{seed}__1000", [((i + 1) * 100, i + 10 * seed) for i in range(150)], 20000)
    write_run(runs, "CartPole-v1__ppo__1__999", [(100, -5.0)], 100)  # an older run of seed 1: ignored
    write_run(runs, "ALE/Pong-v5__ppo_atari_envpool__1__1000", [(1000, -21.0), (2000, -20.0)], 4096)
    write_run(runs, "not_a_run_name", [(1, 1.0)], 1)
    return runs


def test_report_finds_and_parses_runs_including_nested_env_ids(runs_dir):
    assert report.parse_run_name("ALE/Pong-v5__ppo_atari__7__1700000000") == ("ALE/Pong-v5", "ppo_atari", 7, 1700000000)
    assert report.parse_run_name("CartPole-v1__ppo__x__1") is None
    found, skipped = report.find_runs(runs_dir)
    assert sorted((r.env, r.exp, r.seed, r.timestamp) for r in found) == [
        ("ALE/Pong-v5", "ppo_atari_envpool", 1, 1000),
        ("CartPole-v1", "ppo", 1, 999),
        ("CartPole-v1", "ppo", 1, 1000),
        ("CartPole-v1", "ppo", 2, 1000),
        ("CartPole-v1", "ppo", 3, 1000),
    ]
    assert [p.name for p in skipped] == ["not_a_run_name"]
    run = report.load(next(r for r in found if r.seed == 2 and r.timestamp == 1000))
    assert [v for _, _, v in run.returns] == [float(i + 20) for i in range(150)]
    assert run.last_step == 20000 and 9 < run.returns[0][1] - run.start_time < 15


def test_report_curves_average_over_seeds_against_steps_and_wall_time(runs_dir):
    found, _ = report.find_runs(runs_dir)
    runs = [report.load(r) for r in found if r.env == "CartPole-v1" and r.timestamp == 1000]
    np.testing.assert_allclose(report.trailing_mean([1, 2, 3, 4], 2), [1, 1.5, 2.5, 3.5])
    grid, mean, std, count = report.curve(runs, x="step", window=100)
    assert grid[0] == 100 and grid[-1] == 20000 and (count == 3).all()  # to the last logged step, holding the value
    ends = [report.trailing_mean([v for _, _, v in r.returns], 100)[-1] for r in runs]
    assert mean[-1] == pytest.approx(np.mean(ends)) and std[-1] == pytest.approx(np.std(ends))
    grid, mean, _, _ = report.curve(runs, x="time", window=100)
    assert 9 < grid[0] < 15 and 158 < grid[-1] < 165  # seconds since each run's first event
    assert mean[-1] == pytest.approx(np.mean(ends))
    assert report.curve_label("ppo", runs[::-1]) == "ppo: seeds 1, 2, 3, 20k steps"  # each figure names seeds and steps
    assert report.curve_label("ppo", runs[:1]) == "ppo: seed 1, 20k steps"


def test_a_long_legend_goes_below_the_curves(tmp_path):
    """Up to 6 entries the legend sits in the steps panel; more (several scripts, each with its published lines) would
    hide the curves, so they go below both panels and the figure grows to hold them."""

    def height(n_groups):
        groups = {}
        for k in range(n_groups):
            run = report.Run("CartPole-v1", f"ppo__c{k}", 1, 1000, tmp_path, start_time=0.0, last_step=1000, last_time=9.0)
            run.returns = [(s, s / 100, float(k + s / 100)) for s in range(100, 1001, 100)]
            groups[(f"ppo__c{k}", "")] = [run]
        out = tmp_path / f"{n_groups}.png"
        report.plot_env("CartPole-v1", groups, {}, out, window=5)
        return int.from_bytes(out.read_bytes()[20:24], "big")  # the PNG's IHDR: width, then height

    assert height(6) == 420  # 4.2 inches at 100 dpi
    assert height(7) == 420 + round(100 * 0.18 * 4)  # 4 rows of two columns


def test_report_writes_figures_and_the_table(runs_dir, tmp_path):
    out = tmp_path / "report"
    result = tool("benchmark/report.py", runs_dir, "--out", out)
    assert result.returncode == 0, result.stderr
    for png in ("CartPole-v1.png", "ALE_Pong-v5.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "README.md").read_text()
    per_seed = [np.mean([i + 10 * seed for i in range(50, 150)]) for seed in (1, 2, 3)]  # last 100 episodes
    ours = f"{np.mean(per_seed):.2f} ± {np.std(per_seed):.2f}"
    ref = {r["baseline"]: r for r in read_reference() if r["env"] == "CartPole-v1" and r["script"] == "ppo.py"}
    row = next(line for line in text.splitlines() if line.startswith("| CartPole-v1 | ppo.py |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:4] == ["1, 2, 3", "20k"]
    assert cells[5] == ours
    assert cells[6].startswith(f"{float(ref['ppo2']['mean']):.2f} ± {float(ref['ppo2']['std']):.2f} @ 500k")
    assert cells[7] == f"{np.mean(per_seed) / float(ref['ppo2']['mean']):.2f}"
    assert cells[10] == f"{np.mean(per_seed) / float(ref['cleanrl']['mean']):.2f}"
    assert cells[8] == cells[11] == "—"  # no Welch's p: 20k steps against figures published at 500k
    like_for_like = tmp_path / "reference.csv"  # the published rows as if at 20k steps: now a p for each
    published_rows = (ROOT / "benchmark/reference.csv").read_text()
    like_for_like.write_text(published_rows.replace("CartPole-v1,ppo.py,500000", "CartPole-v1,ppo.py,20000"))
    assert tool("benchmark/report.py", runs_dir, "--out", tmp_path / "again", "--reference", like_for_like).returncode == 0
    row = next(x for x in (tmp_path / "again/README.md").read_text().splitlines() if x.startswith("| CartPole-v1 | ppo.py |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    for baseline, cell in (("ppo2", cells[8]), ("cleanrl", cells[11])):  # Welch's p against each published row
        published = {"mean": float(ref[baseline]["mean"]), "std": float(ref[baseline]["std"]), "seeds": 3}
        assert cell == f"{report.welch(per_seed, published)[1]:.2f}"
    pong = next(line for line in text.splitlines() if line.startswith("| ALE/Pong-v5 |"))
    assert "-20.50 ± 0.00" in pong and pong.count("—") == 6  # no published table for ALE/Pong-v5
    assert "![CartPole-v1](CartPole-v1.png)" in text and "not_a_run_name" in text and "__999" in text
    with open(out / "summary.csv", newline="") as f:
        summary = {r["env"]: r for r in csv.DictReader(f)}
    np.testing.assert_allclose([float(v) for v in summary["CartPole-v1"]["per_seed"].split()], per_seed)
    assert tool("benchmark/report.py", tmp_path / "empty_nothing", "--out", out).returncode != 0


def test_welch_p_is_students_t_with_the_welch_satterthwaite_degrees_of_freedom():
    """Welch's test without scipy: two seeds a side with equal variances of the mean give 2 degrees of freedom, where
    Student's two-sided p is 1 - |t| / sqrt(2 + t^2); 3 a side give 4, where t = 2.776445 is the 5% point."""
    for gap in (0.0, 0.3, 1.0, 2.5, 10.0, -4.0):
        # ours [-1, 1]: sample variance 2; published std 1 (numpy's) over 2 seeds: sample variance 2 too
        t, p = report.welch([-1.0, 1.0], {"mean": -gap, "std": 1.0, "seeds": 2})
        assert t == pytest.approx(gap / math.sqrt(2))
        assert p == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), abs=1e-12)
    # ours [-1, 0, 1]: sample variance 1; published std sqrt(2/3) over 3 seeds: sample variance 1
    t, p = report.welch([-1.0, 0.0, 1.0], {"mean": -2.776445 * math.sqrt(2 / 3), "std": math.sqrt(2 / 3), "seeds": 3})
    assert t == pytest.approx(2.776445) and p == pytest.approx(0.05, abs=1e-6)
    assert report.welch([5.0], {"mean": 1.0, "std": 1.0, "seeds": 3}) is None  # one seed: no test
    assert report.welch([-200.0, -200.0], {"mean": -200.0, "std": 0.0, "seeds": 3}) is None  # no spread at all


def test_welch_p_is_scipys_where_scipy_is_installed():
    scipy_stats = pytest.importorskip("scipy.stats")  # not a requirement: the report does without it
    rng = np.random.default_rng(0)
    for _ in range(200):
        ours, n = rng.normal(0, rng.uniform(0.1, 50), rng.integers(2, 9)), int(rng.integers(2, 9))
        ref = {"mean": float(rng.normal(0, 30)), "std": float(rng.uniform(0.1, 50)), "seeds": n}
        want = scipy_stats.ttest_ind_from_stats(
            ours.mean(), ours.std(ddof=1), len(ours), ref["mean"], ref["std"] * math.sqrt(n / (n - 1)), n, equal_var=False
        )
        assert report.welch(list(ours), ref) == pytest.approx((want.statistic, want.pvalue), rel=1e-9, abs=1e-12)


def test_report_made_again_from_its_episodes_file_is_the_same(runs_dir, tmp_path):
    """docs/results/ keeps episodes.csv.gz, not the event files: the report must come back identical from it."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert tool("benchmark/report.py", runs_dir, "--out", first, "--per", 10000).returncode == 0
    res = tool("benchmark/report.py", first / "episodes.csv.gz", "--out", second, "--per", 10000)
    assert res.returncode == 0, res.stderr
    tables = [[x for x in (d / "README.md").read_text().splitlines() if x.startswith(("|", "!["))] for d in (first, second)]
    assert tables[0] == tables[1] and len(tables[0]) > 10  # the notes differ: they name the folders skipped first
    assert (second / "summary.csv").read_text() == (first / "summary.csv").read_text()
    assert (second / "CartPole-v1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_training_time_leaves_out_the_pause_between_resumed_segments(tmp_path):
    """A run stopped and resumed an hour later: its table time, its time axis and its episodes file leave the hour out."""
    from torch.utils.tensorboard import SummaryWriter

    run_dir = tmp_path / "runs" / "CartPole-v1__ppo__1__1000"
    t0 = time.time()
    for segment, start in enumerate((t0, t0 + 3600 + 100)):  # two event files, as --resume writes them
        writer = SummaryWriter(str(run_dir), filename_suffix=f".{segment}")
        for i in range(100):  # an iteration's scalar and an episode each second: 100 s of training a segment
            step = (segment * 100 + i + 1) * 100
            writer.add_scalar("charts/SPS", 100.0, step, walltime=start + i + 1)
            writer.add_scalar("charts/episodic_return", float(step), step, walltime=start + i + 1)
        writer.close()
    found, _ = report.find_runs(tmp_path / "runs")
    run = report.load(found[0])
    assert len(run.pauses) == 1 and 3600 < run.pauses[0][1] - run.pauses[0][0] < 3602
    assert 198 < report.training_time(run, run.last_time) < 202  # of 3,800 s of wall time
    grid, _, _, _ = report.curve([run], x="time")
    assert grid[-1] == pytest.approx(report.training_time(run, run.last_time)) and grid[-1] < 300
    out = tmp_path / "report"
    assert tool("benchmark/report.py", tmp_path / "runs", "--out", out).returncode == 0
    row = next(line for line in (out / "README.md").read_text().splitlines() if line.startswith("| CartPole-v1 |"))
    assert row.split("|")[5].strip().endswith(" min") and float(row.split("|")[5].split()[0]) < 3.5  # not 63 min
    again = report.read_episodes(out / "episodes.csv.gz")[0]  # recorded in the file ...
    assert again.pauses == [(pytest.approx(a, abs=1e-3), pytest.approx(b, abs=1e-3)) for a, b in run.pauses]
    with gzip.open(out / "episodes.csv.gz", "rt") as f:  # ... and, in a file of before, found between the episodes
        rows = list(csv.DictReader(f))
    older = tmp_path / "older.csv.gz"
    with gzip.open(older, "wt", newline="") as f:
        w = csv.DictWriter(f, fieldnames=report.EPISODE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    derived = report.read_episodes(older)[0]
    assert len(derived.pauses) == 1 and 3600 < derived.pauses[0][1] - derived.pauses[0][0] < 3602
    broken = tmp_path / "broken.csv.gz"  # a pauses cell that is not 'from:to': one line, no traceback
    with gzip.open(broken, "wt", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([{**r, "pauses": "1:2:3"} for r in rows])
    res = tool("benchmark/report.py", broken, "--out", tmp_path / "bad")
    assert res.returncode == 2 and "not an episodes file" in res.stderr and "Traceback" not in res.stderr
    for cell in ("nan:nan", "5:3", "1:inf"):  # a pause that is no span of time would silently skew the training time
        with pytest.raises(ValueError, match="not 'from:to'"):
            report.parse_pauses(cell)
    assert report.parse_pauses("1:2 3.5:7") == [(1.0, 2.0), (3.5, 7.0)]


COMMITTED_REPORTS = sorted(
    p.parent.relative_to(ROOT).as_posix()
    for p in (ROOT / "docs/results").rglob("episodes.csv.gz")
    if "ablations" not in p.parts  # benchmark/ablate.py's reports: test_ablation.py makes them again
)


@pytest.mark.parametrize("folder", COMMITTED_REPORTS)
def test_committed_report_comes_back_from_its_episodes_file(folder, tmp_path):
    """The figures committed under docs/results/ are the report of the games committed beside them: no hand edits."""
    committed = (ROOT / folder / "README.md").read_text(encoding="utf-8")
    args = []
    window = re.search(r"^\| env \| script \| seed \| 0–(\d+)([kM]) \|", committed, re.M)
    if window:  # the committed report has a table per window of steps: make it again with the same --per
        args = ["--per", int(window.group(1)) * {"k": 1000, "M": 1_000_000}[window.group(2)]]
    res = tool("benchmark/report.py", ROOT / folder / "episodes.csv.gz", "--out", tmp_path / "again", *args)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "again/summary.csv").read_text() == (ROOT / folder / "summary.csv").read_text()
    again = (tmp_path / "again/README.md").read_text()
    tables = [[x for x in t.splitlines() if x.startswith("|")] for t in (committed, again)]
    assert tables[0] == tables[1] and tables[0]


RESULTS_TABLE = re.compile(r"^\| env \| script \| steps \| seeds \| ours \|.*?\n\|[-|]+\|\n((?:\|.*\n)+)", re.M)


def readme_results_rows(text):
    """The rows of every results table in a page (| env | script | steps | seeds | ours | ...; README.md has one, the
    docs/ pages more): (env, script and flags, steps, seeds, our figure) for each row."""
    tables = RESULTS_TABLE.findall(text)
    assert tables, "no results table (| env | script | steps | seeds | ours | ...)"
    rows = []
    for line in "".join(tables).splitlines():
        env, script, steps, seeds, ours = [c.strip() for c in line.strip("|").split("|")][:5]
        first, _, last = seeds.partition("–")
        steps = float(steps[:-1]) * {"k": 1e3, "M": 1e6}[steps[-1]]
        rows.append((env, script.strip("`"), steps, list(range(int(first), int(last or first) + 1)), ours))
    return rows


def committed_figure(env, script, steps, seeds):
    """What the committed reports (docs/results/**/summary.csv) give for these runs: `mean ± std` over `seeds` (numpy's
    std, ddof=0), or the mean alone for one seed, from each matching row's figures per seed; [] where none matches."""

    def key(name):  # a page may shorten an env id: 'MicroRTS ProduceCombatUnits' is a prefix of its key
        return re.sub(r"[^a-z0-9]", "", name.lower())

    found = []
    for path in sorted((ROOT / "docs/results").rglob("summary.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if "script" not in row or not key(row["env"]).startswith(key(env)):  # ablations: no script column
                    continue
                if sorted(row["script"].split()) != sorted(script.split()) or abs(int(row["steps"]) / steps - 1) > 0.02:
                    continue
                per_seed = dict(zip(map(int, row["seeds"].split()), map(float, row["per_seed"].split())))
                if not set(seeds) <= per_seed.keys():
                    continue
                if sorted(seeds) == sorted(per_seed):  # all its seeds: the row's own figures, unrounded
                    mean, std = float(row["mean"]), float(row["std"])
                else:
                    mean, std = float(np.mean([per_seed[s] for s in seeds])), float(np.std([per_seed[s] for s in seeds]))
                found.append(f"{mean:.2f}" if len(seeds) == 1 else f"{mean:.2f} ± {std:.2f}")
    return found


def readme_results_errors(text):
    """A line for each figure of ours in a page's results tables that no committed report gives."""
    errors = []
    for env, script, steps, seeds, ours in readme_results_rows(text):
        found = committed_figure(env, script, steps, seeds)
        if ours not in found:
            said = f"the committed report gives {' or '.join(found)}" if found else "no committed report has these runs"
            errors.append(f"{env} | {script} | seeds {seeds[0]}–{seeds[-1]}: {ours}, but {said}")
    return errors


def test_readme_results_are_the_figures_of_the_committed_reports():
    """README's one results table: each figure of ours is that of a committed report under docs/results/ (the same env,
    script and flags, steps and seeds), so a figure cannot be typed in, or outlive the report it came from."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(RESULTS_TABLE.findall(text)) == 1
    assert len(readme_results_rows(text)) >= 10
    assert readme_results_errors(text) == []


def committed_per_seed(env, script, steps, seeds):
    """Each seed's figure from the committed report that has these runs (as committed_figure finds it), or None."""

    def key(name):
        return re.sub(r"[^a-z0-9]", "", name.lower())

    for path in sorted((ROOT / "docs/results").rglob("summary.csv")):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if "script" not in row or key(row["env"]) != key(env):
                    continue
                if sorted(row["script"].split()) != sorted(script.split()):
                    continue
                per_seed = dict(zip(map(int, row["seeds"].split()), map(float, row["per_seed"].split())))
                if abs(int(row["steps"]) / steps - 1) <= 0.02 and set(seeds) <= per_seed.keys():
                    return [per_seed[s] for s in seeds]
    return None


def readme_p_errors(text):
    """A line for each published cell of README's results table whose Welch p (`(p 0.16)`, `(v2, p 0.90)`) is not the
    report's for the committed seeds, or that lacks one where the report gives one (2+ seeds a side, a spread, steps)."""
    reference, errors = report.load_reference(ROOT / "benchmark/reference.csv"), []
    lines = "".join(RESULTS_TABLE.findall(text)).splitlines()
    for line, (env, script, steps, seeds, _) in zip(lines, readme_results_rows(text)):
        cells = [c.strip() for c in line.strip("|").split("|")]
        per_seed = committed_per_seed(env, script, steps, seeds)
        refs = report.references_for(reference, env, script.split()[0])
        for cell, baseline in zip(cells[5:7], ("ppo2", "cleanrl")):
            ref, said = refs.get(baseline), re.search(r"\bp (\d\.\d\d)\)", cell)
            test = report.welch(per_seed, ref) if ref and per_seed and steps >= 0.99 * ref["steps"] else None
            want = f"{test[1]:.2f}" if test else None
            if (said.group(1) if said else None) != want:
                errors.append(f"{env} | {script} | {baseline}: p {said.group(1) if said else 'none'}, the report's {want}")
    return errors


def test_readme_welch_p_are_the_reports():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_p_errors(text) == []
    assert text.count("(p ") + text.count(", p ") >= 16
    row = "| Walker2d-v4 | `ppo_continuous_action.py` | 1M | 1–5 | 2912.86 ± 371.77 | 3356.49 ± 322.61 (v2, p 0.20) |"
    assert text.count(row) == 1
    for changed, said in [("(v2, p 0.21)", "p 0.21, the report's 0.20"), ("(v2)", "p none, the report's 0.20")]:
        errors = readme_p_errors(text.replace(row, row.replace("(v2, p 0.20)", changed)))
        assert errors == [f"Walker2d-v4 | ppo_continuous_action.py | ppo2: {said}"]


DOCS_WITH_RESULTS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "docs").rglob("*.md")
    if RESULTS_TABLE.search(p.read_text(encoding="utf-8"))
)


@pytest.mark.parametrize("page", DOCS_WITH_RESULTS)
def test_docs_results_are_the_figures_of_the_committed_reports(page):
    """The figures that moved from README.md into docs/ pages (each seed, the shorter runs) stay tied to the reports."""
    assert readme_results_errors((ROOT / page).read_text(encoding="utf-8")) == []


def test_the_docs_pages_with_results_are_found():
    assert {"docs/classic.md", "docs/mujoco.md", "docs/atari.md", "docs/microrts.md"} <= set(DOCS_WITH_RESULTS)


def test_readme_results_check_fails_on_a_figure_that_is_not_reported():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    row = "| Hopper-v4 | `ppo_continuous_action.py` | 1M | 1–5 | 2188.29 ± 249.22 |"
    assert text.count(row) == 1
    for changed, said in [
        ("| 1M | 1–5 | 2188.30 ± 249.22 |", "2188.30 ± 249.22, but the committed report gives 2188.29 ± 249.22"),
        ("| 1M | 1–3 | 2188.29 ± 249.22 |", "seeds 1–3: 2188.29 ± 249.22, but the committed report gives 2060.22 ± 153.99"),
        ("| 1M | 4 | 2188.29 ± 249.22 |", "seeds 4–4: 2188.29 ± 249.22, but the committed report gives 2621.65"),
        ("| 2M | 1–5 | 2188.29 ± 249.22 |", "no committed report has these runs"),
    ]:
        errors = readme_results_errors(text.replace(row, row.replace("| 1M | 1–5 | 2188.29 ± 249.22 |", changed)))
        assert len(errors) == 1 and errors[0].startswith("Hopper-v4 |") and said in errors[0], errors
    flagged = row.replace("`ppo_continuous_action.py`", "`ppo_continuous_action.py --no-norm-obs`")
    assert "no committed report" in readme_results_errors(text.replace(row, flagged))[0]


INFLIGHT = ROOT / "benchmark/inflight"


def test_no_checkpoint_nor_large_file_is_tracked():
    """A long run keeps its folder outside the repository (benchmark/inflight/README.md) and only its results are
    committed: no checkpoint and nothing over 5 MB is tracked, so a clone no longer grows ~20 MB a session."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [f for f in files.split("\0") if f and (ROOT / f).is_file()]
    assert len(files) > 50
    assert [f for f in files if (ROOT / f).stat().st_size > 5 * 2**20] == []
    assert [f for f in files if f.endswith((".pt", ".pth", ".ckpt"))] == []
    assert [f for f in files if f.startswith("benchmark/inflight/")] == ["benchmark/inflight/README.md"]


def test_report_table_of_mean_return_per_window_of_steps(runs_dir, tmp_path):
    out = tmp_path / "report"
    assert tool("benchmark/report.py", runs_dir, "--out", out, "--per", 10000).returncode == 0
    text = (out / "README.md").read_text()
    assert "| env | script | seed | 0–10k | 10k–20k |" in text
    for seed in (1, 2, 3):  # episodes i = 0..99 end at steps 100..10,000; i = 100..149 at 10,100..15,000
        row = next(line for line in text.splitlines() if line.startswith(f"| CartPole-v1 | ppo.py | {seed} |"))
        assert row.split("|")[4:6] == [f" {49.5 + 10 * seed:.2f} ", f" {124.5 + 10 * seed:.2f} "], row
    assert tool("benchmark/report.py", runs_dir, "--out", out).returncode == 0
    assert "Mean return per window" not in (out / "README.md").read_text()  # off by default
    assert tool("benchmark/report.py", runs_dir, "--out", out, "--per", -1).returncode == 2
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    res = tool("benchmark/report.py", tmp_path / "bad.csv.gz", "--out", out)
    assert res.returncode == 2 and "is not an episodes file" in res.stderr and "Traceback" not in res.stderr


def write_flagged_run(runs, name, returns, last_step, **changed):
    """A run of ppo_atari_envpool.py that logged its settings as the scripts do: the defaults, `changed` applied."""
    from torch.utils.tensorboard import SummaryWriter

    settings = report.script_defaults(ROOT / "ppo_atari_envpool.py") | {"exp_name": "ppo_atari_envpool"} | changed
    writer = SummaryWriter(str(runs / name))
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in settings.items()))
    for step, value in returns:
        writer.add_scalar("charts/episodic_return", value, step)
    writer.add_scalar("losses/value_loss", 1.0, last_step)
    writer.close()


def test_report_keeps_runs_of_one_script_with_other_settings_apart_and_names_the_flags(tmp_path):
    """A float32 run and a --bf16 --channels-last run of the same script and seed are two rows, each named by the
    flags it changed; neither is taken for an older run of the other, and the episodes file keeps the flags."""
    runs, out = tmp_path / "runs", tmp_path / "report"
    env = "BreakoutNoFrameskip-v4"
    write_flagged_run(runs, f"{env}__ppo_atari_envpool__1__1000", [(100, 10.0)], 4096, seed=1, total_timesteps=4096)
    write_flagged_run(runs, f"{env}__ppo_atari_envpool__1__2000", [(100, 30.0)], 4096, bf16=True, channels_last=True)
    write_flagged_run(runs, f"{env}__ppo_atari_envpool__2__3000", [(100, 50.0)], 4096, bf16=True, channels_last=True)
    write_flagged_run(runs, f"{env}__ppo_atari_envpool__1__4000", [(100, 70.0)], 4096, anneal_lr=False, clip_coef=0.2)
    res = tool("benchmark/report.py", runs, "--out", out, "--per", 1000)
    assert res.returncode == 0 and "older run" not in res.stderr, res.stderr
    table = (out / "README.md").read_text().split("## Mean return per window")[0]  # the table of final returns
    rows = {line.split("|")[2].strip(): line for line in table.splitlines() if f"| {env} |" in line}
    assert set(rows) == {
        "ppo_atari_envpool.py",  # total_timesteps and seed name the run, they are not flags
        "ppo_atari_envpool.py --channels-last --bf16",  # the script's order of its fields
        "ppo_atari_envpool.py --no-anneal-lr --clip-coef 0.2",  # tyro's flags
    }
    assert "| 1, 2 |" in rows["ppo_atari_envpool.py --channels-last --bf16"]
    assert "40.00 ± 10.00" in rows["ppo_atari_envpool.py --channels-last --bf16"]  # its two seeds only
    assert "10.00 ± 0.00" in rows["ppo_atari_envpool.py"] and "409.27" in rows["ppo_atari_envpool.py"]
    with open(out / "summary.csv", newline="") as f:
        assert sorted(r["script"] for r in csv.DictReader(f)) == sorted(rows)
    again = tmp_path / "again"
    assert tool("benchmark/report.py", out / "episodes.csv.gz", "--out", again, "--per", 1000).returncode == 0
    assert (again / "summary.csv").read_text() == (out / "summary.csv").read_text()  # the flags kept in the file
    assert report.changed_flags({"bf16": "True", "cuda": "False", "seed": "3"}, {"bf16": False, "cuda": True}) == "--bf16"
    assert report.defaults_of("ppo_shared_vf0.01") == {}  # an --exp-name of no script: its runs are named by it alone


def test_report_keeps_a_run_whose_settings_changed_on_resume_apart_and_says_from_which_step(tmp_path):
    """A --bf16 run resumed with --no-bf16 (or a run extended by a larger --total-timesteps) logged each segment's
    settings: its row says what changed and from which step, and it is not averaged with the runs that kept theirs."""
    from torch.utils.tensorboard import SummaryWriter

    runs, out, env = tmp_path / "runs", tmp_path / "report", "PongNoFrameskip-v4"
    defaults = report.script_defaults(ROOT / "ppo_atari_envpool.py") | {"exp_name": "ppo_atari_envpool"}
    table = "|param|value|\n|-|-|\n"
    for seed in (1, 2):  # kept --bf16 --channels-last throughout
        write_flagged_run(runs, f"{env}__ppo_atari_envpool__{seed}__1000", [(100, 20.0)], 4096, bf16=True, channels_last=True)
    mixed = runs / f"{env}__ppo_atari_envpool__3__1000"
    for k, (first, bf16) in enumerate(((0, True), (2048, False))):  # two event files, as --resume writes them
        writer = SummaryWriter(str(mixed), filename_suffix=f".{k}", purge_step=first + 1 if first else None)
        settings = defaults | {"seed": 3, "bf16": bf16, "channels_last": True}
        writer.add_text("hyperparameters", table + "\n".join(f"|{a}|{b}|" for a, b in settings.items()), first)
        writer.add_scalar("charts/episodic_return", -10.0 + 20 * k, first + 1000)
        writer.add_scalar("losses/value_loss", 1.0, first + 2048)
        writer.close()
    res = tool("benchmark/report.py", runs, "--out", out)
    assert res.returncode == 0 and "older run" not in res.stderr, res.stderr
    rows = {line.split("|")[2].strip(): line for line in (out / "README.md").read_text().splitlines() if f"| {env} |" in line}
    mixed_label = "ppo_atari_envpool.py --channels-last --bf16; from step 2048: --channels-last"
    assert set(rows) == {"ppo_atari_envpool.py --channels-last --bf16", mixed_label}, rows
    assert "| 1, 2 |" in rows["ppo_atari_envpool.py --channels-last --bf16"] and "| 3 |" in rows[mixed_label]
    again = tmp_path / "again"  # the episodes file keeps the label
    assert tool("benchmark/report.py", out / "episodes.csv.gz", "--out", again).returncode == 0
    assert (again / "summary.csv").read_text() == (out / "summary.csv").read_text()

    segment_flags = report.segment_flags  # one segment; an extension; back to the first settings; none changed
    logged = {name: str(value) for name, value in defaults.items()} | {"total_timesteps": "100"}  # as a table has them
    f32, b16 = logged, logged | {"bf16": "True"}
    assert segment_flags([(0, b16)], defaults) == "--bf16"
    assert segment_flags([(0, f32), (50, f32 | {"total_timesteps": "200"})], defaults) == (
        "--total-timesteps 100; from step 50: --total-timesteps 200"
    )
    back = "(defaults); from step 50: --bf16; from step 80: (defaults)"
    assert segment_flags([(0, f32), (50, b16), (80, f32)], defaults) == back
    assert segment_flags([(0, b16), (50, b16 | {"torch_threads": "1", "cuda": "False"})], defaults) == "--bf16"


def test_a_resumed_script_logs_the_settings_of_its_new_segment_for_the_report(tmp_path):
    """ppo.py run, then extended with --resume and a larger total: TensorBoard has both segments' settings, and the
    report names the run by them."""
    res = run_script("ppo.py", "--total-timesteps", 1024, "--save-model", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (run_dir,) = run_dirs(tmp_path)
    res = run_script("ppo.py", "--resume", run_dir / "checkpoint.pt", "--total-timesteps", 2048, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(report.HYPERPARAMETERS_TAG)]
    assert [step for step, _ in texts] == [0, 1024]
    assert [report.logged_settings(text)["total_timesteps"] for _, text in texts] == ["1024", "2048"]
    out = tmp_path / "report"
    assert tool("benchmark/report.py", tmp_path / "runs", "--out", out).returncode == 0
    assert (
        "| CartPole-v1 | ppo.py --total-timesteps 1024; from step 1024: --total-timesteps 2048 |"
        in (out / "README.md").read_text()
    )


def test_report_episodes_file_of_default_runs_has_no_flags_column(runs_dir, tmp_path):
    """The episodes files committed before flags were recorded come back as they were (no column added)."""
    assert tool("benchmark/report.py", runs_dir, "--out", tmp_path / "r").returncode == 0
    with gzip.open(tmp_path / "r/episodes.csv.gz", "rt") as f:
        assert f.readline().strip().split(",") == report.EPISODE_COLUMNS


# Ctrl-C inside a tool: a real SIGINT, sent by the tool to itself at a chosen point (the patch survives runpy, which
# runs the tool as `python tool.py` would, its `__main__` block included)
CTRL_C_AT = """
import os, runpy, signal, sys, time
import {module} as patched
def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C
    time.sleep(5)
patched.{attr} = interrupted
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even if started in the background
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def ctrl_c_at(target, tool_path, *args, cwd=ROOT):
    """Run the tool (a plain process: the signal is real) with `module:attr` replaced by a Ctrl-C to itself."""
    module, attr = target.split(":")
    code = CTRL_C_AT.format(module=module, attr=attr)
    return run_python("-c", code, ROOT / tool_path, *args, cwd=cwd, fork=False)


EVENTS = "tensorboard.backend.event_processing.event_accumulator:EventAccumulator.Reload"


def test_ctrl_c_while_report_loads_or_writes_is_one_line_and_keeps_the_report_there(runs_dir, tmp_path):
    out = tmp_path / "report"
    res = ctrl_c_at(EVENTS, "benchmark/report.py", runs_dir, "--out", out)  # while the event files are read
    assert res.returncode == 128 + signal.SIGINT and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "report.py: interrupted (Ctrl-C); nothing more was done"
    assert not out.exists()
    assert tool("benchmark/report.py", runs_dir, "--out", out).returncode == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    res = ctrl_c_at("matplotlib.figure:Figure.savefig", "benchmark/report.py", runs_dir, "--out", out, "--per", 10000)
    assert res.returncode == 128 + signal.SIGINT and "Traceback" not in res.stderr, res.stderr
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # the earlier report, whole; no temporary folder


def test_ctrl_c_while_shared_gradients_loads_is_one_line():
    res = ctrl_c_at("gymnasium:make", "benchmark/shared_gradients.py", "--env-ids", "CartPole-v1", "--seeds", "1")
    assert res.returncode == 128 + signal.SIGINT and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "shared_gradients.py: interrupted (Ctrl-C); nothing more was done"
    assert "| env |" not in res.stdout  # stopped before its table


def test_every_tool_exits_through_exit_with():
    """Each tool's `__main__` block is `exit_with(main...)`: Ctrl-C anywhere in it is one line, not a traceback."""
    tools = sorted([*ROOT.glob("benchmark/*.py"), *ROOT.glob("tools/*.py")])
    mains = {t.name: t.read_text(encoding="utf-8").split('if __name__ == "__main__":\n')[1:] for t in tools}
    assert len([m for m in mains.values() if m]) >= 12
    for name, block in mains.items():
        assert not block or block[0].strip().startswith("exit_with(main"), f"{name}: {block[0].strip()}"


# ----------------------------------------------------------------------------------------- speed, before/after


def test_speed_against_a_revision_runs_both_interleaved():
    """--against REV: each script as it was at REV (git show) beside the current one, and their ratio."""
    args = ["--against", "HEAD", "--repeats", "1", "--train-steps", "4096", "--env-seconds", "0.3", "ppo.py"]
    res = tool("benchmark/speed.py", *args, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "measured ppo.py@HEAD:" in res.stdout and "measured ppo.py:" in res.stdout
    assert res.stdout.index("measured ppo.py@HEAD:") < res.stdout.index("measured ppo.py:")  # interleaved, old first
    ratios = res.stdout[res.stdout.index("after / before |") :]  # the before/after table, after the speed table
    (row,) = [line for line in ratios.splitlines() if line.startswith("| ppo.py | CartPole-v1 |")]
    before, after, ratio = (float(c.strip().replace(",", "")) for c in row.strip("|").split("|")[2:5])
    assert ratio == pytest.approx(after / before, abs=0.01)


def test_speed_with_flags_measures_each_script_also_with_them():
    args = ["--with-flags=--no-anneal-lr", "--with-flags=--no-norm-adv --no-anneal-lr", "--repeats", "1"]
    res = tool("benchmark/speed.py", *args, "--train-steps", "4096", "--env-seconds", "0.3", "ppo.py", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.index("measured ppo.py:") < res.stdout.index("measured ppo.py --no-anneal-lr:")  # interleaved
    assert "measured ppo.py --no-norm-adv --no-anneal-lr:" in res.stdout  # each set of flags, side by side
    table = res.stdout[res.stdout.index("with / without |") :]
    (row,) = [line for line in table.splitlines() if line.startswith("| ppo.py | CartPole-v1 |")]
    cells = [float(c.strip().replace(",", "")) for c in row.strip("|").split("|")[2:]]
    plain, flagged, ratio, both, both_ratio = cells
    assert ratio == pytest.approx(flagged / plain, abs=0.01) and both_ratio == pytest.approx(both / plain, abs=0.01)
    assert f"median of 1; {os.cpu_count()} CPUs, " in res.stdout and ", bfloat16: " in res.stdout  # the machine named


SAPPHIRE_RAPIDS = "model name\t: Intel(R) Xeon(R) Platinum 8480+\ncpu family\t: 6\nmodel\t\t: 143\n"
SAPPHIRE_RAPIDS += "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN3 = "model name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 1\nflags\t\t: fpu sse4_2 avx avx2 fma\n"


@pytest.mark.parametrize(
    "cpuinfo, said",
    [
        (
            SAPPHIRE_RAPIDS * 2,  # two CPUs: the first one's fields
            "Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143), AVX-512, bfloat16: AMX-BF16 and AVX512-BF16",
        ),
        (ZEN3, "AMD EPYC (family 25, model 1), AVX2, bfloat16: not native"),
        (ZEN3.replace("avx2 ", "avx512f avx512_bf16 "), "AMD EPYC (family 25, model 1), AVX-512, bfloat16: AVX512-BF16"),
        ("CPU part\t: 0xd40\nFeatures\t: fp asimd bf16\n", "0xd40, NEON, bfloat16: BF16"),  # an Arm Neoverse V1
        (None, "CPU model unknown, no AVX2, bfloat16: not native"),  # /proc/cpuinfo unreadable
    ],
)
def test_machine_names_the_cpu_its_vector_width_and_whether_bf16_is_native(tmp_path, cpuinfo, said):
    """The line speed tables carry: figures from two machines compare only where these agree (the same CPU model may
    come with or without AVX512-BF16, and --bf16 runs only where it is native)."""
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    line = common.machine(path)
    assert line.startswith(f"{os.cpu_count()} CPUs, {said}"), line
    assert ("GPU: " in line) == torch.cuda.is_available()


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope.py"], "no such script: nope.py"),
        (["--repeats", "0", "ppo.py"], "--repeats"),
        (["--env-seconds", "nan", "ppo.py"], "--env-seconds above 0"),
        (["--train-steps", "0", "ppo.py"], "--train-steps must be at least 1"),
        (["--against", "no-such-rev", "ppo.py"], "--against no-such-rev: no ppo.py at that revision"),
    ],
)
def test_speed_bad_input_one_clear_line(args, message):
    res = tool("benchmark/speed.py", *args)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def markdown_pages():
    """README.md, DETAILS.md, every .md under docs/ (but the generated docs/diffs/) and under benchmark/."""
    pages = [ROOT / "README.md", ROOT / "DETAILS.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmark").rglob("*.md")]
    return sorted(p.relative_to(ROOT).as_posix() for p in pages if "diffs" not in p.relative_to(ROOT).parts)


def github_anchors(text):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to '-', repeats numbered."""
    anchors, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} +(.*?)[ #]*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", markdown_pages())
def test_relative_links_of_the_docs_point_at_files(doc):
    """Every relative link (and image) of the pages resolves, and an anchor into a page names one of its headings."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"<img [^>]*src=\"([^\"]+)\"", text)
    links = [m for m in links if not m.startswith(("http://", "https://", "mailto:"))]
    assert links or doc != "README.md"
    bad = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (ROOT / doc).parent / path if path else ROOT / doc
        if not target.exists():
            bad.append(link)
        elif anchor and target.suffix == ".md" and anchor not in github_anchors(target.read_text(encoding="utf-8")):
            bad.append(f"{link} (no such heading)")
    assert not bad, bad


def test_the_link_check_sees_every_page_and_anchor():
    assert {"README.md", "docs/README.md", "docs/results/README.md", "benchmark/inflight/README.md"} <= set(markdown_pages())
    anchors = github_anchors("# A `--bf16` page: 2.04×\n## Speed\n```\n# not a heading\n```\n## Speed\n")
    assert anchors == {"a---bf16-page-204", "speed", "speed-1"}


def test_readme_is_a_front_page():
    """README.md stays short, and a new user reaches the install command within its first screen."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220
    assert any(line.startswith("pip install") for line in lines[:40])


def test_pyproject_pins_are_those_of_requirements():
    """pyproject.toml's dependencies and extras pin exactly what requirements.txt (and requirements-microrts.txt)
    pins, so `pip install -e .[dev]` and `pip install -r requirements.txt` cannot drift apart."""
    import tomllib

    def pins(lines):
        return {re.split(r"[\[=<>~ ]", r)[0].lower(): r for r in (x.split("#")[0].strip() for x in lines) if r}

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    requirements = pins((ROOT / "requirements.txt").read_text().splitlines())
    microrts = pins((ROOT / "requirements-microrts.txt").read_text().splitlines())
    declared = pins(project["dependencies"] + [r for name, reqs in extras.items() if name != "microrts" for r in reqs])
    assert declared == requirements
    assert all("==" in r for r in declared.values())
    assert pins(extras["microrts"]).items() <= microrts.items()  # gym-microrts itself: tools/install_microrts.sh
    assert {"envpool", "dev", "microrts"} <= extras.keys() and project["requires-python"] == ">=3.11"


def test_ci_runs_the_test_command_of_readme_and_installs_what_it_needs():
    """.ci/run's last line is README's test command, and each of that command's plugins is pinned in requirements.txt."""
    setup = re.search(r"## Set up and test\n\n```bash\n(.*?)\n```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    install, command = setup.group(1).split(" && ")
    assert install == "pip install -r requirements.txt"
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == command
    pins = (ROOT / "requirements.txt").read_text()
    assert "-n " not in command or re.search(r"^pytest-xdist==", pins, re.M)  # -n is pytest-xdist's


# benchmark/shared_gradients.py: the split of ppo_shared.py's trunk gradient into its policy and value parts


def test_shared_gradients_split_is_linear_in_vf_coef_and_value_dominated():
    sg = load_module("benchmark/shared_gradients.py")
    m = sg.load("ppo_shared.py")
    p, v, cos = sg.trunk_gradients(m, "Acrobot-v1", 1)
    p_small, v_small, cos_small = sg.trunk_gradients(m, "Acrobot-v1", 1, vf_coef=0.01)
    # the same seed, the same rollout: the policy part does not depend on vf_coef, the value part scales with it
    assert p_small == pytest.approx(p, rel=1e-6)
    assert v_small == pytest.approx(v * 0.01 / m.Args().vf_coef, rel=1e-5)
    assert cos_small == pytest.approx(cos, abs=1e-5)
    # the finding RESULTS.md reports: at initialization the value part is thousands of times the policy part
    assert v / p > 1000


def test_shared_gradients_table_and_one_line_errors():
    res = tool("benchmark/shared_gradients.py", "--env-ids", "CartPole-v1", "--seeds", "1", "2")
    assert res.returncode == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("| CartPole-v1 |")]
    assert len(rows) == 2 and all(len(row.split("|")) == 8 for row in rows)
    res = tool("benchmark/shared_gradients.py", "--env-ids", "Nope-v0")
    assert res.returncode == 1 and res.stderr.strip().count("\n") == 0 and "Nope-v0" in res.stderr
    assert res.stdout == ""  # refused before the table
    res = tool("benchmark/shared_gradients.py", "--env-ids", "BreakoutNoFrameskip-v4")  # an Atari id: the script to use
    assert res.returncode == 1 and "ppo_atari.py" in res.stderr and "Traceback" not in res.stderr, res.stderr
    res = tool("benchmark/shared_gradients.py", "--env-ids", "Acrobot-v1", "--vf-coef", "-1")
    assert res.returncode == 1 and "--vf-coef -1.0 is not allowed" in res.stderr
    res = tool("benchmark/shared_gradients.py", "--env-ids", "Pendulum-v1", "--seeds", "1")
    assert res.returncode == 1 and "Traceback" not in res.stderr and "ppo_continuous_action.py" in res.stderr


# tools/gif.py: a recorded episode as a GIF


def test_gif_keeps_every_nth_frame_in_order(tmp_path):
    import imageio.v2 as imageio

    video = tmp_path / "episode.mp4"
    # 40 frames, frame i a flat gray of 6 * i: the GIF must hold frames 0, 4, 8, ... in that order
    frames = [np.full((64, 64, 3), 6 * i, dtype=np.uint8) for i in range(40)]
    imageio.mimsave(str(video), frames, fps=30, macro_block_size=1)
    gif = load_module("tools/gif.py")
    assert gif.video_to_gif(video, tmp_path / "a.gif", every=4) == 10
    shades = [int(f[..., :3].mean()) for f in imageio.mimread(str(tmp_path / "a.gif"))]
    assert len(shades) == 10 and all(abs(s - 24 * k) <= 3 for k, s in enumerate(shades)), shades
    assert gif.video_to_gif(video, tmp_path / "b.gif", every=1, max_frames=7) == 7
    res = tool("tools/gif.py", tmp_path / "missing.mp4", tmp_path / "c.gif")
    assert res.returncode == 1 and "is not a file" in res.stderr and res.stderr.count("\n") == 1
    (tmp_path / "bad.mp4").write_text("not a video")
    res = tool("tools/gif.py", tmp_path / "bad.mp4", tmp_path / "c.gif")
    assert res.returncode == 1 and "cannot make a GIF" in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_report_draws_a_published_line_only_within_reach_of_the_runs():
    row = {"steps": 10_000_000, "mean": 409.27}
    runs = [report.Run("BreakoutNoFrameskip-v4", "ppo_atari", 1, 0, Path("a"), last_step=999_424)]
    assert not report.within_reach(row, runs)  # 1M-step runs beside a 10M-step number: named, not drawn
    runs.append(report.Run("BreakoutNoFrameskip-v4", "ppo_atari", 2, 0, Path("b"), last_step=5_000_000))
    assert report.within_reach(row, runs)  # the longest run counts
    assert report.within_reach({"steps": 500_000}, [report.Run("CartPole-v1", "ppo", 1, 0, Path("c"), last_step=499_712)])


# ------------------------------------------------- every tool's arguments, its writes and signals (issue 23)

ablate = load_module("benchmark/ablate.py")
speed = load_module("benchmark/speed.py")
atari_speed = load_module("benchmark/atari_speed.py")
first_ratio = load_module("benchmark/first_ratio.py")
kl_estimators = load_module("benchmark/kl_estimators.py")
bf16_gradients = load_module("benchmark/bf16_gradients.py")
shared_gradients = load_module("benchmark/shared_gradients.py")
gif = load_module("tools/gif.py")


def one_line(text):
    """The text is one line, with no traceback in it (argparse's usage lines aside)."""
    lines = text.strip().splitlines()
    if lines and lines[0].startswith("usage:"):  # parser.error: the usage, then "<prog>: error: ..."
        lines = lines[next((i for i, x in enumerate(lines) if ": error: " in x), 0) :]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def refused(capsys, call):
    """Run `call` (a tool's main) in this process: it must refuse in one line, by its exit status or sys.exit."""
    try:
        rc = call()
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err + (rc if isinstance(rc, str) else "")
    assert rc not in (0, None), err
    return one_line(err)


def leftover(pattern):
    """The pids of processes whose command line matches `pattern` (a run that outlived the tool that started it)."""
    res = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split()]


def kill_leftovers(pattern):
    for pid in leftover(pattern):  # our own test's runs, by their unique seed
        os.kill(pid, 9)


ABLATE = ["ppo.py", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--seeds", "1", "--details", "core-4"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (ABLATE + ["--", "--seed", "3"], "--seed after --: ablate.py sets it for each run (use --seeds)"),
        (ABLATE + ["--", "--exp-name", "x"], "--exp-name after --: ablate.py sets it"),
        (ABLATE + ["--", "--no-anneal-lr"], "--no-anneal-lr after --: the flag of core-4, which the ablation switches off"),
        (ABLATE + ["--", "--nope"], "ppo.py: Unrecognized options: --nope"),
        (ABLATE + ["--", "--num-envs", "x"], "ppo.py: Error parsing --num-envs"),
        (ABLATE + ["--", "--resume", "runs/x/checkpoint.pt"], "--resume continues one run"),
        (ABLATE + ["--total-timesteps", "100"], "ppo.py: --total-timesteps 100 is below one batch"),
        (ABLATE + ["--env-id", "Nope-v0"], "ppo.py: Nope-v0: Environment `Nope` doesn't exist."),
        (ABLATE + ["--seeds", "1", "1"], "--seeds: 1 given twice"),
        (ABLATE + ["--out", "taken"], "--out taken: taken is a file, not a folder"),
        (ABLATE + ["--log-dir", "taken/logs"], "--log-dir taken/logs: taken is a file, not a folder"),
        (ABLATE + ["--report-only", "--runs", "nothing"], "--runs nothing: no such folder or episodes file"),
        (["tools"] + ABLATE[1:], "tools is a folder, not a variant script"),
        ([str(ROOT / "benchmark/report.py")] + ABLATE[1:], "report.py is not a variant script (e.g. ppo.py)"),
    ],
)
def test_ablate_refuses_what_its_runs_would_refuse_in_one_line_before_anything_runs(
    tmp_path, monkeypatch, capsys, argv, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("a file")
    assert message in refused(capsys, lambda: ablate.main(argv))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no runs/, logs/ or report


def test_ablate_flags_after_the_double_dash_identify_the_runs(tmp_path, monkeypatch, capsys):
    """The issue's case: an ablation with flags after -- after the same one without them made its own runs, and its
    report is of them (the runs without the flags here: fakes of return 1000, which CartPole cannot reach in 512 steps)."""
    for exp in ("ppo__default", "ppo__off-core-4"):
        write_run(tmp_path / "runs", f"CartPole-v1__{exp}__1__1000", [(s, 1000.0) for s in range(100, 501, 100)], 512)
    args = ABLATE + ["--total-timesteps", "512", "--jobs", "2", "--out", "report", "--last", "5"]
    res = tool("benchmark/ablate.py", *args, "--", "--gamma", "0.98", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "already complete" not in res.stdout and res.stdout.count("] started ") == 2
    new = sorted(d.name.rsplit("__", 2)[0] for d in (tmp_path / "runs").iterdir() if not d.name.endswith("__1000"))
    tag = new[0].split("__")[-1]
    assert new == [f"CartPole-v1__ppo__default__{tag}", f"CartPole-v1__ppo__off-core-4__{tag}"] and tag.startswith("with-")
    with open(tmp_path / "report/summary.csv", newline="") as f:
        means = [float(r["mean"]) for r in csv.DictReader(f)]
    assert len(means) == 2 and max(means) < 500  # the new runs, not the fakes
    assert "`--gamma 0.98`" in (tmp_path / "report/README.md").read_text()
    monkeypatch.chdir(tmp_path)  # the same again, in this process (no run to start)
    assert ablate.main([*args, "--", "--gamma=0.98"]) == 0  # the same settings, spelled otherwise: the same runs
    assert "2 of 2 runs are already complete" in capsys.readouterr().out
    assert ablate.main(args) == 0  # without the flags: the runs made without them (the fakes)
    assert "2 of 2 runs are already complete" in capsys.readouterr().out
    with open(tmp_path / "report/summary.csv", newline="") as f:
        assert [float(r["mean"]) for r in csv.DictReader(f)] == [1000.0, 1000.0]


def test_ablate_does_not_take_a_longer_run_for_a_complete_one(tmp_path):
    """A run made with a larger --total-timesteps anneals its learning rate over another horizon: not this ablation's."""
    write_run(tmp_path, "CartPole-v1__ppo__default__1__1000", [(512, 10.0)], 1024)
    write_run(tmp_path, "CartPole-v1__ppo__default__2__1000", [(512, 10.0)], 4096)
    assert ablate.completed_runs(tmp_path, 1024) == {("CartPole-v1", "ppo__default", 1)}
    notes = []
    groups = ablate.load_groups([tmp_path], "ppo", {"CartPole-v1"}, [], {1, 2}, 1024, notes)
    assert [r.seed for r in groups["CartPole-v1", "ppo__default"]] == [1]
    assert notes == ["ppo__default CartPole-v1 seed 2 ran to step 4,096, past the total: left out"]


def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_ablate_and_report_write_their_report_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for exp in ("ppo__default", "ppo__off-core-4"):
        write_run(tmp_path / "runs", f"CartPole-v1__{exp}__1__1000", [(s, 10.0) for s in range(100, 1001, 100)], 1024)
    out = tmp_path / "report"
    out.mkdir()
    (out / "README.md").write_text("the report that was there")
    monkeypatch.setattr(ablate, "write_report", full_disk)
    line = refused(capsys, lambda: ablate.main([*ABLATE, "--report-only", "--out", str(out)]))
    assert "cannot write the report into" in line and "No space left on device" in line
    monkeypatch.setattr(report, "write_summary_csv", full_disk)  # report.py: the figures and README.md were written
    line = refused(capsys, lambda: report.main([str(tmp_path / "runs"), "--out", str(out)]))
    assert "cannot write the report into" in line and "No space left on device" in line
    assert [p.name for p in out.iterdir()] == ["README.md"]  # nothing half-written, no temporary folder left
    assert (out / "README.md").read_text() == "the report that was there"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{runs}", "--out", "{file}"], "is a file, not a folder"),
        (["{runs}", "{empty}"], "empty holds no run directories"),
        (["{runs}", "--reference", "{empty}"], "--reference"),
    ],
)
def test_report_bad_paths_one_line_before_anything_is_written(tmp_path, capsys, runs_dir, argv, message):
    (tmp_path / "file").write_text("a file")
    (tmp_path / "empty").mkdir()
    paths = {"runs": runs_dir, "file": tmp_path / "file", "empty": tmp_path / "empty"}
    argv = [a.format(**paths) for a in argv] + ([] if "--out" in argv else ["--out", str(tmp_path / "out")])
    assert message in refused(capsys, lambda: report.main(argv))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["classic", "--steps", "0"], "--steps 0 is not allowed: it must be at least 1"),
        (["classic", "--seeds", "-1"], "--seeds -1 is not allowed"),
        (["classic", "--seeds", "1", "1"], "--seeds: 1 given twice"),
        (["classic", "classic"], "suites: classic given twice"),
        (["classic", "--envs", "CartPole-v1", "PongNoFrameskip-v4"], "--envs PongNoFrameskip-v4: not in classic, whose"),
        (["classic", "--", "--seed", "5"], "--seed after --: the suite sets it for each command; use --seeds"),
        (["classic", "--from", "10"], "--from 10 is not allowed: the suite has commands 1 to 9"),
        (["classic", "--run", "--steps", "100"], "ppo.py: --total-timesteps 100 is below one batch"),
        (["classic", "--run", "--", "--nope"], "ppo.py: Unrecognized options: --nope"),
        (["classic", "--run", "--", "--resume", "runs/x/checkpoint.pt"], "--resume continues one run"),
        (["mujoco", "--run", "--", "--gamma", "-2"], "ppo_continuous_action.py: --gamma -2.0 is not allowed"),
    ],
)
def test_suites_refuse_in_one_line_before_any_run(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert message in refused(capsys, lambda: suites.main(argv))
    assert list(tmp_path.iterdir()) == []  # no run was started


def test_suites_from_the_nth_command():
    lines = tool("benchmark/suites.py", "classic", "--from", "8").stdout.splitlines()
    assert lines == [f"python ppo.py --env-id MountainCar-v0 --seed {s} --total-timesteps 500000" for s in (2, 3)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_suites_pass_a_signal_on_to_the_run_and_say_how_to_go_on(tmp_path, signum):
    """The issue's case: SIGTERM (or SIGINT) to `suites.py --run` reaches the run, which writes its checkpoint and logs;
    the suite waits for it, then says in one line what stopped and how to go on, with 128 + the signal."""
    seed = 7790 + signum  # found again by pgrep: nothing may outlive the suite
    cmd = [sys.executable, str(ROOT / "benchmark/suites.py"), "classic", "--envs", "CartPole-v1", "--seeds", seed, 1]
    cmd += ["--steps", 200000, "--run", "--", "--torch-threads", 1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [str(c) for c in cmd], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.time() + 60
        while not list(tmp_path.glob("runs/*/events.out.tfevents.*")) and time.time() < deadline:
            time.sleep(0.3)
        time.sleep(1.5)  # a few iterations in
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 128 + signum, out + err
        (run,) = (tmp_path / "runs").iterdir()
        assert (run / "checkpoint.pt").is_file() and f"{signal.Signals(signum).name}: stopping after this iteration" in out
        line = one_line(err)
        assert line.startswith(f"suite stopped by {signal.Signals(signum).name} during [1/2] (the run exited {128 + signum})")
        assert f"--resume runs/{run.name}/checkpoint.pt" in line and "--from 2 -- --torch-threads 1" in line
        assert "[2/2]" not in out and not leftover(f"--seed {seed} ")
    finally:
        proc.kill()
        kill_leftovers(f"--seed {seed} ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tools"], "tools is a folder, not a variant script"),
        ([str(ROOT / "benchmark/report.py")], "report.py is not a variant script (e.g. ppo.py): it defines no Args"),
        (["--env-id", "Nope-v0", "ppo.py"], "ppo.py: Nope-v0: Environment `Nope` doesn't exist."),
        (["--script-args=--nope", "ppo.py"], "ppo.py: Unrecognized options: --nope"),
        (["--with-flags=--bf16x", "ppo.py"], "ppo.py: Unrecognized options: --bf16x"),
        (["--script-args='--seed", "ppo.py"], '--script-args "\'--seed": No closing quotation'),
        (["--train-steps", "1024", "ppo.py"], "ppo.py: 2 iteration(s) of 512 steps is too few to time after 5 warm-up"),
        (["--env-seconds", "inf", "ppo.py"], "--env-seconds above 0 (and finite)"),
        (["--script-args=--resume x.pt", "ppo.py"], "--resume continues one run"),
    ],
)
def test_speed_refuses_what_its_runs_would_refuse(capsys, argv, message):
    assert message in refused(capsys, lambda: speed.main(argv))


def test_speed_stops_its_measuring_run_on_sigterm(tmp_path):
    """The run it measures gets the signal too (speed.py and atari_speed.py share the code: tools/_common.py's Runs)."""
    marker = "--total-timesteps 200000 --seed 7801"  # in the measuring run's command line only
    argv = ["--repeats", "1", "--env-seconds", "0.2", "--train-steps", "200000", "--script-args=--seed 7801", "ppo.py"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmark/speed.py"), *argv], cwd=tmp_path, **pipes)
    try:
        deadline = time.time() + 90
        while not leftover(marker) and time.time() < deadline:  # its measuring run has started
            time.sleep(0.3)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 128 + signal.SIGTERM, out + err
        assert "stopped by SIGTERM: the run going was stopped" in one_line(err) and not leftover(marker)
    finally:
        proc.kill()
        kill_leftovers(marker)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--repeats", "0"], "--repeats is too small"),
        (["--env-warmup", "-1"], "--env-warmup is too small"),
        (["--timeout", "0"], "--timeout is too small"),
        (["--num-envs", "0"], "--num-envs is too small"),
        (["--torch-threads", "-1"], "ppo_atari.py: --torch-threads -1 is not allowed"),
        (["--env-id", "CartPole-v1"], "ppo_atari.py needs an Atari id"),
    ],
)
def test_atari_speed_refuses_in_one_line_before_measuring(capsys, argv, message):
    assert message in refused(capsys, lambda: atari_speed.main(argv))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope.py"], "no such script: nope.py"),
        (["tools"], "tools is a folder, not a variant script"),
        ([str(ROOT / "benchmark/speed.py")], "speed.py is not a variant script (e.g. ppo.py): it defines no Args"),
        (["ppo.py", "--nope"], "ppo.py: Unrecognized options: --nope"),
        (["ppo.py", "--total-timesteps", "1024", "--target-kl", "0.01"], "--target-kl can cut an update short"),
        (["ppo.py", "--total-timesteps", "1024", "--eval-checkpoint", "x.pt"], "--eval-checkpoint evaluates"),
    ],
)
def test_first_ratio_refuses_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert message in refused(capsys, lambda: first_ratio.main(argv))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nope"], "ppo.py: Unrecognized options: --nope"),
        (["--num-minibatches", "1", "--update-epochs", "1", "--total-timesteps", "512"], "one minibatch per update"),
        (["--resume", "x.pt"], "--resume continues one run"),
    ],
)
def test_kl_estimators_refuses_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert message in refused(capsys, lambda: kl_estimators.main(argv))
    assert list(tmp_path.iterdir()) == []


def test_bf16_gradients_compares_bf16_with_fp32_on_the_same_minibatch_and_with_the_next_one():
    tiny = ["--", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--torch-threads", "1"]
    res = tool("benchmark/bf16_gradients.py", "ppo_atari_envpool.py", *tiny, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [line.split("|")[2:-1] for line in res.stdout.splitlines() if line.startswith(("| 1 ", "| 2 "))]
    (cos, err, cnn_cos, cnn_err, next_cos, next_diff, _, _, alike), _ = [[float(x) for x in r] for r in rows]
    assert 0.99 < cos <= 1 and 0.99 < cnn_cos <= 1  # bf16 rounds the CNN: close to float32's gradient, not equal to it
    assert 0 < err < 0.2 and 0 < cnn_err < 0.3
    assert next_cos < 0.99 and next_diff > err  # another minibatch's gradient: farther away than bf16's rounding
    assert -1 <= alike <= 1
    (whole,) = [line for line in res.stdout.splitlines() if line.startswith("the whole batch")]
    assert 0.99 < float(re.search(r"cosine ([0-9.]+)", whole).group(1)) <= 1
    m = load_script("ppo_atari_envpool.py")
    args = m.Args(num_envs=2, num_steps=32, num_minibatches=2)
    envs = m.make_envs(args, "t")
    try:
        agent = m.Agent(envs, False)
        batch = bf16_gradients.rollout(m, args, agent, envs)
    finally:
        envs.close()
    inds = torch.arange(32)
    g32, t32 = bf16_gradients.gradient(m, args, agent, batch, inds, bf16=False)
    g16, _ = bf16_gradients.gradient(m, args, agent, batch, inds, bf16=True)
    assert torch.equal(g32, bf16_gradients.gradient(m, args, agent, batch, inds, bf16=False)[0])  # the same pass: same bits
    assert not torch.equal(g16, g32)
    assert g32.numel() == sum(p.numel() for p in agent.parameters())
    assert torch.equal(t32, g32[: sum(p.numel() for p in agent.network.parameters())])
    agent.bf16 = False
    _, newlogprob, entropy, newvalue = agent.get_action_and_value(batch[0][inds], batch[1][inds])
    loss = m.ppo_loss(
        newlogprob,
        entropy,
        newvalue,
        newlogprob.detach(),
        batch[2][inds],
        batch[3][inds],
        newvalue.detach().view(-1),
        args,
        args.clip_coef,
    )[0]
    agent.zero_grad()
    loss.backward()  # the gradient the update's first minibatch would take
    assert torch.allclose(g32, torch.cat([p.grad.reshape(-1) for p in agent.parameters()]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ppo_atari_lstm.py"], "ppo_atari_lstm.py has no feed-forward CNN agent: give ppo_atari.py"),
        (["ppo.py"], "ppo.py has no feed-forward CNN agent"),
        (["nothing.py"], "no such script: nothing.py"),
        (["ppo_atari.py", "--", "--num-envs", "0"], "--num-envs 0 is not allowed"),
        (["ppo_atari.py", "--checkpoint", "none.pt"], "cannot load the checkpoint none.pt"),
        (["ppo_atari.py", "--", "--num-minibatches", "1"], "--num-minibatches 1: two minibatches at least"),
    ],
)
def test_bf16_gradients_refuses_in_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert message in refused(capsys, lambda: bf16_gradients.main(argv))
    assert list(tmp_path.iterdir()) == []


def test_kl_estimators_help_prints_its_own_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    kl_estimators.main(["--help"])
    assert "The KL estimators on real updates" in capsys.readouterr().out and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--env-ids", "CartPole-v1", "--seeds", "-1"], "--seed -1 is not allowed"),
        (
            ["--env-ids", "CartPole-v1", "Pendulum-v1", "--seeds", "1"],
            "--env-ids Pendulum-v1: this script takes Discrete actions",
        ),
    ],
)
def test_shared_gradients_refuses_before_its_table(capsys, argv, message):
    try:
        shared_gradients.main(argv)
    except SystemExit as e:
        code = e.code
    assert message in one_line(str(code)) and capsys.readouterr().out == ""  # no table begun


@pytest.mark.parametrize("root", ["a_file", "nowhere", "empty"])
def test_details_and_lineage_refuse_a_root_without_scripts(tmp_path, root):
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    for argv in (["tools/details.py"], ["tools/details.py", "--check"], ["tools/lineage.py", "--check-shared"]):
        res = tool(*argv, "--root", tmp_path / root)
        assert res.returncode == 2 and res.stdout == "", (argv, res.stdout)  # a check over nothing does not say "ok"
        expected = {"a_file": "is a file, not a folder", "nowhere": "no such folder", "empty": "no variant script"}
        assert expected[root] in one_line(res.stderr)


def test_lineage_without_a_pair_to_compare_and_an_output_that_is_a_file(tmp_path):
    shutil.copy(ROOT / "ppo.py", tmp_path / "ppo.py")
    for argv in ([], ["--html", "--out", tmp_path / "html"]):
        res = tool("tools/lineage.py", *argv, "--root", tmp_path)
        assert res.returncode == 2 and "no child script beside its parent" in one_line(res.stderr), res.stdout
    shutil.copy(ROOT / "ppo.py", tmp_path / "ppo_shared.py")
    (tmp_path / "taken").write_text("a file")
    res = tool("tools/lineage.py", "--html", "--out", tmp_path / "taken", "--root", tmp_path)
    assert res.returncode == 2 and "is a file, not a folder" in one_line(res.stderr)


def test_details_writes_details_md_whole_or_says_why_not(repo):
    (repo / "DETAILS.md").mkdir()  # the name is taken
    res = tool("tools/details.py", "--root", repo)
    assert res.returncode == 1 and "cannot write" in one_line(res.stderr) and "DETAILS.md" in res.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["DETAILS.md", *BASE_SCRIPTS]  # no temporary file left


@pytest.mark.parametrize(
    "gif_name, message",
    [("out.png", "does not end in .gif"), ("folder.gif", "is a folder"), ("no/out.gif", "is not a folder")],
)
def test_gif_refuses_an_output_it_cannot_write_before_decoding(tmp_path, gif_name, message):
    (tmp_path / "folder.gif").mkdir()
    (tmp_path / "video.mp4").write_text("not decoded: refused before")
    res = tool("tools/gif.py", tmp_path / "video.mp4", tmp_path / gif_name)
    assert res.returncode == 1 and message in one_line(res.stderr)


def test_a_benchmark_shell_script_passes_sigterm_on_and_waits(tmp_path):
    """bash alone exits on SIGTERM and leaves its command running: atari_lstm.sh passes it on to suites.py, which
    passes it on to the run (a checkpoint written), and stops with 128 + SIGTERM without its report."""
    cmd = ["bash", str(ROOT / "benchmark/atari_lstm.sh"), "--run", "--seeds", "7812", "--envs", "PongNoFrameskip-v4"]
    cmd += ["--steps", "100000", "--", *"--num-envs 2 --num-steps 32 --num-minibatches 2 --torch-threads 1".split()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # this python for `python`
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 90
        while not list(tmp_path.glob("runs/*/events.out.tfevents.*")) and time.time() < deadline:
            time.sleep(0.3)
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)  # to bash only
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 128 + signal.SIGTERM, out + err
        assert list(tmp_path.glob("runs/*/checkpoint.pt")) and "suite stopped by SIGTERM during [1/1]" in err
        assert not (tmp_path / "report").exists() and not leftover("--seed 7812 ")
    finally:
        proc.kill()
        kill_leftovers("--seed 7812 ")


@pytest.mark.parametrize(
    "argv, said",
    [
        (["ppo.py"], "is not one of the Atari scripts"),
        (["ppo_atari_envpool.py", "--iterations", "0"], "measure at least 1"),
        (["ppo_atari_envpool.py", "--against", "no-such-revision"], "no ppo_atari_envpool.py at that revision"),
    ],
)
def test_step_profile_refuses_in_one_line_before_running(argv, said):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmark" / "step_profile.py"), *argv], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_step_profile_accounts_for_every_piece_of_a_tiny_run(tmp_path):
    """The pieces of a profiled run are all there, none negative (the timers neither miss a phase nor count one twice)."""
    spec = importlib.util.spec_from_file_location("step_profile", ROOT / "benchmark" / "step_profile.py")
    step_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_profile)
    flags = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
    timers, args, alone = step_profile.profile(ROOT / "ppo_atari_envpool.py", flags, iterations=2, warmup=1)
    rows = dict(step_profile.table(timers, 2 * args.num_envs * args.num_steps))
    assert args.num_envs == 2 and alone > 0
    assert len(rows) == 8 and all(v >= 0 for k, v in rows.items() if not k.startswith("between")), rows
    assert rows["game"] > 0 and rows["rollout forward"] > 0 and rows["update backward + Adam"] > 0, rows


def test_step_profile_emulate_bf16_runs_bf16_where_the_cpu_check_finds_no_bf16(tmp_path):
    """--emulate-bf16: the profiled script's --bf16 runs even where the CPU has no bfloat16 (simulated here: the script
    told so); without the option the same run is refused."""
    spec = importlib.util.spec_from_file_location("step_profile", ROOT / "benchmark" / "step_profile.py")
    step_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_profile)
    script = tmp_path / "ppo_atari_envpool.py"
    source = (ROOT / "ppo_atari_envpool.py").read_text()
    script.write_text(source.replace("torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()", "False"))
    flags = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1", "--bf16"]
    with pytest.raises(SystemExit) as refused:
        step_profile.profile(script, flags, iterations=1, warmup=1)
    assert "--bf16 needs native bfloat16" in str(refused.value.code)
    timers, args, alone = step_profile.profile(script, flags, iterations=1, warmup=1, emulate_bf16=True)
    rows = dict(step_profile.table(timers, args.num_envs * args.num_steps))
    assert args.bf16 and alone > 0 and rows["update backward + Adam"] > 0, rows

"""Each script reads as the algorithm first: the PPO pieces and train() above one fence line, the plumbing below it.

The order, the fence and where the rollout loop starts are checked here; that the fenced section is the same in every
script (apart from each script's OWN_PLUMBING) is tools/lineage.py --check-shared (tests/test_tools.py)."""

import ast
import re

import pytest
from conftest import ROOT

SCRIPTS = sorted(p.name for p in ROOT.glob("ppo*.py"))
LOOP = "for step in range(args.num_steps)"
# the line the rollout loop may start at, at most (issue 22: ppo.py 300, ppo_atari.py ~420, ppo_atari_lstm.py ~470, the
# others in proportion, about 0.6 of where it started before, 2b9b42a; the Atari scripts +5 to +10 since, for details
# added above the fence later: ppo2's game length per game, --bf16 and its scaling in bfloat16, the wandb flags, the
# frames laid out once for --channels-last; +12 for the frames stored NHWC and --bf16's rollout copy, issue 26)
LOOP_AT_MOST = {
    "ppo.py": 300,
    "ppo_shared.py": 300,
    "ppo_atari.py": 441,
    "ppo_atari_lstm.py": 494,
    "ppo_atari_envpool.py": 451,
    "ppo_atari_multigpu.py": 465,  # 779 before: 0.58 of it, as ppo_atari.py's 420 of 724
    "ppo_continuous_action.py": 400,
    "ppo_multidiscrete.py": 380,
    "ppo_multidiscrete_mask.py": 395,
}
# in this order above the fence (a script may have more between them), and below it
ABOVE = ["Args", "make_envs", "layer_init", "Agent", "compute_gae", "ppo_loss", "make_optimizer", "gradient_step", "train"]
BELOW = [
    "check_args",
    "check_env",
    "save_checkpoint",
    "load_checkpoint",
    "resume_args",
    "StopRequest",
    "evaluate",
    "Run",
    "main",
]


def layout(script):
    text = (ROOT / script).read_text(encoding="utf-8")
    lines = text.splitlines()
    fences = [i + 1 for i, line in enumerate(lines) if line.startswith("# ====")]
    tree = ast.parse(text)
    names = {n.name: n.lineno for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    return text, lines, fences, tree, names


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_algorithm_comes_first_then_one_fence_then_the_plumbing(script):
    text, lines, fences, tree, names = layout(script)
    assert len(fences) == 1, f"{script}: fence lines at {fences}"
    fence = fences[0]
    assert "plumbing, not PPO" in lines[fence - 1]
    above = [names[n] for n in ABOVE]
    assert above == sorted(above) and above[-1] < fence, f"{script}: {dict(zip(ABOVE, above))}, fence at {fence}"
    below = [names[n] for n in BELOW]
    assert below[0] > fence and below[-1] == max(names.values()), f"{script}: {dict(zip(BELOW, below))}"
    last = tree.body[-1]  # if __name__ == "__main__": main()
    assert isinstance(last, ast.If) and ast.unparse(last) == "if __name__ == '__main__':\n    main()"
    assert lines[0].startswith("# ") and "arent" in lines[0]  # the header: what the script adds, and its parent


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_rollout_loop_starts_early(script):
    lines = (ROOT / script).read_text(encoding="utf-8").splitlines()
    (at,) = [i + 1 for i, line in enumerate(lines) if LOOP in line]
    assert at <= LOOP_AT_MOST[script], f"{script}: the rollout loop starts at line {at}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_train_calls_the_plumbing_in_about_ten_one_line_calls(script):
    text, lines, fences, tree, names = layout(script)
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    calls = sorted({n.lineno for n in ast.walk(train) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "run"})
    assert 5 <= len(calls) <= 11, f"{script}: run.* on lines {calls}"
    for line in calls:  # each a single line, with a few words saying what it does where it is not obvious
        assert "run." in lines[line - 1]
    # the plumbing is no longer inline: no try/except, signal, checkpoint or RNG snapshot in the loop
    source = ast.get_source_segment(text, train)
    assert not any(isinstance(n, ast.Try) for n in ast.walk(train))
    for word in ("sys.exit", "signal.", "torch.save", "torch.load", "rng_states", "tempfile", "SummaryWriter("):
        assert word not in source, f"{script}: {word} in train()"


@pytest.mark.parametrize("script", SCRIPTS)
def test_own_plumbing_is_declared_right_below_the_fence(script):
    text, lines, fences, tree, names = layout(script)
    fence = fences[0]
    own = next(n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "OWN_PLUMBING")
    assert own.lineno - fence <= 3
    assert {"check_args", "check_env", "evaluate"} <= set(ast.literal_eval(own.value))
    # the flag domains, checks and checkpoints are below the fence, none of them above it
    for name in ("FLAG_DOMAINS", "RESUME_MAY_CHANGE"):
        (at,) = {n.lineno for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name}
        assert at > fence, f"{script}: {name} above the fence"
    assert re.search(r"^def (rng_states|set_rng_states|load_checkpoint)\(", "\n".join(lines[:fence]), re.M) is None

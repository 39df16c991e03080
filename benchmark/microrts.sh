#!/usr/bin/env bash
# Invalid action masking on MicroRTS: ppo_multidiscrete.py (unmasked) and ppo_multidiscrete_mask.py (aux-4) on the same
# scenario, steps and seeds, one run after the other, then the curves (mean return against steps) and a table.
#
#     bash benchmark/microrts.sh                                   # 2M steps, seeds 1 2 3 (the blog's budget)
#     STEPS=500000 SEEDS=1 bash benchmark/microrts.sh              # one seed each, 500k steps
#     ENV_ID=MicrortsMining-v1 OUT=report-mining bash benchmark/microrts.sh
#
# Needs gym-microrts (bash tools/install_microrts.sh). Runs write runs/ in the current directory; the report goes to
# $OUT (default report-microrts/). OMP_NUM_THREADS=1 by default: the network is small, one thread is faster on a CPU.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/benchmark/forward.sh" # SIGTERM / Ctrl-C go on to the command running, which stops cleanly
ENV_ID="${ENV_ID:-MicrortsProduceCombatUnitsShapedReward-v1}"
STEPS="${STEPS:-2000000}"
SEEDS="${SEEDS:-1 2 3}"
OUT="${OUT:-report-microrts}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# shellcheck disable=SC2086  # SEEDS is a list
forward python "$ROOT/benchmark/suites.py" microrts --envs "$ENV_ID" --seeds $SEEDS --steps "$STEPS" --run -- "$@"
python "$ROOT/benchmark/report.py" runs/ --out "$OUT"

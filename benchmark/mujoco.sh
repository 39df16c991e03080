#!/usr/bin/env bash
# MuJoCo benchmark of ppo_continuous_action.py: long runs, one after the other, for a machine that can afford them.
#
#   bash benchmark/mujoco.sh table       # HalfCheetah-v4, Hopper-v4, Walker2d-v4: 1M steps, seeds 1-3 (the published table)
#   bash benchmark/mujoco.sh bootstrap   # --bootstrap-truncated off vs on: Pendulum-v1 (500k) and HalfCheetah-v4 (1M), seeds 1-3
#   bash benchmark/mujoco.sh all         # both (the HalfCheetah-v4 table runs double as the "off" side)
#
# DRY_RUN=1 prints the commands without running them; SEEDS="1" runs fewer seeds; extra arguments after the mode
# are appended to every command (e.g. -- --no-cuda). Runs land in runs/ of the repository root; then
#   python benchmark/report.py runs/ --out report/
# gives mean ± std over seeds of each seed's last-100-episode return next to the published numbers
# (ppo2 on v2: HalfCheetah 1428.55 ± 62.40, Hopper 2158.65 ± 302.33, Walker2d 3356.49 ± 322.61), with the
# bootstrap runs grouped apart by their exp name (ppo_continuous_action_bootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmark/forward.sh # SIGTERM / Ctrl-C go on to the command running, which stops cleanly

mode=${1:-}
shift || true
[ "${1:-}" = "--" ] && shift
SEEDS=${SEEDS:-"1 2 3"}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # 64-unit networks: one thread is faster, and fair to other jobs

run() {
  echo "+ $*"
  if [ -z "${DRY_RUN:-}" ]; then forward "$@"; fi
}

table() {
  for env in HalfCheetah-v4 Hopper-v4 Walker2d-v4; do
    for seed in $SEEDS; do
      run python ppo_continuous_action.py --env-id "$env" --seed "$seed" --total-timesteps 1000000 --save-model "$@"
    done
  done
}

bootstrap() { # $1: "with-off" also runs the HalfCheetah-v4 runs without the flag (skipped when the table has them)
  local off=$1
  shift
  for spec in Pendulum-v1:500000 HalfCheetah-v4:1000000; do
    env=${spec%%:*} steps=${spec##*:}
    for seed in $SEEDS; do
      if [ "$env" = Pendulum-v1 ] || [ "$off" = with-off ]; then
        run python ppo_continuous_action.py --env-id "$env" --seed "$seed" --total-timesteps "$steps" --save-model "$@"
      fi
      run python ppo_continuous_action.py --env-id "$env" --seed "$seed" --total-timesteps "$steps" --save-model \
        --bootstrap-truncated --exp-name ppo_continuous_action_bootstrap "$@"
    done
  done
}

case "$mode" in
table) table "$@" ;;
bootstrap) bootstrap with-off "$@" ;;
all)
  table "$@"
  bootstrap without-off "$@"
  ;;
*)
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
echo "done; summary: python benchmark/report.py runs/ --out report/"

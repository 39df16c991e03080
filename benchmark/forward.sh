# Sourced by the benchmark scripts that run long commands: `forward CMD...` runs CMD so that a SIGTERM or SIGINT to the
# script goes on to it, once (it stops cleanly: a run writes its checkpoint, suites.py says how to go on), and waits
# for it; the script then stops with CMD's status (set -e). Bash alone would exit at once and leave CMD running.
set -m # each command in a process group of its own: a Ctrl-C at the terminal reaches it through the trap, once
child=
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null || true' TERM
trap '[ -n "$child" ] && kill -INT "$child" 2>/dev/null || true' INT
forward() {
  "$@" &
  child=$!
  local status=0
  wait "$child" || status=$?
  while kill -0 "$child" 2>/dev/null; do # a trapped signal ended the wait, not the command: wait on
    status=0
    wait "$child" || status=$?
  done
  child=
  return "$status"
}

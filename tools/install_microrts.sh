#!/usr/bin/env bash
# Install MicroRTS for ppo_multidiscrete.py and ppo_multidiscrete_mask.py: gym-microrts 0.6.0 and JPype1 from
# requirements-microrts.txt, and a Java runtime with apt only where no `java` is found.
# gym-microrts 0.6.0 declares Python<3.10 and gym 0.21, but its code needs only `gym.spaces` (the scripts alias gym to
# gymnasium), hence --no-deps --ignore-requires-python.
#
#     bash tools/install_microrts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --no-deps --ignore-requires-python -r requirements-microrts.txt
if ! command -v java >/dev/null 2>&1; then
    echo "no java found: installing openjdk-17-jre-headless with apt-get"
    SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo "sudo")
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends openjdk-17-jre-headless
fi
java -version 2>&1 | head -1
python -c "import jpype; print('JVM:', jpype.getDefaultJVMPath())"

#!/usr/bin/env bash
# make demo: from a fresh Debian machine (as root), install what is needed,
# start a throwaway one-node Slurm with grace-policy, show what users see, and
# stop it again. Nothing is left running; nothing outside a temp dir changes
# except the Debian packages install-deps.sh adds.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: run as root (it starts munged, slurmctld and slurmd)" >&2
  exit 1
fi
bash packaging/install-deps.sh
exec "${PYTHON:-python3}" -m tests.slurm.demo "$@"

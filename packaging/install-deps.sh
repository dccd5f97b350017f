#!/usr/bin/env bash
# Installs what the tests, the demo and the plugin build need on a fresh Debian
# machine. Idempotent and quiet when everything is already there.
set -euo pipefail
need_apt=()
for pkg in slurmd slurmctld slurm-client libslurm-dev munge gcc-aarch64-linux-gnu \
           libc6-dev-arm64-cross qemu-user python3-dev python3-pip python3-venv \
           fakeroot patchelf dpkg-dev make bzip2 binutils-aarch64-linux-gnu; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: run as root (or install: ${need_apt[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
"$PY" - <<'PYEOF' || "$PY" -m pip install -q pyelftools pydantic structlog cffi pytest pytest-cov hypothesis ruff
import importlib.util, sys
mods = ["elftools", "pydantic", "structlog", "cffi", "pytest", "pytest_cov", "hypothesis", "ruff"]
sys.exit(0 if all(importlib.util.find_spec(m) for m in mods) else 1)
PYEOF

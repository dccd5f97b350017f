#!/usr/bin/env bash
# Installs what the tests, the demo and the plugin build need on a fresh Debian
# machine. Idempotent and quiet when everything is already there.
# mmdebstrap: the release matrix's Debian roots (tests/slurm/roots.py);
# debhelper, dpkg-dev, rpm: make deb / make rpm and their tests.
# Container steps (tests/slurm/containers.py builds pyxis and enroot from
# ../shared/third_party/): squashfs-tools parallel gawk makeself libmd-dev
# libbsd-dev jq zstd curl libcap2-bin for enroot, runc for --container.
# squashfs-tools: container images the tests make (mksquashfs) and the
# squashfs reader's oracle (unsquashfs); util-linux: unshare for SIF builds
# and for slurmd's own mount namespace (tests/slurm/test_gpu_cache.py; mount, too).
# liblzo2-2, libzstd1 (squashfs-tools' own deps, named because the image
# reader's native decoders are tested against them: grace_policy/image/native.py).
# libfuse2 + fusepy (pinned): the hung FUSE mount of tests/slurm/test_hungfs.py.
# iproute2: the two-architecture cluster's network namespace and tap (ip).
# mount (mount/umount), util-linux (unshare): the job-container tests' namespace
# holders and their clean-up (tests/slurm/test_job_container.py, tests/test_mntns.py);
# job_container/tmpfs itself is in slurm-wlm-basic-plugins (a slurmd dependency).
# g++-aarch64-linux-gnu: the CUDA fixtures' aarch64 builds (nvcc -ccbin
# aarch64-linux-gnu-g++, tests/gpu/fixtures.py; nvcc itself comes from PyPI
# wheels the tests fetch, pinned, into the test cache).
# linux-libc-dev, linux-libc-dev-arm64-cross: both architectures' asm/unistd.h,
# which tests/test_confine.py holds the system call filter's numbers to.
# python3-pytest: make bench runs under the embedded /usr/bin/python3, and its
# container figures build images with the tests' helpers (tests/corpus.py).
# ipxe-qemu: qemu-system-aarch64's virtio-net option ROM (efi-virtio.rom) for
# the two-architecture cluster's NIC; apt pulls it in only as a Recommends,
# which images that install without Recommends leave out.
set -euo pipefail
need_apt=()
all_pkgs=(slurmd slurmctld slurm-client libslurm-dev munge gcc-aarch64-linux-gnu
          libc6-dev-arm64-cross qemu-user python3-dev python3-pip python3-venv
          fakeroot patchelf dpkg-dev make bzip2 binutils-aarch64-linux-gnu
          mmdebstrap debhelper rpm util-linux mount
          qemu-system-arm flex bison bc cpio xz-utils libssl-dev libelf-dev
          squashfs-tools parallel gawk makeself libmd-dev libbsd-dev jq zstd curl
          libcap2-bin runc libfuse2 liblzo2-2 libzstd1 iproute2 python3-pytest ipxe-qemu
          debian-archive-keyring g++-aarch64-linux-gnu linux-libc-dev
          linux-libc-dev-arm64-cross)
# Registry images (issue 25): Debian's registry 2.8.2, skopeo to push, umoci;
# python3-bcrypt writes the test registry's htpasswd where Python has no crypt.
all_pkgs+=(docker-registry skopeo umoci python3-bcrypt)
# --packaging deb|rpm: only what make deb / make rpm need (no test tools).
if [ "${1:-}" = --packaging ]; then
  all_pkgs=(libslurm-dev python3-dev python3-pip build-essential debhelper dpkg-dev)
  [ "${2:-}" = rpm ] && all_pkgs+=(rpm)
fi
# The files the tests and demos open or run, by the package that ships them: a
# package dpkg calls installed can still lack one (a Recommends left out, a
# path removed by hand, a slimmed image), and the failure then comes much
# later ("failed to find romfile", "No such file"). Such a package is
# reinstalled.
need_files=(
  /usr/sbin/slurmd-wlm:slurmd /usr/sbin/slurmstepd-wlm:slurmd /usr/sbin/slurmctld-wlm:slurmctld
  /usr/bin/srun:slurm-client /usr/include/slurm/spank.h:libslurm-dev /usr/sbin/munged:munge
  /usr/bin/aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu
  /usr/bin/aarch64-linux-gnu-g++:g++-aarch64-linux-gnu
  /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1:libc6-arm64-cross
  /usr/aarch64-linux-gnu/lib/libc.so:libc6-dev-arm64-cross
  /usr/include/x86_64-linux-gnu/asm/unistd_64.h:linux-libc-dev
  /usr/aarch64-linux-gnu/include/asm/unistd.h:linux-libc-dev-arm64-cross
  /usr/bin/qemu-aarch64:qemu-user /usr/bin/qemu-system-aarch64:qemu-system-arm
  /usr/lib/ipxe/qemu/efi-virtio.rom:ipxe-qemu
  /usr/bin/mksquashfs:squashfs-tools /usr/bin/unsquashfs:squashfs-tools
  /usr/share/makeself/makeself-header.sh:makeself /usr/bin/mmdebstrap:mmdebstrap
  /usr/share/keyrings/debian-archive-keyring.gpg:debian-archive-keyring
  /usr/sbin/runc:runc /usr/bin/jq:jq /usr/bin/zstd:zstd /usr/bin/curl:curl /bin/ip:iproute2
  /usr/bin/patchelf:patchelf /usr/bin/fakeroot:fakeroot /usr/bin/python3-config:python3-dev
  /bin/mount:mount /bin/umount:mount /usr/bin/unshare:util-linux
  /usr/lib/x86_64-linux-gnu/slurm-wlm/job_container_tmpfs.so:slurm-wlm-basic-plugins
)
[ "${1:-}" = --packaging ] || need_files+=(/usr/bin/docker-registry:docker-registry
  /usr/bin/skopeo:skopeo /usr/bin/umoci:umoci)
reinstall=()
for pkg in "${all_pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ "${1:-}" != --packaging ]; then
  for entry in "${need_files[@]}"; do
    file=${entry%%:*} pkg=${entry##*:}
    [ -e "$file" ] && continue
    if dpkg -s "$pkg" >/dev/null 2>&1; then
      echo "install-deps: $file is missing though $pkg is installed: reinstalling $pkg" >&2
      reinstall+=("$pkg")
    else
      need_apt+=("$pkg")
    fi
  done
fi
if [ ${#need_apt[@]} -gt 0 ] || [ ${#reinstall[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: run as root (or install: ${need_apt[*]})" >&2
    exit 1
  fi
  apt-get update -qq
  if [ ${#need_apt[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      "${need_apt[@]}" >/dev/null
  fi
  if [ ${#reinstall[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --reinstall "${reinstall[@]}" >/dev/null
  fi
  for entry in "${need_files[@]}"; do
    [ -e "${entry%%:*}" ] || { echo "install-deps: ${entry%%:*} still missing after installing ${entry##*:}" >&2; exit 1; }
  done
fi
[ "${1:-}" = --packaging ] && exit 0
PY=${PYTHON:-python3}
"$PY" - <<'PYEOF' || "$PY" -m pip install -q pyelftools pydantic structlog cffi pytest pytest-cov hypothesis ruff==0.17.6 \
    tree-sitter==0.26.1 tree-sitter-bash==0.25.1
import importlib.util, sys
mods = ["elftools", "pydantic", "structlog", "cffi", "pytest", "pytest_cov", "hypothesis", "ruff",
        "tree_sitter", "tree_sitter_bash"]
sys.exit(0 if all(importlib.util.find_spec(m) for m in mods) else 1)
PYEOF
# The hung-mount tests' FUSE daemon (tests/slurm/hungfs.py): fusepy, pinned.
"$PY" -c 'import importlib.metadata as m, sys; sys.exit(m.version("fusepy") != "3.0.1")' \
  2>/dev/null || "$PY" -m pip install -q "fusepy==3.0.1"

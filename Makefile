# grace-policy: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
# The interpreter embedded in slurmstepd: the distribution's, readable by every user.
PLUGIN_PYTHON ?= /usr/bin/python3
PREFIX ?= /usr/local
DESTDIR ?=
BUILD ?= build

.PHONY: all deps test test-fast lint verify-loader verify-pages verify-gpu demo-node demo-cluster plugin plugin-testhooks install demo bench fuzz clean

all: plugin

deps:
	bash packaging/install-deps.sh

# The suite as independent parts side by side (tests/parts.py: what each
# part holds, GRACE_TEST_JOBS, GRACE_TEST_PARTS); prints the time per part.
# The plugin is built once before the parts start: each part's clusters run
# `make install` from this tree, and parts that built build/ side by side in
# a fresh clone copied a half-linked grace_policy_py.so ("file too short").
test: deps
	$(MAKE) plugin
	$(PYTHON) -m ruff check grace_policy tests spank bench
	$(PYTHON) tests/parts.py

test-fast:
	$(PYTHON) -m pytest -q -m "not slurm" tests

lint:
	$(PYTHON) -m ruff check grace_policy tests spank bench

verify-loader:
	GRACE_VERIFY_FULL=1 $(PYTHON) -m pytest -q tests/test_loader_oracle.py

# The page rules against real 64 KiB and 16 KiB arm64 kernels under qemu, with
# glibc 2.31 and 2.36, on every page fixture and every aarch64 corpus file
# (make test runs a sample). Builds and caches the 64 KiB kernel on first use.
verify-pages: deps
	GRACE_VERIFY_FULL=1 $(PYTHON) -m pytest -q tests/test_page_oracle.py

# The CUDA rules on a real GPU (issue 26): NVML held to nvidia-smi, then each
# nvcc-built fixture run on each kind of GPU and the driver's outcome (kernel
# ran / no kernel image / JIT / PTX too new) held to the prediction. Without a
# GPU it prints that it was not run and why, and exits 0 (not part of make test).
verify-gpu: deps
	$(PYTHON) tests/gpu/verify_gpu.py

# The plugin on a real 64 KiB aarch64 node: Slurm inside the qemu guest, the
# plugin cross-built for aarch64, what users see (first run: kernel build).
demo-node: deps
	$(PYTHON) tests/vm/demo_node.py

# The two-architecture cluster: slurmctld, munge and the login node on this
# x86_64 machine (in a network namespace of its own), slurmd with the aarch64
# plugin on the 64 KiB guest, the home over 9p; the seeds' scenarios
# submitted as a user, with the login node's prediction beside each decision.
demo-cluster: deps
	$(PYTHON) tests/vm/demo_cluster.py

# Long fuzz of the ELF reader and the image readers (squashfs, LZO)
# (hypothesis; ELF failures are kept in its database under
# ~/.cache/grace-policy-tests/hypothesis and replayed on the next run).
fuzz:
	GRACE_FUZZ_EXAMPLES=$${GRACE_FUZZ_EXAMPLES:-50000} $(PYTHON) -m pytest -q -p no:cacheprovider tests/test_elf_fuzz.py \
	    tests/test_hostile.py tests/image/test_image_fuzz.py -k "fuzz"

clean:
	rm -rf $(BUILD) .pytest_cache .coverage

# Step-launch overhead with and without the plugin (issue 4): prints the table
# and writes docs/PERFORMANCE.md. Starts the tests' local Slurm when it can.
bench: plugin
	$(PLUGIN_PYTHON) -m bench

# plugin, install, demo: the SPANK plugin (owned with spank/ and tests/slurm/).
include packaging/plugin.mk

# deb, rpm: packages pinned to the Slurm release they are built against (issue 9).
include packaging/packages.mk

# The SPANK plugin: build, install. Included from the top-level Makefile,
# which defines PLUGIN_PYTHON (the interpreter embedded in slurmstepd: the
# distribution's /usr/bin/python3, readable by every user), PREFIX, DESTDIR
# and BUILD.

# Two libraries: the stub Slurm loads everywhere (srun, sbatch, salloc,
# slurmstepd), with no libpython in its DT_NEEDED, and the Python part it
# dlopen()s in slurmstepd only on a verdict-cache miss.
PLUGIN_SO := $(BUILD)/spank_grace_policy.so
PLUGIN_PY_SO := $(BUILD)/grace_policy_py.so
PYDEPS := $(BUILD)/pydeps
PLUGIN_REQS := packaging/plugin-requirements.txt
SPANK_C := spank/grace_spank.c spank/grace_stepd.c spank/grace_helper.c spank/grace_cache.c \
		spank/grace_container.c spank/grace_node.c spank/grace_wire.c spank/grace_contract.c \
		spank/grace_afterpull.c
# The C <-> Python contract (grace_policy/contract.py), as C sees it: written
# before any C file is compiled, and again whenever the table changes.
CONTRACT_H := $(BUILD)/grace_contract.h
SPANK_H := spank/grace.h spank/grace_wire.h $(CONTRACT_H)
CFFI_C := $(BUILD)/spank_grace_policy_cffi.c
# Names the per-user cache file (DIR/<uid>.v<version>): entries of another
# version are never read.
GRACE_VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' grace_policy/__init__.py)

# Facts about PLUGIN_PYTHON, asked once per make run.
PLUGIN_PY_INCLUDE = $(shell $(PLUGIN_PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
# The node checker (grace_node.c) execs this interpreter: the one embedded.
PLUGIN_PY_EXE = $(shell $(PLUGIN_PYTHON) -c 'import sys; print(sys.executable)')
PLUGIN_PY_LIB = $(shell $(PLUGIN_PYTHON) -c 'import sysconfig as s; print(s.get_config_var("LIBDIR") + "/" + s.get_config_var("INSTSONAME"))')

PLUGIN_CFLAGS ?= -O2 -g
PLUGIN_CFLAGS += -std=gnu11 -fPIC -Wall -Wextra -D_FORTIFY_SOURCE=2 -fstack-protector-strong
PLUGIN_LDFLAGS := -shared -Wl,-z,now -Wl,-z,relro -Wl,-z,nodelete -Wl,--no-undefined-version

# Where the plugin goes (Slurm's PluginDir or any absolute path plugstack.conf
# names) and, beside it, GP_DIR: the C code finds its Python part at
# <plugin dir>/../grace-policy, so the two move together. Packages set
# SLURM_PLUGINDIR to the distribution's PluginDir (Debian:
# /usr/lib/<multiarch>/slurm-wlm, RHEL: /usr/lib64/slurm).
SLURM_PLUGINDIR ?= $(PREFIX)/lib/slurm
GP_DIR = $(patsubst %/,%,$(dir $(SLURM_PLUGINDIR)))/grace-policy
GP_LIBDIR = $(DESTDIR)$(GP_DIR)/python
GP_SHARE = $(DESTDIR)$(PREFIX)/share/grace-policy
# The config cli_filter.lua hands to 'grace-policy submit' (plugstack's config=).
GP_CONFIG ?= /etc/slurm/grace-policy.toml

# cffi (for the generator and, at run time, its _cffi_backend) and the core's
# dependencies, for PLUGIN_PYTHON, in a directory of our own: never in the
# system site-packages (Debian's python is externally managed).
$(PYDEPS)/.stamp: $(PLUGIN_REQS)
	rm -rf $(PYDEPS)
	$(PLUGIN_PYTHON) -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
		--target $(PYDEPS) -r $(PLUGIN_REQS)
	touch $@

# Any interpreter that runs this repository's Python will do (the table
# imports nothing); PLUGIN_PYTHON is the one the build already needs.
$(CONTRACT_H): grace_policy/contract.py spank/gen_contract.py grace_policy/slurm_bridge.py
	$(PLUGIN_PYTHON) -s spank/gen_contract.py $@

$(CFFI_C) $(BUILD)/grace_build.h: spank/build_plugin.py spank/gen_contract.py spank/grace_python.c \
		$(SPANK_H) $(PYDEPS)/.stamp
	PYTHONPATH=$(PYDEPS) $(PLUGIN_PYTHON) -s spank/build_plugin.py $(BUILD)

$(BUILD)/%.o: spank/%.c $(SPANK_H) grace_policy/__init__.py | $(PYDEPS)/.stamp
	$(CC) $(PLUGIN_CFLAGS) -DGRACE_VERSION='"$(GRACE_VERSION)"' -DGRACE_PY_EXE='"$(PLUGIN_PY_EXE)"' \
		-Ispank -I$(BUILD) -c -o $@ $<

# -Wno-unused-parameter: only for cffi's generated glue (an empty stub of its
# own); our grace_python.c, included there, is clean without it.
$(BUILD)/spank_grace_policy_cffi.o: $(CFFI_C) $(SPANK_H) spank/grace_python.c
	$(CC) $(PLUGIN_CFLAGS) -Wno-unused-parameter -I$(PLUGIN_PY_INCLUDE) -Ispank -I$(BUILD) -c -o $@ $<

# The stub: exports only plugin_*/slurm_spank_* (grace_policy.map).
$(PLUGIN_SO): $(BUILD)/grace_spank.o $(BUILD)/grace_stepd.o $(BUILD)/grace_helper.o \
		$(BUILD)/grace_cache.o $(BUILD)/grace_container.o $(BUILD)/grace_node.o \
		$(BUILD)/grace_wire.o $(BUILD)/grace_contract.o $(BUILD)/grace_afterpull.o \
		spank/grace_policy.map
	$(CC) $(PLUGIN_LDFLAGS) -Wl,--version-script=spank/grace_policy.map -o $@ \
		$(filter %.o,$^) -lpthread -ldl

# The Python part: exports only grace_python_check (grace_policy_py.map).
$(PLUGIN_PY_SO): $(BUILD)/spank_grace_policy_cffi.o spank/grace_policy_py.map
	$(CC) $(PLUGIN_LDFLAGS) -Wl,--version-script=spank/grace_policy_py.map -o $@ \
		$(filter %.o,$^) $(PLUGIN_PY_LIB) -lpthread -ldl

plugin: $(PLUGIN_SO) $(PLUGIN_PY_SO)

# A test build of the stub, for tests/slurm only: -DGRACE_TEST_HOOKS compiles
# in the fault hooks (grace_stepd.c GRACE_ENV_EDIT). Never installed; the
# plugin above has no such code (the tests check that too).
TESTHOOKS_SO := $(BUILD)/testhooks/spank_grace_policy.so
$(TESTHOOKS_SO): $(SPANK_C) $(SPANK_H) spank/grace_policy.map grace_policy/__init__.py
	mkdir -p $(dir $@)
	$(CC) $(PLUGIN_CFLAGS) -DGRACE_TEST_HOOKS -DGRACE_VERSION='"$(GRACE_VERSION)"' \
		-DGRACE_PY_EXE='"$(PLUGIN_PY_EXE)"' -Ispank -I$(BUILD) \
		$(PLUGIN_LDFLAGS) -Wl,--version-script=spank/grace_policy.map -o $@ $(SPANK_C) -lpthread -ldl

plugin-testhooks: $(TESTHOOKS_SO)

# Everything the plugin needs, where it finds it with no environment variable:
# the plugin locates GP_DIR/python from its own path.
install: plugin
	install -d $(DESTDIR)$(SLURM_PLUGINDIR) $(DESTDIR)$(PREFIX)/bin $(GP_SHARE)/plugstack.conf.d
	install -m 0755 $(PLUGIN_SO) $(DESTDIR)$(SLURM_PLUGINDIR)/spank_grace_policy.so
	install -d $(DESTDIR)$(GP_DIR)
	install -m 0755 $(PLUGIN_PY_SO) $(DESTDIR)$(GP_DIR)/grace_policy_py.so
	rm -rf $(GP_LIBDIR).new
	install -d $(GP_LIBDIR).new
	cp -a $(PYDEPS)/. $(GP_LIBDIR).new/
	rm -rf $(GP_LIBDIR).new/bin $(GP_LIBDIR).new/.stamp
	tar -cf - --exclude=__pycache__ --exclude='*.pyc' grace_policy | tar -xf - -C $(GP_LIBDIR).new
	$(PLUGIN_PYTHON) -I -m compileall -q $(GP_LIBDIR).new >/dev/null
	chmod -R a+rX,go-w $(GP_LIBDIR).new
	rm -rf $(GP_LIBDIR) && mv $(GP_LIBDIR).new $(GP_LIBDIR)
	sed 's|@GP_PYDIR@|$(GP_DIR)/python|g' packaging/grace-policy.launcher \
		> $(DESTDIR)$(PREFIX)/bin/grace-policy
	chmod 0755 $(DESTDIR)$(PREFIX)/bin/grace-policy
	if [ -f packaging/grace-policy.example.toml ]; then \
		install -m 0644 packaging/grace-policy.example.toml $(GP_SHARE)/grace-policy.example.toml; fi
	sed 's|@PREFIX@|$(PREFIX)|g; s|@SLURM_PLUGINDIR@|$(SLURM_PLUGINDIR)|g' \
		packaging/plugstack.conf.d/zz-grace-policy.conf.in \
		> $(GP_SHARE)/plugstack.conf.d/zz-grace-policy.conf
	chmod 0644 $(GP_SHARE)/plugstack.conf.d/zz-grace-policy.conf
	sed 's|@GP_CLI@|$(PREFIX)/bin/grace-policy|g; s|@GP_CONFIG@|$(GP_CONFIG)|g' \
		packaging/cli_filter.lua > $(GP_SHARE)/cli_filter.lua
	chmod 0644 $(GP_SHARE)/cli_filter.lua

demo:
	bash scripts/demo.sh

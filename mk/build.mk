# loom's SQL-only flavour for PostgreSQL servers that cannot load loom.so
# (managed ones): the portable parts of loom-core/sql as one script a
# database's owner runs with psql -f (README, docs/flavours.md).
.PHONY: sql-only
sql-only: deps.apt ## write target/sql-only/loom.sql: loom in SQL and PL/pgSQL, for managed PostgreSQL
	install -d target/sql-only
	cargo run -q -p pgloom-core --example sql_only_script > $(SQL_ONLY_SCRIPT).part
	mv $(SQL_ONLY_SCRIPT).part $(SQL_ONLY_SCRIPT)
	@echo "$(SQL_ONLY_SCRIPT): loom $(LOOM_VERSION), SQL-only ($$(wc -c < $(SQL_ONLY_SCRIPT)) bytes)"

# The extension's scripts beside the one pgrx generates (the current
# version's), into directory $(1): first any other full script a previous
# install left (PostgreSQL would run it in place of the chain), then sql/'s
# (0.1.0's full script and the older upgrade steps), and the steps written
# once for both flavours in loom-core/sql/steps/A--B.sql
# (pgloom_core::sql::STEPS), rendered for the extension as loom--A--B.sql.
define install_scripts
test -n "$(LOOM_VERSION)" -a -f $(1)/loom--$(LOOM_VERSION).sql || { echo "install_scripts: no loom--$(LOOM_VERSION).sql in $(1)" >&2; exit 1; }; \
find $(1) -maxdepth 1 -name 'loom--*.sql' ! -name '*--*--*' ! -name 'loom--$(LOOM_VERSION).sql' -delete; \
install -m 0644 sql/loom--*.sql $(1)/; \
cargo run -q -p pgloom-core --example extension_steps -- $(1); \
chmod 0644 $(1)/loom--*--*.sql
endef

# The release build of the extension, installed into PostgreSQL 15's
# directories, with those scripts. `cargo pgrx test` installs its own test
# build over it, so test.integration reinstalls.
.PHONY: install
install: deps deps.pgrx.major ## build and install the extension into PG_CONFIG's server (default: Debian's 15)
	cd loom_pg && $(CARGO_PGRX) install $(INSTALL_PROFILE) --pg-config $(PG_CONFIG) $(PG_FEATURES)
	$(call install_scripts,"$$($(PG_CONFIG) --sharedir)/extension")

# ---------------------------------------------------------------- package

# A Debian package of the extension for PG_CONFIG's major, laid out for
# Debian's and PGDG's paths (/usr/lib/postgresql/NN/lib,
# /usr/share/postgresql/NN/extension) whatever the build's own prefix, with
# every upgrade script and 0.1.0's full script (the base of the chain that
# reaches every older version), depending on postgresql-NN.
# Built from `cargo pgrx package` output with dpkg-deb.
LOOM_VERSION := $(shell sed -nE 's/^version = "(.*)"/\1/p' loom_pg/Cargo.toml | head -n 1)
PKG_NAME := postgresql-$(PG_MAJOR)-loom
PKG_DEB := target/package/$(PKG_NAME)_$(LOOM_VERSION)_amd64.deb
.PHONY: package
package: deps deps.pgrx.major ## build target/package/postgresql-NN-loom_VERSION_amd64.deb for PG_CONFIG's major
	cd loom_pg && $(CARGO_PGRX) package --pg-config $(PG_CONFIG) $(PG_FEATURES)
	@out=target/release/loom-pg$(PG_MAJOR); stage=target/package/$(PKG_NAME); \
	lib=$$stage/usr/lib/postgresql/$(PG_MAJOR)/lib; ext=$$stage/usr/share/postgresql/$(PG_MAJOR)/extension; \
	rm -rf $$stage; install -d $$lib $$ext $$stage/DEBIAN; \
	install -m 0644 "$$out$$($(PG_CONFIG) --pkglibdir)/loom.so" $$lib/; \
	install -m 0644 "$$out$$($(PG_CONFIG) --sharedir)/extension/loom.control" \
	  "$$out$$($(PG_CONFIG) --sharedir)/extension/loom--$(LOOM_VERSION).sql" $$ext/; \
	$(call install_scripts,$$ext); \
	printf '%s\n' "Package: $(PKG_NAME)" "Version: $(LOOM_VERSION)" "Architecture: amd64" \
	  "Maintainer: loom developers <loom@example.invalid>" "Section: database" "Priority: optional" \
	  "Depends: postgresql-$(PG_MAJOR), libc6 (>= $$(objdump -T $$lib/loom.so | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1))" \
	  "Installed-Size: $$(du -sk $$stage/usr | cut -f1)" \
	  "Description: loom: durable-workflow snapshots and execution logs for PostgreSQL $(PG_MAJOR)" \
	  " The loom extension stores a durable-workflow engine's events, snapshots" \
	  " (as frames, decoded in the server) and refs, in one code-point order." \
	  > $$stage/DEBIAN/control; \
	dpkg-deb --root-owner-group -Zxz --build $$stage $(PKG_DEB) >/dev/null; \
	echo "$(PKG_DEB):"; dpkg-deb --contents $(PKG_DEB) | awk '{print "  " $$6}' | grep -v '/$$'

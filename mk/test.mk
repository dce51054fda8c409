.PHONY: fmt check-fmt check.fmt
fmt: ## format the code (cargo fmt)
	cargo fmt --all
check-fmt check.fmt: ## check the formatting, changing nothing (what lint runs)
	cargo fmt --all -- --check

# Not --all-features: pgrx refuses more than one pgNN feature at once.
.PHONY: check.clippy
check.clippy: deps
	cargo clippy --workspace --all-targets --features pgloom/cli,pgloom/test-kits -- -D warnings

# The public crates' docs build without a broken link or a warning, as
# docs.rs builds them (every feature, `--cfg docsrs`: each feature-gated
# item labelled; docs.rs's nightly rustdoc, here stable's by
# RUSTC_BOOTSTRAP).
.PHONY: check.docs
check.docs: deps.apt
	RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="-D warnings --cfg docsrs" cargo doc --no-deps -p pgloom-core -p pgloom --all-features

# The client builds with each backend alone (a Postgres-only service, an
# embedded SQLite one, neither), warnings refused.
.PHONY: check.features
check.features: deps.apt
	RUSTFLAGS="-D warnings" cargo check -p pgloom --no-default-features --features postgres,openssl,zstd
	RUSTFLAGS="-D warnings" cargo check -p pgloom --no-default-features --features postgres,rustls,zstd
	RUSTFLAGS="-D warnings" cargo check -p pgloom --no-default-features --features sqlite
	RUSTFLAGS="-D warnings" cargo check -p pgloom --no-default-features

# The public crates package, build from their packages alone and pass the
# registry's checks, as `cargo publish` would run them (pgloom-core
# through a local overlay of the registry), without uploading; and their
# declared rust-version covers every locked dependency (tests/tooling/msrv.rs);
# their public API names no other crate's type outside pgloom::interop
# (tests/tooling/public_api.rs).
.PHONY: check.package
check.package: deps.apt
	@# The overlay serves the pgloom-core just packaged, but cargo takes a
	@# registry crate for immutable: it reuses a source it unpacked, and a
	@# build of it, under the same version. Both go, so the check builds
	@# pgloom against today's pgloom-core.
	rm -rf target/package/tmp-registry $${CARGO_HOME:-$$HOME/.cargo}/registry/src/*/pgloom-core-*
	for d in target/debug/deps/pgloom_core-*.d; do \
	  if [ -f "$$d" ] && grep -q 'registry/src/[^ ]*/pgloom-core-' "$$d"; then \
	    h=$$(basename "$$d" .d); rm -rf target/debug/.fingerprint/pgloom-core-$${h#pgloom_core-}; fi; \
	done
	cargo publish --dry-run -p pgloom-core -p pgloom --allow-dirty
	$(call module_test,--test tooling,msrv:: --nocapture)
	$(call module_test,--test tooling,public_api::)

# The port table (above), every major's: no two servers on one port, and
# docs/operations.md's cluster tables give each of 15's its own.
all_ports = $(foreach major,$(SUPPORTED_MAJORS),$(foreach entry,$(CLUSTER_OFFSETS) $(CITUS_OFFSETS),\
  $(firstword $(subst =, ,$(entry)))@$(major)=$(call port_of,$(firstword $(subst =, ,$(entry))),$(major)))) \
  $(foreach entry,$(SCRATCH_PORTS),$(subst =,@scratch=,$(entry)))
.PHONY: ports
ports: ## print the port table: every cluster of every major, and the tests' scratch servers
	@printf '%s\n' $(all_ports) | tr '@=' '  ' | awk '{printf "%-16s %-8s %s\n", $$1, $$2, $$3}'
.PHONY: check.ports
check.ports:
	@clash=$$(printf '%s\n' $(all_ports) | sed 's/.*=//' | sort | uniq -d); \
	if [ -n "$$clash" ]; then echo "check.ports: more than one server on port(s) $$clash"; exit 1; fi; \
	checked=0; for entry in $(all_ports); do \
	  case $$entry in *@$(DEBIAN_MAJOR)=*) ;; *) continue;; esac; \
	  name=$${entry%%@*}; port=$${entry##*=}; checked=$$((checked + 1)); \
	  found=$$(awk -F'|' -v n="$$name" '{ gsub(/`/, "", $$2); k = split($$2, names, ","); \
	    split($$3, ports, ","); for (i = 1; i <= k; i++) { gsub(/ /, "", names[i]); gsub(/ /, "", ports[i]); \
	    if (names[i] == n) print ports[i] } }' docs/operations.md); \
	  [ "$$found" = "$$port" ] || { echo "check.ports: docs/operations.md gives $$name port(s) '$$found', the table $$port"; exit 1; }; \
	done; [ $$checked = $(words $(CLUSTER_OFFSETS) $(CITUS_OFFSETS)) ] || { echo "check.ports: only $$checked of $(DEBIAN_MAJOR)'s clusters checked"; exit 1; }; \
	echo "ports: no clash; docs/operations.md agrees on $$checked clusters"

.PHONY: lint
lint: check.ports check.fmt check.clippy check.docs check.features check.package ## fmt, clippy and docs -D warnings, each feature set, the crates packaged

# The crates that need no database (what a plain `cargo test` runs, plus
# the loom CLI's tests).
.PHONY: test.unit
test.unit: deps.apt
	cargo test -p pgloom-core -p pgloom -p loom-fixtures --features pgloom/cli,pgloom/test-kits,pgloom/serde
	# A build without zstd refuses it loudly, and still reads 0x01 frames.
	cargo test -p pgloom-core --no-default-features --lib
	cargo test -p pgloom --no-default-features --features sqlite --lib
	# Connection strings and certificate files under rustls.
	cargo test -p pgloom --no-default-features --features postgres,rustls,zstd --lib pg_connect

# The extension's #[pg_test]s, in a throwaway cluster pgrx runs as postgres.
# One at a time: they share one database, and the ones that alter loom's
# tables (conversions, dropped triggers) deadlock with the ones that write
# them in another order.
#
# Run as postgres, pgrx installs its test build with `sudo cp`, which
# writes into the installed loom.so in place: the Makefile's clusters share
# that directory, and a backend of theirs that has the library mapped (an
# idle PgBouncer server connection, say) then runs the new bytes and
# crashes its cluster (SIGSEGV) when it next calls into loom or exits. So
# the installed file is unlinked first (those backends keep the old one),
# and the run fails if the file it held open was written into anyway.
.PHONY: test.pg
test.pg: deps deps.pgrx.major clear.pgrx-test | $(LOOM_PGROOT)
	@lib="$$($(PG_CONFIG) --pkglibdir)/loom.so"; \
	if [ -f "$$lib" ]; then exec 3<"$$lib"; held=$$(stat -L -c %i /proc/self/fd/3); rm -f "$$lib"; fi; \
	(cd loom_pg && RUST_TEST_THREADS=1 $(CARGO_PGRX) test pg$(PG_MAJOR) $(PG_FEATURES)); \
	if [ -n "$${held:-}" ] && [ "$$(stat -c %i "$$lib")" = "$$held" ]; then \
	  echo "test.pg: the test build was written into the loom.so running backends have mapped" >&2; exit 1; fi

# What a killed pg_test run leaves under CARGO_PGRX_TEST_PGDATA: its data
# directory (pgrx names it <major>-<PID of the test process>), maybe its
# server still running, and beside them its server's socket and socket
# lock, beside which the next run's server refuses to start (see
# clear_stale_sockets). A run whose test process is gone has its server
# stopped (fast shutdown) and its directory removed.
.PHONY: clear.pgrx-test
clear.pgrx-test: | $(LOOM_PGROOT)
	@install -d -o postgres -g postgres $(CARGO_PGRX_TEST_PGDATA)
	@if [ -L $(CARGO_PGRX_TEST_PGDATA) ]; then echo "$(CARGO_PGRX_TEST_PGDATA) is a symlink"; exit 1; fi; \
	for run in $(CARGO_PGRX_TEST_PGDATA)/*-*; do \
	  { [ -d "$$run" ] && [ ! -L "$$run" ]; } || continue; \
	  tester=$${run##*-}; \
	  case "$$tester" in ''|*[!0-9]*) continue ;; esac; \
	  [ ! -d /proc/$$tester ] || continue; \
	  dir=$$run; $(clear_stale_pid) \
	  if [ -f "$$run/postmaster.pid" ]; then \
	    pid=$$(head -n 1 "$$run/postmaster.pid"); \
	    echo "$$run: stopping the server a killed pg_test run left (PID $$pid)"; \
	    $(RUNAS) kill -INT "$$pid" || true; \
	    for i in $$(seq 60); do $(call serves,$$pid,$$run) || break; sleep 0.5; done; \
	    if $(call serves,$$pid,$$run); then echo "$$run: its server (PID $$pid) did not stop"; exit 1; fi; \
	  fi; \
	  echo "$$run: removing the data of a pg_test run that is gone"; \
	  $(RUNAS) rm -rf -- "$$run"; \
	done; \
	sockdir=$(CARGO_PGRX_TEST_PGDATA); $(clear_stale_sockets)

# `make clusters` on a machine restored from a snapshot: s3's server is gone
# but its postmaster.pid and its socket's lock file are left, each naming a
# PID that a live postgres-owned process (not a server of s3) now has. pg_ctl
# alone takes that for a running server, and the server refuses to start
# beside that socket lock; `clusters` must clear both, start s3 and see it
# answer. Then a killed pg_test run: its server left running (a process
# whose working directory is its data directory), its socket lock naming
# that server, and a stale lock naming the squatter; clear.pgrx-test must
# stop the one, keep nothing, and remove the other. Fixtures are written
# as postgres, as the files they stand for are.
.PHONY: test.clusters
test.clusters: clusters
	@dir=$(LOOM_PGROOT)/s3; \
	was=$$(tail -n +2 $$dir/postmaster.pid); \
	$(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -m fast -w stop >/dev/null; \
	setpriv --reuid=postgres --regid=postgres --clear-groups sleep 120 & squatter=$$!; \
	trap "kill $$squatter 2>/dev/null || true" EXIT; \
	printf '%s\n%s\n' $$squatter "$$was" | $(RUNAS) tee $$dir/postmaster.pid >/dev/null; \
	printf '%s\n%s\n' $$squatter $$dir | $(RUNAS) tee $$dir/.s.PGSQL.$(PORT_s3).lock >/dev/null; \
	$(MAKE) --no-print-directory clusters CLUSTERS=s3; \
	[ "$$($(PG_BIN)/psql "host=127.0.0.1 port=$(PORT_s3) user=postgres dbname=postgres" -X -At -c 'SELECT 1')" = 1 ]; \
	echo "test.clusters: s3 started again past a stale postmaster.pid and socket lock (PID $$squatter, not its server)"; \
	run=$(CARGO_PGRX_TEST_PGDATA)/$(PG_MAJOR)-2147483646; \
	$(RUNAS) install -d -m 0700 $$run; \
	setpriv --reuid=postgres --regid=postgres --clear-groups \
	  bash -c "cd $$run && exec env --default-signal=INT sleep 120" & orphan=$$!; \
	trap "kill $$squatter $$orphan 2>/dev/null || true" EXIT; \
	for i in $$(seq 50); do ! $(call serves,$$orphan,$$run) || break; sleep 0.1; done; \
	echo $$orphan | $(RUNAS) tee $$run/postmaster.pid >/dev/null; \
	printf '%s\n%s\n' $$orphan $$run | $(RUNAS) tee $(CARGO_PGRX_TEST_PGDATA)/.s.PGSQL.1.lock >/dev/null; \
	printf '%s\n%s\n' $$squatter $$run | $(RUNAS) tee $(CARGO_PGRX_TEST_PGDATA)/.s.PGSQL.2.lock >/dev/null; \
	$(MAKE) --no-print-directory clear.pgrx-test; \
	if [ -e $$run ] || $(call serves,$$orphan,$$run) || [ -e $(CARGO_PGRX_TEST_PGDATA)/.s.PGSQL.2.lock ]; then \
	  echo "test.clusters: the killed pg_test run was not cleared"; exit 1; \
	fi; \
	$(RUNAS) rm -f $(CARGO_PGRX_TEST_PGDATA)/.s.PGSQL.1.lock; \
	echo "test.clusters: a killed pg_test run's server stopped, its data and a stale socket lock removed"

# tests/ against the Makefile's clusters, with the release build installed
# and the loom binary built (the CLI tests run it).
export LOOM_BIN := $(CURDIR)/target/debug/loom
# TESTS narrows the run while working on one area: TESTS='--test security'
# (one binary a directory of tests/, one module a file), and FILTER to the
# tests whose path holds it: FILTER=upgrade::.
TESTS ?=
FILTER ?=
# $(3) cargo test -p loom-harness $(1) -- $(2): one module's tests (a
# filter on their paths), with environment $(3), in a subshell that fails
# when the filter selects no test, which libtest would report as a pass
# ("0 passed").
module_test = ( found=$$($(3) cargo test -q -p loom-harness $(1) -- --list $(2) 2>/dev/null | grep -c ': test$$' || true); \
  [ "$$found" -gt 0 ] || { echo "no test matches '$(2)' in $(1)" >&2; exit 1; }; \
  $(3) cargo test -p loom-harness $(1) -- $(2) )
.PHONY: test.integration
test.integration: install clusters pooler clusters.sql-only sql-only clusters.citus.if-available
	cargo build -p pgloom --features cli --bin loom
	cargo test -p loom-harness $(TESTS) -- --nocapture $(FILTER)
	# The TLS suite again over rustls (the same sslmodes and typed errors).
	$(call module_test,--features pgloom/rustls --test connect,tls:: --nocapture,LOOM_TLS_BACKEND=rustls)
	$(citus_tests)

# The suite on one more major (PG_CONFIG=...): the pg_tests, then every
# integration test binary (tests/<area>/ or tests/<name>.rs) but those that
# hold nothing a server's major changes, or need what only 15 has here:
#   connect       PgBouncer and the tls cluster run on 15
#   cli_postgres  the loom command's output, the same on every server
#   citus         Citus is installed for 15 only
#   telemetry     spans and metrics, made by the client
#   tooling       checks of the crates, no server
# and, in server/, the hostile frame inputs (over three minutes a run; the
# decoders are loom-core's on every major) and the workload's plans.
ONLY_ON_15 := connect cli_postgres citus telemetry tooling
ONLY_ON_15_MODULES := hostile_frames workload
TEST_BINARIES := $(sort $(basename $(notdir $(wildcard tests/*.rs))) $(notdir $(patsubst %/main.rs,%,$(wildcard tests/*/main.rs))))
MAJOR_TESTS := $(addprefix --test ,$(filter-out $(ONLY_ON_15),$(TEST_BINARIES))) \
  -- $(addprefix --skip ,$(addsuffix ::,$(ONLY_ON_15_MODULES)))
.PHONY: test.major
test.major: test.pg install clusters clusters.sql-only sql-only
	cargo build -p pgloom --features cli --bin loom
	cargo test -p loom-harness $(MAJOR_TESTS) --nocapture

# test.major on every supported major but Debian's, each timed.
OTHER_MAJORS := $(filter-out $(DEBIAN_MAJOR),$(SUPPORTED_MAJORS))
.PHONY: test.majors
test.majors: deps.majors ## run the suite on PostgreSQL 16, 17 and 18
	@$(foreach major,$(OTHER_MAJORS),start=$$(date +%s); \
	  $(MAKE) --no-print-directory test.major PG_CONFIG=$(call dist_pg_config,$(major)) INSTALL_PROFILE=; \
	  echo "*** PostgreSQL $(major): test.major passed in $$(( $$(date +%s) - start )) s";)

# pg_upgrade across majors with loom installed (tests/install/pg_upgrade.rs): the
# same loom version in the old and the new major's build, then pg_upgrade
# from 15 to 18. Both relocatable builds: Debian's 15 stores an attribute
# option (pg_attver) that the other builds' servers refuse on restore.
.PHONY: test.pg_upgrade
test.pg_upgrade: deps.majors ## pg_upgrade a PostgreSQL 15 cluster with loom data to 18
	$(MAKE) --no-print-directory install PG_CONFIG=$(call dist_pg_config,15) INSTALL_PROFILE=
	$(MAKE) --no-print-directory install PG_CONFIG=$(call dist_pg_config,18) INSTALL_PROFILE=
	$(call module_test,--test install,pg_upgrade:: --ignored --nocapture,\
	  LOOM_PG_UPGRADE_OLD_BIN=$(PG_DIST)/$(PG_BUILD_15)/bin LOOM_PG_UPGRADE_NEW_BIN=$(PG_DIST)/$(PG_BUILD_18)/bin)

# Each major's package, built and installed as a user would
# (tests/install/packages.rs): dpkg -i / -r on Debian's 15 (the from-source install
# it replaces is put back after), unpacked and loaded by path on 16-18.
package_test = $(call module_test,--test install,packages:: --ignored --nocapture,\
  LOOM_PACKAGE_DEB=$(CURDIR)/target/package/postgresql-$(1)-loom_$(LOOM_VERSION)_amd64.deb \
  LOOM_PACKAGE_MAJOR=$(1) LOOM_PACKAGE_BIN=$$($(2) --bindir))
.PHONY: test.package
test.package: deps.majors ## build every major's .deb and install, load and remove it
	$(MAKE) --no-print-directory package
	$(call package_test,$(DEBIAN_MAJOR),$(PG_CONFIG))
	$(MAKE) --no-print-directory install
	$(foreach major,$(OTHER_MAJORS),$(MAKE) --no-print-directory package PG_CONFIG=$(call dist_pg_config,$(major)) && \
	  $(call package_test,$(major),$(call dist_pg_config,$(major))) && ) true

# The SQL-only flavour (tests/install/sql_only.rs) on servers without loom.so, 15
# and 18, installed by a database owner that is not superuser; its catalog
# compared with the native extension's on cluster c (15). test.integration
# runs it with the rest; this runs it alone.
.PHONY: test.sql-only
test.sql-only: sql-only install clusters clusters.sql-only
	$(call module_test,--test install,sql_only:: --nocapture)

.PHONY: test
# The README's Rust quick start, run as a user runs it: the example
# service (migrate, one pool, append, append in its own transaction, page,
# a zstd frame snapshot, resume) on a fresh database, twice (a second boot
# finds everything in place), exiting 0, each snapshot stored as a 0x02
# frame. Then as a user of managed PostgreSQL runs it: LOOM_SQL_ONLY=1 on
# 15's server with no loom library, as a database owner that is not
# superuser (RDS's master user: CREATEROLE CREATEDB), the SQL-only flavour
# installed by its migrate() and the zstd frames written by the client.
# Then six copies at once through PgBouncer in transaction mode (make
# pooler), on one fresh database: every copy exits 0.
EXAMPLE_OWNER := loom_example_owner
EXAMPLE_SQL_ONLY := host=127.0.0.1 port=$(call port_of,bare,15)
example_frames_are_zstd = [ "$$($(PG_BIN)/psql "$(1)" -X -At -c \
  "SELECT count(*) FILTER (WHERE get_byte(state_z, 0) = 2) FROM loom.snapshots")" = 2 ] \
  || { echo "test.example: the example's two snapshots are not both zstd (0x02) frames"; exit 1; }
.PHONY: test.example
test.example: install clusters pooler clusters.sql-only
	$(PG_BIN)/psql "$$LOOM_PG_ICU dbname=postgres" -X -q -v ON_ERROR_STOP=1 \
	  -c "DROP DATABASE IF EXISTS loom_example_service WITH (FORCE)" -c "CREATE DATABASE loom_example_service"
	LOOM_DB="$$LOOM_PG_ICU dbname=loom_example_service" cargo run -q -p pgloom --example service
	LOOM_DB="$$LOOM_PG_ICU dbname=loom_example_service" cargo run -q -p pgloom --example service
	@$(call example_frames_are_zstd,$$LOOM_PG_ICU dbname=loom_example_service)
	$(PG_BIN)/psql "$(EXAMPLE_SQL_ONLY) user=postgres dbname=postgres" -X -q -v ON_ERROR_STOP=1 \
	  -c "DROP DATABASE IF EXISTS loom_example_managed WITH (FORCE)" -c "DROP ROLE IF EXISTS $(EXAMPLE_OWNER)" \
	  -c "CREATE ROLE $(EXAMPLE_OWNER) LOGIN CREATEROLE CREATEDB" \
	  -c "CREATE DATABASE loom_example_managed OWNER $(EXAMPLE_OWNER)"
	LOOM_SQL_ONLY=1 LOOM_DB="$(EXAMPLE_SQL_ONLY) user=$(EXAMPLE_OWNER) dbname=loom_example_managed" \
	  cargo run -q -p pgloom --example service
	LOOM_SQL_ONLY=1 LOOM_DB="$(EXAMPLE_SQL_ONLY) user=$(EXAMPLE_OWNER) dbname=loom_example_managed" \
	  cargo run -q -p pgloom --example service
	@$(call example_frames_are_zstd,$(EXAMPLE_SQL_ONLY) user=$(EXAMPLE_OWNER) dbname=loom_example_managed)
	$(PG_BIN)/psql "$$LOOM_PG_ICU dbname=postgres" -X -q -v ON_ERROR_STOP=1 \
	  -c "DROP DATABASE IF EXISTS loom_example_pooled WITH (FORCE)" -c "CREATE DATABASE loom_example_pooled"
	cargo build -q -p pgloom --example service
	@pids=; for i in 1 2 3 4 5 6; do \
	  LOOM_DB="$$LOOM_PG_POOLER dbname=loom_example_pooled" target/debug/examples/service \
	    > target/example-pooled-$$i.log 2>&1 & pids="$$pids $$!"; \
	done; failed=0; i=0; for pid in $$pids; do i=$$((i + 1)); \
	  wait $$pid || { failed=$$((failed + 1)); echo "copy $$i failed:"; cat target/example-pooled-$$i.log; }; \
	done; \
	[ $$failed = 0 ] || { echo "test.example: $$failed of 6 copies failed behind PgBouncer"; exit 1; }; \
	echo "test.example: 6 copies at once through PgBouncer (transaction mode): all exited 0"

test: lint test.unit test.pg test.clusters test.integration test.example test.majors test.pg_upgrade test.package ## run every test (what CI runs)

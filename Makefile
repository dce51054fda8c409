# loom's build, test, demo and benchmark entry points.
#
# Two commands matter (README): `make demo` and `make test`. Each does all of
# its own set-up on a fresh Debian 12 machine, as root, and a second run
# redoes only what changed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
export PATH := $(HOME)/.cargo/bin:$(PATH)

PG_MAJOR := 15
PG_BIN := /usr/lib/postgresql/$(PG_MAJOR)/bin
PG_CONFIG := $(PG_BIN)/pg_config
# pgrx 0.19 needs rustc 1.96; cargo-pgrx must match the pgrx crates exactly.
PGRX_VERSION := 0.18.0
# libssl-dev and pkg-config: loom-client's TLS (openssl-sys); openssl: the tls
# cluster's throwaway certificates.
APT_PACKAGES := postgresql-$(PG_MAJOR) postgresql-server-dev-$(PG_MAJOR) sudo zstd libssl-dev pkg-config openssl

# Cluster data, sockets and logs live in the postgres user's home, not in the
# checkout: initdb refuses root, and a clone (CI's, under /root) may not be
# traversable by postgres. One root for every clone: a running cluster is
# reused, whoever started it.
LOOM_PGROOT ?= /var/lib/postgresql/loom
# The fault tests (tests/faults.rs) stop and restart clusters by data dir.
export LOOM_PGROOT
# Fixed ports away from 5432 (the system's `main` cluster is never touched)
# and below the ephemeral range (32768+), where a client socket could hold one.
#   c      UTF8, libc C.UTF-8: code point order is also the database order
#   icu    UTF8, ICU en-US: the non-C default order that ADR 0108's bugs need
#   s1-s3  three more ICU en-US servers: the shards of ShardedEventStore
#   tls    UTF8, C.UTF-8, ssl=on, and TCP only over TLS: the client's sslmodes
CLUSTERS := c icu s1 s2 s3 tls
PORT_c := 25431
PORT_icu := 25432
PORT_s1 := 25433
PORT_s2 := 25434
PORT_s3 := 25435
PORT_tls := 25436
INITDB_c := --locale=C.UTF-8
INITDB_icu := --locale=C.UTF-8 --locale-provider=icu --icu-locale=en-US
INITDB_s1 := $(INITDB_icu)
INITDB_s2 := $(INITDB_icu)
INITDB_s3 := $(INITDB_icu)
INITDB_tls := --locale=C.UTF-8
# The tls cluster's throwaway CA and server certificate (see the rule below).
TLS_CERTS := $(LOOM_PGROOT)/tls-certs
# Server options a cluster starts with, beyond port, socket and address.
START_tls := -c ssl=on -c ssl_cert_file=$(TLS_CERTS)/server.crt -c ssl_key_file=$(TLS_CERTS)/server.key
# Shell run once after initdb (in $dir). The tls cluster refuses TCP without
# TLS (hostnossl reject), so a client that does not encrypt fails loudly.
INIT_tls = printf '%s\n' 'local all all trust' 'hostssl all all 127.0.0.1/32 trust' \
  'hostnossl all all all reject' | $(RUNAS) tee $$dir/pg_hba.conf >/dev/null;

# What the integration tests, the demo and the benches connect to.
export LOOM_PG_C := host=127.0.0.1 port=$(PORT_c) user=postgres
export LOOM_PG_ICU := host=127.0.0.1 port=$(PORT_icu) user=postgres
export LOOM_PG_SHARDS := host=127.0.0.1 port=$(PORT_s1) user=postgres;host=127.0.0.1 port=$(PORT_s2) user=postgres;host=127.0.0.1 port=$(PORT_s3) user=postgres
# No sslmode: each TLS test states its own; the CA is the one to trust.
export LOOM_PG_TLS := host=localhost port=$(PORT_tls) user=postgres
export LOOM_PG_TLS_CA := $(TLS_CERTS)/ca.crt
# pg_tests run their own throwaway cluster, as postgres, under this root.
export CARGO_PGRX_TEST_RUNAS := postgres
export CARGO_PGRX_TEST_PGDATA := $(LOOM_PGROOT)/pgrx-test

RUNAS := runuser -u postgres --
CARGO_PGRX := cargo pgrx

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z.]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

# ---------------------------------------------------------------- set-up

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
	@if ! grep -qs '^pg$(PG_MAJOR) = "$(PG_CONFIG)"' $(HOME)/.pgrx/config.toml; then \
	  $(CARGO_PGRX) init --pg$(PG_MAJOR) $(PG_CONFIG); \
	fi

.PHONY: deps
deps: deps.apt deps.pgrx ## install every system package and tool the build needs

# --------------------------------------------------------------- clusters

$(LOOM_PGROOT):
	install -d -o postgres -g postgres -m 0755 $@

# Initialise (once) and start (unless running) cluster $(1) on port $(2)
# with initdb flags $(3), then $(INIT_$(1)); start it with $(START_$(1)).
define start_cluster
dir=$(LOOM_PGROOT)/$(1); \
if [ ! -f $$dir/PG_VERSION ]; then \
  install -d -o postgres -g postgres -m 0700 $$dir; \
  $(RUNAS) $(PG_BIN)/initdb -D $$dir -A trust -U postgres --encoding=UTF8 $(3) >/dev/null; \
  $(INIT_$(1)) \
fi; \
if ! $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir status >/dev/null 2>&1; then \
  $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -l $$dir/server.log -w \
    -o "-p $(2) -k $$dir -c listen_addresses=127.0.0.1 $(START_$(1))" start >/dev/null; \
fi; \
echo "cluster $(1): port $(2) ($$dir)";
endef

# A throwaway CA and a server certificate for the tls cluster, made once
# (server.crt, renamed into place last, marks a complete set). It covers DNS
# localhost and IP 127.0.0.1 only, so verify-full has a name that matches
# and, with host=<other> hostaddr=127.0.0.1, one that does not. The CA's key
# is deleted once it has signed: nothing else is ever signed with it.
$(TLS_CERTS)/server.crt: | deps.apt $(LOOM_PGROOT)
	install -d -o postgres -g postgres -m 0755 $(TLS_CERTS)
	cd $(TLS_CERTS) && \
	openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -sha256 \
	  -days 3650 -subj "/CN=loom test CA" -keyout ca.key -out ca.crt \
	  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" && \
	openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
	  -subj "/CN=localhost" -keyout server.key -out server.csr && \
	openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -set_serial "0x$$(openssl rand -hex 8)" \
	  -days 3650 -sha256 -out server.crt.new -extfile <(printf '%s\n' \
	    'subjectAltName=DNS:localhost,IP:127.0.0.1' 'basicConstraints=critical,CA:FALSE' \
	    'keyUsage=critical,digitalSignature' 'extendedKeyUsage=serverAuth') && \
	rm -f ca.key server.csr && \
	chown postgres:postgres server.key server.crt.new ca.crt && chmod 0600 server.key && \
	chmod 0644 ca.crt server.crt.new && mv server.crt.new server.crt
	# A tls cluster already running (its certificates deleted by hand) takes the new pair.
	if $(RUNAS) $(PG_BIN)/pg_ctl -D $(LOOM_PGROOT)/tls status >/dev/null 2>&1; then \
	  $(RUNAS) $(PG_BIN)/pg_ctl -D $(LOOM_PGROOT)/tls reload >/dev/null; \
	fi

# Start (initialising if needed) every cluster the tests and demo use.
.PHONY: clusters
clusters: deps.apt $(TLS_CERTS)/server.crt | $(LOOM_PGROOT) ## start loom's own PostgreSQL clusters (reused when running)
	@$(foreach name,$(CLUSTERS),$(call start_cluster,$(name),$(PORT_$(name)),$(INITDB_$(name))))

.PHONY: stop
stop: ## stop every cluster the Makefile started
	@for name in $(CLUSTERS); do \
	  dir=$(LOOM_PGROOT)/$$name; \
	  if [ -f $$dir/postmaster.pid ]; then $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -m fast -w stop; fi; \
	done

# ------------------------------------------------------------------ build

# The release build of the extension, installed into PostgreSQL 15's
# directories, with sql/: the upgrade steps and the full scripts of older
# versions (pgrx generates only the current version's). `cargo pgrx test`
# installs its own test build over it, so test.integration reinstalls.
.PHONY: install
install: deps ## build and install the extension into the machine's PostgreSQL 15
	cd loom_pg && $(CARGO_PGRX) install --release --pg-config $(PG_CONFIG)
	install -m 0644 sql/loom--*.sql "$$($(PG_CONFIG) --sharedir)/extension/"

# ------------------------------------------------------------------ tests

.PHONY: check.fmt fmt
check.fmt fmt: ## check formatting (cargo fmt)
	cargo fmt --all -- --check

# Not --all-features: pgrx refuses more than one pgNN feature at once.
.PHONY: check.clippy
check.clippy: deps
	cargo clippy --workspace --all-targets --features loom-client/cli -- -D warnings

# The public crates' docs build without a broken link or a warning.
.PHONY: check.docs
check.docs: deps.apt
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p loom-core -p loom-client

.PHONY: lint
lint: check.fmt check.clippy check.docs ## fmt check, clippy -D warnings, docs -D warnings

# The crates that need no database (what a plain `cargo test` runs, plus
# the loom CLI's tests).
.PHONY: test.unit
test.unit: deps.apt
	cargo test -p loom-core -p loom-client --features loom-client/cli
	# A build without zstd refuses it loudly, and still reads 0x01 frames.
	cargo test -p loom-core --no-default-features --lib
	cargo test -p loom-client --no-default-features --features sqlite --lib

# The extension's #[pg_test]s, in a throwaway cluster pgrx runs as postgres.
# One at a time: they share one database, and the ones that alter loom's
# tables (conversions, dropped triggers) deadlock with the ones that write
# them in another order.
.PHONY: test.pg
test.pg: deps | $(LOOM_PGROOT)
	install -d -o postgres -g postgres $(CARGO_PGRX_TEST_PGDATA)
	cd loom_pg && RUST_TEST_THREADS=1 $(CARGO_PGRX) test pg$(PG_MAJOR)

# tests/ against the Makefile's clusters, with the release build installed
# and the loom binary built (the CLI tests run it).
export LOOM_BIN := $(CURDIR)/target/debug/loom
# TESTS narrows the run while working on one file: TESTS='--test security'.
TESTS ?=
.PHONY: test.integration
test.integration: install clusters clusters.citus.if-available
	cargo build -p loom-client --features cli --bin loom
	cargo test -p loom-harness $(TESTS) -- --nocapture
	$(citus_tests)

.PHONY: test
test: lint test.unit test.pg test.integration ## run every test (what CI runs)

# ------------------------------------------------------------ demo, bench

.PHONY: demo
demo: install clusters ## frame a synthetic agent state, store it, read it back from psql
	cargo run -q --release -p loom-harness --bin loom-demo
	@echo
	@echo "psql reads the zstd frame back through loom_snapshot_state:"
	@$(PG_BIN)/psql "$$LOOM_PG_ICU dbname=loom_demo" -X -c \
	  "SELECT f.format, f.stored_bytes, f.declared_bytes, \
	          jsonb_array_length(loom_snapshot_state(frame_zstd)->'turns') AS turns, \
	          loom_snapshot_state(frame_zstd)->'turns'->0->'call' AS first_call \
	   FROM demo_snapshot, loom_snapshot_frame_info(frame_zstd) AS f"

.PHONY: bench
bench: install clusters clusters.citus.if-available ## print the codec, read-path, workload and scale-out benchmarks
	cargo bench -p loom-harness

# Coverage-guided fuzzing of frame decoding, for FUZZ_SECONDS (not in test).
FUZZ_SECONDS ?= 120
.PHONY: fuzz
fuzz: deps.apt
	@if ! cargo fuzz --version >/dev/null 2>&1; then cargo install cargo-fuzz --locked; fi
	cd loom-core && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_frame --sanitizer none -- -max_total_time=$(FUZZ_SECONDS)

# ------------------------------------------------------------------ citus

# Citus (the scale-out engine) is installed by its users from the Citus
# project's own packages; this project never carries, fetches or builds its
# source. The Citus tests run where a Citus line that supports the server
# under test is installed (citus.so in its pkglibdir, citus.control's
# default_version on that line), or against a running Citus cluster named by
# LOOM_PG_CITUS and LOOM_PG_CITUS_WORKERS; elsewhere `make test` says loudly
# that they were SKIPPED, and cargo reports them as ignored, not passed.
# The lines loom is tested with, per PostgreSQL major.
CITUS_LINES_15 := 13.2
CITUS_LINES := $(CITUS_LINES_$(PG_MAJOR))
# The installed Citus line ("13.2"), or empty.
CITUS_INSTALLED = $(shell sed -nE "s/^default_version *= *'([0-9]+\.[0-9]+)[.-].*/\1/p" \
  "$$($(PG_CONFIG) --sharedir 2>/dev/null)/extension/citus.control" 2>/dev/null)
# Set by the caller (environment or command line): a Citus cluster of theirs.
CITUS_EXTERNAL := $(if $(filter environment command line,$(origin LOOM_PG_CITUS)),yes)
ifeq ($(CITUS_EXTERNAL),yes)
CITUS_FOUND := yes
export LOOM_CITUS_EXTERNAL := yes
# The one test that stops a worker needs clusters it can stop.
CITUS_SKIP := --skip a_worker_stopped_mid_pass_fails_the_pass_loudly
else
CITUS_FOUND := $(shell [ -f "$$($(PG_CONFIG) --pkglibdir 2>/dev/null)/citus.so" ] && \
  echo " $(CITUS_LINES) " | grep -qF " $(CITUS_INSTALLED) " && echo yes)
endif

# Fails, saying what to install, unless a supported Citus is there.
.PHONY: citus.check
citus.check:
	@if [ "$(CITUS_FOUND)" != yes ]; then \
	  echo "*** Citus: PostgreSQL $(PG_MAJOR) ($(PG_CONFIG)) has $(if $(CITUS_INSTALLED),Citus $(CITUS_INSTALLED),no Citus);" \
	    "loom is tested with Citus $(or $(CITUS_LINES),<none for this major>)." >&2; \
	  echo "*** Install Citus from the Citus project's packages for this server," \
	    "or set LOOM_PG_CITUS and LOOM_PG_CITUS_WORKERS to a running Citus cluster (docs/operations.md, Scale-out)." >&2; \
	  exit 1; \
	fi

# A Citus coordinator and two workers, for the Citus tests and bench. Not in
# CLUSTERS (`make clusters` and `make stop` leave them alone): `make test`
# and `make bench` start them through clusters.citus.if-available.
# ICU en-US like icu, so a code-point-order bug shows; the Citus settings go
# into postgresql.conf once, at initdb, so any start of the data dir has them.
CITUS_CLUSTERS := citus0 citus1 citus2
CITUS_COORDINATOR := citus0
CITUS_WORKERS := citus1 citus2
PORT_citus0 := 25437
PORT_citus1 := 25438
PORT_citus2 := 25439
INITDB_citus0 := $(INITDB_icu)
INITDB_citus1 := $(INITDB_icu)
INITDB_citus2 := $(INITDB_icu)
CITUS_INIT = printf '%s\n' "shared_preload_libraries = 'citus'" 'wal_level = logical' \
  'max_prepared_transactions = 20' | $(RUNAS) tee -a $$dir/postgresql.conf >/dev/null;
# Citus runs a maintenance daemon (distributed deadlock detection, 2PC
# recovery) per database: the tests' databases need more background
# workers than the default 8. Set with ALTER SYSTEM, so a cluster made
# before this line gets it too, on a restart when it differs.
CITUS_MAX_WORKER_PROCESSES := 64
INIT_citus0 = $(CITUS_INIT)
INIT_citus1 = $(CITUS_INIT)
INIT_citus2 = $(CITUS_INIT)
LOOM_PG_CITUS ?= host=127.0.0.1 port=$(PORT_citus0) user=postgres
LOOM_PG_CITUS_WORKERS ?= host=127.0.0.1 port=$(PORT_citus1) user=postgres;host=127.0.0.1 port=$(PORT_citus2) user=postgres
export LOOM_PG_CITUS LOOM_PG_CITUS_WORKERS

# psql on Citus cluster $(1), database postgres, quiet, stopping at an error.
citus_psql = PGOPTIONS='-c client_min_messages=warning' $(PG_BIN)/psql \
  "host=127.0.0.1 port=$(PORT_$(1)) user=postgres dbname=postgres" -X -q -At -v ON_ERROR_STOP=1

# Start the three (initialising them if needed), then, each step skipped when
# done: the citus extension in every node's postgres database, the
# coordinator's own entry, and each worker added on the coordinator.
.PHONY: clusters.citus
clusters.citus: citus.check | $(LOOM_PGROOT) ## start the Citus coordinator and 2 workers (reused when running)
	@$(foreach name,$(CITUS_CLUSTERS),$(call start_cluster,$(name),$(PORT_$(name)),$(INITDB_$(name))))
	@$(foreach name,$(CITUS_CLUSTERS),if [ "$$($(call citus_psql,$(name)) -c 'SHOW max_worker_processes')" != $(CITUS_MAX_WORKER_PROCESSES) ]; then \
	  $(call citus_psql,$(name)) -c 'ALTER SYSTEM SET max_worker_processes = $(CITUS_MAX_WORKER_PROCESSES)'; \
	  $(RUNAS) $(PG_BIN)/pg_ctl -D $(LOOM_PGROOT)/$(name) -m fast -w restart >/dev/null; \
	  echo "cluster $(name): restarted with max_worker_processes = $(CITUS_MAX_WORKER_PROCESSES)"; \
	fi;)
	@$(foreach name,$(CITUS_CLUSTERS),$(call citus_psql,$(name)) -c 'CREATE EXTENSION IF NOT EXISTS citus';)
	@$(call citus_psql,$(CITUS_COORDINATOR)) -c "SELECT citus_set_coordinator_host('127.0.0.1', $(PORT_$(CITUS_COORDINATOR))) \
	  WHERE NOT EXISTS (SELECT FROM pg_dist_node WHERE groupid = 0)" >/dev/null
	@$(foreach name,$(CITUS_WORKERS),$(call citus_psql,$(CITUS_COORDINATOR)) -c "SELECT citus_add_node('127.0.0.1', $(PORT_$(name))) \
	  WHERE NOT EXISTS (SELECT FROM pg_dist_node WHERE nodename = '127.0.0.1' AND nodeport = $(PORT_$(name)))" >/dev/null;)
	@echo "citus: coordinator $(CITUS_COORDINATOR) (port $(PORT_$(CITUS_COORDINATOR))), nodes:" \
	  "$$($(call citus_psql,$(CITUS_COORDINATOR)) -c "SELECT string_agg(nodeport || CASE groupid WHEN 0 THEN ' (coordinator)' ELSE '' END, ', ' ORDER BY nodeport) FROM pg_dist_node")"

# What the tests and benches run against: the caller's Citus cluster, or
# the Makefile's where Citus is installed; otherwise one loud notice, and
# LOOM_CITUS_MISSING tells the scale-out bench to say it is skipped.
ifneq ($(CITUS_FOUND),yes)
export LOOM_CITUS_MISSING := PostgreSQL $(PG_MAJOR) has $(if $(CITUS_INSTALLED),Citus $(CITUS_INSTALLED),no Citus) installed (tested with: $(or $(CITUS_LINES),none))
endif
.PHONY: clusters.citus.if-available
clusters.citus.if-available:
ifeq ($(CITUS_EXTERNAL),yes)
	@echo "citus: the caller's cluster, LOOM_PG_CITUS=$(LOOM_PG_CITUS)"
else ifeq ($(CITUS_FOUND),yes)
	@$(MAKE) --no-print-directory clusters.citus
else
	@echo >&2; echo "*** Citus tests and benches SKIPPED: $(LOOM_CITUS_MISSING)." >&2; \
	  echo "*** make test.citus says what to install (docs/operations.md, Scale-out)." >&2; echo >&2
endif

# The Citus tests (#[ignore]d in a plain run: they need Citus), or the
# loud line saying they did not run.
ifeq ($(CITUS_FOUND),yes)
define citus_tests
cargo test -p loom-harness --test citus -- --ignored --nocapture $(CITUS_SKIP)
$(if $(CITUS_SKIP),@echo "*** SKIPPED a_worker_stopped_mid_pass_fails_the_pass_loudly: it stops a worker; it runs only on the Makefile's own Citus clusters." >&2)
endef
else
define citus_tests
@echo "*** Citus tests SKIPPED (cargo lists them as ignored): $(LOOM_CITUS_MISSING)." >&2
endef
endif

# The Citus tests alone: fails when there is no Citus to run them on.
.PHONY: test.citus
test.citus: citus.check install clusters ## run the Citus tests (fails without an installed Citus)
	@$(MAKE) --no-print-directory clusters.citus.if-available
	$(citus_tests)

.PHONY: stop.citus
stop.citus: ## stop the Citus clusters
	@for name in $(CITUS_CLUSTERS); do \
	  dir=$(LOOM_PGROOT)/$$name; \
	  if [ -f $$dir/postmaster.pid ]; then $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -m fast -w stop; fi; \
	done

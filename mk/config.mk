# What the build runs against: the majors, the system packages, the clusters
# and their ports, and the environment every test and demo reads.

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
# Exported, so that the make the harness runs (cluster.start) has the same.
export LOOM_PGHOME
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
# A cluster's INITDB_, START_ and INIT_ come from this table (and
# citus.mk's) alone, never from the environment: the make the harness runs
# inherits the tests', and would paste one into a shell command.
$(foreach entry,$(CLUSTER_OFFSETS) $(CITUS_OFFSETS),$(foreach v,INITDB START INIT,$(if \
  $(filter environment%,$(origin $(v)_$(firstword $(subst =, ,$(entry))))),$(eval $(v)_$(firstword $(subst =, ,$(entry))) :=))))
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
# tests/server/backtraces.rs starts a server of its own with them set. Clusters
# the tests restart inherit this environment too.
unexport RUST_BACKTRACE RUST_LIB_BACKTRACE
CARGO_PGRX := cargo pgrx
# A make run builds each crate once, so cargo's incremental caches (2.1 GB
# of a clean `make test`'s target/) would only be written, never read.
# Set CARGO_INCREMENTAL=1 to keep them.
export CARGO_INCREMENTAL ?= 0

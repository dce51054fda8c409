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

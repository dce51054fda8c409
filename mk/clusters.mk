$(LOOM_PGROOT):
	install -d -o postgres -g postgres -m 0755 $(LOOM_PGHOME) $@

# Succeeds while PID $(1) is the server of data directory $(2): a number,
# the PID of a process whose working directory is that directory, as a
# postmaster's is. The one test of every lock file below, the harness's
# included (it stops and starts clusters through cluster.start, below).
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
if [ -L "$$dir/postmaster.pid" ]; then echo "$$dir/postmaster.pid is a symlink, not a server's"; exit 1; fi; \
if [ -f "$$dir/postmaster.pid" ]; then \
  pid=$$($(RUNAS) head -n 1 -- "$$dir/postmaster.pid"); \
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
stop_clusters = $(call stop_dirs,$(addprefix $(LOOM_PGROOT)/,$(1)),fast)

# Stops the servers of data directories $(1), where they run, with pg_ctl's
# shutdown mode $(2): fast, or immediate (a server that died, to clients).
define stop_dirs
for dir in $(1); do \
  $(clear_stale_pid) \
  if [ -f "$$dir/postmaster.pid" ]; then $(RUNAS) $(PG_BIN)/pg_ctl -D "$$dir" -m $(2) -w stop >/dev/null; fi; \
done
endef

# One server at a time, for the harness (src/cluster_control.rs and
# scratch_server.rs), so that a cluster is started, stopped and its stale
# locks judged in one language, here, from the one table of config.mk:
#   make cluster.start NAME=icu               start it as `make clusters` does
#   make cluster.stop NAME=icu MODE=immediate stop it (MODE: fast, immediate)
#   make cluster.status NAME=icu              exit 0 while its server runs
# DIR=/absolute/path in place of NAME names a scratch server's directory
# (stop and status only: a scratch server starts with its test's settings).
# The harness passes only paths of letters, digits and / . _ - (the
# recipes hand it to a shell), and every variable, empty or not, so that
# none comes from its environment.
cluster_dir = $(if $(DIR),$(DIR),$(if $(PORT_$(NAME)),$(LOOM_PGROOT)/$(NAME),$(error \
  NAME=$(NAME) is no cluster of the table (config.mk, citus.mk), and no DIR= is given)))
.PHONY: cluster.start cluster.stop cluster.status
cluster.start: | $(LOOM_PGROOT)
	@$(if $(PORT_$(NAME)),,$(error NAME=$(NAME) is no cluster of the table (config.mk, citus.mk)))
	@$(call start_cluster,$(NAME),$(PORT_$(NAME)),$(INITDB_$(NAME)))
cluster.stop:
	@$(call stop_dirs,$(cluster_dir),$(or $(filter fast immediate,$(MODE)),$(if $(MODE),$(error MODE=$(MODE) is not fast or immediate),fast)))
cluster.status:
	@dir=$(cluster_dir); $(clear_stale_pid) $(RUNAS) $(PG_BIN)/pg_ctl -D "$$dir" status >/dev/null

# The bare clusters of the SQL-only servers, on 15 and 18, beside the other
# clusters of their major.
.PHONY: clusters.sql-only
clusters.sql-only: $(foreach major,$(SQL_ONLY_MAJORS),$(call bare_pg_config,$(major))) deps.locale | $(LOOM_PGROOT)
	@$(foreach major,$(SQL_ONLY_MAJORS),$(MAKE) --no-print-directory clusters \
	  PG_CONFIG=$(call bare_pg_config,$(major)) CLUSTERS=bare &&) true

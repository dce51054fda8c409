# loom's build, test, demo and benchmark entry points.
#
# Two commands matter (README): `make demo` and `make test`. Each does all of
# its own set-up on a fresh Debian 12 machine, as root, and a second run
# redoes only what changed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
export PATH := $(HOME)/.cargo/bin:$(PATH)

# The rest is in mk/, one file a concern, included in this order (each may
# use what the ones before it define):
#   config.mk    majors, system packages, the cluster and port table, the
#                environment the tests read
#   deps.mk      installing what the build needs (apt, cargo-pgrx, the
#                16-18 builds)
#   clusters.mk  starting and stopping the PostgreSQL clusters and PgBouncer
#   build.mk     the SQL-only script, `make install`, `make package`
#   test.mk      lint and every test target (`make test`)
#   demo.mk      `make demo`, the benchmarks, the fuzzers
#   citus.mk     the Citus clusters, where Citus is installed
include $(addprefix mk/,config.mk deps.mk clusters.mk build.mk test.mk demo.mk citus.mk)

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z.]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 20

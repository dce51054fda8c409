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
	cd loom-core && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_delta --sanitizer none -- -max_total_time=$(FUZZ_SECONDS)

# pg_shard: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(CURDIR)/target
PG_CONFIG ?= pg_config
# release builds for the demo and CI; `make install PROFILE=debug` while iterating
PROFILE ?= release
PGRX_PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

.PHONY: demo test bootstrap install cluster stop status destroy unit regress coordinator-test lint bench bench-triggers bench-metadata bench-coordinator bench-tls bench-move bench-pause tpch-test bench-tpch package package-test docker docker-test

demo: install ## bootstrap, build, (re)start the local cluster, run the demo
	scripts/cluster.sh restart
	scripts/demo.sh

test: install lint unit regress tpch-test coordinator-test client-suites ## every test

bootstrap: ## install what is missing: PostgreSQL dev headers, libclang, cargo-pgrx
	scripts/bootstrap.sh

install: bootstrap ## build the extension (installed into PostgreSQL 15) and the coordinator
	cd pg_shard_ext && cargo pgrx install $(PGRX_PROFILE_FLAG) --pg-config "$$(command -v $(PG_CONFIG))"
	cargo build --release -p pg_shard_coordinator

package: bootstrap ## Debian packages of the extension and the coordinator, into target/debian
	scripts/package.sh

package-test: package ## the packages installed with apt on a fresh Debian 12 with PostgreSQL 15 (mmdebstrap)
	tests/packaging/install.sh

docker: bootstrap ## Docker images pg-shard-node and pg-shard-coordinator from the packages (starts a Docker engine if none runs)
	@engine=$$(scripts/docker-engine.sh start) && scripts/docker.sh; status=$$?; \
	if [ -n "$$engine" ]; then scripts/docker-engine.sh stop "$$engine"; fi; exit $$status

docker-test: bootstrap ## docker/compose.yaml's cluster from the images, checked, then the pg_regress suites against its containers
	tests/docker/run.sh

cluster: ## start (or reuse) the local cluster: metadata 54320, workers 54321-54322
	scripts/cluster.sh start

stop: ## stop the local cluster
	scripts/cluster.sh stop

status:
	scripts/cluster.sh status

destroy: ## stop the local cluster and delete its data
	scripts/cluster.sh destroy

unit: ## Rust unit and property tests
	cargo test --workspace

regress: ## pg_regress suites against a throwaway 3-node cluster
	tests/run_regress.sh

tpch-test: ## TPC-H's 22 queries at scale factor 0.01 through pg_shard against one PostgreSQL
	tests/tpch/run.sh

coordinator-test: ## the coordinator with psql, pgbench, psycopg, node-postgres, tokio-postgres, faults
	tests/coordinator/run.sh

client-suites: ## psycopg2's and pg8000's own test suites, directly and through the coordinator
	tests/client_suites/run.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: ## criterion benchmarks of the core crate
	cargo bench -p pg_shard_core --bench keyspace

bench-triggers: install ## the guard triggers' cost: COPY of 1M rows and single-row INSERTs, with and without them
	benches/shard_guard.sh

bench-tpch: install ## TPC-H at scale factor 1 (PGSHARD_TPCH_SCALE): the cluster against one PostgreSQL
	benches/tpch.sh

bench-metadata: install ## SQL through the metadata node vs direct / one PostgreSQL
	benches/metadata_sql.sh

bench-coordinator: install ## pgbench -S through the coordinator vs direct vs pgbouncer
	benches/coordinator.sh

bench-tls: install ## what TLS costs: pgbench -S through the coordinator, plain vs TLS to the nodes vs TLS both ways
	benches/tls.sh

bench-move: install ## shard moves (copy rate limits) and a split under pgbench -N: write pause, latency, duration, MB/s
	benches/move.sh

bench-pause: install ## many cutovers (moves, splits, reverts) under load (WORKLOAD=N: pgbench -N; update: issue 18's single-row UPDATEs): the pause's longest transaction against control windows
	benches/pause.sh

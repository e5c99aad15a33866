# The two commands (see README.md). Both install the pinned nats-server into .tools/ first.
.PHONY: up test bench lint validate-deploy nats-server py-venv asyncapi-tools ts-sdk console-tools

# Run the system: an embedded nats-server with JetStream (data in .data/nats) + every service.
up: nats-server
	cargo run --locked --bin switchboard -- up

# Run every test against real nats-server processes (and the pinned Python clients the
# foreign-client tests drive: nats-py, the official MCP SDK; the official AsyncAPI parser
# that checks docs/asyncapi.yaml; the TypeScript SDK, built; Debian's chromium and the pinned
# playwright-core that drive the console in a real browser). Every binary runs, so one
# failure does not hide the next; the wait-bound fault tests run in a lane beside the rest
# (tests/run.sh). One binary alone: cargo test --locked -p switchboard-tests --test NAME.
test: nats-server py-venv asyncapi-tools ts-sdk console-tools
	bash tests/run.sh

# The performance report: a private nats-server and the five services (release binaries),
# Switchboard's paths beside raw NATS in the same run; prints the table and writes
# docs/performance.md. BENCH_OPS (default 400), BENCH_AGENTS (default 10000) and BENCH_GOALS
# (live goals, default 100000; a 3-node R3 cluster opens up to 10000 of them) scale it;
# BENCH_PENDING (approvals waiting for one person, default 10000) the people rows;
# BENCH_THREAD (the console's conversation, default 10000 messages) and BENCH_CONSOLE_LOADS
# (fresh page loads per view, default 20) the console rows;
# BENCH_ONLY=cluster runs only the 3-node R3 cluster rows, BENCH_ONLY=people the people rows,
# BENCH_ONLY=console the console rows (BENCH_AGENTS defaults to 5000 there),
# BENCH_ONLY=backlog the backlog rows (fetch+ack beside its raw floor, audit ingest),
# BENCH_ONLY=peers the call beside Synadia's SDK, BENCH_ONLY=limits the leases and budgets,
# BENCH_ONLY=budgets the budget rows alone (the call with and without a budget, and its floor).
bench: nats-server py-venv
	cargo build --release --locked --bins
	BENCH_WRITE=$(CURDIR)/docs/performance.md cargo bench --locked -p switchboard-tests --bench report

# What CI checks besides the tests.
lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

# Check the deployment artifacts (nats/*.conf, docker-compose.yml, Dockerfile, helm/switchboard)
# with pinned tools in .tools/deploy-venv; needs no Docker and no Kubernetes.
validate-deploy:
	bash deploy/validate.sh

nats-server:
	@bash nats/install-server.sh

py-venv:
	@bash tests/python/install.sh

asyncapi-tools:
	@bash tests/asyncapi/install.sh

ts-sdk:
	@bash sdk/typescript/install.sh

console-tools:
	@bash tests/console/install.sh

# syntax=docker/dockerfile:1
# The Switchboard image: all ten binaries (nine services + the `switchboard` CLI) in one image;
# SERVICE picks the service a container runs (docker-compose.yml, helm/switchboard).
#
#   docker build -t switchboard .
#   docker run -e SERVICE=inbox-fanout -e SWITCHBOARD_NATS__URLS='[nats://n1:4222]' switchboard
#
# Needs BuildKit (the default builder of current Docker) for the cache mounts.

# ---- build ---------------------------------------------------------------------------------
# The toolchain is the image's (rust-toolchain.toml is left out by .dockerignore, so rustup
# downloads nothing during the build). Keep this tag in step with the toolchain CI uses.
FROM rust:1.95-slim-bookworm AS builder

# build-essential: the C compiler for rusqlite's bundled SQLite (audit), ring (async-nats) and
# mimalloc (every service's allocator).
# DL3008 (pin apt versions) is ignored on purpose: the base image tag pins the Debian release,
# and Debian drops superseded package versions from its mirrors, so exact pins break rebuilds.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential pkg-config \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .

# The registry and target/ live in cache mounts, so a rebuild after a source change recompiles
# only the workspace crates; the binaries are copied out of the cache in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace --bins \
    && mkdir -p /out \
    && cp target/release/directory target/release/inbox-fanout target/release/reply-correlator \
       target/release/task-lifecycle target/release/audit target/release/a2a-gateway \
       target/release/people target/release/limits target/release/files \
       target/release/console \
       target/release/switchboard /out/

# ---- run -----------------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates: TLS to NATS (tls:// URLs), to an https OTLP collector, and from the A2A
# gateway to https webhooks and remote agents. (DL3008: as above.)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 switchboard \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin switchboard \
    && install -d -o 10001 -g 10001 /var/lib/switchboard

COPY --from=builder /out/ /usr/local/bin/
COPY deploy/docker-entrypoint.sh /usr/local/bin/switchboard-entrypoint

# Every setting comes from SWITCHBOARD_* variables (docs/config.md). The services may
# start before NATS is up (compose, Kubernetes): keep trying instead of exiting.
ENV SERVICE=directory \
    SWITCHBOARD_NATS__RETRY_ON_INITIAL_CONNECT=true \
    RUST_LOG=info

USER 10001:10001
WORKDIR /var/lib/switchboard

# SIGTERM drains: in-flight requests get SWITCHBOARD_SHUTDOWN_GRACE_MS (10 s by default), so
# give `docker stop` more than that (docker-compose.yml sets stop_grace_period).
STOPSIGNAL SIGTERM

# `<service> health`: NATS and JetStream reachable, and this very instance answering a micro PING
# by the id it wrote to $TMPDIR/switchboard-<service>.id at start. Each step waits at most 3 s.
# The console has no micro service: the entrypoint checks that its HTTP port answers instead.
HEALTHCHECK --interval=15s --timeout=12s --start-period=30s --retries=3 \
    CMD ["switchboard-entrypoint", "health"]

ENTRYPOINT ["switchboard-entrypoint"]

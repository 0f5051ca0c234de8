# syntax=docker/dockerfile:1
# The Bloodraven image: the `bloodraven` binary (and `bloodraven-sidecar`, the sidecar alone) on Debian bookworm, with the MariaDB client that
# `bloodraven deploy migrate -- mariadb …` runs and the tools backups are taken, verified and
# restored with (mariadb-backup, zstd, mariadbd).
#
#   docker build -t bloodraven .
#
# scripts/image builds the same runtime image (the final stage) without a container daemon and
# checks it from inside; it reads the LABEL, USER, ENTRYPOINT and CMD lines below and refuses to
# run when they disagree with it, so change both together.

# ---- build ----------------------------------------------------------------------------------
# Bookworm, like the runtime stage: the binary links against glibc, and the runtime's glibc must
# be at least as new as the one it was built with.
FROM rust:1-bookworm AS build
WORKDIR /src
# Only what the build reads: the workspace manifests, the crates, docs/ (the operator embeds
# docs/operator.md) and charts/ (`bloodraven manifests` embeds the chart's values and dashboard).
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY docs docs
COPY charts charts
# The cache mounts keep downloaded crates and target/ between builds. They are not part of the
# image, so the binaries are copied out of target/ in the same step. The sidecar-only binary is
# built with the `sidecar` profile (whole-program LTO, size-optimised: see Cargo.toml).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p bloodraven \
 && cargo build --profile sidecar --locked -p bloodraven --bin bloodraven-sidecar \
 && install -D -m 0755 target/release/bloodraven /out/bloodraven \
 && install -D -m 0755 target/sidecar/bloodraven-sidecar /out/bloodraven-sidecar

# ---- runtime --------------------------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: the system's trust roots, read by the TLS clients (bloodraven's and mariadb's).
# mariadb-client: users' migration commands (`bloodraven deploy migrate -- mariadb …`), and
# mariadb-dump for a restore from a backup, and mariadb-binlog, with which the operator
# archives the primary's binlog (docs/pitr.md).
# mariadb-backup and zstd: the sidecar takes physical backups with them (docs/backup.md).
# mariadb-server-core: mariadbd alone (no service scripts), the scratch server in which the
# operator verifies a backup and `restore-in-place --from-backup` prepares one.
# No recommended packages, and no apt lists left behind: both only make the image bigger.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates mariadb-client mariadb-backup mariadb-server-core zstd \
 && rm -rf /var/lib/apt/lists/*
# A fixed non-root uid/gid, so Kubernetes' runAsNonRoot can check it and volumes can be
# prepared for it. --no-log-init: a high uid would otherwise grow a large sparse
# /var/log/lastlog. /var/lib/bloodraven is the dataDir of the documented configuration, writable
# by that user when no volume is mounted there.
RUN groupadd --gid 65532 bloodraven \
 && useradd --no-log-init --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin bloodraven \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/bloodraven
# The binaries come last: they change most often, and this keeps the layers above cached.
# bloodraven-sidecar is the sidecar alone, for the container next to every MySQL server.
COPY --from=build /out/bloodraven /usr/local/bin/bloodraven
COPY --from=build /out/bloodraven-sidecar /usr/local/bin/bloodraven-sidecar
LABEL org.opencontainers.image.title="bloodraven"
LABEL org.opencontainers.image.description="Keeps exactly one MySQL/MariaDB site of a failover group writable."
LABEL org.opencontainers.image.source="https://github.com/shipstream/bloodraven"
# Numeric, so the runtime can tell the user is not root without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bloodraven"]
CMD ["operator", "--config", "/etc/bloodraven/operator.yaml"]

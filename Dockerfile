# syntax=docker/dockerfile:1
#
# The runner-scaler daemon's image: `docker build -t REGISTRY/runner-scaler:VERSION .`
# (README, "The image"). Two stages: a Rust toolchain builds the release binary; the run
# stage holds that binary, glibc, OpenSSL and the CA bundle, and nothing else: no shell, no
# package manager.
#
# Why a glibc base and not a static musl `scratch`: consulrs (the Consul client) pulls in
# reqwest 0.11 with native-tls, so the binary links libssl.so.3 and libcrypto.so.3 (check with
# `ldd target/release/runner-scaler`). distroless `cc-debian12` carries glibc, libgcc_s,
# libssl3 and /etc/ssl/certs/ca-certificates.crt; the builder is Debian 12 (bookworm) too, so
# the binary links against the same glibc and OpenSSL 3.0 it finds at run time.
#
# TLS roots: the Vault and Forgejo clients (reqwest 0.13, rustls with the platform verifier)
# and the GitHub client (hyper-rustls with rustls-native-certs) read the system bundle at
# /etc/ssl/certs; the Consul client trusts its bundled web PKI roots plus every certificate
# of CONSUL_CACERT (src/clients/consul.rs). A private CA is therefore given to each service
# by its *_CACERT variable (nomad/runner-scaler.nomad.hcl), not baked into the image.

# ---- build ----
# The toolchain is pinned: Cargo.toml's rust-version is the floor, this is what CI builds with.
FROM docker.io/library/rust:1.95.0-slim-bookworm AS build
# openssl-sys (consulrs -> reqwest 0.11 -> native-tls, in Cargo.lock) compiles against the
# system OpenSSL: its build script asks pkg-config for libssl and needs libssl-dev's headers,
# and the slim image has neither, so `cargo build` fails without them. Bookworm's libssl-dev is
# OpenSSL 3.0, the libssl3 the run stage carries.
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the build reads (see .dockerignore): the manifest, the lock file, the sources, and
# tests/ (the manifest names a bench under tests/bench that cargo checks exists).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY tests ./tests
# The daemon alone: without the `sim` feature the image has no simulator (no twins, no seeded
# world, no tokio test-util), and `runner-scaler simulate` says so and exits 64.
RUN cargo build --release --locked --no-default-features --bin runner-scaler

# ---- run ----
# `nonroot` runs as uid/gid 65532 by default; USER below says so explicitly and numerically,
# so Kubernetes-style runAsNonRoot checks and Nomad's template `uid`/`gid` can rely on it.
FROM gcr.io/distroless/cc-debian12:nonroot AS run
COPY --from=build /src/target/release/runner-scaler /usr/local/bin/runner-scaler
USER 65532:65532
# /metrics, /livez, /healthz when RUNNER_SCALER_LISTEN is set to this port.
EXPOSE 9464
# Exec form: there is no shell in this image to run a string command.
ENTRYPOINT ["/usr/local/bin/runner-scaler"]
CMD ["run"]

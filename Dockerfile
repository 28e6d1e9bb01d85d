# syntax=docker/dockerfile:1
# ctxproxy image: both binaries (ctxproxy, mock-upstream), the shipped config and the migrations.
#   docker build -t ctxproxy .
#   docker run -p 8080:8080 -e OPENAI_API_KEY ctxproxy
# The same image runs the fake provider: docker run --entrypoint mock-upstream ctxproxy --listen 0.0.0.0:9000

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds (BuildKit); the binaries are copied
# out of the cached target dir because a cache mount is not part of the image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ctxproxy --bin mock-upstream \
    && mkdir -p /out \
    && cp target/release/ctxproxy target/release/mock-upstream /out/

FROM debian:bookworm-slim AS runtime
# ca-certificates: the upstream (api.openai.com) is reached over TLS with the system roots.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin ctxproxy
WORKDIR /app
COPY --from=build /out/ctxproxy /out/mock-upstream /usr/local/bin/
COPY config/ ./config/
COPY migrations/ ./migrations/
# data/ holds the default SQLite database; it must be writable by the non-root user.
RUN mkdir -p /app/data && chown ctxproxy:ctxproxy /app/data
USER ctxproxy
ENV CTXPROXY_LISTEN=0.0.0.0:8080
EXPOSE 8080
VOLUME ["/app/data"]
ENTRYPOINT ["ctxproxy", "serve"]

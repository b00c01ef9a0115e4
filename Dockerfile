# sandbox-agent in a container: the release binary of scripts/dist on
# Debian 12, no Rust inside (README.md, "Deploy it" → "Container image").
#
#   scripts/dist                      # dist/sandbox-agent-<version>-x86_64-unknown-linux-gnu.tar.gz
#   podman build --format docker -t sandbox-agent .      # or: docker build -t sandbox-agent .
#   export SANDBOX_AGENT_TOKEN="$(openssl rand -hex 32)"
#   podman run -d -e SANDBOX_AGENT_TOKEN -p 2468:2468 \
#       -v sandbox-agent-data:/var/lib/sandbox-agent sandbox-agent
#
# (`--format docker` keeps the HEALTHCHECK: podman's default OCI format
# drops it.) Decisions: research/decisions.md, "Container image".
#
# BASE: Debian 12 by default (Node.js 18: codex and claude run on it);
# `--build-arg BASE=debian:trixie-slim` gives Debian 13's Node.js 20, which
# gemini needs.
ARG BASE=debian:bookworm-slim
FROM ${BASE}

# - nodejs, npm: the catalog's npm agents are installed with npm on first
#   use and run on Node.js. Debian 12 ships Node.js 18 (no newer one in
#   bookworm-backports); which agents run on it: research/decisions.md.
# - tini: PID 1. It reaps every orphan (an agent's grandchild whose parent
#   died) and forwards SIGTERM/SIGINT to the server; the server cannot be
#   PID 1 itself, as a waitpid(-1) reaper would steal tokio::process exit
#   statuses.
# - ca-certificates: TLS to the npm registry and the agents' own APIs.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates nodejs npm tini \
    && rm -rf /var/lib/apt/lists/*

# The unprivileged user agents and processes run as (--agent-user below):
# the server stays root to keep the store and the runtime id from them.
RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash agent

# The release tarball's version: the workspace's (Cargo.toml). ADD unpacks
# the tarball: /opt/sandbox-agent-<version>-x86_64-unknown-linux-gnu/
# holds sandbox-agent, LICENSE and README.md.
ARG VERSION=0.1.0
ADD dist/sandbox-agent-${VERSION}-x86_64-unknown-linux-gnu.tar.gz /opt/
RUN ln -s /opt/sandbox-agent-${VERSION}-x86_64-unknown-linux-gnu/sandbox-agent /usr/local/bin/sandbox-agent \
    && mkdir -p /var/lib/sandbox-agent
COPY scripts/container-entrypoint /usr/local/bin/sandbox-agent-entrypoint

# Settings as environment variables rather than arguments, so a command
# given to `podman run IMAGE server --flag …` (or `podman exec CONTAINER
# sandbox-agent agents list`) keeps them. No token here: one is required
# at run time in SANDBOX_AGENT_TOKEN (scripts/container-entrypoint).
ENV SANDBOX_AGENT_HOST=0.0.0.0 \
    SANDBOX_AGENT_PORT=2468 \
    SANDBOX_AGENT_DATA_DIR=/var/lib/sandbox-agent \
    SANDBOX_AGENT_AGENT_USER=agent

# Installed agents, agent homes, the session store (sessions.db) and the
# runtime id: kept across containers on a volume.
VOLUME /var/lib/sandbox-agent
WORKDIR /home/agent
EXPOSE 2468

# GET /v2/health is public (no token) and answers 200 once the server
# listens; Node.js is already here, so no curl is added for it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["node", "-e", "require('http').get({host: '127.0.0.1', port: process.env.SANDBOX_AGENT_PORT, path: '/v2/health', timeout: 4000}, r => process.exit(r.statusCode === 200 ? 0 : 1)).on('error', () => process.exit(1))"]

# `podman stop` / `docker stop` send SIGTERM: the server stops its agents
# (5 s grace), flushes the store and exits 0 well within the default 10 s.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/sandbox-agent-entrypoint"]
CMD ["server"]

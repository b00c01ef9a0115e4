/**
 * `sandbox-agent/docker`: the `docker()` sandbox provider
 * (`research/contract.md`, "Sandbox providers"): one container per
 * sandbox, made through the Docker Engine HTTP API on its unix socket
 * (Docker's, or podman's compatible service `podman system service`), with
 * `node:http` alone (no CLI, no dependency).
 *
 * - The socket: the `host` option, else `DOCKER_HOST` (`unix:///PATH` only:
 *   a `tcp://` or `ssh://` host is refused with a message saying so), else
 *   `/var/run/docker.sock`, else podman's `/run/podman/podman.sock`.
 * - The container: the image's own entrypoint and command (`server`, as in
 *   the repository's `Dockerfile`, which holds the runtime), the token in
 *   its environment as `SANDBOX_AGENT_TOKEN` (never in `Cmd`), port 2468
 *   published on `127.0.0.1` at a port the engine picks, the labels
 *   `dev.sandboxagent.fleet=FLEET` and `dev.sandboxagent.managed=1`.
 * - `destroySandbox()` removes the container with its anonymous volumes
 *   (`DELETE /containers/ID?force=true&v=true`); {@link cleanup} removes
 *   every container of a fleet, what a crashed client left.
 */
import { existsSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { SandboxStartError, randomId, type SandboxCreateRequest, type SandboxInstance, type SandboxProvider } from "./sandbox.js";

/** The label naming a container's fleet. */
export const FLEET_LABEL = "dev.sandboxagent.fleet";
/** The label every container this provider makes carries. */
export const MANAGED_LABEL = "dev.sandboxagent.managed";
/** The Engine API version the paths are prefixed with (Docker 20.10+, podman 3+). */
const API_VERSION = "v1.41";
/** The port the image's server listens on (`SANDBOX_AGENT_PORT` of the `Dockerfile`). */
const DEFAULT_CONTAINER_PORT = 2468;
/** Lines of a container's output kept for errors. */
const LOG_TAIL = 50;

/** Options of {@link docker}. */
export interface DockerOptions {
  /** The image, holding the runtime (the repository's `Dockerfile`: `sandbox-agent`, `localhost/sandbox-agent:test`, …). Required. */
  image: string;
  /** Environment of the container (API keys for the agents: they stay in the container, never in this client's logs). */
  env?: Record<string, string>;
  /** Volumes and bind mounts, in the Engine API's `Binds` form: `"NAME:/path"`, `"/host/dir:/path:ro"`. */
  volumes?: string[];
  /** The fleet id its containers are labelled with; default a new random one per `start()`. */
  fleet?: string;
  /** More labels (the fleet and managed labels cannot be overridden). */
  labels?: Record<string, string>;
  /** The Engine API's unix socket: a path or `unix:///PATH`; default `DOCKER_HOST`, else the usual sockets (module doc). */
  host?: string;
  /** The container's command (the image's `CMD` by default, `["server"]`); arguments of `sandbox-agent`. */
  cmd?: string[];
  /** The host address the port is published on; default `127.0.0.1` (loopback only). */
  hostIp?: string;
  /** The port the server listens on inside the container; default 2468. */
  containerPort?: number;
}

/** A `docker()` provider, with its fleet. */
export interface DockerProvider extends SandboxProvider {
  readonly name: "docker";
  /** The fleet id when one was given; `undefined` when each `start()` makes its own (see `sdk.sandbox.fleet`). */
  readonly fleet: string | undefined;
}

/** What {@link cleanup} removed. */
export interface CleanupResult {
  /** The names of the containers removed. */
  removed: string[];
}

/** The answer of one Engine API call. */
interface EngineAnswer {
  status: number;
  body: Buffer;
}

/**
 * The Engine API's unix socket path (module doc for the order).
 *
 * @throws {Error} a `DOCKER_HOST` or `host` that is not a unix socket.
 */
export function socketPath(host?: string): string {
  const given = host ?? process.env["DOCKER_HOST"];
  if (given !== undefined && given !== "") {
    if (given.startsWith("unix://")) return given.slice("unix://".length);
    if (given.startsWith("/")) return given;
    throw new Error(
      `docker: ${host === undefined ? "DOCKER_HOST" : "options.host"}=${given} is not supported: only a unix socket ` +
        `(unix:///PATH) is; forward a remote engine's socket to a local one (e.g. ssh -L /tmp/docker.sock:/var/run/docker.sock HOST)`,
    );
  }
  for (const path of ["/var/run/docker.sock", "/run/podman/podman.sock"]) if (existsSync(path)) return path;
  return "/var/run/docker.sock";
}

/** One Engine API call over the unix socket. */
function engine(socket: string, method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<EngineAnswer> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = httpRequest(
      {
        socketPath: socket,
        method,
        path: `/${API_VERSION}${path}`,
        headers: payload === undefined ? {} : { "content-type": "application/json", "content-length": payload.length },
        ...(signal === undefined ? {} : { signal }),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks) }));
        res.on("error", reject);
      },
    );
    req.on("error", (error) => reject(new Error(`Docker Engine API at ${socket}: ${method} ${path}: ${error.message}`)));
    req.end(payload);
  });
}

/** The Engine API's error message of an answer (`{"message": …}`), or its status. */
function engineError(answer: EngineAnswer): string {
  try {
    const parsed = JSON.parse(answer.body.toString("utf8")) as { message?: unknown };
    if (typeof parsed.message === "string") return `${answer.status}: ${parsed.message}`;
  } catch {
    // not JSON
  }
  return `${answer.status}: ${answer.body.toString("utf8").slice(0, 300)}`;
}

/**
 * A container's output, demultiplexed: without a TTY the Engine API frames
 * stdout and stderr (8-byte headers: stream, 0, 0, 0, big-endian length).
 */
function demux(raw: Buffer): string {
  const parts: Buffer[] = [];
  let offset = 0;
  while (offset + 8 <= raw.length) {
    const stream = raw[offset];
    if ((stream !== 0 && stream !== 1 && stream !== 2) || raw[offset + 1] !== 0 || raw[offset + 2] !== 0 || raw[offset + 3] !== 0) {
      return raw.toString("utf8");
    }
    const length = raw.readUInt32BE(offset + 4);
    parts.push(raw.subarray(offset + 8, offset + 8 + length));
    offset += 8 + length;
  }
  return offset === 0 ? raw.toString("utf8") : Buffer.concat(parts).toString("utf8");
}

function checkStringRecord(name: string, value: unknown): void {
  if (value === undefined) return;
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new TypeError(`docker: ${name} must be an object of strings`);
  for (const [key, item] of Object.entries(value)) {
    if (typeof item !== "string") throw new TypeError(`docker: ${name}.${key} must be a string`);
  }
}

function checkStringArray(name: string, value: unknown): void {
  if (value === undefined) return;
  if (!Array.isArray(value) || value.some((item) => typeof item !== "string")) throw new TypeError(`docker: ${name} must be an array of strings`);
}

/**
 * A provider making one container per `SandboxAgent.start()` from
 * `options.image` (module doc). Also callable as `docker.cleanup({ fleet })`.
 *
 * @throws {TypeError} an option of the wrong type (`image` is required).
 * @throws {Error} `host`/`DOCKER_HOST` not a unix socket.
 */
export function docker(options: DockerOptions): DockerProvider {
  if (typeof options !== "object" || options === null) throw new TypeError("docker: options must be an object ({ image })");
  if (typeof options.image !== "string" || options.image === "") throw new TypeError("docker: options.image must be a non-empty string");
  checkStringRecord("options.env", options.env);
  checkStringRecord("options.labels", options.labels);
  checkStringArray("options.volumes", options.volumes);
  checkStringArray("options.cmd", options.cmd);
  for (const key of ["fleet", "host", "hostIp"] as const) {
    if (options[key] !== undefined && typeof options[key] !== "string") throw new TypeError(`docker: options.${key} must be a string`);
  }
  if (options.containerPort !== undefined && !Number.isInteger(options.containerPort)) throw new TypeError("docker: options.containerPort must be an integer");
  if (options.env !== undefined && "SANDBOX_AGENT_TOKEN" in options.env) {
    throw new TypeError("docker: options.env must not hold SANDBOX_AGENT_TOKEN (start() generates the token)");
  }
  const socket = socketPath(options.host);
  const port = `${options.containerPort ?? DEFAULT_CONTAINER_PORT}/tcp`;
  const hostIp = options.hostIp ?? "127.0.0.1";
  return {
    name: "docker",
    fleet: options.fleet,
    async create(request: SandboxCreateRequest): Promise<SandboxInstance> {
      const fleet = options.fleet ?? randomId();
      const name = `sandbox-agent-${fleet}-${randomId().slice(0, 8)}`;
      const fail = async (step: "create" | "start", message: string, id?: string): Promise<never> => {
        let logs = "";
        if (id !== undefined) {
          logs = await containerLogs(socket, id).catch(() => "");
          await remove(socket, id).catch(() => undefined);
        }
        throw new SandboxStartError(step, "docker", `${message} (container ${name}, image ${options.image})`, logs, request.token);
      };

      // Step create.
      const began = Date.now();
      const env = Object.entries(options.env ?? {}).map(([key, value]) => `${key}=${value}`);
      const body = {
        Image: options.image,
        ...(options.cmd === undefined ? {} : { Cmd: options.cmd }),
        Env: [...env, `SANDBOX_AGENT_TOKEN=${request.token}`],
        Labels: { ...options.labels, [FLEET_LABEL]: fleet, [MANAGED_LABEL]: "1" },
        ExposedPorts: { [port]: {} },
        HostConfig: {
          PortBindings: { [port]: [{ HostIp: hostIp, HostPort: "" }] },
          ...(options.volumes === undefined ? {} : { Binds: options.volumes }),
        },
      };
      let created: EngineAnswer;
      try {
        created = await engine(socket, "POST", `/containers/create?name=${encodeURIComponent(name)}`, body, request.signal);
      } catch (error) {
        return fail("create", error instanceof Error ? error.message : String(error));
      }
      if (created.status !== 201) return fail("create", `the engine refused to create the container (${engineError(created)})`);
      const id = (JSON.parse(created.body.toString("utf8")) as { Id: string }).Id;
      const createMs = Date.now() - began;

      // Step start: the server starts with the container; its port is known once started.
      const startBegan = Date.now();
      let baseUrl: string;
      let defaultCwd: string;
      try {
        const started = await engine(socket, "POST", `/containers/${id}/start`, undefined, request.signal);
        if (started.status !== 204 && started.status !== 304) return await fail("start", `the container did not start (${engineError(started)})`, id);
        const inspected = await engine(socket, "GET", `/containers/${id}/json`, undefined, request.signal);
        if (inspected.status !== 200) return await fail("start", `inspecting the container failed (${engineError(inspected)})`, id);
        const info = JSON.parse(inspected.body.toString("utf8")) as {
          State?: { Running?: boolean; ExitCode?: number };
          Config?: { WorkingDir?: string };
          NetworkSettings?: { Ports?: Record<string, { HostIp?: string; HostPort?: string }[] | null> };
        };
        const binding = info.NetworkSettings?.Ports?.[port]?.[0];
        if (binding?.HostPort === undefined || binding.HostPort === "") {
          const state = info.State?.Running === false ? `it exited with status ${info.State.ExitCode}` : "no published port";
          return await fail("start", `the container's port ${port} was not published: ${state}`, id);
        }
        const address = hostIp === "0.0.0.0" || hostIp === "" ? "127.0.0.1" : hostIp.includes(":") ? `[${hostIp}]` : hostIp;
        baseUrl = `http://${address}:${binding.HostPort}`;
        defaultCwd = info.Config?.WorkingDir || "/";
      } catch (error) {
        if (error instanceof SandboxStartError) throw error;
        return fail("start", error instanceof Error ? error.message : String(error), id);
      }
      const startMs = Date.now() - startBegan;

      let destroying: Promise<void> | undefined;
      return {
        id,
        baseUrl,
        defaultCwd,
        fleet,
        timings: { createMs, startMs },
        logs: () => containerLogs(socket, id),
        async running() {
          const inspected = await engine(socket, "GET", `/containers/${id}/json`);
          if (inspected.status !== 200) return false;
          return (JSON.parse(inspected.body.toString("utf8")) as { State?: { Running?: boolean } }).State?.Running === true;
        },
        destroy() {
          destroying ??= remove(socket, id);
          return destroying;
        },
      };
    },
  };
}

/** The last {@link LOG_TAIL} lines a container printed (stdout and stderr). */
async function containerLogs(socket: string, id: string): Promise<string> {
  const answer = await engine(socket, "GET", `/containers/${id}/logs?stdout=true&stderr=true&tail=${LOG_TAIL}`);
  if (answer.status !== 200) return "";
  return demux(answer.body).trim();
}

/** Removes a container (running or not) and its anonymous volumes; one already gone is fine. */
async function remove(socket: string, id: string): Promise<void> {
  const answer = await engine(socket, "DELETE", `/containers/${id}?force=true&v=true`);
  if (answer.status !== 204 && answer.status !== 200 && answer.status !== 404) {
    throw new Error(`docker: removing container ${id} failed (${engineError(answer)})`);
  }
}

/** Options of {@link cleanup}. */
export interface CleanupOptions {
  /** The fleet whose containers are removed (the `dev.sandboxagent.fleet` label). Required. */
  fleet: string;
  /** The Engine API's socket, as `docker({ host })`. */
  host?: string;
}

/**
 * Removes every container labelled with `fleet` (running or not, with
 * their anonymous volumes): what a client that crashed before
 * `destroySandbox()` left. Other fleets' containers, and containers this
 * provider did not make, are not touched.
 *
 * @returns the names of the containers removed.
 * @throws {TypeError} `fleet` not a non-empty string.
 * @throws {Error} the Engine API failed.
 */
export async function cleanup(options: CleanupOptions): Promise<CleanupResult> {
  if (typeof options !== "object" || options === null || typeof options.fleet !== "string" || options.fleet === "") {
    throw new TypeError("cleanup: options.fleet must be a non-empty string");
  }
  const socket = socketPath(options.host);
  const filters = encodeURIComponent(JSON.stringify({ label: [`${FLEET_LABEL}=${options.fleet}`, `${MANAGED_LABEL}=1`] }));
  const listed = await engine(socket, "GET", `/containers/json?all=true&filters=${filters}`);
  if (listed.status !== 200) throw new Error(`docker: listing fleet ${options.fleet}'s containers failed (${engineError(listed)})`);
  const containers = JSON.parse(listed.body.toString("utf8")) as { Id: string; Names?: string[]; Labels?: Record<string, string> }[];
  const removed: string[] = [];
  for (const container of containers) {
    // The engine filtered already; checked again so no other fleet is ever removed.
    if (container.Labels?.[FLEET_LABEL] !== options.fleet) continue;
    await remove(socket, container.Id);
    removed.push((container.Names?.[0] ?? container.Id).replace(/^\//, ""));
  }
  return { removed };
}

/**
 * The containers of a fleet, by name (running or not): what {@link cleanup}
 * would remove.
 *
 * @throws {TypeError} `fleet` not a non-empty string.
 */
export async function listFleet(options: CleanupOptions): Promise<string[]> {
  if (typeof options !== "object" || options === null || typeof options.fleet !== "string" || options.fleet === "") {
    throw new TypeError("listFleet: options.fleet must be a non-empty string");
  }
  const socket = socketPath(options.host);
  const filters = encodeURIComponent(JSON.stringify({ label: [`${FLEET_LABEL}=${options.fleet}`] }));
  const listed = await engine(socket, "GET", `/containers/json?all=true&filters=${filters}`);
  if (listed.status !== 200) throw new Error(`docker: listing fleet ${options.fleet}'s containers failed (${engineError(listed)})`);
  const containers = JSON.parse(listed.body.toString("utf8")) as { Id: string; Names?: string[]; Labels?: Record<string, string> }[];
  return containers.filter((c) => c.Labels?.[FLEET_LABEL] === options.fleet).map((c) => (c.Names?.[0] ?? c.Id).replace(/^\//, ""));
}

docker.cleanup = cleanup;
docker.list = listFleet;

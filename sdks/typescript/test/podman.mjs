// Containers for the sandbox-provider tests: podman's Docker-compatible
// service (`podman system service`) on a private unix socket, with this
// machine's settings (tests/v2_api/src/podman.rs: CONTAINERS_CONF with
// `[containers] default_ulimits = []` and `[engine] runtime = "runc"`),
// and the image `localhost/sandbox-agent:test` that scripts/test-image
// builds once per run ($SANDBOX_AGENT_TEST_IMAGE names another).
//
// Where podman cannot run at all, `podmanService()` returns `{ skip }`
// with one line saying why (the tests then skip); a missing image is an
// error (scripts/test builds it before the tests).
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const IMAGE = process.env.SANDBOX_AGENT_TEST_IMAGE ?? "localhost/sandbox-agent:test";

/**
 * Starts `podman system service --time=0 unix://SOCKET` in a temporary
 * directory. Returns `{ socket, host, conf, stop() }`, or `{ skip }`.
 */
export async function podmanService() {
  const dir = mkdtempSync(join(tmpdir(), "sa-ts-podman-"));
  const conf = join(dir, "containers.conf");
  writeFileSync(conf, '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n');
  const env = { ...process.env, CONTAINERS_CONF: conf };
  try {
    execFileSync("podman", ["info"], { env, stdio: ["ignore", "ignore", "pipe"] });
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    const why = error.code === "ENOENT" ? "podman is not installed (scripts/test installs podman runc)" : `\`podman info\` failed: ${String(error.stderr ?? error.message).trim()}`;
    return { skip: `sandbox provider container tests: not run: ${why}` };
  }
  try {
    execFileSync("podman", ["image", "exists", IMAGE], { env, stdio: "ignore" });
  } catch {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`the image ${IMAGE} is missing: scripts/test-image builds it (from the release tarball of scripts/dist)`);
  }
  const socket = join(dir, "podman.sock");
  const service = spawn("podman", ["system", "service", "--time=0", `unix://${socket}`], { env, stdio: ["ignore", "ignore", "pipe"], detached: false });
  let stderr = "";
  service.stderr.on("data", (chunk) => (stderr += chunk));
  const deadline = Date.now() + 20_000;
  while (!existsSync(socket)) {
    if (service.exitCode !== null || Date.now() > deadline) {
      service.kill("SIGKILL");
      throw new Error(`podman system service did not open ${socket}: ${stderr}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return {
    socket,
    host: `unix://${socket}`,
    conf,
    /** `podman ARGS…` with these settings: its stdout and stderr, together. */
    podman(args) {
      const run = spawnSync("podman", args, { env, encoding: "utf8" });
      if (run.status !== 0) throw new Error(`podman ${args.join(" ")}: ${run.status}: ${run.stderr}`);
      return `${run.stdout}${run.stderr}`.trim();
    },
    async stop() {
      if (service.exitCode === null) {
        const exited = new Promise((resolve) => service.once("exit", resolve));
        service.kill("SIGTERM");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** One Engine API GET over the socket: `{ status, json }`. */
export async function engineGet(socket, path) {
  const { request } = await import("node:http");
  return new Promise((resolve, reject) => {
    const req = request({ socketPath: socket, path: `/v1.41${path}` }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk) => (body += chunk));
      res.on("end", () => {
        let json;
        try {
          json = body ? JSON.parse(body) : undefined;
        } catch {
          json = body;
        }
        resolve({ status: res.statusCode, json });
      });
    });
    req.on("error", reject);
    req.end();
  });
}

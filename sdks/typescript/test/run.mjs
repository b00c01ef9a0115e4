// `npm test`'s runner: node --test over test/*.test.mjs, two files at a
// time. Node 20 has a WebSocket only behind --experimental-websocket
// (Node 22 has it built in); the flag reaches every test file's process.
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";

const dir = fileURLToPath(new URL(".", import.meta.url));
const files = readdirSync(dir)
  .filter((name) => name.endsWith(".test.mjs"))
  .sort()
  .map((name) => dir + name);
const flags = typeof WebSocket === "undefined" ? ["--experimental-websocket"] : [];
const run = spawnSync(process.execPath, [...flags, "--test", "--test-concurrency=2", ...files], { stdio: "inherit" });
process.exit(run.status ?? 1);

#!/usr/bin/env node
/**
 * The package's `sandbox-agent` command (`npx sandbox-agent server …`): finds
 * the binary as `sandbox-agent/node` does ({@link resolveBinary}: the
 * `SANDBOX_AGENT_BIN` variable, the platform package, the `PATH`) and runs
 * it with this command's arguments, stdin, stdout and stderr
 * (`research/contract.md`, "The npm packages"). Node cannot `exec`, so it
 * stays as the binary's parent: the signals a parent is sent (SIGINT,
 * SIGTERM, SIGHUP, SIGQUIT, SIGUSR2) are passed on, and it ends as the
 * binary ended, with its exit status or by the same signal.
 *
 * `npx` (npm 11) ends on SIGTERM without passing it on, leaving this
 * process and the server behind. So when npm started it (`npm_command` in
 * the environment: `npx`, `npm exec`, `npm run`), losing its parent counts
 * as SIGTERM; started otherwise (`node_modules/.bin/sandbox-agent &` from a
 * script that then exits), it runs on like the binary would.
 *
 * `SANDBOX_AGENT_NPM_DEBUG=1` prints the binary chosen and where it was
 * found on stderr first.
 */
import { spawn } from "node:child_process";
import { resolveBinary, VERSION_PROBE_VARIABLE, type ResolvedBinary } from "./node.js";

/** Signals passed on to the binary (SIGUSR1 is Node's inspector's). */
const FORWARDED: NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR2"];
/** How often the parent is looked at when npm started this process, in milliseconds. */
const PARENT_POLL_MS = 500;

/** The parent at start (npm's shell, when npm started this process). */
const parent = process.ppid;

if (process.env[VERSION_PROBE_VARIABLE]) {
  // Another launcher took this one for the binary (found on the PATH).
  process.stderr.write("this is the sandbox-agent npm package's launcher, not the binary\n");
  process.exit(1);
}

let binary: ResolvedBinary;
try {
  binary = await resolveBinary();
} catch (error) {
  process.stderr.write(`sandbox-agent (npm launcher): ${(error as Error).message}\n`);
  process.exit(1);
}
if (process.env["SANDBOX_AGENT_NPM_DEBUG"]) {
  process.stderr.write(`sandbox-agent (npm launcher): ${binary.path} (${binary.source}), version ${binary.version}\n`);
}

const child = spawn(binary.path, process.argv.slice(2), { stdio: "inherit" });
const forward = (signal: NodeJS.Signals): void => {
  child.kill(signal);
};
for (const signal of FORWARDED) process.on(signal, forward);
const orphaned = process.env["npm_command"]
  ? setInterval(() => {
      if (process.ppid === parent) return;
      clearInterval(orphaned);
      child.kill("SIGTERM");
    }, PARENT_POLL_MS)
  : undefined;
orphaned?.unref();
child.once("error", (error) => {
  process.stderr.write(`sandbox-agent (npm launcher): cannot run ${binary.path}: ${error.message}\n`);
  process.exit(1);
});
child.once("exit", (code, signal) => {
  clearInterval(orphaned);
  for (const name of FORWARDED) process.off(name, forward);
  if (signal === null) process.exit(code ?? 1);
  // Ended by a signal: end the same way, so the caller sees it.
  process.kill(process.pid, signal);
  // A signal whose default action is not to end the process.
  setTimeout(() => process.exit(1), 1_000).unref();
});

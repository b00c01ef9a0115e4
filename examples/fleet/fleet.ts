/**
 * A fleet of sandboxes: N containers from the sandbox-agent image, one
 * prompt each to an agent, all streamed at once, then a table of what each
 * took, and every sandbox destroyed at the end, even when one failed.
 *
 *   node dist/fleet.js [N] [--image IMAGE] [--agent AGENT] [--fleet ID] [--fail INDEX]
 *
 * N defaults to 4, IMAGE to $SANDBOX_AGENT_IMAGE or `sandbox-agent`, AGENT
 * to `mock` (the built-in test agent; a real one needs its API key:
 * `docker({ image, env: { ANTHROPIC_API_KEY } })`). The Engine API socket
 * is $DOCKER_HOST (unix:// only) or the usual one. `--fail INDEX` makes
 * sandbox INDEX ask for an agent that does not exist (after its sandbox
 * started), to show that a failure still leaves nothing behind. Exits 1
 * when any sandbox failed. The table's columns, in ms since that sandbox's start():
 * create (the container made), healthy (its server answered /v2/health),
 * first (the first streamed update), end (the end of the turn).
 */
import { SandboxAgent } from "sandbox-agent";
import { docker } from "sandbox-agent/docker";
import { randomUUID } from "node:crypto";

/** One sandbox's outcome. */
interface Row {
  index: number;
  create?: number;
  healthy?: number;
  first?: number;
  end?: number;
  stopReason?: string;
  updates: number;
  error?: string;
}

interface Args {
  count: number;
  image: string;
  agent: string;
  fleet: string;
  fail: number | undefined;
}

function parseArgs(argv: string[]): Args {
  let fail: number | undefined;
  let count = 4;
  let image = process.env["SANDBOX_AGENT_IMAGE"] ?? "sandbox-agent";
  let agent = "mock";
  let fleet = `fleet-${randomUUID().slice(0, 8)}`;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const value = (): string => {
      const next = argv[++i];
      if (next === undefined) throw new Error(`${arg} needs a value`);
      return next;
    };
    if (arg === "--image") image = value();
    else if (arg === "--agent") agent = value();
    else if (arg === "--fleet") fleet = value();
    else if (arg === "--fail") fail = Number(value());
    else if (/^\d+$/.test(arg) && Number(arg) > 0) count = Number(arg);
    else throw new Error(`unknown argument ${JSON.stringify(arg)} (usage: fleet.js [N] [--image IMAGE] [--agent AGENT] [--fleet ID] [--fail INDEX])`);
  }
  return { count, image, agent, fleet, fail };
}

async function runOne(index: number, image: string, agent: string, fleet: string, started: SandboxAgent[]): Promise<Row> {
  const row: Row = { index, updates: 0 };
  const t0 = performance.now();
  const since = (): number => Math.round(performance.now() - t0);
  try {
    const sdk = await SandboxAgent.start({ sandbox: docker({ image, fleet }) });
    started.push(sdk);
    row.healthy = since();
    const timings = sdk.sandbox?.timings;
    row.create = timings?.createMs;
    const session = await sdk.createSession({ agent, metadata: { fleet, index } });
    const turn = session.promptStream(`sandbox ${index}: say hello`);
    for await (const _update of turn) {
      row.first ??= since();
      row.updates++;
    }
    row.stopReason = (await turn.result).stopReason;
    row.end = since();
  } catch (error) {
    row.error = error instanceof Error ? error.message.split("\n")[0] : String(error);
  }
  return row;
}

function table(rows: Row[]): string {
  const header = ["#", "create", "healthy", "first", "end", "updates", "result"];
  const cells = rows.map((r) => [
    String(r.index),
    ...[r.create, r.healthy, r.first, r.end].map((v) => (v === undefined ? "-" : String(v))),
    String(r.updates),
    r.error === undefined ? (r.stopReason ?? "-") : `FAILED: ${r.error}`,
  ]);
  const widths = header.map((h, c) => Math.max(h.length, ...cells.map((row) => row[c]!.length)));
  const line = (row: string[]): string => row.map((cell, c) => (c === row.length - 1 ? cell : cell.padStart(widths[c]!))).join("  ");
  return [line(header), ...cells.map(line)].join("\n");
}

async function main(): Promise<number> {
  const { count, image, agent, fleet, fail } = parseArgs(process.argv.slice(2));
  console.log(`fleet ${fleet}: ${count} sandboxes from ${image}, agent ${agent}`);
  const started: SandboxAgent[] = [];
  const t0 = performance.now();
  let rows: Row[] = [];
  try {
    rows = await Promise.all(Array.from({ length: count }, (_, i) => runOne(i, image, i === fail ? "no-such-agent" : agent, fleet, started)));
  } finally {
    // Every sandbox goes, whatever happened above.
    const destroyed = await Promise.allSettled(started.map((sdk) => sdk.destroySandbox()));
    const failed = destroyed.filter((d) => d.status === "rejected");
    if (failed.length > 0) console.error(`${failed.length} sandboxes could not be destroyed; run docker.cleanup({ fleet: "${fleet}" })`);
  }
  console.log(table(rows));
  const failures = rows.filter((r) => r.error !== undefined || r.stopReason !== "end_turn").length;
  console.log(`${count - failures}/${count} sandboxes answered in ${Math.round(performance.now() - t0)} ms; all ${started.length} started were destroyed`);
  return failures === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error instanceof Error ? error.message : error);
    process.exit(2);
  },
);

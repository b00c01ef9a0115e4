// A client that starts sandboxes and is then killed (sandbox.test.mjs,
// "a client killed mid-run"): starts argv[3] sandboxes of fleet argv[2]
// through the socket argv[4], prints "ready" and waits to be killed.
import { SandboxAgent } from "sandbox-agent";
import { docker } from "sandbox-agent/docker";

const [fleet, count, host, image] = process.argv.slice(2);
const sdks = await Promise.all(
  Array.from({ length: Number(count) }, () => SandboxAgent.start({ sandbox: docker({ image, fleet, host }), agent: "mock" })),
);
const sessions = await Promise.all(sdks.map((sdk) => sdk.createSession()));
// A turn is running when the kill comes.
for (const session of sessions) void session.prompt("still working").catch(() => undefined);
console.log("ready");
setInterval(() => undefined, 60_000);

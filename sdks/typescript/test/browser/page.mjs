// Runs in headless Chromium (test/browser.test.mjs): the packages' default
// entries, loaded as plain ES modules through an import map with no
// bundler, against a real server. Sets `window.__report` when done.
import { SandboxAgent, SandboxAgentClient, SandboxAgentError } from "sandbox-agent";

const params = new URL(location.href).searchParams;
const server = params.get("server");
const dir = params.get("dir");
const token = params.get("token");
const report = {};

function textOf(updates) {
  return updates
    .filter((u) => u.sessionUpdate === "agent_message_chunk" && u.content.type === "text")
    .map((u) => u.content.text)
    .join("");
}

async function collect(turn) {
  const updates = [];
  for await (const update of turn) updates.push(update);
  return updates;
}

/** A fetch whose first event stream breaks once `marker` went through (as in the Node tests). */
function cuttingFetch(marker) {
  let gets = 0;
  return async (input, init) => {
    if (init?.method !== "GET" || !String(input).endsWith("/v2/rpc")) return fetch(input, init);
    gets++;
    const response = await fetch(input, init);
    if (gets !== 1) return response;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let seen = "";
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        controller.enqueue(value);
        seen += decoder.decode(value, { stream: true });
        if (seen.includes(marker) && seen.endsWith("\n\n")) {
          await reader.cancel();
          controller.error(new TypeError("network cut by the test"));
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

try {
  const asked = [];
  const anonymous = new SandboxAgentClient({ baseUrl: server, agent: "mock", autoConnect: false });
  try {
    await anonymous.listAgents();
  } catch (error) {
    report.unauthorized = error.isUnauthorized();
  }
  const client = new SandboxAgentClient({
    baseUrl: server,
    token,
    agent: "mock",
    onQuestion: (question) => ({ action: "accept", content: { name: "Browser", color: "blue", confirm: false } }),
    onPermissionRequest: (request) => {
      asked.push(request.toolCall.title);
      return "allow";
    },
  });
  report.health = (await client.getHealth()).status;
  const session = await client.newSession({ cwd: dir, metadata: { from: "browser" } });
  const turn = client.promptStream(session.sessionId, "ask permission");
  report.permissionText = textOf(await collect(turn));
  report.stopReason = (await turn.result).stopReason;
  report.asked = asked;
  report.metadata = (await client.getSession(session.sessionId)).metadata;

  await client.writeFsFile(`${dir}/from-browser.txt`, "written by a browser");
  report.file = new TextDecoder().decode(await client.readFsFile(`${dir}/from-browser.txt`));
  report.entries = (await client.listFsEntries(dir)).entries.map((e) => e.name);

  // Seed 001's shapes work here too; start() (a server from the binary) is refused at once.
  const seed = await SandboxAgent.connect({ baseUrl: server, token, agent: "mock" });
  await seed.mkdirFs({ path: `${dir}/seed` });
  report.seedEntries = (await seed.listFsEntries({ path: dir })).map((e) => `${e.name}:${e.entryType}`);
  try {
    await SandboxAgent.start({ agent: "mock" });
  } catch (error) {
    report.startError = error.message;
  }
  await seed.dispose();

  try {
    await client.getSession("nope");
  } catch (error) {
    report.notFound = error instanceof SandboxAgentError && error.isNotFound() && error.status === 404;
  }

  report.questionText = textOf(await collect(client.promptStream(session.sessionId, "ask question")));

  const run = await client.runProcess({ command: "sh", args: ["-c", "echo from a process"] });
  report.process = `${run.exitCode}:${run.stdout}`;

  // The browser's own WebSocket, the token as ?access_token=.
  const ws = new SandboxAgentClient({
    baseUrl: server,
    token,
    agent: "mock",
    transport: "websocket",
    onPermissionRequest: () => "reject",
  });
  const wsSession = await ws.newSession({ cwd: dir });
  report.websocketText = textOf(await collect(ws.promptStream(wsSession.sessionId, "ask permission")));
  await ws.dispose();

  const cut = new SandboxAgentClient({ baseUrl: server, token, agent: "mock", fetch: cuttingFetch("chunk-2 ") });
  const cutSession = await cut.newSession({ cwd: dir });
  report.resumedText = textOf(await collect(cut.promptStream(cutSession.sessionId, "!slow 5 40")));

  await Promise.all([client.dispose(), cut.dispose()]);
} catch (error) {
  report.error = String(error?.stack ?? error);
}
window.__report = report;

// Processes in the sandbox through SandboxAgentClient (no agent connection).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ProcessHandle, SandboxAgentClient, chunkBytes } from "sandbox-agent";
import { startServer } from "./server.mjs";

async function outputOf(handle, options) {
  const events = [];
  for await (const event of handle.output(options)) events.push(event);
  const text = events
    .filter((e) => e.type === "chunk")
    .map((e) => new TextDecoder().decode(chunkBytes(e.chunk)))
    .join("");
  return { events, text, exit: events.at(-1) };
}

describe("processes", () => {
  let server;
  let client;
  before(async () => {
    server = await startServer();
    client = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", autoConnect: false });
  });
  after(async () => {
    await client?.dispose();
    await server?.stop();
  });

  test("runProcess: exit code and both streams", async () => {
    const result = await client.runProcess({ command: "sh", args: ["-c", "echo out; echo err >&2; exit 3"] });
    assert.equal(result.exitCode, 3);
    assert.equal(result.stdout, "out\n");
    assert.equal(result.stderr, "err\n");
    assert.equal(result.timedOut, false);
    await assert.rejects(client.runProcess({ command: "no-such-program-xyz" }), (e) => e.status === 400 && e.problem.type === "urn:sandbox-agent:error:program-not-found");
  });

  test("startProcess: output followed to the exit; list, get, forget", async () => {
    const handle = await client.startProcess({ command: "sh", args: ["-c", "for i in 1 2 3; do echo line$i; sleep 0.05; done"], title: "lines" });
    assert.ok(handle instanceof ProcessHandle);
    assert.match(handle.id, /^[0-9a-f]{32}$/);
    const { text, exit } = await outputOf(handle);
    assert.equal(text, "line1\nline2\nline3\n");
    assert.deepEqual(exit, { type: "exit", exitCode: 0, signal: null });
    assert.deepEqual(await handle.wait(), { exitCode: 0, signal: null });
    const info = await client.getProcess(handle.id);
    assert.equal(info.state, "exited");
    assert.equal(info.outputBytes, 18);
    const { processes } = await client.listProcesses({ state: "exited" });
    assert.ok(processes.some((p) => p.id === handle.id && p.title === "lines"));
    // From an offset: only what follows it.
    assert.equal((await outputOf(await client.processHandle(handle.id), { offset: 6 })).text, "line2\nline3\n");
    await handle.forget();
    await assert.rejects(client.getProcess(handle.id), (e) => e.isNotFound());
  });

  test("a followed output cut midway resumes with no byte lost or repeated", async () => {
    let gets = 0;
    const cutting = async (input, init) => {
      if (!String(input).includes("/output")) return fetch(input, init);
      gets++;
      const response = await fetch(input, init);
      if (gets !== 1) return response;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let seen = "";
      return new Response(
        new ReadableStream({
          async pull(controller) {
            const { value, done } = await reader.read();
            if (done) return controller.close();
            controller.enqueue(value);
            seen += decoder.decode(value, { stream: true });
            if (seen.includes("n3") && seen.endsWith("\n\n")) {
              await reader.cancel();
              controller.error(new TypeError("network cut by the test"));
            }
          },
        }),
        { status: response.status, headers: response.headers },
      );
    };
    const cutClient = new SandboxAgentClient({ baseUrl: server.url, agent: "mock", autoConnect: false, fetch: cutting });
    const handle = await cutClient.startProcess({ command: "sh", args: ["-c", "for i in 1 2 3 4 5 6; do echo n$i; sleep 0.05; done"] });
    const { text, exit } = await outputOf(handle);
    assert.equal(text, "n1\nn2\nn3\nn4\nn5\nn6\n");
    assert.equal(exit.exitCode, 0);
    assert.ok(gets >= 2, `reopened (${gets} GETs)`);
  });

  test("a terminal over a WebSocket: keys in, output out, resize, exit; a late terminal sees the screen so far", async () => {
    const shell = await client.startProcess({ command: "sh", tty: true, cols: 80, rows: 24, env: { PS1: "$ " } });
    const terminal = await shell.terminal();
    const decoder = new TextDecoder();
    let screen = "";
    const events = terminal[Symbol.asyncIterator]();
    async function until(text) {
      while (!screen.includes(text)) {
        const { value, done } = await events.next();
        assert.ok(!done, `the terminal ended before ${JSON.stringify(text)}; screen: ${JSON.stringify(screen)}`);
        if (value.type === "data") screen += decoder.decode(value.bytes, { stream: true });
        if (value.type === "exit") return value;
      }
    }
    terminal.write("echo hi-$((40+2))\n");
    await until("hi-42");
    terminal.resize(100, 40);
    terminal.write("stty size\n");
    await until("40 100");
    // A second terminal from offset 0 gets everything so far.
    const late = await shell.terminal();
    let lateScreen = "";
    for await (const event of late) {
      if (event.type === "data") lateScreen += decoder.decode(event.bytes, { stream: true });
      if (lateScreen.includes("40 100")) break;
    }
    assert.match(lateScreen, /hi-42/);
    late.close();
    terminal.write("exit 7\n");
    let exit;
    for (;;) {
      const { value, done } = await events.next();
      if (done) break;
      if (value.type === "exit") exit = value;
    }
    assert.deepEqual(exit, { type: "exit", exitCode: 7, signal: null });
    assert.ok(terminal.offset > 0);

    // Without a terminal: a resize is an error frame and the socket stays open.
    const cat = await client.startProcess({ command: "cat" });
    const pipe = await cat.terminal();
    pipe.resize(10, 10);
    pipe.write("piped\n");
    pipe.eof();
    const seen = [];
    for await (const event of pipe) seen.push(event);
    const error = seen.find((e) => e.type === "error");
    assert.equal(error.problem.type, "urn:sandbox-agent:error:not-a-tty");
    assert.equal(seen.filter((e) => e.type === "data").map((e) => decoder.decode(e.bytes)).join(""), "piped\n");
    assert.equal(seen.at(-1).type, "exit");

    // A refused handshake says why: the process was forgotten (404).
    const gone = await client.startProcess({ command: "true" });
    await gone.wait();
    await gone.forget();
    await assert.rejects(gone.terminal(), (e) => e.isNotFound());
  });

  test("stdin, signals and a terminal's size", async () => {
    const cat = await client.startProcess({ command: "cat" });
    await cat.writeStdin("hello ");
    await cat.writeStdin(new TextEncoder().encode("stdin"));
    await cat.closeStdin();
    assert.equal((await outputOf(cat)).text, "hello stdin");

    const sleeper = await client.startProcess({ command: "sleep", args: ["30"] });
    await sleeper.kill();
    assert.deepEqual(await sleeper.wait(), { exitCode: null, signal: "SIGKILL" });
    await assert.rejects(sleeper.signal("TERM"), (e) => e.status === 409);

    const tty = await client.startProcess({ command: "sh", args: ["-c", "sleep 0.5; stty size"], tty: true, cols: 80, rows: 24 });
    await tty.resize(100, 40);
    const { text, events } = await outputOf(tty);
    assert.match(text, /40 100/);
    assert.ok(events.filter((e) => e.type === "chunk").every((e) => e.chunk.stream === "tty"));
  });

  test("a handle's and a terminal's wrong argument types are TypeErrors naming the call and the parameter; the process is untouched", async () => {
    const shell = await client.startProcess({ command: "sh", tty: true, cols: 80, rows: 24 });
    const wrong = [
      [() => shell.writeStdin({ text: "hi" }), /^ProcessHandle\.writeStdin: data must be a string or a Uint8Array \(got an object\)$/],
      [() => shell.writeStdin("hi", { eof: "yes" }), /^ProcessHandle\.writeStdin: options\.eof must be a boolean/],
      [() => shell.signal(9), /^ProcessHandle\.signal: name must be a string \(got a number\)$/],
      [() => shell.resize("100", 40), /^ProcessHandle\.resize: cols must be a finite number \(got a string\)$/],
      [() => shell.terminal({ offset: "0" }), /^ProcessHandle\.terminal: options\.offset must be a finite number/],
      [() => shell.output({ offset: "0" }).next(), /^ProcessHandle\.output: options\.offset must be a finite number/],
    ];
    for (const [call, message] of wrong) await assert.rejects(call, { name: "TypeError", message });
    const terminal = await shell.terminal();
    assert.throws(() => terminal.write(42), { name: "TypeError", message: /^ProcessTerminal\.write: data must be a string or a Uint8Array \(got a number\)$/ });
    assert.throws(() => terminal.resize(100), { name: "TypeError", message: /^ProcessTerminal\.resize: rows must be a finite number \(got undefined\)$/ });
    // No resize reached the process: its terminal is still 24 rows by 80 columns.
    terminal.write("stty size\n");
    let screen = "";
    for await (const event of terminal) {
      if (event.type === "data") screen += new TextDecoder().decode(event.bytes);
      if (/^24 80\r?$/m.test(screen) || event.type === "exit") break;
    }
    assert.match(screen, /^24 80\r?$/m);
    assert.equal((await shell.refresh()).state, "running");
    terminal.close();
    await shell.kill();
  });
});

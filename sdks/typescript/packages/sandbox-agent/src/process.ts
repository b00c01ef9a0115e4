/**
 * Processes in the sandbox (`research/contract.md`, "Processes and
 * terminals"): run to completion, or start and follow the output, which
 * resumes by byte offset after a cut, so every byte the server still holds
 * is delivered exactly once.
 */
import { parseSse } from "acp-http-client";
import { SandboxAgentError } from "./error.js";
import { check, checkFields } from "./check.js";

/** What to run: an argv program (never a shell line; use `sh -c` for one). */
export interface ProcessRequest {
  /** The program: a name looked up on the `PATH`, or a path. */
  command: string;
  /** Its arguments. */
  args?: string[];
  /** Working directory (relative ones start at the session's `cwd`). */
  cwd?: string;
  /** Variables set on top of the server's environment. */
  env?: Record<string, string>;
  /** Text written to stdin first (a run then closes stdin). */
  stdin?: string;
  /** The session the process belongs to. */
  sessionId?: string;
}

/** {@link ProcessRequest} for `runProcess`. */
export interface RunProcessRequest extends ProcessRequest {
  /** Kill the process after this many milliseconds. */
  timeoutMs?: number;
  /** Keep at most this many bytes of each stream. */
  maxOutputBytes?: number;
}

/** {@link ProcessRequest} for `startProcess`. */
export interface StartProcessRequest extends ProcessRequest {
  /** Run on a pseudo-terminal (stdout and stderr are then one stream, `tty`). */
  tty?: boolean;
  /** Terminal columns (with `tty`), default 80. */
  cols?: number;
  /** Terminal rows (with `tty`), default 24. */
  rows?: number;
  /** A name to show in lists. */
  title?: string;
}

/** What `runProcess` returns. */
export interface RunResult {
  /** The exit code, `null` when a signal ended it. */
  exitCode: number | null;
  /** The signal that ended it (`"SIGKILL"`), if one did. */
  signal: string | null;
  /** Text, or base64 when `stdoutEncoding` is `"base64"`. */
  stdout: string;
  /** Text, or base64 when `stderrEncoding` is `"base64"`. */
  stderr: string;
  /** Set when stdout was not UTF-8. */
  stdoutEncoding?: "base64";
  /** Set when stderr was not UTF-8. */
  stderrEncoding?: "base64";
  /** Output past `maxOutputBytes` was left out. */
  truncated: boolean;
  /** `timeoutMs` passed and the process was killed. */
  timedOut: boolean;
  /** How long it ran, in milliseconds. */
  durationMs: number;
}

/** A process as the server describes it. */
export interface ProcessInfo {
  /** 32 hex digits. */
  id: string;
  /** The program's process id (`null` until seen). */
  pid: number | null;
  /** The program as asked. */
  command: string;
  /** Its arguments. */
  args: string[];
  /** The real path it runs in. */
  cwd: string;
  /** It runs on a pseudo-terminal. */
  tty: boolean;
  /** The start's `title`. */
  title: string | null;
  /** The session it belongs to. */
  sessionId: string | null;
  /** The agent's tool call that names it (an agent's terminal). */
  toolCallId: string | null;
  /** `running` or `exited`. */
  state: "running" | "exited";
  /** The exit code once it exited (`null` when a signal ended it). */
  exitCode: number | null;
  /** The signal that ended it (`"SIGKILL"`). */
  signal: string | null;
  /** RFC 3339 UTC. */
  startedAt: string;
  /** RFC 3339 UTC, once it exited. */
  endedAt: string | null;
  /** Bytes written so far (the offset of the next byte). */
  outputBytes: number;
}

/** One read of a process's output. */
export interface OutputChunk {
  /** Byte offset of its first byte in the process's output (all streams in one sequence). */
  offset: number;
  /** Which stream (`tty`: a terminal's one stream). */
  stream: "stdout" | "stderr" | "tty";
  /** The bytes as text, or base64 when `encoding` is `"base64"`. */
  data: string;
  /** Set when the bytes were not UTF-8. */
  encoding?: "base64";
}

/** An item of {@link ProcessHandle.output}. */
export type OutputEvent =
  | { type: "chunk"; chunk: OutputChunk }
  /** The server no longer held `dropped` bytes from `offset`; output resumes at `nextOffset`. */
  | { type: "dropped"; offset: number; nextOffset: number; dropped: number }
  /** The process exited; always the last item. */
  | { type: "exit"; exitCode: number | null; signal: string | null };

/** The bytes of a chunk (text encoded as UTF-8, base64 decoded). */
export function chunkBytes(chunk: OutputChunk): Uint8Array {
  if (chunk.encoding !== "base64") return new TextEncoder().encode(chunk.data);
  const binary = atob(chunk.data);
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

/** Plain HTTP as the client does it (auth, problems, timeouts): the client's own helper. */
export type HttpCall = (
  method: string,
  path: string,
  request?: { query?: Record<string, string | number | boolean | undefined>; json?: unknown; body?: string | Uint8Array; contentType?: string; headers?: Record<string, string>; signal?: AbortSignal; noTimeout?: boolean },
) => Promise<Response>;

/** Opens a WebSocket on a server path (the client adds the base URL and `?access_token=`). */
export type SocketOpener = (path: string, query: Record<string, string>) => WebSocket;

/** An item of a {@link ProcessTerminal}. */
export type TerminalEvent =
  /** Output bytes as they are (a frame may end inside a UTF-8 character). */
  | { type: "data"; bytes: Uint8Array }
  | { type: "dropped"; offset: number; nextOffset: number; dropped: number }
  /** The process exited; the last item. */
  | { type: "exit"; exitCode: number | null; signal: string | null }
  /** A request of this client failed (a resize without a terminal, stdin after it closed, …); the socket stays open. */
  | { type: "error"; problem: Record<string, unknown> };

/**
 * A terminal attached to a process over a WebSocket (`research/contract.md`,
 * "Terminal WebSocket"): iterate it for the output (and `exit`, last),
 * `write` keys, `resize`, `eof`. Closing it leaves the process running.
 * Bytes are counted in `offset`, so a new terminal from `offset` resumes
 * exactly.
 */
export class ProcessTerminal implements AsyncIterable<TerminalEvent> {
  readonly #socket: WebSocket;
  readonly #queue: TerminalEvent[] = [];
  #wake: (() => void) | undefined;
  #ended: SandboxAgentError | true | undefined;
  #offset: number;

  /** @internal Made by {@link ProcessHandle.terminal}. */
  constructor(socket: WebSocket, offset: number) {
    this.#socket = socket;
    this.#offset = offset;
    socket.binaryType = "arraybuffer";
    socket.onmessage = (event: MessageEvent) => {
      if (typeof event.data === "string") {
        let frame: Record<string, unknown>;
        try {
          frame = JSON.parse(event.data) as Record<string, unknown>;
        } catch {
          return;
        }
        if (frame["type"] === "dropped") {
          this.#offset = Number(frame["nextOffset"]);
          this.#push(frame as unknown as TerminalEvent);
        } else if (frame["type"] === "exit") {
          this.#push({ type: "exit", exitCode: frame["exitCode"] as number | null, signal: frame["signal"] as string | null });
        } else if (frame["type"] === "error") {
          this.#push({ type: "error", problem: frame["problem"] as Record<string, unknown> });
        }
        return;
      }
      const bytes = new Uint8Array(event.data as ArrayBuffer);
      this.#offset += bytes.length;
      this.#push({ type: "data", bytes });
    };
    socket.onclose = (event: CloseEvent) => {
      this.#ended ??=
        event.code === 1000
          ? true
          : new SandboxAgentError("connection-lost", `the terminal WebSocket closed (${event.code}${event.reason ? `: ${event.reason}` : ""})`);
      this.#wake?.();
    };
  }

  /** The byte offset after the output received so far (resume a new terminal from it). */
  get offset(): number {
    return this.#offset;
  }

  /** Sends keys (stdin bytes; text is sent as UTF-8). @throws {TypeError} `data` neither a string nor a `Uint8Array`. */
  write(data: string | Uint8Array): void {
    check("ProcessTerminal.write", "data", data, "chunk");
    this.#socket.send(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  /** Resizes the terminal (`cols` and `rows` 1 to 4096). @throws {TypeError} `cols` or `rows` not a number. */
  resize(cols: number, rows: number): void {
    check("ProcessTerminal.resize", "cols", cols, "number");
    check("ProcessTerminal.resize", "rows", rows, "number");
    this.#socket.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  /** Closes stdin (on a terminal: `^D`). */
  eof(): void {
    this.#socket.send(JSON.stringify({ type: "eof" }));
  }

  /** Detaches (close frame 1000); the process keeps running. */
  close(): void {
    this.#ended ??= true;
    this.#socket.close(1000);
    this.#wake?.();
  }

  #push(event: TerminalEvent): void {
    this.#queue.push(event);
    this.#wake?.();
  }

  /** The terminal's events until `exit`, or until the socket closes (an error unless it closed normally). */
  async *[Symbol.asyncIterator](): AsyncGenerator<TerminalEvent, void, undefined> {
    for (;;) {
      const next = this.#queue.shift();
      if (next !== undefined) {
        yield next;
        if (next.type === "exit") return;
        continue;
      }
      if (this.#ended !== undefined) {
        if (this.#ended !== true) throw this.#ended;
        return;
      }
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = undefined;
    }
  }
}

/** Reopen delays of a followed output: 50 ms doubling to 2 s; 8 failures in a row end it. */
const REOPEN_FIRST_MS = 50;
const REOPEN_MAX_MS = 2_000;
const REOPEN_ATTEMPTS = 8;

/** A started (or listed) process. Dropping it leaves the process running. */
export class ProcessHandle {
  /** The process id. */
  readonly id: string;
  /** The process as it was when this handle was made. */
  readonly started: ProcessInfo;
  readonly #http: HttpCall;
  readonly #openSocket: SocketOpener;

  /** @internal Made by `SandboxAgentClient.startProcess` and `processHandle`. */
  constructor(info: ProcessInfo, http: HttpCall, openSocket: SocketOpener) {
    this.id = info.id;
    this.started = info;
    this.#http = http;
    this.#openSocket = openSocket;
  }

  /**
   * Attaches a terminal over a WebSocket, its output from byte `offset`
   * (default 0: everything the server still holds, so a late client sees
   * the screen so far). Any number may attach to one process.
   *
   * @throws {SandboxAgentError} `connection-lost` when the socket does not open
   *   (a wrong token, an unknown process: the handshake is refused).
   */
  async terminal(options: { offset?: number } = {}): Promise<ProcessTerminal> {
    checkFields("ProcessHandle.terminal", "options", options, { offset: "number?" });
    const offset = options.offset ?? 0;
    const socket = this.#openSocket(this.#path("/terminal"), { offset: String(offset) });
    const opened = await new Promise<boolean>((resolve) => {
      socket.onopen = () => resolve(true);
      socket.onerror = () => resolve(false);
      socket.onclose = () => resolve(false);
    });
    if (!opened) {
      // Why: the same path without an upgrade answers the handshake's status.
      try {
        const response = await this.#http("GET", this.#path());
        await response.body?.cancel();
      } catch (error) {
        throw SandboxAgentError.from(error);
      }
      throw new SandboxAgentError("connection-lost", `the terminal WebSocket of process ${this.id} did not open`);
    }
    socket.onerror = null;
    return new ProcessTerminal(socket, offset);
  }

  #path(suffix = ""): string {
    return `/v2/processes/${encodeURIComponent(this.id)}${suffix}`;
  }

  /** The process as it is now. */
  async refresh(): Promise<ProcessInfo> {
    return (await this.#http("GET", this.#path())).json() as Promise<ProcessInfo>;
  }

  /**
   * Follows the output from byte `offset` (default 0) until the process
   * exits: chunks, `dropped` markers, then `exit` (always last). A cut
   * stream is reopened from the last offset handed out (50 ms doubling to
   * 2 s; 8 failures in a row with nothing between them end it with the
   * error), so no byte is lost or repeated. An HTTP error (404 once the
   * process was forgotten) ends it at once.
   */
  async *output(options: { offset?: number; signal?: AbortSignal } = {}): AsyncGenerator<OutputEvent, void, undefined> {
    checkFields("ProcessHandle.output", "options", options, { offset: "number?", signal: "signal?" });
    let resumeAt = options.offset ?? 0;
    let failures = 0;
    for (;;) {
      let response: Response | undefined;
      let lastError: unknown;
      try {
        response = await this.#http("GET", this.#path("/output"), {
          query: { offset: resumeAt },
          headers: { accept: "text/event-stream", "last-event-id": String(resumeAt) },
          ...(options.signal === undefined ? {} : { signal: options.signal }),
          noTimeout: true,
        });
      } catch (error) {
        if (!(error instanceof SandboxAgentError) || error.kind !== "connection-lost") throw error;
        lastError = error;
      }
      if (response?.body) {
        try {
          for await (const event of parseSse(response.body)) {
            failures = 0;
            const data: unknown = JSON.parse(event.data);
            if (event.event === "exit") {
              const exit = data as { exitCode: number | null; signal: string | null };
              yield { type: "exit", exitCode: exit.exitCode, signal: exit.signal };
              return;
            }
            if (event.event === "dropped") {
              const d = data as { offset: number; nextOffset: number; dropped: number };
              resumeAt = Math.max(resumeAt, d.nextOffset);
              yield { type: "dropped", offset: d.offset, nextOffset: d.nextOffset, dropped: d.dropped };
              continue;
            }
            const end = Number(event.id);
            if (Number.isSafeInteger(end)) {
              if (end <= resumeAt) continue; // handed out already
              resumeAt = end;
            }
            yield { type: "chunk", chunk: data as OutputChunk };
          }
        } catch (error) {
          if (options.signal?.aborted) throw new SandboxAgentError("aborted", "process output: aborted", { cause: error });
          lastError = error;
        } finally {
          await response.body.cancel().catch(() => undefined);
        }
      }
      failures++;
      if (failures > REOPEN_ATTEMPTS) {
        throw SandboxAgentError.from(
          lastError ?? new SandboxAgentError("connection-lost", "process output: the stream kept ending before the exit"),
        );
      }
      const delay = Math.min(REOPEN_FIRST_MS * 2 ** (failures - 1), REOPEN_MAX_MS);
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }

  /** Writes to stdin (streamed as sent); `eof: true` closes stdin after it. @throws {TypeError} `data` neither a string nor a `Uint8Array`. */
  async writeStdin(data: string | Uint8Array, options: { eof?: boolean } = {}): Promise<void> {
    check("ProcessHandle.writeStdin", "data", data, "chunk");
    checkFields("ProcessHandle.writeStdin", "options", options, { eof: "boolean?" });
    const response = await this.#http("POST", this.#path("/input"), {
      ...(options.eof ? { query: { eof: true } } : {}),
      body: data,
      contentType: "application/octet-stream",
    });
    await response.body?.cancel();
  }

  /** Closes stdin (on a terminal: sends `^D`). */
  closeStdin(): Promise<void> {
    return this.writeStdin("", { eof: true });
  }

  /** Sends a signal by name (`"SIGINT"`, `"TERM"`, …). @throws {TypeError} `name` not a string. */
  async signal(name: string): Promise<void> {
    check("ProcessHandle.signal", "name", name, "string");
    const response = await this.#http("POST", this.#path("/signal"), { json: { signal: name } });
    await response.body?.cancel();
  }

  /** `SIGKILL`: kills the whole process tree. */
  kill(): Promise<void> {
    return this.signal("SIGKILL");
  }

  /** Resizes the terminal (`cols` and `rows` 1 to 4096). @throws {TypeError} `cols` or `rows` not a number. */
  async resize(cols: number, rows: number): Promise<void> {
    check("ProcessHandle.resize", "cols", cols, "number");
    check("ProcessHandle.resize", "rows", rows, "number");
    const response = await this.#http("POST", this.#path("/resize"), { json: { cols, rows } });
    await response.body?.cancel();
  }

  /** Waits for the exit (following the output from its current end). */
  async wait(): Promise<{ exitCode: number | null; signal: string | null }> {
    const now = await this.refresh();
    if (now.state === "exited") return { exitCode: now.exitCode, signal: now.signal };
    for await (const event of this.output({ offset: now.outputBytes })) {
      if (event.type === "exit") return { exitCode: event.exitCode, signal: event.signal };
    }
    throw new SandboxAgentError("invalid-response", "process output ended without an exit");
  }

  /** Forgets the process (`DELETE`; a running one's tree is killed first). */
  async forget(): Promise<void> {
    const response = await this.#http("DELETE", this.#path());
    await response.body?.cancel();
  }
}

/**
 * The shapes `SandboxAgentClient` takes and returns. ACP values (session
 * updates, content, permission options) are `@agentclientprotocol/sdk`'s
 * schema types; the server's own shapes are in `research/contract.md`
 * ("Extension methods and control plane", "Host file system").
 */
import type {
  CancelNotification,
  ContentBlock,
  CreateElicitationRequest,
  CreateElicitationResponse,
  McpServer,
  NewSessionResponse,
  PromptRequest,
  PromptResponse,
  RequestPermissionRequest,
  SessionNotification,
  SessionUpdate,
  StopReason,
} from "@agentclientprotocol/sdk";

export type { CancelNotification, ContentBlock, McpServer, PromptRequest, PromptResponse, SessionUpdate, StopReason };

/** One session update with the session it belongs to (`session/update` params). */
export type SessionUpdateEvent = SessionNotification;

/**
 * The agent asks to run a tool: `sessionId`, the `toolCall` (title, kind,
 * status, …) and the `options` it offers (`optionId`, `name`, `kind`:
 * `allow_once`, `allow_always`, `reject_once`, `reject_always`).
 */
export type PermissionRequest = RequestPermissionRequest;

/**
 * An answer to a {@link PermissionRequest}: `"allow"` picks the first
 * `allow_once` option (else `allow_always`), `"allow-always"` the first
 * `allow_always`, `"reject"` the first `reject_once` (else `reject_always`),
 * `"reject-always"` the first `reject_always`; `{optionId}` picks that
 * option; `"cancel"`, or a kind the request does not offer, answers
 * cancelled (the turn then usually ends with stop reason `cancelled`).
 */
export type PermissionDecision = "allow" | "allow-always" | "reject" | "reject-always" | "cancel" | { optionId: string };

/** Decides permission requests (may be async; a throw counts as `"cancel"`). */
export type PermissionHandler = (request: PermissionRequest) => PermissionDecision | Promise<PermissionDecision>;

/**
 * The agent asks the person a question (ACP elicitation): `message`, and
 * either a form (`mode: "form"`, `requestedSchema`: the fields) or a URL to
 * open (`mode: "url"`, `url`, `elicitationId`); `sessionId` says which
 * session asks.
 */
export type QuestionRequest = CreateElicitationRequest;

/**
 * An answer to a {@link QuestionRequest}: `{action: "accept", content:
 * {field: value, …}}` (a URL question takes no content), `{action:
 * "decline"}` or `{action: "cancel"}`. The agent checks the content.
 */
export type QuestionAnswer = CreateElicitationResponse;

/** Answers questions (may be async; a throw counts as `{action: "cancel"}`). */
export type QuestionHandler = (question: QuestionRequest) => QuestionAnswer | Promise<QuestionAnswer>;

/** Options of `new SandboxAgentClient(...)` (seed 001's constructor, plus the transport). */
export interface SandboxAgentClientOptions {
  /** The server's root URL, e.g. `http://127.0.0.1:2468`. */
  baseUrl: string;
  /** Bearer token of a server started with `--token`. */
  token?: string;
  /** The agent id every session of this client runs on (`mock`, `claude`, `codex`, …). */
  agent: string;
  /**
   * Open the connection at construction (default `true`); calls made
   * meanwhile wait for it. `false`: call {@link SandboxAgentClient.connect}
   * first (session calls before it fail with kind `not-connected`).
   */
  autoConnect?: boolean;
  /** Every session update of every session of this client, in order. */
  onSessionUpdate?: (event: SessionUpdateEvent) => void;
  /**
   * A turn its server stopped in (`_sandboxagent/turn/interrupted`), when
   * the connection hears it: in the history an attach replays. In an
   * events page read it with `turnInterruptedOf`.
   */
  onTurnInterrupted?: (event: TurnInterrupted) => void;
  /** Answers the agent's permission requests; without it they are answered cancelled. */
  onPermissionRequest?: PermissionHandler;
  /**
   * Answers the agent's questions (forms and URLs to open). With it the
   * client declares that it answers them; without it the server answers
   * every question `cancel` for this client. An `accept` whose content does
   * not fit the form is sent as `cancel`: check it with `checkAnswer`
   * first to ask again.
   */
  onQuestion?: QuestionHandler;
  /** Extra headers for every request. */
  headers?: Record<string, string>;
  /** The `fetch` to use; default the global one. */
  fetch?: typeof fetch;
  /**
   * How session calls travel: `"http"` (default), `/v2/rpc` with its event
   * stream, resumed after a cut with nothing lost; or `"websocket"`, one
   * WebSocket on `/acp` (lower latency; a dropped socket ends the connection
   * and what was in flight on it; `headers` do not apply, the token goes in
   * `?access_token=`). Plain HTTP calls (health, agents, inventory, files)
   * use `fetch` either way.
   */
  transport?: "http" | "websocket";
  /** The `WebSocket` constructor for `transport: "websocket"`; default the global one (Node 20: `--experimental-websocket`). */
  WebSocket?: typeof WebSocket;
  /**
   * Time limit of each call in milliseconds: of each session call until its
   * answer, of each plain HTTP call until the answer's head (a download's
   * body may take longer). A prompt turn has none: turns can take many
   * minutes. None by default.
   */
  requestTimeoutMs?: number;
}

/**
 * One session as the server's inventory knows it. The server's own keys
 * (`agent`, timestamps, `ended`, …) are fields; `metadata` holds the keys
 * the caller stored with `newSession({metadata})` or `setMetadata`.
 */
export interface SessionSummary {
  /** The session's id (the agent's). */
  sessionId: string;
  /** The agent id the session runs on. */
  agent: string | undefined;
  /** The working directory given at creation. */
  cwd: string | undefined;
  /** The title the agent or `setMetadata` gave it. */
  title: string | undefined;
  /** RFC 3339, UTC, milliseconds. */
  createdAt: string | undefined;
  /** RFC 3339, UTC, milliseconds; bumped by every recorded message. */
  updatedAt: string | undefined;
  /** The session ended (terminated, or its agent process exited). */
  ended: boolean;
  /** Restored from the server's store and not loaded since. */
  dormant: boolean;
  /** Messages recorded in the session's event log. */
  eventCount: number | undefined;
  /** The current model id, when known. */
  model: string | undefined;
  /** The current mode id, when known. */
  mode: string | undefined;
  /** The first prompt's text (at most 200 characters), once there was one. */
  firstPrompt: string | undefined;
  /** The caller's own metadata keys (`labels`, `variant`, …). */
  metadata: Record<string, unknown>;
}

/** What {@link SandboxAgentClient.newSession} and `loadSession` return: the summary plus the agent's modes and options. */
export interface SessionDetails extends SessionSummary {
  /** The agent's session modes (`currentModeId`, `availableModes`), if it has any. */
  modes: NewSessionResponse["modes"];
  /** The agent's configuration options (the model selector, …), if it has any. */
  configOptions: NewSessionResponse["configOptions"];
}

/**
 * Parameters of {@link SandboxAgentClient.newSession}: ACP's
 * `NewSessionRequest` (seed 001's client passed that object as is) with
 * `mcpServers` optional, plus `metadata`.
 */
export interface NewSessionOptions {
  /** Working directory of the session (absolute). */
  cwd: string;
  /** MCP servers the agent should connect to; default none. */
  mcpServers?: McpServer[];
  /** Metadata stored with the session (a JSON object of at most 64 KiB). */
  metadata?: Record<string, unknown>;
  /** ACP's `_meta`, sent as given; its `"sandboxagent.dev"` object is merged with `metadata`. */
  _meta?: Record<string, unknown> | null;
  /** Any other `session/new` field (`additionalDirectories`, …) is sent to the agent as given. */
  [field: string]: unknown;
}

/**
 * The object form of {@link SandboxAgentClient.loadSession}: ACP's
 * `LoadSessionRequest` with `mcpServers` optional.
 */
export interface LoadSessionRequest {
  /** The session to take up. */
  sessionId: string;
  /** Its working directory (absolute). */
  cwd: string;
  /** MCP servers the agent should connect to; default none. */
  mcpServers?: McpServer[];
  /** Any other `session/load` field is sent to the agent as given. */
  [field: string]: unknown;
}

/** How a prompt turn ended. */
export interface PromptResult {
  /** `end_turn`, `cancelled`, `max_tokens`, `max_turn_requests` or `refusal`. */
  stopReason: StopReason;
}

/** One page of sessions. */
export interface SessionPage {
  /** Newest first. */
  sessions: SessionSummary[];
  /** Pass it as `cursor` for the next page; absent on the last page. */
  nextCursor?: string;
}

/** Filters of {@link SandboxAgentClient.listSessions} (`GET /v2/sessions`). */
export interface ListSessionsQuery {
  /** Entries per page, 1 to 1000 (default 100). */
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string;
  /** Only this agent's sessions; default all agents. */
  agent?: string;
  /** `live`, `dormant` or `ended`. */
  state?: "live" | "dormant" | "ended";
  /** Only sessions whose title contains this text. */
  q?: string;
}

/** One message of a session's event log. */
export interface SessionEvent {
  /** Position in the log, from 0; never reused. */
  offset: number;
  /** RFC 3339 time it was recorded. */
  at: string;
  /** Who sent it. */
  direction: "client_to_agent" | "agent_to_client";
  /** The JSON-RPC message as the client sees it. */
  message: Record<string, unknown>;
}

/**
 * A prompt turn that was running when its server stopped
 * (`_sandboxagent/turn/interrupted`, `research/contract.md`,
 * "Notifications the runtime sends"): recorded in the session's log when
 * the server starts again. The turn ended without an answer, as if with
 * stop reason `cancelled`; the agent requests named in `requestIds` can
 * no longer be answered (a UI greys them out).
 */
export interface TurnInterrupted {
  /** The session. */
  sessionId: string;
  /** Why: `"server-stopped"`. */
  reason: "server-stopped";
  /** Always `"cancelled"`. */
  stopReason: StopReason;
  /** The client's JSON-RPC id of the `session/prompt` that got no answer. */
  promptId: string | number | null;
  /** The agent's ids of its requests left unanswered, oldest first. */
  requestIds: Array<string | number>;
}

/** One page of a session's event log. */
export interface SessionEventPage {
  /** Oldest first. */
  events: SessionEvent[];
  /** The offset to ask for next. */
  nextOffset: number;
}

/** `GET /v2/health` (`research/contract.md`, "`GET /v2/health`"). */
export interface Health {
  /** `ok` while the server serves. */
  status: string;
  /** The server's version. */
  version: string;
  /** The store's and memory budget's figures (see the contract). */
  [key: string]: unknown;
}

/** One configured agent (`GET /v2/agents`). */
export interface AgentInfo {
  /** The agent id (`mock`, `claude`, …), as `agent` in the client's options. */
  id: string;
  /** A name for a person. */
  name: string;
  /** Ready to start without an install. */
  installed: boolean;
  /** The installed (or running) version, when known. */
  version?: string;
  /** Where it comes from: `builtin`, `registry` or `fallback`. */
  source: "builtin" | "registry" | "fallback" | string;
  /** Its program. */
  path?: string;
  /** A process of it is running. */
  running: boolean;
  /** That process's id. */
  pid?: number;
  /** Process starts after the first. */
  restarts: number;
  /** Why its last start or process failed. */
  lastError?: string;
  /**
   * Environment variables the agent reads itself as its credential, with no
   * auth method to match (`["ANTHROPIC_API_KEY"]` for `claude`); names only.
   */
  credentialEnv?: string[];
  /** Capabilities, agent info, models, modes and auth, when known. */
  [key: string]: unknown;
}

/** What {@link SandboxAgentClient.installAgent} returns. */
export interface AgentInstallResult {
  /** The agent id. */
  agent: string;
  /** The version now active. */
  version?: string;
  /** `builtin`, `registry` or `fallback`. */
  source: string;
  /** Its program. */
  path?: string;
  /** Nothing had to be installed. */
  alreadyInstalled: boolean;
  /** How long the install took, in milliseconds. */
  durationMs: number;
}

/** Models of a session or an agent. */
export interface ModelList {
  /** The models the agent reported. */
  availableModels: { modelId: string; name?: string; description?: string }[];
  /** The session's current model (absent for an agent's list). */
  currentModelId?: string;
}

/** One file system entry ("Host file system"). */
export interface FsEntry {
  /** The entry's name in its directory. */
  name: string;
  /** Absolute path. */
  path: string;
  /** Bytes; 0 for directories. */
  size: number;
  /** What it is (a symlink to something inside the root is reported as its target). */
  entryType: "file" | "directory" | "symlink";
  /** RFC 3339 UTC, or `null`. */
  modified: string | null;
  /** A symlink's text. */
  symlinkTarget?: string;
  /** `entry_type` (the seed-era spelling), `rawName` for a name that is not UTF-8. */
  [key: string]: unknown;
}

/** Options of the file calls: relative paths start at this session's `cwd`. */
export interface FsOptions {
  sessionId?: string;
}

/**
 * The object form of the one-path file calls (seed 001's client):
 * `readFsFile({path, sessionId?})`, `statFs`, `mkdirFs`, `writeFsFile`.
 */
export interface FsPathRequest extends FsOptions {
  /** Absolute, or relative to the session's `cwd` (else the server's working directory). */
  path: string;
}

/** `listFsEntries({path?, sessionId?})`: default path `.`. */
export interface FsListRequest extends FsOptions {
  path?: string;
}

/** `deleteFsEntry({path, recursive?, sessionId?})`. */
export interface FsDeleteRequest extends FsPathRequest {
  /** Delete a non-empty directory with what it holds. */
  recursive?: boolean;
}

/** `moveFs({from, to, overwrite?, sessionId?})`. */
export interface FsMoveRequest extends FsOptions {
  from: string;
  to: string;
  /** Replace an entry at `to`. */
  overwrite?: boolean;
}

/** The query of `uploadFsBatch(archive, {path, sessionId?, gzip?})`: `path` is the directory to unpack into. */
export interface FsUploadQuery extends FsPathRequest {
  /** The archive is gzip-compressed; default: guessed from its first bytes when it is a `Uint8Array`. */
  gzip?: boolean;
}

/** `readFsFileStream({path, sessionId?, from?, etag?})`. */
export interface FsReadStreamRequest extends FsPathRequest {
  /** A byte offset to resume from. */
  from?: number;
  /** The `etag` of the earlier download `from` continues. */
  etag?: string;
}

/** What a file can be written from: text (sent as UTF-8) or bytes, whole or streamed. */
export type FsBody = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

/** A tar archive (gzip-compressed or not), whole or streamed. */
export type FsArchive = Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

/** What `readFsFileStream` returns. */
export interface FsFileStream {
  /** The body. */
  stream: ReadableStream<Uint8Array>;
  /** Where its first byte belongs in the file: `from` when only the rest came, else 0. */
  offset: number;
  /** The file's size in bytes, when the server said. */
  size: number | undefined;
  /** The file's `ETag`, to resume a later download with. */
  etag: string | undefined;
}

/**
 * What `listFsEntries({path})` returns (seed 001's shape): the entries,
 * sorted by name, as an array; `truncated` is `true` when the directory
 * held more than the server lists.
 */
export type FsEntryList = FsEntry[] & { truncated: boolean };

/**
 * Options of `startEmbeddedServer` (`sandbox-agent/node`) and of the
 * `server` field of {@link SandboxAgentStartOptions}.
 */
export interface EmbeddedServerOptions {
  /**
   * The `sandbox-agent` binary: default `$SANDBOX_AGENT_BIN` (which must
   * exist when set), else the platform package's, else `sandbox-agent` on
   * the `PATH` (`resolveBinary`).
   */
  binary?: string;
  /** Extra `sandbox-agent server` arguments (`--data-dir DIR`, `--fs-root DIR`, …). */
  args?: string[];
  /** How long start-up may take, in milliseconds; default 15,000. */
  startupTimeoutMs?: number;
  /** How long `stop()` waits after SIGTERM before SIGKILL, in milliseconds; default 5,000. */
  shutdownGraceMs?: number;
  /**
   * The server's logs (stderr): `"keep"` (default) keeps the last 200
   * lines for `EmbeddedServer.logs` and start-up errors; `"inherit"`
   * writes them to this process's stderr.
   */
  logs?: "keep" | "inherit";
}

/**
 * Options of `SandboxAgentClient.start()` / `SandboxAgent.start()` (Node.js
 * only): the client's options without `baseUrl` and `token`, which come
 * from the private server it starts, plus that server's options.
 */
export interface SandboxAgentStartOptions extends Omit<SandboxAgentClientOptions, "baseUrl" | "token"> {
  /** How to start the private server (`startEmbeddedServer`'s options). */
  server?: EmbeddedServerOptions;
}

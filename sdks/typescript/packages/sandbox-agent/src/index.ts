/**
 * `sandbox-agent`: `SandboxAgentClient`, a client of a sandbox-agent server
 * (`research/contract.md`, "The TypeScript packages").
 *
 * Layout:
 * - `client.ts`: {@link SandboxAgentClient}: connection, sessions, prompt turns, permissions,
 *   agents, files, each call in seed 001's object form and a positional one;
 * - `agent.ts`: {@link SandboxAgent} (seed 001's entry class, and
 *   `start({ sandbox })`, `createSession`, `destroySandbox`);
 * - `sandbox.ts`: the sandbox provider interface and its errors;
 * - `check.ts`: the run-time argument checks every public call makes;
 * - `forms.ts`: each call's two argument forms (seed 001's request
 *   objects, positional), told apart and checked;
 * - `turn.ts`: {@link PromptTurn}, a turn read as an async iterator;
 * - `process.ts`: {@link ProcessHandle}, processes in the sandbox and their
 *   output followed by offset;
 * - `error.ts`: {@link SandboxAgentError} and its predicates;
 * - `question.ts`: {@link checkAnswer}, an answer checked against its form;
 * - `types.ts`: the shapes it takes and returns;
 * - `meta.ts`: the server's `_meta["sandboxagent.dev"]` read into fields.
 *
 * This entry is browser-safe: it imports no Node built-in (fetch, streams,
 * `AbortController` and `TextDecoder` only).
 */
export { SandboxAgentClient, CLIENT_VERSION } from "./client.js";
export { SandboxAgent, Session } from "./agent.js";
export type { CreateSessionOptions, SandboxConnectOptions, SandboxInfo, SandboxStartOptions } from "./agent.js";
export { SandboxStartError, generateToken, randomId, waitHealthy } from "./sandbox.js";
export type { SandboxCreateRequest, SandboxInstance, SandboxProvider, SandboxStep, SandboxTimings } from "./sandbox.js";
export type { CallOptions, PromptOptions } from "./client.js";
export { PromptTurn } from "./turn.js";
export { ProcessHandle, ProcessTerminal, chunkBytes } from "./process.js";
export type {
  OutputChunk,
  OutputEvent,
  ProcessInfo,
  ProcessRequest,
  RunProcessRequest,
  RunResult,
  StartProcessRequest,
  TerminalEvent,
} from "./process.js";
export { SandboxAgentError } from "./error.js";
export { checkAnswer } from "./question.js";
export { turnInterruptedOf } from "./meta.js";
export type { SandboxAgentErrorKind } from "./error.js";
export type * from "./types.js";

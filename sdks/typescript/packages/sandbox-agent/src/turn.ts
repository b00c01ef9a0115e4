/**
 * `PromptTurn`: one prompt turn, read as an async iterator of its session
 * updates, with the turn's outcome in `result`.
 */
import type { SessionUpdate } from "@agentclientprotocol/sdk";
import type { SandboxAgentError } from "./error.js";
import type { PromptResult } from "./types.js";

/**
 * A running prompt turn. `for await (const update of turn)` yields the
 * turn's session updates in order (text chunks, tool calls, plans, …) and
 * ends when the turn ends; it throws the turn's error if it failed.
 * `result` resolves with the stop reason. Every update the iterator yields
 * has arrived before `result` resolves (the transport holds the answer until
 * the stream delivered what the agent sent before it).
 */
export class PromptTurn implements AsyncIterable<SessionUpdate> {
  /** The session this turn runs in. */
  readonly sessionId: string;
  /** Resolves with the stop reason when the turn ends; rejects with a `SandboxAgentError`. */
  readonly result: Promise<PromptResult>;
  readonly #queue: SessionUpdate[] = [];
  #wake: (() => void) | undefined;
  #finished = false;
  #error: SandboxAgentError | undefined;
  #iterating = false;
  readonly #cancel: () => Promise<void>;

  /** @internal Made by `SandboxAgentClient.promptStream`. */
  constructor(sessionId: string, run: (turn: PromptTurn) => Promise<PromptResult>, cancel: () => Promise<void>) {
    this.sessionId = sessionId;
    this.#cancel = cancel;
    this.result = run(this).then(
      (result) => {
        this.#end(undefined);
        return result;
      },
      (error: SandboxAgentError) => {
        this.#end(error);
        throw error;
      },
    );
    // A caller that only iterates still sees the error there.
    this.result.catch(() => undefined);
  }

  /** Asks the agent to stop the turn (`result` then has stop reason `cancelled`). */
  cancel(): Promise<void> {
    return this.#cancel();
  }

  /** @internal Called by the client for each update of this session. */
  push(update: SessionUpdate): void {
    if (this.#finished) return;
    this.#queue.push(update);
    this.#wake?.();
  }

  #end(error: SandboxAgentError | undefined): void {
    this.#finished = true;
    this.#error = error;
    this.#wake?.();
  }

  /** The updates of this turn; one iteration per turn. */
  async *[Symbol.asyncIterator](): AsyncGenerator<SessionUpdate, void, undefined> {
    if (this.#iterating) throw new Error("a PromptTurn can be iterated once");
    this.#iterating = true;
    for (;;) {
      const next = this.#queue.shift();
      if (next !== undefined) {
        yield next;
        continue;
      }
      if (this.#finished) {
        if (this.#error !== undefined) throw this.#error;
        return;
      }
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = undefined;
    }
  }
}

/**
 * A Server-Sent Events parser over a fetch body (WHATWG HTML, "Server-sent
 * events", "Event stream interpretation"), using only `TextDecoder` and
 * `ReadableStream`, so it runs in Node 20+, Bun and browsers.
 */

/** One dispatched event. */
export interface SseEvent {
  /** The `id:` field of this event, or `undefined` when it had none. */
  id: string | undefined;
  /** The `event:` field; `"message"` when absent. */
  event: string;
  /** The `data:` lines joined by `\n`. */
  data: string;
}

/**
 * Yields the events of an SSE body in order. Comment lines (`: heartbeat`)
 * are skipped; an event without `data` is not dispatched. The generator ends
 * when the body ends and throws when reading it fails (a cut stream).
 *
 * Unlike `EventSource`, `id` is reported per event rather than carried over,
 * so a caller can tell events without an `id:` line (which must not move its
 * resume point) from those with one.
 */
export async function* parseSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data: string[] = [];
  let id: string | undefined;
  let event = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let start = 0;
      for (;;) {
        const lineEnd = findLineEnd(buffer, start);
        if (lineEnd === undefined) break;
        const line = buffer.slice(start, lineEnd.index);
        start = lineEnd.next;
        if (line === "") {
          if (data.length > 0) {
            yield { id, event: event || "message", data: data.join("\n") };
          }
          data = [];
          id = undefined;
          event = "";
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") data.push(value);
        else if (field === "id") id = value;
        else if (field === "event") event = value;
      }
      buffer = buffer.slice(start);
      if (done) return;
    }
  } finally {
    reader.releaseLock();
  }
}

/** The end of the next line at or after `from` (CRLF, LF or CR), if complete. */
function findLineEnd(text: string, from: number): { index: number; next: number } | undefined {
  for (let i = from; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 10) return { index: i, next: i + 1 };
    if (c === 13) {
      // A CR at the very end may be the first half of a CRLF: wait for more.
      if (i + 1 === text.length) return undefined;
      return { index: i, next: text.charCodeAt(i + 1) === 10 ? i + 2 : i + 1 };
    }
  }
  return undefined;
}

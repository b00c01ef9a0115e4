// Server-Sent Events read with fetch (an EventSource cannot send the token):
// the ACP connection's stream and a process's output both come this way.

/** One SSE event of a frame's lines: `{event, id, data}` (`event` is
 * "message" unless named, `id` a string or null); null for a frame without
 * data, such as a heartbeat comment. */
function parseSseFrame(frame) {
  let event = "message";
  let id = null;
  const data = [];
  for (const line of frame.split(/\r?\n/)) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "id") id = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event, id, data: data.join("\n") } : null;
}

/** Reads an SSE body to its end, calling `onEvent` with each event. */
export async function readSse(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const event = parseSseFrame(frame);
      if (event) onEvent(event);
    }
  }
}

// One process of the process API as the page names and writes it: its API
// path, its argv read from and written as a command line, how it ended.

export function processPath(id, rest = "") {
  return `/v2/processes/${encodeURIComponent(id)}${rest}`;
}

/** Splits a command line into argv as a shell splits words, expanding
 * nothing (the server runs an argv, never a shell line): blanks separate,
 * '…' keeps every character, "…" keeps every character but \" and \\, and
 * outside quotes \ keeps the next character. Throws on an open quote. */
export function splitArgv(line) {
  const words = [];
  let word = null; // null between words; "" is an empty quoted word
  let quote = null;
  for (let i = 0; i < line.length; i += 1) {
    const c = line[i];
    if (quote === "'") {
      if (c === "'") quote = null;
      else word += c;
    } else if (quote === '"') {
      if (c === '"') quote = null;
      else if (c === "\\" && (line[i + 1] === '"' || line[i + 1] === "\\")) {
        i += 1;
        word += line[i];
      } else word += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      word = word ?? "";
    } else if (c === "\\") {
      i += 1;
      if (i < line.length) word = (word ?? "") + line[i];
    } else if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else {
      word = (word ?? "") + c;
    }
  }
  if (quote) throw new Error(`a ${quote} quote is not closed`);
  if (word !== null) words.push(word);
  return words;
}

/** A process's argv as one line a shell (and splitArgv) reads back. */
export function commandLine(process) {
  const quoted = (word) => (/^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`);
  return [process.command, ...(process.args || [])].map(quoted).join(" ");
}

/** How a process ended: `exit code N`, `ended by SIGNAL`, or "" while it runs. */
export function exitText({ exitCode, signal }) {
  if (signal) return `ended by ${signal}`;
  return exitCode === null || exitCode === undefined ? "" : `exit code ${exitCode}`;
}

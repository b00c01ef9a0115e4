// README.md's fenced blocks, for the tests that run its examples as written.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const readmePath = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "README.md");

/**
 * The fenced blocks after the line `heading` of README.md, up to the next
 * heading of the same or a higher level (`### npm` ends at the next `###`,
 * `##` or `#`), as `{lang, text}` (`lang` is `""` for a bare fence).
 */
export function blocksAfter(heading) {
  const lines = readFileSync(readmePath, "utf8").split("\n");
  const start = lines.indexOf(heading);
  assert.ok(start >= 0, `README.md has no heading ${heading}`);
  const level = heading.match(/^#+/)[0].length;
  const ends = (line) => {
    const marks = line.match(/^#+ /);
    return marks !== null && marks[0].length - 1 <= level;
  };
  const blocks = [];
  for (let i = start + 1; i < lines.length && !ends(lines[i]); i++) {
    if (!lines[i].startsWith("```")) continue;
    const end = lines.indexOf("```", i + 1);
    blocks.push({ lang: lines[i].slice(3), text: lines.slice(i + 1, end).join("\n") + "\n" });
    i = end;
  }
  return blocks;
}

/**
 * Checks an answer to an agent's question (ACP elicitation) against its
 * form before it is sent, by the rules the Rust SDK applies
 * (`research/contract.md`, "The SDK and `sandbox-agent prompt`",
 * "Questions"): every required field present (a `null` counts as left
 * out), no field the form lacks, each value of its field's type (string,
 * number, integer, boolean, array of strings), a string's length in
 * characters within `minLength`/`maxLength` and its value among `enum` /
 * `oneOf`, a number within `minimum`/`maximum`, an array's items among its
 * choices and their count within `minItems`/`maxItems`. `pattern` and
 * `format` are left to the agent. A URL question takes no content.
 */
import type { QuestionAnswer, QuestionRequest } from "./types.js";

/**
 * What is wrong with `answer` for `question`, e.g. `field "name" must be at
 * least 1 character long (is 0)`; `undefined` when it fits (declines and
 * cancels always fit).
 */
export function checkAnswer(question: QuestionRequest, answer: QuestionAnswer): string | undefined {
  if (answer.action !== "accept") return undefined;
  const content = (answer as { content?: unknown }).content;
  const given = content === undefined || content === null ? {} : content;
  if (typeof given !== "object" || Array.isArray(given)) return "the content must be an object of field values";
  const values = Object.entries(given as Record<string, unknown>).filter(([, value]) => value !== null);
  if (question.mode === "url") {
    return values.length === 0 ? undefined : "a URL question takes no content";
  }
  if (question.mode !== "form") return undefined; // a future mode: the agent judges
  const schema = (question as { requestedSchema?: { properties?: Record<string, Record<string, unknown>>; required?: string[] | null } })
    .requestedSchema;
  const properties = schema?.properties ?? {};
  for (const [name] of values) {
    if (!(name in properties)) return `field "${name}" is not a field of the form`;
  }
  const byName = new Map(values);
  for (const name of schema?.required ?? []) {
    if (!byName.has(name)) return `field "${name}" is required`;
  }
  for (const [name, value] of values) {
    const problem = checkValue(properties[name] ?? {}, value);
    if (problem !== undefined) return `field "${name}" ${problem}`;
  }
  return undefined;
}

function checkValue(property: Record<string, unknown>, value: unknown): string | undefined {
  const num = (key: string): number | undefined => (typeof property[key] === "number" ? (property[key] as number) : undefined);
  switch (property["type"]) {
    case "string": {
      if (typeof value !== "string") return `must be a string, not ${JSON.stringify(value)}`;
      const length = [...value].length;
      const min = num("minLength");
      const max = num("maxLength");
      if (min !== undefined && length < min) return `must be at least ${min} character${min === 1 ? "" : "s"} long (is ${length})`;
      if (max !== undefined && length > max) return `must be at most ${max} character${max === 1 ? "" : "s"} long (is ${length})`;
      const allowed = choices(property["enum"], property["oneOf"]);
      if (allowed !== undefined && !allowed.includes(value)) return `must be one of ${quoted(allowed)}, not ${JSON.stringify(value)}`;
      return undefined;
    }
    case "number":
    case "integer": {
      const integer = property["type"] === "integer";
      if (typeof value !== "number" || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
        return `must be ${integer ? "an integer" : "a number"}, not ${JSON.stringify(value)}`;
      }
      const min = num("minimum");
      const max = num("maximum");
      if (min !== undefined && value < min) return `must be at least ${min} (is ${value})`;
      if (max !== undefined && value > max) return `must be at most ${max} (is ${value})`;
      return undefined;
    }
    case "boolean":
      return typeof value === "boolean" ? undefined : `must be true or false, not ${JSON.stringify(value)}`;
    case "array": {
      if (!Array.isArray(value) || !value.every((item) => typeof item === "string")) {
        return `must be an array of strings, not ${JSON.stringify(value)}`;
      }
      const items = (property["items"] ?? {}) as Record<string, unknown>;
      const allowed = choices(items["enum"], items["anyOf"]);
      const wrong = allowed === undefined ? undefined : value.find((item) => !allowed.includes(item));
      if (wrong !== undefined && allowed !== undefined) return `may only hold ${quoted(allowed)}, not ${JSON.stringify(wrong)}`;
      const min = num("minItems");
      const max = num("maxItems");
      if (min !== undefined && value.length < min) return `must hold at least ${min} (holds ${value.length})`;
      if (max !== undefined && value.length > max) return `must hold at most ${max} (holds ${value.length})`;
      return undefined;
    }
    default:
      return undefined; // a type this client does not know: the agent judges
  }
}

/** The allowed values of an `enum` (strings) or a `oneOf`/`anyOf` (`{const}` options). */
function choices(values: unknown, options: unknown): string[] | undefined {
  if (Array.isArray(values)) return values.filter((v): v is string => typeof v === "string");
  if (Array.isArray(options)) {
    return options
      .map((o) => (typeof o === "object" && o !== null ? (o as { const?: unknown }).const : undefined))
      .filter((v): v is string => typeof v === "string");
  }
  return undefined;
}

function quoted(values: string[]): string {
  return values.map((v) => JSON.stringify(v)).join(", ");
}

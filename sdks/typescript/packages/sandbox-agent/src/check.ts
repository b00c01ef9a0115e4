/**
 * Run-time checks of the arguments of every public call: JavaScript callers
 * have no compiler, and a wrong type must fail at once with a `TypeError`
 * naming the call and the parameter (`mkdirFs: path must be a string (got
 * an object)`), never become a request built from `"[object Object]"`
 * (`research/contract.md`, "The TypeScript packages").
 */

/** What a value must be; a trailing `?` also allows `undefined`. */
export type Spec = Kind | `${Kind}?`;

type Kind = keyof typeof KINDS;

/** Each kind: its test and how the error message names it. */
const KINDS = {
  string: [(v: unknown) => typeof v === "string", "a string"],
  number: [(v: unknown) => typeof v === "number" && Number.isFinite(v), "a finite number"],
  boolean: [(v: unknown) => typeof v === "boolean", "a boolean"],
  function: [(v: unknown) => typeof v === "function", "a function"],
  object: [isObject, "an object"],
  array: [Array.isArray, "an array"],
  signal: [(v: unknown) => typeof AbortSignal !== "undefined" && v instanceof AbortSignal, "an AbortSignal"],
  /** A request body: text or bytes, whole or streamed. */
  body: [(v: unknown) => typeof v === "string" || isBytes(v), "a string, Uint8Array, ArrayBuffer, Blob or ReadableStream"],
  /** Stdin or keys: text (sent as UTF-8) or bytes. */
  chunk: [(v: unknown) => typeof v === "string" || v instanceof Uint8Array, "a string or a Uint8Array"],
  /** An archive: bytes only (a string would be sent as UTF-8, never what a tar is). */
  bytes: [isBytes, "a Uint8Array, ArrayBuffer, Blob or ReadableStream"],
} as const satisfies Record<string, readonly [(v: unknown) => boolean, string]>;

/**
 * Throws `TypeError("<method>: <name> must be <kind> (got <what>)")` unless
 * `value` fits `spec`.
 */
export function check(method: string, name: string, value: unknown, spec: Spec): void {
  const optional = spec.endsWith("?");
  if (optional && value === undefined) return;
  const [test, said] = KINDS[(optional ? spec.slice(0, -1) : spec) as Kind];
  if (!test(value)) throw typeError(method, name, said, value);
}

/**
 * Checks that `value` is an object (or, with `optional`, `undefined`) and
 * each listed field fits its spec; fields are named `<name>.<field>`. Other
 * fields are not looked at.
 */
export function checkFields(
  method: string,
  name: string,
  value: unknown,
  fields: Readonly<Record<string, Spec>>,
  optional = false,
): void {
  if (optional && value === undefined) return;
  if (!isObject(value)) throw typeError(method, name, "an object", value);
  for (const [field, spec] of Object.entries(fields)) check(method, `${name}.${field}`, value[field], spec);
}

/** The per-call options every method takes last: `{signal?}`. */
export function checkCallOptions(method: string, options: unknown): void {
  checkFields(method, "options", options, { signal: "signal?" }, true);
}

/** A `TypeError` for a call given something that is neither of its forms. */
export function typeError(method: string, name: string, expected: string, value: unknown): TypeError {
  return new TypeError(`${method}: ${name} must be ${expected} (got ${describe(value)})`);
}

/** A plain object (not `null`, not an array). */
export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function isBytes(value: unknown): boolean {
  return (
    value instanceof Uint8Array ||
    value instanceof ArrayBuffer ||
    (typeof Blob !== "undefined" && value instanceof Blob) ||
    (typeof ReadableStream !== "undefined" && value instanceof ReadableStream)
  );
}

/** What a value is, for an error message (never its contents: it may be a secret). */
function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  const type = typeof value;
  if (type === "object") return "an object";
  if (type === "undefined") return "undefined";
  return /^[aeiou]/.test(type) ? `an ${type}` : `a ${type}`;
}

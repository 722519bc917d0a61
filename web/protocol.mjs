// The envelope check and the error-code table of py/exactspec/protocol.json, JS side (the Python
// side is protocol.py and errors.py). makeValidator(schema) is pure (tests run it in node);
// loadProtocol() fetches the one schema. Every error crossing a boundary is {code, message}.
export function makeValidator(schema) {
  const fields = schema.envelope;
  const isCount = (x) => Number.isInteger(x) && x >= 0;
  return function validateEnvelope(env) {
    const fail = (msg) => { throw codedError("E_PROTOCOL", msg); };
    if (env === null || typeof env !== "object" || Array.isArray(env)) fail(`envelope fields must be ${fields}`);
    const keys = Object.keys(env);
    if (keys.length !== fields.length || !fields.every((f) => keys.includes(f))) fail(`envelope fields must be ${fields}`);
    if (!(typeof env.kind === "string" && Object.hasOwn(schema.kinds, env.kind))) fail(`unknown message kind ${JSON.stringify(env.kind)}`);
    for (const key of ["seq", "epoch"]) if (!isCount(env[key])) fail(`${key} must be a non-negative integer`);
    if (typeof env.request_id !== "string" || env.payload === null || typeof env.payload !== "object" ||
        Array.isArray(env.payload)) fail("request_id must be a string and payload an object");
    const missing = schema.kinds[env.kind].filter((f) => !(f in env.payload));
    if (missing.length) fail(`${env.kind} payload lacks ${missing}`);
    return env;
  };
}

/** An Error whose message starts "E_CODE: " and whose .code is the code (Pyodide keeps the text). */
export function codedError(code, message) {
  return Object.assign(new Error(`${code}: ${message}`), { code, detail: message });
}

/** {code, message} of anything thrown: its .code, else a leading "E_CODE: " in its message, else
 *  `fallback`. `codes` (the table) limits which codes are believed. */
export function errorPayload(err, fallback = "E_INTERNAL", codes = null) {
  let text = String(err?.message ?? err ?? "").replace(/^(?:Error|JsException|PythonError): /, "");
  if (text.startsWith("Traceback (most recent call last)")) {   // a Python traceback: its last line says what
    const last = text.trim().split("\n").pop().trim();
    text = last.replace(/^(?:[\w.]+\.)?(?:ExactSpecError|JsException): /, "");
    if (!/^E_[A-Z_]+: /.test(text)) text = `python: ${last}`;
  }
  const known = (c) => typeof c === "string" && /^E_[A-Z_]+$/.test(c) && (!codes || Object.hasOwn(codes, c));
  const m = /^(E_[A-Z_]+): ?([\s\S]*)$/.exec(text);
  if (known(err?.code)) return { code: err.code, message: m && m[1] === err.code ? m[2] : (err.detail ?? text) };
  if (m && known(m[1])) return { code: m[1], message: m[2] };
  return { code: fallback, message: text.split("\n")[0] || "unknown failure" };
}

let schemaPromise = null;
/** The one schema (fetched once per realm) -> {validate, codes, schema}. */
export function loadSchema(url = new URL("../py/exactspec/protocol.json", import.meta.url).href) {
  schemaPromise ??= fetch(url).then(async (res) => {
    if (!res.ok) throw codedError("E_MODEL_LOAD", `${url}: HTTP ${res.status}`);
    const schema = await res.json();
    return { validate: makeValidator(schema), codes: schema.errors, schema };
  });
  return schemaPromise;
}

export async function loadProtocol(url) {
  return (await loadSchema(url)).validate;
}

// The envelope check, the generate request's type table and the error-code table of
// py/exactspec/core/protocol.json, JS side (the Python side is protocol.py and errors.py).
// makeValidator(schema) and makeRequestChecker(schema) are pure (tests run them in node);
// loadSchema() fetches the one schema. Every error crossing a boundary is {code, message}.
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

const TYPE_WORDS = { boolean: "true or false", integer: "an integer", number: "a finite number", string: "a string",
  strings: "a list of strings", token_ids: "a list of integer token ids", object: "an object or null" };

/** A value as the Python side names it (protocol.py _shown), so both say the same sentence. */
export function shown(v) {
  if (v === null || typeof v === "boolean" || typeof v === "string") return JSON.stringify(v);
  if (typeof v === "number") return String(v);
  if (v === undefined) return "undefined";
  if (Array.isArray(v)) return "a list";
  return typeof v === "function" ? "a function" : typeof v === "object" ? "an object" : `a ${typeof v}`;
}

/** Whether `v` is of a table type (protocol.py _typed has the same rules). */
function typed(kind, v) {
  const isIds = (x) => Array.isArray(x) && x.every(Number.isInteger);
  switch (kind) {
    case "boolean": return typeof v === "boolean";
    case "integer": return Number.isInteger(v);
    case "number": return Number.isFinite(v);
    case "string": return typeof v === "string";
    case "strings": return Array.isArray(v) && v.every((x) => typeof x === "string");
    case "token_ids": return isIds(v);
    case "object": return v === null || (typeof v === "object" && !Array.isArray(v));
    default: throw codedError("E_INTERNAL", `protocol.json: unknown option type ${kind}`);
  }
}

/** A conversation [{role, content}, ...] checked message by message (protocol.py checked_messages);
 *  `roles` from the table. Throws E_BAD_ARGUMENT naming the first bad message. */
function checkMessages(messages, roles, given) {
  const bad = (message) => { throw codedError("E_BAD_ARGUMENT", message); };
  if (!Array.isArray(messages) || !messages.length) bad(`messages must be a non-empty list of {role, content} objects, got ${shown(messages)}`);
  messages.forEach((m, i) => {
    if (m === null || typeof m !== "object" || Array.isArray(m)) bad(`messages[${i}] must be a {role, content} object, got ${shown(m)}`);
    const keys = Object.keys(m).filter((k) => given(m, k)).sort();
    if (keys.join() !== "content,role") bad(`messages[${i}] must hold exactly role and content, got ${keys.join(", ") || "no field"}`);
    if (!roles.includes(m.role)) bad(`messages[${i}].role must be one of ${roles.join(", ")}, got ${shown(m.role)}`);
    if (typeof m.content !== "string") bad(`messages[${i}].content must be a string, got ${shown(m.content)}`);
  });
}

/** checkRequest(payload) for a generate payload {prompt | prompt_ids | messages, chat?, raw_text?, config}:
 *  throws E_BAD_ARGUMENT naming the first field or option of the wrong type (the sentences of
 *  protocol.py checked_request); returns the payload. The values' ranges are Python's to check. */
export function makeRequestChecker(schema) {
  const table = (name) => Object.fromEntries(Object.entries(schema[name]).filter(([k]) => !k.startsWith("_")));
  const request = table("generate_request"), options = table("generate_config");
  const pick = (isPrompt) => Object.fromEntries(Object.entries(request).filter(([, rule]) => ("prompt" in rule) === isPrompt));
  const prompts = pick(true), fields = pick(false);   // exactly one prompt field; the flags
  const kinds = Object.entries(prompts).map(([key, rule]) => `${rule.prompt} (${key})`);
  const onePrompt = `a generate request needs a prompt: ${kinds.slice(0, -1).join(", ")} or ${kinds.at(-1)}, exactly one of them`;
  const bad = (message) => { throw codedError("E_BAD_ARGUMENT", message); };
  const check = (rules, key, v, where = "") => {
    const rule = rules[key];
    if (!typed(rule.type, v)) bad(`${where}${key} must be ${TYPE_WORDS[rule.type]}, got ${shown(v)}`);
    if (rule.non_empty && !v.length) bad(`${where}${key} is empty: no token could be generated (leave the option out to allow every token)`);
  };
  const given = (obj, key) => Object.hasOwn(obj, key) && obj[key] !== undefined;   // JSON drops undefined
  return function checkRequest(payload) {
    if (payload === null || typeof payload !== "object" || Array.isArray(payload)) bad("a generate request must be an object");
    const known = ["config", ...Object.keys(prompts), ...Object.keys(fields)].sort();
    const unknown = Object.keys(payload).filter((k) => given(payload, k) && !known.includes(k)).sort();
    if (unknown.length) bad(`${unknown[0]} is not a field of a generate request (known: ${known.join(", ")})`);
    for (const key of Object.keys(fields)) if (given(payload, key)) check(fields, key, payload[key]);
    const promptField = Object.keys(prompts).filter((k) => given(payload, k));
    if (promptField.length !== 1) bad(onePrompt);
    if (given(payload, "prompt")) {
      if (typeof payload.prompt !== "string") bad(`prompt must be a string, got ${shown(payload.prompt)}`);
    } else if (given(payload, "prompt_ids")) {
      if (!typed("token_ids", payload.prompt_ids) || !payload.prompt_ids.length) {
        bad(`prompt_ids must be a non-empty list of integer token ids, got ${shown(payload.prompt_ids)}`);
      }
    } else checkMessages(payload.messages, prompts.messages.roles, given);
    if (promptField[0] !== "prompt" && (payload.chat || payload.raw_text)) {
      bad(`chat and raw_text apply to a text prompt, not to ${promptField[0]}`);
    }
    const config = given(payload, "config") ? payload.config : {};
    if (config === null || typeof config !== "object" || Array.isArray(config)) bad(`config must be an object, got ${shown(config)}`);
    const unknownOption = Object.keys(config).filter((k) => given(config, k) && !Object.hasOwn(options, k)).sort();
    if (unknownOption.length) bad(`config.${unknownOption[0]} is not a known option (known: ${Object.keys(options).join(", ")})`);
    for (const key of Object.keys(options)) if (given(config, key)) check(options, key, config[key], "config.");
    return payload;
  };
}

/** An Error whose message starts "E_CODE: " and whose .code is the code (Pyodide keeps the text).
 *  A message that already starts with the code (a message passed on) is not prefixed twice. */
export function codedError(code, message) {
  let detail = String(message ?? "");
  const prefix = `${code}: `;
  while (detail.startsWith(prefix)) detail = detail.slice(prefix.length);
  if (!detail.trim() || detail === code) detail = "no detail was given";
  return Object.assign(new Error(`${code}: ${detail}`), { code, detail });
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
  const once = (code, message) => ({ code, message: codedError(code, message).detail });   // the code said once
  if (known(err?.code)) return once(err.code, m && m[1] === err.code ? m[2] : (err.detail ?? text));
  if (m && known(m[1])) return once(m[1], m[2]);
  return { code: fallback, message: text.split("\n")[0] || "unknown failure" };
}

/** The round record of schema.round_record (protocol.json): `at` maps each fixed word's name to
 *  its offset, `decode(words)` reads a record (Int32Array: fixed words, then n_forced forced ids,
 *  then n_proposed ids) into {n_accepted, next_token, rejected_at, ended_by, near_top_p, error_code,
 *  status, draft_ms, verify_ms, forced, proposals, diag}. The one JS reader of the layout (Python's: round_record.py). */
export function roundRecordLayout(schema) {
  const rec = schema.round_record;
  const at = Object.fromEntries(rec.words.map(([name], i) => [name, i]));
  const fixed = rec.words.length;
  const status = Object.fromEntries(Object.entries(rec.status).map(([name, v]) => [v, name]));
  const f32 = (words, i) => new Float32Array(Int32Array.of(words[i]).buffer)[0];
  function decode(words) {
    const w = Int32Array.from(words);
    if (w.length < fixed || w[at.n_forced] < 0 || w[at.n_proposed] < 0 || w.length !== fixed + w[at.n_forced] + w[at.n_proposed]) {
      throw codedError("E_PROTOCOL", `a round record needs ${fixed} words + n_forced + n_proposed ids, got ${w.length}`);
    }
    const nForced = w[at.n_forced];
    const none = (v) => (v < 0 ? null : v);
    return {
      n_accepted: w[at.n_accepted], next_token: none(w[at.next_token]), rejected_at: none(w[at.rejected_at]),
      ended_by: rec.ended_by[w[at.ended_by] & rec.ended_by_mask] ?? "", near_top_p: (w[at.ended_by] & rec.near_top_p_flag) !== 0,
      error_code: rec.decision_errors[w[at.decision_error]] ?? "E_INTERNAL", status: status[w[at.status]] ?? "unknown",
      draft_ms: w[at.draft_us] / 1000, verify_ms: w[at.verify_us] / 1000,
      forced: Array.from(w.subarray(fixed, fixed + nForced)), proposals: Array.from(w.subarray(fixed + nForced)),
      diag: { score: f32(w, at.diag_score), u: f32(w, at.diag_u), a: f32(w, at.diag_a) },
    };
  }
  /** The decision words alone (what decide() returns: the WGSL or C decider's words), in the
   *  shape the decide() harnesses compare with decide_round: -1 for none, diag beside. */
  function decodeDecision(words) {
    const w = Int32Array.from(words);
    if (w.length < rec.decision_words) throw codedError("E_PROTOCOL", `a decision needs ${rec.decision_words} words, got ${w.length}`);
    return {
      n_accepted: w[at.n_accepted], next_token: w[at.next_token], rejected_at: w[at.rejected_at],
      ended_by: rec.ended_by[w[at.ended_by] & rec.ended_by_mask] ?? "", error_code: rec.decision_errors[w[at.decision_error]] ?? "E_INTERNAL",
      diag: { score: f32(w, at.diag_score), u: f32(w, at.diag_u), a: f32(w, at.diag_a), near_top_p: (w[at.ended_by] & rec.near_top_p_flag) !== 0 },
    };
  }
  return { at, fixed, decisionWords: rec.decision_words, status: rec.status, decode, decodeDecision };
}

let schemaPromise = null;
/** The one schema (fetched once per realm) -> {validate, codes, schema}. */
export function loadSchema(url = new URL("../py/exactspec/core/protocol.json", import.meta.url).href) {
  schemaPromise ??= fetch(url).then(async (res) => {
    if (!res.ok) throw codedError("E_MODEL_LOAD", `${url}: HTTP ${res.status}`);
    const schema = await res.json();
    return { validate: makeValidator(schema), checkRequest: makeRequestChecker(schema), codes: schema.errors, schema };
  });
  return schemaPromise;
}

export async function loadProtocol(url) {
  return (await loadSchema(url)).validate;
}

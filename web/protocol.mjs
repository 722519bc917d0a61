// The envelope check of py/exactspec/protocol.json, JS side (the Python side is protocol.py).
// makeValidator(schema) is pure (tests run it in node); loadProtocol() fetches the one schema.
export function makeValidator(schema) {
  const fields = schema.envelope;
  const isCount = (x) => Number.isInteger(x) && x >= 0;
  return function validateEnvelope(env) {
    const fail = (msg) => { throw Object.assign(new Error(`E_PROTOCOL: ${msg}`), { code: "E_PROTOCOL" }); };
    if (env === null || typeof env !== "object" || Array.isArray(env)) fail(`envelope fields must be ${fields}`);
    const keys = Object.keys(env);
    if (keys.length !== fields.length || !fields.every((f) => keys.includes(f))) fail(`envelope fields must be ${fields}`);
    if (!(env.kind in schema.kinds)) fail(`unknown message kind ${JSON.stringify(env.kind)}`);
    for (const key of ["seq", "epoch"]) if (!isCount(env[key])) fail(`${key} must be a non-negative integer`);
    if (typeof env.request_id !== "string" || env.payload === null || typeof env.payload !== "object" ||
        Array.isArray(env.payload)) fail("request_id must be a string and payload an object");
    const missing = schema.kinds[env.kind].filter((f) => !(f in env.payload));
    if (missing.length) fail(`${env.kind} payload lacks ${missing}`);
    return env;
  };
}

export async function loadProtocol(url = "/py/exactspec/protocol.json") {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`E_MODEL_LOAD: ${url}: HTTP ${res.status}`);
  return makeValidator(await res.json());
}

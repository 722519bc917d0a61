// The one JS check of a sampling policy (exactspec.core.policy.SamplingPolicy.validate's twin), shared by the WebGPU acceptor, the WASM champion and the WASM draft.
import { codedError } from "./protocol.mjs";

const bad = (field, message) => codedError("E_BAD_ARGUMENT", `${field}: ${message}`);
const isId = (v, limit) => Number.isInteger(v) && v >= 0 && v < limit;

/** policy ({temperature, top_k, top_p, repetition_penalty, suppress_token_ids, allowed_token_ids},
 *  absent fields at their defaults) -> the same fields, checked against vocabulary size V; throws
 *  E_BAD_ARGUMENT naming the first bad field with SamplingPolicy.validate's sentence.
 *  allowed_token_ids (the grammar's mask for this row, null for none) must be ids in [0, V). */
export function checkedPolicy(policy, V) {
  const p = { temperature: 1.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0,
              suppress_token_ids: [], allowed_token_ids: null, ...(policy || {}) };
  if (!(Number.isFinite(p.temperature) && p.temperature >= 0)) {
    throw bad("temperature", `must be finite and >= 0 (0 = greedy), got ${p.temperature}`);
  }
  if (!(Number.isInteger(p.top_k) && p.top_k >= 0)) throw bad("top_k", `must be an integer >= 0 (0 = off), got ${p.top_k}`);
  if (!(typeof p.top_p === "number" && p.top_p > 0 && p.top_p <= 1)) throw bad("top_p", `must be in (0, 1] (1 = off), got ${p.top_p}`);
  if (!(Number.isFinite(p.repetition_penalty) && p.repetition_penalty > 0)) {
    throw bad("repetition_penalty", `must be finite and > 0 (1 = off), got ${p.repetition_penalty}`);
  }
  for (const id of p.suppress_token_ids) if (!isId(id, V)) throw bad("suppress_token_ids", `id ${id} not in [0, ${V})`);
  if (p.allowed_token_ids !== null) {
    for (const id of p.allowed_token_ids) if (!isId(id, V)) throw bad("grammar", `allowed id ${id} not in [0, ${V})`);
  }
  return p;
}

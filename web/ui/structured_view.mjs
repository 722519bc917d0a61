// structured_view.mjs — the page's structured output: the form's response_format, and a finished
// answer parsed, pretty-printed and checked against its schema. The grammar (xgrammar, in the
// engine) is what guarantees the shape; this check is the page showing the user that it holds,
// over the schema keywords listed in CHECKED (others are named as not checked, never ignored).

export const CHECKED = ["type", "properties", "required", "additionalProperties", "items", "enum", "const",
  "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "pattern"];

/** The form's response_format: kind ("" none, json_schema, json_object, regex, grammar) and the
 *  box's text -> the request's response_format, or null. A schema that is not JSON throws a coded
 *  E_BAD_ARGUMENT (the engine checks everything else). */
export function responseFormatFrom(kind, text) {
  if (!kind) return null;
  if (kind === "json_object") return { type: "json_object" };
  if (kind === "regex") return { type: "regex", pattern: text };
  if (kind === "grammar") return { type: "grammar", ebnf: text };
  let schema;
  try { schema = JSON.parse(text); } catch (err) {
    const e = new Error(`E_BAD_ARGUMENT: response_format: the schema box is not JSON (${err.message})`);
    e.code = "E_BAD_ARGUMENT";
    throw e;
  }
  return { type: "json_schema", schema };
}

const typeOf = (v) => (v === null ? "null" : Array.isArray(v) ? "array" : Number.isInteger(v) ? "integer" : typeof v);
const fits = (v, t) => t === typeOf(v) || (t === "number" && typeof v === "number");

/** Where `value` breaks `schema` (the CHECKED keywords) -> list of "path: why" (empty: it fits),
 *  and the keywords met that this check does not know (`unchecked`). */
export function checkAgainst(schema, value, path = "$", out = { errors: [], unchecked: new Set() }) {
  if (schema === true || schema === undefined) return out;
  if (schema === false) { out.errors.push(`${path}: the schema allows nothing here`); return out; }
  for (const key of Object.keys(schema)) {
    if (!CHECKED.includes(key) && !["title", "description", "$schema", "default", "examples"].includes(key)) out.unchecked.add(key);
  }
  const bad = (why) => out.errors.push(`${path}: ${why}`);
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => fits(value, t))) bad(`is ${typeOf(value)}, the schema wants ${types.join(" or ")}`);
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) bad("is not one of the enum's values");
  if ("const" in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) bad("is not the schema's const");
  if (typeof value === "string") {
    if (schema.minLength !== undefined && [...value].length < schema.minLength) bad(`is shorter than ${schema.minLength}`);
    if (schema.maxLength !== undefined && [...value].length > schema.maxLength) bad(`is longer than ${schema.maxLength}`);
    if (schema.pattern !== undefined && !new RegExp(schema.pattern, "u").test(value)) bad(`does not match ${schema.pattern}`);
  }
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) bad(`is below ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) bad(`is above ${schema.maximum}`);
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) bad(`has fewer than ${schema.minItems} items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) bad(`has more than ${schema.maxItems} items`);
    if (schema.items && typeof schema.items === "object") value.forEach((x, i) => checkAgainst(schema.items, x, `${path}[${i}]`, out));
  }
  if (typeOf(value) === "object") {
    for (const name of schema.required ?? []) if (!(name in value)) bad(`lacks the required "${name}"`);
    const props = schema.properties ?? {};
    for (const [name, v] of Object.entries(value)) {
      if (name in props) checkAgainst(props[name], v, `${path}.${name}`, out);
      else if (schema.additionalProperties === false) bad(`has "${name}", which the schema does not allow`);
      else if (typeof schema.additionalProperties === "object") checkAgainst(schema.additionalProperties, v, `${path}.${name}`, out);
    }
  }
  return out;
}

/** A finished answer under a JSON response_format -> {ok, pretty, lines: [sentence...]}: it parses,
 *  and (json_schema) fits the schema over the checked keywords. */
export function reviewAnswer(responseFormat, text, finishReason) {
  if (!responseFormat || !["json_schema", "json_object"].includes(responseFormat.type)) return null;
  let value;
  try { value = JSON.parse(text); } catch (err) {
    const cut = finishReason === "length" ? " (the answer reached max tokens before the JSON closed)" : "";
    return { ok: false, pretty: null, lines: [`not JSON: ${err.message}${cut}`] };
  }
  const pretty = JSON.stringify(value, null, 2);
  if (responseFormat.type === "json_object") {
    const isObject = typeOf(value) === "object";
    return { ok: isObject, pretty, lines: [isObject ? "valid JSON object" : `valid JSON, but ${typeOf(value)}, not an object`] };
  }
  const { errors, unchecked } = checkAgainst(responseFormat.schema, value);
  const lines = [errors.length ? `does not fit the schema: ${errors.slice(0, 5).join("; ")}` : "valid JSON, fits the schema"];
  if (unchecked.size) lines.push(`not checked here: ${[...unchecked].sort().join(", ")} (not checked by this page)`);
  return { ok: errors.length === 0, pretty, lines };
}

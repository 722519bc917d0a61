// Memory plan of the WebGPU champion (pure): tensors split by rows to fit a binding, bytes by category, refusals.
import { QMATMUL_FORMATS } from "./qmatmul.mjs";

const MiB = 1024 * 1024;
const mib = (b) => `${(b / MiB).toFixed(1)} MiB`;
const oom = (message) => Object.assign(new Error(`E_OUT_OF_MEMORY: ${message}`), { code: "E_OUT_OF_MEMORY" });

/** Largest bytes one storage binding (and one buffer) may hold: the device's
 *  maxStorageBufferBindingSize and maxBufferSize, or a smaller `override` (tests force splits). */
export function bindingLimit(limits, override = 0) {
  const l = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize, override > 0 ? override : Infinity);
  return Math.floor(l / 4) * 4;
}

/** Row ranges [{row0, rows}] of a (rows, rowBytes) tensor, each piece within `limit` bytes. */
export function rowPieces(name, rows, rowBytes, limit) {
  const per = Math.floor(limit / rowBytes);
  if (per < 1) throw oom(`${name}: one row is ${rowBytes} bytes, more than the ${limit}-byte binding limit`);
  const pieces = [];
  for (let row0 = 0; row0 < rows; row0 += per) pieces.push({ row0, rows: Math.min(per, rows - row0) });
  return pieces;
}

export const LINEAR_GROUPS = ["qkv", "o", "gateUp", "down"];   // the fused layer linears, in upload order

/** (rows, cols) of each fused layer linear: q|k|v and gate|up stacked by rows. */
export function linearShapes(hp) {
  const { hidden: H, inter: F, heads, kvHeads: KV, headDim: hd } = hp;
  return { qkv: [(heads + 2 * KV) * hd, H], o: [H, heads * hd], gateUp: [2 * F, H], down: [H, F] };
}

const LINEAR_NAMES = { qkv: "self_attn.q|k|v_proj", o: "self_attn.o_proj", gateUp: "mlp.gate|up_proj", down: "mlp.down_proj" };

/** Bytes of one stored row of `cols` weights: "q8" int8, "f32" float32, a GGUF block form
 *  (Q8_0 | Q4_0 | Q4_1: the q8act kernels, web/gpu/qmatmul.mjs) its blocks. */
export function formRowBytes(form, cols) {
  if (form === "q8") return cols;
  if (form === "f32") return 4 * cols;
  if (Object.hasOwn(QMATMUL_FORMATS, form) && form !== "ROWQ8") return (cols / 32) * QMATMUL_FORMATS[form].blockBytes;
  throw new Error(`E_BAD_ARGUMENT: weight form ${JSON.stringify(form)} is not "q8", "f32", "Q8_0", "Q4_0" or "Q4_1"`);
}

/** The whole plan for hyper-parameters `hp` (web/formats/model_config.mjs gpuHyperParameters) and the stored forms
 *  of the weights: `forms.embed` "f32" | "q8"; `forms.head` "tied" | "f32" | "q8" | a block form;
 *  `forms.layers` (optional, default every linear "q8") one {qkv, o, gateUp, down} of "q8" | "f32" |
 *  a block form (formRowBytes) per layer. `q8act`: the activation quantiser's scratch is counted.
 *  Refuses (E_OUT_OF_MEMORY, saying what would fit) a row wider than a binding, a per-layer KV
 *  cache, attention scratch or logits buffer over a binding, and a total over `budgetBytes`.
 *  `weightLimit` (default `limit`): a smaller piece size for the weights only (tests force splits).
 *  Returns {pieces: {embed, head, qkv, o, gateUp, down} (each linear: its longest piece list over
 *  the layers), layerPieces: per layer {qkv, o, gateUp, down}, bytes}. */
export function planChampion(hp, forms, { maxBlock: B, maxContext: ctx, limit, weightLimit = limit, budgetBytes = 0, q8act = false }) {
  const { vocab: V, hidden: H, inter: F, heads, kvHeads: KV, headDim: hd, layers: L } = hp;
  const qDim = heads * hd, qkvDim = (heads + 2 * KV) * hd;
  const rowBytes = formRowBytes;
  const shapes = linearShapes(hp);
  const layerForms = forms.layers ?? Array.from({ length: L }, () => ({ qkv: "q8", o: "q8", gateUp: "q8", down: "q8" }));
  if (layerForms.length !== L) throw new Error(`E_BAD_ARGUMENT: forms.layers has ${layerForms.length} entries for ${L} layers`);
  const byForm = {};                      // row pieces depend only on the form: computed once per (group, form)
  const linearPieces = (group, form) => {
    const [rows, cols] = shapes[group];
    byForm[form] ??= {};
    byForm[form][group] ??= rowPieces(LINEAR_NAMES[group], rows, rowBytes(form, cols), weightLimit);
    return byForm[form][group];
  };
  const layerPieces = layerForms.map((f) => Object.fromEntries(LINEAR_GROUPS.map((g) => [g, linearPieces(g, f[g])])));
  const longest = (g) => layerPieces.map((p) => p[g]).reduce((a, b) => (b.length > a.length ? b : a));
  const pieces = {
    embed: rowPieces("model.embed_tokens.weight", V, rowBytes(forms.embed, H), weightLimit),
    head: forms.head === "tied" ? null : rowPieces("lm_head.weight", V, rowBytes(forms.head, H), weightLimit),
    ...Object.fromEntries(LINEAR_GROUPS.map((g) => [g, longest(g)])),
  };
  const q8 = (rows, cols) => rows * cols + rows * 4;
  const linearBytes = (form, [rows, cols]) => (form === "q8" ? q8(rows, cols) : rows * rowBytes(form, cols));
  const big = (form) => (form === "tied" ? 0 : linearBytes(form, [V, H]));
  const weights = big(forms.embed) + big(forms.head) + 4 * H * (2 * L + 1) + L * (hp.qkvBias ? 4 * qkvDim : 0)
    + layerForms.reduce((sum, f) => sum + LINEAR_GROUPS.reduce((s, g) => s + linearBytes(f[g], shapes[g]), 0), 0);
  const kvPerPosition = 2 * L * KV * hd * 4;            // K and V of every layer
  const perPosition = kvPerPosition + B * heads * 4 + hd * 4;   // + attention scratch + RoPE table
  const maxIn = Math.max(H, qDim, F);                   // q8act: the quantised activations (int8 + a vec2 per 32)
  const fixedActs = 4 * B * (1 + 2 * H + qkvDim + 2 * qDim + 3 * F + V) + (q8act ? B * maxIn + B * (maxIn / 32) * 8 : 0);
  const fits = (perPositionBytes) => Math.floor(limit / perPositionBytes);
  const perBinding = [
    ["the KV cache of one layer", KV * hd * 4], ["the attention scratch", B * heads * 4], ["the RoPE table", hd * 4],
  ];
  for (const [what, bytesPerPosition] of perBinding) {
    if (ctx * bytesPerPosition > limit) {
      throw oom(`${what} at maxContext ${ctx} is ${ctx * bytesPerPosition} bytes, over the ${limit}-byte binding limit; ` +
                `maxContext <= ${fits(bytesPerPosition)} would fit`);
    }
  }
  if (B * V * 4 > limit) throw oom(`the logits buffer (${B} x ${V} f32) is over the ${limit}-byte binding limit`);
  const bytes = { weights, kvCache: ctx * kvPerPosition, activations: fixedActs + ctx * (perPosition - kvPerPosition) };
  bytes.total = bytes.weights + bytes.kvCache + bytes.activations;
  if (budgetBytes > 0 && bytes.total > budgetBytes) {
    const room = budgetBytes - weights - fixedActs;
    const what = `weights ${mib(weights)} + KV cache ${mib(bytes.kvCache)} (maxContext ${ctx}) + activations ` +
                 `${mib(bytes.activations)} = ${mib(bytes.total)} exceed the memory budget of ${mib(budgetBytes)}`;
    throw oom(room >= perPosition ? `${what}; maxContext <= ${Math.floor(room / perPosition)} would fit`
      : `${what}; the weights alone do not fit`);
  }
  return { pieces, layerPieces, bytes };
}

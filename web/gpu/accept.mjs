// accept.mjs: processors, acceptance and sampling on WebGPU (docs/browser_contract.md, docs/gpu_accept.md).
//
//   const acceptor = await createAcceptor({ device, vocabSize, maxBlock });
//   await acceptor.decide({...})      -> Int32Array: the decision words of protocol.json's round_record
//   await acceptor.processRows({...}) -> Float32Array (nRows * V) processed rows (tests only)
//   both take rowOffset (decided row i is logits row rowOffset + i; default 0) and rowMasks (null, or
//   Uint32Array nRows * ceil(V / 32): row i's allowed-id bits, bit (id & 31) of word (id >> 5), ANDed
//   with policy.allowed_token_ids in processors step 3; default null); decide also takes logitsRows,
//   the rows the last forward wrote (default: what the buffer holds, at most maxBlock), and refuses
//   rowOffset + nRows beyond it
//   await acceptor.drawBits(addrs)    -> Uint32Array of RNG words per address (tests only)
//
// One decide() = one submission: processors_rows (one workgroup per row) + accept_decide (one
// workgroup), then the record's decision words are copied back. Semantics: exactspec.core.acceptance.decide_round with
// exactspec.reference.processors.process_logits (processors-v1) and the RNG contract of docs/rng.md.
import { checkedPolicy } from "../sampling_policy.mjs";

const MAX_BLOCK_LIMIT = 32;                    // stop_mask is one u32 word
const NONE = 0xffffffff;
const RESULT_WORDS = 8;                        // REC_DECISION_WORDS (shaders/round_record.wgsl, generated)
const ROWINFO_WORDS = 4;
const ROW_INVALID = 1;
const ROW_NEAR_TOP_P = 2;
const SHADER_FILES = {
  record: "round_record.wgsl",
  common: "accept_common.wgsl",
  threefry: "threefry_addr.wgsl",
  gumbel: "sample_gumbel.wgsl",
  processors: "processors_rows.wgsl",
  decide: "accept_decide.wgsl",
  bits: "threefry_bits.wgsl",
};

function badArgument(message) {
  return Object.assign(new Error(message), { code: "E_BAD_ARGUMENT" });
}

function isUint(v, limit) {
  return Number.isInteger(v) && v >= 0 && v < limit;
}

async function fetchShaders(baseUrl) {
  const entries = await Promise.all(Object.entries(SHADER_FILES).map(async ([name, file]) => {
    const response = await fetch(new URL(file, baseUrl));
    if (!response.ok) throw Object.assign(new Error(`shader ${file}: HTTP ${response.status}`), { code: "E_MODEL_LOAD" });
    return [name, await response.text()];
  }));
  return Object.fromEntries(entries);
}

// WG invocations per workgroup (4, 16, 64 or 256); GS * GS = WG is the fixed summation grouping.
function shaderHeader(V, WG) {
  const per = Math.ceil(V / WG);
  const idBits = Math.max(1, Math.ceil(Math.log2(V)));
  return `const V: u32 = ${V}u;\nconst PER: u32 = ${per}u;\nconst WG: u32 = ${WG}u;\nconst GS: u32 = ${Math.sqrt(WG)}u;\n` +
         `const NWORDS: u32 = ${Math.ceil(V / 32)}u;\nconst IDBITS: u32 = ${idBits}u;\n` +
         `const ID_SHIFT0: u32 = ${4 * (Math.ceil(idBits / 4) - 1)}u;\n`;   // top 4-bit digit of a token id
}

async function compile(device, label, code, layouts) {
  device.pushErrorScope("validation");
  const module = device.createShaderModule({ label, code });
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === "error");
  if (errors.length) {
    await device.popErrorScope();
    throw new Error(`${label}: ${errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join("; ")}`);
  }
  const pipeline = await device.createComputePipelineAsync({
    label, layout: device.createPipelineLayout({ bindGroupLayouts: layouts }), compute: { module, entryPoint: "main" },
  });
  const err = await device.popErrorScope();
  if (err) throw new Error(`${label}: ${err.message}`);
  return pipeline;
}

function layoutOf(device, kinds) {
  return device.createBindGroupLayout({
    entries: kinds.map((type, binding) => ({
      binding, visibility: GPUShaderStage.COMPUTE,
      buffer: { type: type === "uniform" ? "uniform" : type === "ro" ? "read-only-storage" : "storage" },
    })),
  });
}

// Each invocation holds PER = ceil(V / WG) floats in a private array; shader compilers cap a
// private array (Tint: 64 KiB), so large vocabularies need a larger workgroup.
const MAX_PER = 8192;
const WORKGROUP_SIZES = [4, 16, 64, 256];

// SwiftShader (CPU) pays for every invocation at every barrier: 4 invocations per row (one SIMD
// group) measured 2-9x faster than 256 there (docs/gpu_accept.md), so it gets the smallest size
// whose private array fits (4 up to V = 32768, 64 at V = 151936). Real GPUs want 256.
function defaultWorkgroupSize(device, V) {
  const info = device.adapterInfo || {};
  const swiftshader = info.architecture === "swiftshader" || info.vendor === "google" && /swiftshader/i.test(info.description || "");
  return swiftshader ? WORKGROUP_SIZES.find((wg) => Math.ceil(V / wg) <= MAX_PER) ?? 256 : 256;
}

export async function createAcceptor({ device, vocabSize, maxBlock, workgroupSize = defaultWorkgroupSize(device, vocabSize),
                                      shaderBaseUrl = new URL("../../shaders/", import.meta.url) }) {
  const V = vocabSize;
  if (!(Number.isInteger(V) && V >= 1 && V <= MAX_PER * 256)) throw badArgument(`vocabSize: ${V} (at most ${MAX_PER * 256})`);
  if (!(Number.isInteger(maxBlock) && maxBlock >= 1 && maxBlock <= MAX_BLOCK_LIMIT)) throw badArgument(`maxBlock: ${maxBlock}`);
  const nWords = Math.ceil(V / 32);
  const src = await fetchShaders(shaderBaseUrl);
  if (!WORKGROUP_SIZES.includes(workgroupSize)) throw badArgument(`workgroupSize: ${workgroupSize}`);
  if (Math.ceil(V / workgroupSize) > MAX_PER) {
    throw badArgument(`workgroupSize: ${workgroupSize} leaves ${Math.ceil(V / workgroupSize)} tokens per invocation at V = ${V} (at most ${MAX_PER})`);
  }
  const head = shaderHeader(V, workgroupSize);

  // Binding convention: tensors in group 0 (shape comments in the .wgsl), the Meta uniform in group 1.
  const procLayout = layoutOf(device, ["ro", "rw", "rw", "ro", "ro"]);
  const decideLayout = layoutOf(device, ["ro", "ro", "ro", "ro", "rw"]);
  const metaLayout = layoutOf(device, ["uniform"]);
  const bitsLayout = layoutOf(device, ["ro", "rw"]);
  const [procPipeline, decidePipeline, bitsPipeline] = await Promise.all([
    compile(device, "processors_rows", head + src.common + src.processors, [procLayout, metaLayout]),
    compile(device, "accept_decide", head + src.record + src.common + src.threefry + src.gumbel + src.decide, [decideLayout, metaLayout]),
    compile(device, "threefry_bits", src.threefry + src.gumbel + src.bits, [bitsLayout]),
  ]);

  const S = GPUBufferUsage.STORAGE, CD = GPUBufferUsage.COPY_DST, CS = GPUBufferUsage.COPY_SRC;
  const buffer = (label, size, usage) => device.createBuffer({ label, size: Math.max(16, size), usage });
  const rowBytes = maxBlock * V * 4;
  const params = buffer("accept params", 64, GPUBufferUsage.UNIFORM | CD);                 // (16,) Meta
  const probs = buffer("accept probs", rowBytes, S | CS);                                   // (maxBlock, V) f32
  const rowinfo = buffer("accept rowinfo", maxBlock * ROWINFO_WORDS * 4, S | CS);           // (maxBlock, 4) u32
  const bitmaps = buffer("accept bitmaps", (2 + maxBlock) * nWords * 4, S | CD);            // (2 + maxBlock, NWORDS) u32
  const proposalsBuf = buffer("accept proposals", maxBlock * 4, S | CD);                    // (maxBlock,) u32
  const pDraftBuf = buffer("accept p_draft", rowBytes, S | CD);                             // (maxBlock, V) f32
  const result = buffer("accept result", RESULT_WORDS * 4, S | CS);                         // (8,) u32
  const readback = buffer("accept readback", RESULT_WORDS * 4, GPUBufferUsage.MAP_READ | CD);
  const logitsUpload = buffer("accept logits upload", rowBytes, S | CD);                    // processRows input

  const entries = (buffers) => buffers.map((b, binding) => ({ binding, resource: { buffer: b } }));
  const metaGroup = device.createBindGroup({ layout: metaLayout, entries: entries([params]) });
  const decideGroup = device.createBindGroup({
    layout: decideLayout, entries: entries([probs, rowinfo, pDraftBuf, proposalsBuf, result]),
  });
  const procGroups = new WeakMap();            // logits buffer -> bind group
  function procGroupFor(logitsBuffer) {
    let g = procGroups.get(logitsBuffer);
    if (!g) {
      g = device.createBindGroup({
        layout: procLayout, entries: entries([logitsBuffer, probs, rowinfo, bitmaps, proposalsBuf]),
      });
      procGroups.set(logitsBuffer, g);
    }
    return g;
  }

  let tail = Promise.resolve();                 // decide/processRows share buffers: run one at a time
  const serial = (fn) => {
    const run = tail.then(fn, fn);
    tail = run.catch(() => {});
    return run;
  };

  // Writes the Meta uniform, bitmaps and proposals for nRows rows. logitsRows: the rows the logits
  // buffer holds for this call (the last forward's, when the caller knows it), at most maxBlock.
  function upload({ nRows, proposals, contextIds, policy, seed, roundId, stopTokenIds, remaining, greedy,
                    rowOffset = 0, rowMasks = null }, logitsRows) {
    const pol = checkedPolicy(policy, V);
    const props = Int32Array.from(proposals || []);
    if (!(Number.isInteger(nRows) && nRows >= 1 && nRows <= maxBlock)) throw badArgument(`nRows: ${nRows}`);
    if (props.length > nRows) throw badArgument(`proposals: ${props.length} > nRows ${nRows}`);
    for (const y of props) if (!isUint(y, V)) throw badArgument(`proposals: ${y}`);
    if (!isUint(rowOffset, maxBlock)) throw badArgument(`rowOffset: ${rowOffset}`);
    const held = Math.min(maxBlock, logitsRows);
    if (rowOffset + nRows > held) throw badArgument(`nRows ${nRows} at rowOffset ${rowOffset}: the logits hold ${held} rows`);
    if (rowMasks !== null && !((rowMasks instanceof Uint32Array || rowMasks instanceof Int32Array) &&
        rowMasks.length === nRows * nWords)) {
      throw badArgument(`rowMasks: need a Uint32Array of nRows * ceil(V / 32) = ${nRows * nWords} words`);
    }
    const perRow = rowMasks !== null;
    // [0] masked ids (shared), [1] context ids, [2 + r] decided row r's masked ids (per-row masks only)
    const bits = new Uint32Array((perRow ? 2 + nRows : 2) * nWords);
    const setBit = (word0, j) => { bits[word0 + (j >>> 5)] |= (1 << (j & 31)) >>> 0; };
    for (const id of pol.suppress_token_ids) setBit(0, id);
    if (pol.allowed_token_ids !== null) {
      const allowed = new Uint8Array(V);
      for (const id of pol.allowed_token_ids) allowed[id] = 1;
      for (let j = 0; j < V; j++) if (!allowed[j]) setBit(0, j);
    }
    for (const id of contextIds || []) {
      if (!isUint(id, V)) throw badArgument(`context_ids: ${id}`);
      setBit(nWords, id);
    }
    if (perRow) {                               // masked = masked by the policy, or not allowed by the row
      const allowedBits = new Uint32Array(rowMasks.buffer, rowMasks.byteOffset, rowMasks.length);
      for (let r = 0; r < nRows; r++) {
        for (let w = 0; w < nWords; w++) bits[(2 + r) * nWords + w] = (bits[w] | ~allowedBits[r * nWords + w]) >>> 0;
      }
    }
    const stops = new Set(stopTokenIds || []);
    let stopMask = 0;
    props.forEach((y, i) => { if (stops.has(y)) stopMask |= 1 << i; });
    const [seedLo, seedHi] = seed || [0, 0];
    if (!isUint(seedLo, 2 ** 32) || !isUint(seedHi, 2 ** 32)) throw badArgument(`seed: ${seed}`);
    if (!isUint(roundId ?? 0, 2 ** 32)) throw badArgument(`roundId: ${roundId}`);
    const words = new ArrayBuffer(64);
    const u = new Uint32Array(words), f = new Float32Array(words);
    u[0] = nRows; u[1] = props.length; u[2] = seedLo; u[3] = seedHi;
    u[4] = roundId ?? 0; u[5] = remaining ?? NONE; u[6] = greedy ? 1 : 0; u[7] = stopMask >>> 0;
    f[8] = pol.temperature; f[9] = pol.top_p; f[10] = pol.repetition_penalty; u[11] = pol.top_k;
    u[12] = pol.repetition_penalty !== 1.0 ? 1 : 0;
    u[13] = perRow ? 2 : pol.suppress_token_ids.length || pol.allowed_token_ids !== null ? 1 : 0;   // MASK_PER_ROW, MASK_SHARED
    u[14] = 0xff800000; u[15] = rowOffset;
    device.queue.writeBuffer(params, 0, words);
    device.queue.writeBuffer(bitmaps, 0, bits);
    const propWords = new Uint32Array(maxBlock);
    propWords.set(props);
    device.queue.writeBuffer(proposalsBuf, 0, propWords);
  }

  function encodeProcessors(encoder, logitsBuffer, nRows) {
    const pass = encoder.beginComputePass({ label: "processors_rows" });
    pass.setPipeline(procPipeline);
    pass.setBindGroup(0, procGroupFor(logitsBuffer));
    pass.setBindGroup(1, metaGroup);
    pass.dispatchWorkgroups(nRows);
    pass.end();
  }

  // rows of logits a buffer holds (the champion's logits buffer: maxBlock of its own)
  const rowsIn = (logitsBuffer) => Math.min(maxBlock, Math.floor(logitsBuffer.size / (4 * V)));

  async function decideNow(args) {
    const { logitsBuffer, nRows, proposals, pDraft, greedy, remaining, logitsRows } = args;
    const m = (proposals || []).length;
    if (nRows !== m + 1) throw badArgument(`nRows: need m + 1 = ${m + 1}, got ${nRows}`);
    if (m > 0 && !(Number.isInteger(remaining) && remaining >= m)) throw badArgument(`remaining: ${remaining} < m ${m}`);
    if (!(logitsRows === undefined || isUint(logitsRows, maxBlock + 1))) throw badArgument(`logitsRows: ${logitsRows}`);
    upload(args, Math.min(rowsIn(logitsBuffer), logitsRows ?? maxBlock));
    if (m > 0 && !greedy) {
      if (!pDraft || pDraft.length !== m * V) throw badArgument(`pDraft: need ${m} * ${V} floats`);
      device.queue.writeBuffer(pDraftBuf, 0, pDraft instanceof Float32Array ? pDraft : Float32Array.from(pDraft));
    }
    const encoder = device.createCommandEncoder({ label: "accept decide" });
    encodeProcessors(encoder, logitsBuffer, nRows);
    const pass = encoder.beginComputePass({ label: "accept_decide" });
    pass.setPipeline(decidePipeline);
    pass.setBindGroup(0, decideGroup);
    pass.setBindGroup(1, metaGroup);
    pass.dispatchWorkgroups(1);
    pass.end();
    encoder.copyBufferToBuffer(result, 0, readback, 0, RESULT_WORDS * 4);
    device.queue.submit([encoder.finish()]);
    await readback.mapAsync(GPUMapMode.READ);
    const words = new Int32Array(readback.getMappedRange().slice(0));
    readback.unmap();
    return words;
  }

  async function processRowsNow({ logits, logitsBuffer, nRows, proposals, contextIds, policy, greedy, rowOffset = 0,
                                  rowMasks = null }) {
    const given = logitsBuffer ? rowsIn(logitsBuffer) : logits ? logits.length / V : 0;   // rows of logits given
    upload({ nRows, proposals, contextIds, policy, greedy, rowOffset, rowMasks }, given);
    let source = logitsBuffer;
    if (!source) {
      if (!logits || logits.length !== (rowOffset + nRows) * V) throw badArgument(`logits: need (${rowOffset} + ${nRows}) * ${V} floats`);
      device.queue.writeBuffer(logitsUpload, 0, logits instanceof Float32Array ? logits : Float32Array.from(logits));
      source = logitsUpload;
    }
    const probBytes = nRows * V * 4, infoBytes = nRows * ROWINFO_WORDS * 4;
    const staging = device.createBuffer({ size: probBytes + infoBytes, usage: GPUBufferUsage.MAP_READ | CD });
    const encoder = device.createCommandEncoder({ label: "accept processRows" });
    encodeProcessors(encoder, source, nRows);
    encoder.copyBufferToBuffer(probs, 0, staging, 0, probBytes);
    encoder.copyBufferToBuffer(rowinfo, 0, staging, probBytes, infoBytes);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const bytes = staging.getMappedRange().slice(0);
    staging.unmap();
    staging.destroy();
    const out = new Float32Array(bytes, 0, nRows * V);
    const info = new Uint32Array(bytes, probBytes, nRows * ROWINFO_WORDS);
    out.status = Array.from({ length: nRows }, (_, r) => info[r * ROWINFO_WORDS]);
    out.errorCodes = out.status.map((s) => (s & ROW_INVALID ? "E_PROCESSOR_INVALID" : ""));
    out.nearTopP = out.status.map((s) => (s & ROW_NEAR_TOP_P) !== 0);
    out.argmax = Array.from({ length: nRows }, (_, r) => info[r * ROWINFO_WORDS + 1]);
    out.nKept = Array.from({ length: nRows }, (_, r) => info[r * ROWINFO_WORDS + 2]);
    for (let r = 0; r < nRows; r++) if (out.status[r] & ROW_INVALID) out.fill(NaN, r * V, (r + 1) * V);
    return out;
  }

  // addrs: Uint32Array (n, 8) = seed_lo, seed_hi, domain, round, position, token, weight f32 bits, 0.
  async function drawBitsNow(addrs) {
    const n = addrs.length / 8;
    const input = device.createBuffer({ size: addrs.byteLength, usage: S | CD });
    const output = device.createBuffer({ size: addrs.byteLength, usage: S | CS });
    const staging = device.createBuffer({ size: addrs.byteLength, usage: GPUBufferUsage.MAP_READ | CD });
    device.queue.writeBuffer(input, 0, addrs);
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(bitsPipeline);
    pass.setBindGroup(0, device.createBindGroup({ layout: bitsLayout, entries: entries([input, output]) }));
    pass.dispatchWorkgroups(Math.ceil(n / 64));
    pass.end();
    encoder.copyBufferToBuffer(output, 0, staging, 0, addrs.byteLength);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    const words = new Uint32Array(staging.getMappedRange().slice(0));
    staging.unmap();
    for (const b of [input, output, staging]) b.destroy();
    return words;
  }

  return {
    vocabSize: V,
    maxBlock,
    workgroupSize,
    decide: (args) => serial(() => decideNow(args)),
    processRows: (args) => serial(() => processRowsNow(args)),
    drawBits: (addrs) => serial(() => drawBitsNow(addrs)),
    destroy() {
      for (const b of [params, probs, rowinfo, bitmaps, proposalsBuf, pDraftBuf, result, readback, logitsUpload]) b.destroy();
    },
  };
}

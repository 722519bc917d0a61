// WebGPU device, pipeline and buffer helpers shared by the champion and its test harness.

/** Request an adapter + device with the adapter's own limits (no optional features needed). */
export async function requestDevice() {
  const noGpu = (why) => Object.assign(new Error(`E_NO_WEBGPU: ${why}`), { code: "E_NO_WEBGPU" });
  if (!navigator.gpu) throw noGpu("navigator.gpu is missing (insecure context or flags)");
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw noGpu("no adapter");
  const a = adapter.limits;
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: a.maxStorageBufferBindingSize,
      maxBufferSize: a.maxBufferSize,
      maxStorageBuffersPerShaderStage: a.maxStorageBuffersPerShaderStage,
      maxComputeWorkgroupStorageSize: a.maxComputeWorkgroupStorageSize,
      maxComputeInvocationsPerWorkgroup: a.maxComputeInvocationsPerWorkgroup,
      maxComputeWorkgroupSizeX: a.maxComputeWorkgroupSizeX,
    },
  });
  device.esAdapterInfo = adapter.info ?? {};   // "es" prefix: GPUDevice has its own adapterInfo getter
  device.esFallbackAdapter = adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false;
  device.esLostInfo = null;      // set once the device is lost: {reason, message}
  device.lost.then((info) => {
    device.esLostInfo = { reason: info.reason, message: info.message };
    if (info.reason !== "destroyed") console.error(`WebGPU device lost: ${info.reason} ${info.message}`);
  });
  device.addEventListener?.("uncapturederror", (e) => console.error(`WebGPU error: ${e.error.message}`));
  return device;
}

/**
 * Count every buffer the device creates (live count, live bytes, peak bytes) so receipts and
 * leak checks read the engine's own accounting, and let a test refuse allocations:
 * `accounting.refuseAfter = n` makes the (n+1)-th createBuffer from now throw E_OUT_OF_MEMORY.
 * destroyAll() frees what is still live (terminate, failed load). Mutates `device` in place.
 */
export function trackDevice(device) {
  const live = new Map();      // GPUBuffer -> bytes
  const accounting = {
    liveBuffers: 0, liveBytes: 0, peakBytes: 0, created: 0, refuseAfter: -1,
    destroyAll() { for (const b of [...live.keys()]) b.destroy(); },
  };
  const create = device.createBuffer.bind(device);
  device.createBuffer = (desc) => {
    if (accounting.refuseAfter === 0) {
      accounting.refuseAfter = -1;
      throw Object.assign(new Error(`E_OUT_OF_MEMORY: buffer ${desc.label ?? ""} of ${desc.size} bytes refused`), { code: "E_OUT_OF_MEMORY" });
    }
    if (accounting.refuseAfter > 0) accounting.refuseAfter -= 1;
    const buf = create(desc);
    const destroy = buf.destroy.bind(buf);
    live.set(buf, desc.size);
    accounting.created += 1;
    accounting.liveBuffers = live.size;
    accounting.liveBytes += desc.size;
    accounting.peakBytes = Math.max(accounting.peakBytes, accounting.liveBytes);
    buf.destroy = () => {
      if (live.has(buf)) {
        accounting.liveBytes -= live.get(buf);
        live.delete(buf);
        accounting.liveBuffers = live.size;
      }
      destroy();
    };
    return buf;
  };
  device.accounting = accounting;
  return accounting;
}

/** Fetch one shader source by URL (throws on HTTP errors). */
export async function fetchText(url) {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`E_MODEL_LOAD: GET ${url} -> ${res.status}`);
  return res.text();
}

/** Compile shaders/<name>.wgsl into compute pipelines (entry point "main"), once, at load.
 *  Compilation errors are reported with the file name. Returns {name: GPUComputePipeline}. */
export async function createPipelines(device, shaderBaseUrl, names) {
  const out = {};
  await Promise.all(names.map(async (name) => {
    const code = await fetchText(new URL(`${name}.wgsl`, shaderBaseUrl));
    const module = device.createShaderModule({ label: name, code });
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === "error");
    if (errors.length) {
      throw new Error(`E_SHADER: ${name}.wgsl: ` + errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join("; "));
    }
    out[name] = await device.createComputePipelineAsync({ label: name, layout: "auto", compute: { module, entryPoint: "main" } });
  }));
  return out;
}

/** A storage buffer of `bytes` (rounded up to 4), optionally filled from a typed array. */
export function storageBuffer(device, bytes, data = null, label = "") {
  const size = Math.max(4, Math.ceil(bytes / 4) * 4);
  const buf = device.createBuffer({
    label, size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST,
  });
  if (data) writeBytes(device, buf, 0, data);
  return buf;
}

export const META_BYTES = 64;       // every shader's Meta struct fits in 16 words
export const META_STRIDE = 256;     // minUniformBufferOffsetAlignment

/** One uniform buffer holding `slots` Meta structs at META_STRIDE apart (one write per forward). */
export function metaBuffer(device, slots, label = "") {
  return device.createBuffer({ label, size: slots * META_STRIDE, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
}

/** Write a Meta struct (array of [value, "u32"|"f32"] pairs, declaration order) into `words` at slot. */
export function packMeta(fields, words = new ArrayBuffer(META_STRIDE), slot = 0) {
  const u = new Uint32Array(words, slot * META_STRIDE, 16), f = new Float32Array(words, slot * META_STRIDE, 16);
  fields.forEach(([v, kind], i) => { if (kind === "f32") f[i] = v; else u[i] = v >>> 0; });
  return words;
}

/** writeBuffer of any typed array / ArrayBuffer, padding its byte length up to a multiple of 4. */
export function writeBytes(device, buffer, offset, data) {
  const bytes = data instanceof ArrayBuffer ? new Uint8Array(data)
    : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (bytes.byteLength % 4 === 0 && bytes.byteOffset % 4 === 0) {
    device.queue.writeBuffer(buffer, offset, bytes.buffer, bytes.byteOffset, bytes.byteLength);
  } else {
    const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
    padded.set(bytes);
    device.queue.writeBuffer(buffer, offset, padded);
  }
}

/** Copy `bytes` from a GPU buffer into a new ArrayBuffer (one submission, then map). */
export async function readBuffer(device, buffer, bytes, offset = 0) {
  const size = Math.ceil(bytes / 4) * 4;
  const staging = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const enc = device.createCommandEncoder();
  enc.copyBufferToBuffer(buffer, offset, staging, 0, size);
  device.queue.submit([enc.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const out = staging.getMappedRange().slice(0, bytes);
  staging.unmap();
  staging.destroy();
  return out;
}

/** Bind group pair for the convention: tensors in group 0 (bindings 0..k-1), Meta in group 1
 *  (the Meta struct at `slot` of a metaBuffer). */
export function bindGroups(device, pipeline, tensors, meta, slot = 0) {
  const g0 = device.createBindGroup({
    layout: pipeline.getBindGroupLayout(0),
    entries: tensors.map((buffer, binding) => ({ binding, resource: { buffer } })),
  });
  const g1 = device.createBindGroup({
    layout: pipeline.getBindGroupLayout(1), entries: [{ binding: 0, resource: { buffer: meta, offset: slot * META_STRIDE, size: META_BYTES } }],
  });
  return [g0, g1];
}

// accept_device.mjs: a WebGPU device for the acceptor when no shared device helper is used
// (tests, harness). Asks for the adapter's buffer limits; surfaces a lost device as an error code.

export async function requestAcceptDevice() {
  if (!globalThis.navigator?.gpu) throw Object.assign(new Error("WebGPU unavailable"), { code: "E_DEVICE_LOST" });
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw Object.assign(new Error("no WebGPU adapter"), { code: "E_DEVICE_LOST" });
  const device = await adapter.requestDevice({
    requiredLimits: {
      maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
      maxBufferSize: adapter.limits.maxBufferSize,
    },
  });
  device.lost.then((info) => console.error(`accept device lost: ${info.reason} ${info.message}`));
  return device;
}

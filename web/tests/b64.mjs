// b64.mjs — typed arrays to and from base64, for the browser harnesses' page.evaluate payloads.

/** base64 text -> a new `Type` (Float32Array, Int32Array, ...) over its bytes. */
export function fromB64(b64, Type) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new Type(bytes.buffer);
}

/** A typed array's bytes -> base64 text (in 32 KiB pieces: no argument-count limit). */
export function toB64(typed) {
  const bytes = new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

// sha256Hex(bytes): lowercase hex SHA-256 by WebCrypto (browser workers and node), or null where
// SubtleCrypto is missing (an insecure context). One helper for every artifact identity.
export async function sha256Hex(bytes) {
  if (!globalThis.crypto?.subtle) return null;
  const digest = new Uint8Array(await globalThis.crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

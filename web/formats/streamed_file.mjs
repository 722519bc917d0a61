// streamed_file.mjs — a fetched model file read once, front to back, never whole: every byte hashed
// as it arrives (its sha256 is the loader's identity), the header read first, then each tensor's
// bytes in file order into one staging buffer the size of the largest tensor wanted. What the
// loader holds of the file at once is that buffer, the header while it is parsed, and one network
// chunk: LoadTransient counts them (the memory report's "load transient", docs/browser.md).
//
//   const file = new StreamedFile(response, label, transient);
//   const head = await file.read(8);                   // a new buffer of the next 8 bytes
//   const view = await file.stage(offset, nbytes);     // bytes [offset, offset + nbytes), ascending
//   const identity = await file.finish(end, {drain, size}); // the rest read and hashed -> sha256 hex
import { modelLoadError } from "./model_checks.mjs";
import { Sha256Stream } from "../sha256_stream.mjs";
import { codedError } from "../protocol.mjs";

const PIECE_BYTES = 128 * 1024;       // a byte stream's reads: what one read holds beside the staging buffer

/** Bytes a loader holds of a model file, now and at most (the "load transient" category). */
export class LoadTransient {
  constructor() { this.held = 0; this.peak = 0; this.largestTensor = 0; this.largestCopy = 0; }
  hold(n) { this.held += n; if (this.held > this.peak) this.peak = this.held; }
  release(n) { this.held -= n; }
  /** n bytes made from a staged tensor (re-ordered rows, a float32 dequantisation) held while they
   *  are written. */
  holdCopy(n) { this.hold(n); if (n > this.largestCopy) this.largestCopy = n; }
  /** {peak, largest_tensor, ratio}: the peak against the largest tensor the load had to hold: as
   *  it is in the file, or as the loader writes it (a float32 dequantisation), whichever is larger. */
  report() {
    const largest = Math.max(this.largestTensor, this.largestCopy);
    return { peak: this.peak, largest_tensor: largest, ratio: largest ? Math.round((this.peak / largest) * 1000) / 1000 : null };
  }
}

export class StreamedFile {
  constructor(response, label, transient = new LoadTransient()) {
    if (!response.body) throw modelLoadError(`${label}: the response has no body`);
    this.label = label;
    this.transient = transient;
    this.position = 0;                 // offset of the next byte a read takes
    this.received = 0;                 // bytes that came from the body (each hashed once)
    // a byte stream (a fetch body in Chromium) is read in pieces of at most PIECE_BYTES into one
    // scratch buffer of ours; any other stream hands over the pieces it makes
    try {
      this._reader = response.body.getReader({ mode: "byob" });
      this._scratch = new Uint8Array(PIECE_BYTES);
      this.transient.hold(PIECE_BYTES);
    } catch {
      this._reader = response.body.getReader();
      this._scratch = null;
    }
    this._hash = new Sha256Stream();
    this._chunk = new Uint8Array(0);   // the unread part is _chunk[_at..]
    this._at = 0;
    this._front = [];                  // bytes given back (unread), taken before the body's
    this._staging = null;
    this._stagedAt = null;             // {offset, nbytes} in the staging buffer now
    this._ended = false;
  }

  /** The next piece of bytes, or null at the end of the body. */
  async _next() {
    if (this._front.length) return this._front.shift();
    if (this._ended) return null;
    const { done, value } = this._scratch ? await this._reader.read(this._scratch) : await this._reader.read();
    if (done) { this._ended = true; this._dropScratch(); return null; }
    let piece = value instanceof Uint8Array ? value : new Uint8Array(value);
    if (this._scratch) {               // the scratch buffer came back (transferred) holding the piece
      this._scratch = new Uint8Array(piece.buffer);
    }
    this._hash.update(piece);
    this.received += piece.byteLength;
    return piece;
  }

  /** Bytes a piece adds to what is held: none when it lives in the scratch buffer (held already). */
  _counted(piece) { return this._scratch && piece.buffer === this._scratch.buffer ? 0 : piece.byteLength; }

  _dropScratch() {
    if (this._scratch) this.transient.release(this._scratch.byteLength);
    this._scratch = null;
  }

  /** Exactly n bytes into target[offset..] (or dropped when target is null); with short, fewer
   *  where the body ends first. -> the bytes taken. */
  async _take(target, offset, n, short = false) {
    const start = offset;
    while (n > 0) {
      if (this._at === this._chunk.byteLength) {
        this.transient.release(this._counted(this._chunk));
        this._chunk = new Uint8Array(0);
        this._at = 0;
        const piece = await this._next();
        if (piece === null && short) return offset - start;
        if (piece === null) throw modelLoadError(`${this.label}: the file ended early (${this.position} bytes read, ${this.position + n} expected at least)`);
        this._chunk = piece;
        this.transient.hold(this._counted(piece));
      }
      const take = Math.min(n, this._chunk.byteLength - this._at);
      if (target) target.set(this._chunk.subarray(this._at, this._at + take), offset);
      this._at += take; offset += take; n -= take; this.position += take;
    }
    return offset - start;
  }

  /** A new buffer of the next n bytes (a header). Its bytes count as held until forget(n). */
  async read(n) {
    const out = new Uint8Array(n);
    this.transient.hold(n);
    await this._take(out, 0, n);
    return out;
  }

  /** The next n bytes or, where the body ends first, fewer: a new buffer, held until forget(n). */
  async readUpTo(n) {
    const out = new Uint8Array(n);
    this.transient.hold(n);
    const got = await this._take(out, 0, n, true);
    return got === n ? out : out.subarray(0, got);
  }

  /** The caller no longer holds n bytes it read. */
  forget(n) { this.transient.release(n); }

  /** Give back bytes just read (they are read again next, and not hashed twice). */
  unread(bytes) {
    if (bytes.byteLength === 0) return;
    if (this._at < this._chunk.byteLength) this._front.unshift(this._chunk.subarray(this._at));
    this.transient.release(this._counted(this._chunk));
    this._chunk = new Uint8Array(0);
    this._at = 0;
    this._front.unshift(bytes);
    this.position -= bytes.byteLength;
  }

  /** Bytes [offset, offset + nbytes) of the file in the staging buffer (a view, valid until the next
   *  stage); offsets only ascend. size: the staging buffer's bytes, given at the first call (the
   *  largest tensor the loader will stage). */
  async stage(offset, nbytes, size = nbytes) {
    if (offset < this.position) throw codedError("E_INTERNAL", `${this.label}: bytes at ${offset} asked for after ${this.position} (out of file order)`);
    if (!this._staging) {
      this._staging = new Uint8Array(size);
      this.transient.hold(size);
    }
    if (nbytes > this._staging.byteLength) throw codedError("E_INTERNAL", `${this.label}: ${nbytes} bytes staged in a buffer of ${this._staging.byteLength}`);
    await this._take(null, 0, offset - this.position);
    this._stagedAt = null;
    await this._take(this._staging, 0, nbytes);
    this._stagedAt = { offset, nbytes };
    return this._staging.subarray(0, nbytes);
  }

  /** The staging buffer's ArrayBuffer (a loader tells its copies from the staged bytes by it). */
  get stagingBuffer() { return this._staging?.buffer ?? null; }

  /** The staged view of a source {offset, nbytes} (a tensor's bytes in the file), which must be
   *  the range staged last: a tensor map over a stream reads only the tensor being placed. */
  current(source) {
    const at = this._stagedAt;
    if (!this._staging || !at || at.offset !== source.offset || at.nbytes !== source.nbytes) {
      throw codedError("E_INTERNAL", `${this.label}: bytes at ${source.offset} read while they are not staged (out of file order)`);
    }
    return this._staging.subarray(0, source.nbytes);
  }

  /** Read the file to `end` (hashed), then the rest: refused as trailing bytes unless drain, and
   *  a body that differs from the declared size refused -> the sha256 hex of every byte. The
   *  staging buffer is released. */
  async finish(end, { drain = false, size = null } = {}) {
    this._releaseStaging();
    await this._take(null, 0, Math.max(0, end - this.position));
    if (drain) {
      while ((await this._take(null, 0, 1 << 20, true)) > 0);
    } else if (this._at < this._chunk.byteLength || (this._front.length ? true : (await this._peekEnd()) === false)) {
      this.cancel();
      throw modelLoadError(`${this.label}: trailing bytes after the ${end} bytes its header covers`);
    }
    this.transient.release(this._counted(this._chunk));
    this._chunk = new Uint8Array(0);
    this._at = 0;
    if (size !== null && this.received !== size) {
      throw modelLoadError(`${this.label}: the body held ${this.received} bytes, its Content-Length says ${size}`);
    }
    return this._hash.hexDigest();
  }

  /** true when the body has ended (nothing is left to read); otherwise the next piece is kept. */
  async _peekEnd() {
    const piece = await this._next();
    if (piece === null) return true;
    this._front.unshift(piece);
    return false;
  }

  /** Stop reading (an error, or a header probe): the download is cancelled. */
  cancel() {
    this._releaseStaging();
    this.transient.release(this._counted(this._chunk));
    this._chunk = new Uint8Array(0);
    this._at = 0;
    this._dropScratch();
    this._reader.cancel().catch(() => {});
  }

  _releaseStaging() {
    if (this._staging) this.transient.release(this._staging.byteLength);
    this._staging = null;
    this._stagedAt = null;
  }
}

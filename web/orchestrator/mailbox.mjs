// mailbox.mjs — when the orchestrator worker's event loop must run: a count of the page's messages
// to the worker that it has not yet received, shared through a SharedArrayBuffer (the page adds
// one before each postMessage, the worker takes one off as each arrives), so that synchronous
// rounds skip the event-loop hop (~0.5 ms under Pyodide) until something, such as a cancel, waits.
// Without cross-origin isolation there is no shared memory: the loop then runs every
// PAUSE_EVERY_MS, as before. Pure decisions (shouldYield) are separate from the shared state.

export const PAUSE_EVERY_MS = 10;     // no mailbox: the loop runs at least this often during a request
export const QUIET_MAX_MS = 200;      // a mailbox: with nothing waiting, still at least this often
export const MAILBOX_KIND = "mailbox"; // the page's first message, outside the protocol: {kind, mail}

/** Whether the worker yields before its next round: `sinceYieldMs` since its loop last ran,
 *  `waiting` true / false (the mailbox's count) or null (no mailbox). */
export function shouldYield(sinceYieldMs, waiting) {
  if (waiting === null) return sinceYieldMs >= PAUSE_EVERY_MS;
  return waiting || sinceYieldMs >= QUIET_MAX_MS;
}

// ---- the page's side --------------------------------------------------------------------------
/** A mailbox for `worker` (sent as its first message), or null where memory cannot be shared. */
export function openMailbox(worker) {
  if (!globalThis.crossOriginIsolated || typeof SharedArrayBuffer !== "function") return null;
  const mail = new Int32Array(new SharedArrayBuffer(4));
  worker.postMessage({ kind: MAILBOX_KIND, mail });
  return mail;
}

/** postMessage(message) to `worker`, counted in `mail` (null: not counted); a message that cannot
 *  be posted is not counted. */
export function postCounted(worker, mail, message) {
  if (mail) Atomics.add(mail, 0, 1);
  try {
    worker.postMessage(message);
  } catch (err) {
    if (mail) Atomics.sub(mail, 0, 1);
    throw err;
  }
}

// ---- the worker's side ------------------------------------------------------------------------
let inbox = null;

/** The worker's onmessage, first: true when `data` was the mailbox (taken once: a shared Int32Array
 *  of one or more elements; anything else under that kind is dropped), else counts it received. */
export function receive(data) {
  if (data?.kind !== MAILBOX_KIND) {
    if (inbox) Atomics.sub(inbox, 0, 1);
    return false;
  }
  const mail = data.mail;
  if (!inbox && mail instanceof Int32Array && mail.length >= 1 && mail.buffer instanceof SharedArrayBuffer) inbox = mail;
  return true;
}

/** true / false: whether a message waits; null: no mailbox. */
export function mailWaiting() {
  return inbox ? Atomics.load(inbox, 0) > 0 : null;
}

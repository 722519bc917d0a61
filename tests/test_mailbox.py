"""web/orchestrator/mailbox.mjs under Node: when the orchestrator worker yields to its event loop
(the decision table, with and without the page's mailbox), and the shared count itself: the page
counts each message it posts (not one that fails to post), the worker takes one off as each arrives,
takes the first well-formed mailbox only and drops a malformed one. The browser half (a cancel
still lands within a round or two when the rounds never yield on a timer) is
tests/test_browser_e2e.py's cancel test."""
from pathlib import Path

from node_harness import run_module

ROOT = Path(__file__).resolve().parents[1]
MAILBOX = ROOT / "web" / "orchestrator" / "mailbox.mjs"


def node(script: str):
    """An ES module snippet with `mb` (mailbox.mjs) imported; it prints one JSON value."""
    return run_module(MAILBOX, "mb", script)


def test_the_yield_decision():
    got = node("""
const cases = [[0, null], [9.9, null], [10, null], [0, false], [199, false], [200, false], [0, true], [500, true]];
console.log(JSON.stringify(cases.map(([ms, w]) => mb.shouldYield(ms, w))));
""")
    # no mailbox: every PAUSE_EVERY_MS (10); a mailbox: at once when a message waits, else every QUIET_MAX_MS (200)
    assert got == [False, False, True, False, False, True, True, True]


def test_the_page_counts_what_it_posts_and_the_worker_what_arrives():
    got = node("""
const sent = [];
const worker = { postMessage: (m) => sent.push(m) };
const out = {};
out.notIsolated = mb.openMailbox(worker);                 // Node: no crossOriginIsolated
globalThis.crossOriginIsolated = true;
const mail = mb.openMailbox(worker);
out.first = sent[0].kind === mb.MAILBOX_KIND && sent[0].mail === mail;
out.before = mb.mailWaiting();                            // the worker has no mailbox yet
for (let i = 0; i < 3; i++) mb.postCounted(worker, mail, { kind: "generate", i });
out.posted = Atomics.load(mail, 0);
const failing = { postMessage: () => { throw new Error("DataCloneError"); } };
try { mb.postCounted(failing, mail, { kind: "x" }); out.threw = false; } catch { out.threw = true; }
out.afterFailure = Atomics.load(mail, 0);
out.tookMailbox = mb.receive(sent[0]);
out.waiting = [mb.mailWaiting()];
for (const m of sent.slice(1)) { out.handled = mb.receive(m); out.waiting.push(mb.mailWaiting()); }
out.second = mb.receive({ kind: mb.MAILBOX_KIND, mail: new Int32Array(new SharedArrayBuffer(4)) });
mb.postCounted(worker, mail, { kind: "cancel" });
out.afterSecond = mb.mailWaiting();                       // still the first mailbox's count
console.log(JSON.stringify(out));
""")
    assert got["notIsolated"] is None and got["first"] and got["before"] is None
    assert got["posted"] == 3 and got["threw"] and got["afterFailure"] == 3
    assert got["tookMailbox"] is True and got["handled"] is False
    assert got["waiting"] == [True, True, True, False]
    assert got["second"] is True and got["afterSecond"] is True


def test_a_malformed_mailbox_is_dropped():
    got = node("""
const out = [];
for (const mail of [new Int32Array(4), new Int32Array(new SharedArrayBuffer(0)), [1], null,
                    new Float64Array(new SharedArrayBuffer(8))]) {
  out.push([mb.receive({ kind: mb.MAILBOX_KIND, mail }), mb.mailWaiting()]);
}
console.log(JSON.stringify(out));
""")
    assert got == [[True, None]] * 5        # taken off the protocol, never used: the timer rule stays

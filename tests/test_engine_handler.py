"""The orchestrator worker's protocol handler (web/orchestrator/handler.mjs), driven in node with a
mock runtime: one request at a time in arrival order, cancels applied at once, stale epochs
dropped and counted, every failure a coded envelope."""
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The scenario runs in node; it prints one JSON object that the tests below take apart.
SCRIPT = r"""
import fs from 'node:fs';
import { makeValidator } from './web/protocol.mjs';
import { createOrchestratorHandler } from './web/orchestrator/handler.mjs';
const schema = JSON.parse(fs.readFileSync('py/exactspec/core/protocol.json', 'utf8'));
const log = [], posted = [];
const tick = () => new Promise((r) => setTimeout(r, 5));
let active = 0, maxActive = 0;
const runtime = {
  async load(payload) { log.push(['load']); if (payload.models === 'bad') throw new Error('boom at load'); return { timing_ms: {}, info: {} }; },
  async generate(env, post) {
    active++; maxActive = Math.max(maxActive, active);
    log.push(['generate-start', env.request_id, env.epoch]);
    await tick(); await tick();
    active--;
    log.push(['generate-end', env.request_id]);
    const p = env.payload.prompt;
    if (p === 'throw-plain') throw new Error('something broke');
    if (p === 'throw-coded') throw new Error('E_DEVICE_LOST: gone');
    if (p === 'refuse') return { error: { code: 'E_BAD_ARGUMENT', message: 'k too large' } };
    post({ kind: 'result', request_id: env.request_id, seq: 0, epoch: env.epoch, payload: { finish_reason: 'length', stats: {} } });
    return { finish_reason: 'length' };
  },
  cancel(epoch) { log.push(['cancel', epoch]); },
  fault(spec) { log.push(['fault', spec.action]); },
  memory() { return { gpu_buffers_live: 3 }; },
  async terminate() { log.push(['terminate']); },
};
const h = createOrchestratorHandler({ runtime, post: (e) => posted.push(e), validate: makeValidator(schema), codes: schema.errors });
const env = (kind, id, epoch, payload) => ({ kind, request_id: id, seq: 0, epoch, payload });
const gen = (id, epoch, prompt = 'p') => env('generate', id, epoch, { prompt, config: {} });
h.onMessage(env('load', 'L', 0, { models: {} }));
h.onMessage(gen('A', 0));
h.onMessage(gen('B', 0));
await tick();
h.onMessage(env('cancel', 'A', 1, {}));                 // at once, while A runs
h.onMessage(env('cancel', 'A', 0, {}));                 // older than the handler's epoch: stale
h.onMessage(env('fault', 'F', 0, { action: 'x' }));     // stale too
h.onMessage(gen('C', 0));                               // stale generate: counted, still answered
h.onMessage({ kind: 'generate', request_id: 'D' });     // malformed
h.onMessage(gen('E', 1, 'throw-plain'));
h.onMessage(gen('G', 1, 'throw-coded'));
h.onMessage(gen('H', 1, 'refuse'));
h.onMessage(env('memory', 'M', 1, {}));
const last = h.onMessage(env('load', 'L2', 1, { models: 'bad' }));
await last;
h.onMessage(env('terminate', 'T', 1, {}));
await h.onMessage(gen('I', 1));
console.log(JSON.stringify({ log, posted, maxActive, state: h.state }));
"""


def run_scenario():
    r = subprocess.run(["node", "--input-type=module", "-e", SCRIPT], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


OUT = None


def scenario():
    global OUT
    if OUT is None:
        OUT = run_scenario()
    return OUT


def errors_for(out, request_id):
    return [e["payload"] for e in out["posted"] if e["request_id"] == request_id and e["kind"] == "error"]


def test_requests_run_one_at_a_time_in_arrival_order():
    out = scenario()
    assert out["maxActive"] == 1
    starts = [e[1] for e in out["log"] if e[0] == "generate-start"]
    assert starts == ["A", "B", "C", "E", "G", "H"]
    # each start follows the previous end: strictly serial
    seq = [e[0] + ":" + e[1] for e in out["log"] if e[0].startswith("generate")]
    assert seq == [x for r in starts for x in (f"generate-start:{r}", f"generate-end:{r}")]


def test_cancel_acts_at_once_and_stale_messages_are_dropped_and_counted():
    out = scenario()
    log = out["log"]
    a_start = log.index(["generate-start", "A", 0])
    a_end = log.index(["generate-end", "A"])
    assert ["cancel", 1] in log[a_start:a_end]          # applied while A ran, not queued behind it
    assert [e for e in log if e[0] == "cancel"] == [["cancel", 1]]   # the stale cancel never applied
    assert ["fault", "x"] not in log                    # the stale fault never applied
    assert out["state"]["droppedStale"] == 3            # stale cancel + stale fault + stale generate
    assert ["generate-start", "C", 0] in log            # the stale generate was still answered


def test_every_failure_is_a_coded_envelope():
    out = scenario()
    assert errors_for(out, "E") == [{"code": "E_INTERNAL", "message": "something broke", "fatal": True}]
    assert errors_for(out, "G") == [{"code": "E_DEVICE_LOST", "message": "gone", "fatal": True}]
    assert errors_for(out, "H") == [{"code": "E_BAD_ARGUMENT", "message": "k too large", "fatal": True}]
    assert errors_for(out, "L2") == [{"code": "E_MODEL_LOAD", "message": "boom at load", "fatal": True}]
    assert errors_for(out, "D")[0]["code"] == "E_PROTOCOL" and out["state"]["droppedInvalid"] == 1
    assert errors_for(out, "I") == [{"code": "E_TERMINATED", "message": "the engine was terminated", "fatal": True}]
    mem = [e["payload"] for e in out["posted"] if e["request_id"] == "M"]
    assert mem and mem[0]["stage"] == "memory" and mem[0]["gpu_buffers_live"] == 3
    assert [e["kind"] for e in out["posted"] if e["request_id"] == "L"] == ["ready"]


def test_every_envelope_posted_is_valid_and_seq_increases():
    out = scenario()
    from exactspec.core.protocol import validate_envelope
    for env in out["posted"]:
        validate_envelope(env)
    own = [e["seq"] for e in out["posted"] if e["kind"] != "result"]
    assert own == sorted(own) and len(set(own)) == len(own)


REFUSAL_SCRIPT = r"""
import fs from 'node:fs';
import { makeValidator } from './web/protocol.mjs';
import { createOrchestratorHandler } from './web/orchestrator/handler.mjs';
const schema = JSON.parse(fs.readFileSync('py/exactspec/core/protocol.json', 'utf8'));
const posted = [];
const runtime = { async generate(env, post) {
  post({ kind: 'result', request_id: env.request_id, seq: 0, epoch: env.epoch, payload: { finish_reason: 'length', stats: {} } });
  return { finish_reason: 'length' };
}, cancel() {} };
const h = createOrchestratorHandler({ runtime, post: (e) => posted.push(e), validate: makeValidator(schema), codes: schema.errors });
h.onMessage({ kind: 'cancel', request_id: 'A', seq: 0, epoch: 2, payload: {} });
await h.onMessage({ kind: 'generate', request_id: 'B', seq: 1, epoch: 2, payload: { prompt: 'x' } });      // lacks config
await h.onMessage({ kind: 'generate', request_id: 'C', seq: 2, epoch: 'two', payload: { config: {} } });  // no usable epoch
await h.onMessage({ kind: 'generate', request_id: 'D', seq: 3, epoch: 2, payload: { prompt_ids: [0, 776], config: {} } });
console.log(JSON.stringify(posted));
"""


def test_a_refused_envelope_is_answered_in_its_own_epoch():
    """After a cancel (epoch 2), a generate the envelope check refuses is answered in epoch 2, the
    epoch its sender waits in (epoch 0 was dropped by the engine as stale: the request never
    settled); one with no usable epoch gets the handler's. A token-id prompt passes the check."""
    r = subprocess.run(["node", "--input-type=module", "-e", REFUSAL_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    by_id = {e["request_id"]: e for e in json.loads(r.stdout)}
    assert by_id["B"]["kind"] == "error" and by_id["B"]["epoch"] == 2
    assert by_id["B"]["payload"] == {"code": "E_PROTOCOL", "message": "generate payload lacks config", "fatal": True}
    assert by_id["C"]["kind"] == "error" and by_id["C"]["epoch"] == 2
    assert by_id["D"]["kind"] == "result" and by_id["D"]["epoch"] == 2

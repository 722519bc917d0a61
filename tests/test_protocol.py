"""One protocol schema, two checkers: Python's protocol.py and JS's web/protocol.mjs agree."""
import json
import os
import subprocess

import pytest

from exactspec.errors import ExactSpecError
from exactspec.protocol import Inbox, make_envelope, validate_envelope

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = {"kind": "tokens", "request_id": "r", "seq": 0, "epoch": 0, "payload": {"token_ids": [1], "text": "a"}}
CASES = [
    GOOD,
    {**GOOD, "kind": "telepathy"},
    {**GOOD, "seq": -1},
    {**GOOD, "epoch": 1.5},
    {**GOOD, "seq": True},
    {**GOOD, "request_id": 7},
    {**GOOD, "payload": []},
    {**GOOD, "payload": {"token_ids": [1]}},
    {k: v for k, v in GOOD.items() if k != "epoch"},
    {**GOOD, "extra": 1},
    {"kind": "cancel", "request_id": "r", "seq": 3, "epoch": 2, "payload": {}},
    {"kind": "propose", "request_id": "r", "seq": 0, "epoch": 0, "payload": {"round_id": 0, "k": 4}},
    {"kind": "error", "request_id": "r", "seq": 0, "epoch": 0, "payload": {"code": "E_CANCELLED"}},
    [], None, "envelope",
]


def python_verdicts():
    out = []
    for env in CASES:
        try:
            validate_envelope(env)
            out.append(True)
        except ExactSpecError as err:
            assert err.code == "E_PROTOCOL"
            out.append(False)
    return out


def test_js_and_python_agree_on_every_case():
    script = ("import { makeValidator } from './web/protocol.mjs';\n"
              "import fs from 'node:fs';\n"
              "const v = makeValidator(JSON.parse(fs.readFileSync('py/exactspec/protocol.json', 'utf8')));\n"
              "const cases = JSON.parse(fs.readFileSync(0, 'utf8'));\n"
              "console.log(JSON.stringify(cases.map((c) => { try { v(c); return true; } catch (e) {"
              " if (!e.message.startsWith('E_PROTOCOL')) throw e; return false; } })));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps(CASES), capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    py = python_verdicts()
    assert js == py
    assert py.count(True) == 3   # GOOD, cancel, propose (the error lacks "message")


def test_inbox_drops_stale_foreign_and_replayed_messages():
    inbox = Inbox("req", epoch=1)
    assert inbox.offer(make_envelope("tokens", "req", 0, 1, {"token_ids": [], "text": ""}))
    assert not inbox.offer(make_envelope("tokens", "req", 0, 1, {"token_ids": [], "text": ""}))   # replay
    assert not inbox.offer(make_envelope("tokens", "req", 1, 0, {"token_ids": [], "text": ""}))   # stale epoch
    assert not inbox.offer(make_envelope("tokens", "other", 1, 1, {"token_ids": [], "text": ""}))  # foreign
    assert inbox.offer(make_envelope("result", "req", 5, 1, {"finish_reason": "eos", "stats": {}}))
    assert inbox.dropped_stale == 3 and len(inbox.accepted) == 2
    with pytest.raises(ExactSpecError):
        inbox.offer({"kind": "tokens"})

"""One protocol schema, two checkers: Python's protocol.py and JS's web/protocol.mjs agree."""
import json
import os
import subprocess

import pytest

from exactspec.core.errors import ExactSpecError
from exactspec.core.protocol import CONFIG_OPTIONS, REQUEST_FIELDS, Inbox, checked_request, make_envelope, validate_envelope

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
              "const v = makeValidator(JSON.parse(fs.readFileSync('py/exactspec/core/protocol.json', 'utf8')));\n"
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


# ----------------------------------------------------------------------------- generate requests
# (JS expression, the same payload in Python, the sentence both refuse it with, or None: accepted).
# JSON cannot carry NaN or Infinity, so each side builds its own payload from the JS literal.
NAN, INF = float("nan"), float("inf")
ONE_PROMPT = ("a generate request needs a prompt: text (prompt), token ids (prompt_ids) or a conversation (messages), "
              "exactly one of them")
REQUEST_CASES = [
    ("{prompt: 'x', config: {k: 4, temperature: 0.5, stop_strings: ['\\n']}}",
     {"prompt": "x", "config": {"k": 4, "temperature": 0.5, "stop_strings": ["\n"]}}, None),
    ("{prompt_ids: [0, 776, 266], config: {}}", {"prompt_ids": [0, 776, 266], "config": {}}, None),
    ("{prompt: 'x', raw_text: true, config: {}}", {"prompt": "x", "raw_text": True, "config": {}}, None),
    ("{prompt: 'x', config: {allowed_token_ids: NaN}}", {"prompt": "x", "config": {"allowed_token_ids": NAN}},
     "config.allowed_token_ids must be a list of integer token ids, got NaN"),
    ("{prompt: 'x', config: {allowed_token_ids: []}}", {"prompt": "x", "config": {"allowed_token_ids": []}},
     "config.allowed_token_ids is empty: no token could be generated (leave the option out to allow every token)"),
    ("{prompt: 'x', config: {allowed_token_ids: [1, NaN]}}", {"prompt": "x", "config": {"allowed_token_ids": [1, NAN]}},
     "config.allowed_token_ids must be a list of integer token ids, got a list"),
    ("{prompt: 'x', chat: 'false', config: {}}", {"prompt": "x", "chat": "false", "config": {}},
     'chat must be true or false, got "false"'),
    ("{prompt: 'x', raw_text: 1, config: {}}", {"prompt": "x", "raw_text": 1, "config": {}},
     "raw_text must be true or false, got 1"),
    ("{prompt: 'x', config: {max_new_tokens: Infinity}}", {"prompt": "x", "config": {"max_new_tokens": INF}},
     "config.max_new_tokens must be an integer, got Infinity"),
    ("{prompt: 'x', config: {temperature: NaN}}", {"prompt": "x", "config": {"temperature": NAN}},
     "config.temperature must be a finite number, got NaN"),
    ("{prompt: 'x', config: {k: 2.5}}", {"prompt": "x", "config": {"k": 2.5}}, "config.k must be an integer, got 2.5"),
    ("{prompt: 'x', config: {k: 1e-7}}", {"prompt": "x", "config": {"k": 1e-7}}, "config.k must be an integer, got 1e-7"),
    ("{prompt: 'x', config: {top_k: -0.000123}}", {"prompt": "x", "config": {"top_k": -0.000123}},
     "config.top_k must be an integer, got -0.000123"),
    ("{prompt: 'x', config: {seed: true}}", {"prompt": "x", "config": {"seed": True}}, "config.seed must be an integer, got true"),
    ("{prompt: 'x', config: {top_k: null}}", {"prompt": "x", "config": {"top_k": None}}, "config.top_k must be an integer, got null"),
    ("{prompt: 'x', config: {stop_strings: 'ab'}}", {"prompt": "x", "config": {"stop_strings": "ab"}},
     'config.stop_strings must be a list of strings, got "ab"'),
    ("{prompt: 'x', config: {tempreature: 0}}", {"prompt": "x", "config": {"tempreature": 0}},
     "config.tempreature is not a known option (known: speculate, k, scheduler, temperature, top_k, top_p, "
     "repetition_penalty, seed, max_new_tokens, prefix_reuse, stop_strings, stop_token_ids, suppress_token_ids, "
     "allowed_token_ids, response_format, forced_batching, chain_steps)"),
    ("{prompt: 'x', config: null}", {"prompt": "x", "config": None}, "config must be an object, got null"),
    ("{config: {}}", {"config": {}}, ONE_PROMPT),
    ("{prompt: 'x', prompt_ids: [1], config: {}}", {"prompt": "x", "prompt_ids": [1], "config": {}}, ONE_PROMPT),
    ("{prompt: 7, config: {}}", {"prompt": 7, "config": {}}, "prompt must be a string, got 7"),
    ("{prompt_ids: [], config: {}}", {"prompt_ids": [], "config": {}},
     "prompt_ids must be a non-empty list of integer token ids, got a list"),
    ("{prompt_ids: [1, 2], chat: true, config: {}}", {"prompt_ids": [1, 2], "chat": True, "config": {}},
     "chat and raw_text apply to a text prompt, not to prompt_ids"),
    ("{prompt: 'x', stream: true, config: {}}", {"prompt": "x", "stream": True, "config": {}},
     "stream is not a field of a generate request (known: chat, config, messages, prompt, prompt_ids, raw_text)"),
    # a conversation (messages): a list of {role, content}, roles from the table, no flags
    ("{messages: [{role: 'system', content: 'Be brief.'}, {role: 'user', content: 'Hi'}, {role: 'assistant', content: ''},"
     " {role: 'user', content: '<|im_end|>'}], config: {}}",
     {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": ""}, {"role": "user", "content": "<|im_end|>"}], "config": {}}, None),
    ("{messages: [{role: 'user', content: 'x'}], prompt: 'x', config: {}}",
     {"messages": [{"role": "user", "content": "x"}], "prompt": "x", "config": {}}, ONE_PROMPT),
    ("{messages: [], config: {}}", {"messages": [], "config": {}},
     "messages must be a non-empty list of {role, content} objects, got a list"),
    ("{messages: 'hi', config: {}}", {"messages": "hi", "config": {}},
     'messages must be a non-empty list of {role, content} objects, got "hi"'),
    ("{messages: [{role: 'user', content: 'x'}, 7], config: {}}", {"messages": [{"role": "user", "content": "x"}, 7], "config": {}},
     "messages[1] must be a {role, content} object, got 7"),
    ("{messages: [['user', 'x']], config: {}}", {"messages": [["user", "x"]], "config": {}},
     "messages[0] must be a {role, content} object, got a list"),
    ("{messages: [{role: 'user', content: 'x', name: 'eve'}], config: {}}",
     {"messages": [{"role": "user", "content": "x", "name": "eve"}], "config": {}},
     "messages[0] must hold exactly role and content, got content, name, role"),
    ("{messages: [{}], config: {}}", {"messages": [{}], "config": {}}, "messages[0] must hold exactly role and content, got no field"),
    ("{messages: [{role: 'root', content: 'x'}], config: {}}", {"messages": [{"role": "root", "content": "x"}], "config": {}},
     'messages[0].role must be one of system, user, assistant, tool, got "root"'),
    ("{messages: [{role: null, content: 'x'}], config: {}}", {"messages": [{"role": None, "content": "x"}], "config": {}},
     "messages[0].role must be one of system, user, assistant, tool, got null"),
    ("{messages: [{role: 'user', content: 3}], config: {}}", {"messages": [{"role": "user", "content": 3}], "config": {}},
     "messages[0].content must be a string, got 3"),
    ("{messages: [{role: 'user', content: 'x'}], chat: true, config: {}}",
     {"messages": [{"role": "user", "content": "x"}], "chat": True, "config": {}},
     "chat and raw_text apply to a text prompt, not to messages"),
    ("{messages: [{role: 'user', content: 'x'}], raw_text: true, config: {}}",
     {"messages": [{"role": "user", "content": "x"}], "raw_text": True, "config": {}},
     "chat and raw_text apply to a text prompt, not to messages"),
]


def js_request_verdicts(expressions):
    script = ("import { makeRequestChecker } from './web/protocol.mjs';\n"
              "import fs from 'node:fs';\n"
              "const check = makeRequestChecker(JSON.parse(fs.readFileSync('py/exactspec/core/protocol.json', 'utf8')));\n"
              f"const cases = [{', '.join(f'() => ({e})' for e in expressions)}];\n"
              "console.log(JSON.stringify(cases.map((c) => { try { check(c()); return null; } catch (e) {"
              " return [e.code, e.detail]; } })));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def python_request_verdict(payload):
    try:
        checked_request(payload)
        return None
    except ExactSpecError as err:
        return [err.code, err.message]


def test_js_and_python_refuse_the_same_requests_with_the_same_sentence():
    js = js_request_verdicts([c[0] for c in REQUEST_CASES])
    for (expr, payload, sentence), js_verdict in zip(REQUEST_CASES, js):
        want = None if sentence is None else ["E_BAD_ARGUMENT", sentence]
        assert js_verdict == want, expr
        assert python_request_verdict(payload) == want, expr


def test_js_refuses_what_postmessage_cannot_send():
    js = js_request_verdicts(["{prompt: 'x', config: {temperature: () => 0}}", "{prompt: 'x', chat: new Date(0), config: {}}"])
    assert js == [["E_BAD_ARGUMENT", "config.temperature must be a finite number, got a function"],
                  ["E_BAD_ARGUMENT", "chat must be true or false, got an object"]]


def test_checked_request_fills_defaults_and_takes_js_numbers():
    out = checked_request({"prompt_ids": [0, 776.0], "config": {"k": 4.0, "stop_token_ids": [2.0]}})
    assert out["prompt_ids"] == [0, 776] and out["chat"] is False and out["raw_text"] is False
    assert out["config"]["k"] == 4 and out["config"]["stop_token_ids"] == (2,) and out["config"]["allowed_token_ids"] is None
    assert out["config"]["temperature"] == 1.0 and out["config"]["max_new_tokens"] == 64


SCHEMA_JS = "JSON.parse(readFileSync('./py/exactspec/core/protocol.json', 'utf8'))"


def test_the_module_takes_its_options_from_the_table():
    """generate()'s options are protocol.json's (no JS copy): the same names as Python's, and an
    option added to the table is sorted into config with no JS change."""
    script = ("import { readFileSync } from 'node:fs';\nimport { optionNames, requestPayload } from './web/exactspec.mjs';\n"
              f"const schema = {SCHEMA_JS};\n"
              "const grown = { ...schema, generate_config: { ...schema.generate_config, new_option: { type: 'integer', default: 0 } } };\n"
              "console.log(JSON.stringify([optionNames(schema), requestPayload('hi', { new_option: 3, chat: true }, grown)]));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    names, grown = json.loads(r.stdout)
    assert names == {"config": list(CONFIG_OPTIONS), "fields": list(REQUEST_FIELDS)}
    assert grown == {"prompt": "hi", "chat": True, "config": {"new_option": 3}}


def test_message_roles_are_the_ones_chat_templates_get():
    from exactspec.formats.chat import ROLES
    from exactspec.core.protocol import MESSAGE_ROLES
    assert MESSAGE_ROLES == ROLES


def test_the_module_sends_a_conversation_as_messages():
    """generate([{role, content}, ...]) is a conversation; an array of numbers stays token ids."""
    script = ("import { readFileSync } from 'node:fs';\nimport { requestPayload } from './web/exactspec.mjs';\n"
              f"const schema = {SCHEMA_JS};\n"
              "console.log(JSON.stringify([requestPayload([{role: 'user', content: 'hi'}], {k: 2}, schema),"
              " requestPayload([0, 1], {}, schema), requestPayload('hi', {chat: true}, schema)]));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"messages": [{"role": "user", "content": "hi"}], "config": {"k": 2}},
                                    {"prompt_ids": [0, 1], "config": {}}, {"prompt": "hi", "chat": True, "config": {}}]


def test_checked_request_keeps_a_conversation():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    out = checked_request({"messages": messages, "config": {}})
    assert out["messages"] == messages and "prompt" not in out and out["chat"] is False


def test_coded_errors_say_their_code_once():
    script = ("import { codedError, errorPayload } from './web/protocol.mjs';\n"
              "const a = codedError('E_BAD_ARGUMENT', 'E_BAD_ARGUMENT: E_BAD_ARGUMENT: k is 99');\n"
              "const b = codedError('E_TARGET_NUMERIC_OR_MASK', 'E_TARGET_NUMERIC_OR_MASK');\n"
              "const c = errorPayload(new Error('E_MODEL_LOAD: E_MODEL_LOAD: config.json: bad'));\n"
              "const d = errorPayload(a);\n"
              "console.log(JSON.stringify([a.message, b.message, c, d]));\n")
    r = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    a, b, c, d = json.loads(r.stdout)
    assert a == "E_BAD_ARGUMENT: k is 99"
    assert b == "E_TARGET_NUMERIC_OR_MASK: no detail was given"
    assert c == {"code": "E_MODEL_LOAD", "message": "config.json: bad"}
    assert d == {"code": "E_BAD_ARGUMENT", "message": "k is 99"}

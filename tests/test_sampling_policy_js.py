"""web/sampling_policy.mjs, the one JS policy check (WebGPU acceptor, WASM champion, WASM draft), refuses what SamplingPolicy.validate refuses, in its sentences."""
import json
import subprocess
from pathlib import Path

import pytest

from exactspec.core.errors import ExactSpecError
from exactspec.core.policy import SamplingPolicy

ROOT = Path(__file__).resolve().parent.parent
V = 50
BAD = [{"temperature": -1}, {"top_k": -1}, {"top_k": 1.5}, {"top_p": 0}, {"top_p": 1.5},
       {"repetition_penalty": 0}, {"repetition_penalty": -2}, {"suppress_token_ids": [3, 100]}]


def js_verdicts(policies):
    script = """
import { checkedPolicy } from "./web/sampling_policy.mjs";
console.log(JSON.stringify(JSON.parse(process.argv[1]).map((p) => {
  try { checkedPolicy(p, %d); return null; } catch (err) { return [err.code, err.message]; }
})));
""" % V
    r = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps(policies)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_js_check_says_what_python_says():
    got = js_verdicts(BAD + [{}, {"temperature": 0, "top_k": 5, "top_p": 0.5, "suppress_token_ids": [0, 49]}])
    for policy, verdict in zip(BAD, got):
        with pytest.raises(ExactSpecError) as want:
            SamplingPolicy(**policy).validate(V)
        assert verdict == [want.value.code, str(want.value)], (policy, verdict)
    assert got[len(BAD):] == [None, None]


def test_every_js_backend_uses_it():
    """The acceptor and both WASM loaders import it and keep no checker of their own."""
    for path in ("web/gpu/accept.mjs", "web/champion_wasm/champion_wasm.mjs", "web/draft/draft.mjs"):
        text = (ROOT / path).read_text()
        assert 'import { checkedPolicy } from "../sampling_policy.mjs";' in text, path
        assert "must be finite and" not in text and "function checkPolicy" not in text and "policyNumbers" not in text, path

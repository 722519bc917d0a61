"""xgrammar masks: the browser build (web/grammar/xgrammar_masks.mjs over npm @mlc-ai/web-xgrammar,
run in Node) and the CPython twin (reference/xgrammar_masks.py over PyPI xgrammar) give the same
mask, word for word, at every step of a fixed accepted token path, for each spec type, after
rollbacks and re-accepts too; both refuse the same ids and the same bad specs in the same words
(docs/grammar.md, "Masks").

Paths are built here, deterministically, on the Python side: the tokenizers library's ids of a valid
output while the constraint accepts them, then at each step the allowed id whose bytes are the
longest prefix of the rest of the output (the lowest such id on a tie), then a stop id.
"""
import base64
import hashlib
import json

import numpy as np
import pytest

from browser_fixture import chromium_browser, http_server  # noqa: F401
from exactspec.core.errors import E_BAD_ARGUMENT, ExactSpecError
from exactspec.host.server import REPO_ROOT
from exactspec.reference import xgrammar_masks as xm
from node_harness import run_harness

HARNESS = REPO_ROOT / "web" / "tests" / "grammar_masks_harness.mjs"
TOKENIZER = REPO_ROOT / "web" / "models" / "smollm2-draft" / "tokenizer.json"
VOCAB = 49152                 # SmolLM2's embedding rows = its tokenizer's ids
PADDED_VOCAB = VOCAB + 40     # a model with more rows than the tokenizer has ids
STOP = 2                      # <|im_end|>

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "status": {"type": "string", "enum": ["active", "inactive", "banned"]},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["name", "status", "age", "tags", "address"],
}
SCHEMA_VALUE = {"name": "Ada Lovelace", "status": "inactive", "age": 36, "tags": ["math", "engines"],
                "address": {"city": "London"}}
EBNF = 'root ::= item ("; " item)*\nitem ::= [a-z]+ "=" [0-9]+\n'
LONG_JSON = json.dumps({"id": 7, "ok": True, "ratio": 2.5, "none": None, "items": [1, -2, "three", [4, {"five": 5}]],
                        "meta": {"author": "Charles Babbage", "year": 1837, "notes": "difference engine, analytical engine"}},
                       indent=1)

CASES = [   # name, spec, a valid output
    ("json_schema", {"type": "json_schema", "schema": json.dumps(SCHEMA)}, json.dumps(SCHEMA_VALUE, separators=(", ", ": "))),
    ("regex_date", {"type": "regex", "pattern": r"\d{4}-\d{2}-\d{2}"}, "2024-02-29"),
    ("regex_email", {"type": "regex", "pattern": r"[a-z]+(\.[a-z]+)?@[a-z]+\.(com|org)"}, "ada.lovelace@engines.org"),
    ("grammar", {"type": "grammar", "ebnf": EBNF, "root": "root"}, "alpha=1; beta=22; gamma=333; delta=4444; omega=5"),
    ("json_object", {"type": "json_object"}, LONG_JSON),
]
BAD = [   # (what, spec): each refused on both sides with E_BAD_ARGUMENT, in the same words
    ("schema: unknown type", {"type": "json_schema", "schema": '{"type": "nonsense"}'}),
    ("schema: unknown type, again", {"type": "json_schema", "schema": '{"type": "nonsense"}'}),
    ("schema: not JSON", {"type": "json_schema", "schema": '{"type": "objec'}),
    ("ebnf: undefined rule", {"type": "grammar", "ebnf": 'root ::= "a" | b', "root": "root"}),
    ("ebnf: no root rule", {"type": "grammar", "ebnf": 'start ::= "a"', "root": "root"}),
    ("ebnf: syntax", {"type": "grammar", "ebnf": 'root ::= ("a"', "root": "root"}),
    ("regex: unclosed group", {"type": "regex", "pattern": "(a"}),
    ("regex: reversed range", {"type": "regex", "pattern": "[z-a]"}),
    ("spec: missing field", {"type": "regex"}),
    ("spec: unknown type", {"type": "lark", "grammar": "x"}),
    ("spec: extra field", {"type": "json_object", "schema": "{}"}),
] + [(f"ebnf: undefined rule x{k}", {"type": "grammar", "ebnf": f"root ::= x{k}", "root": "root"}) for k in range(25)]


@pytest.fixture(scope="module")
def tokenizer_json():
    return json.loads(TOKENIZER.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def contexts(tokenizer_json):
    return {VOCAB: xm.GrammarContext(tokenizer_json, VOCAB, [STOP]),
            PADDED_VOCAB: xm.GrammarContext(tokenizer_json, PADDED_VOCAB, [STOP])}


def decoded_vocab(context):
    return [bytes(t) for t in context.tokenizer_info.decoded_vocab]


def build_path(context, spec, text):
    """A fixed accepted path for `text` under `spec` (see the module docstring), ending in STOP."""
    from tokenizers import Tokenizer

    planned = Tokenizer.from_file(str(TOKENIZER)).encode(text, add_special_tokens=False).ids
    decoded = decoded_vocab(context)
    compiled, _, _ = context.compile(spec)
    m = context.matcher(compiled)
    target, done, path, following = text.encode(), 0, [], True
    while True:
        allowed = xm.allowed_ids(m.mask())
        assert allowed, f"{spec['type']}: no id allowed after {path}"
        rest = target[done:]
        if not rest:
            assert STOP in allowed, f"{spec['type']}: the output is complete but the stop id is not allowed"
            assert m.accept(STOP)
            return path + [STOP]
        nxt = planned[len(path)] if following and len(path) < len(planned) else None
        if nxt is not None and nxt in allowed and rest.startswith(decoded[nxt]):
            choice = nxt
        else:
            following = False
            fits = [i for i in allowed if decoded[i] and rest.startswith(decoded[i])]
            assert fits, f"{spec['type']}: the output leaves the constraint at byte {done}: {rest[:20]!r}"
            choice = max(fits, key=lambda i: (len(decoded[i]), -i))
        assert m.accept(choice)
        path.append(choice)
        done += len(decoded[choice])


def ops_for(context, spec, path, long_rollback):
    """The op list both sides run: per step a mask, a refused id (the lowest the mask forbids) and
    its mask again (state unchanged), the accept; every 7th step a rollback of 3 and the re-accepts;
    at the end the terminated state, a rollback of `long_rollback` (or all) and the re-accepts."""
    compiled, _, _ = context.compile(spec)
    m = context.matcher(compiled)
    ops = []

    def step(token):
        mask = m.mask()
        ids = set(xm.allowed_ids(mask))
        refused = next(i for i in range(context.tokenizer_count) if i not in ids)
        ops.extend([["mask"], ["reject", refused], ["mask"], ["accept", token]])
        assert m.accept(token)

    for k, token in enumerate(path):
        step(token)
        if k % 7 == 6 and k + 1 < len(path):
            ops.extend([["rollback", 3], ["mask"]])
            m.rollback(3)
            for t in path[k - 2:k + 1]:
                step(t)
    ops.extend([["terminated"], ["mask"], ["reject", path[-1]]])
    n = min(long_rollback, len(path)) if long_rollback else len(path)
    ops.extend([["rollback", n], ["terminated"]])
    m.rollback(n)
    for t in path[len(path) - n:]:
        step(t)
    ops.extend([["terminated"], ["mask"]])
    return ops


def run_ops(context, spec, ops, stops=None):
    compiled, _, _ = context.compile(spec)
    m = context.matcher(compiled, stops)
    out = []
    for op in ops:
        if op[0] == "mask":
            out.append(m.mask())
        elif op[0] in ("accept", "reject"):
            out.append(m.accept(op[1]))
        elif op[0] == "rollback":
            m.rollback(op[1])
            out.append(None)
        else:
            out.append(m.terminated())
    return out


def assert_same(name, ops, js, py, n_words):
    assert len(js) == len(py) == len(ops), name
    for i, (op, a, b) in enumerate(zip(ops, js, py)):
        assert not isinstance(a, dict), f"{name} op {i} {op}: js failed ({a}), python gave {b!r}"
        if op[0] == "mask":
            a = np.frombuffer(base64.b64decode(a), dtype=np.uint32)
            assert a.shape == b.shape == (n_words,), f"{name} op {i}: {a.shape} {b.shape}"
            if not np.array_equal(a, b):
                w = int(np.flatnonzero(a != b)[0])
                raise AssertionError(f"{name} op {i} (mask): word {w} differs: js {a[w]:#010x} python {b[w]:#010x} "
                                     f"({int((a != b).sum())} words differ; allowed js {xm.count_allowed(a)}, "
                                     f"python {xm.count_allowed(b)})")
        else:
            assert a == b, f"{name} op {i} {op}: js {a!r} python {b!r}"
        if op[0] == "accept":
            assert b is True, f"{name} op {i}: the path's id {op[1]} was refused"
        if op[0] == "reject":
            assert b is False, f"{name} op {i}: the refused id {op[1]} was accepted"


@pytest.fixture(scope="module")
def run(contexts, tokenizer_json):
    """Both sides on the same job: (job, the harness's output, Python's expected results)."""
    base = contexts[VOCAB]
    cases, expected = [], {}
    for name, spec, text in CASES:
        path = build_path(base, spec, text)
        assert 8 <= len(path) <= 120, (name, len(path))
        ops = ops_for(base, spec, path, 64 if name == "json_object" else 0)
        cases.append({"name": name, "spec": spec, "ops": ops, "path": path})
        expected[name] = run_ops(base, spec, ops)
    # the padded vocabulary: ids at or beyond the tokenizer's count are never allowed nor accepted;
    # and a matcher with other stop ids than its context's
    padded = contexts[PADDED_VOCAB]
    spec = {"type": "json_object"}
    path = build_path(padded, spec, '{"a": [1, 2]}')
    ops = ops_for(padded, spec, path, 0) + [["rollback", len(path)], ["reject", VOCAB], ["reject", PADDED_VOCAB - 1],
                                            ["reject", -1], ["mask"]]
    stops_ops = [["mask"], ["accept", path[0]], ["mask"]]
    padded_cases = [{"name": "padded_json_object", "spec": spec, "ops": ops},
                    {"name": "padded_other_stops", "spec": spec, "stops": [STOP, 0], "ops": stops_ops}]
    expected["padded_json_object"] = run_ops(padded, spec, ops)
    expected["padded_other_stops"] = run_ops(padded, spec, stops_ops, [STOP, 0])
    job = {
        "tokenizer": str(TOKENIZER),
        "contexts": [{"vocabSize": VOCAB, "stopTokenIds": [STOP], "cases": cases},
                     {"vocabSize": PADDED_VOCAB, "stopTokenIds": [STOP], "cases": padded_cases}],
        "bad": [spec for _, spec in BAD],
        "timingSpec": {"type": "json_schema", "schema": json.dumps(SCHEMA, indent=2)},
        "regexPatterns": [r"\d{4}-\d{2}-\d{2}", 'a"b\\c', "caf\u00e9|\u65e5\u672c", "\t\n\x01"],
        "sentences": ["[FATAL] /Users/x/xgrammar/cpp/json_schema_converter.cc:902: Unsupported type \"x\"\nAborted()",
                      "[16:04:42] /project/cpp/json_schema_converter.cc:3460: Check failed: (err.empty()) is false: "
                      "Failed to parse JSON: syntax error at line 1 near: . The JSON string is:{\"type\": \"objec",
                      "x" * 300, "", "plain words without a period"],
        "canonical": [{"type": "grammar", "root": "root", "ebnf": "root ::= \"\u00e9\""}, {"schema": "{}", "type": "json_schema"}],
    }
    return job, run_harness(HARNESS, job), expected


def test_masks_equal_word_for_word_along_each_path(run, contexts):
    job, out, expected = run
    for ctx_job, ctx_out in zip(job["contexts"], out["contexts"]):
        n_words = (ctx_job["vocabSize"] + 31) // 32
        assert ctx_out["nWords"] == n_words and ctx_out["tokenizerCount"] == VOCAB
        for case in ctx_job["cases"]:
            got = ctx_out["cases"][case["name"]]
            assert_same(case["name"], case["ops"], got["results"], expected[case["name"]], n_words)
    # every path is 8..120 ids long, the json_object one at least 64 (rolled back 64 at once)
    lengths = {c["name"]: len(c["path"]) for c in job["contexts"][0]["cases"]}
    assert lengths["json_object"] > 64, lengths
    print("\npath lengths:", lengths)


def test_ids_beyond_the_tokenizer_are_never_allowed(run):
    _, out, _ = run
    results = out["contexts"][1]["cases"]["padded_json_object"]["results"]
    for r in results:
        if isinstance(r, str):
            words = np.frombuffer(base64.b64decode(r), dtype=np.uint32)
            assert words.shape == ((PADDED_VOCAB + 31) // 32,)
            assert not any(i >= VOCAB for i in xm.allowed_ids(words))
    assert results[-4:-1] == [False, False, False]


def test_masks_of_a_terminated_matcher_are_empty_and_refuse_everything(run):
    job, out, expected = run
    for case in job["contexts"][0]["cases"]:
        ops, res = case["ops"], out["contexts"][0]["cases"][case["name"]]["results"]
        i = ops.index(["terminated"])
        assert res[i] is True and res[i + 2] is False            # after the stop id: terminated, nothing accepted
        assert xm.count_allowed(np.frombuffer(base64.b64decode(res[i + 1]), dtype=np.uint32)) == 0
        assert res[i + 4] is False                               # rolled back: running again


def test_bad_specs_are_refused_on_both_sides_in_the_same_words(run, contexts):
    _, out, _ = run
    assert len(out["bad"]) == len(BAD)
    for (what, spec), js in zip(BAD, out["bad"]):
        with pytest.raises(ExactSpecError) as e:
            contexts[VOCAB].compile(spec)
        assert e.value.code == E_BAD_ARGUMENT, what
        assert js.get("code") == E_BAD_ARGUMENT, (what, js)
        assert js["message"] == f"{E_BAD_ARGUMENT}: {e.value.message}", what
        assert "\n" not in e.value.message and len(e.value.message) < 300, what
        if what.startswith(("schema", "ebnf", "regex")):
            assert "does not compile: " in e.value.message and "Aborted" not in js["message"], (what, js)
    messages = {what: js["message"] for (what, _), js in zip(BAD, out["bad"])}
    assert messages["schema: unknown type"].endswith('Unsupported type "nonsense"')
    assert 'Rule "b" is not defined' in messages["ebnf: undefined rule"]
    assert "parenthesis is not closed" in messages["regex: unclosed group"]


def test_the_rest_of_the_helpers_agree(run, tokenizer_json):
    job, out, _ = run
    vocab = xm.encoded_vocab(tokenizer_json)
    assert out["vocabSha256"] == hashlib.sha256(json.dumps(vocab, ensure_ascii=False, separators=(",", ":"))
                                                .encode()).hexdigest()
    assert out["regexTags"] == [xm.regex_structural_tag(p) for p in job["regexPatterns"]]
    assert out["sentences"] == [xm.xgrammar_sentence(s) for s in job["sentences"]]
    assert out["sentences"][:2] == ['Unsupported type "x"', "Failed to parse JSON: syntax error at line 1 near: ."]
    assert out["canonical"] == [xm.canonical_spec_json(s) for s in job["canonical"]]


def test_compile_is_cached_per_spec_and_rollback_is_bounded(run, contexts):
    _, out, _ = run
    t = out["timings"]
    assert t["firstCached"] is False and t["cachedCached"] is True and t["sameObject"] is True
    ctx0 = out["contexts"][0]
    for name, case in ctx0["cases"].items():
        assert case["rollbackError"]["code"] == E_BAD_ARGUMENT, name
        assert case["afterDispose"] == E_BAD_ARGUMENT, name
    assert ctx0["afterContextDispose"] == E_BAD_ARGUMENT
    spec = {"type": "json_schema", "schema": json.dumps(SCHEMA, indent=2)}
    first, first_ms, first_cached = contexts[VOCAB].compile(spec)
    again, again_ms, again_cached = contexts[VOCAB].compile(dict(reversed(list(spec.items()))))   # same canonical JSON
    assert again is first and again_cached and not first_cached
    m = contexts[VOCAB].matcher(first)
    with pytest.raises(ExactSpecError) as e:
        m.rollback(1)
    assert e.value.code == E_BAD_ARGUMENT
    print(f"\ncompile of the schema on the {VOCAB}-id vocabulary: Node first {t['firstCompileMs']:.1f} ms, cached "
          f"{t['cachedCompileMs']:.3f} ms (context {t['contextMs']:.0f} ms); CPython first {first_ms:.1f} ms, cached "
          f"{again_ms:.3f} ms; Node mask step {ctx0['cases']['json_schema']['msPerMaskStep']:.2f} ms")


def test_tokenizer_info_is_the_one_from_huggingface_builds(contexts):
    """The vocabulary construction is xgrammar's own TokenizerInfo.from_huggingface on this tokenizer:
    the same decoded vocabulary, type, size, prefix-space flag, stop and special ids."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER))
    assert xgr.TokenizerInfo._detect_metadata_from_hf(tok.backend_tokenizer.to_str()) == \
        {"vocab_type": xgr.VocabType.BYTE_LEVEL, "add_prefix_space": False}
    for size, ours in contexts.items():
        hf = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=size, stop_token_ids=[STOP])
        mine = ours.tokenizer_info
        assert (mine.vocab_type, mine.vocab_size, mine.add_prefix_space, mine.stop_token_ids) == \
            (hf.vocab_type, hf.vocab_size, hf.add_prefix_space, hf.stop_token_ids) == \
            (xgr.VocabType.BYTE_LEVEL, size, False, [STOP])
        assert mine.decoded_vocab == hf.decoded_vocab
        assert mine.special_token_ids == hf.special_token_ids


def test_regex_as_a_structural_tag_is_compile_regex(contexts):
    """The regex construction both sides share (a structural tag) gives compile_regex's masks."""
    ctx = contexts[VOCAB]
    for name, spec, text in CASES:
        if spec["type"] != "regex":
            continue
        path = build_path(ctx, spec, text)
        a = ctx.matcher(ctx.compile(spec)[0])
        b = xm.GrammarMatcher(ctx, ctx.compiler.compile_regex(spec["pattern"]), [STOP])
        for token in path:
            assert np.array_equal(a.mask(), b.mask()), name
            assert a.accept(token) and b.accept(token)
        assert a.terminated() and b.terminated()


def test_helpers_count_and_name_the_allowed_ids():
    mask = np.zeros(4, dtype=np.uint32)
    assert (xm.count_allowed(mask), xm.only_allowed(mask), xm.allowed_ids(mask)) == (0, -1, [])
    mask[2] = 1 << 31
    assert (xm.count_allowed(mask), xm.only_allowed(mask), xm.allowed_ids(mask)) == (1, 95, [95])
    mask[0] = 0b101
    assert (xm.count_allowed(mask), xm.only_allowed(mask), xm.allowed_ids(mask)) == (3, -1, [0, 2, 95])
    assert xm.xgrammar_sentence("[12:00:00] /a/b.cc:1: First. Second.") == "First."


def test_the_core_package_imports_without_xgrammar():
    import subprocess
    import sys

    code = ("import sys; sys.modules['xgrammar'] = None\n"
            "import exactspec, exactspec.core.orchestrator, exactspec.reference.xgrammar_masks as xm\n"
            "try:\n    xm.GrammarContext({'model': {'vocab': {'a': 0}}}, 1, [0])\nexcept ImportError:\n    print('lazy')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "lazy", r.stderr


# ---- in headless Chromium: the served bundle imported as a module, under the server's CSP ----

BROWSER_WALK = """async ({ spec, path, bad }) => {
  const G = await import("/web/grammar/xgrammar_masks.mjs");
  const tokenizerJson = await (await fetch("/web/models/smollm2-draft/tokenizer.json")).json();
  let t0 = performance.now();
  const context = await G.createGrammarContext(tokenizerJson, { vocabSize: 49152, stopTokenIds: [2] });
  const contextMs = performance.now() - t0;
  let refused = null;
  try { await context.compile(bad); } catch (e) { refused = { code: e.code, message: e.message }; }
  const { compiled, compileMs } = await context.compile(spec);
  const matcher = context.matcher(compiled);
  const b64 = (w) => btoa(String.fromCharCode(...new Uint8Array(w.buffer)));
  const masks = [], accepted = [];
  for (const id of path) { masks.push(b64(matcher.mask())); accepted.push(matcher.accept(id)); }
  matcher.rollback(path.length);
  masks.push(b64(matcher.mask()));
  matcher.dispose();
  context.dispose();
  return { masks, accepted, refused, contextMs, compileMs, global: typeof globalThis.xgrammar };
}"""


def test_the_served_bundle_gives_the_same_masks_in_chromium(chromium_browser, http_server, contexts):  # noqa: F811
    spec = CASES[0][1]
    ctx = contexts[VOCAB]
    path = build_path(ctx, spec, CASES[0][2])[:16]
    bad_what, bad = BAD[3]
    page = chromium_browser.new_context().new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(http_server.url + "/web/grammar/xgrammar_masks.mjs")   # a same-origin document with the CSP
        out = page.evaluate(BROWSER_WALK, {"spec": spec, "path": path, "bad": bad})
    finally:
        page.context.close()
    assert not errors, errors
    m = ctx.matcher(ctx.compile(spec)[0])
    expected = []
    for token in path:
        expected.append(m.mask())
        assert m.accept(token)
    m.rollback(len(path))
    expected.append(m.mask())
    assert out["accepted"] == [True] * len(path)
    for i, (a, b) in enumerate(zip(out["masks"], expected)):
        assert np.array_equal(np.frombuffer(base64.b64decode(a), dtype=np.uint32), b), f"step {i}"
    with pytest.raises(ExactSpecError) as e:
        ctx.compile(bad)
    assert out["refused"] == {"code": E_BAD_ARGUMENT, "message": f"{E_BAD_ARGUMENT}: {e.value.message}"}, bad_what
    print(f"\nChromium: context {out['contextMs']:.0f} ms, first compile of the schema {out['compileMs']:.1f} ms")

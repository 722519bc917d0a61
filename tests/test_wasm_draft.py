"""WASM-SIMD draft (wasm/draft.c + web/draft/*.mjs) against the NumPy references.

- forward logits vs LlamaReference (f32 weights) within TOLERANCES["draft_logits"], with
  rollback and re-feed;
- processed rows vs processors.process_logits within TOLERANCES["draft_probs_f64"] (float64 rows)
  and ["draft_probs_f32"] (the same rows as float32);
- the portable log bit for bit, the Gumbel-max sampler token for token on identical weights;
- propose vs RunnerDraft(LlamaReference).propose with an RngDecider of the same seed;
- the module worker: envelopes, stale epochs dropped and counted, p_draft transferred.

Models: tests/synthetic_models.py's draft_tiny_llama (transformers) and untied_mha (NumPy), and
the shipped draft web/models/draft/ when it is present. The pure-wasm cases run under Node
(web/tests/draft_harness.mjs); the worker and the timing run in Chromium.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from browser_fixture import REPO_ROOT, browser_page, chromium_browser, http_server  # noqa: F401
from node_harness import run_harness
from tolerances import TOLERANCES, max_error, within
import synthetic_models

sys.path.insert(0, str(REPO_ROOT / "py"))
from exactspec.core import rng  # noqa: E402
from exactspec.core.backends import RunnerDraft  # noqa: E402
from exactspec.core.caches import LogicalCache  # noqa: E402
from exactspec.core.deciders import RngDecider  # noqa: E402
from exactspec.core.errors import ExactSpecError  # noqa: E402
from exactspec.core.policy import AllowedSetGrammar, SamplingPolicy  # noqa: E402
from exactspec.reference.processors import process_logits  # noqa: E402
from exactspec.reference.reference_llama import LlamaReference  # noqa: E402

WASM = REPO_ROOT / "web" / "build" / "cpu.wasm"      # the CPU module: the draft is one of its halves
HARNESS = REPO_ROOT / "web" / "tests" / "draft_harness.mjs"
SHIPPED = REPO_ROOT / "web" / "models" / "draft"


# ----------------------------------------------------------------------------- set-up
def ensure_wasm() -> Path:
    """Build web/build/cpu.wasm (the CPU module, wasm/build.sh) if it is missing or older than any
    source in wasm/ (draft.c is linked with champion.c, cpu.c and common.c)."""
    newest = max(p.stat().st_mtime for p in (REPO_ROOT / "wasm").iterdir() if p.is_file())
    if not WASM.exists() or WASM.stat().st_mtime < newest:
        subprocess.run(["bash", str(REPO_ROOT / "wasm" / "build.sh")], check=True, cwd=REPO_ROOT)
    return WASM


def model_dirs() -> list:
    dirs = [pytest.param("tiny", id="tiny-random")]
    if (SHIPPED / "model.safetensors").exists() and (SHIPPED / "config.json").exists():
        dirs.append(pytest.param("shipped", id="shipped-draft"))
    return dirs


_refs: dict = {}


def reference(which: str):
    if which not in _refs:
        d = {"tiny": synthetic_models.draft_tiny_llama, "untied": synthetic_models.untied_mha}.get(which, lambda: SHIPPED)()
        _refs[which] = (d, LlamaReference.from_dir(d))
    return _refs[which]


def b64(arr, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype=dtype).tobytes()).decode()


def unb64(text, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def run_node(model_dir: Path, cases: dict) -> dict:
    ensure_wasm()
    return run_harness(HARNESS, {"wasm": str(WASM), "model_dir": str(model_dir), **cases})


def policy_json(p: SamplingPolicy) -> dict:
    allowed = None if p.grammar is None else sorted(p.grammar.allowed_token_ids([]))
    return {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
            "repetition_penalty": p.repetition_penalty, "suppress_token_ids": list(p.suppress_token_ids),
            "allowed_token_ids": allowed}


# ----------------------------------------------------------------------------- math + RNG
def test_portable_log_bitwise_exp_sincos_accurate():
    rs = np.random.default_rng(7)
    x = np.concatenate([
        rs.uniform(0, 1, 4000), np.exp(rs.uniform(-740, 700, 3000)), rs.uniform(1 - 1e-6, 1 + 1e-6, 500),
        np.array([2.0 ** -1074, 2.0 ** -1060, 1e-310, 0.5, 1.0, 2.0, 0.7071067811865476, 0.7071067811865475,
                  1.0 - 2.0 ** -24, 2.0 ** -24, 1.7976931348623157e308]),
    ])
    angles = np.concatenate([rs.uniform(-10, 10, 2000), rs.uniform(0, 600, 2000), np.arange(0, 600, 0.5)])
    out = run_node(synthetic_models.draft_tiny_llama(), {"plog": b64(x, "<f8"), "sincos": b64(angles, "<f8")})
    got_log = unb64(out["plog"], "<f8")
    want_log = rng.portable_log_np(x)
    assert np.array_equal(got_log.view(np.uint64), want_log.view(np.uint64)), "portable log not bit-identical"
    # exp(-x) vs NumPy: within 2 ulp wherever the result is a normal number
    got_exp, want_exp = unb64(out["exp"], "<f8"), np.exp(-x)
    normal = want_exp > 1e-300
    ulp = np.spacing(want_exp[normal])
    assert np.all(np.abs(got_exp[normal] - want_exp[normal]) <= 2 * ulp)
    sc = unb64(out["sincos"], "<f8").reshape(-1, 2)
    want_sc = np.stack([np.sin(angles), np.cos(angles)], axis=1)
    print(f"[err] wasm_sincos max abs {max_error(sc, want_sc, 'wasm_sincos'):.3g}")
    assert within(sc, want_sc, "wasm_sincos")


def test_gumbel_max_sampler_token_for_token():
    """Same float64 weights -> the C sampler picks exactly sample_gumbel_max_np's token."""
    rs = np.random.default_rng(11)
    cases, want = [], []
    for i in range(600):
        n = int(rs.choice([4, 37, 301, 4096]))
        w = rs.dirichlet(np.full(n, rs.choice([0.02, 0.3, 1.0, 20.0])))
        if i % 3 == 0:
            w[rs.random(n) < 0.5] = 0.0
            if not w.any():
                w[0] = 1.0
        if i % 7 == 0:
            w = np.full(n, 1.0 / n)                                # exact ties in weight
        if i % 11 == 0:
            w = w * 10.0 ** rs.uniform(-300, 300)                  # unnormalised, tiny or huge
        if i % 13 == 0:
            w[rs.random(n) < 0.3] = 5e-324                         # subnormal weights
        if i % 17 == 0:
            w = w * 1e-310                                         # all subnormal (or zero)
        seed = int(rs.integers(0, 2 ** 64, dtype=np.uint64))
        domain, rnd, pos = int(rs.integers(1, 6)), int(rs.integers(0, 2 ** 32)), int(rs.integers(0, 64))
        cases.append({"weights": b64(w, "<f8"), "seed": [seed & 0xFFFFFFFF, seed >> 32], "domain": domain,
                      "round": rnd, "position": pos})
        want.append(rng.sample_gumbel_max_np(w, seed, domain, rnd, pos))
    # docs/rng.md golden: weights [.1 .2 .3 .4], seed 42, domain 1, round 0, positions 0..2 -> 1, 2, 2
    for pos, tok in enumerate([1, 2, 2]):
        cases.append({"weights": b64([0.1, 0.2, 0.3, 0.4], "<f8"), "seed": [42, 0], "domain": 1, "round": 0,
                      "position": pos})
        want.append(tok)
    out = run_node(synthetic_models.draft_tiny_llama(), {"sample": cases})
    assert out["sample"] == want
    assert out["sample_plain"] == want          # the pruned and the plain loop agree


# ----------------------------------------------------------------------------- forward
def forward_sequences(V: int, T: int, rs) -> list:
    """Call lists [(ids, start_pos)]: prompts, single steps, blocks, rollbacks and re-feeds."""
    p = rs.integers(0, V, 24).tolist()
    seq_a = [(p[:12], 0)] + [([t], 12 + i) for i, t in enumerate(p[12:16])]      # one token at a time
    seq_a += [(p[16:20], 14), (p[5:6], 9), (p[:3], 10), ([int(V - 1)], 13)]       # rollback + re-feed
    seq_a += [(p[:1], 0), (p[1:24], 1)]                                           # restart from 0
    long = rs.integers(0, V, T).tolist()
    seq_b = [(long[:T - 9], 0)] + [([t], T - 9 + i) for i, t in enumerate(long[T - 9:T - 4])]
    seq_b += [(long[T - 6:T], T - 6)]                                             # up to max_context
    return [seq_a, seq_b]


@pytest.mark.parametrize("which", model_dirs() + [pytest.param("untied", id="untied-mha-defaults")])
def test_forward_logits_match_reference(which):
    model_dir, ref = reference(which)
    rs = np.random.default_rng(3)
    T = min(ref.max_context, 160)
    seqs = forward_sequences(ref.vocab_size, T, rs)
    out = run_node(model_dir, {"forward": [[[ids, s] for ids, s in seq] for seq in seqs]})
    worst = 0.0
    for seq, rows in zip(seqs, out["forward"]):
        ref.reset()
        for (ids, start), row in zip(seq, rows):
            got = unb64(row, "<f4")
            want = ref.forward(ids, start)[-1]
            worst = max(worst, max_error(got, want, "draft_logits"))
            assert within(got, want, "draft_logits"), (
                f"start {start} n {len(ids)}: max |diff| {np.max(np.abs(got - want)):.3g}")
    print(f"[{which}] forward logits: [err] draft_logits {worst:.3g}")


# ----------------------------------------------------------------------------- processors
def processor_policies(V: int) -> list:
    rs = np.random.default_rng(5)
    allowed = sorted(rs.choice(V, size=V // 3, replace=False).tolist())
    return [
        SamplingPolicy(),
        SamplingPolicy(temperature=0.0),
        SamplingPolicy(temperature=0.0, repetition_penalty=1.8),
        SamplingPolicy(temperature=0.7, top_k=20),
        SamplingPolicy(temperature=1.3, top_p=0.9),
        SamplingPolicy(temperature=0.9, top_k=50, top_p=0.8, repetition_penalty=1.3),
        SamplingPolicy(top_k=1),
        SamplingPolicy(top_p=0.5, suppress_token_ids=(0, 3, V - 1)),
        SamplingPolicy(temperature=0.5, grammar=AllowedSetGrammar(allowed), repetition_penalty=0.7),
        SamplingPolicy(temperature=2.0, top_k=V - 1, top_p=0.999),
    ]


def hard_rows(V: int, rs) -> list:
    """Ties, -inf, peaked and flat rows (float32 values)."""
    ties = np.round(rs.normal(0, 2, V)).astype(np.float32)                     # many exact ties
    flat = np.zeros(V, np.float32)
    peaked = (rs.normal(0, 1, V) * 30).astype(np.float32)
    holes = rs.normal(0, 3, V).astype(np.float32)
    holes[rs.random(V) < 0.6] = -np.inf
    return [ties, flat, peaked, holes]


def near_top_p_boundary(logits, context, policy) -> bool:
    """True if a cumulative sum of the sorted probabilities lies within 1e-12 of top_p."""
    if policy.top_p >= 1.0 or policy.temperature == 0:
        return False
    loose = SamplingPolicy(temperature=policy.temperature, top_k=policy.top_k,
                           repetition_penalty=policy.repetition_penalty,
                           suppress_token_ids=policy.suppress_token_ids, grammar=policy.grammar)
    probs = process_logits(logits, context, loose)
    order = np.lexsort((np.arange(len(probs)), -probs))
    return bool(np.any(np.abs(np.cumsum(probs[order]) - policy.top_p) < 1e-12))


@pytest.mark.parametrize("which", model_dirs())
def test_processed_rows_match_process_logits(which):
    model_dir, ref = reference(which)
    V = ref.vocab_size
    rs = np.random.default_rng(9)
    ref.reset()
    model_rows = [r.astype(np.float32) for r in ref.forward(rs.integers(0, V, 6).tolist(), 0)[-3:]]
    rows = model_rows + hard_rows(V, rs)
    cases, want = [], []
    for policy in processor_policies(V):
        for row in rows:
            context = rs.integers(0, V, int(rs.integers(0, 30))).tolist()
            logits64 = row.astype(np.float64)
            try:
                expect = process_logits(logits64, context, policy)
            except ExactSpecError as err:
                expect = err.code
            if not isinstance(expect, str) and near_top_p_boundary(logits64, context, policy):
                continue
            cases.append({"logits": b64(row, "<f4"), "context": context, "policy": policy_json(policy)})
            want.append(expect)
    # invalid rows: NaN, +inf, everything suppressed
    bad = rows[0].copy()
    bad[5] = np.nan
    inf = rows[0].copy()
    inf[7] = np.inf
    for row, pol in [(bad, SamplingPolicy()), (inf, SamplingPolicy()),
                     (rows[0], SamplingPolicy(suppress_token_ids=tuple(range(V))))]:
        cases.append({"logits": b64(row, "<f4"), "context": [], "policy": policy_json(pol)})
        want.append("E_PROCESSOR_INVALID")
    out = run_node(model_dir, {"process": cases})
    worst64 = worst32 = 0.0
    for i, (got, expect) in enumerate(zip(out["process"], want)):
        if isinstance(expect, str):
            assert got["error_code"] == expect, f"case {i}"
            continue
        assert got["error_code"] == "", f"case {i}: {got['error_code']}"
        p64, p32 = unb64(got["probs64"], "<f8"), unb64(got["probs"], "<f4")
        worst64 = max(worst64, max_error(p64, expect, "draft_probs_f64"))
        worst32 = max(worst32, max_error(p32, expect, "draft_probs_f32"))
        assert within(p64, expect, "draft_probs_f64"), f"case {i}: max |diff| {np.max(np.abs(p64 - expect)):.3g}"
        assert within(p32, expect, "draft_probs_f32"), f"case {i} (f32 row)"
        assert np.array_equal(p64 > 0, expect > 0), f"case {i}: support differs"
    print(f"[{which}] processed rows: {len(cases)} cases, [err] draft_probs_f64 {worst64:.3g}, "
          f"draft_probs_f32 {worst32:.3g}")


# ----------------------------------------------------------------------------- propose
def propose_scenarios(ref, policy, seeds, n_rounds, k, stop_ids):
    """Run RunnerDraft over a sequence of rounds per seed; record what the WASM side must be told.

    Between rounds a pseudo-random prefix of the proposals is committed plus one correction
    token, like the orchestrator, so the next feed re-feeds and rolls back over the cache."""
    V = ref.vocab_size
    calls, expected = [], []
    for seed in seeds:
        rs = np.random.default_rng(seed)
        ref.reset()
        cache = LogicalCache("draft", rs.integers(0, V, int(rs.integers(3, 20))).tolist())
        draft = RunnerDraft(ref)
        for round_id in range(n_rounds):
            if len(cache.tokens) + k + 2 > ref.max_context:
                break
            cache.begin()
            feed, start, context = cache.unmaterialized(), cache.n_materialized, cache.committed_ids
            prop = draft.propose(cache, k, policy, RngDecider(seed), round_id, stop_ids)
            calls.append({"feed": list(map(int, feed)), "start_pos": start, "k": k, "policy": policy_json(policy),
                          "seed": [seed & 0xFFFFFFFF, seed >> 32], "round_id": round_id, "stop": list(stop_ids),
                          "context": list(map(int, context))})
            expected.append(prop)
            if prop.error is not None:
                cache.rollback()
                break
            cache.commit_prefix(int(rs.integers(0, len(prop.tokens) + 1)))
            cache.append_authoritative(int(rs.integers(0, V)))
    return calls, expected


def compare_proposals(calls, expected, out, seeds_of_calls, temperature):
    """-> (n_rounds compared, n_mismatched rounds, n_tokens compared, worst relative row diff).

    After a mismatch the rest of that seed's scenario is skipped: its KV cache holds other tokens.
    Rows come from float32 logits here (float64 in the reference): a logit error e moves each
    probability by about p * 2e / T, so rows are checked against that bound with
    e = the draft_logits tolerance, plus the float32 rounding floor of draft_probs_f32
    (processors alone are held to draft_probs_* above)."""
    e = TOLERANCES["draft_logits"].max_abs
    floor = TOLERANCES["draft_probs_f32"].max_abs
    rel_bound = 4 * e / max(temperature, 1e-9) if temperature > 0 else 0.0
    n_rounds = n_mismatch = n_tokens = 0
    worst = 0.0
    tainted = set()
    for call, prop, got, seed in zip(calls, expected, out, seeds_of_calls):
        if seed in tainted:
            continue
        n_rounds += 1
        want_error = "" if prop.error is None else prop.error.code
        if got["tokens"] != list(prop.tokens) or got["error_code"] != want_error:
            n_mismatch += 1
            tainted.add(seed)
            print(f"mismatch seed {seed} round {call['round_id']}: wasm {got['tokens']} {got['error_code']!r} "
                  f"vs reference {list(prop.tokens)} {want_error!r}")
            continue
        n_tokens += len(prop.tokens)
        if prop.tokens:
            rows = unb64(got["p_draft"], "<f4").reshape(len(prop.tokens), -1)
            for row, want_row in zip(rows, prop.p_draft_rows):
                rel = np.abs(row - want_row) / (floor + np.abs(want_row))
                worst = max(worst, float(np.max(rel)))
                assert np.all(np.abs(row - want_row) <= floor + rel_bound * np.abs(want_row))
    return n_rounds, n_mismatch, n_tokens, worst


PROPOSE_POLICIES = [
    pytest.param(SamplingPolicy(temperature=1.0), 60, id="T1"),
    pytest.param(SamplingPolicy(temperature=0.0), 30, id="greedy"),
    pytest.param(SamplingPolicy(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.2), 30, id="mixed"),
]


@pytest.mark.parametrize("policy,n_seeds", PROPOSE_POLICIES)
@pytest.mark.parametrize("which", model_dirs())
def test_propose_matches_runner_draft(which, policy, n_seeds):
    model_dir, ref = reference(which)
    seeds = [int(s) for s in np.random.default_rng(17).integers(0, 2 ** 64, n_seeds, dtype=np.uint64)]
    stop_ids = (1, 2)
    calls, expected, seed_of = [], [], []
    for seed in seeds:
        c, e = propose_scenarios(ref, policy, [seed], n_rounds=6, k=5, stop_ids=stop_ids)
        calls += c
        expected += e
        seed_of += [seed] * len(c)
    out = run_node(model_dir, {"propose": calls})["propose"]
    n_rounds, n_mismatch, n_tokens, worst = compare_proposals(calls, expected, out, seed_of, policy.temperature)
    print(f"[{which} {policy}] propose: {n_rounds} rounds, {n_tokens} tokens identical, "
          f"{n_mismatch} mismatched rounds; max relative p_draft diff {worst:.3g}")
    # float32 logits vs float64 reference: a draw can flip only when two Gumbel scores lie within
    # ~1e-5; allow at most 2% of rounds (observed: none). Greedy: none at all (observed: none).
    if policy.temperature == 0:
        assert n_mismatch == 0
    assert n_mismatch <= max(1, 0.02 * n_rounds)
    assert n_tokens > 0


@pytest.mark.parametrize("which", model_dirs())
def test_propose_invalid_row_reports_processor_invalid(which):
    model_dir, ref = reference(which)
    V = ref.vocab_size
    policy = SamplingPolicy(suppress_token_ids=tuple(range(V)))
    calls, expected = propose_scenarios(ref, policy, [5], n_rounds=1, k=3, stop_ids=())
    assert expected[0].error is not None and expected[0].error.code == "E_PROCESSOR_INVALID"
    out = run_node(model_dir, {"propose": calls})["propose"]
    assert out[0]["error_code"] == "E_PROCESSOR_INVALID" and out[0]["tokens"] == []


# ----------------------------------------------------------------------------- browser
def open_harness(page, http_server):
    ensure_wasm()
    page.goto(f"{http_server.url}/web/tests/draft_harness.html")
    page.wait_for_function("() => window.harnessReady === true", timeout=30000)


def rel_url(path: Path) -> str:
    return "/" + path.relative_to(REPO_ROOT).as_posix() + "/"


WORKER_SCRIPT = """
async ([wasm, model, calls]) => {
  const { worker, log } = window.draftHarness.startWorker(wasm, model);
  const waitFor = async (pred, what) => {
    for (let i = 0; i < 600; i++) {
      const hit = log.find(pred);
      if (hit) return hit;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error("timed out waiting for " + what + ": " + JSON.stringify(log.map((m) => m.kind)));
  };
  await waitFor((m) => m.kind === "progress" || m.kind === "error" || m.kind === "worker_error", "ready");
  const env = (kind, seq, epoch, payload) => ({ kind, request_id: "req-1", seq, epoch, payload });
  const proposal = (c) => ({ round_id: c.round_id, k: c.k, feed: c.feed, start_pos: c.start_pos, policy: c.policy,
                            seed: c.seed, stop_token_ids: c.stop, context_ids: c.context });
  worker.postMessage(env("propose", 0, 0, proposal(calls[0])));
  const first = await waitFor((m) => m.kind === "proposals" || m.kind === "error", "first proposals");
  worker.postMessage(env("cancel", 0, 1, {}));
  worker.postMessage(env("propose", 1, 0, proposal(calls[1])));          // stale epoch: dropped
  worker.postMessage(env("propose", 1, 1, proposal(calls[0])));          // current epoch
  worker.postMessage(env("propose", 1, 1, proposal(calls[0])));          // duplicate seq: dropped
  worker.postMessage(env("sync", 2, 1, { committed_length: 3, pending: [] }));
  const sync = await waitFor((m) => m.kind === "sync", "sync");
  worker.terminate();
  const summary = (m) => ({ kind: m.kind, epoch: m.epoch, request_id: m.request_id, seq: m.seq,
    payload: m.kind === "proposals"
      ? { round_id: m.payload.round_id, tokens: m.payload.tokens, error_code: m.payload.error_code,
          p_draft_is_f32: m.payload.p_draft instanceof Float32Array, p_draft_len: m.payload.p_draft.length,
          p_draft_b64: window.draftHarness.toBase64(m.payload.p_draft) }
      : m.payload });
  return { first: summary(first), log: log.map(summary), sync: sync.payload };
}
"""


def test_worker_envelopes_stale_epochs_and_transfer(browser_page, http_server):
    model_dir, ref = reference("tiny")
    V = ref.vocab_size
    policy = SamplingPolicy(temperature=1.0, top_k=30)
    calls, expected = propose_scenarios(ref, policy, [99], n_rounds=1, k=4, stop_ids=())
    calls2, _ = propose_scenarios(ref, policy, [98], n_rounds=1, k=4, stop_ids=())
    open_harness(browser_page, http_server)
    res = browser_page.evaluate(WORKER_SCRIPT, [rel_url(WASM.parent)[:-1] + "/cpu.wasm", rel_url(model_dir),
                                                [calls[0], calls2[0]]])
    kinds = [m["kind"] for m in res["log"]]
    assert kinds == ["progress", "proposals", "proposals", "sync"], kinds
    ready = res["log"][0]["payload"]
    assert ready["stage"] == "ready" and ready["vocab_size"] == V
    first, second = res["log"][1], res["log"][2]
    want = list(expected[0].tokens)
    for msg, epoch in ((first, 0), (second, 1)):
        assert msg["epoch"] == epoch and msg["request_id"] == "req-1"
        p = msg["payload"]
        assert p["error_code"] == "" and p["tokens"] == want        # same feed from 0: same proposals
        assert p["p_draft_is_f32"] and p["p_draft_len"] == len(want) * V
        rows = unb64(p["p_draft_b64"], "<f4").reshape(len(want), V)
        for row, want_row in zip(rows, expected[0].p_draft_rows):
            assert np.all(np.abs(row - want_row) <= 1e-6 + 1e-3 * np.abs(want_row))
    sync = res["sync"]
    assert sync["dropped_stale"] == 1 and sync["dropped_out_of_order"] == 1
    assert sync["n_transferred"] == 2 and sync["n_proposals"] == 2 * len(want)
    assert sync["committed_length"] == 3 and sync["epoch"] == 1
    seqs = [m["seq"] for m in res["log"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


TIMING_SCRIPT = """
async ([wasm, model, opts]) => {
  const t0 = performance.now();
  const draft = await window.draftHarness.createDraft({ wasmUrl: wasm, modelUrl: model });
  const loadMs = performance.now() - t0;
  const results = {};
  for (const [name, policy] of Object.entries(opts.policies)) {
    results[name] = window.draftHarness.timePropose(draft, { ...opts, policy });
  }
  return { load_ms: loadMs, results, vocab_size: draft.vocabSize, simd: true };
}
"""


@pytest.mark.parametrize("which", model_dirs())
def test_browser_propose_timing(which, browser_page, http_server):
    """ms per draft token (forward + processors + sample) in Chromium; recorded, loosely bounded."""
    model_dir, ref = reference(which)
    open_harness(browser_page, http_server)
    opts = {"promptLen": 32, "k": 8, "reps": 40,
            "policies": {"T1": {"temperature": 1.0}, "greedy": {"temperature": 0.0},
                         "topk_topp": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.1}}}
    res = browser_page.evaluate(TIMING_SCRIPT, ["/web/build/cpu.wasm", rel_url(model_dir), opts])
    res["wasm_bytes"] = WASM.stat().st_size
    out = REPO_ROOT / "build" / f"draft_timing_{which}.json"
    out.write_text(json.dumps(res, indent=2))
    for name, r in res["results"].items():
        print(f"[{which}] {name}: {r['ms_per_token']:.3f} ms/draft token, min {r['ms_per_token_min']:.3f} "
              f"(forward alone {r['forward_ms']:.3f}, min {r['forward_ms_min']:.3f})")
        assert r["tokens"] > 0 and r["ms_per_token"] < 200


def test_worker_sync_prefills_like_runner_draft(browser_page, http_server):
    """sync {committed_length, pending} feeds the pending ids (prefill); a propose from there
    equals RunnerDraft's after RunnerDraft.prefill."""
    model_dir, ref = reference("tiny")
    V = ref.vocab_size
    rs = np.random.default_rng(21)
    prompt = rs.integers(0, V, 17).tolist()
    policy = SamplingPolicy(temperature=1.0)
    ref.reset()
    cache = LogicalCache("draft", prompt)
    draft = RunnerDraft(ref)
    draft.prefill(cache)                                     # feeds prompt[:-1]
    cache.begin()
    feed, start = cache.unmaterialized(), cache.n_materialized
    prop = draft.propose(cache, 4, policy, RngDecider(123), 0, ())
    open_harness(browser_page, http_server)
    res = browser_page.evaluate("""
async ([wasm, model, prompt, feed, start, policy]) => {
  const { worker, log } = window.draftHarness.startWorker(wasm, model);
  const waitFor = async (kind) => {
    for (let i = 0; i < 600; i++) {
      const hit = log.find((m) => m.kind === kind || m.kind === "error");
      if (hit) { log.splice(log.indexOf(hit), 1); return hit; }
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error("timeout " + kind);
  };
  await waitFor("progress");
  worker.postMessage({ kind: "sync", request_id: "r", seq: 0, epoch: 0,
                       payload: { committed_length: prompt.length - 1, pending: prompt.slice(0, -1) } });
  const sync = await waitFor("sync");
  worker.postMessage({ kind: "propose", request_id: "r", seq: 1, epoch: 0,
                       payload: { round_id: 0, k: 4, feed, start_pos: start, policy, seed: [123, 0],
                                  stop_token_ids: [], context_ids: prompt } });
  const prop = await waitFor("proposals");
  worker.terminate();
  return { sync: sync.payload, tokens: prop.payload.tokens };
}
""", ["/web/build/cpu.wasm", rel_url(model_dir), prompt, feed, start, policy_json(policy)])
    assert res["sync"]["n_cached"] == len(prompt) - 1
    assert res["tokens"] == list(prop.tokens)


def test_bad_calls_raise_coded_errors():
    model_dir, ref = reference("tiny")
    V, T = ref.vocab_size, ref.max_context
    cases = [
        ({"op": "forward", "ids": [1, 2, 3], "start": 0}, ""),
        ({"op": "forward", "ids": [4], "start": 5}, "E_BAD_ARGUMENT"),             # skips uncached positions
        ({"op": "forward", "ids": [V], "start": 0}, "E_BAD_ARGUMENT"),             # id out of range
        ({"op": "forward", "ids": [-1], "start": 0}, "E_BAD_ARGUMENT"),
        ({"op": "forward", "ids": [], "start": 0}, "E_BAD_ARGUMENT"),              # nothing to feed
        ({"op": "forward", "ids": [0] * (T + 1), "start": 0}, "E_CONTEXT_OVERFLOW"),
        ({"op": "propose", "ids": [0] * 3, "start": T - 2}, "E_BAD_ARGUMENT"),     # beyond the cache
        ({"op": "forward", "ids": [0] * T, "start": 0}, ""),
        ({"op": "propose", "ids": [0], "start": T - 1, "k": 2}, "E_CONTEXT_OVERFLOW"),  # 2nd proposal at T
        ({"op": "propose", "ids": [0], "start": 0, "policy": {"temperature": -1}}, "E_BAD_ARGUMENT"),
        ({"op": "propose", "ids": [0], "start": 0, "policy": {"top_p": 0}}, "E_BAD_ARGUMENT"),
        ({"op": "propose", "ids": [0], "start": 0, "policy": {"suppress_token_ids": [V]}}, "E_BAD_ARGUMENT"),
        ({"op": "propose", "ids": [0], "start": 0, "context": [V + 3]}, "E_BAD_ARGUMENT"),
        ({"op": "propose", "ids": [0], "start": 0}, ""),
        ({"op": "forward", "ids": [0], "start": None}, "E_BAD_ARGUMENT"),
        ({"op": "propose", "ids": [0], "start": 0.5}, "E_BAD_ARGUMENT"),
    ]
    out = run_node(model_dir, {"errors": [c for c, _ in cases]})
    assert out["errors"] == [want for _, want in cases]


@pytest.mark.parametrize("which", model_dirs())
def test_browser_equals_node(which, browser_page, http_server):
    """The page (Chromium's V8) gives the same proposals and p_draft bytes as Node's."""
    model_dir, ref = reference(which)
    calls, _ = propose_scenarios(ref, SamplingPolicy(temperature=1.0, top_p=0.95), [7, 8, 9], n_rounds=4, k=4,
                                 stop_ids=(1,))
    cases = {"propose": calls, "forward": [[[[3, 4, 5], 0], [[6], 3], [[7, 8], 2]]]}
    node_out = run_node(model_dir, cases)
    open_harness(browser_page, http_server)
    page_out = browser_page.evaluate("""
async ([wasm, model, cases]) => {
  const draft = await window.draftHarness.createDraft({ wasmUrl: wasm, modelUrl: model });
  return window.draftHarness.runCases(draft, cases);
}""", ["/web/build/cpu.wasm", rel_url(model_dir), cases])
    assert page_out["propose"] == node_out["propose"]
    assert page_out["forward"] == node_out["forward"]


def test_worker_client_forward_propose_cancel(browser_page, http_server):
    """DraftWorkerClient (the caller's side of the protocol): forward = prefill, propose equal to
    RunnerDraft's after two rounds with rollback, errors come back coded, cancel keeps working."""
    model_dir, ref = reference("tiny")
    policy = SamplingPolicy(temperature=0.9, top_k=50)
    calls, expected = propose_scenarios(ref, policy, [4242], n_rounds=3, k=4, stop_ids=())
    open_harness(browser_page, http_server)
    res = browser_page.evaluate("""
async ([wasm, model, calls]) => {
  const client = await window.draftHarness.DraftWorkerClient.create({ wasmUrl: wasm, modelUrl: model });
  const out = { vocab: client.vocabSize, identity: client.identity, rounds: [] };
  await client.forward(calls[0].feed.slice(0, -1), calls[0].start_pos);       // prefill all but the last
  let first = true;
  for (const c of calls) {
    const feed = first ? c.feed.slice(-1) : c.feed;
    const start = first ? c.start_pos + c.feed.length - 1 : c.start_pos;
    first = false;
    const r = await client.propose({ feed, startPos: start, k: c.k, policy: c.policy, seed: c.seed,
      roundId: c.round_id, stopTokenIds: c.stop, contextIds: c.context });
    out.rounds.push({ tokens: Array.from(r.tokens), error_code: r.error_code, n: r.pDraft.length });
  }
  try { await client.forward([0], 10000); } catch (err) { out.error = err.code; }
  await client.cancel();
  const again = await client.propose({ feed: [1, 2], startPos: 0, k: 2, policy: {}, seed: [1, 0] });
  out.after_cancel = again.tokens.length;
  client.terminate();
  return out;
}""", ["/web/build/cpu.wasm", rel_url(model_dir), calls])
    assert res["vocab"] == ref.vocab_size and res["identity"] == ref.identity      # sha256 of the weights
    assert [r["tokens"] for r in res["rounds"]] == [list(p.tokens) for p in expected]
    assert all(r["n"] == len(r["tokens"]) * ref.vocab_size for r in res["rounds"])
    assert res["error"] == "E_BAD_ARGUMENT" and res["after_cancel"] == 2

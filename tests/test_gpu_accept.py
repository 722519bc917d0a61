"""WebGPU acceptor (web/gpu/accept.mjs, shaders/{processors,accept,sample,threefry}_*.wgsl) against
the float64 references: processors.process_logits, rng.py and acceptance.decide_round.

Runs in headless Chromium (SwiftShader WebGPU) through web/tests/accept_harness.html; never
skipped. Measured rates and timings are printed (run with -s) and recorded in docs/gpu_accept.md.
"""
from __future__ import annotations

import base64
import math

import numpy as np
import pytest
from scipy import stats

from browser_fixture import chromium_browser, forward_console, http_server  # noqa: F401
from exactspec.twins import accept_twins
from exactspec.reference import processors
from exactspec.core import rng
from exactspec.core.acceptance import decide_round, residual_weights
from exactspec.core.deciders import RngDecider
from exactspec.core.errors import ExactSpecError
from exactspec.core.policy import AllowedSetGrammar, SamplingPolicy
from tolerances import TOLERANCES, flip_margin, max_error, within

# A decision may differ from the float64 reference only where the reference's decision quantity
# is within the measured f32 error of the quantity it is compared with (tests/tolerances.py):
# |u - a_ref| <= accept_probability for an accept test, a score gap <= flip_margin("gumbel_score").
CHI2_ALPHA = 1e-4           # false-alarm rate of each chi-square test (two tests: 2e-4 in all)


def b64(array) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


def unb64(text, dtype):
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


@pytest.fixture(scope="module")
def harness(chromium_browser, http_server):  # noqa: F811
    context = chromium_browser.new_context()
    page = context.new_page()
    forward_console(page)
    page.goto(http_server.url + "/web/tests/accept_harness.html")
    page.wait_for_function("() => window.acceptHarnessReady === true", timeout=60_000)
    yield page
    context.close()


def js_policy(policy: SamplingPolicy) -> dict:
    return {
        "temperature": float(policy.temperature), "top_k": int(policy.top_k), "top_p": float(policy.top_p),
        "repetition_penalty": float(policy.repetition_penalty),
        "suppress_token_ids": [int(i) for i in policy.suppress_token_ids],
        "allowed_token_ids": None if policy.grammar is None else sorted(int(i) for i in policy.grammar.allowed),
    }


# ------------------------------------------------------------------------------ conventions
def test_kernels_follow_the_conventions():
    """Each acceptor kernel is shaders/<name>.wgsl with a NumPy twin of the same name, a header
    comment, tensors in group 0 with shape comments, and at most one Meta uniform in group 1."""
    import re
    from browser_fixture import REPO_ROOT
    for name in ("processors_rows", "accept_decide", "threefry_bits"):
        assert callable(getattr(accept_twins, name, None)), f"no NumPy twin {name}"
        wgsl = (REPO_ROOT / "shaders" / f"{name}.wgsl").read_text()
        assert wgsl.startswith(f"// {name}.wgsl: "), name
        bindings = [line for line in wgsl.splitlines() if line.startswith("@group(")]
        if bindings[-1].startswith("@group(1)"):
            assert bindings.pop() == "@group(1) @binding(0) var<uniform> params: Meta;", name
        for i, line in enumerate(bindings):
            assert line.startswith(f"@group(0) @binding({i}) var<storage") and re.search(r"// \(", line), line


# ------------------------------------------------------------------------------ (a) processors
def make_logits(kind: str, n: int, V: int, gen) -> np.ndarray:
    """(n, V) float32 logits of a named hard shape."""
    if kind == "normal":
        x = gen.standard_normal((n, V)) * 2.5
    elif kind == "ties":                                    # few distinct values: ties everywhere
        x = gen.integers(-3, 4, size=(n, V)).astype(np.float64)
    elif kind == "peaked":                                  # one dominant token, long flat tail
        x = gen.standard_normal((n, V)) * 0.1
        x[np.arange(n), gen.integers(0, V, size=n)] += 25.0
    elif kind == "wide":                                    # large range: underflow in softmax
        x = gen.standard_normal((n, V)) * 40.0
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def policies(V: int, gen) -> list[SamplingPolicy]:
    some = sorted(set(int(i) for i in gen.choice(V, size=min(V - 1, 5), replace=False)))
    allowed = sorted(set(int(i) for i in gen.choice(V, size=max(2, V // 3), replace=False)))
    return [
        SamplingPolicy(),
        SamplingPolicy(temperature=0.7),
        SamplingPolicy(temperature=1.7, top_k=3),
        SamplingPolicy(temperature=0),
        SamplingPolicy(temperature=0, repetition_penalty=1.5, suppress_token_ids=tuple(some[:2])),
        SamplingPolicy(top_k=1),
        SamplingPolicy(top_k=max(1, V // 2)),
        SamplingPolicy(top_p=0.9),
        SamplingPolicy(top_p=0.5, temperature=0.8),
        SamplingPolicy(repetition_penalty=1.3),
        SamplingPolicy(repetition_penalty=0.8, top_k=4, top_p=0.95),
        SamplingPolicy(suppress_token_ids=tuple(some)),
        SamplingPolicy(grammar=AllowedSetGrammar(allowed), top_p=0.8),
        SamplingPolicy(temperature=0.6, top_k=20, top_p=0.7, repetition_penalty=1.2,
                       suppress_token_ids=tuple(some[:1]), grammar=AllowedSetGrammar(allowed)),
    ]


def reference_rows(logits, context, proposals, policy):
    """Row i: process_logits with context + proposals[:i]; an ExactSpecError where it refuses."""
    rows = []
    for i in range(logits.shape[0]):
        try:
            rows.append(processors.process_logits(logits[i], list(context) + list(proposals[:i]), policy))
        except ExactSpecError as err:
            rows.append(err)
    return rows


def run_process_rows(harness, V, logits, context, proposals, policy, greedy=False, workgroup_size=None):
    n = logits.shape[0]
    out = harness.evaluate("a => acceptHarness.processRows(a)", {
        "V": V, "maxBlock": 5, "logitsB64": b64(logits.astype(np.float32)), "nRows": n,
        "proposals": [int(p) for p in proposals], "contextIds": [int(c) for c in context],
        "policy": js_policy(policy), "greedy": greedy, "workgroupSize": workgroup_size})
    return unb64(out["probsB64"], np.float32).reshape(n, V), out


@pytest.mark.parametrize("V,workgroup_size", [(7, None), (1000, None), (4097, None), (1000, 256), (4097, 16)])
def test_process_rows_match_reference(harness, V, workgroup_size):
    """workgroup_size None: the default for the adapter (4 on SwiftShader); 16 and 256 also work."""
    gen = np.random.default_rng(V)
    n = 4
    checked = near = 0
    worst = 0.0
    for kind in ("normal", "ties", "peaked", "wide"):
        logits = make_logits(kind, n, V, gen)
        context = [int(c) for c in gen.integers(0, V, size=6)]
        proposals = [int(p) for p in gen.integers(0, V, size=n - 1)]
        proposals[-1] = proposals[0]                        # a repeated proposal is penalised once
        for policy in policies(V, gen):
            got, out = run_process_rows(harness, V, logits, context, proposals, policy, workgroup_size=workgroup_size)
            for i, want in enumerate(reference_rows(logits, context, proposals, policy)):
                label = f"V={V} {kind} row {i} {policy}"
                if isinstance(want, ExactSpecError):
                    assert out["status"][i] & accept_twins.ROW_INVALID, label
                    continue
                assert out["status"][i] & accept_twins.ROW_INVALID == 0, label
                if out["status"][i] & accept_twins.ROW_NEAR_TOP_P:
                    near += 1                               # f32 sums within 1e-5 of top_p: excluded
                    continue
                assert within(got[i], want, "processed_probs"), (label, np.abs(got[i] - want).max())
                worst = max(worst, max_error(got[i], want, "processed_probs"))
                live = want > 1e-30                          # f32 exp underflows below ~1e-38
                assert np.array_equal(got[i][live] > 0, np.ones(live.sum(), bool)), label
                assert not (got[i][want == 0] > 0).any(), label
                checked += 1
    print(f"processRows V={V} workgroup {workgroup_size or 'default'}: {checked} rows checked, {near} near the "
          f"top-p boundary excluded; [err] processed_probs max abs {worst:.3g}")
    assert near <= checked // 20


@pytest.mark.parametrize("workgroup_size", [None, 256])
def test_top_k_top_p_selection_with_ties(harness, workgroup_size):
    """Radix selection: random k and top_p on rows with many exact ties, V not a multiple of WG."""
    V = 300
    gen = np.random.default_rng(99)
    checked = near = 0
    for trial in range(24):
        logits = gen.integers(-4, 5, size=(4, V)).astype(np.float32) * np.float32(gen.choice([0.25, 1.0, 3.0]))
        logits[0, gen.integers(0, V, size=V // 3)] = -np.inf                 # masked tokens (-inf input)
        policy = SamplingPolicy(top_k=int(gen.integers(1, V + 20)), top_p=float(gen.choice([1.0, gen.uniform(0.01, 1.0)])),
                                temperature=float(gen.choice([1.0, 0.5, 2.0])))
        got, out = run_process_rows(harness, V, logits, [], [], policy, workgroup_size=workgroup_size)
        for i, want in enumerate(reference_rows(logits, [], [], policy)):
            if out["status"][i] & accept_twins.ROW_NEAR_TOP_P:
                near += 1
                continue
            assert np.array_equal(got[i] > 0, want > 0), (trial, i, policy)
            assert within(got[i], want, "processed_probs"), (trial, i, policy)
            checked += 1
    print(f"top-k/top-p with ties (workgroup {workgroup_size or 'default'}): {checked} rows, {near} near top-p excluded")
    assert near <= checked // 10


def test_process_rows_errors_and_ties(harness):
    V = 7
    # NaN / +inf input, all suppressed, penalty overflow: E_PROCESSOR_INVALID per row
    logits = np.array([[0, 1, np.nan, 0, 0, 0, 0], [0, np.inf, 0, 0, 0, 0, 0],
                       [1, 1, 1, 1, 1, 1, 1], [3e38, 0, 0, 0, 0, 0, 0]], np.float32)
    policy = SamplingPolicy(suppress_token_ids=(), repetition_penalty=0.5)
    got, out = run_process_rows(harness, V, logits, [0], [], policy)
    assert [s & 1 for s in out["status"]] == [1, 1, 0, 1]
    got, out = run_process_rows(harness, V, logits[2:3], [], [],
                                SamplingPolicy(suppress_token_ids=tuple(range(V))))
    assert out["status"][0] & 1
    # documented tie rules: top-k keeps the lowest ids; top_p = 0.5 on 4 equal logits keeps 2
    got, _ = run_process_rows(harness, 4, np.array([[1, 2, 2, 0]], np.float32), [], [], SamplingPolicy(top_k=1))
    assert got[0].tolist() == [0, 1, 0, 0]
    got, _ = run_process_rows(harness, 4, np.zeros((1, 4), np.float32), [], [], SamplingPolicy(top_p=0.5))
    assert got[0].tolist() == [0.5, 0.5, 0, 0]
    got, out = run_process_rows(harness, 4, np.array([[1, 3, 3, 0]], np.float32), [], [],
                                SamplingPolicy(temperature=0), greedy=True)
    assert got[0].tolist() == [0, 1, 0, 0] and out["argmax"][0] == 1


# ------------------------------------------------------------------------------ (b) Threefry bits
KAT = [  # Random123 kat_vectors threefry2x32 20 rounds: counter, key -> out (as in tests/test_rng.py)
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]


def test_threefry_uniforms_gumbel_bitwise(harness):
    gen = np.random.default_rng(7)
    n = 4000
    seeds = [int(s) for s in gen.integers(0, 2**63, size=n, dtype=np.uint64) * 2 + gen.integers(0, 2, size=n)]
    seeds[:4] = [0, 42, 0x0123456789ABCDEF, 2**64 - 1]
    addrs = np.zeros((n, 8), np.uint32)
    addrs[:, 0] = [s & 0xFFFFFFFF for s in seeds]
    addrs[:, 1] = [s >> 32 for s in seeds]
    addrs[:, 2] = gen.integers(1, 6, size=n)
    addrs[:, 3:6] = gen.integers(0, 2**32, size=(n, 3), dtype=np.uint64)
    addrs[:4, 2] = [1, 2, 3, 5]
    addrs[:8, 3:6] = [[0, 0, 0], [7, 3, 0], [1, 0, 31999], [2**32 - 1] * 3, [0, 0, 1], [1, 1, 1], [5, 2**31, 4095], [9, 8, 7]]
    weights = np.exp(gen.uniform(-80, 0, size=n)).astype(np.float32)
    weights[:4] = [1.0, 1 - 2**-24, 2**-24, np.float32(1.17549435e-38)]
    addrs[:, 6] = weights.view(np.uint32)
    kat = np.array([[key[0], key[1], ctr[0], ctr[1], 0, 0, 0, 0] for ctr, key, _ in KAT], np.uint32)
    words = unb64(harness.evaluate("a => acceptHarness.drawBits(a)",
                                   {"addrsB64": b64(np.concatenate([kat, addrs]))}), np.uint32).reshape(-1, 8)
    for row, (_, _, want) in zip(words[:3], KAT):          # level 1 is a plain Threefry call
        assert (int(row[0]), int(row[1])) == want
    words = words[3:]
    bits = words[:, 2]
    for a, w, s in zip(addrs, words, seeds):
        assert (int(w[0]), int(w[1])) == rng.round_key(s, int(a[2]), int(a[3]))
        want = rng.threefry2x32(rng.round_key(s, int(a[2]), int(a[3])), (int(a[4]), int(a[5])))
        assert (int(w[2]), int(w[3])) == want
    assert words[1, 2] == 0x7E7A5EF1 and words[2, 2] == 0xE93C2D98 and words[3, 2] == 0xA42044F6   # docs/rng.md golden
    u_oc = words[:, 4].view(np.float32).astype(np.float64)
    u_oo = words[:, 5].view(np.float32).astype(np.float64)
    assert np.array_equal(u_oc, rng.uniform_open_closed_np(bits))          # exact in f32 by design
    assert np.array_equal(u_oo, rng.uniform_open_open_np(bits))
    assert np.array_equal(words, accept_twins.threefry_bits(addrs))        # the whole kernel vs its twin
    g_gpu = words[:, 6].view(np.float32)
    plog_gpu = words[:, 7].view(np.float32)
    assert np.array_equal(g_gpu.view(np.uint32), accept_twins.gumbel_f32(bits).view(np.uint32))   # twin: bitwise
    assert np.array_equal(plog_gpu.view(np.uint32), accept_twins.plog_f32(weights).view(np.uint32))
    g_ref = rng.gumbel_np(bits)
    plog_ref = rng.portable_log_np(weights[4:].astype(np.float64))      # weights[:4]: exact cases, log 0 at 1.0
    print(f"[err] gumbel_f32 max abs {max_error(g_gpu, g_ref, 'gumbel_f32'):.3g}; "
          f"plog_f32 max rel {max_error(plog_gpu[4:], plog_ref, 'plog_f32'):.3g}")
    assert within(g_gpu, g_ref, "gumbel_f32") and within(plog_gpu[4:], plog_ref, "plog_f32")


# ------------------------------------------------------------------------------ (c) decide vs decide_round
def as_decision(d) -> tuple:
    if isinstance(d, dict):
        return (d["n_accepted"], d["next_token"], d["rejected_at"], d["ended_by"], d["error_code"])
    err = d.error.code if d.error is not None else ""
    return (d.n_accepted, -1 if d.next_token is None else d.next_token,
            -1 if d.rejected_at is None else d.rejected_at, d.ended_by or "", err)


def make_round_set(gen, V, m, style):
    """Champion logits (m+1, V) f32, draft rows (m, V) f32 and proposals drawn from them."""
    logits = (gen.standard_normal((m + 1, V)) * gen.choice([0.5, 2.0, 5.0])).astype(np.float32)
    policy = SamplingPolicy()
    if style in ("close", "nan"):
        draft_logits = logits[:m] + gen.standard_normal((m, V)).astype(np.float32) * 0.3
    elif style in ("equal", "scaled"):                     # p_draft == p_target: zero residual, always accept
        draft_logits = logits[:m].copy()
    else:
        draft_logits = (gen.standard_normal((m, V)) * 2.0).astype(np.float32)
    p_draft = np.stack([processors.process_logits(r, [], policy) for r in draft_logits]).astype(np.float32) \
        if m else np.zeros((0, V), np.float32)
    if style == "disjoint" and m:                          # draft mass where the target has little
        p_draft[:, : V // 2] = 0
        p_draft /= p_draft.sum(axis=1, keepdims=True)
    if style == "scaled" and m:                             # 2 * p_target: a = 1/2, empty residual
        p_draft = (p_draft * 2).astype(np.float32)
    if style == "nan" and m >= 1:                           # invalid champion row 1: fatal only if reached
        logits[1, gen.integers(V)] = np.nan
    return logits, p_draft, policy


def draft_proposals(p_draft, seed, round_id):
    return [rng.sample_gumbel_max_np(p_draft[i].astype(np.float64), seed, rng.DRAFT_SAMPLE, round_id, i)
            for i in range(p_draft.shape[0])]


def reference_decision(logits, p_draft, proposals, policy, seed, round_id, stops, remaining, greedy, context=()):
    m = len(proposals)
    rows = reference_rows(logits[: m + 1], context, proposals, policy)
    p_draft_rows = [None] * m if greedy else [p_draft[i].astype(np.float64) for i in range(m)]
    return rows, decide_round(rows, p_draft_rows, proposals,
                              RngDecider(seed), round_id, stops, remaining, greedy)


def reference_accept_probability(rows, p_draft, proposals, j) -> float:
    y = proposals[j]
    return min(1.0, rows[j][y] / float(p_draft[j][y]))


def reference_scores(rows, p_draft, proposals, seed, round_id, rejected_at) -> np.ndarray:
    """(V,) Gumbel scores plog(w) + g of the row the round samples its last token from."""
    if rejected_at >= 0:
        w = residual_weights(rows[rejected_at], p_draft[rejected_at].astype(np.float64))
        domain, pos = rng.CORRECTION_SAMPLE, rejected_at
    elif proposals:
        w, domain, pos = rows[len(proposals)], rng.TARGET_EXTRA, 0
    else:
        w, domain, pos = rows[0], rng.TARGET_BASELINE, 0
    bits = rng.draw_bits_row_np(seed, domain, round_id, pos, w.shape[0])
    return np.where(w > 0, rng.portable_log_np(np.where(w > 0, w, 1.0)) + rng.gumbel_np(bits), -np.inf)


def disagreement_margin(rows, p_draft, proposals, seed, round_id, got, want):
    """Why f32 and the reference differ: ("accept", |u - a_ref|) at the first accept test that
    went the other way, else ("gumbel", reference score of its choice minus that of f32's)."""
    n_g, n_w = got[0], want[0]
    rej_g, rej_w = got[2], want[2]
    if (n_g, rej_g) != (n_w, rej_w):
        j = min(n_g, n_w)
        a = reference_accept_probability(rows, p_draft, proposals, j)
        return "accept", abs(rng.uniform_accept(seed, round_id, j) - a)
    if got[1] < 0 or want[1] < 0:
        return "outcome", math.inf
    score = reference_scores(rows, p_draft, proposals, seed, round_id, rej_w)
    return "gumbel", float(score[want[1]] - score[got[1]])


def assert_explained(kind, margin, detail):
    """A disagreement is allowed only inside the band the measured f32 errors can cross."""
    limit = TOLERANCES["accept_probability"].max_abs if kind == "accept" else flip_margin("gumbel_score")
    assert kind in ("accept", "gumbel") and margin <= limit, (detail, kind, margin, limit)


def decision_quantity_errors(got, want_t, rows, p_draft, proposals, seed, round_id):
    """For a round decided alike: (|a_gpu - a_ref| at the last accept test or None, |score_gpu - score_ref|
    of the sampled token or None), from the harness's diagnostic words."""
    n_acc, token, rej = want_t[0], want_t[1], want_t[2]
    a_err = score_err = None
    if proposals:
        j = rej if rej >= 0 else n_acc - 1
        if j >= 0:
            a_err = abs(got["diag"]["a"] - reference_accept_probability(rows, p_draft, proposals, j))
    if token >= 0:
        score_err = abs(got["diag"]["score"] - reference_scores(rows, p_draft, proposals, seed, round_id, rej)[token])
    return a_err, score_err


def run_rounds(harness, V, maxBlock, sets, jobs):
    out = harness.evaluate("a => acceptHarness.decideMany(a)", {
        "V": V, "maxBlock": maxBlock,
        "sets": [{"logitsB64": b64(s[0]), "pDraftB64": b64(s[1]) if s[1].size else ""} for s in sets],
        "jobs": jobs})
    return out["results"], out["ms"]


@pytest.mark.parametrize("V,n_sets,rounds_per_set", [(37, 60, 50), (1000, 20, 10)])
def test_decide_matches_decide_round(harness, V, n_sets, rounds_per_set):
    gen = np.random.default_rng(1000 + V)
    maxBlock = 5
    styles = ["close", "close", "far", "disjoint", "equal", "scaled", "nan"]
    sets, jobs, refs = [], [], []
    for s in range(n_sets):
        m = int(gen.integers(0, maxBlock))
        style = styles[s % len(styles)]
        logits, p_draft, policy = make_round_set(gen, V, m, style)
        context = []
        if s % 3 == 2:                                      # champion knobs (no top-p: its boundary is f32-fuzzy)
            policy = SamplingPolicy(temperature=0.8, top_k=max(1, V // 3), repetition_penalty=1.2,
                                    suppress_token_ids=(0,))
            context = [int(c) for c in gen.integers(0, V, size=4)]
        sets.append((logits, p_draft))
        seed = int(gen.integers(0, 2**63)) * 2 + 1
        for r in range(rounds_per_set):
            round_id = int(gen.integers(0, 2**32))
            proposals = draft_proposals(p_draft, seed, round_id)
            stops = [proposals[1]] if m >= 2 and r % 5 == 0 else []
            remaining = m if r % 7 == 0 else m + 3
            jobs.append({"set": s, "proposals": proposals, "policy": js_policy(policy), "contextIds": context,
                         "seed": [seed & 0xFFFFFFFF, seed >> 32], "roundId": round_id, "stopTokenIds": stops,
                         "remaining": remaining, "greedy": False})
            refs.append((logits, p_draft, proposals, policy, seed, round_id, stops, remaining, context))
    results, ms = run_rounds(harness, V, maxBlock, sets, jobs)
    n_diff, margins, kinds = 0, [], {}
    a_errs, score_errs = [0.0], [0.0]
    for got, (logits, p_draft, proposals, policy, seed, round_id, stops, remaining, context) in zip(results, refs):
        rows, want = reference_decision(logits, p_draft, proposals, policy, seed, round_id, stops, remaining, False,
                                        context)
        got_t, want_t = as_decision(got), as_decision(want)
        kinds[want_t[4] or "ok"] = kinds.get(want_t[4] or "ok", 0) + 1
        if got_t != want_t:
            n_diff += 1
            kind, margin = disagreement_margin(rows, p_draft, proposals, seed, round_id, got_t, want_t)
            margins.append((kind, margin))
            assert_explained(kind, margin, (got_t, want_t))
        elif not want_t[4]:
            a_err, score_err = decision_quantity_errors(got, want_t, rows, p_draft, proposals, seed, round_id)
            a_errs += [] if a_err is None else [a_err]
            score_errs += [] if score_err is None else [score_err]
    total = len(jobs)
    print(f"decide V={V}: {n_diff}/{total} disagreements ({n_diff / total:.2e}); margins {margins}; "
          f"outcomes {kinds}; {ms / total:.2f} ms per decide(); [err] accept_probability max abs {max(a_errs):.3g} "
          f"({len(a_errs) - 1} tests), gumbel_score max abs {max(score_errs):.3g} ({len(score_errs) - 1} tokens)")
    assert max(a_errs) <= TOLERANCES["accept_probability"].max_abs
    assert max(score_errs) <= TOLERANCES["gumbel_score"].max_abs
    assert len(a_errs) > total // 4 and len(score_errs) > total // 4     # the error bands are measured, not empty
    assert kinds.get("E_TARGET_NUMERIC_OR_MASK", 0) > 0 and kinds.get("E_RESIDUAL_INVARIANT", 0) > 0 or V > 100
    assert n_diff <= max(2, total // 500)


def test_decide_reports_near_top_p(harness):
    """Four equal logits, top_p = 0.5: the cumulative sum hits top_p exactly, so the f32 kernel
    flags the row; decide() passes the flag on (diag.near_top_p) and still decides as the reference."""
    logits = np.zeros((1, 4), np.float32)
    for top_p, flagged in ((0.5, True), (0.9, False)):
        policy = SamplingPolicy(top_p=top_p)
        jobs = [{"set": 0, "proposals": [], "policy": js_policy(policy), "seed": [5, 0], "roundId": r,
                 "stopTokenIds": [], "remaining": 1, "greedy": False} for r in range(20)]
        results, _ = run_rounds(harness, 4, 2, [(logits, np.zeros((0, 4), np.float32))], jobs)
        for r, got in enumerate(results):
            assert got["diag"]["near_top_p"] is flagged
            _, want = reference_decision(logits, np.zeros((0, 4)), [], policy, 5, r, [], 1, False)
            assert as_decision(got) == as_decision(want)


# ------------------------------------------------------------------------------ (d) distribution
def test_first_token_follows_p_target(harness):
    V, N = 6, 3000
    target_logits = np.log(np.array([0.30, 0.25, 0.15, 0.12, 0.10, 0.08]))
    draft_probs = np.array([0.10, 0.40, 0.00, 0.30, 0.15, 0.05], np.float32)   # misses token 2 entirely
    seed = 20240917
    p_target = processors.process_logits(target_logits, [], SamplingPolicy())
    for m in (2, 0):
        logits = np.tile(target_logits, (m + 1, 1)).astype(np.float32)
        p_draft = np.tile(draft_probs, (m, 1)).astype(np.float32)
        jobs = []
        for r in range(N):
            jobs.append({"set": 0, "proposals": draft_proposals(p_draft, seed, r), "policy": js_policy(SamplingPolicy()),
                         "seed": [seed, 0], "roundId": r, "stopTokenIds": [], "remaining": 10, "greedy": False})
        results, _ = run_rounds(harness, V, 3, [(logits, p_draft)], jobs)
        first = np.array([job["proposals"][0] if res["n_accepted"] >= 1 else res["next_token"]
                          for job, res in zip(jobs, results)])
        counts = np.bincount(first, minlength=V)
        chi2 = float((((counts - N * p_target) ** 2) / (N * p_target)).sum())
        critical = stats.chi2.isf(CHI2_ALPHA, V - 1)
        print(f"first token m={m}: counts {counts.tolist()} chi2 {chi2:.2f} (critical {critical:.2f} at {CHI2_ALPHA})")
        assert chi2 < critical


# ------------------------------------------------------------------------------ (e) greedy
@pytest.mark.parametrize("V", [37, 1000])
def test_greedy_equals_reference(harness, V):
    gen = np.random.default_rng(5000 + V)
    maxBlock = 5
    sets, jobs, refs = [], [], []
    policies_g = [SamplingPolicy(temperature=0),
                  SamplingPolicy(temperature=0, repetition_penalty=1.5, suppress_token_ids=(0, 3))]
    for s in range(40):
        m = int(gen.integers(0, maxBlock))
        logits = gen.integers(-2, 3, size=(m + 1, V)).astype(np.float32) if s % 2 else \
            (gen.standard_normal((m + 1, V)) * 2).astype(np.float32)
        if s % 9 == 4 and m:
            logits[m, 5] = np.nan                           # invalid row: reached only if all accepted
        policy = policies_g[s % 2]
        context = [int(c) for c in gen.integers(0, V, size=3)]
        sets.append((logits, np.zeros((0, V), np.float32)))
        for r in range(8):
            # proposals: the reference argmax chain, with one random deviation in some rounds
            proposals = []
            for i in range(m):
                row = processors.process_logits(logits[i], context + proposals, policy) \
                    if not np.isnan(logits[i]).any() else np.ones(V)
                proposals.append(int(np.argmax(row)))
            if m and r % 2:
                proposals[int(gen.integers(m))] = int(gen.integers(V))
            stops = [proposals[0]] if m and r == 3 else []
            remaining = m if r == 5 else m + 2
            jobs.append({"set": s, "proposals": proposals, "contextIds": context, "policy": js_policy(policy),
                         "seed": [1, 2], "roundId": r, "stopTokenIds": stops, "remaining": remaining, "greedy": True})
            refs.append((logits, proposals, policy, stops, remaining, context))
    results, _ = run_rounds(harness, V, maxBlock, sets, jobs)
    for got, (logits, proposals, policy, stops, remaining, context) in zip(results, refs):
        _, want = reference_decision(logits, np.zeros((0, V)), proposals, policy, 0, 0, stops, remaining, True, context)
        assert as_decision(got) == as_decision(want), (proposals, got)


# ------------------------------------------------------------------------------ NumPy f32 twins (CPU only)
def test_twins_match_reference():
    """accept_twins (the kernels' f32 recipes in NumPy) agree with the float64 references."""
    gen = np.random.default_rng(3)
    for V in (7, 300):
        for kind in ("normal", "ties", "peaked"):
            logits = make_logits(kind, 3, V, gen)
            for policy in policies(V, gen):
                probs, status, _ = accept_twins.processors_rows(logits, [1, 2], [3, 4], policy)
                for i, want in enumerate(reference_rows(logits, [1, 2], [3, 4], policy)):
                    if isinstance(want, ExactSpecError):
                        assert status[i] & accept_twins.ROW_INVALID
                    elif not status[i] & accept_twins.ROW_NEAR_TOP_P:
                        assert within(probs[i], want, "processed_probs"), (V, kind, policy, i)
    V, margins = 37, []
    for s in range(60):
        m = int(gen.integers(0, 5))
        logits, p_draft, policy = make_round_set(gen, V, m, ["close", "far", "scaled", "nan"][s % 4])
        for r in range(10):
            proposals = draft_proposals(p_draft, 11, r)
            probs, status, argmax = accept_twins.processors_rows(logits, [], proposals, policy)
            got = accept_twins.accept_decide(probs, status, argmax, p_draft, proposals, 11, r, [], m + 1, False)
            rows, want = reference_decision(logits, p_draft, proposals, policy, 11, r, [], m + 1, False)
            got_t, want_t = as_decision(got), as_decision(want)
            if got_t != want_t:
                kind, margin = disagreement_margin(rows, p_draft, proposals, 11, r, got_t, want_t)
                margins.append((kind, margin))
                assert_explained(kind, margin, (s, r, got_t, want_t))
    print(f"twins vs reference: {len(margins)} disagreements in 600 rounds, margins {margins}")

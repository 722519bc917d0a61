"""WASM-SIMD champion (wasm/champion.c + web/champion_wasm/champion_wasm.mjs) in Node:

- forward logits vs the reference computing the same function: matmul "auto" runs q8act-v1 on the
  int8 rows (docs/quant_kernels.md) against LlamaReference.from_dir(dir, weights="q8",
  matmul="q8act") within TOLERANCES["wasm_champion_logits_q8act"] (and counts the rows that are
  the same bits), matmul "f32" (and a model whose widths are not multiples of 32) the float
  function against weights="q8" within TOLERANCES["wasm_champion_logits"]; blocks of 1..9 with
  rollback and re-feed;
- batch invariance: a position's logits are the same bits decoded alone or inside any block, at
  any offset, after a rollback;
- champion_decide vs acceptance.decide_round (process_logits, RngDecider) on thousands of random
  rounds: decisions equal, except inside the float64 margins of the tolerance table;
- coded errors for bad calls and bad files.

Models (tests/synthetic_models.py): a random HF Llama (tiny_llama), a NumPy-made one with awkward
sizes (V = 301, one KV head, 3 layers) and the shipped web/models/champion/ when present.
"""
from __future__ import annotations

import base64
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from browser_fixture import REPO_ROOT
from test_gpu_accept import (as_decision, draft_proposals, js_policy, make_round_set, reference_rows,
                             reference_scores)
from test_gpu_champion import split
import synthetic_models
from node_harness import run_harness
from tolerances import TOLERANCES, flip_margin, max_error, within

from exactspec.core import rng
from exactspec.core.acceptance import decide_round
from exactspec.core.deciders import RngDecider
from exactspec.core.policy import AllowedSetGrammar, SamplingPolicy
from exactspec.reference.processors import process_logits
from exactspec.reference.reference_llama import LlamaReference

WASM = REPO_ROOT / "web" / "build" / "cpu.wasm"
WASM_THREADS = REPO_ROOT / "web" / "build" / "cpu_mt.wasm"
HARNESS = REPO_ROOT / "web" / "tests" / "champion_harness.mjs"
SHIPPED = REPO_ROOT / "web" / "models" / "champion"


# ----------------------------------------------------------------------------- set-up
def ensure_wasm() -> Path:
    """Build web/build/cpu.wasm and cpu_mt.wasm if either is missing or older than any source in wasm/."""
    sources = [p for p in (REPO_ROOT / "wasm").iterdir() if p.suffix in (".c", ".h", ".sh")]
    newest = max(p.stat().st_mtime for p in sources)
    if any(not w.exists() or w.stat().st_mtime < newest for w in (WASM, WASM_THREADS)):
        subprocess.run(["bash", str(REPO_ROOT / "wasm" / "build.sh")], check=True, cwd=REPO_ROOT)
    return WASM


def ensure_tiny() -> Path:
    return synthetic_models.tiny_llama(seed=3)


def model_dirs():
    dirs = ["tiny", "odd"]
    if (SHIPPED / "model.q8.safetensors").exists():
        dirs.append("shipped")
    return dirs


def resolve(which: str) -> Path:
    return {"tiny": ensure_tiny, "odd": synthetic_models.odd_q8}.get(which, lambda: SHIPPED)()


_refs: dict = {}
FUNCTION_MATMUL = {"q8act-v1": "q8act", "f32": "f32"}      # champion.matmulFunction -> reference matmul
FUNCTION_TOLERANCE = {"q8act-v1": "wasm_champion_logits_q8act", "f32": "wasm_champion_logits"}


def reference(model_dir: Path, matmul: str = "f32") -> LlamaReference:
    if (model_dir, matmul) not in _refs:
        _refs[(model_dir, matmul)] = LlamaReference.from_dir(model_dir, weights="q8", matmul=matmul)
    return _refs[(model_dir, matmul)]


def b64(array) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


def unb64(text, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def run_node(model_dir: Path, cases: dict, max_block: int = 9, max_context: int = 0, threads: int = 1,
             wasm: Path = WASM, weight_storage: str = "auto", matmul: str = "auto") -> dict:
    ensure_wasm()
    return run_harness(HARNESS, {"wasm": str(wasm), "model_dir": str(model_dir), "max_block": max_block,
                                 "max_context": max_context, "threads": threads, "weight_storage": weight_storage,
                                 "matmul": matmul, **cases})


def forward_rows(out_rows, blocks, vocab) -> list:
    return [unb64(s, np.float32).reshape(len(ids), vocab) for s, (ids, _) in zip(out_rows, blocks)]


def as_blocks(blocks) -> list:
    return [[[int(i) for i in ids], int(start)] for ids, start in blocks]


# ----------------------------------------------------------------------------- forward
# (model, matmul option) -> the function the champion must run: q8act-v1 wherever every int8
# linear's width is a multiple of 32; odd_q8's down_proj (176 wide) keeps "auto" on the float one
LOGITS_CASES = [(w, "auto", "f32" if w == "odd" else "q8act-v1") for w in model_dirs()] + \
    [(w, "f32", "f32") for w in model_dirs() if w != "odd"]


@pytest.mark.parametrize("which,matmul,function", LOGITS_CASES)
def test_logits_match_q8_reference(which, matmul, function):
    model_dir = resolve(which)
    ref = reference(model_dir, FUNCTION_MATMUL[function])
    tol_name = FUNCTION_TOLERANCE[function]
    V = ref.vocab_size
    gen = np.random.default_rng(11)
    longest = min(150, ref.max_context)
    plans = [(5, [5]), (17, [9, 1, 7]), (40, [8, 9, 3, 2]), (longest, [9, 9, 2])]
    sequences, blocks_of = [], []
    for length, sizes in plans:
        ids = gen.integers(0, V, length)
        blocks = split(ids, sizes)
        if length > 8:
            blocks += [(ids[length - 6:length - 1], length - 6)]      # rollback and re-feed 5 positions
        sequences.append(as_blocks(blocks))
        blocks_of.append(blocks)
    out = run_node(model_dir, {"forward": sequences}, matmul=matmul)
    assert out["info"]["identity"] == ref.identity                 # sha256 of model.q8.safetensors
    assert out["info"]["matmulFunction"] == function
    worst, same, total = 0.0, 0, 0
    for rows, blocks in zip(out["forward"], blocks_of):
        ref.reset()
        for got, (ids, start) in zip(forward_rows(rows, blocks, V), blocks):
            want = ref.forward(ids, start)
            worst = max(worst, max_error(got, want, tol_name))
            same += int(np.all(got.astype(np.float64) == want, axis=1).sum())
            total += len(ids)
            assert within(got, want, tol_name), (which, start, len(ids), np.abs(got - want).max())
    print(f"[err] {tol_name} ({which}, matmul {matmul}): max abs {worst:.3g}; {same}/{total} rows bit-identical; "
          f"memory {out['info']['memoryBytes']} bytes")


@pytest.mark.parametrize("which", model_dirs())
def test_block_logits_bitwise_equal_single(which):
    """Each position's logits: the same float32 bits alone, in blocks of 2..9 at any offset,
    and after a rollback over a different continuation."""
    model_dir = resolve(which)
    V = reference(model_dir).vocab_size
    ids = np.random.default_rng(7).integers(0, V, 31)
    other = ids.copy()
    other[20:] = (other[20:] + 1) % V
    plans = [[1], [9], [2, 7, 4], [5, 1, 8, 3, 6, 9], [3, 3, 3, 2, 2, 2, 4, 4, 4, 4], [6, 2, 9, 1, 5, 7]]
    sequences = [split(ids, sizes) for sizes in plans]
    rollback = split(ids[:20], [9]) + [(other[20:29], 20), (ids[18:27], 18), (ids[27:31], 27)]
    sequences.append(rollback)
    out = run_node(model_dir, {"forward": [as_blocks(s) for s in sequences]})
    got = [np.concatenate(forward_rows(rows, blocks, V)) for rows, blocks in zip(out["forward"], sequences)]
    singles = got[0].view(np.uint32)
    for sizes, rows in zip(plans[1:], got[1:-1]):
        differ = np.flatnonzero((rows.view(np.uint32) != singles).any(axis=1))
        assert differ.size == 0, f"{which}: block sizes {sizes}: positions {differ.tolist()} differ"
    again = forward_rows(out["forward"][-1], rollback, V)
    assert np.array_equal(again[-2].view(np.uint32), singles[18:27]), "re-fed block after rollback differs"
    assert np.array_equal(again[-1].view(np.uint32), singles[27:31])
    assert not np.array_equal(again[2].view(np.uint32), singles[20:29])     # the other continuation really differed


def test_kv_caches_grow_on_demand_and_keep_every_position():
    """A model with room for 2048 positions: the caches start at 512 positions and grow (twice) while
    1200 positions go through in blocks; the rows match the reference past each growth, and the same
    sequence run again once the caches have grown (no growth during it) gives the same bits: the
    growth copied every cached position exactly."""
    model_dir = synthetic_models.long_llama(seed=5)
    ref = reference(model_dir, "q8act")
    V = ref.vocab_size
    ids = np.random.default_rng(13).integers(0, V, 1200)
    blocks = split(ids, [9] * 133 + [3])
    out = run_node(model_dir, {"forward": [as_blocks(blocks), as_blocks(blocks)]})
    assert out["info"]["maxContext"] == 2048 and out["info"]["kvCapacity"] == 512
    assert out["kvCapacityAfter"] >= 1200
    first, again = (forward_rows(rows, blocks, V) for rows in out["forward"])
    for a, b in zip(first, again):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    ref.reset()
    for got, (block_ids, start) in zip(first, blocks):
        want = ref.forward(block_ids, start)
        if start in (0, 504, 513, 1017, 1026, 1197):        # around each growth (512, 1024) and the end
            assert within(got, want, "wasm_champion_logits_q8act"), (start, np.abs(got - want).max())


@pytest.mark.parametrize("which", model_dirs())
def test_threads_bitwise_equal_one_thread(which):
    """cpu_mt.wasm with 1, 2 and 3 threads (Node worker_threads over shared memory): every
    logits row is the same bits as the one-thread build's, blocks of 1..9 with a rollback."""
    model_dir = resolve(which)
    V = reference(model_dir).vocab_size
    ids = np.random.default_rng(5).integers(0, V, 40)
    blocks = split(ids, [1, 9, 4, 2, 7, 3, 9, 5]) + [(ids[30:39], 30), (ids[12:21], 12)]
    cases = {"forward": [as_blocks(blocks)]}
    want = np.concatenate(forward_rows(run_node(model_dir, cases)["forward"][0], blocks, V)).view(np.uint32)
    for threads in (1, 2, 3):
        out = run_node(model_dir, cases, threads=threads, wasm=WASM_THREADS)
        got = np.concatenate(forward_rows(out["forward"][0], blocks, V)).view(np.uint32)
        assert np.array_equal(got, want), f"{which}: {threads} threads differ at rows {np.flatnonzero((got != want).any(1))}"


@pytest.mark.parametrize("which", model_dirs())
def test_int8_weight_storage_bitwise_equal_f32(which):
    """The q8 linears held as int8 (widened in registers) give the same bits as held widened to
    f32, for blocks of 1..9 with rollbacks, on one thread and on three."""
    model_dir = resolve(which)
    V = reference(model_dir).vocab_size
    ids = np.random.default_rng(9).integers(0, V, 40)
    blocks = split(ids, [1, 9, 4, 2, 7, 3, 9, 5]) + [(ids[30:39], 30), (ids[12:21], 12)]
    cases = {"forward": [as_blocks(blocks)]}
    runs = {}
    for storage, threads, wasm in [("f32", 1, WASM), ("int8", 1, WASM), ("int8", 3, WASM_THREADS)]:
        out = run_node(model_dir, cases, threads=threads, wasm=wasm, weight_storage=storage)
        assert out["info"]["weightStorage"] == storage
        runs[(storage, threads)] = np.concatenate(forward_rows(out["forward"][0], blocks, V)).view(np.uint32)
    want = runs[("f32", 1)]
    for key, got in runs.items():
        assert np.array_equal(got, want), f"{which}: {key} differs at rows {np.flatnonzero((got != want).any(1))}"


# ----------------------------------------------------------------------------- decide
def random_policy(gen, V) -> SamplingPolicy:
    """Champion policies: every knob, alone and combined (top-p included: float64 on both sides)."""
    kind = int(gen.integers(0, 8))
    some = tuple(sorted(set(int(i) for i in gen.choice(V, size=min(V - 1, 3), replace=False))))
    allowed = AllowedSetGrammar(sorted(set(int(i) for i in gen.choice(V, size=max(2, V // 3), replace=False))))
    return [
        SamplingPolicy(),
        SamplingPolicy(temperature=float(gen.choice([0.5, 0.8, 1.7]))),
        SamplingPolicy(top_k=int(gen.integers(1, V))),
        SamplingPolicy(top_p=float(gen.uniform(0.3, 0.99))),
        SamplingPolicy(repetition_penalty=float(gen.choice([0.8, 1.3, 2.0]))),
        SamplingPolicy(suppress_token_ids=some),
        SamplingPolicy(grammar=allowed, top_p=0.9),
        SamplingPolicy(temperature=0.7, top_k=max(1, V // 4), top_p=0.85, repetition_penalty=1.2,
                       suppress_token_ids=some[:1], grammar=allowed),
    ][kind]


def reference_decision(logits, p_draft, proposals, policy, seed, round_id, stops, remaining, greedy, context):
    m = len(proposals)
    rows = reference_rows(logits[: m + 1], context, proposals, policy)
    p_draft_rows = [None] * m if greedy else [p_draft[i].astype(np.float64) for i in range(m)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)       # p_draft(y) == 0: ratio inf, accepted
        decision = decide_round(rows, p_draft_rows, proposals, RngDecider(seed), round_id, stops, remaining, greedy)
    return rows, decision


def reference_quantities(rows, p_draft, proposals, seed, round_id, want):
    """(a of the last accept test or None, Gumbel score of the sampled token or None) in float64."""
    n_acc, token, rej = want[0], want[1], want[2]
    a = score = None
    if proposals and p_draft is not None:
        j = rej if rej >= 0 else n_acc - 1
        if j >= 0 and not want[4]:
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = rows[j][proposals[j]] / np.float64(p_draft[j][proposals[j]])
            a = float(ratio) if ratio < 1 else 1.0
    if token >= 0 and p_draft is not None:
        score = float(reference_scores(rows, p_draft, proposals, seed, round_id, rej)[token])
    return a, score


def explain(rows, p_draft, proposals, seed, round_id, got, want):
    """A disagreement is allowed only where float64 rounding can reverse it: the reference's
    accept test within wasm_accept_probability of its uniform, or the reference's top two
    Gumbel scores within flip_margin("wasm_gumbel_score")."""
    if (got[0], got[2]) != (want[0], want[2]):
        j = min(got[0], want[0])
        a = min(1.0, rows[j][proposals[j]] / float(p_draft[j][proposals[j]]))
        return abs(rng.uniform_accept(seed, round_id, j) - a) <= TOLERANCES["wasm_accept_probability"].max_abs
    if got[1] < 0 or want[1] < 0:
        return False
    _, score_want = reference_quantities(rows, p_draft, proposals, seed, round_id, want)
    _, score_got = reference_quantities(rows, p_draft, proposals, seed, round_id, got)
    return score_want - score_got <= flip_margin("wasm_gumbel_score")


def argmax_chain(logits, context, policy, m) -> list:
    """Greedy proposals: each the argmax of its processed row (a random id where a row is invalid)."""
    proposals = []
    for i in range(m):
        rows = reference_rows(logits[i:i + 1], list(context) + proposals, [], policy)
        proposals.append(int(np.argmax(rows[0])) if isinstance(rows[0], np.ndarray) else i)
    return proposals


def build_rounds(gen, V, n_sets, rounds_per_set, max_block=9):
    """Synthetic logits sets (hard shapes) x random rounds: policies, seeds, stops, remaining, greedy."""
    styles = ["close", "close", "far", "disjoint", "equal", "scaled", "nan"]
    sets, jobs, refs = [], [], []
    for s in range(n_sets):
        m = int(gen.integers(0, max_block))
        style = styles[s % len(styles)]
        logits, p_draft, _ = make_round_set(gen, V, m, style)
        if s % 5 == 4:                                       # ties everywhere
            logits = gen.integers(-2, 3, size=logits.shape).astype(np.float32)
        sets.append({"logits": b64(logits), "p_draft": b64(p_draft) if p_draft.size else ""})
        seed = int(gen.integers(0, 2**63)) * 2 + int(gen.integers(0, 2))
        for r in range(rounds_per_set):
            round_id = int(gen.integers(0, 2**32))
            greedy = r % 6 == 5
            policy = SamplingPolicy(temperature=0) if greedy and r % 12 == 5 else random_policy(gen, V)
            context = [int(c) for c in gen.integers(0, V, size=int(gen.integers(0, 6)))]
            proposals = draft_proposals(p_draft, seed, round_id)
            if m and r % 9 == 4:                             # a proposal the draft gave zero mass
                zero = np.flatnonzero(p_draft[0] == 0)
                if zero.size:
                    proposals[0] = int(zero[0])
            if greedy:                                       # the reference argmax chain, one deviation
                proposals = argmax_chain(logits, context, policy, m)
                if m and r % 2:
                    proposals[int(gen.integers(m))] = int(gen.integers(V))
            stops = [proposals[int(gen.integers(m))]] if m and r % 4 == 0 else [int(gen.integers(V))]
            remaining = int(gen.integers(m, m + 3)) if m else 1
            jobs.append({"set": s, "proposals": proposals, "policy": js_policy(policy), "contextIds": context,
                         "seed": [seed & 0xFFFFFFFF, seed >> 32], "roundId": round_id, "stopTokenIds": stops,
                         "remaining": remaining, "greedy": greedy})
            refs.append((logits, p_draft, proposals, policy, seed, round_id, stops, remaining, greedy, context))
    return sets, jobs, refs


def check_rounds(results, refs, label):
    """Compare every decision with decide_round; returns counters and the measured errors."""
    n_diff, kinds, a_errs, score_errs = 0, {}, [0.0], [0.0]
    for got, (logits, p_draft, proposals, policy, seed, round_id, stops, remaining, greedy, context) in zip(results, refs):
        assert "thrown" not in got, (label, got)
        rows, want = reference_decision(logits, p_draft, proposals, policy, seed, round_id, stops, remaining, greedy,
                                        context)
        got_t, want_t = as_decision(got), as_decision(want)
        kinds[want_t[4] or want_t[3] or "token"] = kinds.get(want_t[4] or want_t[3] or "token", 0) + 1
        if got_t != want_t:
            n_diff += 1
            assert not greedy, (label, "greedy decisions must be equal", got_t, want_t)
            assert explain(rows, p_draft, proposals, seed, round_id, got_t, want_t), (label, got_t, want_t)
            continue
        a, score = reference_quantities(rows, None if greedy else p_draft, proposals, seed, round_id, want_t)
        # the record carries the diagnostics as float32 bits: errors in units of float32 spacing
        if a is not None and got["diag"]["a"] is not None:            # NaN (no test) arrives as null
            a_errs.append(abs(got["diag"]["a"] - a) / abs(float(np.spacing(np.float32(a)))))
        if score is not None:
            score_errs.append(abs(got["diag"]["score"] - score) / abs(float(np.spacing(np.float32(score)))))
    return n_diff, kinds, max(a_errs), max(score_errs), len(a_errs) - 1, len(score_errs) - 1


@pytest.mark.parametrize("V,n_sets,rounds_per_set", [(37, 160, 24), (1000, 60, 24), (4096, 6, 20)])
def test_decide_matches_decide_round(V, n_sets, rounds_per_set):
    gen = np.random.default_rng(4000 + V)
    sets, jobs, refs = build_rounds(gen, V, n_sets, rounds_per_set)
    model_dir = {37: None, 1000: ensure_tiny(), 4096: SHIPPED}[V]
    if model_dir is None or not (model_dir / "config.json").exists():
        model_dir = synthetic_models.vocab_q8(V)
    out = run_node(model_dir, {"decide": {"sets": sets, "jobs": jobs}})
    n_diff, kinds, a_err, score_err, n_a, n_score = check_rounds(out["decide"]["results"], refs, f"V={V}")
    total = len(jobs)
    print(f"decide V={V}: {n_diff}/{total} disagreements; outcomes {kinds}; accept probability within "
          f"{a_err:.3g} float32 spacings ({n_a} tests), Gumbel score within {score_err:.3g} ({n_score} tokens)")
    assert a_err <= 1.0 and score_err <= 1.0    # the float64 values (TOLERANCES) rounded once to float32
    assert n_a > total // 4 and n_score > total // 4                    # the compared quantities are not empty
    if V < 100:                                                          # every outcome occurs
        assert {"token", "stop", "length", "E_TARGET_NUMERIC_OR_MASK", "E_RESIDUAL_INVARIANT"} <= set(kinds), kinds
    assert n_diff <= max(1, total // 2000)


@pytest.mark.parametrize("which", model_dirs())
def test_decide_on_forward_rows(which):
    """Rounds on the model's own logits: the rows decide() reads are exactly readLogits()'s. The
    draft rows are the reference's processed rows of the same block, a little perturbed, so
    proposals are often accepted."""
    model_dir = resolve(which)
    ref = reference(model_dir)
    V = ref.vocab_size
    gen = np.random.default_rng(99)
    sets, jobs, plans = [], [], []
    for s in range(12):
        m = int(gen.integers(0, 9))
        prompt = [int(i) for i in gen.integers(0, V, int(gen.integers(1, 20)))]
        block = [int(i) for i in gen.integers(0, V, m + 1)]
        forward = [[prompt[i:i + 9], i] for i in range(0, len(prompt), 9)] + [[block, len(prompt)]]
        ref.reset()
        ref.forward(prompt, 0)
        near = ref.forward(block, len(prompt))[:m] + gen.normal(0, 0.3, (m, V))        # (m, V)
        p_draft = np.array([process_logits(row, [], SamplingPolicy()) for row in near], np.float32).reshape(m, V)
        sets.append({"forward": forward, "p_draft": b64(p_draft) if m else ""})
        plans.append((prompt, p_draft))
        seed = int(gen.integers(0, 2**63))
        for r in range(30):
            greedy = r % 5 == 4
            proposals = draft_proposals(p_draft, seed, r)
            policy = random_policy(gen, V) if r % 3 == 2 else SamplingPolicy(temperature=float(gen.choice([1.0, 0.9])))
            jobs.append({"set": s, "proposals": proposals, "policy": js_policy(policy), "contextIds": prompt,
                         "seed": [seed & 0xFFFFFFFF, seed >> 32], "roundId": r, "stopTokenIds": [1],
                         "remaining": m + int(gen.integers(0, 2)), "greedy": greedy})
    out = run_node(model_dir, {"decide": {"sets": sets, "jobs": jobs}})
    refs = []
    for job in jobs:
        prompt, p_draft = plans[job["set"]]
        logits = unb64(out["decide"]["setLogits"][job["set"]], np.float32).reshape(-1, V)
        policy = SamplingPolicy(temperature=job["policy"]["temperature"], top_k=job["policy"]["top_k"],
                                top_p=job["policy"]["top_p"], repetition_penalty=job["policy"]["repetition_penalty"],
                                suppress_token_ids=tuple(job["policy"]["suppress_token_ids"]),
                                grammar=None if job["policy"]["allowed_token_ids"] is None
                                else AllowedSetGrammar(job["policy"]["allowed_token_ids"]))
        seed = job["seed"][0] | job["seed"][1] << 32
        refs.append((logits, p_draft, job["proposals"], policy, seed, job["roundId"], job["stopTokenIds"],
                     job["remaining"], job["greedy"], prompt))
    n_diff, kinds, a_err, score_err, _, _ = check_rounds(out["decide"]["results"], refs, which)
    print(f"decide on forward rows ({which}): {n_diff}/{len(jobs)} disagreements; outcomes {kinds}")
    assert n_diff == 0 and kinds.get("length", 0) + kinds.get("stop", 0) > 0    # some rounds accept everything


# ----------------------------------------------------------------------------- errors
def test_bad_calls_and_files_are_coded():
    model_dir = synthetic_models.odd_q8()
    ok_decide = {"nRows": 1, "proposals": [], "policy": {}, "seed": [1, 2], "roundId": 0}
    errors = [
        {"op": "forward", "ids": list(range(5)), "start": 0},             # block > maxBlock 4
        {"op": "forward", "ids": [1], "start": 33},                       # skips uncached positions
        {"op": "forward", "ids": [301], "start": 0},                      # id >= V
        {"op": "forward", "ids": [], "start": 0},
        {"op": "forward", "ids": [1, 2], "start": 31},                    # beyond maxContext 32
        {"op": "forward", "ids": [1, 2], "start": 30},                    # fine
        {"op": "readLogits", "n": 5},
        {"op": "decide", "args": {**ok_decide, "nRows": 2}},              # nRows != m + 1
        {"op": "decide", "args": {**ok_decide, "policy": {"top_p": 0}}},
        {"op": "decide", "args": {**ok_decide, "policy": {"temperature": -1}}},
        {"op": "decide", "args": {**ok_decide, "policy": {"suppress_token_ids": [301]}}},
        {"op": "decide", "args": {**ok_decide, "seed": [2**32, 0]}},
        {"op": "decide", "args": {**ok_decide, "contextIds": [-1]}},
        {"op": "decide", "args": {**ok_decide, "nRows": 2, "proposals": [3], "remaining": 1}},   # no pDraft
        {"op": "decide", "args": {**ok_decide, "nRows": 3, "proposals": [3, 4], "remaining": 1, "greedy": True}},
        {"op": "decide", "args": {**ok_decide, "nRows": 3, "proposals": [3, 4], "remaining": 2, "greedy": True}},
        {"op": "decide", "args": ok_decide},                              # fine
        {"op": "poison", "n": 1},
        {"op": "decide", "args": ok_decide},                              # answers E_TARGET_NUMERIC_OR_MASK
    ]
    fill = [[[1, 2, 3, 4], s] for s in range(0, 32, 4)]                # 32 positions cached
    out = run_node(model_dir, {"errors": errors, "forward": [fill], "load_errors": [
        {"max_block": 0}, {"max_block": 65}, {"max_context": 81}, {"threads": 3}, {"threads": 17},
        {"config_patch": {"tie_word_embeddings": False}}, {"config_patch": {"hidden_act": "gelu"}},
        {"config_patch": {"head_dim": 18}}, {"config_patch": {"vocab_size": 300}}, {"truncate": 7},
        {"rename_tensor": "model.layers.2.mlp.up_proj.weight.scale"}, {}]}, max_block=4, max_context=32)
    assert out["errors"] == ["E_BAD_ARGUMENT"] * 4 + ["E_CONTEXT_OVERFLOW", "", "E_BAD_ARGUMENT"] + ["E_BAD_ARGUMENT"] * 7 + \
        ["E_BAD_ARGUMENT", "E_BAD_ARGUMENT", "", "", "E_TARGET_NUMERIC_OR_MASK"]
    assert out["load_errors"] == ["E_BAD_ARGUMENT"] * 5 + ["E_MODEL_LOAD"] * 6 + [""]   # threads 3: one-thread build
    assert out["after_destroy"] == "E_TERMINATED"

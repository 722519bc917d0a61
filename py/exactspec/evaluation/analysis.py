"""From a run's records to its results (pure): speed-ups per request and stratum, survival and
E[G(k)], the cost model and its prediction, break-even N_min, latency decomposition, memory by
category, quality, the gate metrics and the conclusion per topology. The functions that take a
`backend` compare records' "backend" field; the v2 report passes records whose "backend" is their
topology ("toy-wasm", "real-wasm", ...), so the same code groups by topology."""
from __future__ import annotations

import math

from . import metrics as M
from .arms import ADAPTIVE_K_MAX, DRAFT_KS, arm_spec, engine_name

KV_BYTES = 4   # float32 K and V


def decode_ms_per_token(rec: dict):
    n = len(rec["token_ids"]) if rec.get("token_ids") is not None else rec.get("n_tokens", 0)
    if n < 2 or rec.get("first_token_ms") is None:
        return None
    return (rec["total_ms"] - rec["first_token_ms"]) / (n - 1)


def index(records: list) -> dict:
    return {(r["backend"], r["arm"], r["prompt_id"], r["temperature"], r.get("rep", 0)): r for r in records}


def per_request_speedups(records: list) -> list:
    """Each request of an arm against champion alone (same backend, prompt, T, repeat): end to end
    (page-clock request time) and decode (ms/token after the first token). wllama is set
    against the WASM champion alone."""
    idx = index(records)
    out = []
    for r in records:
        if r["arm"] == "none":
            continue
        base = idx.get((_wllama_base(r["backend"]), "none", r["prompt_id"], r["temperature"], r.get("rep", 0)))
        if base is None:
            continue
        out.append({"backend": r["backend"], "arm": r["arm"], "prompt_id": r["prompt_id"], "stratum": r["stratum"],
                    "temperature": r["temperature"], "speedup": M.speedup(base["total_ms"], r["total_ms"]),
                    "decode_speedup": M.speedup(decode_ms_per_token(base), decode_ms_per_token(r))})
    return out


def _wllama_base(backend: str) -> str:
    """wllama runs are set against the WASM champion alone of the same pair ("toy-wllama" -> "toy-wasm")."""
    return backend[:-len("wllama")] + "wasm" if backend.endswith("wllama") else backend


def group_median(rows: list, keys: tuple, field: str) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r[field])
    return {k: M.median(v) for k, v in groups.items()}


def spec_rounds(recs: list) -> list:
    """(proposed, accepted) of every round that proposed something."""
    return [(p, a) for r in recs for p, a, *_ in r.get("rounds", []) if p > 0]


def survival_table(records: list, arm: str = f"draft-k{ADAPTIVE_K_MAX}") -> dict:
    """{(backend, stratum, T): survival(...)} from the rounds of `arm`, plus stratum "all"."""
    out, groups = {}, {}
    for r in records:
        if r["arm"] == arm:
            groups.setdefault((r["backend"], r["stratum"], r["temperature"]), []).append(r)
            groups.setdefault((r["backend"], "all", r["temperature"]), []).append(r)
    for key, recs in groups.items():
        out[key] = M.survival(spec_rounds(recs), ADAPTIVE_K_MAX)
    return out


def tokens_per_round(recs: list):
    rounds = spec_rounds(recs)
    return (sum(a for _, a in rounds) + len(rounds)) / len(rounds) if rounds else None


def expected_vs_measured(records: list, surv: dict) -> list:
    """E[G(k)] predicted from the k = 8 arm's S_i against each fixed-k arm's tokens per round."""
    out = []
    for (backend, stratum, t), s in sorted(surv.items(), key=str):
        for k in DRAFT_KS:
            recs = [r for r in records if r["backend"] == backend and r["arm"] == f"draft-k{k}" and r["temperature"] == t
                    and (stratum == "all" or r["stratum"] == stratum)]
            measured = tokens_per_round(recs)
            if measured is not None:
                out.append({"backend": backend, "stratum": stratum, "temperature": t, "k": k,
                            "predicted": M.expected_tokens(s["S"], k), "measured": measured})
    return out


def _step_ms(rec: dict):
    """A champion-alone request's mean champion ms per step after its first round: each round entry's
    verify time over its tokens (a chain of baseline steps is one entry of several; runs before
    chains had one token an entry)."""
    return _mean(x[4] / max(x[2], 1) for x in rec["rounds"][1:])


def _mean(values):
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def cost_model(records: list, surv: dict, backend: str, t: float, k: int = 4) -> dict | None:
    """The specification's per-token cost for draft k against champion alone, pooled over strata:
    C_t(1) = champion-alone page ms/token; its per-step overhead o = C_t(1) - engine step time;
    predicted C_spec(k) = (k d + V(k) + o) / E[G(k)] with d the draft ms per proposal, V the
    verify ms per round of the k arm, E[G(k)] from the k = 8 arm's S_i; measured = the k arm's
    page ms/token."""
    alone = [r for r in records if r["backend"] == backend and r["arm"] == "none" and r["temperature"] == t]
    arm = [r for r in records if r["backend"] == backend and r["arm"] == f"draft-k{k}" and r["temperature"] == t]
    s = surv.get((backend, "all", t))
    if not alone or not arm or s is None:
        return None
    c1 = M.median(decode_ms_per_token(r) for r in alone)
    step = M.median(_step_ms(r) for r in alone)   # engine ms per champion step
    rounds = [x for r in arm for x in r["rounds"] if x[0] > 0]
    if c1 is None or step is None or not rounds:
        return None
    d = sum(x[3] for x in rounds) / sum(x[0] for x in rounds)
    v = sum(x[4] for x in rounds) / len(rounds)
    eg = M.expected_tokens(s["S"], k)
    if eg is None:
        return None
    overhead = max(c1 - step, 0.0)
    predicted = M.spec_cost_per_token(d, k, v, overhead, eg)
    measured = M.median(decode_ms_per_token(r) for r in arm)
    pred_speedup, meas_speedup = M.speedup(c1, predicted), M.speedup(c1, measured)
    return {"backend": backend, "temperature": t, "k": k, "c_alone_ms": c1, "step_ms": step, "overhead_ms": overhead,
            "draft_ms_per_proposal": d, "verify_ms_per_round": v, "expected_tokens": eg,
            "predicted_ms_per_token": predicted, "measured_ms_per_token": measured,
            "predicted_speedup": pred_speedup, "measured_speedup": meas_speedup,
            "measured_over_predicted": M.speedup(meas_speedup, pred_speedup) if pred_speedup else None}


ACCEPTANCE_TARGETS = (1.0, 1.5, 2.0)


def acceptance_needed(records: list, loads: dict, topology: str, t: float, conversational: list,
                      targets=ACCEPTANCE_TARGETS, k_max: int = 8) -> dict | None:
    """What per-token acceptance a draft needs on this topology to reach each target speed-up, from
    this run's own costs: c = champion alone's page ms per token (median, decode), its engine step
    V(1) (median), o = c - V(1) the per-round time outside the champion; V(n) for n = 2..k_max+1
    from the spec engine's calibration scaled to that V(1); d the draft ms per proposal of the
    draft arms (else the calibration's). Per target, the lowest a over k (iid acceptance, E[G(k)]
    = 1 + a + ... + a^k) and its k; None when no k reaches it even with every proposal accepted.
    Beside it, the acceptance the draft arms measured at T (pooled, and on the conversational strata)."""
    alone = [r for r in records if topology_of(r) == topology and r["arm"] == "none" and r["temperature"] == t]
    drafts = [r for r in records if topology_of(r) == topology and r["arm"].startswith("draft-k") and r["temperature"] == t]
    cal = (loads.get(f"{topology}-spec") or {}).get("calibration") or ((loads.get(f"{topology}-spec") or {}).get("info") or {}).get("calibration")
    if not alone or not isinstance(cal, dict) or not cal.get("verify_ms"):
        return None
    vcal = cal["verify_ms"]
    c1 = M.median(decode_ms_per_token(r) for r in alone)
    step = M.median(_step_ms(r) for r in alone)
    if c1 is None or step is None or not vcal[1]:
        return None
    rounds = [x for r in drafts for x in r["rounds"] if x[0] > 0]
    d = (sum(x[3] for x in rounds) / sum(x[0] for x in rounds)) if rounds else cal.get("draft_ms_per_proposal")
    if d is None:
        return None
    o = max(c1 - step, 0.0)
    verify = {n: step * vcal[n] / vcal[1] for n in range(2, min(k_max + 1, len(vcal) - 1) + 1) if vcal[n]}
    need = {}
    for target in targets:
        best = None
        for k in range(1, k_max + 1):
            if k + 1 not in verify:
                continue
            a = M.acceptance_for(target, k, c1, verify[k + 1], d, o)
            if a is not None and (best is None or a < best["a"]):
                best = {"a": a, "k": k}
        need[f"{target:g}"] = best
    conv = [x for r in drafts if r["stratum"] in conversational for x in r["rounds"] if x[0] > 0]
    a_all, n_all = M.acceptance_mle([(x[0], x[1]) for x in rounds])
    a_conv, n_conv = M.acceptance_mle([(x[0], x[1]) for x in conv])
    return {"topology": topology, "temperature": t, "c_alone_ms": c1, "step_ms": step, "overhead_ms": o,
            "draft_ms_per_proposal": d, "verify_ms": {str(n): v for n, v in verify.items()}, "needed": need,
            "measured": {"all": a_all, "all_trials": n_all, "conversational": a_conv, "conversational_trials": n_conv}}


def decomposition(records: list, loads: dict, backend: str, arm: str, t: float) -> dict | None:
    """Median ms per request by component (the waterfall): loads, prefill (both), draft,
    verify + correction (one device call decides the round), orchestrator bookkeeping
    (commit, rollback, emit), synchronisation (page <-> workers), from the engine's timers."""
    recs = [r for r in records if r["backend"] == backend and r["arm"] == arm and r["temperature"] == t]
    if not recs:
        return None
    topo = f"{backend}-{engine_role(recs[0])}"
    lt = (loads.get(topo) or {}).get("timing_ms", {})
    med = lambda f: M.median(f(r) for r in recs)
    tm = lambda key: (lambda r: r["timing_ms"].get(key, 0.0))
    return {"backend": backend, "arm": arm, "temperature": t,
            "load_runtime": (lt.get("pyodide", 0) + lt.get("install", 0)), "load_champion": lt.get("champion_load", 0),
            "load_draft": draft_load_ms(loads, backend) if engine_role(recs[0]) == "spec" else 0.0,
            "prefill": med(tm("prefill")), "draft": med(tm("draft")), "verify_and_correct": med(tm("verify")) + med(tm("accept")),
            "orchestrator": med(lambda r: r["timing_ms"]["total"] - sum(r["timing_ms"].get(k, 0) for k in ("prefill", "draft", "verify", "accept"))),
            "sync_and_output": med(lambda r: r["total_ms"] - r["timing_ms"]["total"]),
            "request_total": med(lambda r: r["total_ms"])}


def noise_and_power(records: list, rows: list, topology: str, threshold: float) -> dict | None:
    """How noisy the run's machine was, and what that means for a per-stratum gate at `threshold`:
    identical requests (champion alone, same prompt, T and answer, across repeats) give the
    machine's own spread; auto's per-request speed-ups within each (stratum, T) cell give the
    spread a cell's interval is built from. -> {identical_log_sd, identical_dof, auto_log_sd,
    auto_dof, requests_per_cell (median), needed_at_1x, needed_at_1_1x: the requests a cell whose
    true speed-up is 1.00x (1.10x) would need for its interval to clear the threshold}, or None
    without repeats."""
    same = {}
    for r in records:
        if topology_of(r) == topology and r["arm"] == "none" and r.get("token_ids") is not None:
            key = (r["prompt_id"], r["temperature"], tuple(r["token_ids"]))
            same.setdefault(key, []).append(M.ms_per_token(r["total_ms"], n_tokens(r)))
    cells = {}
    for r in rows:
        if r["topology"] == topology and r["arm"] == "auto":
            cells.setdefault((r["stratum"], r["temperature"]), []).append(r["ratio"])
    id_sd, id_dof = M.pooled_log_sd(same.values())
    auto_sd, auto_dof = M.pooled_log_sd(cells.values())
    if id_sd is None and auto_sd is None:
        return None
    return {"identical_log_sd": id_sd, "identical_dof": id_dof, "auto_log_sd": auto_sd, "auto_dof": auto_dof,
            "requests_per_cell": M.median(len(v) for v in cells.values()) if cells else None,
            "threshold": threshold, "needed_at_1x": M.requests_to_clear(auto_sd, threshold, 1.0),
            "needed_at_1_1x": M.requests_to_clear(auto_sd, threshold, 1.1)}


PHASES = ("models", "crossing", "choose", "commit", "emit", "pause")


def round_phases(records: list, topology: str, t: float, arms=("none", "none-spec", "auto")) -> dict:
    """Where a decode round's wall time goes, median over requests of each one's ms per round
    (timing_ms.phases, which the orchestrator records since the run after test-split run #5):
    models (the draft and the champion, their own timers), crossing (the rest of the session's
    call: the bridge and the record), choose (auto's policy and lookup's search, or the
    scheduler), commit, emit (text and the tokens event) and pause (yields to the worker's event
    loop). -> {arm: {phase: ms, "rounds": median rounds}} for the arms that recorded them; {}
    when none did (older runs)."""
    out = {}
    for arm in arms:
        per = []
        for r in records:
            ph = (r.get("timing_ms") or {}).get("phases")
            st = r.get("stats") or {}           # rounds: a chain of baseline steps is one event, its steps rounds
            n = ((st.get("rounds") or 0) + (st.get("baseline_steps") or 0)) or len(r.get("rounds") or ())
            if (topology_of(r) != topology or r["arm"] != arm or r["temperature"] != t or not ph or not n):
                continue
            models = r["timing_ms"].get("draft", 0.0) + r["timing_ms"].get("verify", 0.0)
            per.append({"models": models / n, "crossing": (ph["call"] - models) / n, "choose": ph["choose"] / n,
                        "commit": ph["commit"] / n, "emit": ph["emit"] / n, "pause": ph["pause"] / n, "rounds": n})
        if per:
            out[arm] = {k: M.median(x[k] for x in per) for k in PHASES + ("rounds",)}
    return out


def _kv_bytes(info_cfg: dict, context: int) -> int:
    return 2 * info_cfg["layers"] * info_cfg["kv_heads"] * info_cfg["head_dim"] * context * KV_BYTES


def engine_role(rec: dict) -> str:
    """"alone" or "spec": the engine the request ran on (the record's "engine" name, else its arm's)."""
    if rec.get("engine"):
        return rec["engine"].rsplit("-", 1)[-1]
    return "spec" if rec["arm"] == "auto" else arm_spec(rec["arm"])["engine"]


def resident_total(peak: dict | None):
    return sum(v for v in (peak or {}).values() if isinstance(v, (int, float))) if peak else None


def memory_report(records: list, loads: dict, backend: str, model_shapes: dict) -> dict | None:
    """Memory of champion alone vs champion + draft in the specification's categories: artifact
    bytes (files run), logical composition (artifacts + KV caches at the context limit),
    incremental (what the draft adds), physically deduplicated (nothing is shared between the
    two models, so equal to the logical sum), and peak resident (max over requests of the
    receipts' categories: champion memory, draft WASM memory, Pyodide heap)."""
    alone, spec = loads.get(f"{backend}-alone"), loads.get(f"{backend}-spec")
    if not alone or not spec or not (spec.get("info") or {}).get("champion"):
        return None
    ctx = spec["info"]["champion"]["max_context"]
    art_c = spec["info"]["champion"]["artifact_bytes"]
    art_d = (spec["info"].get("draft") or {}).get("artifact_bytes") or 0
    kv_counted = bool(model_shapes)
    if not kv_counted:         # shapes unknown (e.g. a pair whose configs the report was not given): no KV bytes
        model_shapes = {"champion": {"layers": 0, "kv_heads": 0, "head_dim": 0}, "draft": {"layers": 0, "kv_heads": 0, "head_dim": 0}}
    kv_c, kv_d = _kv_bytes(model_shapes["champion"], ctx), _kv_bytes(model_shapes["draft"], ctx)
    peak = lambda engine: max((resident_total(r.get("peak_resident_bytes")) or 0 for r in records
                               if r["backend"] == backend and r["arm"] != "wllama" and engine_role(r) == engine), default=None)
    p_alone, p_spec = peak("alone"), peak("spec")
    return {"backend": backend, "artifact_bytes": {"champion": art_c, "draft": art_d},
            "logical_bytes": {"alone": art_c + kv_c, "spec": art_c + kv_c + art_d + kv_d},
            "incremental_bytes": art_d + kv_d, "deduplicated_bytes": {"alone": art_c + kv_c, "spec": art_c + kv_c + art_d + kv_d},
            "peak_resident_bytes": {"alone": p_alone, "spec": p_spec},
            "peak_ratio": M.speedup(p_spec, p_alone) if p_alone else None, "kv_counted": kv_counted}


def greedy_mismatches(records: list) -> dict:
    """{(backend, stratum): mismatches} of every speculative arm at T = 0 against champion alone."""
    idx = index(records)
    out: dict = {}
    for r in records:
        if r["temperature"] != 0 or r["arm"] in ("none", "wllama"):
            continue
        base = idx.get((r["backend"], "none", r["prompt_id"], 0.0, r.get("rep", 0)))
        if base is None:
            continue
        key = (r["backend"], r["stratum"])
        out[key] = out.get(key, 0) + (r["token_ids"] != base["token_ids"])
    return out


def gate_metrics(rows: list, mism: dict, cost: dict, mem: dict, nmin: dict, p_value, backend: str, strata: list,
                 conversational: list) -> dict:
    """The metric values the gates name, for one champion backend (topology)."""
    mine = [r for r in rows if r["backend"] == backend]
    med = lambda arm, t, ss: M.median(r["speedup"] for r in mine if r["arm"] == arm and r["temperature"] == t and r["stratum"] in ss)
    per_stratum = {s: min((v for v in (med("draft-adaptive", t, [s]) for t in (0.0, 1.0)) if v is not None), default=None)
                   for s in strata}
    best_fixed = lambda t: max((v for v in (med(f"draft-k{k}", t, conversational) for k in DRAFT_KS) if v is not None), default=None)
    keep = [M.speedup(med("draft-adaptive", t, conversational), best_fixed(t)) for t in (0.0, 1.0)]
    costs = [c["measured_over_predicted"] for c in cost.values() if c and c["backend"] == backend and c["measured_over_predicted"]]
    return {"greedy_mismatches": sum(v for (b, _), v in mism.items() if b == backend) if mism else None,
            "distribution_p_value": p_value if backend == "wasm" else None,
            "conversational_t1_median_speedup": med("draft-adaptive", 1.0, conversational),
            "min_stratum_speedup_adaptive": {s: v for s, v in per_stratum.items() if v is not None} or None,
            "conversational_adaptive_over_best_fixed": min((k for k in keep if k is not None), default=None),
            "measured_over_predicted": min(costs) if costs else None,
            "peak_memory_ratio": (mem.get(backend) or {}).get("peak_ratio"),
            "n_min_tokens": nmin.get(backend)}


def conclusion(verdicts: list, per_stratum_speedup: dict) -> str:
    """adopt / keep off / adopt only for some strata, in the specification's terms: speculation is
    adopted only where it preserves the champion (greedy identity, distribution) and wins the
    whole cost function (every gate)."""
    by = {v["id"]: v["passed"] for v in verdicts}
    if by.get("greedy_identity") is False or by.get("distribution") is False:
        return "keep off: it does not preserve the champion"
    if all(p is not False for p in by.values()):
        return "adopt"
    winners = sorted(s for s, v in per_stratum_speedup.items() if v is not None and v >= 1.0)
    if winners and by.get("peak_memory") is not False:
        return "adopt only for some strata: " + ", ".join(winners) + " (with the adaptive scheduler)"
    return "keep off: it does not win the whole cost function"


def draft_load_ms(loads: dict, backend: str) -> float:
    """The spec engine's draft load: ready.timing_ms.draft_load when the engine waited for it, else the
    background draft's own load (draft_load_ms, from its start to its arrival after ready): a draft
    loaded in the background is still the draft's fixed cost in break-even and the waterfall."""
    spec = loads.get(f"{backend}-spec") or {}
    return (spec.get("timing_ms") or {}).get("draft_load") or spec.get("draft_load_ms") or 0.0


def break_even(records: list, loads: dict, backend: str, arm: str, strata: list) -> dict | None:
    """Cold: the draft's fixed cost F = L_d + P_d(S) (its load, and the prefill the spec arm
    spends beyond champion alone) against the per-token gain, N_min = F / (C_t(1) - C_spec);
    and T_spec(N) / T_baseline(N) for N = 1..1024 (baseline fixed cost: L_t + P_t(S))."""
    spec = (loads.get(f"{backend}-spec") or {}).get("timing_ms")
    if spec is not None:
        spec = {**spec, "draft_load": draft_load_ms(loads, backend)}
    alone_load = (loads.get(f"{backend}-alone") or {}).get("load_ms")
    pick = lambda a: [r for r in records if r["backend"] == backend and r["arm"] == a and r["stratum"] in strata]
    base, sp = pick("none"), pick(arm)
    if not spec or alone_load is None or not base or not sp:
        return None
    p_t = M.median(r["timing_ms"]["prefill"] for r in base)
    p_d = max(M.median(r["timing_ms"]["prefill"] for r in sp) - p_t, 0.0)
    fixed = spec.get("draft_load", 0.0) + p_d
    c1 = M.median(decode_ms_per_token(r) for r in base)
    cs = M.median(decode_ms_per_token(r) for r in sp)
    if c1 is None or cs is None:
        return None
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    return {"backend": backend, "arm": arm, "strata": strata, "draft_load_ms": spec.get("draft_load", 0.0),
            "draft_prefill_ms": p_d, "fixed_ms": fixed, "c_alone_ms": c1, "c_spec_ms": cs,
            "n_min": M.n_min(fixed, c1, cs), "curve_n": ns,
            "curve_ratio": [M.latency_ratio(n, alone_load + p_t + fixed, cs, alone_load + p_t, c1) for n in ns]}


def cold_warm(run_info: dict, records: list, backend: str) -> dict | None:
    """T_baseline and T_spec from cold (engine load + its first request) and warm (the same
    request later in the run, same arm as the cold one), for the first prompt at T = 0."""
    cold, loads = run_info.get("cold", {}), run_info.get("loads", {})
    a, s = cold.get(f"{backend}-alone"), cold.get(f"{backend}-spec")
    if not a or not s:
        return None
    idx = index(records)
    wa, ws = idx.get((backend, "none", a["prompt_id"], 0.0, 0)), idx.get((backend, s.get("arm", "draft-adaptive"), s["prompt_id"], 0.0, 0))
    out = {"prompt_id": a["prompt_id"],
           "cold_baseline_ms": loads[f"{backend}-alone"]["load_ms"] + a["total_ms"],
           "cold_spec_ms": loads[f"{backend}-spec"]["load_ms"] + s["total_ms"],
           "warm_baseline_ms": wa["total_ms"] if wa else None, "warm_spec_ms": ws["total_ms"] if ws else None}
    out["cold_speedup"] = M.speedup(out["cold_baseline_ms"], out["cold_spec_ms"])
    out["warm_speedup"] = M.speedup(out["warm_baseline_ms"], out["warm_spec_ms"])
    return out


# ---- evaluation v2 (gates_v2.json): per-token speed-ups with bootstrap intervals, per topology ----
FIXED_ARMS = ("none",) + tuple(f"draft-k{k}" for k in DRAFT_KS) + ("lookup-k4",)
MIN_SAMPLES = 20          # a conditional distribution test needs this many samples in each arm
POSITIONS = 4


def topology_of(rec: dict) -> str:
    """The record's topology ("<pair>-<backend>"); a v1 record has only its backend."""
    return rec.get("topology") or rec["backend"]


def n_tokens(rec: dict):
    return rec.get("n_tokens") if rec.get("n_tokens") is not None else len(rec.get("token_ids") or [])


def engine_pair(rec: dict) -> int:
    """Which of the topology's engine pairs served the request (the runner's --engine-pairs, gates
    v3: repeat r on pair r mod E; the arm and champion alone it is compared with share the repeat,
    so the pair); 0 for a run with one pair (every v2 run)."""
    return rec.get("engine_pair", 0)


def per_token_rows(records: list) -> list:
    """Each request of an arm against champion alone (same topology, prompt, T, repeat), per
    generated token: ratio = alone's page ms per token / the arm's (> 1: the arm is faster)."""
    idx = {(topology_of(r), r["arm"], r["prompt_id"], r["temperature"], r.get("rep", 0)): r for r in records}
    out = []
    for r in records:
        if r["arm"] == "none":
            continue
        t = topology_of(r)
        base = idx.get((_wllama_base(t), "none", r["prompt_id"], r["temperature"], r.get("rep", 0)))
        if base is None:
            continue
        mb, ma = M.ms_per_token(base["total_ms"], n_tokens(base)), M.ms_per_token(r["total_ms"], n_tokens(r))
        ratio = M.speedup(mb, ma)
        if ratio is None:
            continue
        out.append({"topology": t, "arm": r["arm"], "prompt_id": r["prompt_id"], "stratum": r["stratum"],
                    "temperature": r["temperature"], "rep": r.get("rep", 0), "pair": engine_pair(r), "ratio": ratio,
                    "base_ms_per_token": mb, "arm_ms_per_token": ma})
    return out


def cell_name(stratum: str, t: float) -> str:
    return f"{stratum} T={t:g}"


MIN_CI_REQUESTS = 2       # one request has no spread to resample: no interval, so a CI gate is inconclusive there


def _stat(groups: list, pairs: list | None = None) -> dict:
    """{"value": geometric mean of the pooled values, "ci", "n": count, "pairs": engine pairs}.
    groups: lists of values (strata); pairs: the same shape, each value's engine pair (None: one
    pair). ci: the stratified bootstrap of the requests when they come from one engine pair (every
    v2 run), else the cluster bootstrap (gates v3: engine pairs, then requests within their strata;
    metrics.cluster_bootstrap_ci); None with fewer than MIN_CI_REQUESTS values."""
    flat = [v for g in groups for v in g]
    labels = sorted({x for g in (pairs or []) for x in g})
    if len(labels) > 1:
        clusters = [[[v for v, x in zip(g, pg) if x == label] for g, pg in zip(groups, pairs)] for label in labels]
        ci = M.cluster_bootstrap_ci(clusters)
    else:
        ci = M.bootstrap_ci(groups)
    return {"value": M.geo_mean(flat), "ci": ci if len(flat) >= MIN_CI_REQUESTS else None, "n": len(flat),
            "pairs": max(len(labels), 1)}


def _ratio_stat(groups_of_rows: list, value=lambda r: r["ratio"]) -> dict:
    """_stat of value(row) over groups (strata) of rows, clustered by the rows' engine pairs."""
    return _stat([[value(r) for r in g] for g in groups_of_rows], [[r["pair"] for r in g] for g in groups_of_rows])


def _paired_stat(auto: dict, other: dict) -> dict:
    """_stat of auto's ratio over the other arm's, paired by key ((prompt, repeat)), clustered by
    auto's engine pairs (the paired request shares its pair). auto: key -> row; other: key -> ratio."""
    both = [k for k in sorted(auto) if k in other]
    return _stat([[auto[k]["ratio"] / other[k] for k in both]], [[auto[k]["pair"] for k in both]])


def _rows(rows, topology, arm, t=None, strata=None):
    return [r for r in rows if r["topology"] == topology and r["arm"] == arm and (t is None or r["temperature"] == t)
            and (strata is None or r["stratum"] in strata)]


def auto_speedup_cells(rows: list, topology: str, strata: list, temps: list) -> dict:
    """{"<stratum> T=<t>": {value, ci, n}}: auto's per-token speed-up over champion alone; every
    planned cell appears (value None: no data)."""
    return {cell_name(s, t): _ratio_stat([_rows(rows, topology, "auto", t, [s])]) for s in strata for t in temps}


def auto_over_best_fixed_cells(rows: list, topology: str, strata: list, temps: list) -> dict:
    """{"<stratum> T=<t>": {value, ci, n, best}}: auto against the best fixed arm of the cell (the
    highest point speed-up among champion alone, draft-k*, lookup-k4), paired by (prompt, repeat)."""
    out = {}
    for s in strata:
        for t in temps:
            auto = {(r["prompt_id"], r["rep"]): r for r in _rows(rows, topology, "auto", t, [s])}
            cands = {"none": {k: 1.0 for k in auto}}
            for arm in FIXED_ARMS[1:]:
                got = {(r["prompt_id"], r["rep"]): r["ratio"] for r in _rows(rows, topology, arm, t, [s])}
                if got:
                    cands[arm] = got
            best = max(sorted(cands), key=lambda a: M.geo_mean(cands[a].values()) or 0.0) if auto else None
            out[cell_name(s, t)] = {**_paired_stat(auto, cands[best] if best else {}), "best": best}
    return out


def conversational_auto(rows: list, topology: str, conversational: list, t: float = 1.0) -> dict:
    """auto's per-token speed-up at T = t on the conversational strata pooled (stratified bootstrap)."""
    return _ratio_stat([_rows(rows, topology, "auto", t, [s]) for s in conversational])


def engine_load_ms(loads: dict, topology: str, role: str, pair: int = 0):
    """The page-clock load of the topology's engine, role "alone" or "spec", of engine pair `pair`
    (None when not recorded)."""
    got = loads.get(engine_name(topology, role, pair))
    return got.get("load_ms") if got else None


def loads_at_median(loads: dict) -> dict:
    """`loads` with each engine's load_ms the median of its timed load and its further loads
    (load_ms_repeats; the runner's --load-repeats), the rest as it was: the report's check of how much
    end_to_end_with_loads rests on one noisy load. An engine without further loads keeps its own."""
    out = {}
    for name, v in loads.items():
        again = [x for x in v.get("load_ms_repeats") or [] if x is not None]
        out[name] = {**v, "load_ms": M.median([v["load_ms"], *again])} if again and v.get("load_ms") is not None else v
    return out


def end_to_end_with_loads(rows: list, loads: dict, topology: str, conversational: list, tokens: int,
                          t: float = 1.0) -> dict:
    """The adoption condition with loads: per conversational request at T = t, (L_alone + N c_alone)
    / (L_spec + N c_auto), N = tokens; geometric mean. L is the page-clock load to ready of the
    engines that served the request (its engine pair's: with several pairs, gates v3, each pair's
    own loads, and the cluster bootstrap resamples pairs with their loads; with one, v2, the loads
    are held fixed and the requests resampled). A draft loaded in the background (after ready,
    while the engine is idle) is not in L_spec; `value_draft_in_the_way` is the same ratio (point
    value) with L_spec up to the end of the draft's load and calibration instead, as for a session
    whose first request had to wait for all of it (None when the draft was not loaded in the
    background). load_alone_ms / load_spec_ms: the first pair's."""
    def of_pair(j):
        spec = loads.get(engine_name(topology, "spec", j)) or {}
        return (engine_load_ms(loads, topology, "alone", j), engine_load_ms(loads, topology, "spec", j),
                spec.get("draft_calibrated_ms") or spec.get("draft_ready_ms"))
    la, ls, full = of_pair(0)
    extra = {"load_alone_ms": la, "load_spec_ms": ls, "tokens": tokens, "draft_in_background_to_ms": full}
    by_stratum = [_rows(rows, topology, "auto", t, [s]) for s in conversational]
    loads_of = {j: of_pair(j) for j in {r["pair"] for g in by_stratum for r in g}}
    if la is None or ls is None or any(a is None or b is None for a, b, _ in loads_of.values()):
        return {"value": None, "ci": None, "n": 0, **extra, "value_draft_in_the_way": None}
    gain = lambda r, spec_ms: ((loads_of[r["pair"]][0] + tokens * r["base_ms_per_token"])
                               / (spec_ms + tokens * r["arm_ms_per_token"]))
    mine = [r for g in by_stratum for r in g]
    in_way = (M.geo_mean([gain(r, loads_of[r["pair"]][2]) for r in mine])
              if mine and all(f is not None for _, _, f in loads_of.values()) else None)
    return {**_ratio_stat(by_stratum, lambda r: gain(r, loads_of[r["pair"]][1])), **extra, "value_draft_in_the_way": in_way}


def greedy_mismatches_v2(records: list, topology: str):
    """Speculative arms' T = 0 answers that differ from champion alone's in the topology (None: nothing compared)."""
    idx = {(topology_of(r), r["arm"], r["prompt_id"], r["temperature"], r.get("rep", 0)): r for r in records}
    compared = mism = 0
    for r in records:
        if topology_of(r) != topology or r["arm"] in ("none", "wllama") or r["temperature"] != 0:
            continue
        base = idx.get((topology, "none", r["prompt_id"], 0.0, r.get("rep", 0)))
        if base is not None:
            compared += 1
            mism += r["token_ids"] != base["token_ids"]
    return mism if compared else None


def distribution_tests(samples: list, topology: str, positions: int = POSITIONS, min_samples: int = MIN_SAMPLES) -> dict:
    """The stronger distribution gate: per (prompt, position 1..positions, arm in auto / draft-k4) a
    chi-square homogeneity test against champion alone on the samples that share the most common
    prefix before the position; Bonferroni over the tests run. {"tests": [...], "m", "min_adjusted_p"}."""
    by: dict = {}
    for s in samples:
        if topology_of(s) == topology:
            by.setdefault((s["prompt_id"], s["arm"]), []).append((s.get("seed", 0), list(s["token_ids"])))
    tests = []
    for pid in sorted({p for p, _ in by}):
        base = [ids for _, ids in sorted(by.get((pid, "none"), []))]
        for arm in ("auto", "draft-k4"):
            other = [ids for _, ids in sorted(by.get((pid, arm), []))]
            if not base or not other:
                continue
            for j in range(1, positions + 1):
                prefix, a, b = M.conditional_position_samples(base, other, j)
                if len(a) < min_samples or len(b) < min_samples:
                    continue
                tests.append({"prompt_id": pid, "arm": arm, "position": j, "prefix": prefix, "n_none": len(a),
                              "n_arm": len(b), "p": M.homogeneity_p_value(a, b)})
    adj = M.bonferroni([x["p"] for x in tests])
    for x, p in zip(tests, adj):
        x["p_adjusted"] = p
    return {"tests": tests, "m": len(tests), "min_adjusted_p": min(adj) if adj else None}


def conclusion_v2(verdicts: list) -> str:
    """The topology's reading from its gate verdicts (anything but pass counts as not passing)."""
    by = {v["id"]: v["verdict"] for v in verdicts}
    for gate in ("greedy_identity", "distribution"):
        if gate in by and by[gate] != "pass":
            return f"keep speculation off: {gate} {by[gate]} (the champion is not shown to be preserved)"
    not_passed = [f"{g} ({v})" for g, v in by.items() if v != "pass"]
    if not not_passed:
        return "auto passes every gate: keep it the default"
    return "auto does not pass every gate: " + ", ".join(not_passed)


CONTROL_ARM = "none-spec"   # champion alone on the champion + draft engine: what the engines alone make of auto vs none


def auto_over_control_cells(rows: list, topology: str, strata: list, temps: list, control: str = CONTROL_ARM) -> dict:
    """{"<stratum> T=<t>": {value, ci, n}}: auto's per-token speed-up over the control arm (champion
    alone on the same engine as auto), paired by (prompt, repeat); value None where the topology
    has no control. Information beside the gates (which compare with the user's alternative: the
    champion-alone engine)."""
    out = {}
    for s in strata:
        for t in temps:
            auto = {(r["prompt_id"], r["rep"]): r for r in _rows(rows, topology, "auto", t, [s])}
            ctrl = {(r["prompt_id"], r["rep"]): r["ratio"] for r in _rows(rows, topology, control, t, [s])}
            out[cell_name(s, t)] = _paired_stat(auto, ctrl)
    return out


ENGINE_GAP = 0.02     # |log| of champion alone's two engines' ratio above which the report says the gate reads them too


def engine_difference(arm_rows: list, control_cells: dict, topology: str, control: str = CONTROL_ARM) -> dict | None:
    """What the two engines alone differ by, beside the never-slower gate (information, not a gate):
    {"control_over_alone": {T: {value, ci}}: champion alone on auto's engine (the control arm) over
    champion alone's engine per generated token, from the report's arm rows; "auto_over_control":
    [lowest, highest] of auto's cells against its own engine; "gap": whether some T's control ratio
    is beyond ENGINE_GAP, when a never-slower cell measures the engines as much as auto}. None where
    the topology has no control arm."""
    by_t = {r["temperature"]: {"value": r["speedup_per_token"], "ci": r["ci"]} for r in arm_rows
            if r["topology"] == topology and r["arm"] == control and r["speedup_per_token"]}
    if not by_t:
        return None
    values = [c["value"] for c in control_cells.values() if c.get("value")]
    return {"control_over_alone": by_t,
            "auto_over_control": [min(values), max(values)] if values else None,
            "gap": any(abs(math.log(c["value"])) > ENGINE_GAP for c in by_t.values())}

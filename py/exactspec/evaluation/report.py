"""A run's results.json, report.md and plots (I/O around the pure analysis), and the section of
docs/evaluation.md that names the latest full run."""
from __future__ import annotations

import json
import math
import os

from ..reference.models import default_models_dir
from ..host.safe_files import write_file
from . import analysis as A
from . import metrics as M
from .corpus import load_corpus
from .gates import check_same_gates, evaluate, load_gates
from .runner import CORPUS_DIR, GATES_PATH, LOCK_PATH, Checkpoints

ENTROPY_EDGES = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 9.0]


def _model_shapes(models_dir: str) -> dict:
    out = {}
    for role in ("champion", "draft"):
        with open(os.path.join(models_dir, role, "config.json")) as f:
            c = json.load(f)
        out[role] = {"layers": c["num_hidden_layers"], "kv_heads": c["num_key_value_heads"],
                     "head_dim": c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]}
    return out


def identities(records: list, run_info: dict) -> dict:
    """What every arm bound: the distinct values of each receipt identity per arm, and whether all
    our arms ran the same prompt ids for every prompt."""
    per_arm: dict = {}
    ids_by_prompt: dict = {}
    for r in records:
        if r["backend"] == "wllama":
            continue
        arm = per_arm.setdefault(f"{r['backend']}:{r['arm']}", {})
        for k, v in r["identity"].items():
            arm.setdefault(k, set()).add(v)
        ids_by_prompt.setdefault(r["prompt_id"], set()).add(r["prompt_ids_sha256"])
    return {"per_arm": {a: {k: sorted(map(str, v)) for k, v in d.items()} for a, d in per_arm.items()},
            "same_prompt_ids_everywhere": all(len(v) == 1 for v in ids_by_prompt.values()),
            "browser": run_info.get("machine", {}).get("chromium"), "commit": run_info.get("machine", {}).get("commit")}


def summarise(run_dir: str, with_entropy: bool = True) -> dict:
    """Everything the report, the plots and the gates need, from build/eval/<run>/."""
    with open(os.path.join(run_dir, "run.json")) as f:
        run_info = json.load(f)
    gates_doc, g_hash = load_gates(GATES_PATH)
    check_same_gates(run_info["plan"]["gates_sha256"], g_hash)
    everything = Checkpoints(run_dir).load_all()
    records = [r for r in everything if r.get("kind") == "request"]
    failures = [r for r in everything if r.get("kind") == "failure"]
    prompts, _ = load_corpus(CORPUS_DIR, LOCK_PATH)
    by_id = {p["id"]: p for p in prompts}
    strata = sorted({r["stratum"] for r in records})
    conv = [s for s in gates_doc["conversational_strata"] if s in strata] or strata
    backends = [b for b in ("wasm", "webgpu") if any(r["backend"] == b for r in records)]
    temps = sorted({r["temperature"] for r in records})
    loads = run_info.get("loads", {})

    rows = A.per_request_speedups(records)
    surv = A.survival_table(records)
    cost = {f"{b}:T={t:g}": A.cost_model(records, surv, b, t) for b in backends for t in temps}
    mem = {b: A.memory_report(records, loads, b, _model_shapes(default_models_dir())) for b in backends}
    be = {b: A.break_even(records, loads, b, "draft-adaptive", conv) for b in backends}
    nmin = {b: (be[b]["n_min"] if be[b] else None) for b in backends}
    mism = A.greedy_mismatches(records)
    dist = run_info.get("distribution")
    p_value = M.homogeneity_p_value(dist["none"], dist["draft-adaptive"]) if dist else None
    fit = {}
    if dist and with_entropy:   # each arm against the champion's exact first-token distribution (reference)
        from .entropy import champion_first_token_probs
        q = champion_first_token_probs(by_id[dist["prompt_id"]], default_models_dir())
        fit = {arm: M.goodness_of_fit_p_value(dist[arm], q) for arm in ("none", "draft-adaptive")}

    arm_rows = []
    for (b, arm, t), v in sorted(A.group_median(rows, ("backend", "arm", "temperature"), "speedup").items(), key=str):
        recs = [r for r in records if r["backend"] == b and r["arm"] == arm and r["temperature"] == t]
        arm_rows.append({"backend": b, "arm": arm, "temperature": t, "requests": len(recs), "median_speedup": v,
                         "median_decode_speedup": M.median(x["decode_speedup"] for x in rows if (x["backend"], x["arm"], x["temperature"]) == (b, arm, t)),
                         "median_ms_per_token": M.median(A.decode_ms_per_token(r) for r in recs),
                         "median_request_ms": M.median(r["total_ms"] for r in recs),
                         "tokens_per_round": A.tokens_per_round(recs)})
    for b, t in [(b, t) for b in backends for t in temps]:
        recs = [r for r in records if r["backend"] == b and r["arm"] == "none" and r["temperature"] == t]
        arm_rows.append({"backend": b, "arm": "none", "temperature": t, "requests": len(recs), "median_speedup": 1.0,
                         "median_decode_speedup": 1.0, "median_ms_per_token": M.median(A.decode_ms_per_token(r) for r in recs),
                         "median_request_ms": M.median(r["total_ms"] for r in recs), "tokens_per_round": 1.0})
    stratum_rows = {f"{b}:{arm}:T={t:g}:{s}": v for (b, arm, t, s), v in
                    A.group_median(rows, ("backend", "arm", "temperature", "stratum"), "speedup").items()}

    verdicts, conclusions = {}, {}
    for b in backends:
        gm = A.gate_metrics(rows, mism, {k: c for k, c in cost.items() if k.startswith(b + ":")}, mem, nmin, p_value,
                            b, strata, conv)
        verdicts[b] = {"metrics": gm, "verdicts": evaluate(gates_doc, gm)}
        conclusions[b] = A.conclusion(verdicts[b]["verdicts"], gm["min_stratum_speedup_adaptive"] or {})

    res = {"run": run_info["run"], "plan": run_info["plan"], "machine": run_info.get("machine"),
           "wall_s": run_info.get("wall_s"), "gates_version": gates_doc["version"], "gates_sha256": g_hash,
           "identities": identities(records, run_info), "loads": {k: {"load_ms": v["load_ms"], "timing_ms": v.get("timing_ms")} for k, v in loads.items()},
           "cold_warm": {b: A.cold_warm(run_info, records, b) for b in backends},
           "arms": arm_rows, "strata_speedup": stratum_rows,
           "survival": [{"backend": b, "stratum": s, "temperature": t, **v} for (b, s, t), v in sorted(surv.items(), key=str)],
           "expected_vs_measured": A.expected_vs_measured(records, surv), "cost_model": cost,
           "break_even": [be[b] for b in backends], "memory": mem,
           "memory_timeline": run_info.get("memory_timeline", []),
           "greedy_mismatches": {f"{b}:{s}": v for (b, s), v in mism.items()},
           "wllama": {"failures": [{k: f[k] for k in ("prompt_id", "temperature", "error")} for f in failures],
                      "greedy_same_as_ours": _wllama_agreement(records)},
           "distribution": {"p_value": p_value, "fit_to_champion_p": fit, **(dist or {})},
           "waterfall": [A.decomposition(records, loads, b, arm, t) for b in backends for arm in ("none", "draft-k4", "draft-adaptive", "lookup-adaptive") for t in temps],
           "gates": verdicts, "conclusions": conclusions}
    res["topologies"] = _topologies(records, res)
    res["pareto"] = _pareto(res["topologies"])
    res["heatmap"] = _heatmap(rows, records, strata)
    res["ecdf"] = {f"{b}:{arm}": M.ecdf(r["speedup"] for r in rows if r["backend"] == b and r["arm"] == arm)
                   for b, arm in [("wasm", "draft-adaptive"), ("wasm", "draft-k4"), ("wasm", "lookup-adaptive"),
                                  ("webgpu", "draft-adaptive"), ("wllama", "wllama")]
                   if any(r["backend"] == b and r["arm"] == arm for r in rows)}
    ent = {"pairs": [], "prompts": 0, "skipped": []}
    if with_entropy:
        ent = __import__("exactspec.evaluation.entropy", fromlist=["x"]).draft_entropy_pairs(records, by_id, default_models_dir())
    res["entropy"] = {"prompts": ent["prompts"], "skipped": ent["skipped"], "pairs": len(ent["pairs"]),
                      "bins": [{"lo": lo, "hi": hi, "n": n, "rate": rate} for lo, hi, n, rate in
                               M.acceptance_by_bin([(h, a) for h, a, _ in ent["pairs"]], ENTROPY_EDGES)]}
    return res


def _wllama_agreement(records: list) -> list:
    """[same, compared]: wllama's greedy ids against our WASM champion alone's (T = 0)."""
    idx = A.index(records)
    pairs = [(r, idx.get(("wasm", "none", r["prompt_id"], 0.0, r.get("rep", 0)))) for r in records
             if r["backend"] == "wllama" and r["temperature"] == 0 and r.get("token_ids")]
    pairs = [(r, b) for r, b in pairs if b]
    return [sum(r["token_ids"] == b["token_ids"] for r, b in pairs), len(pairs)]


def _topologies(records: list, res: dict) -> list:
    out = []
    names = {"none": "champion alone", "draft-adaptive": "champion + draft (adaptive)", "lookup-adaptive": "champion + lookup (adaptive)"}
    for b, mem in res["memory"].items():
        if not mem:
            continue
        for arm, label in names.items():
            recs = [r for r in records if r["backend"] == b and r["arm"] == arm]
            if recs:
                peak = mem["peak_resident_bytes"]["spec" if arm == "draft-adaptive" else "alone"]
                out.append({"name": f"{b}: {label}", "peak_bytes": peak, "median_latency_ms": M.median(r["total_ms"] for r in recs)})
    return out


def _pareto(tops: list) -> dict:
    pts = [t for t in tops if t["peak_bytes"] and t["median_latency_ms"]]
    front = set(M.pareto_front([(t["median_latency_ms"], t["peak_bytes"]) for t in pts]))
    return {"points": [{"name": t["name"], "latency_ms": t["median_latency_ms"], "peak_bytes": t["peak_bytes"], "front": i in front}
                       for i, t in enumerate(pts)],
            "energy": "not measured: browsers expose no energy counter; no proxy is reported"}


def _heatmap(rows: list, records: list, strata: list) -> dict:
    methods = ["draft-k1", "draft-k2", "draft-k4", "draft-k8", "draft-adaptive", "lookup-k4", "lookup-adaptive"]
    speed = [[M.median(r["speedup"] for r in rows if r["backend"] == "wasm" and r["arm"] == m and r["stratum"] == s)
              for s in strata] for m in methods]
    idx = A.index(records)
    quality = []
    for m in methods:
        row = []
        for s in strata:
            pairs = [(r, idx.get(("wasm", "none", r["prompt_id"], 0.0, r.get("rep", 0)))) for r in records
                     if r["backend"] == "wasm" and r["arm"] == m and r["stratum"] == s and r["temperature"] == 0]
            pairs = [(r, b) for r, b in pairs if b]
            row.append(sum(r["token_ids"] == b["token_ids"] for r, b in pairs) / len(pairs) if pairs else None)
        quality.append(row)
    return {"methods": methods, "strata": strata, "speed": speed, "quality": quality}


# ---- Markdown ----
def _f(v, fmt=".2f"):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "never"
    return format(v, fmt)


def report_markdown(res: dict, plots_rel: str = "plots") -> str:
    m = res.get("machine") or {}
    L = [f"# Evaluation run `{res['run']}`", "",
         f"Commit `{m.get('commit')}`, Chromium {m.get('chromium')}, {m.get('cpus')} CPUs, load average "
         f"{m.get('load_1_5_15')} at start; wall time {res.get('wall_s')} s. Gates v{res['gates_version']} "
         f"(sha256 `{res['gates_sha256'][:12]}`), corpus sha256 `{res['plan']['corpus_sha256'][:12]}`; "
         f"{len(res['plan']['prompts'])} prompts, T in {res['plan']['temperatures']}; WebGPU (SwiftShader, ~15-20x slower "
         f"than the WASM champion) on a subset only: arms {res['plan']['arms'].get('webgpu', [])}, prompts "
         f"{res['plan']['webgpu_prompts'] if 'webgpu' in res['plan']['arms'] else []}.", ""]
    L += ["## Conclusion per topology", ""]
    for b, c in res["conclusions"].items():
        L.append(f"- **{b}** (browser-only): {c}")
    L += ["", "## Gates", "", "| topology | gate | value | op | threshold | result |", "|---|---|---|---|---|---|"]
    for b, g in res["gates"].items():
        for v in g["verdicts"]:
            verdict = {True: "pass", False: "**fail**", None: "n/a"}[v["passed"]]
            L.append(f"| {b} | {v['id']} | {_f(v['value'], '.3g') if isinstance(v['value'], (int, float)) else '-'} | {v['op']} | {v['threshold']} | {verdict} |")
    L += ["", "Per stratum (adaptive draft arm, worst of T = 0 and T = 1, gate no_stratum_below 0.95x):", "",
          "| topology | stratum | median speed-up | result |", "|---|---|---|---|"]
    for b, g in res["gates"].items():
        for v in g["verdicts"]:
            for s, (val, ok) in (v.get("per_stratum") or {}).items():
                L.append(f"| {b} | {s} | {_f(val)}x | {'pass' if ok else '**fail**'} |")
    L += ["", "## Arms (medians over prompts)", "",
          "| backend | arm | T | n | speed-up (end to end) | decode speed-up | ms/token | request ms | tokens/round |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(res["arms"], key=lambda r: (r["backend"], r["temperature"], r["arm"])):
        L.append(f"| {r['backend']} | {r['arm']} | {r['temperature']:g} | {r['requests']} | {_f(r['median_speedup'])}x | "
                 f"{_f(r['median_decode_speedup'])}x | {_f(r['median_ms_per_token'])} | {_f(r['median_request_ms'], '.0f')} | {_f(r['tokens_per_round'])} |")
    L += ["", "## Cold and warm (first prompt, T = 0: champion alone vs draft adaptive)", "",
          "| backend | cold T_baseline ms | cold T_spec ms | cold speed-up | warm T_baseline ms | warm T_spec ms | warm speed-up |",
          "|---|---|---|---|---|---|---|"]
    for b, c in res["cold_warm"].items():
        if c:
            L.append(f"| {b} | {c['cold_baseline_ms']:.0f} | {c['cold_spec_ms']:.0f} | {_f(c['cold_speedup'])}x | "
                     f"{_f(c['warm_baseline_ms'], '.0f')} | {_f(c['warm_spec_ms'], '.0f')} | {_f(c['warm_speedup'])}x |")
    L += ["", "Loads (page clock, ms): " + ", ".join(f"{k} {v['load_ms']:.0f}" for k, v in res["loads"].items()), ""]
    L += ["## Cost model (draft k = 4, all strata pooled)", "",
          "| backend, T | C_t(1) ms/token | d ms/proposal | V ms/round | overhead ms | E[G(4)] | predicted ms/token | measured | predicted speed-up | measured | ratio |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, c in res["cost_model"].items():
        if c:
            L.append(f"| {k} | {c['c_alone_ms']:.2f} | {c['draft_ms_per_proposal']:.2f} | {c['verify_ms_per_round']:.2f} | "
                     f"{c['overhead_ms']:.2f} | {c['expected_tokens']:.2f} | {c['predicted_ms_per_token']:.2f} | {_f(c['measured_ms_per_token'])} | "
                     f"{_f(c['predicted_speedup'])}x | {_f(c['measured_speedup'])}x | {_f(c['measured_over_predicted'])} |")
    L += ["", "## Break-even (cold, conversational strata, adaptive draft)", ""]
    for b in res["break_even"]:
        if b:
            L.append(f"- {b['backend']}: F = L_d {b['draft_load_ms']:.0f} ms + P_d {b['draft_prefill_ms']:.1f} ms; C_t(1) "
                     f"{b['c_alone_ms']:.2f} ms/token, C_spec {b['c_spec_ms']:.2f} ms/token; **N_min = {_f(b['n_min'], '.0f')}** tokens.")
    L += ["", "## Survival S_i and E[G(k)] (draft k = 8 arm; predicted vs measured tokens per round)", "",
          "| backend | stratum | T | S_1..S_8 |", "|---|---|---|---|"]
    for s in res["survival"]:
        L.append(f"| {s['backend']} | {s['stratum']} | {s['temperature']:g} | {' '.join(_f(x) for x in s['S'])} |")
    L += ["", "| backend | T | k | E[G(k)] predicted | measured tokens/round |", "|---|---|---|---|---|"]
    for e in res["expected_vs_measured"]:
        if e["stratum"] == "all":
            L.append(f"| {e['backend']} | {e['temperature']:g} | {e['k']} | {_f(e['predicted'])} | {_f(e['measured'])} |")
    L += ["", "## Memory (specification's categories, bytes)", ""]
    for b, mm in res["memory"].items():
        if mm:
            L.append(f"- {b}: artifacts champion {mm['artifact_bytes']['champion']:,} + draft {mm['artifact_bytes']['draft']:,}; "
                     f"logical composition alone {mm['logical_bytes']['alone']:,}, with draft {mm['logical_bytes']['spec']:,} "
                     f"(artifacts + KV at the context limit); incremental {mm['incremental_bytes']:,}; physically deduplicated = "
                     f"logical (the two models share no bytes); peak resident alone {_f(mm['peak_resident_bytes']['alone'], ',')}, "
                     f"with draft {_f(mm['peak_resident_bytes']['spec'], ',')} (ratio {_f(mm['peak_ratio'])}).")
    L += [f"- Timeline: {len(res['memory_timeline'])} samples of engine.memory() (loads, cold requests, every 25th request) in results.json.", ""]
    L += ["## Quality", "", "Greedy mismatches against champion alone (T = 0, every speculative arm): " +
          (", ".join(f"{k} {v}" for k, v in sorted(res["greedy_mismatches"].items())) or "none compared") + ".",
          f"Distribution test (first token at T = 1, prompt {res['distribution'].get('prompt_id')}, {res['distribution'].get('n')} "
          f"seeds per arm, champion alone vs adaptive draft): chi-square homogeneity p = {_f(res['distribution']['p_value'], '.3g')}; "
          "each arm against the champion's first-token distribution computed by the CPython reference (q8 weights): "
          + (", ".join(f"{a} p = {_f(p, '.3g')}" for a, p in res["distribution"].get("fit_to_champion_p", {}).items()) or "not computed") + ".",
          f"llama.cpp (wllama) greedy ids equal to our WASM champion alone's: {res['wllama']['greedy_same_as_ours'][0]} of "
          f"{res['wllama']['greedy_same_as_ours'][1]}; wllama requests that failed inside wllama (left out): "
          + (", ".join(f"{f['prompt_id']} T={f['temperature']:g}: {f['error'][:80]}" for f in res["wllama"]["failures"]) or "none") + ".", "",
          f"Acceptance vs draft entropy: {res['entropy']['pairs']} judged proposals from {res['entropy']['prompts']} prompts "
          "(the draft's entropy recomputed by the CPython reference draft on the ids the browser ran; the engine does not expose it)"
          + (f"; skipped (prompt ids differ): {res['entropy']['skipped']}" if res['entropy']['skipped'] else "") + ".", "",
          "Energy: browsers expose no energy counter; no proxy is reported.", "", "## Plots", ""]
    for name in ("survival", "waterfall", "break_even", "memory_latency", "entropy", "heatmap", "ecdf", "pareto"):
        L.append(f"![{name}]({plots_rel}/{name}.png)")
    return "\n".join(L) + "\n"


def write_report(run_dir: str, with_entropy: bool = True, with_plots: bool = True) -> dict:
    from .plots import write_plots
    res = summarise(run_dir, with_entropy=with_entropy)
    if with_plots:
        res["plots"] = write_plots(res, run_dir)
    write_file(os.path.join(run_dir, "results.json"), json.dumps(
        res, indent=1, default=lambda x: None if isinstance(x, float) and math.isinf(x) else str(x)))
    write_file(os.path.join(run_dir, "report.md"), report_markdown(res))
    return res


"""Preregistered gates (eval/gates_v4.json; eval/gates_v3.json, gates_v2.json and gates.json stay the
records of v3's, v2's and v1's runs): load with their hash, judge metrics (with bootstrap intervals from v2 on: pass,
fail, inconclusive, fail (no data)), refuse a run recorded under a different gate file."""
from __future__ import annotations

import hashlib
import json
import operator
import os

from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError

GATES_V1_PATH = os.path.join("eval", "gates.json")
GATES_V2_PATH = os.path.join("eval", "gates_v2.json")
GATES_V3_PATH = os.path.join("eval", "gates_v3.json")   # v2's gates, judged over several engine pairs (cluster bootstrap)
GATES_V4_PATH = os.path.join("eval", "gates_v4.json")   # v3's, constraints compiled before timing, WebGPU gate repeats
PASS, FAIL, INCONCLUSIVE, NO_DATA = "pass", "fail", "inconclusive", "fail (no data)"
OPS = {"==": operator.eq, ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def gates_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_gates(path: str) -> tuple:
    """(gate document, sha256 of the file's bytes as text)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    doc = json.loads(text)
    for g in doc.get("gates", []):
        if g.get("op") not in OPS or not isinstance(g.get("threshold"), (int, float)) or not g.get("id"):
            raise ExactSpecError(E_BAD_ARGUMENT, f"{path}: gate {g.get('id')!r} needs an id, an op in {list(OPS)} and a threshold")
    return doc, gates_hash(text)


def check_same_gates(run_gates_hash: str, current_hash: str) -> None:
    """A run is judged only against the gate file it recorded: anything else is refused."""
    if run_gates_hash != current_hash:
        raise ExactSpecError(E_MANIFEST_MISMATCH, f"the run was recorded under gates {run_gates_hash[:12]}, the gate file "
                             f"is now {current_hash[:12]}: a changed gate file invalidates the run (run it again)")


def evaluate(doc: dict, metrics: dict) -> list:
    """v1 gates, one verdict per gate: {id, metric, op, threshold, value, verdict, passed}. No value
    for the metric (e.g. a backend without the arm) is "fail (no data)" with passed False: never a
    pass. A gate with per_stratum reads metrics[metric] as {stratum: value}: it fails if a stratum
    fails, and fails (no data) if a stratum, or every stratum, has no value."""
    out = []
    for g in doc["gates"]:
        value = metrics.get(g["metric"])
        verdict = {k: g[k] for k in ("id", "metric", "op", "threshold")}
        if g.get("per_stratum") and isinstance(value, dict):
            per = {s: (v, judge(v, g["op"], g["threshold"])) for s, v in value.items()}
            verdict.update(value=min((v for v, _ in per.values() if v is not None), default=None),
                           per_stratum={s: (v, j == PASS if j != NO_DATA else None) for s, (v, j) in per.items()},
                           verdict=combine(j for _, j in per.values()))
        else:
            verdict.update(value=value, verdict=judge(value, g["op"], g["threshold"]))
        verdict["passed"] = verdict["verdict"] == PASS
        out.append(verdict)
    return out


def judge(value, op: str, threshold, ci=None) -> str:
    """One verdict. With ci = (lo, hi): >= passes only when lo clears the threshold and fails only
    when hi is below it (<= mirrored); in between "inconclusive". Without ci the value is compared.
    No value: "fail (no data)", never a pass."""
    if value is None:
        return NO_DATA
    if ci is None:
        return PASS if OPS[op](value, threshold) else FAIL
    lo, hi = ci
    if op in (">=", ">"):
        return PASS if OPS[op](lo, threshold) else FAIL if not OPS[op](hi, threshold) else INCONCLUSIVE
    if op in ("<=", "<"):
        return PASS if OPS[op](hi, threshold) else FAIL if not OPS[op](lo, threshold) else INCONCLUSIVE
    return PASS if lo == hi == threshold else FAIL if not (lo <= threshold <= hi) else INCONCLUSIVE


_VERDICT_RANK = {FAIL: 0, NO_DATA: 1, INCONCLUSIVE: 2, PASS: 3}


def deciding_cell(cells: dict, op: str):
    """The name of the cell that decides a per-stratum gate (None when no cell has a value): the
    worst verdict first (fail, no data, inconclusive, pass), then the bound nearest to failing, the
    interval's lower end for >= (its upper end for <=; the value where there is no interval). The
    lowest value alone can name a passing cell while a wider interval elsewhere is inconclusive."""
    lower = op in (">=", ">")

    def bound(c):
        ci = c.get("ci")
        b = c["value"] if not ci else ci[0] if lower else ci[1]
        return b if lower else -b
    known = [(n, c) for n, c in cells.items() if c.get("value") is not None]
    if not known:
        return None
    return min(known, key=lambda nc: (_VERDICT_RANK.get(nc[1].get("verdict"), 3), bound(nc[1]), nc[0]))[0]


def combine(verdicts) -> str:
    """A gate over cells: fail if one fails, else fail (no data) if one has none (or there are no
    cells), else inconclusive if one is, else pass."""
    verdicts = list(verdicts)
    for v in (FAIL, NO_DATA, INCONCLUSIVE):
        if not verdicts or v in verdicts:
            return NO_DATA if not verdicts else v
    return PASS


def applies(gate: dict, topology: str) -> bool:
    scope = gate.get("applies_to", "all")
    return scope == "all" or topology in scope


def evaluate_v2(doc: dict, metrics: dict, topology: str) -> list:
    """One verdict per gate that applies to `topology`: {id, metric, op, threshold, ci_gate, value,
    ci, verdict, passed (verdict == pass)}. metrics[metric] is a number, {"value", "ci"}, or for a
    per-stratum gate {cell: {"value", "ci"}} (cells "<stratum> T=<t>"); absent or None: no data.
    The per-stratum value and interval shown are the deciding cell's (`cell`: deciding_cell)."""
    out = []
    for g in doc["gates"]:
        if not applies(g, topology):
            continue
        m = metrics.get(g["metric"])
        want_ci = bool(g.get("ci"))
        verdict = {k: g[k] for k in ("id", "metric", "op", "threshold")}
        verdict["ci_gate"] = want_ci
        if g.get("per_stratum"):
            cells = {}
            for cell, c in sorted((m or {}).items()):
                c = c if isinstance(c, dict) else {"value": c, "ci": None}
                v = (INCONCLUSIVE if want_ci and c.get("value") is not None and c.get("ci") is None
                     else judge(c.get("value"), g["op"], g["threshold"], c.get("ci") if want_ci else None))
                cells[cell] = {**c, "verdict": v}
            name = deciding_cell(cells, g["op"])
            worst = cells[name] if name is not None else {}
            verdict.update(value=worst.get("value"), ci=worst.get("ci"), cell=name, cells=cells,
                           verdict=combine(c["verdict"] for c in cells.values()))
        else:
            c = m if isinstance(m, dict) else {"value": m, "ci": None}
            ci = c.get("ci") if want_ci else None
            v = (INCONCLUSIVE if want_ci and c.get("value") is not None and ci is None   # no interval: cannot pass
                 else judge(c.get("value"), g["op"], g["threshold"], ci))
            verdict.update(value=c.get("value"), ci=ci, verdict=v)
        verdict["passed"] = verdict["verdict"] == PASS
        out.append(verdict)
    return out

"""Preregistered gates (eval/gates.json): load with their hash, evaluate on metrics, refuse a run
recorded under a different gate file."""
from __future__ import annotations

import hashlib
import json
import operator

from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError

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
    """One verdict per gate: {id, metric, op, threshold, value, passed}; passed is None when the
    run has no value for the metric (e.g. a backend without the arm). A gate with per_stratum
    reads metrics[metric] as {stratum: value} and passes only if every stratum does."""
    out = []
    for g in doc["gates"]:
        value = metrics.get(g["metric"])
        test = OPS[g["op"]]
        verdict = {k: g[k] for k in ("id", "metric", "op", "threshold")}
        if g.get("per_stratum") and isinstance(value, dict):
            per = {s: (v, None if v is None else bool(test(v, g["threshold"]))) for s, v in value.items()}
            known = [ok for _, ok in per.values() if ok is not None]
            verdict.update(value=min((v for v, _ in per.values() if v is not None), default=None),
                           per_stratum=per, passed=all(known) if known else None)
        else:
            verdict.update(value=value, passed=None if value is None else bool(test(value, g["threshold"])))
        out.append(verdict)
    return out

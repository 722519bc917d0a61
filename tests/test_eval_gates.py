"""Gates and corpus lock: evaluation on synthetic metrics, a changed gate file refused, the
corpus lock catching an added, removed or changed file, and the shipped corpus and gates valid."""
import json
import os
import shutil

import pytest

from exactspec.core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError
from exactspec.evaluation.corpus import FIELDS, check_lock, file_hashes, load_corpus, lock_of, select
from exactspec.evaluation.gates import check_same_gates, evaluate, gates_hash, load_gates

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = {"version": 1, "gates": [
    {"id": "same", "metric": "mismatches", "op": "==", "threshold": 0},
    {"id": "fast", "metric": "speedup", "op": ">=", "threshold": 2.0},
    {"id": "lean", "metric": "memory", "op": "<=", "threshold": 1.3},
    {"id": "strata", "metric": "per", "op": ">=", "threshold": 0.95, "per_stratum": True},
    {"id": "absent", "metric": "nothing", "op": ">=", "threshold": 1}]}


def test_gate_verdicts_exact():
    v = {g["id"]: g for g in evaluate(DOC, {"mismatches": 0, "speedup": 1.999, "memory": 1.3,
                                            "per": {"code": 1.2, "chat": 0.94, "json": None}})}
    assert v["same"]["passed"] is True and v["fast"]["passed"] is False and v["lean"]["passed"] is True
    assert v["strata"]["passed"] is False and v["strata"]["value"] == 0.94
    assert v["strata"]["per_stratum"] == {"code": (1.2, True), "chat": (0.94, False), "json": (None, None)}
    assert v["absent"]["passed"] is None and v["absent"]["value"] is None
    assert evaluate(DOC, {"per": {"code": 0.95}})[3]["passed"] is True


def test_gate_file_is_checked_and_hashed(tmp_path):
    p = tmp_path / "gates.json"
    p.write_text(json.dumps(DOC))
    doc, h = load_gates(str(p))
    assert doc == DOC and h == gates_hash(json.dumps(DOC))
    p.write_text(json.dumps({"version": 1, "gates": [{"id": "x", "metric": "m", "op": "~", "threshold": 1}]}))
    with pytest.raises(ExactSpecError) as e:
        load_gates(str(p))
    assert e.value.code == E_BAD_ARGUMENT


def test_a_changed_gate_file_invalidates_the_run():
    h = gates_hash("a")
    check_same_gates(h, h)
    with pytest.raises(ExactSpecError) as e:
        check_same_gates(h, gates_hash("a "))
    assert e.value.code == E_MANIFEST_MISMATCH and "invalidates the run" in e.value.message


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_corpus_lock_catches_every_change(tmp_path, change):
    d = tmp_path / "corpus"
    shutil.copytree(os.path.join(REPO, "eval", "corpus"), d)
    lock = lock_of(file_hashes(str(d)))
    assert check_lock(str(d), lock) == lock["corpus_sha256"]
    name = sorted(os.listdir(d))[0]
    if change == "edit":
        (d / name).write_text((d / name).read_text() + "\n")
    elif change == "add":
        (d / "extra.jsonl").write_text("")
    else:
        os.remove(d / name)
    with pytest.raises(ExactSpecError) as e:
        check_lock(str(d), lock)
    assert e.value.code == E_MANIFEST_MISMATCH


def test_shipped_corpus_matches_its_lock_and_covers_the_strata():
    prompts, h = load_corpus(os.path.join(REPO, "eval", "corpus"), os.path.join(REPO, "eval", "corpus.lock.json"))
    strata = {p["stratum"] for p in prompts}
    assert strata == {"casual", "dialogue", "summary", "extraction", "json", "code", "repetitive", "unicode",
                      "long_context", "adversarial"}
    assert all(sum(p["stratum"] == s for p in prompts) >= 3 for s in strata)
    assert all(sorted(p) == sorted(FIELDS) for p in prompts) and any(p["chat"] for p in prompts)
    assert len({p["seed"] for p in prompts}) == len(prompts)
    assert [p["stratum"] for p in select(prompts, 1)] == sorted(strata)
    doc, _ = load_gates(os.path.join(REPO, "eval", "gates.json"))
    assert {g["id"] for g in doc["gates"]} >= {"greedy_identity", "conversational_t1_2x", "no_stratum_below", "peak_memory"}

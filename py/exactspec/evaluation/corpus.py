"""The preregistered corpus: eval/corpus/<stratum>.jsonl, each prompt in the dev (tuning) or test split, frozen by
eval/corpus.lock.json (sha256 per file and per split); the loader returns one split only, and the test split's runs
are counted in eval/test_split_runs.json."""
from __future__ import annotations

import hashlib
import json
import os

from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError
from ..host.safe_files import write_file

FIELDS = ("id", "stratum", "prompt", "chat", "max_new_tokens", "seed", "split")
OPTIONAL_FIELDS = ("response_format",)     # the structured stratum's constraint (a request's response_format)
SPLITS = ("dev", "test")
TEST_RUNS_PATH = os.path.join("eval", "test_split_runs.json")


def file_hashes(corpus_dir: str) -> dict:
    """{file name: sha256 hex} of every .jsonl in corpus_dir, sorted by name."""
    out = {}
    for name in sorted(os.listdir(corpus_dir)):
        if name.endswith(".jsonl"):
            with open(os.path.join(corpus_dir, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def split_hash(prompts: list) -> str:
    """sha256 of one split's prompt records (sorted by id, keys sorted): what a run of that split ran."""
    return hashlib.sha256(json.dumps(sorted(prompts, key=lambda p: p["id"]), sort_keys=True,
                                     ensure_ascii=False).encode("utf-8")).hexdigest()


def lock_of(hashes: dict, prompts: list | None = None) -> dict:
    """The lock document for these file hashes (its own hash binds the whole corpus) and, given the
    prompts, each split's ids and hash."""
    lock = {"files": hashes, "corpus_sha256": hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()}
    if prompts is not None:
        lock["splits"] = {s: {"ids": sorted(p["id"] for p in prompts if p["split"] == s),
                              "sha256": split_hash([p for p in prompts if p["split"] == s])} for s in SPLITS}
    return lock


def check_lock(corpus_dir: str, lock: dict) -> str:
    """The corpus hash when every file matches the lock; E_MANIFEST_MISMATCH naming the first
    file added, removed or changed since the lock was written."""
    now = file_hashes(corpus_dir)
    for name in sorted(set(now) | set(lock["files"])):
        if now.get(name) != lock["files"].get(name):
            what = "added" if name not in lock["files"] else "removed" if name not in now else "changed"
            raise ExactSpecError(E_MANIFEST_MISMATCH, f"corpus file {name} was {what} after the corpus was locked")
    return lock_of(now)["corpus_sha256"]


def parse_prompts(lines, source: str) -> list:
    """Prompt records of one .jsonl text (each with exactly FIELDS, split in SPLITS); E_BAD_ARGUMENT otherwise."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if sorted(set(rec) - set(OPTIONAL_FIELDS)) != sorted(FIELDS):
            raise ExactSpecError(E_BAD_ARGUMENT, f"{source}:{n}: a prompt has exactly the fields {', '.join(FIELDS)} "
                                 f"(and optionally {', '.join(OPTIONAL_FIELDS)})")
        if rec["split"] not in SPLITS:
            raise ExactSpecError(E_BAD_ARGUMENT, f"{source}:{n}: split {rec['split']!r} is not one of {', '.join(SPLITS)}")
        out.append(rec)
    return out


def _all_prompts(corpus_dir: str) -> list:
    prompts = []
    for name in sorted(os.listdir(corpus_dir)):
        if name.endswith(".jsonl"):
            with open(os.path.join(corpus_dir, name), encoding="utf-8") as f:
                prompts += parse_prompts(f, name)
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise ExactSpecError(E_BAD_ARGUMENT, "corpus prompt ids must be unique")
    return prompts


def load_corpus(corpus_dir: str, lock_path: str, split: str) -> tuple:
    """(the prompts of `split` only, in file-then-line order; that split's sha256), after the lock
    check. A dev (tuning) run never gets a test prompt from here, and the split's ids and hash
    must equal the lock's (a prompt moved between splits is refused)."""
    if split not in SPLITS:
        raise ExactSpecError(E_BAD_ARGUMENT, f"split {split!r}: one of {', '.join(SPLITS)}")
    with open(lock_path) as f:
        lock = json.load(f)
    check_lock(corpus_dir, lock)
    mine = [p for p in _all_prompts(corpus_dir) if p["split"] == split]
    h = split_hash(mine)
    locked = (lock.get("splits") or {}).get(split)
    if not locked or locked["sha256"] != h or locked["ids"] != sorted(p["id"] for p in mine):
        raise ExactSpecError(E_MANIFEST_MISMATCH, f"the {split} split differs from the lock's (ids or hash)")
    return mine, h


def write_lock(corpus_dir: str, lock_path: str) -> dict:
    """Write the lock of the corpus as it is now (a new corpus version: earlier runs stay bound to theirs)."""
    lock = lock_of(file_hashes(corpus_dir), _all_prompts(corpus_dir))
    write_file(lock_path, json.dumps(lock, indent=1, ensure_ascii=False) + "\n")
    return lock


def select(prompts: list, per_stratum: int) -> list:
    """The first per_stratum prompts of every stratum (quick runs), order kept."""
    seen: dict = {}
    out = []
    for p in prompts:
        seen[p["stratum"]] = seen.get(p["stratum"], 0) + 1
        if seen[p["stratum"]] <= per_stratum:
            out.append(p)
    return out


def recorded_test_runs(path: str = TEST_RUNS_PATH) -> list:
    """The recorded runs of the test split ([{run, commit, date}], oldest first; [] when none)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)["runs"]


def record_test_run(run: str, commit: str, date: str, path: str = TEST_RUNS_PATH) -> int:
    """Append {run, commit, date} to the committed counter of test-split runs (at the start of a
    --split test run; a resumed run of the same name is not counted again); the count after it."""
    runs = recorded_test_runs(path)
    if not any(r["run"] == run for r in runs):
        runs.append({"run": run, "commit": commit, "date": date})
        write_file(path, json.dumps({"what": "every run of the locked test split (exactspec bench --split test), "
                                             "appended by the bench at the run's start; never edited by hand",
                                     "runs": runs}, indent=1) + "\n")
    return len(runs)

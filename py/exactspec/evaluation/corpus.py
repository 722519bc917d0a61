"""The preregistered corpus: eval/corpus/<stratum>.jsonl, frozen by eval/corpus.lock.json (sha256 per file)."""
from __future__ import annotations

import hashlib
import json
import os

from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, ExactSpecError

FIELDS = ("id", "stratum", "prompt", "chat", "max_new_tokens", "seed")


def file_hashes(corpus_dir: str) -> dict:
    """{file name: sha256 hex} of every .jsonl in corpus_dir, sorted by name."""
    out = {}
    for name in sorted(os.listdir(corpus_dir)):
        if name.endswith(".jsonl"):
            with open(os.path.join(corpus_dir, name), "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def lock_of(hashes: dict) -> dict:
    """The lock document for these file hashes (its own hash binds the whole corpus)."""
    return {"files": hashes, "corpus_sha256": hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()}


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
    """Prompt records of one .jsonl text (each with exactly FIELDS); E_BAD_ARGUMENT otherwise."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        if sorted(rec) != sorted(FIELDS):
            raise ExactSpecError(E_BAD_ARGUMENT, f"{source}:{n}: a prompt has exactly the fields {', '.join(FIELDS)}")
        out.append(rec)
    return out


def load_corpus(corpus_dir: str, lock_path: str) -> tuple:
    """(prompts in file-then-line order, corpus hash), after the lock check."""
    with open(lock_path) as f:
        corpus_hash = check_lock(corpus_dir, json.load(f))
    prompts = []
    for name in sorted(os.listdir(corpus_dir)):
        if name.endswith(".jsonl"):
            with open(os.path.join(corpus_dir, name), encoding="utf-8") as f:
                prompts += parse_prompts(f, name)
    ids = [p["id"] for p in prompts]
    if len(set(ids)) != len(ids):
        raise ExactSpecError(E_BAD_ARGUMENT, "corpus prompt ids must be unique")
    return prompts, corpus_hash


def select(prompts: list, per_stratum: int) -> list:
    """The first per_stratum prompts of every stratum (quick runs), order kept."""
    seen: dict = {}
    out = []
    for p in prompts:
        seen[p["stratum"]] = seen.get(p["stratum"], 0) + 1
        if seen[p["stratum"]] <= per_stratum:
            out.append(p)
    return out

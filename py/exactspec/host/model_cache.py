"""A Hugging Face folder made ready for the browser engine: converted once into build/model_cache/.

The browser runs a champion from model.q8.safetensors and a draft from an all-F32
model.safetensors. A folder as published (bf16/f16, or shards) has neither. `browser_ready(folder,
role)` returns the folder itself when it already holds its role's run artifact, else the folder
that `exactspec.reference.convert` made from it under build/model_cache/<key>/ ($EXACTSPEC_MODEL_CACHE
when set), where key is the sha256 of the role and of the content of every file convert reads
(the identity files, chat_template.jinja and special_tokens_map.json when present, and the
weights: exactspec.reference.hf.checkpoint_digest). A changed file is a new key; an unchanged folder
converts once. convert writes through a staging folder renamed into place, so a cache folder
holding exactspec_model.json is complete.
"""
from __future__ import annotations

import os
import sys

from ..reference.convert import MODEL_FILE, OPTIONAL_FILES, ROLES
from ..core.errors import E_BAD_ARGUMENT, ExactSpecError
from ..formats.manifest import FILES, WEIGHTS_FILE, sha256_file, sha256_json

CACHE_DIR = os.path.join("build", "model_cache")   # under the repository root


def default_cache_root() -> str:
    """$EXACTSPEC_MODEL_CACHE, else build/model_cache of the source checkout."""
    from .server import REPO_ROOT
    return os.environ.get("EXACTSPEC_MODEL_CACHE") or os.path.join(str(REPO_ROOT), CACHE_DIR)


def has_run_artifact(folder: str, role: str) -> bool:
    """The champion: model.q8.safetensors is there. The draft: model.safetensors holds F32 only."""
    if role not in ROLES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"role must be one of {sorted(ROLES)}, got {role!r}")
    path = os.path.join(folder, ROLES[role])
    if not os.path.isfile(path):
        return False
    if ROLES[role] != WEIGHTS_FILE:
        return True
    from ..formats.safetensors import read_header
    entries, _ = read_header(path)
    return all(entry["dtype"] == "F32" for entry in entries.values())


def content_key(folder: str, role: str) -> str:
    """sha256 of the role and of the sha256 of every file convert reads from the folder."""
    from ..reference.hf import checkpoint_digest, open_checkpoint
    digests = {name: sha256_file(os.path.join(folder, name))[0]
               for name in (*FILES, *OPTIONAL_FILES) if os.path.isfile(os.path.join(folder, name))}
    with open_checkpoint(folder) as ckpt:
        digests["weights"] = checkpoint_digest(ckpt)[0]
    return sha256_json({"role": role, "files": digests})


class ConvertProgress:
    """convert's progress callback: one line on stderr per tenth of the bytes (rewritten in place on
    a terminal), prefixed with what is being converted."""

    def __init__(self, prefix: str, stream=None):
        self.prefix, self.stream, self.shown = prefix, stream or sys.stderr, 0

    def __call__(self, done: int, total: int, done_bytes: int, total_bytes: int) -> None:
        live = self.stream.isatty()
        if not live and done < total and done_bytes < self.shown + total_bytes / 10:
            return
        self.shown = done_bytes
        print(("\r" if live else "") + f"{self.prefix}: {done}/{total} tensors, "
              f"{done_bytes / 1e6:.1f}/{total_bytes / 1e6:.1f} MB",
              end="\n" if done == total or not live else "", file=self.stream, flush=True)


def browser_ready(folder: str, role: str, cache_root: str | None = None, stream=None) -> str:
    """The folder to serve to the browser engine for `role` (see module docstring); converting
    prints its progress on `stream` (stderr)."""
    if has_run_artifact(folder, role):
        return folder
    from ..reference.convert import convert
    target = os.path.join(cache_root or default_cache_root(), content_key(folder, role))
    if not os.path.isfile(os.path.join(target, MODEL_FILE)):
        what = "q8" if role == "champion" else "F32"
        convert(folder, target, role=role,
                progress=ConvertProgress(f"exactspec: {folder}: converting the {role} to {what} for the browser "
                                         f"({target})", stream))
    return target

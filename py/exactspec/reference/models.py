"""Load a champion/draft pair into an Orchestrator: each model a Hugging Face-layout folder or a
GGUF file (the champion's tokenizer, chat template and stop ids then come from its metadata)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Optional

from ..core.backends import RunnerChampion, RunnerDraft
from ..formats.config import MAX_CONFIG_BYTES, read_json_file, read_regular_file
from ..core.errors import E_MODEL_LOAD, ExactSpecError
from ..core.orchestrator import Orchestrator
from ..formats.tokenizer import MAX_TOKENIZER_BYTES, Tokenizer


def default_models_dir() -> str:
    """$EXACTSPEC_MODELS, else web/models of the source checkout this package lives in."""
    env = os.environ.get("EXACTSPEC_MODELS")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "web", "models"))


MAX_TOKENIZER_CONFIG_BYTES = 1 << 24   # tokenizer_config.json: chat templates, added tokens


def _read_json(path: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON object from a regular file, bounded in size and depth (exactspec.formats.config)."""
    value = read_json_file(path, max_bytes=max_bytes)
    if not isinstance(value, dict):
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: not a JSON object")
    return value


@dataclass
class LoadedPair:
    orchestrator: Orchestrator
    tokenizer: Tokenizer
    tokenizer_config: dict
    stop_token_ids: tuple
    manifest: Optional[dict]


def stop_ids_from(model_dir: str) -> tuple:
    """generation_config.json's eos_token_id (an id, a list of ids, or absent/null: none), in
    file order without repeats; anything else is E_MODEL_LOAD."""
    path = os.path.join(model_dir, "generation_config.json")
    eos = _read_json(path).get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: eos_token_id must be a token id or a list of ids, "
                             f"got {json.dumps(eos)[:80]}", field="eos_token_id")
    return tuple(dict.fromkeys(ids))


def read_tokenizer_config(model_dir: str) -> dict:
    """tokenizer_config.json, its chat_template taken as transformers takes it: from
    chat_template.jinja when the folder has one (where transformers saves it today)."""
    from ..formats.manifest import CHAT_TEMPLATE_FILE, chat_template_of
    tok_config = _read_json(os.path.join(model_dir, "tokenizer_config.json"), MAX_TOKENIZER_CONFIG_BYTES)
    jinja_path = os.path.join(model_dir, CHAT_TEMPLATE_FILE)
    if os.path.exists(jinja_path):
        jinja = read_regular_file(jinja_path, max_bytes=MAX_TOKENIZER_CONFIG_BYTES)
        tok_config["chat_template"] = chat_template_of(tok_config, jinja, jinja_path)
    return tok_config


def _reference(model: str, weights: str = "f32", role: str = "draft", matmul: str = "f32"):
    """The NumPy reference of a folder (LlamaReference.from_dir; role "champion" refuses the
    drafts-only restricted-vocabulary tensors) or of a GGUF file; matmul "q8act": the quantised
    linears on their blocks (docs/reference_model.md)."""
    from ..formats.manifest import is_gguf_file
    if is_gguf_file(model):
        from ..formats.gguf_model import load_reference
        return load_reference(model, matmul=matmul)
    from .reference_llama import LlamaReference  # numpy: CPython only
    return LlamaReference.from_dir(model, weights=weights, role=role, matmul=matmul)


def known_draft(champion: str, models_dir: Optional[str] = None) -> Optional[str]:
    """The draft folder that <models_dir>/manifest.json (default web/models) binds to this champion
    in its `drafts` entry, keyed by the sha256 of the champion's weights (a GGUF: the file), or
    None when the manifest names none (or there is no manifest)."""
    from ..formats.manifest import draft_for_champion, is_gguf_file, sha256_file
    models_dir = models_dir or default_models_dir()
    path = os.path.join(models_dir, "manifest.json")
    if not os.path.exists(path):
        return None
    if is_gguf_file(champion):
        digest = sha256_file(champion)[0]
    else:
        from .hf import checkpoint_digest, open_checkpoint
        with open_checkpoint(champion) as ckpt:
            digest = checkpoint_digest(ckpt)[0]
    folder = draft_for_champion(_read_json(path, MAX_TOKENIZER_CONFIG_BYTES), digest)
    return os.path.join(models_dir, folder) if folder else None


def load_pair(champion_dir: str, draft_dir: Optional[str] = None, champion_weights: str = "f32",
              champion_matmul: str = "f32") -> LoadedPair:
    """champion_dir / draft_dir: a folder or a GGUF file. champion_weights (a folder champion):
    "f32" (model.safetensors) or "q8" (model.q8.safetensors, what the browser runs).
    champion_matmul: the champion reference's function, "f32" or "q8act" (its quantised linears
    with q8act-v1 on their blocks, the WASM / WebGPU champions' default)."""
    from ..formats.manifest import check_pair, is_gguf_file
    manifest = None
    if draft_dir is not None:
        manifest = check_pair(champion_dir, draft_dir,
                              champion_run_weights="model.q8.safetensors" if champion_weights == "q8" else "model.safetensors")
    if is_gguf_file(champion_dir):
        from .gguf_pair import load_gguf_pair
        pair = load_gguf_pair(champion_dir, matmul=champion_matmul)
        if draft_dir is not None:
            pair.orchestrator.draft = RunnerDraft(_reference(draft_dir))
        pair.manifest = manifest
        return pair
    tok_path = os.path.join(champion_dir, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tok_path)
    tok_config = read_tokenizer_config(champion_dir)
    champion = _reference(champion_dir, weights=champion_weights, role="champion", matmul=champion_matmul)
    draft = _reference(draft_dir) if draft_dir is not None else None
    tok_bytes = read_regular_file(tok_path, max_bytes=MAX_TOKENIZER_BYTES)
    tokenizer_hash = hashlib.sha256(tok_bytes).hexdigest()   # same bytes the browser hashes
    identities = {"tokenizer": tokenizer_hash,
                  "chat_template": hashlib.sha256(tok_config.get("chat_template", "").encode()).hexdigest()}
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    from .constrained import ReferenceConstraints
    constraints = ReferenceConstraints(json.loads(tok_bytes), champion.vocab_size)   # response_format, compiled on use
    orch = Orchestrator(RunnerChampion(champion), RunnerDraft(draft) if draft else None, decode=decode,
                        identities=identities, n_token_ids=tokenizer.vocab_size, constraints=constraints)
    return LoadedPair(orch, tokenizer, tok_config, stop_ids_from(champion_dir), manifest)

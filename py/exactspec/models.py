"""Load a champion/draft pair from Hugging Face-layout directories into an Orchestrator."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Optional

from .backends import RunnerChampion, RunnerDraft
from .errors import E_MODEL_LOAD, ExactSpecError
from .orchestrator import Orchestrator
from .tokenizer import Tokenizer


def default_models_dir() -> str:
    """$EXACTSPEC_MODELS, else web/models of the source checkout this package lives in."""
    env = os.environ.get("EXACTSPEC_MODELS")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "web", "models"))


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: not readable JSON ({exc})") from None


@dataclass
class LoadedPair:
    orchestrator: Orchestrator
    tokenizer: Tokenizer
    tokenizer_config: dict
    stop_token_ids: tuple
    manifest: Optional[dict]


def stop_ids_from(model_dir: str) -> tuple:
    gen = _read_json(os.path.join(model_dir, "generation_config.json"))
    eos = gen.get("eos_token_id", [])
    return tuple(eos if isinstance(eos, list) else [eos])


def load_pair(champion_dir: str, draft_dir: Optional[str] = None) -> LoadedPair:
    from .reference_llama import LlamaReference  # numpy: CPython only
    manifest = None
    if draft_dir is not None:
        from .manifest import check_pair
        manifest = check_pair(champion_dir, draft_dir)
    tok_path = os.path.join(champion_dir, "tokenizer.json")
    tokenizer = Tokenizer.from_file(tok_path)
    tok_config = _read_json(os.path.join(champion_dir, "tokenizer_config.json"))
    champion = LlamaReference.from_dir(champion_dir)
    draft = LlamaReference.from_dir(draft_dir) if draft_dir is not None else None
    with open(tok_path, "rb") as f:
        tokenizer_hash = hashlib.sha256(f.read()).hexdigest()   # same bytes the browser hashes
    identities = {"tokenizer": tokenizer_hash,
                  "chat_template": hashlib.sha256(tok_config.get("chat_template", "").encode()).hexdigest()}
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    orch = Orchestrator(RunnerChampion(champion), RunnerDraft(draft) if draft else None, decode=decode,
                        identities=identities)
    return LoadedPair(orch, tokenizer, tok_config, stop_ids_from(champion_dir), manifest)

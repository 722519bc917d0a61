"""A GGUF file as the champion (CPython reference): what models.load_pair gives for a model folder.

`load_gguf_pair(path)` returns a models.LoadedPair built from the one file: the NumPy reference on
its dequantised weights (gguf_model.load_reference), the tokenizer and tokenizer_config rebuilt
from its metadata (gguf_tokenizer), and the stop ids it names (EOS, EOT, EOM). The tokenizer
identity is the sha256 of the rebuilt tokenizer.json (canonical JSON); the chat template's is the
sha256 of the template text, as for a folder. The pair has no draft here: models.load_pair attaches
one (a folder or a GGUF file) after manifest.check_pair.
"""
from __future__ import annotations

import hashlib
import json

from ..core.backends import RunnerChampion
from ..formats.gguf import GGUFFile
from ..formats.gguf_model import load_reference
from ..formats.gguf_tokenizer import load_tokenizer, stop_token_ids, tokenizer_config, tokenizer_spec
from .models import LoadedPair
from ..core.orchestrator import Orchestrator


def load_gguf_pair(path, matmul: str = "f32") -> LoadedPair:
    """matmul: the reference champion's ("q8act": the block tensors with q8act-v1, load_reference)."""
    with GGUFFile(path) as f:
        tokenizer, spec = load_tokenizer(f), tokenizer_spec(f)
        tok_config = tokenizer_config(f)
        stop_ids = stop_token_ids(f)
    champion = load_reference(path, matmul=matmul)
    canonical = json.dumps(spec, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    identities = {"tokenizer": hashlib.sha256(canonical).hexdigest(),
                  "chat_template": hashlib.sha256(tok_config.get("chat_template", "").encode()).hexdigest()}
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    from .constrained import ReferenceConstraints
    orchestrator = Orchestrator(RunnerChampion(champion), None, decode=decode, identities=identities,
                                n_token_ids=tokenizer.vocab_size,
                                constraints=ReferenceConstraints(spec, champion.vocab_size))   # spec: tokenizer.json
    return LoadedPair(orchestrator, tokenizer, tok_config, stop_ids, None)

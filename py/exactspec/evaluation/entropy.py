"""Draft entropy per proposal position (I/O: loads the draft). The browser engine does not expose
the draft's distribution, so this recomputes it with the CPython float64 reference draft on the
same ids (prompt + the answer the browser gave at T = 0) and pairs it with whether the browser
accepted the proposal at that position (token source "accepted" or "correction")."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from .metrics import entropy_nats


def champion_first_token_probs(prompt: dict, models_dir: str) -> dict:
    """{token id: probability} of the champion's first token at T = 1 (q8 weights, CPython
    float64 reference: the function the browser's champion computes, up to float32 rounding)."""
    from ..formats.chat import encode_chat_prompt
    from ..reference.reference_llama import LlamaReference
    from ..formats.tokenizer import Tokenizer
    tok = Tokenizer.from_file(os.path.join(models_dir, "champion", "tokenizer.json"))
    with open(os.path.join(models_dir, "champion", "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    ids = (encode_chat_prompt(tok, tok_config, [{"role": "user", "content": prompt["prompt"]}]) if prompt["chat"]
           else tok.encode(prompt["prompt"], add_special_tokens=True))
    row = LlamaReference.from_dir(os.path.join(models_dir, "champion"), weights="q8").forward(ids, 0)[-1]
    q = np.exp(row - row.max())
    q /= q.sum()
    return {i: float(p) for i, p in enumerate(q)}


def draft_entropy_pairs(records: list, prompts_by_id: dict, models_dir: str, arm: str = "draft-k8",
                        backend: str = "wasm") -> dict:
    """{"pairs": [(entropy nats, accepted 0/1, stratum)], "prompts": n, "skipped": ids whose
    prompt ids did not hash to what the browser ran}."""
    from ..formats.chat import encode_chat_prompt
    from ..reference.reference_llama import LlamaReference
    from ..formats.tokenizer import Tokenizer
    tok = Tokenizer.from_file(os.path.join(models_dir, "champion", "tokenizer.json"))
    with open(os.path.join(models_dir, "champion", "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    draft = LlamaReference.from_dir(os.path.join(models_dir, "draft"))
    pairs, skipped, n = [], [], 0
    for r in records:
        if r["arm"] != arm or r["backend"] != backend or r["temperature"] != 0 or not r["token_ids"]:
            continue
        p = prompts_by_id[r["prompt_id"]]
        ids = (encode_chat_prompt(tok, tok_config, [{"role": "user", "content": p["prompt"]}]) if p["chat"]
               else tok.encode(p["prompt"], add_special_tokens=True))
        if hashlib.sha256(json.dumps(ids).encode()).hexdigest() != r["prompt_ids_sha256"]:
            skipped.append(r["prompt_id"])
            continue
        draft.reset()
        logits = draft.forward(ids + r["token_ids"][:-1], 0)
        n += 1
        for pos, src in enumerate(r["sources"][:len(r["token_ids"])]):
            if src not in ("accepted", "correction"):
                continue
            row = logits[len(ids) + pos - 1]
            probs = np.exp(row - row.max())
            probs /= probs.sum()
            pairs.append((entropy_nats(probs.tolist()), int(src == "accepted"), r["stratum"]))
    return {"pairs": pairs, "prompts": n, "skipped": skipped}

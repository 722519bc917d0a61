"""Restricted-vocabulary drafts: two optional I32 tensors of a draft's model.safetensors.

    exactspec.head_ids    (N,) strictly ascending ids in [0, V): the LM head has N rows,
                          lm_head.weight (N, D); the draft's logit is -inf for every other id.
    exactspec.embed_rows  (V,) values in [0, M): token t's input embedding is row
                          embed_rows[t] of model.embed_tokens.weight (M, D), M <= V.

Either needs an untied LM head. Drafts only: a champion's checks never list them, so a champion
file carrying one is refused as an unexpected tensor. Exactness is untouched: the proposal
distribution is exactly 0 outside head_ids and speculative sampling only needs its true values.
The twin of this file in the page is web/formats/model_checks.mjs (restrictedShapes,
checkRestrictedValues): same checks, same messages. docs/draft_wasm.md describes the format.
"""
from __future__ import annotations

import numpy as np

HEAD_IDS = "exactspec.head_ids"
EMBED_ROWS = "exactspec.embed_rows"
RESTRICTED_TENSORS = (HEAD_IDS, EMBED_ROWS)
INDEX_DTYPE = "I32"
EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def restricted_shapes(entries: dict, hp: dict, refuse) -> dict[str, tuple[int, ...]]:
    """The expected shapes a draft's restriction tensors add or change, from a safetensors header.

    entries: name -> {"dtype", "shape"}; hp: vocab_size, hidden_size, tie_word_embeddings;
    refuse(message, tensor_name) raises. -> {} for an unrestricted draft, else name -> shape for
    the restriction tensors themselves, lm_head.weight (N, D) and model.embed_tokens.weight (M, D).
    Only dtypes, ranks and lengths are checked here; the values by check_restricted_values."""
    v, d = hp["vocab_size"], hp["hidden_size"]
    shapes: dict[str, tuple[int, ...]] = {}
    for name in RESTRICTED_TENSORS:
        if name not in entries:
            continue
        dtype = str(entries[name]["dtype"]).upper()
        shape = tuple(int(x) for x in entries[name]["shape"])
        if dtype != INDEX_DTYPE:
            refuse(f"tensor {name!r} has dtype {dtype}, expected {INDEX_DTYPE}", name)
        if hp["tie_word_embeddings"]:
            refuse(f"tensor {name!r} needs an untied LM head (config tie_word_embeddings is true)", name)
        if name == HEAD_IDS:
            if len(shape) != 1 or not 1 <= shape[0] <= v:
                refuse(f"tensor {name!r} has shape {shape}, expected (N,) with 1 <= N <= {v}", name)
            shapes[name] = shape
            shapes[LM_HEAD] = (shape[0], d)
        else:
            if shape != (v,):
                refuse(f"tensor {name!r} has shape {shape}, expected {(v,)}", name)
            shapes[name] = shape
            embed = entries.get(EMBEDDING)
            m = int(embed["shape"][0]) if embed is not None and len(embed["shape"]) == 2 else 0
            if not 1 <= m <= v:
                refuse(f"tensor {EMBEDDING!r} needs 1 to {v} rows with {name!r} present", EMBEDDING)
            shapes[EMBEDDING] = (m, d)
    return shapes


def check_restricted_values(name: str, values: np.ndarray, limit: int, refuse) -> np.ndarray:
    """values (I32, read from the file) against [0, limit) and, for head_ids, strictly
    ascending; -> the values as int64. refuse(message, tensor_name) raises at the first fault."""
    ids = np.asarray(values).astype(np.int64)
    outside = np.flatnonzero((ids < 0) | (ids >= limit))
    if outside.size:
        i = int(outside[0])
        refuse(f"tensor {name!r} holds {int(ids[i])} at index {i}, outside [0, {limit})", name)
    if name == HEAD_IDS:
        steps = np.flatnonzero(ids[1:] <= ids[:-1])
        if steps.size:
            i = int(steps[0]) + 1
            refuse(f"tensor {name!r} is not strictly ascending at index {i} "
                   f"({int(ids[i - 1])} then {int(ids[i])})", name)
    return ids


def decode_index_tensor(name: str, data, count: int, refuse) -> np.ndarray:
    """Little-endian I32 bytes -> (count,) int32 array, its byte length checked."""
    if len(data) != 4 * count:
        refuse(f"tensor {name!r} holds {len(data)} bytes, shape ({count},) of I32 needs {4 * count}", name)
    return np.frombuffer(bytes(data), dtype="<i4").astype(np.int32)


def check_restricted_checkpoint(read_bytes, header: dict, vocab_size: int, path: str) -> None:
    """The values of the restriction tensors a checked header lists (read_bytes(name) -> bytes),
    refused E_MODEL_LOAD naming path and the tensor (exactspec convert, before the long write)."""
    from ..core.errors import E_MODEL_LOAD, ExactSpecError

    def refuse(message: str, name: str):
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: {message}", tensor=name, file=path)

    for name in RESTRICTED_TENSORS:
        if name in header:
            count = int(header[name]["shape"][0])
            limit = vocab_size if name == HEAD_IDS else int(header[EMBEDDING]["shape"][0])
            check_restricted_values(name, decode_index_tensor(name, read_bytes(name), count, refuse), limit, refuse)

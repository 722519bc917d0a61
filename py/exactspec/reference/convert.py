"""`exactspec convert SRC DST [--role draft]`: a Hugging Face folder to its run artifact, streamed.

Writes DST/model.q8.safetensors in the format the shipped champion uses (scheme `q8-sym-row-v1`:
every 2-D tensor but the embedding as `<name>.q8` int8 symmetric per output row plus
`<name>.scale` float32 `(rows,)`, w ~= q8 * scale[:, None]; embedding, norms and biases as
float32 under their own names; the source's `__metadata__` plus `quantization`, keys sorted),
copies the small files (config, generation config, tokenizer files), and writes
DST/exactspec_model.json: the file list with sha256 and sizes, the `models.<role>` entry of a
served manifest (run_artifact) and the model's identity (exactspec.formats.manifest). With role "draft"
the artifact is instead DST/model.safetensors with every tensor F32 (what the WASM draft runs).

Streaming: the header is laid out from the source headers alone, then each output tensor is
produced in blocks of rows (read, widen to float32, quantise, write) and hashed as written, so
the peak is one block of rows (CHUNK_VALUES float32 values and their int8 copy), never a tensor
and never the model. Quantisation is exactly tools/train/export_hf.py's torch code in NumPy:
amax = max|row| in float32, clamped to float32(1e-12); scale = float32(amax / 127);
q = clip(rint(w / scale), -127, 127) (float32 division, ties to even). The result is the
shipped champion's model.q8.safetensors byte for byte, up to the order of its metadata keys.
A weight that is inf or NaN is refused (E_MODEL_LOAD naming the tensor and row).

Writing (the rules: docs/hostile_input.md, "Files the command line writes"): DST, and every DST
entry convert would write, must not be a symbolic link (E_IO naming it); all outputs are built in
a fresh staging folder inside DST and renamed into place together at the end (exactspec.host.safe_files),
so a convert that fails or is interrupted leaves DST as it was, never a mix of two models.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time

import numpy as np

from ..formats.config import read_regular_file
from ..core.errors import E_BAD_ARGUMENT, E_IO, E_MODEL_LOAD, ExactSpecError
from .hf import CONFIG_FILE, load_config, open_checkpoint
from ..formats.manifest import (FILES, CHAT_TEMPLATE_FILE, MAX_MODEL_JSON_BYTES, Q8_WEIGHTS_FILE, RUN_WEIGHTS_SCHEMES,
                       WEIGHTS_FILE, model_identity_from_files, run_weights_scheme)
from .reference_llama import _check_header, _parse_config
from .restricted_vocab import RESTRICTED_TENSORS, check_restricted_checkpoint
from ..host.safe_files import move_into_place, refuse_link, replacing, write_file
from ..formats.safetensors import safetensors_layout

CHUNK_VALUES = 1 << 20                 # float32 values per block of rows (4 MiB)
EMBEDDING = "model.embed_tokens.weight"
OPTIONAL_FILES = ("special_tokens_map.json", CHAT_TEMPLATE_FILE)
MODEL_FILE = "exactspec_model.json"
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def plan_outputs(header: dict, tied: bool, quantise: bool = True, q8_embedding: bool = False) -> dict:
    """Output tensor name -> (dtype, shape, source name, kind in {"f32", "q8", "scale"}); with
    quantise=False every tensor is F32 under its own name (the WASM draft's model.safetensors);
    q8_embedding quantises the embedding like the linears (default: F32, the shipped format).
    A draft's restricted-vocabulary tensors (I32) pass through unchanged (kind "i32")."""
    plan = {}
    for name, info in header.items():
        shape = tuple(info["shape"])
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue   # not part of the function (transformers ignores them too)
        if name in RESTRICTED_TENSORS:
            plan[name] = (str(info["dtype"]).upper(), shape, name, "i32")
            continue
        if quantise and len(shape) == 2 and (name != EMBEDDING or q8_embedding):
            plan[name + ".q8"] = ("I8", shape, name, "q8")
            plan[name + ".scale"] = ("F32", shape[:1], name, "scale")
        else:
            plan[name] = ("F32", shape, name, "f32")
    return plan


def quantise_rows(w: np.ndarray, scale=None):
    """(q8, scale) of float32 rows as export_hf.quantize_rows computes them in torch; with
    scale given, only q8 against it."""
    if scale is None:
        amax = np.maximum(np.max(np.abs(w), axis=1), np.float32(1e-12))
        scale = (amax / np.float32(127.0)).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def _row_blocks(shape: tuple):
    rows = shape[0] if shape else 1
    per = max(1, CHUNK_VALUES // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    for begin in range(0, rows, per):
        yield begin, min(rows, begin + per)


class _HashingWriter:
    def __init__(self, f, path: str):
        self.f, self.path, self.sha, self.bytes = f, path, hashlib.sha256(), 0

    def write(self, data) -> None:
        data = memoryview(data).cast("B")
        try:
            self.f.write(data)
        except OSError as e:
            raise ExactSpecError(E_IO, f"{self.path}: cannot write ({e.strerror or e})") from None
        self.sha.update(data)
        self.bytes += len(data)


def check_finite(source: str, values, first_row: int = 0) -> None:
    """E_MODEL_LOAD naming the tensor and the row of the first inf or NaN among `values` (rows
    first_row.. of tensor `source`): such an artifact would only fail at run time."""
    finite = np.isfinite(values)
    if finite.all():
        return
    at = tuple(int(i) for i in np.argwhere(~finite)[0])
    if not at:
        where = "its value"
    elif len(at) == 1:
        where = f"element {first_row + at[0]}"
    else:
        where = f"row {first_row + at[0]}" + (f", column {at[1]}" if len(at) == 2 else "")
    raise ExactSpecError(E_MODEL_LOAD, f"{source}: {where} is {float(values[at])} (convert needs finite weights)")


def _produce(ckpt, writer, kind: str, source: str, scales: dict) -> None:
    """Write one output tensor block by block."""
    dtype, shape = ckpt.entry(source)
    if kind == "i32":   # restricted-vocabulary ids: the bytes as they are (checked before the write)
        writer.write(ckpt.read_bytes(source))
        return
    if not shape:   # a scalar
        value = ckpt.read_float32(source)
        check_finite(source, value)
        writer.write(value.astype("<f4").tobytes())
        return
    scale_parts = []
    for begin, end in _row_blocks(shape):
        rows = ckpt.read_rows_float32(source, begin, end)
        check_finite(source, rows, begin)
        if kind == "f32":
            writer.write(np.ascontiguousarray(rows, dtype="<f4"))
        elif kind == "scale":
            scale_parts.append(quantise_rows(rows)[1])
            writer.write(scale_parts[-1].astype("<f4"))
        else:
            writer.write(quantise_rows(rows, scales[source][begin:end])[0])
    if kind == "scale":
        scales[source] = np.concatenate(scale_parts)


def write_artifact(ckpt, path: str, plan: dict, metadata: dict, progress=None) -> tuple[str, int]:
    """Stream the planned artifact to path (a fresh file renamed over it when complete):
    (sha256, bytes)."""
    prefix, order = safetensors_layout({n: (d, s) for n, (d, s, _, _) in plan.items()}, metadata)
    # every .scale (F32) precedes its .q8 (I8) in the layout; scales are kept (4 bytes a row)
    scales: dict = {}
    total = len(prefix) + sum(nbytes for *_, nbytes in order)
    with replacing(path, "wb") as f:
        writer = _HashingWriter(f, path)
        writer.write(prefix)
        for i, (name, _, _, nbytes) in enumerate(order):
            _, _, source, kind = plan[name]
            before = writer.bytes
            _produce(ckpt, writer, kind, source, scales)
            if writer.bytes - before != nbytes:
                raise ExactSpecError(E_MODEL_LOAD, f"{name}: wrote {writer.bytes - before} bytes, "
                                     f"the header declares {nbytes}")
            if progress:
                progress(i + 1, len(order), writer.bytes, total)
    return writer.sha.hexdigest(), writer.bytes


def _read_small_files(src: str) -> dict:
    """The identity files (required) and the optional ones present: name -> bytes."""
    files = {}
    for name in (*FILES, *OPTIONAL_FILES):
        path = os.path.join(src, name)
        if name not in FILES and not os.path.exists(path):
            continue
        data = read_regular_file(path, max_bytes=MAX_MODEL_JSON_BYTES) if os.path.exists(path) else None
        if data is None:
            raise ExactSpecError(E_MODEL_LOAD, f"{path}: file not found (convert needs {', '.join(FILES)})")
        files[name] = data
    return files


def _is_source_itself(src: str, dst: str, name: str) -> bool:
    """DST/name is SRC/name (convert in place, or a link to the source): left as it is."""
    out, path = os.path.join(dst, name), os.path.join(src, name)
    return os.path.exists(out) and os.path.exists(path) and os.path.samefile(path, out)


def _make_staging(dst: str) -> str:
    try:
        return tempfile.mkdtemp(prefix=".exactspec-convert-", dir=dst)
    except OSError as e:
        raise ExactSpecError(E_IO, f"{dst}: cannot write ({e.strerror or e})") from None


ROLES = {"champion": Q8_WEIGHTS_FILE, "draft": WEIGHTS_FILE}   # the artifact each role runs in the browser


def convert(src, dst, progress=None, role: str = "champion", q8_embedding: bool = False) -> dict:
    """Convert folder src into dst (created if missing). Returns the exactspec_model.json object
    plus "seconds". role "champion" writes model.q8.safetensors (the WebGPU/WASM champion's
    artifact), "draft" an all-F32 model.safetensors (the WASM draft's), streamed alike;
    q8_embedding (champion only) stores the embedding as q8 too (4x smaller at real vocabularies).
    progress(done_tensors, tensors, done_bytes, total_bytes) is called after each tensor."""
    src, dst = os.fspath(src), os.fspath(dst)
    started = time.perf_counter()
    if role not in ROLES:
        raise ExactSpecError(E_BAD_ARGUMENT, f"role must be one of {sorted(ROLES)}, got {role!r}")
    if q8_embedding and role != "champion":
        raise ExactSpecError(E_BAD_ARGUMENT, "--q8-embedding applies to the champion's q8 artifact only")
    artifact = ROLES[role]
    src_weights, dst_weights = os.path.join(src, WEIGHTS_FILE), os.path.join(dst, WEIGHTS_FILE)
    if (role == "draft" and os.path.exists(src_weights) and os.path.exists(dst_weights)
            and os.path.samefile(src_weights, dst_weights)):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{dst}: converting a draft in place would overwrite the "
                             f"{WEIGHTS_FILE} it reads; give another DST")
    config, _ = load_config(src)
    hp = _parse_config(config, os.path.join(src, CONFIG_FILE))
    refuse_link(dst)
    created = not os.path.lexists(dst)
    try:
        os.makedirs(dst, exist_ok=True)
    except OSError as e:
        raise ExactSpecError(E_IO, f"{dst}: cannot create the folder ({e.strerror or e})") from None
    try:
        return _convert_into(src, dst, artifact, hp, progress, role, q8_embedding, started)
    except BaseException:
        if created:   # leave no empty folder behind a failed convert
            with contextlib.suppress(OSError):
                os.rmdir(dst)
        raise


def _convert_into(src: str, dst: str, artifact: str, hp: dict, progress, role: str, q8_embedding: bool,
                  started: float) -> dict:
    """Everything is written to a staging folder in DST, then renamed into DST at the end."""
    with open_checkpoint(src) as ckpt:
        header = ckpt.header()
        _check_header(header, hp, ckpt.index_path or ckpt.files[0], quantised=False, role=role)
        check_restricted_checkpoint(ckpt.read_bytes, header, hp["vocab_size"], ckpt.index_path or ckpt.files[0])
        files = _read_small_files(src)
        # the identity (tokenizer parsed, ids resolved) before the long write; its run_weights_*
        # fields are filled in once the artifact's digest is known
        identity = model_identity_from_files(files, {artifact: ("0" * 64, 0)}, source=src, run_weights=artifact)
        to_copy = [name for name in files if not _is_source_itself(src, dst, name)]
        for name in (*to_copy, artifact, MODEL_FILE):   # before the long write: never write through a link
            refuse_link(os.path.join(dst, name))
        metadata = dict(ckpt.metadata)
        metadata.pop("quantization", None)
        if RUN_WEIGHTS_SCHEMES[artifact][1] is not None:
            metadata["quantization"] = RUN_WEIGHTS_SCHEMES[artifact][1]
        plan = plan_outputs(header, hp["tie_word_embeddings"], quantise=role == "champion",
                            q8_embedding=q8_embedding)
        staging = _make_staging(dst)
        try:
            for name in to_copy:
                write_file(os.path.join(staging, name), files[name])
            sha, nbytes = write_artifact(ckpt, os.path.join(staging, artifact), plan,
                                         dict(sorted(metadata.items())), progress)
            entry = _model_entry(files, identity, hp, dst, artifact, sha, nbytes)
            write_file(os.path.join(staging, MODEL_FILE), json.dumps(entry, indent=2) + "\n")
            move_into_place(staging, dst, (*to_copy, artifact, MODEL_FILE))   # the model file last
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    entry["seconds"] = round(time.perf_counter() - started, 3)   # not in the file: it stays deterministic
    return entry


def _model_entry(files: dict, identity: dict, hp: dict, dst: str, artifact: str, sha: str, nbytes: int) -> dict:
    """The exactspec_model.json object."""
    identity.update(run_weights_sha256=sha, run_weights_bytes=nbytes)
    if artifact == WEIGHTS_FILE:
        identity.update(weights_sha256=sha, weights_bytes=nbytes)
    listed = [{"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
              for name, data in files.items()] + [{"path": artifact, "bytes": nbytes, "sha256": sha}]
    entry = {
        "files": sorted(listed, key=lambda e: e["path"]),
        "model": {"dir": os.path.basename(os.path.normpath(dst)), "hidden_size": hp["hidden_size"],
                  "num_hidden_layers": hp["num_layers"],
                  "run_artifact": {"file": artifact, "sha256": sha, "bytes": nbytes,
                                   "quantization": run_weights_scheme(artifact)}},
        "identity": identity,
    }
    return entry

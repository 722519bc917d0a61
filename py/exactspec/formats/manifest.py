"""Champion/draft compatibility: what must be identical for exact speculative decoding.

Exactness needs both models to speak the same token language: the draft proposes token ids
that the champion scores, so ids, the text they stand for, the prompt they were given (chat
template, special tokens) and where generation stops must mean the same thing on both sides.
Weights, sizes, context length and RoPE may differ: the draft is only a proposal that the
champion's own distribution accepts or corrects, and no KV cache is ever shared. Those are
recorded in the manifest but never refused.

Two manifests meet here: the pair manifest (check_pair_identities: what the pair shares and
where it differs) and web/models/manifest.json, the list of served files with their sha256
and the artifact each model runs (check_served_files, check_run_artifact). Pure Python
(hashlib, json); runs in Pyodide: everything except the directory wrappers at the end works on
bytes and digests in memory, and check_served_pair is the browser's whole load-time check.
"""
from __future__ import annotations

import hashlib
import json
import os

from .config import load_json_bounded, open_regular_file, read_regular_file
from ..core.errors import E_BAD_ARGUMENT, E_MANIFEST_MISMATCH, E_MODEL_LOAD, ExactSpecError
from .tokenizer import Tokenizer

MANIFEST_VERSION = 1
with open(os.path.join(os.path.dirname(__file__), "model_files.json"), encoding="utf-8") as _f:
    MODEL_FILE_TABLE = json.load(_f)     # the one table of a folder's files, JS reads it too
FILES = tuple(MODEL_FILE_TABLE["required"])
(CHAT_TEMPLATE_FILE,) = MODEL_FILE_TABLE["optional"]   # transformers' own file; wins over tokenizer_config's
RUN_ARTIFACT = dict(MODEL_FILE_TABLE["run_artifact"])  # role -> the weights file it runs
WEIGHTS_FILE = RUN_ARTIFACT["draft"]                    # model.safetensors (all F32 for a draft)
Q8_WEIGHTS_FILE = RUN_ARTIFACT["champion"]              # model.q8.safetensors
SHARDED_WEIGHTS_FILE = "model.safetensors.index.json"   # a sharded checkpoint, run as published
MAX_MODEL_JSON_BYTES = 256 << 20     # tokenizer.json of a real model is a few MB

# Run artifact (the weights file a backend actually runs) -> (quantisation scheme name, the
# safetensors "__metadata__" "quantization" string that file must carry, None = no such key).
# The scheme is derived from the file name (the browser passes only hashes); the CPython
# directory path also reads the file's header and refuses a metadata that disagrees.
RUN_WEIGHTS_SCHEMES = {
    WEIGHTS_FILE: ("f32", None),
    Q8_WEIGHTS_FILE: ("q8-sym-row-v1", "int8 symmetric per output row; w = q8 * scale[:,None]"),
    SHARDED_WEIGHTS_FILE: ("f32", None),   # digest: exactspec.reference.hf.checkpoint_digest
}

# Fields that must be identical (in this order of reporting).
MUST_MATCH = (
    "tokenizer_sha256", "tokenizer_vocab_size", "config_vocab_size", "token_map_sha256",
    "added_tokens", "merges_sha256", "model_options_sha256", "normalizer_sha256",
    "pre_tokenizer_sha256", "post_processor_sha256", "decoder_sha256", "tokenizer_flags",
    "chat_template_sha256", "bos_token_id", "eos_token_id", "pad_token_id", "stop_token_ids",
)
# A GGUF holds no tokenizer.json: its tokenizer is rebuilt from the metadata (gguf_tokenizer), so
# the bytes of that JSON are ours, not the model's. Every field of what the bytes mean is compared.
GGUF_PAIR_FIELDS = tuple(field for field in MUST_MATCH if field != "tokenizer_sha256")
# Recorded, allowed to differ.
MAY_DIFFER = (
    "weights_sha256", "weights_bytes", "run_weights_file", "run_weights_sha256", "run_weights_bytes",
    "quantization", "model_type", "architectures", "hidden_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "max_position_embeddings", "model_max_length", "rope_theta", "rope_scaling", "torch_dtype",
    "tie_word_embeddings",
)
# tokenizer_config.json switches that change the ids or text transformers would produce.
_TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token", "clean_up_tokenization_spaces",
                    "add_prefix_space", "legacy")
_HEX = frozenset("0123456789abcdef")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_json(value) -> str:
    return sha256_bytes(canonical_json(value))


def is_sha256_hex(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def is_byte_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


GGUF_SCHEME = "gguf"   # a .gguf file runs its own blocks; its digest is the file's sha256


def is_gguf_file(path) -> bool:
    """A model given as one file (a GGUF) rather than a folder: what the command line's
    --champion/--draft and check_pair tell apart (a folder, or a path that is neither, is a folder)."""
    return os.path.isfile(path)


def run_weights_scheme(run_weights: str, where: str = "") -> str:
    """The quantisation scheme name of a run artifact, by file name (RUN_WEIGHTS_SCHEMES; any
    name ending in .gguf is GGUF_SCHEME)."""
    if run_weights.endswith(".gguf"):
        return GGUF_SCHEME
    if run_weights not in RUN_WEIGHTS_SCHEMES:
        raise ExactSpecError(E_MODEL_LOAD, f"{where or run_weights}: no quantisation scheme is known for "
                             f"a run artifact named {run_weights!r} (known: {sorted(RUN_WEIGHTS_SCHEMES)})")
    return RUN_WEIGHTS_SCHEMES[run_weights][0]


def check_weights_metadata(run_weights: str, metadata: dict, where: str) -> None:
    """E_MODEL_LOAD unless a run artifact's safetensors metadata states its scheme's quantisation."""
    scheme = run_weights_scheme(run_weights, where)
    expected, found = RUN_WEIGHTS_SCHEMES[run_weights][1], metadata.get("quantization")
    if found != expected:
        raise ExactSpecError(E_MODEL_LOAD, f"{where}: safetensors metadata 'quantization' is {found!r}, "
                             f"but scheme {scheme!r} (from the file name) needs {expected!r}")


# ---------------------------------------------------------------------------------------------
# Identity from in-memory files (browser and CPython alike)
# ---------------------------------------------------------------------------------------------


def _where(source: str, name: str) -> str:
    return f"{source}{'' if source.endswith('/') else '/'}{name}" if source else name


def _parse_json_object(raw: bytes, where: str) -> dict:
    # the bounded loader: size, depth, NaN/Infinity and overflow refused, all E_MODEL_LOAD
    value = load_json_bounded(raw, max_bytes=MAX_MODEL_JSON_BYTES, source=where)
    if not isinstance(value, dict):
        raise ExactSpecError(E_MODEL_LOAD, f"{where}: not a JSON object")
    return value


def _token_content(value):
    """tokenizer_config tokens are a string, an AddedToken-like object, or null."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _as_id_list(value, where: str, key: str) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise ExactSpecError(E_MODEL_LOAD, f"{where}: {key} must be a token id or a list of ids")
    return sorted(set(items))


def _file_bytes(files: dict, name: str, where: str, required: bool = True):
    data = files.get(name)
    if data is None:
        if required:
            raise ExactSpecError(E_MODEL_LOAD, f"{where}: file not found")
        return None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{where}: contents must be bytes, got {type(data).__name__}")
    return bytes(data)


def _weights_digest(weights: dict, name: str, where: str):
    """(sha256 hex, byte count) the caller computed for a weights file, or None if not given."""
    entry = weights.get(name)
    if entry is None:
        return None
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2
            and is_sha256_hex(entry[0]) and is_byte_count(entry[1])):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{where}: weights digest must be (lowercase sha256 hex, "
                             f"byte count), got {entry!r}")
    return entry[0], entry[1]


def chat_template_of(tok_config: dict, jinja: bytes | None, where: str = CHAT_TEMPLATE_FILE):
    """The chat template as transformers takes it: chat_template.jinja's text when the folder has
    that file (it wins over tokenizer_config.json's entry), else tokenizer_config's chat_template
    (a string, a list of named templates, or None)."""
    if jinja is None:
        return tok_config.get("chat_template")
    try:
        return jinja.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExactSpecError(E_MODEL_LOAD, f"{where}: not UTF-8 text (byte {e.start})") from None


def model_identity_from_files(files: dict, weights: dict, *, source: str,
                              run_weights: str = Q8_WEIGHTS_FILE) -> dict:
    """Everything that identifies a model's token language and shape, hashed where large.

    files: name -> bytes for config.json, tokenizer.json, tokenizer_config.json,
    generation_config.json and optionally chat_template.jinja (other names are ignored).
    weights: weights file name -> (sha256 hex, byte count), computed by the caller over the
    bytes it runs; must hold run_weights, may hold model.safetensors (weights_sha256 and
    weights_bytes are None without it). source names the model in error messages
    ("champion", a directory); it is not part of the result.
    """
    if not isinstance(files, dict) or not isinstance(weights, dict):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{source}: files and weights must be dicts")
    where = {name: _where(source, name) for name in (*FILES, CHAT_TEMPLATE_FILE, WEIGHTS_FILE, run_weights)}
    config = _parse_json_object(_file_bytes(files, "config.json", where["config.json"]), where["config.json"])
    tok_raw = _file_bytes(files, "tokenizer.json", where["tokenizer.json"])
    tok_spec = _parse_json_object(tok_raw, where["tokenizer.json"])
    tok_config = _parse_json_object(_file_bytes(files, "tokenizer_config.json", where["tokenizer_config.json"]),
                                    where["tokenizer_config.json"])
    gen_config = _parse_json_object(_file_bytes(files, "generation_config.json", where["generation_config.json"]),
                                    where["generation_config.json"])
    try:
        tokenizer = Tokenizer(tok_spec)
    except ExactSpecError as e:
        raise ExactSpecError(e.code, f"{where['tokenizer.json']}: {e.message}") from None

    model = tok_spec["model"]
    token_map = [[i, tokenizer.id_to_token(i)] for i in range(tokenizer.vocab_size)]
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model.get("merges", [])]
    model_options = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    added = [{k: t.get(k) for k in ("id", "content", "special", "single_word", "lstrip", "rstrip", "normalized")}
             for t in tok_spec.get("added_tokens") or []]

    chat_template = chat_template_of(tok_config, _file_bytes(files, CHAT_TEMPLATE_FILE, where[CHAT_TEMPLATE_FILE],
                                                            required=False), where[CHAT_TEMPLATE_FILE])

    def token_id(key: str):
        content = _token_content(tok_config.get(key))
        if content is None:
            return config.get(key + "_id")
        i = tokenizer.token_to_id(content)
        if i is None:
            raise ExactSpecError(E_MODEL_LOAD, f"{where['tokenizer_config.json']}: {key} {content!r} "
                                 "is not in the vocabulary")
        return i

    scheme = run_weights_scheme(run_weights, where[run_weights])
    run_digest = _weights_digest(weights, run_weights, where[run_weights])
    if run_digest is None:
        raise ExactSpecError(E_MODEL_LOAD, f"{where[run_weights]}: file not found")
    f32_digest = _weights_digest(weights, WEIGHTS_FILE, where[WEIGHTS_FILE]) or (None, None)

    config_vocab = config.get("vocab_size")
    if not isinstance(config_vocab, int) or isinstance(config_vocab, bool):
        raise ExactSpecError(E_MODEL_LOAD, f"{where['config.json']}: vocab_size missing or not an integer")

    identity = {
        "tokenizer_sha256": sha256_bytes(tok_raw),
        "tokenizer_vocab_size": tokenizer.vocab_size,
        "config_vocab_size": config_vocab,
        "token_map_sha256": sha256_json(token_map),
        "added_tokens": added,
        "merges_sha256": sha256_json(merges),
        "model_options_sha256": sha256_json(model_options),
        "normalizer_sha256": sha256_json(tok_spec.get("normalizer")),
        "pre_tokenizer_sha256": sha256_json(tok_spec.get("pre_tokenizer")),
        "post_processor_sha256": sha256_json(tok_spec.get("post_processor")),
        "decoder_sha256": sha256_json(tok_spec.get("decoder")),
        "tokenizer_flags": {k: tok_config.get(k) for k in _TOKENIZER_FLAGS},
        "chat_template_sha256": None if chat_template is None else sha256_json(chat_template),
        "bos_token_id": token_id("bos_token"),
        "eos_token_id": token_id("eos_token"),
        "pad_token_id": token_id("pad_token"),
        "stop_token_ids": _as_id_list(gen_config.get("eos_token_id"), where["generation_config.json"], "eos_token_id"),
        "weights_sha256": f32_digest[0],
        "weights_bytes": f32_digest[1],
        "run_weights_file": run_weights,
        "run_weights_sha256": run_digest[0],
        "run_weights_bytes": run_digest[1],
        "quantization": scheme,
        "model_max_length": tok_config.get("model_max_length"),
    }
    for key in MAY_DIFFER:
        if key not in identity:
            identity[key] = config.get(key)
    return identity


def _show(value) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12] + ".."
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def check_pair_identities(champion: dict, draft: dict, fields: tuple = MUST_MATCH) -> dict:
    """The pair's manifest, or E_MANIFEST_MISMATCH naming every field that must match and
    does not (the draft's output vocabulary must equal the champion's: both configs' vocab_size
    are equal, and at least the champion tokenizer's size; rows past the tokenizer's ids are
    vocabulary padding, which every request suppresses on both sides, Orchestrator n_token_ids).
    Arguments: identities from
    model_identity_from_files or load_model_identity; fields: those compared (a GGUF side has
    no tokenizer.json bytes of its own: GGUF_PAIR_FIELDS)."""
    problems = []
    for field in fields:
        if champion[field] != draft[field]:
            problems.append((field, f"field {field!r} differs: champion {_show(champion[field])} draft {_show(draft[field])}"))
    for side, ident in (("champion", champion), ("draft", draft)):
        if ident["config_vocab_size"] < champion["tokenizer_vocab_size"]:
            problems.append(("config_vocab_size",
                             f"field 'config_vocab_size' of {side} ({ident['config_vocab_size']}) is smaller than "
                             f"the tokenizer vocab size {champion['tokenizer_vocab_size']}"))

    if problems:
        fields = list(dict.fromkeys(f for f, _ in problems))
        raise ExactSpecError(E_MANIFEST_MISMATCH, "; ".join(m for _, m in problems), fields=fields)
    return {
        "manifest_version": MANIFEST_VERSION,
        "shared": {field: champion[field] for field in fields},
        "champion": {field: champion[field] for field in MAY_DIFFER},
        "draft": {field: draft[field] for field in MAY_DIFFER},
        "differs": [field for field in MAY_DIFFER if champion[field] != draft[field]],
    }


# ---------------------------------------------------------------------------------------------
# Served files against web/models/manifest.json (browser load)
# ---------------------------------------------------------------------------------------------

FILES_MANIFEST = "web/models/manifest.json"     # how messages name it
FILES_MANIFEST_VERSION = 2                       # 2 added models.<role>.run_artifact


def _malformed(problem: str):
    raise ExactSpecError(E_MODEL_LOAD, f"{FILES_MANIFEST}: {problem}")


def _check_model_entry(role: str, info, listed: dict) -> None:
    if not isinstance(info, dict) or not isinstance(info.get("dir"), str) or not info["dir"]:
        _malformed(f"models.{role} is not an object with a non-empty 'dir'")
    artifact = info.get("run_artifact")
    if not (isinstance(artifact, dict) and isinstance(artifact.get("file"), str)
            and is_sha256_hex(artifact.get("sha256")) and is_byte_count(artifact.get("bytes"))):
        _malformed(f"models.{role}.run_artifact is not {{file, sha256 (lowercase hex), bytes, quantization}}")
    scheme = run_weights_scheme(artifact["file"], f"{FILES_MANIFEST}: models.{role}.run_artifact")
    if artifact.get("quantization") != scheme:
        _malformed(f"models.{role}.run_artifact quantization is {artifact.get('quantization')!r}, "
                   f"but {artifact['file']} is scheme {scheme!r}")
    path = f"{info['dir']}/{artifact['file']}"
    if listed.get(path) != (artifact["sha256"], artifact["bytes"]):
        _malformed(f"models.{role}.run_artifact does not repeat the listed sha256 and bytes of {path}")


def listed_files(manifest) -> dict:
    """Validate the shape of web/models/manifest.json (parsed); path -> (sha256, bytes) of
    every listed file. E_MODEL_LOAD naming the first malformed part."""
    if not isinstance(manifest, dict):
        _malformed("not a JSON object")
    if manifest.get("version") != FILES_MANIFEST_VERSION:
        _malformed(f"version is {manifest.get('version')!r}, expected {FILES_MANIFEST_VERSION}")
    entries = manifest.get("files")
    if not isinstance(entries, list):
        _malformed("'files' is not a list")
    listed = {}
    for i, entry in enumerate(entries):
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and entry["path"]
                and is_sha256_hex(entry.get("sha256")) and is_byte_count(entry.get("bytes"))):
            _malformed(f"files[{i}] is not {{path, sha256 (lowercase hex), bytes}}: {_show(entry)}")
        if entry["path"] in listed:
            _malformed(f"files lists {entry['path']!r} twice")
        listed[entry["path"]] = (entry["sha256"], entry["bytes"])
    if manifest.get("total_bytes") != sum(n for _, n in listed.values()):
        _malformed(f"total_bytes {manifest.get('total_bytes')!r} is not the sum of the listed bytes")
    models = manifest.get("models")
    if not isinstance(models, dict):
        _malformed("'models' is not an object")
    for role, info in models.items():
        _check_model_entry(role, info, listed)
    _check_drafts(manifest.get(DRAFTS_KEY, {}))
    return listed


DRAFTS_KEY = "drafts"   # champion weights sha256 -> {"dir": the draft folder made for it, "champion": a name}


def _check_drafts(drafts) -> None:
    if not isinstance(drafts, dict):
        _malformed(f"'{DRAFTS_KEY}' is not an object")
    for key, entry in drafts.items():
        if not is_sha256_hex(key):
            _malformed(f"{DRAFTS_KEY} key {_show(key)} is not a champion's sha256 (lowercase hex)")
        folder = entry.get("dir") if isinstance(entry, dict) else None
        if not (isinstance(folder, str) and folder and folder[0] != "." and "/" not in folder and "\\" not in folder):
            _malformed(f"{DRAFTS_KEY}[{key[:12]}..].dir is not a folder name beside the manifest")


def draft_for_champion(manifest, champion_sha256: str):
    """The folder name (beside the manifest) of the draft that the manifest's `drafts` entry binds
    to the champion whose weights have this sha256 (a GGUF: the file's), or None."""
    listed_files(manifest)
    entry = manifest.get(DRAFTS_KEY, {}).get(champion_sha256)
    return entry["dir"] if entry else None


def _model_entry(manifest, entry: str) -> tuple[dict, dict]:
    listed = listed_files(manifest)
    if entry not in manifest["models"]:
        _malformed(f"has no models.{entry} (has {sorted(manifest['models'])})")
    return listed, manifest["models"][entry]


def check_served_files(manifest: dict, entry: str, served: dict) -> None:
    """Refuse (E_MANIFEST_MISMATCH naming every such file) a served file of the model that
    web/models/manifest.json describes as models.<entry> (the folder it is served from: "champion",
    "draft", "smollm2-draft") and does not list as "<dir>/<name>" with the same sha256 and bytes.
    served: file name -> (sha256 hex, byte count) of the bytes actually fetched."""
    listed, info = _model_entry(manifest, entry)
    if not isinstance(served, dict):
        raise ExactSpecError(E_BAD_ARGUMENT, f"{entry}: served must be a dict of name -> (sha256, bytes)")
    problems = []
    for name in sorted(served):
        path = f"{info['dir']}/{name}"
        sha, nbytes = _weights_digest(served, name, path)
        want = listed.get(path)
        if want is None:
            problems.append((path, f"{path}: not listed in {FILES_MANIFEST}"))
        elif sha != want[0]:
            problems.append((path, f"{path}: sha256 differs from {FILES_MANIFEST} "
                                   f"(served {_show(sha)}, listed {_show(want[0])})"))
        elif nbytes != want[1]:
            problems.append((path, f"{path}: size differs from {FILES_MANIFEST} "
                                   f"(served {nbytes} bytes, listed {want[1]})"))
    if problems:
        raise ExactSpecError(E_MANIFEST_MISMATCH, "; ".join(m for _, m in problems),
                             files=[p for p, _ in problems])


def run_artifact(manifest: dict, entry: str) -> dict:
    """models.<entry>.run_artifact of a valid web/models/manifest.json: {file, sha256, bytes,
    quantization}, the weights file that model runs in the browser."""
    return dict(_model_entry(manifest, entry)[1]["run_artifact"])


def check_run_artifact(manifest: dict, entry: str, file: str, sha256: str, nbytes: int) -> str:
    """The quantisation scheme of the artifact the model of models.<entry> runs, or
    E_MANIFEST_MISMATCH when it is not the file, sha256 and size that its run_artifact binds."""
    _, info = _model_entry(manifest, entry)
    bound = info["run_artifact"]
    path = f"{info['dir']}/{bound['file']}"
    if file != bound["file"]:
        raise ExactSpecError(E_MANIFEST_MISMATCH, f"{entry} runs {info['dir']}/{file}, but {FILES_MANIFEST} "
                             f"models.{entry}.run_artifact binds {path}", files=[f"{info['dir']}/{file}"])
    sha256, nbytes = _weights_digest({file: (sha256, nbytes)}, file, path)
    if (sha256, nbytes) != (bound["sha256"], bound["bytes"]):
        raise ExactSpecError(E_MANIFEST_MISMATCH, f"{path}: the run artifact differs from {FILES_MANIFEST} "
                             f"models.{entry}.run_artifact (run sha256 {_show(sha256)} {nbytes} bytes, "
                             f"bound {_show(bound['sha256'])} {bound['bytes']} bytes)", files=[path])
    return bound["quantization"]


def check_served_model(manifest: dict, entry: str, served: dict) -> str:
    """check_served_files, then the run artifact models.<entry> binds must have been served and be
    that file (check_run_artifact); returns the run artifact's file name."""
    check_served_files(manifest, entry, served)
    _, info = _model_entry(manifest, entry)
    bound = info["run_artifact"]
    if bound["file"] not in served:
        raise ExactSpecError(E_BAD_ARGUMENT, f"{info['dir']}/{bound['file']}: the run artifact that "
                             f"{FILES_MANIFEST} binds was not among the served files")
    check_run_artifact(manifest, entry, bound["file"], *served[bound["file"]])
    return bound["file"]


def check_served_pair(manifest: dict, champion_files: dict, champion_served: dict,
                      draft_files: dict, draft_served: dict, entries: dict | None = None) -> dict:
    """The browser's whole load-time check; returns the pair manifest (check_pair_identities).

    Per role: the served model checks against its models.<entry> (check_served_model); entries:
    role -> the entry, the folder each model is served from (default: the role's name, the toy
    pair's folders); the bytes in *_files (name -> bytes: config.json, tokenizer.json,
    tokenizer_config.json, generation_config.json) are the served bytes; then the identities,
    computed from those bytes and the served digests, must agree on every MUST_MATCH field.
    """
    entries = entries or {"champion": "champion", "draft": "draft"}
    identities = {}
    for role, files, served in (("champion", champion_files, champion_served),
                                ("draft", draft_files, draft_served)):
        entry = entries[role]
        run_file = check_served_model(manifest, entry, served)
        folder = manifest["models"][entry]["dir"]
        if not isinstance(files, dict):
            raise ExactSpecError(E_BAD_ARGUMENT, f"{role}: files must be a dict of name -> bytes")
        for name in sorted(files):
            path = f"{folder}/{name}"
            data = _file_bytes(files, name, path)
            if name not in served:
                raise ExactSpecError(E_BAD_ARGUMENT, f"{path}: given as file contents but not among the served files")
            if sha256_bytes(data) != served[name][0]:
                raise ExactSpecError(E_MANIFEST_MISMATCH, f"{path}: the contents given differ from the served "
                                     f"bytes (sha256 {_show(sha256_bytes(data))}, served {_show(served[name][0])})",
                                     files=[path])
        identities[role] = model_identity_from_files(files, served, source=folder, run_weights=run_file)
    return check_pair_identities(identities["champion"], identities["draft"])


# ---------------------------------------------------------------------------------------------
# Directory wrappers (CPython reference path)
# ---------------------------------------------------------------------------------------------


def sha256_file(path: str) -> tuple[str, int]:
    """(sha256, bytes) of a regular file (a FIFO or device is refused, never read), its declared
    size exactly."""
    h = hashlib.sha256()
    f, size = open_regular_file(path)
    done = 0
    try:
        with f:
            while done < size:
                chunk = f.read(min(1 << 20, size - done))
                if not chunk:
                    break
                h.update(chunk)
                done += len(chunk)
    except OSError as e:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: cannot read ({e.strerror or e})") from None
    if done != size:
        raise ExactSpecError(E_MODEL_LOAD, f"{path}: shrank while read ({done} of {size} bytes)")
    return h.hexdigest(), size


def _read_bytes(path: str) -> bytes:
    return read_regular_file(path, max_bytes=MAX_MODEL_JSON_BYTES)


def load_model_identity(model_dir: str, run_weights: str = WEIGHTS_FILE) -> dict:
    """model_identity_from_files over a directory's files, plus "model_dir"; the run artifact's
    safetensors header must also state its scheme's quantisation (check_weights_metadata)."""
    files = {name: _read_bytes(os.path.join(model_dir, name))
             for name in (*FILES, CHAT_TEMPLATE_FILE) if os.path.exists(os.path.join(model_dir, name))}
    weights = {}
    run_path = os.path.join(model_dir, run_weights)
    if (run_weights == WEIGHTS_FILE and not os.path.exists(run_path)
            and os.path.exists(os.path.join(model_dir, SHARDED_WEIGHTS_FILE))):
        from ..reference.hf import checkpoint_digest, open_checkpoint   # shards: the index and each shard's hash
        run_weights, run_path = SHARDED_WEIGHTS_FILE, os.path.join(model_dir, SHARDED_WEIGHTS_FILE)
        with open_checkpoint(model_dir) as ckpt:
            weights[run_weights] = checkpoint_digest(ckpt)
    elif os.path.exists(run_path):   # streamed: a weights file may be larger than memory allows
        weights[run_weights] = sha256_file(run_path)
    f32_path = os.path.join(model_dir, WEIGHTS_FILE)
    if run_weights != WEIGHTS_FILE and os.path.exists(f32_path):
        weights[WEIGHTS_FILE] = sha256_file(f32_path)
    identity = model_identity_from_files(files, weights, source=model_dir, run_weights=run_weights)
    if run_weights != SHARDED_WEIGHTS_FILE:   # (each shard's header is checked when it is opened)
        from .safetensors import read_header   # here: only the CPython checks read headers
        check_weights_metadata(run_weights, read_header(run_path)[1], run_path)
    return {"model_dir": os.path.abspath(model_dir), **identity}


def load_gguf_identity(path: str) -> dict:
    """model_identity_from_files for a GGUF file, plus "model_dir" (the file): the files a Hugging
    Face folder would hold, as the GGUF's metadata implies them (config.json from gguf_model,
    tokenizer.json the canonical JSON of the rebuilt tokenizer, tokenizer_config.json with the
    chat template, generation_config.json with the stop ids); the run artifact is the file itself."""
    from .gguf_model import GGUFModel          # CPython only
    from .gguf_tokenizer import stop_token_ids, tokenizer_config, tokenizer_spec
    with GGUFModel(path) as model:
        files = {"config.json": canonical_json(model.config),
                 "tokenizer.json": canonical_json(tokenizer_spec(model.file)),
                 "tokenizer_config.json": canonical_json(tokenizer_config(model.file)),
                 "generation_config.json": canonical_json({"eos_token_id": list(stop_token_ids(model.file))})}
    name = os.path.basename(path)
    identity = model_identity_from_files(files, {name: sha256_file(path)}, source=path, run_weights=name)
    return {"model_dir": os.path.abspath(path), **identity}


def load_identity(path: str, run_weights: str = WEIGHTS_FILE) -> dict:
    """load_gguf_identity of a file, load_model_identity of a folder."""
    return load_gguf_identity(path) if is_gguf_file(path) else load_model_identity(path, run_weights=run_weights)


def check_pair(champion: str, draft: str, champion_run_weights: str = WEIGHTS_FILE) -> dict:
    """check_pair_identities of two models, each a folder or a GGUF file; a folder champion's
    identity names the weights file it runs (the CLI's default is model.q8.safetensors, the
    browser's artifact), a folder draft runs model.safetensors (f32) on both paths."""
    fields = GGUF_PAIR_FIELDS if is_gguf_file(champion) or is_gguf_file(draft) else MUST_MATCH
    try:
        return check_pair_identities(load_identity(champion, champion_run_weights), load_identity(draft), fields)
    except ExactSpecError as e:
        if e.code != E_MANIFEST_MISMATCH:
            raise
        raise ExactSpecError(e.code, f"draft {draft} does not pair with champion {champion}: {e.message}",
                             **e.detail) from None

"""The browser's load-time model checks, run in Pyodide over the bytes the worker fetched (web/orchestrator/model_check.mjs).

check_models runs every config.json through the one config validator (formats/config.py) before
any weight loads, and hands the loaders its result; after they loaded, it checks the served files
and run artifacts against the manifest and the pair's identities, as under CPython. check_gguf
reads a GGUF file's header into the config and model files it implies. Nothing raises across
the boundary: each returns JSON {"ok": ...} or {"error": {code, message}}.
"""
from __future__ import annotations

import dataclasses
import json

from ..core.errors import E_INTERNAL, ExactSpecError, coded_error
from ..formats.manifest import FILES as MODEL_FILES, MODEL_FILE_TABLE, RUN_ARTIFACT as DEFAULT_RUN_WEIGHTS

OPTIONAL_MODEL_FILES = tuple(MODEL_FILE_TABLE["optional"])    # passed when the folder has them


def model_files() -> str:
    """formats/model_files.json as JSON text: the worker's model check reads its file names here."""
    return json.dumps(MODEL_FILE_TABLE)


def check_models(spec_json: str, get_file) -> str:
    """The browser's load-time checks, run in Pyodide over the bytes the page fetched.

    spec: {"roles": ["champion"(, "draft")], "manifest": web/models/manifest.json or null,
           "entries": {role: the manifest's models entry that role is checked against, the folder
           it is served from ("draft", "smollm2-draft"), or null: not under the manifest (a GGUF
           champion)} (default: each role's own name),
           "served": {role: {name: [sha256 (WebCrypto), bytes]}} (run artifacts included, or
           absent for the first stage), "run_weights": {role: run artifact name} (optional: a GGUF
           champion's file name), "gguf_pair": true when a side is a GGUF (its tokenizer.json is
           rebuilt, so manifest.GGUF_PAIR_FIELDS are compared)}; get_file("role/name") ->
           Uint8Array of a MODEL_FILES file (a GGUF champion's: check_gguf's files), or of the
           OPTIONAL_MODEL_FILES files listed in spec "optional": {role: [name, ...]} (those the
           folder has).
    Stage 1 (no "served"): every config.json through the one config validator (the reference
    loader's), so both paths refuse the same files with the same code, before any weights load;
    a chat_template.jinja that is not UTF-8 is refused there too. Its LlamaConfig, as a plain
    object per role ("validated_configs"), is what the champion and draft loaders receive
    (web/formats/model_config.mjs maps it onto kernel arguments): no JS parses config.json again.
    Stage 2: each listed role's served files against the manifest (when there is one), its run
    artifact against models.<entry>.run_artifact, and the pair's identities over the same fields
    as under CPython.
    Returns JSON {"ok": summary, "validated_configs": {role: LlamaConfig fields}} or
    {"error": {code, message}}: nothing raises across the boundary."""
    from ..formats.config import load_json_bounded, validate_config
    from ..formats.manifest import (CHAT_TEMPLATE_FILE, GGUF_PAIR_FIELDS, MUST_MATCH, chat_template_of, check_pair_identities,
                           check_served_model, check_served_pair, model_identity_from_files)
    try:
        spec = json.loads(spec_json)
        roles = spec["roles"]
        files = {role: {name: bytes(get_file(f"{role}/{name}").to_bytes()) for name in MODEL_FILES} for role in roles}
        for role in roles:
            for name in spec.get("optional", {}).get(role, ()):
                if name not in OPTIONAL_MODEL_FILES:
                    raise ExactSpecError(E_INTERNAL, f"{role}/{name}: not an optional model file")
                files[role][name] = bytes(get_file(f"{role}/{name}").to_bytes())
            if CHAT_TEMPLATE_FILE in files[role]:
                chat_template_of({}, files[role][CHAT_TEMPLATE_FILE], f"{role}/{CHAT_TEMPLATE_FILE}")
        configs = {role: validate_config(load_json_bounded(files[role]["config.json"], source=f"{role}/config.json"),
                                         source=f"{role}/config.json") for role in roles}
        summary = {"configs": {role: {"layers": c.num_hidden_layers, "hidden": c.hidden_size} for role, c in configs.items()}}
        validated = {role: dataclasses.asdict(c) for role, c in configs.items()}
        served = spec.get("served")
        if served is None:
            return json.dumps({"ok": summary, "validated_configs": validated})
        served = {role: {name: (d[0], d[1]) for name, d in served[role].items()} for role in roles}
        manifest = spec.get("manifest")
        entries = spec.get("entries") or {role: role for role in roles}
        listed = [role for role in roles if manifest is not None and entries.get(role)]
        if len(listed) == 2:
            pair = check_served_pair(manifest, files["champion"], served["champion"], files["draft"], served["draft"],
                                     entries=entries)
        else:   # one role (a GGUF champion, or the draft failed to load) or none under the manifest
            run = {role: check_served_model(manifest, entries[role], served[role]) for role in listed}
            named = spec.get("run_weights") or {}
            for role in roles:
                run.setdefault(role, named.get(role, DEFAULT_RUN_WEIGHTS[role]))
            ids = {role: model_identity_from_files(files[role], served[role], source=role, run_weights=run[role])
                   for role in roles}
            fields = GGUF_PAIR_FIELDS if spec.get("gguf_pair") else MUST_MATCH
            pair = check_pair_identities(ids["champion"], ids["draft"], fields) if len(roles) == 2 else None
        summary["manifest_checked"] = bool(listed)
        summary["pair_checked"] = pair is not None
        summary["differs"] = pair["differs"] if pair else []
        return json.dumps({"ok": summary, "validated_configs": validated})
    except Exception as exc:
        return json.dumps({"error": coded_error(exc, E_INTERNAL, "model check").to_dict()})


def check_gguf(prefix, size: int, label: str) -> str:
    """The browser's load-time check of a GGUF champion, in Pyodide, over the bytes before its data
    section (the page reads no weights for it): gguf.py's container checks against the file's
    `size`, gguf_model's config (validated as any config.json) and tensor table, and the tokenizer
    rebuilt from tokenizer.ggml.*. Returns JSON {"ok": {"files", "summary"}} where files
    are the four MODEL_FILES the file implies, as manifest.load_gguf_identity writes them (canonical
    JSON text: the same identities as under CPython), or {"error": {code, message}}."""
    from ..formats.gguf import GGUFFile
    from ..formats.gguf_model import GGUFModel
    from ..formats.gguf_tokenizer import load_tokenizer, stop_token_ids, tokenizer_config, tokenizer_spec
    from ..formats.manifest import canonical_json
    try:
        raw = bytes(prefix.to_bytes()) if hasattr(prefix, "to_bytes") else bytes(prefix)
        model = GGUFModel(label, file=GGUFFile.from_header(raw, int(size), label))
        load_tokenizer(model.file)                         # its own refusals, named, before any weight is read
        files = {"config.json": model.config, "tokenizer.json": tokenizer_spec(model.file),
                 "tokenizer_config.json": tokenizer_config(model.file),
                 "generation_config.json": {"eos_token_id": list(stop_token_ids(model.file))}}
        c = model.llama_config
        return json.dumps({"ok": {
            "files": {name: canonical_json(v).decode("utf-8") for name, v in files.items()},
            "summary": {"gguf": {"architecture": model.architecture, "tensors": len(model.file.tensors),
                                 "layers": c.num_hidden_layers, "hidden": c.hidden_size}}}})
    except Exception as exc:
        return json.dumps({"error": coded_error(exc, E_INTERNAL, "GGUF check").to_dict()})

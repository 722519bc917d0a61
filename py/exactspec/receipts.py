"""Privacy-safe receipt (spec: "Privacy-safe receipt"): identities, counts, timings, codes.

Never contains prompt or output text, token ids, decoded strings, paths or model bytes.
The seed appears only as a salted commitment. `ALLOWED_FIELDS` is the whole schema.
"""
from __future__ import annotations

import hashlib
import json
import platform
import secrets
import sys

RECEIPT_VERSION = "exactspec-receipt-1"
POSITION_POLICY = "positions-contiguous-from-0-v1"

ALLOWED_FIELDS = (
    "receipt_version", "request_nonce", "champion_artifact_hash", "draft_artifact_hash",
    "tokenizer_hash", "chat_template_hash", "adapter_chain_hash", "sampling_policy_hash",
    "grammar_hash", "position_policy_hash", "scheduler_policy_hash", "hardware_class",
    "runtime_version", "seed_commitment", "target_call_count", "draft_call_count",
    "proposal_count", "accepted_count_histogram", "rejection_position_histogram",
    "timing_ms", "peak_resident_bytes", "bounded_numeric_errors", "failure_code", "fallback_code",
)


def sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def peak_resident_bytes() -> dict:
    """Peak RSS of this process, the only byte category the reference backend can measure."""
    try:
        import resource
        return {"process_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    except (ImportError, OSError):
        return {"process_peak_rss": None}


def build_receipt(*, identities: dict, policy_canonical: dict, scheduler: dict, seed: int,
                  stats: dict, timing_ms: dict, failure_code, fallback_code) -> dict:
    nonce = secrets.token_hex(16)
    grammar = policy_canonical.get("grammar")
    receipt = {
        "receipt_version": RECEIPT_VERSION,
        "request_nonce": nonce,
        "champion_artifact_hash": identities.get("champion", "unknown"),
        "draft_artifact_hash": identities.get("draft", "none"),
        "tokenizer_hash": identities.get("tokenizer", "unknown"),
        "chat_template_hash": identities.get("chat_template", "none"),
        "adapter_chain_hash": "none",
        "sampling_policy_hash": sha256_json(policy_canonical),
        "grammar_hash": sha256_json(grammar) if grammar is not None else "none",
        "position_policy_hash": hashlib.sha256(POSITION_POLICY.encode()).hexdigest(),
        "scheduler_policy_hash": sha256_json(scheduler),
        "hardware_class": f"{platform.system().lower()}-{platform.machine().lower()}",
        "runtime_version": f"{'pyodide' if sys.platform == 'emscripten' else 'cpython'}-{sys.version_info.major}.{sys.version_info.minor}",
        "seed_commitment": hashlib.sha256(f"{nonce}:{seed}".encode()).hexdigest(),
        "target_call_count": stats["target_calls"],
        "draft_call_count": stats["draft_calls"],
        "proposal_count": stats["proposed"],
        "accepted_count_histogram": list(stats["accepted_count_histogram"]),
        "rejection_position_histogram": list(stats["rejection_position_histogram"]),
        "timing_ms": {k: round(v, 3) for k, v in timing_ms.items()},
        "peak_resident_bytes": peak_resident_bytes(),
        "bounded_numeric_errors": stats["numeric_errors"],
        "failure_code": failure_code or "none",
        "fallback_code": fallback_code or "none",
    }
    assert tuple(receipt) == ALLOWED_FIELDS
    return receipt

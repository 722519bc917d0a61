"""Privacy-safe receipt (spec: "Privacy-safe receipt"): identities, counts, timings, codes.

Never contains prompt or output text, token ids, decoded strings, paths or model bytes.
The seed appears only as a commitment sha256(salt || seed) under a fresh 256-bit secret salt
that is NOT in the receipt (a published salt would let anyone recover a 64-bit seed by search):
the salt is the "seed opening", returned to the local caller beside the receipt, so whoever
holds it can prove which seed ran. `ALLOWED_FIELDS` is the whole schema.
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
    "grammar_hash", "position_policy_hash", "scheduler_policy_hash", "scheduler_decisions", "hardware_class",
    "browser_version", "runtime_version", "champion_backend", "seed_commitment", "target_call_count", "draft_call_count",
    "proposal_count", "accepted_count_histogram", "rejection_position_histogram",
    "timing_ms", "peak_resident_bytes", "bounded_numeric_errors", "numerics", "failure_code", "fallback_code",
    "champion_fallback_code", "prompt_reused", "forced_token_count",
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


def seed_commitment(seed: int, salt_hex: str) -> str:
    """sha256(salt || seed as 8 little-endian bytes): hiding while the salt stays secret."""
    return hashlib.sha256(bytes.fromhex(salt_hex) + int(seed).to_bytes(8, "little")).hexdigest()


def _cpython_environment() -> dict:
    return {"hardware_class": f"{platform.system().lower()}-{platform.machine().lower()}",
            "browser_version": "none",
            "runtime_version": f"cpython-{sys.version_info.major}.{sys.version_info.minor}",
            "champion_backend": "reference-numpy",
            "peak_resident_bytes": peak_resident_bytes()}


def build_receipt(*, identities: dict, policy_canonical: dict, scheduler: dict, seed: int,
                  stats: dict, timing_ms: dict, failure_code, fallback_code, numerics: dict | None = None,
                  environment: dict | None = None, decisions: dict | None = None) -> tuple[dict, str]:
    """-> (receipt, seed_opening). `environment` (the browser backend's) supplies
    hardware_class, browser_version, runtime_version and peak_resident_bytes; CPython's own
    are used when it is None. `decisions`: speculate="auto"'s choices, as counts
    ({rounds_by_method, switches}; "none" for a fixed mode); the scheduler description binds
    the policy, its parameters and the calibration."""
    nonce = secrets.token_hex(16)
    salt = secrets.token_hex(32)
    env = {**_cpython_environment(), **(environment or {})}
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
        "scheduler_decisions": decisions or "none",
        "hardware_class": env["hardware_class"],
        "browser_version": env["browser_version"],
        "runtime_version": env["runtime_version"],
        "champion_backend": env["champion_backend"],
        "seed_commitment": seed_commitment(seed, salt),
        "target_call_count": stats["target_calls"],
        "draft_call_count": stats["draft_calls"],
        "proposal_count": stats["proposed"],
        "accepted_count_histogram": list(stats["accepted_count_histogram"]),
        "rejection_position_histogram": list(stats["rejection_position_histogram"]),
        "timing_ms": {k: round(v, 3) for k, v in timing_ms.items()},
        "peak_resident_bytes": env["peak_resident_bytes"],
        "bounded_numeric_errors": stats["numeric_errors"],
        # the decider's diagnostics, aggregated (round_record.NumericsTally.summary); "none" when not given
        "numerics": numerics if numerics is not None else "none",
        "failure_code": failure_code or "none",
        "fallback_code": fallback_code or "none",
        # the engine's, not the request's: E_BATCH_VARIANT when the load's batch check moved the champion
        # off WebGPU (docs/browser.md "Batch invariance at load"); the browser environment says it
        "champion_fallback_code": env.get("champion_fallback_code") or "none",
        # prompt ids each model started from the K/V of the engine's previous request (prefix reuse;
        # "draft" only when the request's session had the draft)
        "prompt_reused": {m: n for m, n in (stats.get("prompt_reused") or {"champion": 0}).items() if n is not None},
        # ids a response_format forced (exactly one allowed): committed without a decision, fed in blocks
        "forced_token_count": stats.get("forced", 0),
    }
    assert tuple(receipt) == ALLOWED_FIELDS
    return receipt, salt

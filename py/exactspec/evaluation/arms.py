"""The arms of a run (pure): which engine each runs on, its request config, and the interleaved
order of (prompt, temperature, arm) requests."""
from __future__ import annotations

DRAFT_KS = tuple(range(1, 9))
LOOKUP_K = 4
ADAPTIVE_K_MAX = 8
FULL = ("none",) + tuple(f"draft-k{k}" for k in DRAFT_KS) + ("draft-adaptive", f"lookup-k{LOOKUP_K}", "lookup-adaptive")
QUICK = ("none", "draft-adaptive")
# WebGPU on SwiftShader is ~15-20x slower than the WASM champion: a subset of arms and prompts only
WEBGPU_SUBSET = ("none", "draft-k4", "draft-adaptive")


def arm_spec(name: str) -> dict:
    """{speculate, k, scheduler, engine}: engine "alone" (champion only) or "spec" (champion + draft)."""
    if name == "none":
        return {"speculate": "none", "k": 0, "scheduler": "static", "engine": "alone"}
    mode, _, how = name.partition("-")
    if mode not in ("draft", "lookup") or not (how == "adaptive" or (how.startswith("k") and how[1:].isdigit())):
        raise ValueError(f"unknown arm {name!r}")
    adaptive = how == "adaptive"
    return {"speculate": mode, "k": ADAPTIVE_K_MAX if adaptive else int(how[1:]),
            "scheduler": "adaptive" if adaptive else "static",
            "engine": "spec" if mode == "draft" else "alone"}   # lookup needs no draft model


def request_config(arm: str, prompt: dict, temperature: float, max_new_tokens: int | None = None) -> dict:
    """The page's config for one request of an arm (same seed and length for every arm)."""
    a = arm_spec(arm)
    return {"max_new_tokens": max_new_tokens or prompt["max_new_tokens"], "temperature": temperature,
            "top_k": 0, "top_p": 1.0, "speculate": a["speculate"], "k": max(a["k"], 1), "scheduler": a["scheduler"],
            "seed": prompt["seed"]}


def schedule(prompts: list, temperatures: list, arms_by_backend: dict, webgpu_prompts: set, wllama: bool,
             repeats: int = 1) -> list:
    """Interleaved request keys (backend, arm, prompt id, temperature, repeat): per repeat, prompt
    and temperature every arm once, their order rotated by the prompt's index so that drift falls
    on all alike. webgpu runs only the prompts in webgpu_prompts (and only repeat 0); wllama only
    prompts without the chat template."""
    keys = []
    for rep in range(repeats):
        keys += _one_pass(prompts, temperatures, arms_by_backend, webgpu_prompts if rep == 0 else set(), wllama, rep)
    return keys


def _one_pass(prompts, temperatures, arms_by_backend, webgpu_prompts, wllama, rep) -> list:
    keys = []
    for i, p in enumerate(prompts):
        for t in temperatures:
            row = []
            for backend, arms in arms_by_backend.items():
                if backend == "webgpu" and p["id"] not in webgpu_prompts:
                    continue
                row += [(backend, arm, p["id"], t, rep) for arm in arms]
            if wllama and not p["chat"]:
                row.append(("wllama", "wllama", p["id"], t, rep))
            r = i % len(row) if row else 0
            keys += row[r:] + row[:r]
    return keys

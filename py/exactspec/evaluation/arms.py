"""The arms of a run (pure): the model pairs and topologies, which engine each arm runs on, its
request config, and the interleaved order of (topology, arm, prompt, temperature) requests."""
from __future__ import annotations

import os

DRAFT_KS = tuple(range(1, 9))
LOOKUP_K = 4
ADAPTIVE_K_MAX = 8
AUTO_K = 8          # sent with speculate "auto", which ignores k (auto picks k in 0..min(8, max_k) itself)
# the toy pair on the WASM champion: every fixed k, the adaptive schedulers, lookup, and auto
# "none-spec": champion alone on the champion + draft engine (the control that separates the engines'
# own differences from what auto's choices do; "none" runs on the champion-alone engine)
TOY_FULL = (("none", "none-spec") + tuple(f"draft-k{k}" for k in DRAFT_KS)
            + ("draft-adaptive", f"lookup-k{LOOKUP_K}", "lookup-adaptive", "auto"))
FULL = TOY_FULL     # v1's name
# WebGPU on SwiftShader is ~15-20x slower than the WASM champion: a subset of arms and prompts only
WEBGPU_SUBSET = ("none", "draft-k4", "auto")
# the real pair (SmolLM2-135M-Instruct Q4_1 + its draft), ~30-50 ms a token on the WASM champion
REAL_FULL = ("none", "none-spec", "auto", "draft-k2", "draft-k4", f"lookup-k{LOOKUP_K}")
QUICK = ("none", "auto")
# the distribution samples' arms (T = 1, first SAMPLE_POSITIONS tokens); the real pair (slow) samples
# champion alone and auto only
SAMPLE_ARMS = ("none", "auto", "draft-k4")
REAL_SAMPLE_ARMS = ("none", "auto", "draft-k4")   # draft k = 4 too: a speculative arm whose every round proposes

# the pairs: the URLs the bench page loads; "file" is the local file a pair needs (None: shipped)
PAIRS = {
    "toy": {"champion": "/web/models/champion/", "draft": "/web/models/draft/", "file": None},
    "real": {"champion": "/web/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
             "draft": "/web/models/smollm2-draft/",
             "file": os.path.join("build", "models", "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")},
}


def topology(pair: str, backend: str) -> str:
    """"toy-wasm", "toy-webgpu", "real-wasm", "toy-wllama": the unit the gates are judged per."""
    return f"{pair}-{backend}"


def split_topology(topo: str) -> tuple:
    pair, _, backend = topo.partition("-")
    return pair, backend


def arms_for(pair: str, backend: str, quick: bool) -> tuple:
    """The arms a topology runs (quick: champion alone and auto)."""
    if quick:
        return QUICK
    if backend == "webgpu":
        return WEBGPU_SUBSET
    return REAL_FULL if pair == "real" else TOY_FULL


def arm_spec(name: str) -> dict:
    """{speculate, k, scheduler, engine}: engine "alone" (champion only) or "spec" (champion + draft)."""
    if name in ("none", "none-spec"):
        return {"speculate": "none", "k": 0, "scheduler": "static", "engine": "alone" if name == "none" else "spec"}
    if name == "auto":   # may use the draft and lookup: the champion + draft engine (what a user loads)
        return {"speculate": "auto", "k": AUTO_K, "scheduler": "static", "engine": "spec"}
    mode, _, how = name.partition("-")
    if mode not in ("draft", "lookup") or not (how == "adaptive" or (how.startswith("k") and how[1:].isdigit())):
        raise ValueError(f"unknown arm {name!r}")
    adaptive = how == "adaptive"
    return {"speculate": mode, "k": ADAPTIVE_K_MAX if adaptive else int(how[1:]),
            "scheduler": "adaptive" if adaptive else "static",
            "engine": "spec" if mode == "draft" else "alone"}   # lookup needs no draft model


def engine_name(topology: str, role: str, pair: int = 0) -> str:
    """An engine's name in a run (its page key and run_info["loads"] key): "<topology>-<role>" for the
    first engine pair (every v2 run's only one), "<topology>-<role>-pair<j>" for pair j > 0."""
    return f"{topology}-{role}" + (f"-pair{pair}" if pair else "")


def engine_pairs_of(topo: str, wanted: int, repeats: int) -> int:
    """How many engine pairs a topology loads (gates v3): `wanted`, at most one a repeat it runs (a
    pair would serve nothing beyond), and one on WebGPU (one engine pair serves all its repeats)."""
    return 1 if split_topology(topo)[1] == "webgpu" else max(1, min(wanted, repeats))


def pair_of_repeat(rep: int, pairs: int) -> int:
    """The engine pair that serves repeat `rep` of every arm (so an arm and champion alone compared
    for the same prompt, temperature and repeat share their pair)."""
    return rep % pairs


def repeat_seed(topo: str, prompt: dict, temperature: float, rep: int) -> int:
    """The sampling seed of repeat `rep` (every arm alike, so that requests pair): the prompt's own,
    except on a WebGPU topology at T > 0, whose repeat r >= 1 samples under the prompt's seed + r
    (gates v4: its gate repeats exist to sample the answers' spread, which one seed repeats
    exactly; WASM repeats keep the prompt's seed, as in v3)."""
    if rep > 0 and temperature > 0 and split_topology(topo)[1] == "webgpu":
        return prompt["seed"] + rep
    return prompt["seed"]


def request_config(arm: str, prompt: dict, temperature: float, max_new_tokens: int | None = None,
                   seed: int | None = None) -> dict:
    """The page's config for one request of an arm (same seed, length and constraint for every arm;
    seed: repeat_seed's, default the prompt's). Every request prefills its whole prompt (prefix_reuse
    off): arms are compared cold, as a first turn is; reuse would hand the repeats of a prompt on one
    engine their prefill."""
    a = arm_spec(arm)
    config = {"max_new_tokens": max_new_tokens or prompt["max_new_tokens"], "temperature": temperature,
              "top_k": 0, "top_p": 1.0, "speculate": a["speculate"], "k": max(a["k"], 1), "scheduler": a["scheduler"],
              "seed": prompt["seed"] if seed is None else seed, "prefix_reuse": False}
    if prompt.get("response_format") is not None:     # the structured stratum: every arm under the same constraint
        config["response_format"] = prompt["response_format"]
    return config


GATE_ARMS = ("none", "auto", "none-spec")   # the arms the per-stratum gates (and auto's control) read


def schedule(prompts: list, temperatures: list, arms_by_topology: dict, ids_by_topology: dict, wllama: bool,
             repeats: int = 1, gate_repeats: int | dict = 0) -> list:
    """Interleaved request keys (topology, arm, prompt id, temperature, repeat): per repeat, prompt
    and temperature every topology's arms once, their order rotated by the prompt's index so that
    drift falls on all alike. A topology runs only the prompts in ids_by_topology[topology];
    wllama ("toy-wllama") runs toy-wasm's prompts without the chat template. Repeats from `repeats`
    to `gate_repeats` (when larger) run GATE_ARMS alone: more requests for the per-stratum gates'
    cells, whose intervals need them; a number applies to the WASM topologies, a dict gives each
    topology its own (absent: 0). A WebGPU topology runs repeat 0 with every arm and its gate
    repeats (gates v4; default none) with GATE_ARMS: `repeats` does not apply to it (SwiftShader
    is slow)."""
    gate_of = (gate_repeats if isinstance(gate_repeats, dict) else   # a number: WASM's (WebGPU: its own, in a dict)
               {t: gate_repeats for t in arms_by_topology if split_topology(t)[1] != "webgpu"})
    keys = []
    for rep in range(max(repeats, *gate_of.values(), 0)):
        for i, p in enumerate(prompts):
            for t in temperatures:
                row = []
                for topo, arms in arms_by_topology.items():
                    webgpu = split_topology(topo)[1] == "webgpu"
                    extra = rep >= (1 if webgpu else repeats)
                    if p["id"] not in ids_by_topology.get(topo, ()) or (extra and rep >= gate_of.get(topo, 0)):
                        continue
                    row += [(topo, arm, p["id"], t, rep) for arm in arms if not extra or arm in GATE_ARMS]
                if wllama and rep < repeats and not p["chat"] and p["id"] in ids_by_topology.get(topology("toy", "wasm"), ()):
                    row.append((topology("toy", "wllama"), "wllama", p["id"], t, rep))
                r = i % len(row) if row else 0
                keys += row[r:] + row[:r]
    return keys


def sample_arms(topo: str) -> tuple:
    return REAL_SAMPLE_ARMS if split_topology(topo)[0] == "real" else SAMPLE_ARMS


def sample_keys(topologies_seeds: dict, prompt_ids: list) -> list:
    """The distribution samples' keys (topology, arm, prompt id, seed), interleaved by seed so that
    an interrupted run has every arm at about the same count."""
    return [(topo, arm, pid, seed) for topo, n in topologies_seeds.items() for seed in range(n)
            for pid in prompt_ids for arm in sample_arms(topo)]


# a rough prior cost of a request per topology, measured here (2 cores, headless Chromium): (fixed ms,
# ms per new token, ms per prompt character: the prefill); the progress line rescales it by the time
# the requests done so far took against it
LOAD_PRIOR_MS = {"toy-wasm": 4000.0, "toy-webgpu": 6000.0, "real-wasm": 10000.0, "real-webgpu": 15000.0}
COST_PRIOR = {"toy-wasm": (60.0, 5.0, 0.05), "toy-webgpu": (350.0, 75.0, 0.3),
              "real-wasm": (250.0, 55.0, 2.2), "real-webgpu": (800.0, 2000.0, 3.0), "toy-wllama": (100.0, 15.0, 0.1)}


def prior_ms(topo: str, prompt: dict, max_new_tokens: int) -> float:
    """The prior estimate of one request's page-clock time (COST_PRIOR)."""
    fixed, per_token, per_char = COST_PRIOR.get(topo, COST_PRIOR["toy-wasm"])
    return fixed + per_token * max_new_tokens + per_char * len(prompt["prompt"])

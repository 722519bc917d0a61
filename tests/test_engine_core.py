"""Engine rules under CPython: failure rules on every path (residual invariant, cancellation
racing a backend failure, stale requests), backend limits refused before output, per-request
counters, a seed commitment that cannot be reversed, one error table, the page's config types,
and the load-time model checks that Pyodide runs."""
import hashlib
import json
import os
import re

import pytest

from exactspec.pyodide import browser_backend, model_check
from exactspec.core.acceptance import RoundDecision
from exactspec.core.backends import RunnerChampion, RunnerDraft
from exactspec.core.errors import (ALL_CODES, CODE_TABLE, E_BAD_ARGUMENT, E_DEVICE_LOST, E_DRAFT_LOST, E_INTERNAL,
                              E_MANIFEST_MISMATCH, E_MODEL_LOAD, E_RESIDUAL_INVARIANT, ExactSpecError, coded_error)
from exactspec.reference.models import default_models_dir
from exactspec.core.orchestrator import CancelToken, GenerationConfig, Orchestrator
from exactspec.reference.processors import SamplingPolicy
from exactspec.core.receipts import seed_commitment
from exactspec.reference.toy import ToyRunner, toy_draft
from toy_helpers import make_orchestrator, toy_decode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GREEDY = SamplingPolicy(temperature=0)
SAMPLE = SamplingPolicy(temperature=1.0)


def run(orch, prompt, cancel=None, epoch=None, **kw):
    events = []
    res = orch.generate(prompt, GenerationConfig(**kw), on_event=events.append, cancel=cancel, epoch=epoch)
    streamed = [t for e in events if e["kind"] == "tokens" for t in e["payload"]["token_ids"]]
    assert streamed == res.token_ids            # no duplicate, no gap, whatever happened
    return res, events


# --- residual invariant: silent before the first token, visible after, never E_CACHE_STATE -----
class ResidualFails(RunnerChampion):
    """The decider reports E_RESIDUAL_INVARIANT at the first speculative round at or after `at`."""

    def __init__(self, runner, at):
        super().__init__(runner)
        self.at, self.fired = at, False

    def decide(self, rows, p_draft_rows, proposals, decider, round_id, *rest):
        out = super().decide(rows, p_draft_rows, proposals, decider, round_id, *rest)
        if proposals and round_id >= self.at and not self.fired:
            self.fired = True
            return RoundDecision(0, None, None, None, ExactSpecError(E_RESIDUAL_INVARIANT, "residual mass 0"))
        return out


def _residual_orch(at, seed=3):
    return Orchestrator(ResidualFails(ToyRunner(40, seed), at), RunnerDraft(toy_draft(ToyRunner(40, seed), 0.6, seed + 9)),
                        decode=toy_decode)


@pytest.mark.parametrize("policy", [GREEDY, SAMPLE])
def test_residual_failure_before_the_first_token_falls_back_to_the_champion_answer(policy):
    alone, _ = run(make_orchestrator(40, 3), [4, 5, 6], max_new_tokens=14, policy=policy, speculate="none", seed=7)
    res, events = run(_residual_orch(0), [4, 5, 6], max_new_tokens=14, policy=policy, speculate="draft", k=3, seed=7)
    assert res.error is None and res.finish_reason == "length"
    assert res.token_ids == alone.token_ids
    assert res.stats["fallback_code"] == E_RESIDUAL_INVARIANT
    assert not [e for e in events if e["kind"] == "error"]


def test_residual_failure_after_output_ends_visibly():
    res, events = run(_residual_orch(4), [4, 5, 6], max_new_tokens=30, policy=SAMPLE, speculate="draft", k=3, seed=2)
    assert res.finish_reason == "error" and res.error["code"] == E_RESIDUAL_INVARIANT
    assert 4 <= len(res.token_ids) < 30
    assert [e["kind"] for e in events][-2:] == ["error", "result"]


# --- cancellation racing a backend failure -----------------------------------------------------
class InterruptedOnCall:
    """Backend mixin: its on_call-th call moves the cancel token on, then fails with `failure`,
    as a call interrupted by the caller's cancel does in the browser."""

    def __init__(self, runner, cancel, on_call, failure):
        super().__init__(runner)
        self.cancel, self.on_call, self.failure, self.calls = cancel, on_call, failure, 0

    def _maybe_interrupt(self):
        self.calls += 1
        if self.calls == self.on_call:
            self.cancel.cancel()
            raise RuntimeError(self.failure)


class CancelThenFail(InterruptedOnCall, RunnerDraft):
    """A draft call interrupted by the caller's cancel (the draft client rejects its calls)."""

    def __init__(self, runner, cancel, on_call):
        super().__init__(runner, cancel, on_call, "E_CANCELLED: superseded by epoch 1")

    def propose(self, *args):
        self._maybe_interrupt()
        return super().propose(*args)


def test_a_cancel_that_interrupts_the_draft_ends_cancelled_not_in_error():
    cancel = CancelToken()
    orch = Orchestrator(RunnerChampion(ToyRunner(40, 5)), CancelThenFail(toy_draft(ToyRunner(40, 5), 0.6, 5), cancel, 3),
                        decode=toy_decode)
    res, events = run(orch, [1, 2, 3], cancel=cancel, max_new_tokens=30, policy=GREEDY, speculate="draft", k=3)
    assert res.finish_reason == "cancelled" and res.error is None
    assert 0 < len(res.token_ids) < 30 and not [e for e in events if e["kind"] == "error"]


class CancelledChampion(InterruptedOnCall, RunnerChampion):
    def __init__(self, runner, cancel, on_call):
        super().__init__(runner, cancel, on_call, "OperationError: mapAsync aborted")

    def verify_linear(self, *args):
        self._maybe_interrupt()
        return super().verify_linear(*args)


def test_a_cancel_that_interrupts_the_champion_ends_cancelled_and_a_real_failure_stays_coded():
    cancel = CancelToken()
    res, _ = run(Orchestrator(CancelledChampion(ToyRunner(40, 6), cancel, 3), decode=toy_decode), [1, 2],
                 cancel=cancel, max_new_tokens=20, policy=GREEDY, speculate="none")
    assert res.finish_reason == "cancelled" and len(res.token_ids) == 2

    class Lost(RunnerChampion):
        def verify_linear(self, *args):
            raise RuntimeError("Error: E_DEVICE_LOST: WebGPU device lost (destroyed)")
    res, _ = run(Orchestrator(Lost(ToyRunner(40, 6)), decode=toy_decode), [1, 2], max_new_tokens=5, policy=GREEDY,
                 speculate="none")
    assert res.error == {"code": E_DEVICE_LOST, "message": "WebGPU device lost (destroyed)"}


def test_a_request_whose_epoch_is_already_stale_ends_cancelled_before_any_model_call():
    calls = []

    class Counting(RunnerChampion):
        def prefill(self, cache):
            calls.append("prefill")
            return super().prefill(cache)
    cancel = CancelToken()
    cancel.advance(3)
    res, events = run(Orchestrator(Counting(ToyRunner(40, 1)), decode=toy_decode), [1, 2], cancel=cancel, epoch=2,
                      max_new_tokens=5, policy=GREEDY, speculate="none")
    assert res.finish_reason == "cancelled" and res.token_ids == [] and calls == []
    assert {e["epoch"] for e in events} == {2}


def test_an_unexpected_failure_after_the_start_is_a_coded_result_not_an_exception():
    class Buggy(RunnerChampion):
        def begin(self, request, draft=None):
            session = super().begin(request, draft)
            session.round = lambda *args: "not a round outcome"
            return session
    res, _ = run(Orchestrator(Buggy(ToyRunner(40, 1)), decode=toy_decode), [1, 2], max_new_tokens=5, policy=GREEDY,
                 speculate="none")
    assert res.finish_reason == "error" and res.error["code"] == E_INTERNAL


# --- limits, arguments ---------------------------------------------------------------------------
def test_backend_limits_are_refused_before_any_output():
    orch = make_orchestrator(40, 3)
    orch.champion.limits = {"max_k": 8, "min_temperature": 1e-6, "repetition_penalty_range": (1e-6, 1e6)}
    cases = [(dict(k=9, speculate="draft"), "k"), (dict(k=64, speculate="lookup"), "k"),
             (dict(policy=SamplingPolicy(temperature=1e-9)), "temperature"),
             (dict(policy=SamplingPolicy(temperature=1.0, repetition_penalty=1e9)), "repetition_penalty"),
             (dict(policy=SamplingPolicy(temperature=1.0, repetition_penalty=1e-9)), "repetition_penalty")]
    for kw, name in cases:
        events = []
        with pytest.raises(ExactSpecError) as e:
            orch.generate([1, 2], GenerationConfig(max_new_tokens=4, **kw), on_event=events.append)
        assert e.value.code == E_BAD_ARGUMENT and e.value.message.startswith(name), kw
        assert events == []
    ok, _ = run(orch, [1, 2], max_new_tokens=4, k=8, speculate="none" if False else "draft", policy=GREEDY)
    assert ok.error is None and len(ok.token_ids) == 4        # k = 8 and greedy are within the limits


def test_stop_strings_and_allowed_ids_are_checked():
    orch = make_orchestrator(40, 3)
    for kw in (dict(stop_strings="ab"), dict(stop_strings=("",)), dict(stop_strings=(3,)),
               dict(policy=SamplingPolicy(temperature=1.0, grammar=browser_backend.AllowedSetGrammar([1, 40])))):
        with pytest.raises(ExactSpecError) as e:
            orch.generate([1, 2], GenerationConfig(max_new_tokens=3, **kw))
        assert e.value.code == E_BAD_ARGUMENT, kw


@pytest.mark.parametrize("config, name", [
    ({"stop_strings": "ab"}, "stop_strings"), ({"k": 2.5}, "k"), ({"k": "4"}, "k"), ({"seed": True}, "seed"),
    ({"temperature": "hot"}, "temperature"), ({"allowed_token_ids": [1, "2"]}, "allowed_token_ids"),
    ({"stop_token_ids": 7}, "stop_token_ids"), ({"tempreature": 0}, "tempreature"), ({"speculate": 1}, "speculate"),
])
def test_the_page_config_is_type_checked(config, name):
    with pytest.raises(ExactSpecError) as e:
        browser_backend.config_from_json({"config": config}, ())
    assert e.value.code == E_BAD_ARGUMENT and e.value.message.startswith(f"config.{name}")


def test_page_config_accepts_js_numbers():
    cfg = browser_backend.config_from_json({"config": {"k": 4.0, "seed": 7, "stop_strings": ["\n\n"], "temperature": 0}}, (2,))
    assert cfg.k == 4 and cfg.seed == 7 and cfg.stop_strings == ("\n\n",) and cfg.stop_token_ids == (2,)


# --- receipts ------------------------------------------------------------------------------------
def test_counters_are_per_request():
    orch = make_orchestrator(40, 3)
    a, _ = run(orch, [1, 2, 3], max_new_tokens=12, policy=GREEDY, speculate="draft", k=3)
    b, _ = run(orch, [1, 2, 3], max_new_tokens=12, policy=GREEDY, speculate="draft", k=3)
    assert a.stats["draft_calls"] == b.stats["draft_calls"] > 0
    assert a.receipt["draft_call_count"] == b.receipt["draft_call_count"] == a.stats["draft_calls"]
    assert a.receipt["target_call_count"] == b.receipt["target_call_count"]


def test_the_seed_commitment_hides_the_seed_and_the_opening_proves_it():
    orch = make_orchestrator(40, 3)
    seed = 41
    res, _ = run(orch, [1, 2, 3], max_new_tokens=4, policy=SAMPLE, seed=seed)
    again, _ = run(orch, [1, 2, 3], max_new_tokens=4, policy=SAMPLE, seed=seed)
    r = res.receipt
    assert r["seed_commitment"] == seed_commitment(seed, res.seed_opening)
    assert r["seed_commitment"] != again.receipt["seed_commitment"]      # fresh salt per request
    blob = json.dumps(r)
    assert res.seed_opening not in blob
    # every 32/64-hex value the receipt publishes, tried as the salt (old and new recipes), recovers nothing
    published = set(re.findall(r"[0-9a-f]{32,64}", blob))
    for candidate in range(0, 1000):
        for salt in published:
            assert hashlib.sha256(f"{salt}:{candidate}".encode()).hexdigest() != r["seed_commitment"]
            if len(salt) % 2 == 0:
                assert seed_commitment(candidate, salt) != r["seed_commitment"]


def test_receipt_environment_is_complete_on_cpython():
    res, _ = run(make_orchestrator(40, 3), [1, 2, 3], max_new_tokens=3, policy=GREEDY)
    r = res.receipt
    assert r["browser_version"] == "none" and r["runtime_version"].startswith("cpython-")
    assert r["peak_resident_bytes"]["process_peak_rss"] > 0


# --- one error table -----------------------------------------------------------------------------
def test_every_code_used_in_py_and_web_is_in_the_one_table():
    assert ALL_CODES == set(CODE_TABLE)
    pattern = re.compile(r"(?<![A-Za-z0-9_])E_[A-Z][A-Z_]*[A-Z](?![A-Za-z0-9_])")
    used = {}
    for top in ("py/exactspec", "web"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d not in ("models", "build", "__pycache__")]
            for name in filenames:
                if name.endswith((".py", ".mjs", ".js", ".html")):
                    path = os.path.join(dirpath, name)
                    for code in pattern.findall(open(path, encoding="utf-8").read()):
                        used.setdefault(code, path)
    unknown = {c: p for c, p in used.items() if c not in CODE_TABLE and c != "E_CODE"}
    assert not unknown, f"codes used but not in protocol.json's table: {unknown}"
    assert len(used) >= 15


@pytest.mark.parametrize("exc, code, message", [
    (RuntimeError("Error: E_DEVICE_LOST: gone"), E_DEVICE_LOST, "gone"),
    (RuntimeError("E_TIMEOUT: draft worker did not answer"), "E_TIMEOUT", "draft worker did not answer"),
    (RuntimeError("E_NOT_A_CODE: x"), E_DRAFT_LOST, "ctx: RuntimeError: E_NOT_A_CODE: x"),
    (ValueError("plain"), E_DRAFT_LOST, "ctx: ValueError: plain"),
    (ExactSpecError(E_MODEL_LOAD, "kept"), E_MODEL_LOAD, "kept"),
])
def test_coded_error_keeps_a_known_code_and_defaults_otherwise(exc, code, message):
    err = coded_error(exc, E_DRAFT_LOST, "ctx")
    assert (err.code, err.message) == (code, message)


# --- the load-time model checks that Pyodide runs -----------------------------------------------
MODELS = default_models_dir()


class Blob:
    def __init__(self, data):
        self.data = data

    def to_bytes(self):
        return self.data


def _check(mutate=None, manifest=True, roles=("champion", "draft"), stage2=True):
    files = {}
    for role in roles:
        for name in model_check.MODEL_FILES:
            files[f"{role}/{name}"] = open(os.path.join(MODELS, role, name), "rb").read()
    if mutate:
        mutate(files)
    man = json.load(open(os.path.join(MODELS, "manifest.json"))) if manifest else None
    spec = {"roles": list(roles), "manifest": man}
    if stage2:
        served = {}
        for role in roles:
            served[role] = {n: [hashlib.sha256(files[f"{role}/{n}"]).hexdigest(), len(files[f"{role}/{n}"])]
                            for n in model_check.MODEL_FILES}
            run_file = model_check.DEFAULT_RUN_WEIGHTS[role]
            data = open(os.path.join(MODELS, role, run_file), "rb").read()
            served[role][run_file] = [hashlib.sha256(data).hexdigest(), len(data)]
        spec["served"] = served
    return json.loads(model_check.check_models(json.dumps(spec), lambda key: Blob(files[key])))


def test_stage_one_hands_the_loaders_the_validated_configs():
    """The check's first stage returns each role's validate_config result as a plain object: the only
    config the champion and draft loaders get (web/formats/model_config.mjs maps it, no JS re-parses)."""
    import dataclasses

    from exactspec.formats.config import validate_config
    out = _check(stage2=False)
    for role in ("champion", "draft"):
        want = validate_config(json.load(open(os.path.join(MODELS, role, "config.json"))), source=f"{role}/config.json")
        assert out["validated_configs"][role] == dataclasses.asdict(want)


def _edit_json(key, fn):
    def mutate(files):
        obj = json.loads(files[key])
        fn(obj)
        files[key] = json.dumps(obj).encode()
    return mutate


def test_the_shipped_pair_passes_the_load_time_checks():
    out = _check()
    assert out["ok"]["manifest_checked"] and out["ok"]["pair_checked"]
    assert _check(manifest=False)["ok"]["pair_checked"]
    assert _check(roles=("champion",))["ok"]["manifest_checked"]


def test_a_draft_with_one_merge_removed_is_refused_naming_the_file_or_the_field():
    drop_merge = _edit_json("draft/tokenizer.json", lambda t: t["model"]["merges"].pop())
    with_manifest = _check(drop_merge)["error"]
    assert with_manifest["code"] == E_MANIFEST_MISMATCH and "draft/tokenizer.json" in with_manifest["message"]
    without = _check(drop_merge, manifest=False)["error"]
    assert without["code"] == E_MANIFEST_MISMATCH and "merges_sha256" in without["message"]


def test_a_draft_with_another_eos_is_refused():
    other_eos = _edit_json("draft/generation_config.json", lambda g: g.update(eos_token_id=[7]))
    err = _check(other_eos, manifest=False)["error"]
    assert err["code"] == E_MANIFEST_MISMATCH and "stop_token_ids" in err["message"]


def test_a_hostile_config_is_refused_at_stage_one_by_the_shared_validator():
    for value in (10 ** 9, 256.9, 0):
        key = "num_hidden_layers" if value == 10 ** 9 else "hidden_size" if value == 256.9 else "num_attention_heads"
        err = _check(_edit_json("champion/config.json", lambda c: c.update({key: value})), stage2=False)["error"]
        assert err["code"] == E_MODEL_LOAD and key in err["message"], (key, err)

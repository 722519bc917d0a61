"""Shared pytest set-up: tests/ helpers importable; the `browser` and `slow` tiers (README.md, Test tiers).

Tiers: `-m "not browser and not slow"` is the fast loop; the plain run is the whole suite (CI).
- `browser` is added here to every test whose fixtures include the shared Chromium
  (browser_fixture.chromium_browser / browser_page), and to the tests in BROWSER_TESTS. It cannot be
  forgotten: every Chromium any test starts (in this process or a child, through EXACTSPEC_CHROMIUM,
  which the product and browser_fixture both read) goes through a guard script that records the
  running test; a test without the `browser` mark that started one fails in its teardown.
- `slow` is added to the tests in SLOW_TESTS (measured: over ~3 s here without a browser). A run
  that includes unmarked tests over SLOW_LIMIT_S lists them at the end.
"""
import atexit
import json
import os
import shutil
import sys
import tempfile

import pytest

# Two cores shared by Chromium, workers and NumPy: one BLAS thread is faster for these small
# matrices and keeps timings of concurrent browser tests sane.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(__file__))

BROWSER_FIXTURES = {"chromium_browser", "browser_page"}

# Tests that start Chromium without the shared fixture (a child process or the product's own
# launch): "file.py" for a whole module, "file.py::test_name" for one test (every parameter),
# "file.py::test_name[param]" for one parameter.
BROWSER_TESTS = {
    "test_setup.py::test_chromium_runs",
    "test_cli.py::test_demo_chats_with_the_real_model[browser]",
    "test_cli.py::test_the_browser_backend_runs_a_published_bf16_folder",
    "test_gguf_cli.py::test_the_browser_backend_pairs_the_smollm2_draft_too",
    "test_gguf_cli.py::test_a_gguf_draft_runs_on_the_browser_backend",
    "test_gguf_cli.py::test_generate_chat_on_the_gguf_answers_in_the_browser",
    "test_page_demo.py::test_demo_runs_the_browser_engine",
    "test_browser_e2e.py::test_cli_browser_backend_json",
    "test_eval_bench.py",                     # `exactspec bench` runs the evaluation in Chromium
    "test_peer_wllama.py::test_peer_on_the_real_gguf_gives_wllamas_greedy_tokens",   # wllama in Chromium
}

# Tests over ~3 s here that start no browser (training, big NumPy models, Node runs of big
# models, many Monte Carlo samples), same keys as BROWSER_TESTS.
SLOW_TESTS = {
    # a Qwen2 of Qwen2.5's vocabulary shape, its 151,665-id tokenizer trained (5.6 s to build)
    "test_vocab_padding.py",
    # a test build of the CPU module compiled, then a thread-pool stress in Node
    "test_thread_race.py",
    # the real SmolLM2-135M model and the trained pair, on the reference or in Node
    "test_gguf_smollm2.py",
    "test_streamed_load.py::test_streamed_smollm2_gguf_equals_the_whole_file_and_holds_one_tensor",
    "test_streamed_load.py::test_a_file_cut_short_or_damaged_in_the_stream_is_refused",
    "test_streamed_load.py::test_streamed_smollm2_gguf_on_the_f32_matmul_converts_a_slice_at_a_time",
    "test_smollm2_distribution.py",
    "test_real_pair.py",
    "test_smollm2_draft.py::test_greedy_speculation_equals_champion_alone",
    "test_gguf_browser_wasm.py::test_smollm2_greedy_chat_equals_reference",
    "test_gguf_cli.py::test_a_gguf_draft_runs_on_the_reference",
    "test_gguf_cli.py::test_generate_chat_on_the_gguf_answers",
    "test_gguf_cli.py::test_the_draft_the_manifest_binds_is_picked_and_exact",
    "test_gguf_cli.py::test_the_shipped_manifest_pairs_the_smollm2_draft",
    "test_gguf_cli.py::test_without_a_bound_draft_auto_runs_without_one_and_draft_is_refused",
    "test_gguf_cli.py::test_a_mismatched_draft_is_refused_naming_the_field",
    "test_cli.py::test_demo_chats_with_the_real_model",
    "test_cli.py::test_demo_says_which_champion_artifact_ran",
    "test_cli.py::test_demo_without_the_real_model_says_so_in_one_line_and_runs_the_toy_pair",
    "test_cli.py::test_browser_ready_converts_a_published_folder_once_keyed_by_its_content",
    # structured output: CLI processes that each load the toy pair and compile a grammar
    "test_structured_cli.py::test_regex_and_grammar_and_json_object",
    "test_structured_cli.py::test_json_schema_file_gives_an_answer_that_fits",
    "test_structured_distribution.py",     # 500 sampled answers per test, and the exact answer enumeration
    # Monte Carlo: thousands of sampled answers per test
    "test_statistical.py",
    "test_restricted_vocab.py::test_sampled_speculation_follows_the_champion",
    # exhaustive enumeration and every-code-point sweeps
    "test_exact_enumeration.py::test_round_edge_cases_first_rejection_closed_form[3-6]",
    "test_tokenizer.py::test_single_word_boundaries_match_tokenizers_for_every_code_point",
    "test_tokenizer_families.py::test_regex_translation_covers_every_code_point_like_oniguruma",
    # Pyodide booted in Node for the orchestrator's per-round cost (tools/bench/round_overhead.mjs)
    "test_round_overhead.py::test_the_node_runner_measures_in_pyodide",
    "test_round_overhead.py::test_the_node_runner_compares_against_another_tree",
    # Node runs of the shipped or mid-size models, thousands of decide rounds
    "test_wasm_real_models.py",
    "test_wasm_build_outputs.py::test_build_writes_only_the_cpu_module",   # four clang builds
    "test_widen.py::test_transformers_runs_the_widened_champion_to_the_same_tokens",   # torch on widened shapes
    "test_wasm_champion.py::test_logits_match_q8_reference",               # the q8act reference in NumPy
    "test_wasm_champion.py::test_decide_matches_decide_round",
    "test_wasm_champion.py::test_threads_bitwise_equal_one_thread",
    "test_wasm_champion.py::test_kv_caches_grow_on_demand_and_keep_every_position",   # 1200 positions, twice
    "test_wasm_champion.py::test_decide_on_forward_rows[shipped]",
    "test_wasm_champion.py::test_int8_weight_storage_bitwise_equal_f32[shipped]",
    "test_wasm_draft.py::test_propose_matches_runner_draft[shipped-draft-T1]",
    "test_wasm_draft.py::test_propose_matches_runner_draft[shipped-draft-mixed]",
    "test_restricted_vocab.py::test_wasm_forward_is_bitwise_the_expanded_drafts_and_matches_the_reference",
    # mid-size hub-shaped checkpoints converted end to end
    "test_hf_convert.py::test_sharded_source_converts_to_the_same_bytes",
    # xgrammar masks: the Node harness and the CPython twin walk every spec type on SmolLM2's
    # 49k vocabulary (one run of both, ~5 s, shared by these tests)
    "test_grammar_masks.py::test_masks_equal_word_for_word_along_each_path",
    "test_grammar_masks.py::test_ids_beyond_the_tokenizer_are_never_allowed",
    "test_grammar_masks.py::test_masks_of_a_terminated_matcher_are_empty_and_refuse_everything",
    "test_grammar_masks.py::test_bad_specs_are_refused_on_both_sides_in_the_same_words",
    "test_grammar_masks.py::test_the_rest_of_the_helpers_agree",
    "test_grammar_masks.py::test_compile_is_cached_per_spec_and_rollback_is_bounded",
    # over 4 s on CI's machine (2026-12-04): the real SmolLM2 tokenizer rebuilt from the GGUF, a
    # fuzz corpus of safetensors headers, the k = 3, V = 5 closed form
    "test_smollm2_draft.py::test_tokenizer_is_the_champions",
    "test_fuzz.py::test_fuzz_safetensors_header_images",
    "test_exact_enumeration.py::test_round_edge_cases_first_rejection_closed_form[3-5]",
    # whole rounds of the CPU module in Node, one thread and several
    "test_cpu_module.py::test_threaded_round_equals_one_thread_composition",
    "test_cpu_module.py::test_round_equals_composition_of_separate_calls",
}

SLOW_LIMIT_S = 3.0


# ----------------------------------------------------------------------------- the Chromium guard
def _install_chromium_guard():
    """Point EXACTSPEC_CHROMIUM at a script that logs the running test, then runs the real one."""
    real = os.environ.get("EXACTSPEC_CHROMIUM", "/usr/bin/chromium")
    real = real if os.path.isabs(real) else shutil.which(real) or real
    if not os.path.isfile(real):
        return None  # no browser here: browser tests fail on their own, saying so
    folder = tempfile.mkdtemp(prefix="exactspec-chromium-guard-")
    log = os.path.join(folder, "launches.log")
    script = os.path.join(folder, "chromium")
    with open(script, "w") as f:
        f.write("#!/bin/sh\n"
                "# tests/conftest.py: records which test started Chromium, then runs it\n"
                f'printf "%s\\t%s\\n" "$EXACTSPEC_TEST_BROWSER" "$EXACTSPEC_TEST_NODEID" >> "{log}"\n'
                f'exec "{real}" "$@"\n')
    os.chmod(script, 0o755)
    atexit.register(shutil.rmtree, folder, True)
    os.environ["EXACTSPEC_CHROMIUM"] = script
    return log


GUARD_LOG = _install_chromium_guard()


def _guard_launches() -> list:
    """Lines the guard wrote since the last call (each: mark flag, test id)."""
    if not GUARD_LOG or not os.path.exists(GUARD_LOG):
        return []
    with open(GUARD_LOG) as f:
        lines = f.read().splitlines()
    os.remove(GUARD_LOG)
    return lines


# ----------------------------------------------------------------------------- marking
def _listed(item, table) -> bool:
    module = item.path.name
    return bool({module, f"{module}::{getattr(item, 'originalname', item.name)}", f"{module}::{item.name}"} & set(table))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if BROWSER_FIXTURES & set(item.fixturenames) or _listed(item, BROWSER_TESTS):
            item.add_marker(pytest.mark.browser)
        if _listed(item, SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    os.environ["EXACTSPEC_TEST_NODEID"] = item.nodeid
    os.environ["EXACTSPEC_TEST_BROWSER"] = "1" if item.get_closest_marker("browser") else "0"
    _guard_launches()  # a launch between tests (session teardown) belongs to no test


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    unmarked = [line for line in _guard_launches() if line.startswith("0\t")]
    if unmarked:
        pytest.fail(f"{item.nodeid} started Chromium but has no `browser` mark: add it to "
                    "BROWSER_TESTS in tests/conftest.py (or use browser_fixture's chromium_browser)",
                    pytrace=False)


# ----------------------------------------------------------------------------- slow report
FILE_SECONDS = {}            # test file -> seconds of its tests' setup, call and teardown (fixtures included)
SLOWEST_FILES = 12           # how many the summary lists (CI's log shows where its time goes)


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::", 1)[0]
    FILE_SECONDS[name] = FILE_SECONDS.get(name, 0.0) + report.duration


def _slowest_files(terminalreporter):
    """The files that took longest (setup + call + teardown), with the run's total, when the run
    took over a minute; written to build/test_durations.json too (every file, slowest first)."""
    total = sum(FILE_SECONDS.values())
    if total < 60:
        return
    ranked = sorted(FILE_SECONDS.items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("-", f"slowest test files ({total / 60:.1f} min in tests)")
    for name, seconds in ranked[:SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:7.1f}s {name}")
    out = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "test_durations.json")
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"total_s": round(total, 1), "files": {n: round(t, 1) for n, t in ranked}}, f, indent=1)
    except OSError:
        pass                     # a read-only checkout: the summary above is the record


def pytest_terminal_summary(terminalreporter, config):
    """List unmarked tests over SLOW_LIMIT_S (only when the run includes unmarked tests), then the
    slowest files."""
    _slowest_files(terminalreporter)
    over = []
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        if report.when != "call" or report.duration <= SLOW_LIMIT_S:
            continue
        if {"slow", "browser"} & set(report.keywords):
            continue
        over.append((report.duration, report.nodeid))
    if over:
        terminalreporter.write_sep("-", f"over {SLOW_LIMIT_S:g} s without a `slow` mark (SLOW_TESTS in tests/conftest.py)")
        for duration, nodeid in sorted(over, reverse=True):
            terminalreporter.write_line(f"{duration:6.1f}s {nodeid}")

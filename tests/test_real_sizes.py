"""tools/bench/real_sizes.py: its pure parts (process tree, per-runner medians, the draft's share and
V(k+1)/V(1) against the champion alone, greedy agreement, the table) and one small run of the whole
benchmark in Chromium on the toy pair's GGUF exports (Q4_1 champion, F32 draft): every runner
measured, memory reported, the draft's greedy tokens equal to the champion alone's."""
import json
import os
import sys

import pytest

from browser_fixture import REPO_ROOT, chromium_browser  # noqa: F401

sys.path.insert(0, str(REPO_ROOT / "tools" / "bench"))
sys.path.insert(0, str(REPO_ROOT / "tools"))
import real_sizes  # noqa: E402
from export_gguf import export_gguf  # noqa: E402

MODELS = REPO_ROOT / "web" / "models"


def test_wllama_thread_counts():
    assert real_sizes.wllama_thread_counts("1,2") == [1, 2] and real_sizes.wllama_thread_counts("4") == [4]
    for bad in ("", "0", "1,x"):
        with pytest.raises(SystemExit, match="--wllama-threads"):
            real_sizes.wllama_thread_counts(bad)


def test_descendants_walks_the_whole_tree_below_root():
    parents = {2: 1, 3: 2, 4: 3, 5: 1, 6: 99, 7: 6}
    assert sorted(real_sizes.descendants(parents, 1)) == [2, 3, 4, 5]
    assert real_sizes.descendants(parents, 4) == []
    assert real_sizes.browser_pss_bytes(root=os.getpid()) >= 0


def _record(prompt, ms, draft=None, verify=None, tpr=1.0, ids=(1, 2, 3)):
    return {"prompt": prompt, "ms_per_token": ms, "first_token_ms": 10.0, "tokens_per_round": tpr,
            "draft_ms_per_proposal": draft, "verify_ms_per_round": verify, "token_ids": list(ids)}


def _runner(name, records, memory=None):
    return {"name": name, "load_ms": 1500.0, "browser_pss_growth": 2_000_000, "records": records,
            **({"memory": memory} if memory else {})}


def test_summary_rows_share_and_verification_ratio():
    mem = {"wasm_champion_bytes": 50_000_000, "wasm_draft_bytes": 8_000_000}
    runners = [_runner("wllama:1t", [_record(0, 300.0), _record(1, 320.0)]),
               _runner("wllama:2t", [_record(0, 400.0), _record(1, 420.0)]),      # slower: vs wllama takes the 1t
               _runner("ours:none", [_record(0, 100.0, verify=90.0), _record(1, 120.0, verify=110.0)], mem),
               _runner("ours:draft@2", [_record(0, 55.0, draft=8.0, verify=130.0, tpr=2.5),
                                        _record(1, 65.0, draft=12.0, verify=150.0, tpr=2.1, ids=(1, 2, 4))], mem)]
    rows = {r["runner"]: r for r in real_sizes.summarise(runners)}
    assert rows["ours:none"]["ms_per_token"] == 110.0 and rows["ours:none"]["vs_wllama"] == round(310 / 110, 3)
    d = rows["ours:draft@2"]
    assert (d["ms_per_token"], d["tokens_per_round"], d["vs_alone"]) == (60.0, 2.3, round(110 / 60, 3))
    assert d["draft_share"] == round(10.0 / 110.0, 3)          # ms per proposal / the champion alone's ms per token
    assert d["v_ratio"] == round(140.0 / 100.0, 3)             # verification per round / per single step
    assert rows["wllama:1t"]["draft_share"] is None and rows["wllama:1t"]["wasm_champion_mb"] is None
    assert rows["wllama:2t"]["vs_wllama"] == round(310 / 410, 3)
    assert (d["wasm_champion_mb"], d["wasm_draft_mb"], d["load_s"]) == (50.0, 8.0, 1.5)
    table = real_sizes.markdown_table(real_sizes.summarise(runners))
    assert "| ours:draft@2 | 60.0 | 1.83x | 5.17x | 2.30 | 10.0 (0.091) | 1.40 |" in table
    runners[3]["ready"] = {"info": {"draft": {"placement": "inline"}}}    # the draft inside the champion's instance
    assert "| 50 (draft inside) |" in real_sizes.markdown_table(real_sizes.summarise(runners))
    ag = real_sizes.agreement(runners)
    assert ag["draft_vs_alone"] == {"ours:draft@2": [None, 2]}     # prompt 1 differs at token 2: reported


@pytest.fixture(scope="module")
def toy_ggufs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real_sizes")
    champion, draft = str(folder / "toy.q4_1.gguf"), str(folder / "toy_draft.f32.gguf")
    export_gguf(str(MODELS / "champion"), champion, "q4_1")
    export_gguf(str(MODELS / "draft"), draft, "f32")
    return folder, champion, draft


def test_the_benchmark_runs_the_toy_pair(chromium_browser, toy_ggufs):  # noqa: F811
    folder, champion, draft = toy_ggufs
    args = real_sizes.parse_args(["--champion", champion, "--draft", draft, "--prompts", "1", "--max-new-tokens", "6",
                                  "--ks", "2,3", "--wllama-threads", "1,2", "--json", str(folder / "rs.json")])
    out = real_sizes.run(args, browser=chromium_browser)
    rows = {r["runner"]: r for r in out["rows"]}
    assert sorted(rows) == ["ours:draft@2", "ours:draft@3", "ours:none", "wllama:1t", "wllama:2t"]
    for name, row in rows.items():
        assert row["ms_per_token"] > 0 and row["load_s"] > 0 and row["requests"] == 1, name
        assert row["browser_pss_growth_mb"] > 0, name
    alone = next(r for r in out["runners"] if r["name"] == "ours:none")
    assert alone["memory"]["wasm_champion_bytes"] > 0 and alone["memory"]["wasm_draft_bytes"] == 0
    inline = rows["ours:draft@3"]["draft_inline"]
    assert inline == (out["runners"][-1]["ready"]["info"]["draft"]["placement"] == "inline")
    # an inline draft lives in the champion's WASM memory: it has none of its own (counted once)
    assert (rows["ours:draft@3"]["wasm_draft_mb"] == 0) == inline and rows["ours:draft@3"]["draft_share"] > 0
    assert out["weight_file_bytes"] == os.path.getsize(champion)
    assert out["agreement"]["draft_vs_alone"] == {"ours:draft@2": [None], "ours:draft@3": [None]}
    text = real_sizes.report(out)
    assert "identical in every run" in text and "against its weight file" in text
    json.dumps(out)       # the whole record is JSON

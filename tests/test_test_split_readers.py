"""The locked test split of eval/corpus is read only by `exactspec bench --split test`: the tuning
and benchmark tools that read the corpus files themselves skip its prompts."""
import importlib.util
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
CORPUS = REPO / "eval" / "corpus"


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prompts(split):
    out = set()
    for f in CORPUS.glob("*.jsonl"):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip() and json.loads(line).get("split") == split:
                out.add(json.loads(line)["prompt"])
    return out


def test_peer_bench_reads_dev_prompts_only():
    peer = _load(REPO / "tools" / "bench" / "peer.py")
    strata = sorted(f.stem for f in CORPUS.glob("*.jsonl"))
    texts = {p["text"] for p in peer.prompt_set(99, strata, corpus_only=True)}
    assert texts and texts <= _prompts("dev") and not texts & _prompts("test")


def test_every_corpus_reader_outside_the_evaluation_skips_the_test_split():
    readers = [p for p in (REPO / "tools").rglob("*.py") if '"corpus"' in p.read_text() or "CORPUS_DIR" in p.read_text()]
    readers = [p for p in readers if "eval" in p.read_text()]
    assert readers
    for path in readers:
        assert '"split"' in path.read_text(), f"{path.relative_to(REPO)} reads eval/corpus without skipping the test split"

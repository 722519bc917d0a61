"""Generated files are not stale: regenerating them gives the committed bytes."""
import importlib.util
from pathlib import Path

SHADERS = Path(__file__).resolve().parent.parent / "shaders"


def load_gen_matmul():
    spec = importlib.util.spec_from_file_location("gen_matmul", SHADERS / "gen_matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matmul_shaders_equal_the_generator_output():
    gen = load_gen_matmul()
    committed = {name: (SHADERS / name).read_bytes() for name in gen.FILES}
    params = {gen.parameters_of(text.decode()) for text in committed.values()}
    assert None not in params, "a matmul shader lost its GENERATED header line"
    assert len(params) == 1, f"the two matmul shaders were generated with different (C, R): {params}"
    C, R = params.pop()
    for name, text in gen.generate(C, R).items():
        assert committed[name] == text.encode(), (
            f"shaders/{name} is stale or hand-edited: run `python3 shaders/gen_matmul.py {C} {R}`")


def test_generator_writes_to_a_given_directory(tmp_path):
    gen = load_gen_matmul()
    gen.main(["3", "2", "--out", str(tmp_path)])
    for name, text in gen.generate(3, 2).items():
        written = (tmp_path / name).read_text()
        assert written == text and gen.parameters_of(written) == (3, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(gen.FILES)

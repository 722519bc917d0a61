"""tools/gguf_first_layers.py: a GGUF cut to its first layers loads as an L-layer model with the
original's tensors, bytes unchanged (every block type), and the metadata otherwise the same."""
from __future__ import annotations

import sys
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from exactspec.formats.gguf import GGUFFile
from exactspec.formats.gguf_model import GGUFModel
from synthetic_models import write_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from gguf_first_layers import first_layers  # noqa: E402

TYPES = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q6_K, "attn_q.weight": Q.Q4_K, "attn_k.weight": Q.Q4_1,
         "attn_v.weight": Q.Q4_0, "attn_output.weight": Q.F16, "ffn_gate.weight": Q.BF16, "ffn_up.weight": Q.Q8_0,
         "ffn_down.weight": Q.Q6_K}


def test_first_layers_keeps_the_tensors_and_metadata(tmp_path):
    src, dst = str(tmp_path / "full.gguf"), str(tmp_path / "cut.gguf")
    write_tiny_model(src, types=TYPES)
    first_layers(src, dst, 1)
    with GGUFModel(dst) as cut, GGUFFile(src) as full:
        assert cut.llama_config.num_hidden_layers == 1
        assert set(cut.file.tensors) == {n for n in full.tensors if not n.startswith("blk.1.")}
        for name, t in cut.file.tensors.items():
            assert (t.type_name, t.shape) == (full.tensors[name].type_name, full.tensors[name].shape)
            assert cut.file.read_raw(name, 0, t.rows) == full.read_raw(name, 0, t.rows), name
        changed = {k for k in full.metadata if cut.file.metadata.get(k) != full.metadata[k]}
        assert changed == {"llama.block_count"}

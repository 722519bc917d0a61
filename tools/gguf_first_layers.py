"""A GGUF file cut to its first L transformer layers: same metadata (block_count L), same tensors as stored.

    python tools/gguf_first_layers.py SmolLM2-135M-Instruct.Q4_1.gguf build/smollm2-2layers.gguf 2

Used to count how many logits rows the WASM champion and the q8act reference share bit for bit at
a given depth (docs/reference_model.md, "The WASM champion against the q8act reference").
"""
from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0] + "/py")
from exactspec.formats.gguf import GGUFFile  # noqa: E402


def first_layers(src: str, dst: str, layers: int) -> None:
    with GGUFFile(src) as f:
        arch = f.metadata["general.architecture"]
        w = GGUFWriter(dst, arch)
        for key, value in f.metadata.items():
            if key == "general.architecture":
                continue                                  # GGUFWriter writes it
            vtype = f.value_types[key]
            value = layers if key == f"{arch}.block_count" else value
            if vtype.startswith("ARRAY["):
                w.add_key_value(key, list(value), GGUFValueType.ARRAY, GGUFValueType[vtype[len("ARRAY["):-1]])
            else:
                w.add_key_value(key, value, GGUFValueType[vtype])
        for name, t in f.tensors.items():
            if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
                continue
            raw = np.frombuffer(f.read_raw(name, 0, t.rows), dtype=np.uint8)
            if t.type_name == "F32":
                w.add_tensor(name, raw.view("<f4").reshape(t.shape))
            else:
                w.add_tensor(name, raw.reshape(t.rows, -1), raw_dtype=GGMLQuantizationType[t.type_name])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    first_layers(sys.argv[1], sys.argv[2], int(sys.argv[3]))

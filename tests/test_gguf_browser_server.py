"""The static server's GGUF rules: the real model's folder serves only its .gguf files (404 while
absent), and a one-file mount (the CLI's --champion FILE.gguf) serves only that file's name."""
from __future__ import annotations

import os

from exactspec.host.server import GGUF_ONLY_PREFIXES, check_mounts, resolve_request_path

PREFIX = next(iter(GGUF_ONLY_PREFIXES))


def test_real_model_folder_serves_only_gguf_files(tmp_path):
    assert resolve_request_path(PREFIX + "m.gguf", tmp_path, ("/web/",)) is None          # absent: 404
    folder = tmp_path / GGUF_ONLY_PREFIXES[PREFIX]
    folder.mkdir(parents=True)
    (folder / "m.gguf").write_bytes(b"GGUF")
    (folder / "status.json").write_text("{}")
    (folder / "sub").mkdir()
    (folder / "sub" / "x.gguf").write_bytes(b"GGUF")
    os.symlink("/etc/hostname", folder / "link.gguf")
    assert resolve_request_path(PREFIX + "m.gguf", tmp_path, ("/web/",)) == str(folder / "m.gguf")
    for name in ("status.json", "sub/x.gguf", "link.gguf", "..%2Fm.gguf", "", "%2e%2e/m.gguf"):
        assert resolve_request_path(PREFIX + name, tmp_path, ("/web/",)) is None, name


def test_one_file_mount_serves_only_its_name(tmp_path):
    model = tmp_path / "My Model.gguf"
    model.write_bytes(b"GGUF")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    mounts = check_mounts({"/models/champion/": str(model)})
    assert resolve_request_path("/models/champion/My%20Model.gguf", tmp_path, (), mounts) == str(model)
    for name in ("other.gguf", "My%20Model.gguf/x", "", "../other.gguf"):
        assert resolve_request_path("/models/champion/" + name, tmp_path, (), mounts) is None, name

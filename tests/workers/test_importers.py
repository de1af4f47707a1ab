"""The import readers on their own (no server): format detection, and the checks that need no
model or dataset, on files written here. End to end: tests/server/test_import.py."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from actstore.errors import InvalidArgument, NotFound
from actstore.workers.importers import detect_format, open_source, pool_blocks

IDS = ["a", "b", "c"]


def _arrays(folder, n=3, width=4, states=3):
    folder.mkdir()
    for k in range(states):
        np.save(folder / f"layer_{k}.npy", np.full((n, width), k, np.float32))
    return folder


def test_detection(tmp_path):
    assert detect_format(_arrays(tmp_path / "npy")) == "arrays"
    save_file({"layer.0": torch.zeros(3, 4)}, str(tmp_path / "one.safetensors"))
    assert detect_format(tmp_path / "one.safetensors") == "arrays"
    (tmp_path / "vllm").mkdir()
    for sid in IDS:
        save_file({"hidden_states": torch.zeros(2, 3, 4)}, str(tmp_path / "vllm" / f"{sid}.safetensors"))
    assert detect_format(tmp_path / "vllm") == "vllm"
    datasets.Dataset.from_dict({"x": [1]}).save_to_disk(str(tmp_path / "hf"))
    assert detect_format(tmp_path / "hf") == "saelens"
    with pytest.raises(NotFound):
        open_source(tmp_path / "missing", None, IDS)


def test_arrays_checks(tmp_path):
    source = open_source(_arrays(tmp_path / "ok"), None, IDS)
    assert (source.n, source.num_states, source.width, source.dtype, source.per_token) == (3, 3, 4, "float32", False)
    assert source.pooled_rows(1, 3).shape == (2, 3, 4) and float(source.pooled_rows(0, 1)[0, 2, 0]) == 2.0
    twice = _arrays(tmp_path / "twice")
    np.save(twice / "layer_01.npy", np.zeros((3, 4), np.float32))
    with pytest.raises(InvalidArgument, match="layer_01.npy and layer_1.npy are both layer 1|layer_1.npy and "
                                              "layer_01.npy are both layer 1"):
        open_source(twice, None, IDS)
    mixed = _arrays(tmp_path / "mixed")
    np.save(mixed / "layer_2.npy", np.zeros((3, 4), np.float16))
    with pytest.raises(InvalidArgument, match="the layers mix dtypes"):
        open_source(mixed, None, IDS)
    both = _arrays(tmp_path / "both")
    save_file({"x": torch.zeros(3, 4)}, str(both / "layer_0.safetensors"))
    with pytest.raises(InvalidArgument, match="both layer_<k>.npy and layer_<k>.safetensors"):
        open_source(both, None, IDS)
    (tmp_path / "two").mkdir()
    save_file({"x": torch.zeros(3, 4), "y": torch.zeros(3, 4)}, str(tmp_path / "two" / "layer_0.safetensors"))
    with pytest.raises(InvalidArgument, match="holds 2 tensors"):
        open_source(tmp_path / "two", None, IDS)
    save_file({"layer.0": torch.zeros(3, 4), "extra": torch.zeros(3)}, str(tmp_path / "keys.safetensors"))
    with pytest.raises(InvalidArgument, match="tensor 'extra' is not named layer.<k>"):
        open_source(tmp_path / "keys.safetensors", None, IDS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="no layer_<k>.npy or layer_<k>.safetensors files"):
        open_source(tmp_path / "empty", None, IDS)
    pickled = _arrays(tmp_path / "pickled")
    np.save(pickled / "layer_0.npy", np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    with pytest.raises(InvalidArgument, match="object array, which is not loaded"):
        open_source(pickled, None, IDS)
    for name, content in {"random": np.random.default_rng(0).bytes(4096), "short": b"\x93NUM"}.items():
        garbage = _arrays(tmp_path / name)
        (garbage / "layer_2.npy").write_bytes(content)
        with pytest.raises(InvalidArgument, match=r"layer_2.npy is not a .npy file \(it does not start with the "
                                                   r"\\x93NUMPY header"):
            open_source(garbage, None, IDS)


def test_vllm_checks(tmp_path):
    (tmp_path / "v").mkdir()
    for i, sid in enumerate(IDS):
        save_file({"hidden_states": torch.full((i + 1, 3, 4), float(i)), "token_ids": torch.arange(i + 1)},
                  str(tmp_path / "v" / f"{sid}.safetensors"))
    source = open_source(tmp_path / "v", "vllm", IDS)
    assert source.token_counts().tolist() == [1, 2, 3] and source.per_token
    blocks = source.token_blocks(1, 3)
    assert [b[0].shape[0] for b in blocks] == [2, 3] and blocks[1][1].tolist() == [0, 1, 2]
    assert pool_blocks(blocks, "mean").shape == (2, 3, 4)
    assert open_source(tmp_path / "v", "vllm", IDS[::-1]).files[0].name == "c.safetensors"  # the dataset's order
    with pytest.raises(InvalidArgument, match="1 files name no sample of the dataset"):
        open_source(tmp_path / "v", "vllm", IDS[:2])
    save_file({"hidden_states": torch.zeros(2, 3, 5)}, str(tmp_path / "v" / "c.safetensors"))
    with pytest.raises(InvalidArgument, match="the files disagree on \\(layers, width\\)"):
        open_source(tmp_path / "v", "vllm", IDS)
    save_file({"hidden_states": torch.zeros(2, 3, 4), "token_ids": torch.arange(5)},
              str(tmp_path / "v" / "c.safetensors"))
    with pytest.raises(InvalidArgument, match="2 rows of hidden states but 5 token ids"):
        open_source(tmp_path / "v", "vllm", IDS)
    save_file({"states": torch.zeros(2, 3, 4)}, str(tmp_path / "v" / "c.safetensors"))
    with pytest.raises(InvalidArgument, match="has no tensor 'hidden_states'"):
        open_source(tmp_path / "v", "vllm", IDS)


def test_saelens_checks(tmp_path):
    def save(name, columns):
        features = datasets.Features({c: datasets.Array2D(shape=(2, 4), dtype="float32") for c in columns})
        datasets.Dataset.from_dict({c: np.zeros((3, 2, 4), np.float32) for c in columns},
                                   features=features).save_to_disk(str(tmp_path / name))
        return tmp_path / name

    ok = save("ok", ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"][:2])
    source = open_source(ok, None, IDS)
    assert (source.num_states, source.width, source.token_counts().tolist()) == (2, 4, [2, 2, 2])
    with pytest.raises(InvalidArgument, match="are both layer 1"):
        open_source(save("dup", ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre"]),
                    None, IDS)
    with pytest.raises(InvalidArgument, match="residual-stream layer 0 is missing"):
        open_source(save("gap", ["blocks.1.hook_resid_pre"]), None, IDS)


def test_arrays_damage_says_what_is_wrong_and_what_to_do(tmp_path):
    cut = _arrays(tmp_path / "cut")
    whole = (cut / "layer_1.npy").read_bytes()
    (cut / "layer_1.npy").write_bytes(whole[:-8])  # numpy itself says only "mmap length is greater than file size"
    with pytest.raises(InvalidArgument, match=r"layer_1.npy as .npy \(its header declares \(3, 4\) float32 "
                                              rf"\({len(whole)} bytes\) but the file holds {len(whole) - 8}: cut "
                                              r"short\?\): write it again with numpy.save"):
        open_source(cut, None, IDS)
    ids = _arrays(tmp_path / "ids")
    (ids / "sample_ids.json").write_text("a, b, c")
    with pytest.raises(InvalidArgument, match=r"sample_ids.json \(.*\): it must be a JSON list of sample id strings"):
        open_source(ids, None, None)
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "layer_0.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(InvalidArgument, match=r"as safetensors \(.*\): write it again with safetensors' save_file"):
        open_source(tmp_path / "st", None, IDS)


def test_big_endian_floats_are_floats(tmp_path):
    folder = tmp_path / "be"
    folder.mkdir()
    values = np.arange(36, dtype=np.float32).reshape(3, 3, 4)
    for k in range(3):
        np.save(folder / f"layer_{k}.npy", values[:, k].astype(">f4"))
    source = open_source(folder, None, IDS)
    assert source.dtype == "float32"
    np.testing.assert_array_equal(source.pooled_rows(0, 3).numpy(), values)

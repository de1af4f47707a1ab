"""Format ``vllm``: the safetensors files vLLM's ``extract_hidden_states`` writes.

vLLM (speculative method ``extract_hidden_states`` with the ``ExampleHiddenStatesConnector``)
writes one file per request, ``<shared_storage_path>/<request id>.safetensors``, holding
``hidden_states`` of shape (prompt tokens, layers extracted, width) and ``token_ids`` (prompt
tokens,), plus a ``.lock`` file beside it. The layers are the ones listed in
``eagle_aux_hidden_state_layer_ids``; vLLM's layer id k is the input of decoder layer k (HF
``hidden_states[k]``) and ``num_hidden_layers`` the last layer's output before the final norm, so an
import needs the ids ``[0, 1, ..., num_hidden_layers]``: the file's layer axis is then layers 0..L.

The file of a sample is named by its sample id: ``<sample id>.safetensors`` (pass
``kv_transfer_params={"hidden_states_path": ...}`` per request, or rename the files). Every
sample of the dataset needs its file and every file its sample. The import pools each sample's
tokens (cls = first, last, mean) or keeps them all (pooling ``tokens``, with their token ids).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from actstore.errors import InvalidArgument
from actstore.workers.importers.arrays import SAFETENSORS_DTYPES, safetensors_failure
from actstore.workers.importers.base import ImportSource, as_float32, check_float

HIDDEN, TOKENS = "hidden_states", "token_ids"


class VllmSource(ImportSource):
    format = "vllm"
    per_token = True

    def __init__(self, path: Path, dataset_ids: list[str], check: bool = True) -> None:
        """``check``: read every file's header (shapes, dtypes, token counts); a shard task, whose
        source was checked when the import was submitted, reads only its own files."""
        if not path.is_dir():
            raise InvalidArgument(f"{path} is not a folder: a vllm import reads the folder of <sample id>.safetensors "
                                  "files extract_hidden_states wrote")
        self.path = path
        by_id = {p.name.removesuffix(".safetensors"): p for p in path.iterdir() if p.name.endswith(".safetensors")}
        missing = [s for s in dataset_ids if s not in by_id]
        if missing:
            raise InvalidArgument(f"{path}: sample {missing[0]!r} has no file {missing[0]}.safetensors ({len(missing)} "
                                  f"of {len(dataset_ids)} samples have none): name each file by its sample id")
        extra = sorted(set(by_id) - set(dataset_ids))
        if extra:
            raise InvalidArgument(f"{path}: {len(extra)} files name no sample of the dataset (e.g. {extra[0]}"
                                  ".safetensors): the sample ids must match the dataset's")
        self.files = [by_id[s] for s in dataset_ids]
        self.n = len(self.files)
        if check:
            self._check()

    def _check(self) -> None:
        path = self.path
        counts, shapes, dtypes = [], set(), set()
        for f in self.files:
            shape, dtype, tokens = self._header(f)
            counts.append(shape[0])
            shapes.add(shape[1:])
            dtypes.add(dtype)
            if tokens is not None and tokens != shape[0]:
                raise InvalidArgument(f"{f}: {shape[0]} rows of hidden states but {tokens} token ids")
        if len(shapes) > 1:
            raise InvalidArgument(f"{path}: the files disagree on (layers, width): {sorted(shapes)}: "
                                  "extract every request with the same layer ids")
        if len(dtypes) > 1:
            raise InvalidArgument(f"{path}: the files mix dtypes ({', '.join(sorted(dtypes))})")
        self.num_states, self.width = shapes.pop()
        self.dtype = check_float(dtypes.pop(), f"{path}: hidden_states")
        self._counts = np.asarray(counts, dtype=np.int64)

    def _header(self, f: Path) -> tuple[tuple[int, ...], str, int | None]:
        from safetensors import SafetensorError, safe_open

        try:
            opened = safe_open(str(f), framework="pt")
        except (SafetensorError, OSError) as exc:
            raise safetensors_failure(f, exc) from None
        if HIDDEN not in opened.keys():
            raise InvalidArgument(f"{f} has no tensor {HIDDEN!r} (it holds {', '.join(opened.keys()) or 'none'})")
        hidden = opened.get_slice(HIDDEN)
        shape = tuple(hidden.get_shape())
        if len(shape) != 3 or shape[0] < 1:
            raise InvalidArgument(f"{f}: {HIDDEN} has shape {shape}; vLLM writes (tokens, layers, width)")
        tokens = tuple(opened.get_slice(TOKENS).get_shape()) if TOKENS in opened.keys() else None
        if tokens is not None and len(tokens) != 1:
            raise InvalidArgument(f"{f}: {TOKENS} has shape {tokens}; expected (tokens,)")
        code = hidden.get_dtype()
        return shape, SAFETENSORS_DTYPES.get(code, code.lower()), tokens[0] if tokens else None

    def token_counts(self) -> np.ndarray:
        return self._counts

    def token_blocks(self, start: int, stop: int) -> list[tuple[torch.Tensor, np.ndarray | None]]:
        from safetensors.torch import load_file

        blocks = []
        for f in self.files[start:stop]:
            tensors = load_file(str(f))
            ids = tensors.get(TOKENS)
            blocks.append((as_float32(tensors[HIDDEN], str(f)),
                           None if ids is None else ids.numpy().astype(np.int64)))
        return blocks

    def describe(self) -> str:
        return f"{self.path} ({self.n} vLLM files, {self.num_states} layers x {self.width} {self.dtype})"

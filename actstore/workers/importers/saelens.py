"""Format ``saelens``: a cached-activations dataset as SAELens's ``CacheActivationsRunner`` writes it.

The runner saves a Hugging Face dataset (``save_to_disk``; opened here with
``datasets.load_from_disk``) with one row per context window and one column per hook point, an
``Array2D`` of shape (context_size, d_in), named by the TransformerLens hook (e.g.
``blocks.3.hook_resid_post``); newer versions add ``token_ids`` (context_size,). An import reads
the residual stream: ``blocks.<i>.hook_resid_pre`` is layer i and ``blocks.<i>.hook_resid_post``
layer i + 1, so the columns together must cover layers 0..L (e.g. ``blocks.0.hook_resid_pre`` and
``blocks.<i>.hook_resid_post`` for every block). Other hook columns are refused; columns that are
not hooks (``token_ids``, ...) are not activations.

Row i is sample i of the dataset (cache with ``shuffle=False``; register the context windows'
texts as the dataset). Every sample holds context_size tokens, which the import pools or keeps.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from actstore.errors import InvalidArgument
from actstore.workers.importers.base import ImportSource, as_float32, check_float, check_layers

RESIDUAL = re.compile(r"blocks\.(\d+)\.hook_resid_(pre|post)")
TOKENS = "token_ids"


class SaeLensSource(ImportSource):
    format = "saelens"
    per_token = True

    def __init__(self, path: Path) -> None:
        import datasets
        import pyarrow as pa

        self.path = path
        try:
            loaded = datasets.load_from_disk(str(path))
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"cannot read {path} as a SAELens cached-activations dataset (a save_to_disk "
                                  f"folder): {str(exc).splitlines()[0][:200]}") from None
        if not isinstance(loaded, datasets.Dataset):
            raise InvalidArgument(f"{path} is a DatasetDict; import the folder of one split")
        self._data = loaded
        columns: dict[int, str] = {}
        for name, feature in loaded.features.items():
            match = RESIDUAL.fullmatch(name)
            if match is None:
                if name.startswith(("blocks.", "hook_")):
                    raise InvalidArgument(f"{path}: column {name!r} is not the residual stream; an import reads "
                                          "blocks.<i>.hook_resid_pre (layer i) and blocks.<i>.hook_resid_post "
                                          "(layer i+1) only")
                continue
            layer = int(match.group(1)) + (match.group(2) == "post")
            if layer in columns:
                raise InvalidArgument(f"{path}: columns {columns[layer]!r} and {name!r} are both layer {layer}")
            if not isinstance(feature, datasets.Array2D):
                raise InvalidArgument(f"{path}: column {name!r} is a {type(feature).__name__}, not an Array2D of "
                                      "(context_size, d_in) as SAELens writes")
            columns[layer] = name
        self._columns = [columns[k] for k in check_layers(columns, str(path), unit="residual-stream layer")]
        shapes = {loaded.features[c].shape for c in self._columns}
        dtypes = {loaded.features[c].dtype for c in self._columns}
        if len(shapes) > 1:
            raise InvalidArgument(f"{path}: the hook columns disagree on (context_size, d_in): {sorted(shapes)}")
        if len(dtypes) > 1:
            raise InvalidArgument(f"{path}: the hook columns mix dtypes ({', '.join(sorted(dtypes))})")
        self._context, self.width = shapes.pop()
        self.dtype = check_float(dtypes.pop(), f"{path}: {self._columns[0]}")
        self.n = loaded.num_rows
        self.num_states = len(self._columns)
        self._tokens = TOKENS in loaded.features
        self.files = sorted(p for p in path.iterdir() if p.is_file())

    def token_counts(self) -> np.ndarray:
        return np.full(self.n, self._context, dtype=np.int64)

    def token_blocks(self, start: int, stop: int) -> list[tuple[torch.Tensor, np.ndarray | None]]:
        wanted = self._columns + ([TOKENS] if self._tokens else [])
        rows = self._data.select_columns(wanted).with_format("numpy")[start:stop]
        layers = torch.stack([as_float32(rows[c], f"{self.path}: {c}") for c in self._columns], dim=2)
        ids = rows[TOKENS].astype(np.int64) if self._tokens else None
        return [(layers[i], None if ids is None else ids[i]) for i in range(stop - start)]

    def describe(self) -> str:
        return (f"{self.path} (SAELens dataset, {self.n} contexts of {self._context} tokens, {self.num_states} layers "
                f"x {self.width} {self.dtype})")

"""A run's Zarr arrays as a lazy `xarray.DataArray`, opened by the client itself (no server code).

The server says where the run is (`LocateRun`: its store root and group); this module opens the
group with zarr 3 (a local directory, or a store URL through obstore: an s3:// bucket with the AWS_* variables)
and wraps the activation array as an xarray lazy backend array: nothing is read until values are
asked for, and a selection reads only the chunks it touches. Zarr decodes the stored chunks (Blosc
+ crc32c: a damaged chunk raises, never returns numbers; so does a missing shard, which zarr itself
would read as zeros); bfloat16, kept as the upper 16 bits in
uint16, is widened to float32 here, and an int8 run's codes are decoded with their shards' steps
and offsets (its `scales` array: value = code * scales[shard, 0] + scales[shard, 1], float32, the
multiply first, as the store decodes them); the layers its `exact` array names (a capture's
max_cka_error kept them exact) are read from there instead, float32. xarray's own `open_zarr` is
not used: Zarr v3 arrays need `dimension_names` metadata for it, which the store does not write.

Layout read (store/format/arrays.py): `acts` (n, L+1, d) or `tokens` (T, L+1, d); `sample_ids` as UTF-8
bytes with `sample_id_offsets`; `labels` (n,) where known; `offsets` (n+1,) for token-level runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
from xarray.backends import BackendArray
from xarray.core import indexing

from actstore.errors import DataLoss, FailedPrecondition
from actstore.event_loop import sync

# what zarr and its codecs raise for bytes that fail their crc32c or do not decode
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, RuntimeError, EOFError)


class _StoredActivations(BackendArray):
    def __init__(self, array: zarr.Array, bfloat16: bool, run_key: str, scales: zarr.Array | None = None,
                 exact: zarr.Array | None = None) -> None:
        self.array = array
        self.bfloat16 = bfloat16
        self.scales = scales  # an int8 run's (shards, 2, L+1, d) steps and offsets
        self.exact = exact  # its layers kept exact, (rows, k, d) float32, named by exact.attrs["layers"]
        self.run_key = run_key
        self.shape = tuple(array.shape)
        decoded = bfloat16 or scales is not None
        self.dtype = np.dtype(np.float32) if decoded else np.dtype(array.dtype)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER, self._read)

    def _read(self, key: tuple) -> np.ndarray:
        try:
            values = self.array.oindex[key]
        except _DECODE_ERRORS as exc:
            raise self._damaged(f"a chunk of {self.array.path} is damaged ({str(exc).splitlines()[0][:200]})") from None
        missing = self._missing_shards(key[0])
        if missing:
            raise self._damaged(f"shard(s) {', '.join(map(str, missing[:10]))} of {self.array.path} are missing "
                                "from the store")
        if self.scales is not None:
            return self._with_exact(self._decoded(values, key), key)
        return (values.astype(np.uint32) << 16).view(np.float32) if self.bfloat16 else values

    def _with_exact(self, values: np.ndarray, key: tuple) -> np.ndarray:
        """`values` at ``key`` with the layers kept exact taken from the `exact` array."""
        if self.exact is None:
            return values
        where = {int(layer): i for i, layer in enumerate(self.exact.attrs["layers"])}
        chosen = np.arange(self.shape[1])[key[1]]
        picked = [(j, where[int(layer)]) for j, layer in enumerate(np.atleast_1d(chosen)) if int(layer) in where]
        if not picked:
            return values
        kept = self.exact.oindex[(key[0], [p for _, p in picked], key[2])]
        axis = 0 if isinstance(key[0], (int, np.integer)) else 1  # the layers' axis (an int key drops its own)
        if np.ndim(chosen) == 0:  # one layer asked for, by its index: its axis is gone from the answer
            return np.take(kept, 0, axis=axis)
        np.moveaxis(values, axis, 0)[[j for j, _ in picked]] = np.moveaxis(kept, axis, 0)
        return values

    def _decoded(self, codes: np.ndarray, key: tuple) -> np.ndarray:
        """An int8 run's codes at ``key`` as float32 values, each row with its shard's state."""
        shards = np.arange(self.shape[0])[key[0]] // self.array.shards[0]
        touched = np.unique(shards)
        try:
            state = self.scales.oindex[(touched, slice(None), key[1], key[2])]
        except _DECODE_ERRORS as exc:
            raise self._damaged(f"a chunk of {self.scales.path} is damaged ({str(exc).splitlines()[0][:200]})") \
                from None
        where = np.searchsorted(touched, shards)
        return codes.astype(np.float32) * state[where, 0] + state[where, 1]

    def _missing_shards(self, rows) -> list[int]:
        """The shards the selected rows lie in that the store does not hold. Zarr reads a missing
        object as its fill value (zeros): every shard of a committed run exists, so one that is
        not there was lost, and its rows must not come back as numbers."""
        shard_rows = self.array.shards[0]
        shards = np.unique(np.arange(self.shape[0])[rows] // shard_rows).tolist()
        keys = [f"{self.array.path}/c/{shard}/" + "/".join("0" * (len(self.shape) - 1)) for shard in shards]
        named = list(shards)
        if self.scales is not None:  # a missing chunk of steps (or of layers kept exact) would read as zeros too
            keys += [f"{self.scales.path}/c/{shard}/0/0/0" for shard in named]
            shards = shards + named
        if self.exact is not None:
            keys += [f"{self.exact.path}/c/{shard}/0/0" for shard in named]
            shards = shards + named
        store = self.array.store

        async def present():
            return await asyncio.gather(*(store.exists(key) for key in keys))

        # the store's coroutines, from this synchronous call (also inside a notebook's running loop)
        return [shard for shard, found in zip(shards, sync(present())) if not found]

    def _damaged(self, what: str) -> DataLoss:
        return DataLoss(f"run {self.run_key[:12]}: {what}; `actstore verify {self.run_key[:12]} --repair` drops the "
                        "damaged shards, then submit the same capture again")


def _store(root: str):
    """A read-only zarr store for the server's store root, as this process can reach it: a URL
    through obstore (`obstore.store.from_url` knows the object stores' schemes, configured by
    their usual variables: this layer imports no server code), a directory as zarr's LocalStore."""
    if "://" in root:
        from obstore.store import from_url
        from zarr.storage import ObjectStore

        # plain-HTTP endpoints allowed (MinIO on a LAN, a test server on loopback), as the server
        # allows them; an https endpoint is still spoken to over https
        return ObjectStore(from_url(root, client_options={"allow_http": True}), read_only=True)
    if not Path(root).is_dir():
        raise FailedPrecondition(f"the server's store {root} is not a directory this machine can see: to_xarray "
                                 "reads the arrays directly (run it where the store is mounted, or use an s3:// "
                                 "store); client.batches streams them from any machine")
    return zarr.storage.LocalStore(root, read_only=True)


def open_run(location) -> xr.DataArray:
    """`location`: the client's RunLocation of a committed run."""
    group = zarr.open_group(store=_store(location.store), path=location.group, mode="r")
    blob = group["sample_ids"][:].tobytes()
    bounds = group["sample_id_offsets"][:]
    ids = np.array([blob[a:b].decode() for a, b in zip(bounds[:-1], bounds[1:])], dtype=object)
    labels = group["labels"][:] if "labels" in group else None
    scales = group["scales"] if location.dtype == "int8" else None
    exact = group["exact"] if scales is not None and "exact" in group else None
    data = indexing.LazilyIndexedArray(_StoredActivations(group[location.array], location.dtype == "bfloat16",
                                                          location.run_key, scales, exact))
    coords: dict = {"layer": np.arange(location.num_layers + 1)}
    if location.pooling == "tokens":
        dims = ("token", "layer", "feature")
        sample = np.searchsorted(group["offsets"][:], np.arange(location.rows), side="right") - 1
        coords.update(sample=("token", sample), sample_id=("token", ids[sample]))
        if labels is not None:
            coords["label"] = ("token", labels[sample])
    else:
        dims = ("sample", "layer", "feature")
        coords["sample_id"] = ("sample", ids)
        if labels is not None:
            coords["label"] = ("sample", labels)
    attrs = {"run_key": location.run_key, "pooling": location.pooling, "stored_dtype": location.dtype}
    return xr.DataArray(xr.Variable(dims, data), coords=coords, name="activations", attrs=attrs)

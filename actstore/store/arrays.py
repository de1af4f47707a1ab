"""Activation arrays in Zarr v3: the `ArrayStore` implementation for local and object stores.

Layout of one run (DESIGN.md, Storage):
    runs/<run_key>/acts        (n, L+1, d)   pooled runs
    runs/<run_key>/tokens      (T, L+1, d)   token-level runs, with
    runs/<run_key>/offsets     (n+1,)        prompt i owns tokens[offsets[i]:offsets[i+1]]
    runs/<run_key>/sample_ids  (n,)  and  labels (n,) where known
    runs/<run_key>/layer_sums  (shards, L+1, d) float64, one chunk per shard, for the layer means
    runs/<run_key>/means       (L+1, d) float64, written at commit
Inner chunks are (rows, 1, d) so one layer reads alone; shards are (rows, L+1, d) and a writer
always writes whole shards, because concurrent writes into one shard lose data.
Every chunk carries a crc32c checksum: a corrupted chunk raises DataLoss, never returns numbers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import zarr
from obstore.exceptions import BaseError as ObjectStoreError
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from actstore.errors import DataLoss, NotFound
from actstore.metrics.layer_stats import LayerStats
from actstore.store import objects
from actstore.store.array_store import ArrayStore, RunLayout, decode_stored
from actstore.store.misses import MissCountingStore
from actstore.store.shard_codec import whole_chunk

COMMIT_MARKER = "committed.json"
# What zarr and its codecs raise for bytes that fail their checksum or do not decode (a failed
# crc32c is a ValueError; a garbled shard index or Blosc frame can be any of these).
DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, RuntimeError, EOFError)
# bfloat16 has no numpy dtype: it is kept as the upper 16 bits of float32, in a uint16 array.
_ZARR_DTYPE = {"float16": "float16", "float32": "float32", "bfloat16": "uint16"}


class ZarrArrayStore(ArrayStore):
    """Zarr v3 groups under `<root>/runs/`. Sharded arrays, Blosc + bitshuffle, crc32c.

    `root` is a local directory, or an `s3://bucket/prefix` URL for an S3-compatible object
    store (`store.objects`); the arrays, their layout and every check go through the zarr store
    interface, so both behave alike. Object-store failures raise our errors (`objects.failure`)."""

    def __init__(self, root: Path | str, compressor: str = "lz4", s3_config: objects.S3Config | None = None) -> None:
        self.root = root
        self.compressor = compressor
        self._url = objects.is_url(str(root))
        inner = objects.zarr_store(str(root), s3_config) if self._url else LocalStore(Path(root))
        self._zarr = MissCountingStore(inner)  # reads notice absent shards without asking first
        self._layouts: dict[str, RunLayout] = {}  # a created run's layout never changes
        # opened arrays of runs with a known layout: opening one reads metadata (a round trip each
        # on an object store), so a capture or a map task opens each once, not once per shard
        self._opened: dict[tuple[str, str], zarr.Array] = {}

    @contextmanager
    def _reported(self) -> Iterator[None]:
        """Object-store errors as ours (a local store's errors are left as they are)."""
        try:
            yield
        except (ObjectStoreError, OSError) as exc:
            if not self._url or isinstance(exc, FileNotFoundError):
                raise
            raise objects.failure(exc, str(self.root)) from None

    def _exists(self, key: str) -> bool:
        with self._reported():
            return sync(self._zarr.exists(key))

    def _group(self, run_key: str, mode: str = "r") -> zarr.Group:
        if mode == "r" and not self._exists(f"runs/{run_key}/zarr.json"):
            raise NotFound(f"run {run_key[:12]} has no arrays in the store at {self.root}")
        try:
            with self._reported():
                return zarr.open_group(store=self._zarr, path=f"runs/{run_key}", mode=mode)
        except (ValueError, KeyError, TypeError) as exc:  # a truncated or garbled zarr.json
            raise DataLoss(f"run {run_key[:12]}: its group metadata is damaged ({type(exc).__name__}); delete "
                           "the run and capture it again") from None

    def _codecs(self, itemsize: int) -> list:
        return [
            BloscCodec(cname=self.compressor, clevel=5, shuffle="bitshuffle", typesize=itemsize),
            Crc32cCodec(),
        ]

    def _side_array(self, group: zarr.Group, name: str, data: np.ndarray, overwrite: bool = False) -> None:
        group.create_array(name, data=data, compressors=self._codecs(data.dtype.itemsize), overwrite=overwrite)

    def _whole(self, run_key: str, group: zarr.Group, name: str, selection=slice(None),
               shard: int | None = None) -> np.ndarray:
        """A side array (or a slice of one), a failed checksum or decode as DataLoss naming it
        (and `shard`, the chunk the slice lies in, where it is one)."""
        try:
            with self._reported():
                return group[name][selection]
        except (*DECODE_ERRORS, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                raise
            raise damaged(run_key, name, _why(exc), shard=shard) from None

    def create_run(self, run_key, layout, sample_ids, labels, offsets, spec=None) -> None:
        self._forget(run_key)
        if self._exists(f"runs/{run_key}/zarr.json"):
            try:
                if self.layout(run_key) == layout:
                    return
            except NotFound:  # an interrupted create: start over
                pass
            self.delete_run(run_key)
        with self._reported():
            self._create(run_key, layout, sample_ids, labels, offsets, spec)

    def _create(self, run_key, layout, sample_ids, labels, offsets, spec) -> None:
        group = zarr.open_group(store=self._zarr, path=f"runs/{run_key}", mode="w")
        dtype = np.dtype(_ZARR_DTYPE[layout.dtype])
        group.create_array(
            layout.array_name,
            shape=(layout.rows, layout.num_states, layout.width),
            chunks=(layout.shard_rows, 1, layout.width),
            shards=(layout.shard_rows, layout.num_states, layout.width),
            dtype=dtype,
            compressors=self._codecs(dtype.itemsize),
            fill_value=0,
        )
        group.create_array(
            "layer_sums",
            shape=(layout.num_shards, layout.num_states, layout.width),
            chunks=(1, layout.num_states, layout.width),
            dtype="float64",
            compressors=self._codecs(8),
            fill_value=0,
        )
        # ids as UTF-8 bytes plus offsets: Zarr v3 has no stable string dtype
        encoded = [i.encode() for i in sample_ids]
        # every side array carries a crc32c too: a flipped byte in ids, labels or offsets is DataLoss
        self._side_array(group, "sample_ids", np.frombuffer(b"".join(encoded), dtype=np.uint8))
        self._side_array(group, "sample_id_offsets", np.cumsum([0] + [len(e) for e in encoded], dtype=np.int64))
        if labels is not None:
            self._side_array(group, "labels", np.asarray(labels, dtype=np.int64))
        if offsets is not None:
            self._side_array(group, "offsets", np.asarray(offsets, dtype=np.int64))
            group.create_array("token_ids", shape=(layout.rows,), chunks=(layout.shard_rows,), dtype="int64",
                               compressors=self._codecs(8), fill_value=-1)
        # The layout is written last: its presence marks a completely created group.
        group.attrs.update({"spec": spec, "layout": layout.to_dict()})

    def _forget(self, run_key: str) -> None:
        self._layouts.pop(run_key, None)
        for key in [k for k in self._opened if k[0] == run_key]:
            self._opened.pop(key, None)

    def _array(self, run_key: str, name: str) -> zarr.Array:
        """An array of a run, opened once while the run exists (`layout` checks that)."""
        self.layout(run_key)
        array = self._opened.get((run_key, name))
        if array is None:
            with self._reported():
                array = self._opened[run_key, name] = self._group(run_key, mode="r+")[name]
        return array

    def _opened_array(self, run_key: str, name: str) -> zarr.Array:
        """`_array` without its existence check (one round trip) once the array is open."""
        return self._opened.get((run_key, name)) or self._array(run_key, name)

    def layout(self, run_key: str) -> RunLayout:
        if run_key in self._layouts and not self._exists(f"runs/{run_key}/zarr.json"):
            self._forget(run_key)  # deleted through another handle
        if run_key not in self._layouts:
            attrs = self._group(run_key).attrs.asdict()
            if "layout" not in attrs:
                raise NotFound(f"run {run_key[:12]} was never completely created")
            self._layouts[run_key] = RunLayout(**attrs["layout"])
        return self._layouts[run_key]

    def write_shard(self, run_key, shard, values, sums, token_ids=None) -> None:
        layout = self.layout(run_key)
        start, stop = layout.shard_range(shard)
        if values.shape != (stop - start, layout.num_states, layout.width):
            expected = (stop - start, layout.num_states, layout.width)
            raise ValueError(f"shard {shard} expects {expected}, got {values.shape}")
        if sums.shape != (layout.num_states, layout.width):
            raise ValueError(f"shard {shard} sums must be {(layout.num_states, layout.width)}, got {sums.shape}")
        with self._reported():  # `layout` checked that the run exists: its arrays, once opened, are kept
            writes = [(self._opened_array(run_key, layout.array_name), slice(start, stop), values),
                      (self._opened_array(run_key, "layer_sums"), shard, sums)]
            if token_ids is not None:
                writes.append((self._opened_array(run_key, "token_ids"), slice(start, stop), token_ids))
            objects = [whole_chunk(array, shard, data) for array, _, data in writes]
            if None not in objects:  # every one a whole chunk in zarr's own bytes: written at once
                self._put(*objects)
                return
            for array, selection, data in writes:  # what the encoder declines: zarr's own write path
                array[selection] = data

    def read_layers(self, run_key, layers, start, stop) -> np.ndarray:
        # no existence check before the read: Zarr reads an absent shard as zeros, and the store
        # counts the reads of absent keys, so a shard missed by this read shows after it. A run
        # deleted through another handle shows the same way; its own existence is checked (a
        # second round trip) only then
        layout = self._layouts.get(run_key) or self.layout(run_key)
        array = self._opened_array(run_key, layout.array_name)
        shards = range(start // layout.shard_rows, -(-stop // layout.shard_rows))
        keys = [_shard_key(run_key, layout, shard) for shard in shards]
        before = self._zarr.misses(keys)
        try:
            with self._reported():
                if len(layers) == 1:
                    stored = array[start:stop, layers[0], :][None]
                elif len(set(layers)) == layout.num_states:
                    # every layer: whole shards, one request each (a layer alone costs two: the
                    # shard's index, then its chunk); fewer layers never decode the others
                    stored = np.moveaxis(array[start:stop], 1, 0)[layers]
                else:
                    stored = np.stack([array[start:stop, layer, :] for layer in layers])
        except DECODE_ERRORS as exc:
            raise self._located(run_key, layout, array, layers, start, stop, exc) from None
        for shard, was, now in zip(shards, before, self._zarr.misses(keys)):
            if now > was:
                self.layout(run_key)  # NotFound if the whole run is gone
                raise damaged(run_key, layout.array_name, "is missing from the store", shard=shard,
                              rows=layout.shard_range(shard))
        return decode_stored(stored, layout.dtype)

    def _located(self, run_key, layout, array, layers, start, stop, exc: Exception) -> DataLoss:
        """The DataLoss of a failed read, naming the first inner chunk (shard, layer) that fails
        alone (read again one by one: only on this error path)."""
        for shard in range(start // layout.shard_rows, -(-stop // layout.shard_rows)):
            lo, hi = layout.shard_range(shard)
            for layer in layers:
                try:
                    with self._reported():
                        array[lo:hi, layer, :]
                except DECODE_ERRORS as inner:
                    return damaged(run_key, layout.array_name, _why(inner), shard=shard, layer=layer, rows=(lo, hi))
        return damaged(run_key, layout.array_name, _why(exc), rows=(start, stop))

    def write_means(self, run_key: str) -> np.ndarray:
        layout = self.layout(run_key)
        group = self._group(run_key, mode="r+")
        means = self._whole(run_key, group, "layer_sums").sum(axis=0) / layout.rows
        self._side_array(group, "means", means, overwrite=True)
        return means

    def means(self, run_key: str) -> np.ndarray:
        group = self._group(run_key)
        if "means" not in group:
            raise NotFound(f"run {run_key[:12]} has no layer means yet: it is not committed")
        return self._whole(run_key, group, "means")

    def sample_ids(self, run_key: str) -> list[str]:
        group = self._group(run_key)
        blob = self._whole(run_key, group, "sample_ids").tobytes()
        bounds = self._whole(run_key, group, "sample_id_offsets")
        try:
            return [blob[a:b].decode() for a, b in zip(bounds[:-1], bounds[1:])]
        except (UnicodeDecodeError, ValueError) as exc:
            raise damaged(run_key, "sample_ids", f"does not decode ({exc})") from None

    def labels(self, run_key: str) -> np.ndarray | None:
        group = self._group(run_key)
        return self._whole(run_key, group, "labels") if "labels" in group else None

    def offsets(self, run_key: str) -> np.ndarray | None:
        group = self._group(run_key)
        return self._whole(run_key, group, "offsets") if "offsets" in group else None

    def write_char_spans(self, run_key: str, spans: np.ndarray) -> None:
        spans = np.asarray(spans, dtype=np.int32)
        if spans.shape != (self.layout(run_key).rows, 2):
            raise ValueError(f"char spans must be (rows, 2), got {spans.shape}")
        with self._reported():
            self._side_array(self._group(run_key, "r+"), "char_spans", spans, overwrite=True)

    def char_spans(self, run_key: str) -> np.ndarray | None:
        group = self._group(run_key)
        return self._whole(run_key, group, "char_spans") if "char_spans" in group else None

    def token_ids(self, run_key: str, start: int, stop: int) -> np.ndarray | None:
        group = self._group(run_key)
        if "token_ids" not in group:
            return None
        rows = self.layout(run_key).shard_rows  # one chunk per shard: read chunk by chunk, to name it
        parts = [self._whole(run_key, group, "token_ids", slice(max(start, s * rows), min(stop, (s + 1) * rows)),
                             shard=s) for s in range(start // rows, -(-stop // rows))]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def delete_run(self, run_key: str) -> None:
        self._forget(run_key)
        with self._reported():
            sync(self._zarr.delete(f"runs/{run_key}/{COMMIT_MARKER}"))
            sync(self._zarr.delete_dir(f"runs/{run_key}"))

    def group_keys(self) -> list[str]:
        return sorted(name for name in self._listed("list_dir", "runs") if name != "zarr.json")  # runs/ is a group

    def group_nbytes(self, run_key: str) -> int:
        with self._reported():
            return sync(self._zarr.getsize_prefix(f"runs/{run_key}"))

    def nbytes_stored(self, run_key: str) -> int:
        layout = self.layout(run_key)
        with self._reported():
            return sync(self._zarr.getsize_prefix(f"runs/{run_key}/{layout.array_name}"))

    # ---- integrity ---------------------------------------------------------------------------------
    def _shard_keys(self, run_key: str, shard: int) -> list[str]:
        layout = self.layout(run_key)
        return [_shard_key(run_key, layout, shard), f"runs/{run_key}/layer_sums/c/{shard}/0/0",
                f"runs/{run_key}/token_ids/c/{shard}", f"runs/{run_key}/chunk_rows/{shard}.json",
                f"runs/{run_key}/layer_stats/{shard}.json"]

    def shard_present(self, run_key: str, shard: int) -> bool:
        return self._exists(self._shard_keys(run_key, shard)[0])

    def layer_sums(self, run_key: str, shard: int) -> np.ndarray:
        if not self._exists(self._shard_keys(run_key, shard)[1]):
            raise damaged(run_key, "layer_sums", "is missing from the store", shard=shard)
        return self._whole(run_key, self._group(run_key), "layer_sums", shard, shard=shard)

    def array_shapes(self, run_key: str) -> dict[str, tuple[tuple[int, ...], str]]:
        group = self._group(run_key)
        shapes = {}
        for name in self._listed("list_dir", f"runs/{run_key}"):
            if not self._exists(f"runs/{run_key}/{name}/zarr.json"):
                continue
            try:
                with self._reported():
                    array = group[name]
                shapes[name] = (tuple(array.shape), str(array.dtype))
            except DECODE_ERRORS as exc:
                raise damaged(run_key, name, f"has unreadable metadata ({_why(exc)})") from None
        return shapes

    def drop_shards(self, run_key: str, shards: list[int]) -> None:
        keys = [key for shard in shards for key in self._shard_keys(run_key, shard)]
        with self._reported():
            for key in [*keys, f"runs/{run_key}/{COMMIT_MARKER}"]:
                sync(self._zarr.delete(key))
            sync(self._zarr.delete_dir(f"runs/{run_key}/means"))

    # ---- description ------------------------------------------------------------------------------
    def _put(self, *items: tuple[str, bytes]) -> None:
        """Objects (key, bytes), in one event-loop round trip (written concurrently)."""
        prototype = default_buffer_prototype()

        async def put() -> None:
            await asyncio.gather(*(self._zarr.set(key, prototype.buffer.from_bytes(data)) for key, data in items))

        with self._reported():
            sync(put())

    def _get(self, key: str) -> bytes | None:
        with self._reported():
            found = sync(self._zarr.get(key, prototype=default_buffer_prototype()))
        return None if found is None else found.to_bytes()

    def _listed(self, method: str, prefix: str) -> list[str]:
        """`list_dir` or `list_prefix` of the zarr store (made inside the event loop: the
        object store's listing needs a running loop)."""

        async def collect() -> list[str]:
            return [name async for name in getattr(self._zarr, method)(prefix)]

        with self._reported():
            return sync(collect())

    def run_keys(self) -> list[str]:
        return sorted(key for key in self._listed("list_dir", "runs")
                      if self._exists(f"runs/{key}/zarr.json"))

    def spec(self, run_key: str) -> dict | None:
        return self._group(run_key).attrs.asdict().get("spec")

    def write_chunk_rows(self, run_key: str, shard: int, rows: dict[str, list]) -> None:
        # one object per shard: shards are written concurrently, and a shared attribute would lose updates
        self._put((f"runs/{run_key}/chunk_rows/{shard}.json", json.dumps(rows).encode()))

    def chunk_rows(self, run_key: str) -> dict[str, list]:
        combined: dict[str, list] = {}
        for name in sorted(self._listed("list_prefix", f"runs/{run_key}/chunk_rows/")):
            payload = self._get(name)
            if payload is None:
                continue
            try:
                rows = json.loads(payload)
            except ValueError as exc:
                raise DataLoss(f"run {run_key[:12]}: the chunk rows {name} are unreadable ({exc})") from None
            for column, cells in rows.items():
                combined.setdefault(column, []).extend(cells)
        return combined

    def write_shard_stats(self, run_key: str, shard: int, stats: dict) -> None:
        self._put((f"runs/{run_key}/layer_stats/{shard}.json", json.dumps(stats).encode()))

    def write_layer_stats(self, run_key: str) -> dict | None:
        layout = self.layout(run_key)
        total = LayerStats.empty(layout.num_states)
        for shard in range(layout.num_shards):
            payload = self._get(f"runs/{run_key}/layer_stats/{shard}.json")
            if payload is None:  # a shard written before statistics existed: the run has none
                return None
            try:
                total.merge(LayerStats.from_dict(json.loads(payload)))
            except (ValueError, KeyError) as exc:
                raise damaged(run_key, "layer_stats", f"does not decode ({exc})", shard=shard) from None
        stats = total.finalize()
        with self._reported():
            self._group(run_key, mode="r+").attrs.update({"layer_stats": stats})
        return stats

    def layer_stats(self, run_key: str) -> dict | None:
        return self._group(run_key).attrs.asdict().get("layer_stats")

    def mark_committed(self, run_key: str) -> None:
        self._put((f"runs/{run_key}/{COMMIT_MARKER}", json.dumps({"run_key": run_key}).encode()))

    def is_committed(self, run_key: str) -> bool:
        return self._exists(f"runs/{run_key}/{COMMIT_MARKER}")


def _shard_key(run_key: str, layout: RunLayout, shard: int) -> str:
    """The object of one shard of a run's activation array."""
    return f"runs/{run_key}/{layout.array_name}/c/{shard}/0/0"


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    if "checksum" in text:
        return f"failed its crc32c check ({text})"
    return f"does not decode ({type(exc).__name__}: {text})"


def damaged(run_key: str, array: str, why: str, *, shard: int | None = None, layer: int | None = None,
            rows: tuple[int, int] | None = None) -> DataLoss:
    """The DataLoss of damaged stored bytes: the run, the array and, where known, the shard (the
    chunk a capture task writes), the layer and the rows, and what to do about it."""
    where = "".join([f"shard {shard} " if shard is not None else "", f"layer {layer} " if layer is not None else "",
                     "of " if shard is not None or layer is not None else "", f"array {array!r}",
                     f" (rows {rows[0]}..{rows[1]})" if rows else ""])
    return DataLoss(f"run {run_key[:12]}: {where} {why}; `actstore verify {run_key[:12]} --repair` "
                    "drops the damaged shards, then submit the same capture again to rewrite them")

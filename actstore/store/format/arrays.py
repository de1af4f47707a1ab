"""Activation arrays in Zarr v3: the `ArrayStore` implementation for local and object stores.

Layout of one run (DESIGN.md, Storage):
    runs/<run_key>/acts        (n, L+1, d)   pooled runs
    runs/<run_key>/tokens      (T, L+1, d)   token-level runs, with
    runs/<run_key>/offsets     (n+1,)        prompt i owns tokens[offsets[i]:offsets[i+1]]
    runs/<run_key>/sample_ids  (n,)  and  labels (n,) where known
    runs/<run_key>/means       (L+1, d) float64, written at commit
    runs/<run_key>/scales      (shards, 2, L+1, d) float32: an int8 run's steps and offsets
                               (`store.format.quantised`), one chunk per shard, written with it
    runs/<run_key>/errors      (L+1, figures) float64: an int8 run's error figures, at commit
    runs/<run_key>/exact       (rows, k, d) float32: an int8 run's layers kept exact (max_cka_error),
                               sharded like the activations; attribute `layers` names them
Inner chunks are (rows, 1, d) so one layer reads alone; shards are (rows, L+1, d) and a writer
always writes whole shards, because concurrent writes into one shard lose data.
Each shard object also carries the float64 sums (L+1, d) of its rows, for the layer means, and
its chunk rows and layer statistics: after its inner chunks, before its index, where zarr does
not look (`store.format.shard_details`; the array's attributes describe them). One object per shard, so
a shard and all that is known of it are written together, in one request. Runs written before
keep the rows and statistics in two JSON objects per shard, and the oldest their sums in a
`layer_sums` array (shards, L+1, d), one chunk per shard; they are read and resumed that way.
Every chunk carries a crc32c checksum: a corrupted chunk raises DataLoss, never returns numbers.
Zarr opens the groups and arrays and codes the side arrays; a shard (and its token ids) moves as
whole objects coded with the array's own zarr codecs (`store.format.codecs`), all objects of one call at
once (`store.format.store_calls`).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.errors import NodeNotFoundError

from actstore.errors import DataLoss, NotFound
from actstore.event_loop import sync
from actstore.store.array_store import ArrayStore, RunLayout, decode_stored
from actstore.store.backends import Options, backend_for
from actstore.store.backends.read_cache import ReadThroughCache
from actstore.store.backends.retries import RetryPolicy
from actstore.store.format.codecs import ChunkCodec
from actstore.store.format.damage import (
    DECODE_ERRORS,
    GROUP,
    damaged,
    metadata_damaged,
    metadata_key,
    reading_metadata,
    why_failed,
)
from actstore.store.format.one_byte_arrays import ERRORS, EXACT, SCALES_DECODE, OneByteShards
from actstore.store.format.quantised import SCALES, is_one_byte
from actstore.store.format.shard_details import (
    LEGACY_ROWS,
    LEGACY_STATS,
    ShardEnds,
    describe,
    details_values,
    shard_batches,
)
from actstore.store.format.store_calls import StoreCalls

COMMIT_MARKER = "committed.json"
# bfloat16 has no numpy dtype: it is kept as the upper 16 bits of float32, in a uint16 array;
# int8 runs keep codes, decoded with their shards' steps and offsets (`store.format.quantised`)
_ZARR_DTYPE = {"float16": "float16", "float32": "float32", "bfloat16": "uint16", "int8": "int8"}


class ZarrArrayStore(OneByteShards, ShardEnds, StoreCalls, ArrayStore):
    """Zarr v3 groups under `<root>/runs/`. Sharded arrays, Blosc + bitshuffle, crc32c.

    `root` is any root a backend takes (`store.backends`), opened with its ``options`` (None:
    this process's); every read, write and check goes through the zarr store interface, so all
    behave alike, and its failures raise our errors (`Backend.failure`). ``read_cache``: a node's
    directory of the chunks it read, with a backend's obstore store (`store.backends.read_cache`)."""

    def __init__(self, root: Path | str, compressor: str = "lz4", options: Options | None = None,
                 read_cache: str | Path | None = None, read_cache_bytes: int = 50 << 30,
                 retry: RetryPolicy | None = None) -> None:
        self.root = root
        self.compressor = compressor
        self._retry = retry or RetryPolicy()
        self._backend = backend_for(root)
        opened = self._backend.open(str(root), options, self._retry)
        self._objects, self._files_at = self._backend.objects(opened), self._backend.directory(str(root))
        # a node's read-through cache only in front of an object store
        self._cache = ReadThroughCache(opened, self._objects, Path(read_cache).expanduser(), read_cache_bytes,
                                       str(root), self._retry) if read_cache and self._objects is not None else None
        self._zarr = opened if self._cache is None else self._cache
        self._layouts: dict[str, RunLayout] = {}  # a created run's layout never changes
        # the codecs of opened arrays of runs with a known layout: opening one reads metadata (a
        # round trip each on an object store), so a capture or a map task opens each once, not
        # once per shard; shards and their side chunks then move as whole objects (`store.format.codecs`)
        self._coders: dict[tuple[str, str], ChunkCodec] = {}
        self._exact: dict[str, dict[int, int]] = {}  # an int8 run's layers kept exact, by their place in `exact`
        # threads that meet a run first at once (a map task's, a capture's writers) open it once:
        # each opening is ~1 ms of CPU and a round trip
        self._opening = threading.RLock()

    def _gone(self, run_key: str) -> NotFound:
        self._forget(run_key)
        return NotFound(f"run {run_key[:12]} has no arrays in the store at {self.root}")

    def _group(self, run_key: str, mode: str = "r") -> zarr.Group:
        """The run's group: one GET of its metadata (zarr 3's own format: no probing for zarr 2's);
        a truncated or garbled zarr.json is DataLoss naming it."""
        try:
            with self._reported(), reading_metadata(run_key):
                return zarr.open_group(store=self._zarr, path=f"runs/{run_key}", mode=mode, zarr_format=3,
                                       use_consolidated=False)
        except NodeNotFoundError:
            raise self._gone(run_key) from None

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
        (and `shard`, the chunk the slice lies in, where it is one); damaged metadata names its object."""
        with self._reported(), reading_metadata(run_key, name):
            array = group[name]
        try:
            with self._reported():
                return array[selection]
        except (*DECODE_ERRORS, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                raise
            raise damaged(run_key, name, why_failed(exc), shard=shard) from None

    def create_run(self, run_key, layout, sample_ids, labels, offsets, spec=None, compress=True) -> None:
        self._forget(run_key)
        if self._exists(f"runs/{run_key}/zarr.json"):
            try:
                if self.layout(run_key) == layout:
                    return
            except NotFound:  # an interrupted create: start over
                pass
            self.delete_run(run_key)
        with self._reported():
            self._create(run_key, layout, sample_ids, labels, offsets, spec, compress)

    def _create(self, run_key, layout, sample_ids, labels, offsets, spec, compress) -> None:
        group = zarr.open_group(store=self._zarr, path=f"runs/{run_key}", mode="w")
        dtype = np.dtype(_ZARR_DTYPE[layout.dtype])
        group.create_array(
            layout.array_name,
            shape=(layout.rows, layout.num_states, layout.width),
            chunks=(layout.shard_rows, 1, layout.width),
            shards=(layout.shard_rows, layout.num_states, layout.width),
            dtype=dtype,
            compressors=self._codecs(dtype.itemsize) if compress else [Crc32cCodec()],
            fill_value=0,
            attributes=describe(layout),
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
        if is_one_byte(layout.dtype):  # each shard's steps and offsets, one checksummed chunk a shard
            group.create_array(SCALES, shape=(layout.num_shards, 2, layout.num_states, layout.width),
                               chunks=(1, 2, layout.num_states, layout.width), dtype="float32",
                               compressors=[Crc32cCodec()], fill_value=0,
                               attributes={"decode": SCALES_DECODE})
        # The layout is written last: its presence marks a completely created group.
        group.attrs.update({"spec": spec, "layout": layout.to_dict()})

    def _has(self, run_key: str, name: str) -> bool:
        """Whether the run has the array `name`: its metadata object is stored (`name in group`
        parses it, and takes a KeyError from a damaged one for absence)."""
        return self._exists(f"runs/{run_key}/{name}/zarr.json")

    def _forget(self, run_key: str) -> None:
        self._layouts.pop(run_key, None)
        self._exact.pop(run_key, None)
        for key in [k for k in self._coders if k[0] == run_key]:
            self._coders.pop(key, None)

    def _codec(self, run_key: str, name: str) -> ChunkCodec:
        """The codec of an array of a run, from the array's metadata (one GET, then kept)."""
        codec = self._coders.get((run_key, name))
        if codec is not None:
            return codec
        with self._opening:
            if (run_key, name) in self._coders:  # opened by another thread meanwhile
                return self._coders[run_key, name]
            try:
                with self._reported(), reading_metadata(run_key, name):
                    array = zarr.open_array(store=self._zarr, path=f"runs/{run_key}/{name}", mode="r+", zarr_format=3)
                    codec = ChunkCodec(array)  # reads the codecs the metadata names
            except NodeNotFoundError:
                self._forget(run_key)
                self.layout(run_key)  # NotFound if the whole run is gone
                raise NotFound(f"run {run_key[:12]} has no {name!r} array") from None
            self._check_layout(run_key, name, array, codec)
            self._coders[run_key, name] = codec
            return codec

    def _check_layout(self, run_key: str, name: str, array: zarr.Array, codec: ChunkCodec) -> None:
        """The activation array's metadata against the run's layout (the group's): a flipped digit
        in either still parses, and reads would go on with the wrong rows or shards."""
        layout = self._layouts.get(run_key)
        if layout is None or name != layout.array_name:
            return
        stored = (tuple(array.shape), codec.shape, str(codec.dtype))
        states, width = layout.num_states, layout.width
        expected = ((layout.rows, states, width), (layout.shard_rows, states, width), _ZARR_DTYPE.get(layout.dtype))
        if stored != expected or (layout.pooling != "tokens" and layout.n != layout.rows):
            raise metadata_damaged(run_key, GROUP, f"does not match {metadata_key(run_key, name)} (the layout "
                                                   f"{layout.to_dict()}; the array {stored[0]}, shards {stored[1]}, "
                                                   f"{stored[2]}): one of the two is damaged")

    def layout(self, run_key: str) -> RunLayout:
        if run_key in self._layouts and not self._exists(f"runs/{run_key}/zarr.json"):
            self._forget(run_key)  # deleted through another handle
        if run_key not in self._layouts:
            with self._opening:
                if run_key not in self._layouts:  # not opened by another thread meanwhile
                    attrs = self._group(run_key).attrs.asdict()
                    if "layout" not in attrs:
                        raise NotFound(f"run {run_key[:12]} was never completely created")
                    with reading_metadata(run_key):  # a layout that is not one: damaged too
                        self._layouts[run_key] = RunLayout(**attrs["layout"])
        return self._layouts[run_key]

    def write_shard(self, run_key, shard, values, sums, token_ids=None, rows=None, stats=None, checksums=None,
                    decoding=None) -> None:
        layout = self._layouts.get(run_key) or self.layout(run_key)
        start, stop = layout.shard_range(shard)
        if values.shape != (stop - start, layout.num_states, layout.width):
            expected = (stop - start, layout.num_states, layout.width)
            raise ValueError(f"shard {shard} expects {expected}, got {values.shape}")
        if sums.shape != (layout.num_states, layout.width):
            raise ValueError(f"shard {shard} sums must be {(layout.num_states, layout.width)}, got {sums.shape}")
        if is_one_byte(layout.dtype) != (decoding is not None):
            raise ValueError(f"shard {shard} of a {layout.dtype} run is written "
                             f"{'with' if is_one_byte(layout.dtype) else 'without'} its steps and offsets")
        # whole objects, coded here and PUT together (`store.format.codecs`): the shard with its chunk rows,
        # statistics and layer sums (`store.format.shard_details`; an older run's: objects of their own), its
        # token ids. A known run's existence is not asked first (a round trip per shard): the service
        # deletes no run while its capture writes, and what a cancelled capture's last tasks write
        # after a delete lies in a folder without group metadata, which no read takes for a run
        # (`gc` removes it; `create_run` of the key replaces it)
        codec = self._codec(run_key, layout.array_name)
        sums_at, details_at = self._carried(run_key, layout)
        decoding_at = self._decoding_at(run_key, layout)  # an int8 shard's steps and offsets, first
        trailer = [] if decoding_at is None else [decoding_at[0].encode(decoding)]
        trailer += [] if details_at is None else [
            details_at.encode(details_values(run_key, shard, layout.num_states, rows, stats))]
        trailer += [] if sums_at is None else [sums_at.encode(sums)]
        # an uncompressed inner chunk's crc32c is its layer's: taken where the writer summed it
        summed = None if checksums is None else {(0, layer, 0): int(c) for layer, c in enumerate(checksums)}
        # a local file takes the shard's parts one after another (zarr's calls: joined); obstore's PUT, one buffer
        encode = codec.encode if self._objects is not None else codec.encode_parts
        written = {codec.key((shard, 0, 0)): encode(values, trailer, summed)}
        sides = (("layer_sums", None if sums_at else sums[None]), ("token_ids", token_ids),
                 (SCALES, None if decoding is None else np.asarray(decoding, np.float32)[None]))
        for name, part in sides:
            if part is not None:
                side = self._codec(run_key, name)
                written[side.key((shard,) + (0,) * (len(side.shape) - 1))] = side.encode(part)
        self._store(written)
        if details_at is None:  # an older run's, after the shard: kept rows always describe a stored shard
            self._put({template.format(run_key=run_key, shard=shard): json.dumps(part).encode()
                       for template, part in ((LEGACY_ROWS, rows), (LEGACY_STATS, stats)) if part is not None})

    def read_layers(self, run_key, layers, start, stop) -> np.ndarray:
        exact = self._exact_positions(run_key)
        if exact and set(layers) & exact.keys():  # an int8 run's layers kept exact come from its `exact` array
            return self._read_again(lambda: self._read_with_exact(run_key, layers, start, stop, exact), run_key)
        return self._read_again(lambda: self._read_layers(run_key, layers, start, stop), run_key)

    def read_stored(self, run_key, layers, start, stop) -> np.ndarray:
        return self._read_again(lambda: self._read_layers(run_key, layers, start, stop, decoded=False), run_key)

    def read_coded(self, run_key, layers, shard) -> tuple[np.ndarray, np.ndarray]:
        layout = self._layouts.get(run_key) or self.layout(run_key)
        start, stop = layout.shard_range(shard)
        return self._read_again(lambda: self._read_layers(run_key, layers, start, stop, decoded="coded"), run_key)

    def _read_again(self, read, run_key: str):
        try:
            return read()
        except DataLoss:
            if self._cache is None:
                raise
            # the bytes may have been damaged in this node's copies: read the object store's once more
            self._cache.forget_under(f"runs/{run_key}/")
            return read()

    def _read_layers(self, run_key, layers, start, stop, decoded: bool | str = True, array: str | None = None):
        """`layers` of the activation array, or of another array of the run sharded like it
        (`array`: an int8 run's `exact` layers, whose index along its second axis `layers` are);
        ``decoded`` "coded": an int8 shard's codes and state (`read_coded`)."""
        # no existence check before the read: an absent shard reads as absent, and the run's own
        # existence (it may have been deleted through another handle) is checked only then
        layout = self._layouts.get(run_key) or self.layout(run_key)
        name = array or layout.array_name
        codec = self._codec(run_key, name)
        shards = range(start // layout.shard_rows, -(-stop // layout.shard_rows))
        keys = [codec.key((shard, 0, 0)) for shard in shards]
        # every layer: whole shards, one GET each; fewer layers fetch the shards' indexes, then
        # only their own inner chunks, as zarr reads them. Every shard's requests go out at once.
        whole = len(set(layers)) == codec.shape[1]
        # an int8 shard's steps and offsets: in its own object's trailer (older int8 runs: the scales array)
        carried = self._decoding_at(run_key, layout) if decoded and array is None else None
        tail = codec.index_size + (0 if carried is None else carried[0].nbytes + carried[1])
        requests = [(key, None if whole else SuffixByteRequest(tail)) for key in keys]
        found = self._fetch(requests + self._scale_requests(run_key, layout, shards, decoded and array is None
                                                            and carried is None))
        found, states = found[:len(keys)], found[len(keys):]
        if carried is not None:
            states = self._carried_states(run_key, layout, shards, found, *carried)
        elif states:
            states = self._states(run_key, layout, shards, states)
        ranges = [self._chunk_ranges(run_key, layout, codec, shard, data, layers, name)
                  for shard, data in zip(shards, found)]
        if whole:
            parts = [[None if r is None else data[r[0]:r[1]] for r in rs] for data, rs in zip(found, ranges)]
        else:
            wanted = [(i, key, r) for i, (key, rs) in enumerate(zip(keys, ranges)) for r in rs if r is not None]
            fetched = self._fetch([(key, RangeByteRequest(*r)) for _, key, r in wanted])
            for (i, _, _), data in zip(wanted, fetched):
                if data is None:  # vanished since its index was read
                    raise self._missing(run_key, layout, shards[i], name)
            chunks = iter(fetched)
            parts = [[None if r is None else next(chunks) for r in rs] for rs in ranges]
        out = np.empty((len(layers), stop - start, layout.width), codec.dtype)
        for shard, shard_parts in zip(shards, parts):
            lo, hi = layout.shard_range(shard)
            a, b = max(lo, start), min(hi, stop)
            whole_chunk = (a, b) == (lo, lo + layout.shard_rows)  # decoded in place, not copied there
            for i, (layer, part) in enumerate(zip(layers, shard_parts)):
                try:
                    if whole_chunk:
                        codec.decode_inner_into(part, out[i, a - start:b - start, None])
                    else:
                        out[i, a - start:b - start] = codec.decode_inner(part)[a - lo:b - lo, 0]
                except DECODE_ERRORS as exc:
                    raise damaged(run_key, name, why_failed(exc), shard=shard, layer=layer, rows=(lo, hi)) from None
        if decoded == "coded":  # one shard's codes and its state, of these layers (`read_coded`)
            return out, states[0][:, layers]
        if states:
            return self._decoded(run_key, layout, out, layers, start, shards, states)
        return out if not decoded else decode_stored(out, layout.dtype)

    def _chunk_ranges(self, run_key, layout, codec, shard, data, layers, name) -> list[tuple[int, int] | None]:
        """Where each layer's inner chunk lies in the shard whose object (or index) is `data`."""
        if data is None:
            raise self._missing(run_key, layout, shard, name)
        try:
            index = codec.index(data[len(data) - codec.index_size:])
        except DECODE_ERRORS as exc:
            raise damaged(run_key, name, f"has a damaged shard index: {why_failed(exc)}", shard=shard,
                          rows=layout.shard_range(shard)) from None
        return [codec.chunk_range(index, (0, layer, 0)) for layer in layers]

    def _missing(self, run_key: str, layout: RunLayout, shard: int, name: str | None = None) -> DataLoss:
        self.layout(run_key)  # NotFound if the whole run is gone
        return damaged(run_key, name or layout.array_name, "is missing from the store", shard=shard,
                       rows=layout.shard_range(shard))

    def write_means(self, run_key: str, overrides: dict[int, np.ndarray] | None = None) -> np.ndarray:
        layout = self.layout(run_key)
        group = self._group(run_key, mode="r+")
        if self._carried(run_key, layout)[0] is None:
            total = self._whole(run_key, group, "layer_sums").sum(axis=0)
        else:  # a batch of shards at a time, so memory stays bounded for any run
            total = np.zeros((layout.num_states, layout.width))
            for batch in shard_batches(layout):
                total += np.sum(self._shard_sums(run_key, layout, batch), axis=0)
        means = total / layout.rows
        for layer, mean in (overrides or {}).items():
            means[layer] = mean
        self._side_array(group, "means", means, overwrite=True)
        return means

    def means(self, run_key: str) -> np.ndarray:
        group = self._group(run_key)
        if not self._has(run_key, "means"):
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
        return self._whole(run_key, group, "labels") if self._has(run_key, "labels") else None

    def offsets(self, run_key: str) -> np.ndarray | None:
        group = self._group(run_key)
        return self._whole(run_key, group, "offsets") if self._has(run_key, "offsets") else None

    def write_char_spans(self, run_key: str, spans: np.ndarray) -> None:
        spans = np.asarray(spans, dtype=np.int32)
        if spans.shape != (self.layout(run_key).rows, 2):
            raise ValueError(f"char spans must be (rows, 2), got {spans.shape}")
        with self._reported():
            self._side_array(self._group(run_key, "r+"), "char_spans", spans, overwrite=True)

    def char_spans(self, run_key: str) -> np.ndarray | None:
        group = self._group(run_key)
        return self._whole(run_key, group, "char_spans") if self._has(run_key, "char_spans") else None

    def token_ids(self, run_key: str, start: int, stop: int) -> np.ndarray | None:
        group = self._group(run_key)
        if not self._has(run_key, "token_ids"):
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
        """The activations' bytes, with an int8 run's scales and error figures (what decoding needs)."""
        layout = self.layout(run_key)
        names = [layout.array_name] + ([SCALES, ERRORS, EXACT] if is_one_byte(layout.dtype) else [])
        with self._reported():
            return sum(sync(self._zarr.getsize_prefix(f"runs/{run_key}/{name}")) for name in names)

    # ---- integrity ---------------------------------------------------------------------------------
    def _shard_keys(self, run_key: str, shard: int) -> list[str]:
        """The shard's objects: activations, token ids, and an older run's layer sums, rows and statistics."""
        layout = self.layout(run_key)
        return [f"runs/{run_key}/{layout.array_name}/c/{shard}/0/0", f"runs/{run_key}/layer_sums/c/{shard}/0/0",
                f"runs/{run_key}/token_ids/c/{shard}", LEGACY_ROWS.format(run_key=run_key, shard=shard),
                LEGACY_STATS.format(run_key=run_key, shard=shard), f"runs/{run_key}/{SCALES}/c/{shard}/0/0/0",
                f"runs/{run_key}/{EXACT}/c/{shard}/0/0"]

    def shard_present(self, run_key: str, shard: int) -> bool:
        return self._exists(self._shard_keys(run_key, shard)[0])

    def layer_sums(self, run_key: str, shard: int) -> np.ndarray:
        layout = self.layout(run_key)
        if self._carried(run_key, layout)[0] is not None:
            return self._shard_sums(run_key, layout, range(shard, shard + 1))[0]
        if not self._exists(self._shard_keys(run_key, shard)[1]):
            raise damaged(run_key, "layer_sums", "is missing from the store", shard=shard)
        return self._whole(run_key, self._group(run_key), "layer_sums", shard, shard=shard)

    def array_shapes(self, run_key: str) -> dict[str, tuple[tuple[int, ...], str]]:
        group = self._group(run_key)
        shapes = {}
        for name in self._listed("list_dir", f"runs/{run_key}"):
            if not self._exists(f"runs/{run_key}/{name}/zarr.json"):
                continue
            with self._reported(), reading_metadata(run_key, name):
                array = group[name]
                shapes[name] = (tuple(array.shape), str(array.dtype))
        return shapes

    def drop_shards(self, run_key: str, shards: list[int]) -> None:
        keys = [key for shard in shards for key in self._shard_keys(run_key, shard)]
        with self._reported():
            for key in [*keys, f"runs/{run_key}/{COMMIT_MARKER}"]:
                sync(self._zarr.delete(key))
            sync(self._zarr.delete_dir(f"runs/{run_key}/means"))

    # ---- description ------------------------------------------------------------------------------
    def run_keys(self) -> list[str]:
        return sorted(key for key in self._listed("list_dir", "runs")
                      if self._exists(f"runs/{key}/zarr.json"))

    def spec(self, run_key: str) -> dict | None:
        return self._group(run_key).attrs.asdict().get("spec")

    def layer_stats(self, run_key: str) -> dict | None:
        return self._group(run_key).attrs.asdict().get("layer_stats")

    def mark_committed(self, run_key: str) -> None:
        self._put({f"runs/{run_key}/{COMMIT_MARKER}": json.dumps({"run_key": run_key}).encode()})

    def is_committed(self, run_key: str) -> bool:
        return self._exists(f"runs/{run_key}/{COMMIT_MARKER}")


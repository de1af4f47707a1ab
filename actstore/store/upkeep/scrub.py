"""Scrubbing a run, like a filesystem scrub: read every chunk, and say what is damaged and why.

`check_run` reads the run-wide parts (group metadata, array shapes and dtypes against what the
catalog says the run is, sample ids, labels, offsets, means); `check_shard` reads every inner
chunk of one shard (each layer alone, so its crc32c is checked and a failure names the layer),
an int8 run's steps and offsets of the shard, its layer sums, kept chunk rows and statistics,
and token ids, and compares each layer's stored bytes with the crc32c the capture recorded in
the catalog. Both only use the `ArrayStore` interface
and return findings, `Damage` records (`actstore.records`: the client reads the same record); the
verify job (`server/verify_job.py`) runs `check_shard` in Ray tasks and compares the catalog's
chunk rows with the shards present.
"""

from __future__ import annotations

import crc32c
import numpy as np

from actstore.errors import DataLoss, NotFound
from actstore.records import Damage
from actstore.store.array_store import ArrayStore, RunLayout
from actstore.store.format.damage import GROUP, metadata_key
from actstore.store.format.one_byte_arrays import EXACT
from actstore.store.format.quantised import SCALES, is_one_byte

WHOLE = -1  # a finding about a whole array (or not about one layer)
# run-wide arrays written once when the run is created: damage there cannot be repaired by
# recapturing shards, only by capturing the run again from the start
CREATED_ONCE = (GROUP, "sample_ids", "sample_id_offsets", "labels", "offsets")
# a finding about an array's metadata object names it "<array>/zarr.json" (the group's: "group")
METADATA = "/zarr.json"


def created_once(array: str) -> bool:
    """Whether damage to `array` (a finding's) needs the run captured again whole: what the run's
    creation writes once, and every metadata object (zarr reads nothing of an array without it)."""
    return array in CREATED_ONCE or array.endswith(METADATA)


def _reason(exc: DataLoss) -> str:
    """A DataLoss message without its leading "run KEY: " and its advice (the report gives both)."""
    text = str(exc).split(": ", 1)[-1]
    return text.split("; `actstore verify", 1)[0]


def expected_shapes(layout: RunLayout, labelled: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every array a run with `layout` has once committed (not a run's
    `layer_sums` array: only older runs have one; `check_shard` reads every shard's sums, wherever
    they are kept, and their shape)."""
    stored = "uint16" if layout.dtype == "bfloat16" else layout.dtype
    shapes = {} if not is_one_byte(layout.dtype) else {
        SCALES: ((layout.num_shards, 2, layout.num_states, layout.width), "float32")}
    shapes |= {
        layout.array_name: ((layout.rows, layout.num_states, layout.width), stored),
        "sample_id_offsets": ((layout.n + 1,), "int64"),
        "means": ((layout.num_states, layout.width), "float64"),
    }
    if labelled:
        shapes["labels"] = ((layout.n,), "int64")
    if layout.pooling == "tokens":
        shapes["offsets"] = ((layout.n + 1,), "int64")
        shapes["token_ids"] = ((layout.rows,), "int64")
    return shapes


def check_run(arrays: ArrayStore, run_key: str, expected: RunLayout, committed: bool,
              spec: dict | None = None) -> list[Damage]:
    """The run-wide checks; `expected` is the layout and `spec` the identity the catalog records."""
    try:
        layout = arrays.layout(run_key)
    except DataLoss as exc:
        return [_finding(exc, GROUP)]
    except NotFound as exc:
        return [Damage(GROUP, WHOLE, WHOLE, str(exc))]
    findings = []
    try:
        stored_spec = arrays.spec(run_key)
    except DataLoss as exc:  # the layout was remembered from before the damage
        return [_finding(exc, GROUP)]
    if spec is not None and stored_spec is not None and stored_spec != spec:
        findings.append(Damage("group", WHOLE, WHOLE, "its spec is not the run's in the catalog"))
    if layout != expected:
        findings.append(Damage(GROUP, WHOLE, WHOLE, f"its layout {layout.to_dict()} (in {metadata_key(run_key)}) is "
                                                    f"not the run's in the catalog {expected.to_dict()}"))
        return findings
    def labels_fit() -> bool:
        labels = arrays.labels(run_key)
        return labels is None or len(labels) == layout.n

    def spans_fit() -> bool:  # optional: runs captured before spans were stored have none
        spans = arrays.char_spans(run_key)
        return spans is None or spans.shape == (layout.rows, 2)

    readers = {"sample_ids": lambda: len(arrays.sample_ids(run_key)) == layout.n, "labels": labels_fit,
               "offsets": lambda: _offsets_fit(arrays.offsets(run_key), layout), "char_spans": spans_fit,
               "means": lambda: arrays.means(run_key).shape == (layout.num_states, layout.width)}
    for name, fits in readers.items():
        try:
            if not fits():
                findings.append(Damage(name, WHOLE, WHOLE, "does not match the run's shape"))
        except DataLoss as exc:
            findings.append(_finding(exc, name))
        except NotFound:
            if committed:  # the means are written at commit
                findings.append(Damage(name, WHOLE, WHOLE, "is missing from a committed run"))
    try:
        shapes = arrays.array_shapes(run_key)
    except DataLoss as exc:  # an array's metadata: named already where a reader above met it
        found = _finding(exc, GROUP)
        return findings if found in findings else [*findings, found]
    labelled = "labels" in shapes
    for name, (shape, dtype) in expected_shapes(layout, labelled).items():
        if name not in shapes:
            if name != "means" or committed:
                findings.append(Damage(name, WHOLE, WHOLE, "is missing from the store"))
        elif shapes[name] != (shape, dtype):
            findings.append(Damage(name, WHOLE, WHOLE, f"is {shapes[name][1]} {shapes[name][0]}, the run's spec "
                                                       f"says {dtype} {shape}"))
    return findings


def _named(exc: DataLoss, default: str) -> str:
    """What a DataLoss names: a metadata object (`store.format.damage.metadata_damaged`: "group", or
    "<array>/zarr.json"), an array ("... array 'labels' ..."), else `default`."""
    text = exc.damage
    if text.startswith("metadata object runs/"):
        key = text.removeprefix("metadata object ").split(" ", 1)[0]
        run_key = key.split("/")[1]
        return GROUP if key == metadata_key(run_key) else key.removeprefix(f"runs/{run_key}/")
    if "array '" in text:
        return text.split("array '", 1)[1].split("'", 1)[0]
    return default


def _finding(exc: DataLoss, default: str, shard: int = WHOLE, layer: int = WHOLE) -> Damage:
    """The finding of a DataLoss about `default` (or what it names) in `shard` and `layer`; damaged
    metadata is about the whole array, whichever shard's read met it."""
    array = _named(exc, default)
    if array == GROUP or array.endswith(METADATA):
        shard = layer = WHOLE
    return Damage(array, shard, layer, _reason(exc))


def _offsets_fit(offsets: np.ndarray | None, layout: RunLayout) -> bool:
    if offsets is None:
        return layout.pooling != "tokens"
    return len(offsets) == layout.n + 1 and int(offsets[-1]) == layout.rows and bool(np.all(np.diff(offsets) >= 0))


def check_shard(arrays: ArrayStore, run_key: str, shard: int, checksums: dict[int, int],
                ids_expected: bool = False) -> list[Damage]:
    """Every inner chunk of one shard, its layer sums, kept rows and statistics, and token ids;
    `checksums` maps a layer to the crc32c the catalog recorded for it (a layer without one is not
    compared). With `ids_expected` (a token-level run of a text model), rows without a token id
    are missing."""
    layout = arrays.layout(run_key)
    name = layout.array_name
    if not arrays.shard_present(run_key, shard):
        return [Damage(name, shard, WHOLE, "is missing from the store")]
    start, stop = layout.shard_range(shard)
    findings = []
    for layer in range(layout.num_states):
        try:
            values = arrays.read_stored(run_key, [layer], start, stop)[0]  # the bytes the capture summed
        except DataLoss as exc:
            found = _finding(exc, name, shard, layer)
            if found.shard == WHOLE:  # the array's metadata: no chunk of it reads
                return [found]
            findings.append(found)
            continue
        recorded = checksums.get(layer)
        if recorded is not None and crc32c.crc32c(np.ascontiguousarray(values)) != recorded:
            findings.append(Damage(name, shard, layer, "reads, but its bytes are not the ones the capture "
                                                       "recorded in the catalog (crc32c differs)"))
    try:
        arrays.decoding(run_key, shard)  # an int8 run's steps and offsets (checksummed as a chunk)
        for layer in arrays.exact_layers(run_key):  # and its layers kept exact, each inner chunk alone
            try:
                arrays.read_layers(run_key, [layer], start, stop)
            except DataLoss as exc:
                findings.append(_finding(exc, EXACT, shard, layer))
    except DataLoss as exc:
        findings.append(_finding(exc, SCALES, shard))
    try:
        sums = arrays.layer_sums(run_key, shard)
        if sums.shape != (layout.num_states, layout.width):
            findings.append(Damage("layer_sums", shard, WHOLE, f"has shape {sums.shape}"))
    except DataLoss as exc:
        findings.append(_finding(exc, "layer_sums", shard))
    try:
        arrays.shard_details(run_key, shard)
    except DataLoss as exc:
        findings.append(_finding(exc, "shard_details", shard))
    try:
        ids = arrays.token_ids(run_key, start, stop)
        if ids is not None and len(ids) != stop - start:
            findings.append(Damage("token_ids", shard, WHOLE, f"has {len(ids)} rows, not {stop - start}"))
        elif ids is not None and ids_expected and (ids < 0).any():
            findings.append(Damage("token_ids", shard, WHOLE, "is missing from the store"))
    except DataLoss as exc:
        findings.append(_finding(exc, "token_ids", shard))
    return findings

"""The activation-array interface: a run's layout, the storage ABC every backend implements, in
three faces its callers take as far as they use them (`RunReader`, `RunWriter`, `StoreUpkeep`;
`ArrayStore` is all three; contract tests: `store.testing.ArrayStoreContract`), and the decoding
of stored values. The Zarr v3 implementation is in `store.format.arrays`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

import numpy as np


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def decode_stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """Stored values as numbers: float16/float32 unchanged, bfloat16 bits widened to float32."""
    return bf16_bits_to_float32(values) if dtype == "bfloat16" else values


ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1}  # bytes of one stored value
# bytes of one value as `read_layers` returns it (bfloat16 and int8 decode to float32)
READ_ITEMSIZE = {"float16": 2, "bfloat16": 4, "float32": 4, "int8": 4}
# a token-level run is cut into at least this many shards, so its capture and reads spread over tasks
MIN_SHARDS_A_RUN = 16
# shards grow only where they reach this share of the object size: a small run keeps its many small shards
MIN_GROWN_SHARE = 0.25
SHARD_ROW_STEP = 4  # a grown or one-byte shard's rows are a multiple of it


def token_shard_rows(shard_rows: int, shard_mb: float, row_bytes: int, rows: int) -> int:
    """Token rows a shard of a token-level run holds: as many shards as the largest multiple of
    ``shard_rows`` that makes an object of at most ``shard_mb`` MB (object stores serve tens of MB
    a request at full speed, and a shard's fixed costs, its PUT, index and catalog rows, are paid
    per object), and no more than a run's rows over `MIN_SHARDS_A_RUN`, give, where that object
    reaches `MIN_GROWN_SHARE` of ``shard_mb``, with the rows spread evenly over them
    (`balanced_shard_rows`); else ``shard_rows`` (a small run's; any run's where ``shard_mb`` is 0)."""
    fitting = min(int(shard_mb * 1e6) // row_bytes, rows // MIN_SHARDS_A_RUN) // shard_rows * shard_rows
    grown = fitting > shard_rows and fitting * row_bytes >= MIN_GROWN_SHARE * shard_mb * 1e6
    return balanced_shard_rows(fitting, rows) if grown else shard_rows


def balanced_shard_rows(most: int, rows: int) -> int:
    """The fewest rows a shard can hold, in steps of `SHARD_ROW_STEP`, that keep the shards of at
    most ``most`` rows as few: zarr stores a run's last, partial shard at its full chunk shape, so
    a shard of 3,328 rows over 53,862 wrote 2,714 rows of padding (5% of the run; measured on
    MiniLM-L6's tokens of 2,000 reviews), where 17 shards of 3,172 pad 62 (0.1%)."""
    shards = -(-rows // most)
    return min(most, max(SHARD_ROW_STEP, -(-rows // (shards * SHARD_ROW_STEP)) * SHARD_ROW_STEP))


@dataclass(frozen=True)
class RunLayout:
    """Shape of one run's arrays; `rows` is n for pooled runs and T (all tokens) for `tokens`."""

    n: int
    rows: int
    num_states: int  # L + 1
    width: int
    dtype: str
    pooling: str
    shard_rows: int

    @classmethod
    def new(cls, n: int, rows: int, num_states: int, width: int, dtype: str, pooling: str, shard_rows: int,
            shard_mb: float) -> RunLayout:
        """A new run's layout, a token-level run's shards sized by `token_shard_rows`. A pooled run of
        a one-byte dtype holds up to 2x `shard_rows` a shard, balanced (`balanced_shard_rows`): the
        bytes of a float16 shard, and half the bytes per value of the float32 layer sums and the
        steps and offsets each shard carries (0.016 + 0.016 bytes a value at 512 rows, against
        0.031 + 0.031 at 256), with no padded last shard."""
        if pooling == "tokens":
            shard_rows = token_shard_rows(shard_rows, shard_mb, num_states * width * ITEMSIZE[dtype], rows)
        elif ITEMSIZE[dtype] == 1:
            shard_rows = balanced_shard_rows(2 * shard_rows, rows)
        return cls(n, rows, num_states, width, dtype, pooling, shard_rows)

    @property
    def array_name(self) -> str:
        return "tokens" if self.pooling == "tokens" else "acts"

    @property
    def num_shards(self) -> int:
        return -(-self.rows // self.shard_rows)

    def shard_range(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_rows
        return start, min(start + self.shard_rows, self.rows)

    def to_dict(self) -> dict:
        return asdict(self)


class RunReader(ABC):
    """What reading a run needs: its layout and side arrays, its values (decoded, as stored, or as
    int8 codes with their decoding state), its means, statistics, error figures and commit state."""

    @abstractmethod
    def layout(self, run_key: str) -> RunLayout: ...

    @abstractmethod
    def read_layers(self, run_key: str, layers: list[int], start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the given layers as stored numbers, shape (len(layers), rows, d).
        float16 stays float16 (callers upcast before products); bfloat16 comes back as float32, and
        int8 codes decoded to float32 values (`store.format.quantised`)."""

    @abstractmethod
    def read_stored(self, run_key: str, layers: list[int], start: int, stop: int) -> np.ndarray:
        """`read_layers` as stored, undecoded: the bytes each layer's crc32c covers (bfloat16's
        uint16 bits, int8 codes)."""

    @abstractmethod
    def read_coded(self, run_key: str, layers: list[int], shard: int) -> tuple[np.ndarray, np.ndarray]:
        """An int8 run's shard as stored: its codes (len(layers), rows, d) int8 and their state
        (2, len(layers), d) float32, decoded by `store.format.quantised.decode` (what a reader that decodes
        elsewhere, a client, is sent: one byte a value). Not for layers kept exact."""

    @abstractmethod
    def decoding(self, run_key: str, shard: int) -> np.ndarray | None:
        """An int8 run's shard's (2, L+1, d) steps and offsets (None for other dtypes); DataLoss
        naming it if missing or damaged."""

    @abstractmethod
    def exact_layers(self, run_key: str) -> list[int]:
        """The layers of an int8 run kept exact (float32), in their stored order; [] for none."""

    @abstractmethod
    def token_ids(self, run_key: str, start: int, stop: int) -> np.ndarray | None:
        """Token ids of rows [start, stop) of a token-level run (None for other runs)."""

    @abstractmethod
    def means(self, run_key: str) -> np.ndarray: ...

    @abstractmethod
    def sample_ids(self, run_key: str) -> list[str]: ...

    @abstractmethod
    def labels(self, run_key: str) -> np.ndarray | None: ...

    @abstractmethod
    def offsets(self, run_key: str) -> np.ndarray | None: ...

    @abstractmethod
    def char_spans(self, run_key: str) -> np.ndarray | None:
        """The spans `write_char_spans` stored, or None (a pooled run, or one captured before)."""

    @abstractmethod
    def spec(self, run_key: str) -> dict | None:
        """The spec given to `create_run`, if any."""

    @abstractmethod
    def layer_stats(self, run_key: str) -> dict | None:
        """The run's per-layer statistics {mean, std, norm_mean, norm_std: [per layer]}, if written."""

    @abstractmethod
    def error_figures(self, run_key: str) -> dict[str, list] | None:
        """What `write_error_figures` stored; None for a run stored exactly."""

    @abstractmethod
    def is_committed(self, run_key: str) -> bool: ...

    @abstractmethod
    def nbytes_stored(self, run_key: str) -> int: ...


class RunWriter(ABC):
    """What a capture or an import needs to write a run: its arrays, its shards (all of a shard or
    none), the layers an int8 run keeps exact, and what is written once at commit."""

    @abstractmethod
    def create_run(
        self,
        run_key: str,
        layout: RunLayout,
        sample_ids: list[str],
        labels: np.ndarray | None,
        offsets: np.ndarray | None,
        spec: dict | None = None,
        compress: bool = True,
    ) -> None:
        """Create the arrays (idempotent for the same layout: a resumed capture calls it again).
        `compress` False stores the activations with their checksum but no compressor (float16
        activations save ~3% for the time Blosc takes); a resumed run keeps what it was created with.
        `spec` (the run's identity, `keys.run_spec`) is kept with them, so the store describes
        its runs without the catalog."""

    @abstractmethod
    def write_shard(self, run_key: str, shard: int, values: np.ndarray, sums: np.ndarray,
                    token_ids: np.ndarray | None = None, rows: dict[str, list] | None = None,
                    stats: dict[str, list] | None = None, checksums: list[int] | None = None,
                    decoding: np.ndarray | None = None) -> None:
        """Write one whole shard (rows, L+1, d) in the storage dtype, its float64 layer sums, for
        token-level runs of text models the token id of every row, and what is kept with it for
        `catalog rebuild` and the commit: its catalog chunk rows (one per layer, the columns of
        `catalog_schema.CHUNK_SCHEMA`) and its per-layer running statistics
        (`LayerStats.to_dict`). A shard is written with all of it or not at all. ``checksums``:
        the crc32c of each layer's stored bytes (C order), where the writer has summed them; a
        backend may store them instead of summing the bytes again. An int8 run's shard is its
        codes with ``decoding``, their (2, L+1, d) float32 steps and offsets (`store.format.quantised`),
        written with it; its sums and statistics are of the decoded values."""

    @abstractmethod
    def create_exact(self, run_key: str, layers: list[int]) -> None:
        """Make room for an int8 run's layers kept exact (float32): `read_layers` then reads those
        layers from there, once written (`write_exact_shard`)."""

    @abstractmethod
    def write_exact_shard(self, run_key: str, shard: int, values: np.ndarray) -> None:
        """One whole shard of the layers kept exact: float32 (rows, k, d) in `exact_layers` order."""

    @abstractmethod
    def write_char_spans(self, run_key: str, spans: np.ndarray) -> None:
        """Store a token-level run's (rows, 2) int32 character spans [start, end) of every token
        in its text ((0, 0) for special tokens), checksummed like the other side arrays."""

    @abstractmethod
    def write_means(self, run_key: str, overrides: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """Reduce the per-shard layer sums into the layer means (L+1, d) and store them; the
        `overrides` replace some layers' means (an int8 run's layers kept exact: their own values')."""

    @abstractmethod
    def write_layer_stats(self, run_key: str) -> dict | None:
        """Merge every shard's statistics into the run's (at commit; None when a shard has none)."""

    @abstractmethod
    def write_error_figures(self, run_key: str, figures: dict[str, list]) -> None:
        """Store a lossy run's error figures, one value per layer each (`metrics.rounding`), at commit."""

    @abstractmethod
    def mark_committed(self, run_key: str) -> None:
        """Write the run's commit marker (after the catalog committed it)."""


class StoreUpkeep(ABC):
    """What upkeep needs: integrity (what `actstore verify` reads and a repair drops), the store's
    description of its runs without the catalog (what `catalog rebuild` reads) and removal (`gc`)."""

    @abstractmethod
    def shard_present(self, run_key: str, shard: int) -> bool:
        """Whether the shard's activation object exists (a missing one would read as zeros)."""

    @abstractmethod
    def layer_sums(self, run_key: str, shard: int) -> np.ndarray:
        """The float64 layer sums (L+1, d) stored with one shard; DataLoss naming it if damaged."""

    @abstractmethod
    def array_shapes(self, run_key: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """(shape, dtype name) of every array of the run, from its metadata; DataLoss if unreadable."""

    @abstractmethod
    def drop_shards(self, run_key: str, shards: list[int]) -> None:
        """Delete the shards' bytes (activations, layer sums, token ids, kept chunk rows), the layer
        means and the commit marker: the run is then an unfinished capture that rewrites them."""

    @abstractmethod
    def run_keys(self) -> list[str]:
        """Every run with arrays in the store."""

    @abstractmethod
    def chunk_rows(self, run_key: str) -> dict[str, list]:
        """Every stored shard's chunk rows given to `write_shard`, concatenated column by column."""

    @abstractmethod
    def shard_details(self, run_key: str, shard: int) -> tuple[dict | None, dict | None]:
        """The chunk rows and statistics kept with one shard (None for either where none were
        given, or the shard is not stored); DataLoss naming the shard if they are damaged."""

    @abstractmethod
    def delete_run(self, run_key: str) -> None:
        """Remove the run's group, its commit marker first: a group left half-deleted is never
        taken for a committed run (see `group_keys`)."""

    @abstractmethod
    def group_keys(self) -> list[str]:
        """Every folder under ``runs/``, whole or not (what `gc` checks against the catalog)."""

    @abstractmethod
    def group_nbytes(self, run_key: str) -> int:
        """Bytes under the run's folder, whatever it holds."""


class ArrayStore(RunReader, RunWriter, StoreUpkeep):
    """What the rest of actstore needs from activation storage: the three faces above, which each
    caller takes only as far as it uses them. A backend subclasses this, and its tests subclass
    the contract suite (`store.testing.ArrayStoreContract`, shipped in the package)."""

"""The DataLoss of damaged stored bytes, and what zarr and our codecs raise for them."""

from __future__ import annotations

from actstore.errors import DataLoss

# What zarr and its codecs raise for bytes that fail their checksum or do not decode (a failed
# crc32c is a ValueError; a garbled shard index or Blosc frame can be any of these).
DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, RuntimeError, EOFError)


def why_failed(exc: BaseException) -> str:
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
                    "drops the damaged shards, then submit the same capture again to rewrite them",
                    damage=f"{where} {why}")

"""The DataLoss of damaged stored bytes, and what zarr and our codecs raise for them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from actstore.errors import DataLoss

# What zarr and its codecs raise for bytes that fail their checksum or do not decode (a failed
# crc32c is a ValueError; a garbled shard index or Blosc frame can be any of these).
DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, RuntimeError, EOFError)
# What zarr raises for a metadata object (a group's or an array's zarr.json) that does not parse:
# invalid UTF-8 or JSON and a document zarr refuses are ValueErrors (its MetadataValidationError
# too); a document of the wrong shape (a list, null, a field of the wrong type, a chunk shape of 0)
# fails where zarr uses it, with any of the others. A missing object is zarr's NodeNotFoundError (a
# ValueError and a FileNotFoundError), or the KeyError a group raises from a FileNotFoundError:
# not damage.
METADATA_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError)
# the name a run's own metadata object (its group's) goes by where arrays are named
GROUP = "group"


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


def metadata_key(run_key: str, array: str = GROUP) -> str:
    """The store key of the metadata object of a run's group or of one of its arrays."""
    return f"runs/{run_key}/zarr.json" if array == GROUP else f"runs/{run_key}/{array}/zarr.json"


def metadata_damaged(run_key: str, array: str, why: str) -> DataLoss:
    """The DataLoss of a run's metadata object that does not parse, named by its store key. Zarr
    needs it to read anything of the array (or, for the group's, of the run), and the capture writes
    it once, when it creates the run: a repair deletes the run, and the same capture writes it whole."""
    what = f"metadata object {metadata_key(run_key, array)} {why}"
    return DataLoss(f"run {run_key[:12]}: its {what}; `actstore verify {run_key[:12]} --repair` deletes the run, "
                    "then submit the same capture again to write it whole", damage=what)


@contextmanager
def reading_metadata(run_key: str, array: str = GROUP) -> Iterator[None]:
    """Zarr's opening of a run's group or array (``array``): what it raises for a metadata object
    that does not parse as DataLoss naming the object; a missing one as it is raised, except an
    array a group misses (zarr's KeyError), which is lost data too."""
    try:
        yield
    except FileNotFoundError:  # zarr's NodeNotFoundError: the caller says what is not found
        raise
    except KeyError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):  # `group[name]` of a member not stored
            raise damaged(run_key, array, "is missing from the store") from None
        raise metadata_damaged(run_key, array, why_failed(exc)) from None
    except METADATA_ERRORS as exc:
        raise metadata_damaged(run_key, array, why_failed(exc)) from None

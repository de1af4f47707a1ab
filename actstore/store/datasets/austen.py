"""The ``austen`` builtin: Jane Austen's six novels as passages, read without R.

The text comes from Debian's r-cran-janeaustenr, *extracted* (``dpkg-deb -x``), not installed:
its ``data/Rdata.rdx`` + ``data/Rdata.rdb`` are an R lazy-load database. ``read_r_lazyload``
unpacks that container and hands each serialized object to the ``rdata`` package to decode.
"""

from __future__ import annotations

import bz2
import lzma
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from actstore.errors import DataLoss, NotFound
from actstore.store.datasets.core import DatasetData

AUSTEN_BOOKS = {  # R variable name -> title, in janeaustenr's order (publication order)
    "sensesensibility": "Sense & Sensibility",
    "prideprejudice": "Pride & Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
AUSTEN_PASSAGE_WORDS = 100
# What reading a damaged database raises: the decompressors, and rdata's parser, which checks the
# format with index lookups and asserts as well as ValueError and NotImplementedError.
_READ_ERRORS = (
    OSError, EOFError, ValueError, LookupError, NotImplementedError, AssertionError,
    struct.error, zlib.error, lzma.LZMAError,
)  # fmt: skip


def _austen_roots() -> list[Path]:
    base = os.environ.get("ACTSTORE_DATA_DIR") or "~/.cache/actstore"
    root = Path(base).expanduser() / "janeaustenr"
    return [
        root / "usr" / "lib" / "R" / "site-library" / "janeaustenr",  # `dpkg-deb -x pkg.deb $root`
        root / "janeaustenr",  # the R package directory copied into $root
        root,  # $root is the R package directory itself
        Path("/usr/lib/R/site-library/janeaustenr"),  # `apt-get install r-cran-janeaustenr`
    ]


def austen_package_dir() -> Path:
    """The installed janeaustenr R package directory (the one holding ``data/Rdata.rdb``).

    Looked up, in order: ``$ACTSTORE_DATA_DIR/janeaustenr`` (default ``~/.cache/actstore``) as a
    ``dpkg-deb -x`` root (``usr/lib/R/site-library/janeaustenr`` under it), then as the package
    directory itself (or its ``janeaustenr`` child), then Debian's system path
    ``/usr/lib/R/site-library/janeaustenr``. ``NotFound`` says how to extract it.
    """
    candidates = _austen_roots()
    for c in candidates:
        if (c / "data" / "Rdata.rdx").is_file() and (c / "data" / "Rdata.rdb").is_file():
            return c
    root = candidates[0].parents[4]
    raise NotFound(
        "austen needs the Debian package r-cran-janeaustenr extracted (not installed) under "
        f"{root}: run `cd /tmp && apt-get download r-cran-janeaustenr && "
        f"dpkg-deb -x r-cran-janeaustenr_*.deb {root}` (or the project's setup script), "
        "or set ACTSTORE_DATA_DIR to the directory that holds janeaustenr/"
    )


def read_r_lazyload(base: str | os.PathLike) -> dict[str, Any]:
    """Read every object of an R lazy-load database ``<base>.rdx`` + ``<base>.rdb``.

    The ``.rdx`` is a gzip'd serialized list(variables = name -> c(offset, length), references,
    compressed). Each ``.rdb`` record is a 4-byte big-endian length, then (compression 2 or 3) a
    type byte ('Z' zlib, '2' bzip2, 'X' xz, '0' none), then the compressed serialization; with
    ``compressed = TRUE`` it is plain zlib. Values are what ``rdata.conversion.convert`` makes of
    them: a character vector is a one-dimensional numpy array of ``str`` (``None`` for NA).
    """
    base = Path(base)
    index = _unserialize(Path(f"{base}.rdx").read_bytes())
    if not isinstance(index, dict) or not isinstance(index.get("variables"), dict):
        raise DataLoss(f"{base}.rdx is not an R lazy-load index")
    compressed = index.get("compressed")
    comp = compressed[0] if compressed is not None and len(compressed) else True
    rdb = Path(f"{base}.rdb").read_bytes()
    out: dict[str, Any] = {}
    for name, pos in index["variables"].items():
        off, length = int(pos[0]), int(pos[1])
        rec = rdb[off : off + length]
        if len(rec) != length or length < 5:
            raise DataLoss(f"{base}.rdb is truncated at object {name!r}")
        out_len = struct.unpack(">I", rec[:4])[0]
        if comp == 1:
            payload = zlib.decompress(rec[4:])
        else:
            kind, body = rec[4:5], rec[5:]
            if kind == b"Z":
                payload = zlib.decompress(body)
            elif kind == b"2":
                payload = bz2.decompress(body)
            elif kind == b"X":
                payload = lzma.decompress(body)
            elif kind == b"0":
                payload = body
            else:
                raise DataLoss(f"{base}.rdb: unknown compression type {kind!r} for {name!r}")
        if len(payload) != out_len:
            raise DataLoss(
                f"{base}.rdb: object {name!r} decompressed to {len(payload)} bytes, not {out_len}"
            )
        out[str(name)] = _unserialize(payload)
    return out


def _unserialize(raw: bytes) -> Any:
    """One R serialization (``saveRDS`` bytes, gzip'd or not), decoded by ``rdata``."""
    try:
        import rdata  # imported on use: it brings pandas and xarray, ~0.6 s
    except ImportError:
        raise NotFound("reading R data needs the rdata package: run `pip install rdata`") from None

    return rdata.conversion.convert(rdata.parser.parse_data(raw, extension=".rds"))


def _austen_lines(pkg: Path) -> dict[str, list[str]]:
    """Each novel's lines (as janeaustenr stores them, NA as ""), keyed by R variable name."""
    data_dir = pkg / "data"
    try:
        objects = read_r_lazyload(data_dir / "Rdata")
    except DataLoss:
        raise
    except _READ_ERRORS as e:
        raise DataLoss(
            f"austen: cannot read {data_dir}/Rdata.rdb ({e}); extract the package again"
        ) from None
    out: dict[str, list[str]] = {}
    for var in AUSTEN_BOOKS:
        lines = objects.get(var)
        items = lines.tolist() if isinstance(lines, np.ndarray) and lines.ndim == 1 else None
        if items is None or not all(isinstance(s, str) or s is None for s in items):
            raise DataLoss(f"austen: {data_dir}/Rdata.rdb has no character vector {var!r}")
        out[var] = [s or "" for s in items]
    return out


def load_austen(words_per_passage: int, source: dict) -> DatasetData:
    """The six novels in janeaustenr's order, each cut into passages of whole lines that reach
    ``words_per_passage`` words (a book's last passage may be shorter); empty lines are skipped
    and words are rejoined with single spaces. Sample ids are ``austen:<R variable>:<k>``."""
    pkg = austen_package_dir()
    texts: list[str] = []
    ids: list[str] = []
    books: list[str] = []
    for var, lines in _austen_lines(pkg).items():
        k = 0
        buf: list[str] = []
        for line in lines:
            words = line.split()
            if not words:
                continue
            buf.extend(words)
            if len(buf) >= words_per_passage:
                texts.append(" ".join(buf))
                ids.append(f"austen:{var}:{k}")
                k += 1
                buf = []
        if buf:
            texts.append(" ".join(buf))
            ids.append(f"austen:{var}:{k}")
        books.append(AUSTEN_BOOKS[var])
    source["books"] = books
    source["package_dir"] = str(pkg)
    return DatasetData(kind="text", texts=texts, sample_ids=ids, source=source)

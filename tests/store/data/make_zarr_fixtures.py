"""Writes tests/store/data/zarr-<version>/: small arrays written by plain zarr-python (the release
that runs this), laid out as the store lays out its activations, which tests/store/test_codecs.py
reads with the installed zarr and with store.format.codecs, and codes again. Run it in a throwaway
environment with the zarr release to record (zarr 3.2 and newer need Python >= 3.12):

    PYTHONPATH=. python tests/store/data/make_zarr_fixtures.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.storage import LocalStore

ROWS, STATES, WIDTH, SHARDS = 8, 3, 16, 3
# fixture name: (data type, codecs after `bytes`); bf16 is the store's bfloat16, a uint16 array
ARRAYS = {"f16": "float16", "bf16": "uint16"}


def codecs(name: str) -> list:
    if name == "f16":  # the store's own chain
        return [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=2), Crc32cCodec()]
    return [Crc32cCodec()]  # uncompressed: its bytes do not depend on the Blosc build


def fixture_values(name: str) -> np.ndarray:
    """The fixture's values: arithmetic only, the same under any numpy. f16's first shard has an
    inner chunk of zeros (the fill value), which zarr leaves out of the shard."""
    rows = SHARDS * ROWS - 5
    steps = np.arange(rows * STATES * WIDTH, dtype=np.float64).reshape(rows, STATES, WIDTH)
    numbers = (steps * 0.37) % 7 - 3  # in [-3, 4)
    if name == "bf16":  # bfloat16 bits of numbers in [1, 8): never the fill value 0
        return ((numbers + 4).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    values = numbers.astype(np.float16)
    values[:ROWS, 1] = 0
    return values


def main() -> None:
    out = Path(__file__).parent / f"zarr-{zarr.__version__}"
    shutil.rmtree(out, ignore_errors=True)
    store = LocalStore(out)
    for name, dtype in ARRAYS.items():
        values = fixture_values(name)
        array = zarr.create_array(store, name=name, shape=values.shape, chunks=(ROWS, 1, WIDTH),
                                  shards=(ROWS, STATES, WIDTH), dtype=dtype, compressors=codecs(name), fill_value=0)
        array[:] = values
    versions = {"python": sys.version.split()[0], "zarr": zarr.__version__, "numcodecs": numcodecs.__version__,
                "numpy": np.__version__}
    (out / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(out, versions)


if __name__ == "__main__":
    main()

"""Content-addressed keys: canonical JSON hashed with sha256.

A run key fixes everything that determines the stored numbers, so the same request from any
team member maps to the same run (the shared cache). A result key does the same for metrics.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

CAPTURE_VERSION = 1
SITE = "residual-stream"  # HF hidden_states convention, layer L taken before the final norm
# The one list of poolings (part of the run key). "tokens" keeps every non-pad token; the others
# give one vector per sample (actstore.modeling.pooling derives its names from this tuple).
POOLINGS = ("cls", "last", "mean", "tokens")
STORAGE_DTYPES = ("float16", "float32", "bfloat16")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: one byte string per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def run_spec(
    *,
    model_digest: str,
    dataset_digest: str,
    num_layers: int,
    pooling: str,
    max_len: int,
    dtype: str,
) -> dict[str, Any]:
    """The fields of DESIGN.md's run key; `layers` is every hidden state 0..L."""
    return {
        "model": model_digest,
        "dataset": dataset_digest,
        "site": SITE,
        "layers": list(range(num_layers + 1)),
        "pooling": pooling,
        "max_len": max_len,
        "dtype": dtype,
        "capture_version": CAPTURE_VERSION,
    }


def run_key(spec: dict[str, Any]) -> str:
    return sha256_hex(spec)


def result_key(
    metric: str, definition_version: int, options: dict[str, Any], run_keys: list[str]
) -> str:
    return sha256_hex(
        {"metric": metric, "version": definition_version, "options": options, "runs": run_keys}
    )

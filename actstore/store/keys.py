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
# Capture sites (actstore.modeling.sites maps them to modules). resid_post keeps the spec's
# historical site value SITE, so every run key made before sites existed stays the same.
RESID_POST = "resid_post"
CANONICAL_SITES = (RESID_POST, "attn_out", "mlp_out")
# The one list of poolings (part of the run key). "tokens" keeps every non-pad token; the others
# give one vector per sample (actstore.modeling.pooling derives its names from this tuple).
POOLINGS = ("cls", "last", "mean", "tokens")
STORAGE_DTYPES = ("float16", "float32", "bfloat16", "int8")  # int8: one byte a value, scaled (store.format.quantised)


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
    site: str = RESID_POST,
    modules: str = "",
    max_cka_error: float | None = None,
) -> dict[str, Any]:
    """The fields of DESIGN.md's run key; `layers` is every hidden state 0..L. A site other than
    resid_post also records `modules`, the module pattern it resolved to in this model; a lossy
    dtype's tolerance (`max_cka_error`) is recorded where one is given (it decides which layers
    are stored exactly)."""
    extra = {} if site == RESID_POST else {"modules": modules}
    if max_cka_error is not None:
        extra["max_cka_error"] = float(max_cka_error)
    return {
        **extra,
        "model": model_digest,
        "dataset": dataset_digest,
        "site": SITE if site == RESID_POST else site,
        "layers": list(range(num_layers + 1)),
        "pooling": pooling,
        "max_len": max_len,
        "dtype": dtype,
        "capture_version": CAPTURE_VERSION,
    }


def site_of(spec: dict[str, Any] | None) -> str:
    """The capture site of a run spec by its user-facing name (resid_post for older runs)."""
    site = (spec or {}).get("site", SITE)
    return RESID_POST if site == SITE else site


def run_key(spec: dict[str, Any]) -> str:
    return sha256_hex(spec)


def rounding_key(spec: dict[str, Any]) -> str:
    """The key a lossy run's rounding draws are seeded from (`store.format.quantised.rounding_seed`):
    its run key without the tolerance, so that a `max_cka_error` changes which layers are kept
    exact and never the codes of the others (runs of different models, data, sites or dtypes
    still draw independently)."""
    return run_key({name: value for name, value in spec.items() if name != "max_cka_error"})


def result_key(
    metric: str, definition_version: int, options: dict[str, Any], run_keys: list[str]
) -> str:
    return sha256_hex(
        {"metric": metric, "version": definition_version, "options": options, "runs": run_keys}
    )

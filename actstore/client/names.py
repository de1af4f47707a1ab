"""How an answer names its runs in tables, titles and legends: by model name, the run key's
first characters where a run has none."""

from __future__ import annotations

from actstore.records import Provenance, RunName


def short_name(run: RunName) -> str:
    """A run's model name (its key's first 12 characters where it has none)."""
    return run.model or run.run_key[:12]


def pair_names(provenance: Provenance) -> tuple[str, str]:
    """The names of runs A and B of an answer (B is A for an answer of one run)."""
    if not provenance.run_keys:
        return "A", "B"
    first = short_name(provenance.run_name(0))
    if len(provenance.run_keys) < 2 or provenance.run_keys[1] == provenance.run_keys[0]:
        return first, first
    second = short_name(provenance.run_name(1))
    return (f"{first} (A)", f"{second} (B)") if first == second else (first, second)

"""The protocol of streaming metric accumulators: what map tasks, merges and finalizes call on them.

A metric job copies an empty accumulator into each map task, `update`s it with chunks of rows, and
`merge`s the tasks' accumulators into one whose `finalize` gives the answer
(`workers.metric_tasks`, `server.executor`). What an update takes (a list of layer blocks, one
block, tokens and offsets, features and labels) and what finalize takes and returns differ per
metric, so those two are declared with any arguments; the members themselves are what a type
checker holds every accumulator to.

Two capabilities are optional, each its own narrow runtime-checkable protocol that callers test
with `isinstance` on an accumulator (a wrapper passes them on to what it wraps):
- `OnDevice`: has a `device` (None: numpy/BLAS on the host; else a torch device name) where it
  forms its products; a map task sets it by the server's `metric_device` policy.
- `Seekable`: resamples rows (bootstrap weights keyed on the global row index), so it is told the
  first row of each range before the range's update.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Accumulator(Protocol):
    """A mergeable streaming state: update with chunks, merge another task's, finalize once."""

    def update(self, *args: Any, **kwargs: Any) -> object:
        """Add one chunk of rows (the metric says in which form, and with what extra arrays)."""
        ...

    def merge(self, other: Any) -> object:
        """Add another accumulator of the same kind and shape (built over other rows) into this one."""
        ...

    def finalize(self, *args: Any, **kwargs: Any) -> Any:
        """The answer from the accumulated state."""
        ...


@runtime_checkable
class OnDevice(Protocol):
    """An accumulator whose products can run on a torch device."""

    device: str | None


@runtime_checkable
class Seekable(Protocol):
    """An accumulator that resamples rows: each update's rows are numbered from the last `seek`."""

    def seek(self, row: int) -> None:
        """The global index of the first row of the next update."""
        ...

"""A job's progress as a `tqdm.auto` bar: a widget in Jupyter (with ipywidgets), text in a terminal.

One bar a job, made at its first event with a total, moved to each event's count (a training's
steps as its progress.json has them, a capture's rows, a matrix job's tiles), its message (a
training's loss) beside it, and closed when the job ends, fails or the watch is broken off (a
notebook's widget then turns red where the count fell short of the total).
"""

from __future__ import annotations

from collections.abc import Iterable

from actstore.client.results import JobInfo


def followed(events: Iterable[JobInfo], description: str = "", shown: bool = True) -> JobInfo | None:
    """Follow a job's events to the last one, drawing them on one bar (if `shown`); returns the
    last event."""
    from tqdm.auto import tqdm

    bar = None
    job = None
    try:
        for job in events:
            if not (shown and job.total):
                continue
            if bar is None:
                bar = tqdm(total=job.total, unit=f" {job.unit or 'step'}", desc=description or job.kind,
                           dynamic_ncols=True)
            elif bar.total != job.total:  # a matrix job's plan, a capture's rows once known
                bar.reset(total=job.total)
            if job.message:
                bar.set_postfix_str(job.message, refresh=False)
            bar.update(job.done - bar.n)
    finally:
        if bar is not None:
            bar.close()
    return job

"""The store's own asyncio event loop: zarr's Store interface is async, and the store (and the
client's xarray view) call it from synchronous code. One loop per process runs on a daemon thread;
``sync`` hands it a coroutine and waits for the result, from any thread, also one that runs an
event loop of its own (a notebook's, a Ray async actor's), where ``asyncio.run`` would refuse.

zarr-python keeps such a loop too (in a module of its own that is not public); its stores' coroutines need no
particular loop: LocalStore hands each call to a worker thread, ObjectStore's obstore calls run
on obstore's own runtime and resolve on whichever loop awaits them.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="actstore-store-loop", daemon=True)
            thread.start()
            _loop, _thread = loop, thread
        return _loop


def _forget_after_fork() -> None:
    """A forked child has no loop thread (only the forking thread survives a fork): it starts one."""
    global _lock, _loop, _thread
    _lock, _loop, _thread = threading.Lock(), None, None


os.register_at_fork(after_in_child=_forget_after_fork)


def sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the store's loop and return its result (or raise its exception)."""
    loop = _running_loop()
    if threading.current_thread() is _thread:
        coroutine.close()
        raise RuntimeError("sync() called from the store's event loop thread: await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

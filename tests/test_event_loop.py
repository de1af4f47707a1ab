"""store.event_loop: the store's async calls run from synchronous code on the process's own loop,
also from a thread that runs a loop of its own, and in a forked child."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

import numpy as np
import pytest
from zarr.storage import LocalStore

from actstore.event_loop import sync


async def _answer(value):
    await asyncio.sleep(0)
    return value, threading.current_thread().name


def test_a_coroutine_runs_on_the_store_loop_and_its_errors_come_back():
    assert sync(_answer(42)) == (42, "actstore-store-loop")

    async def fails():
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        sync(fails())


def test_it_runs_inside_a_running_event_loop(tmp_path):
    store = LocalStore(tmp_path)

    async def notebook_cell():  # a blocking call made where a loop runs (a notebook, an async actor)
        sync(store.set("a/b", _buffer(b"123")))
        return sync(store.exists("a/b"))

    assert asyncio.run(notebook_cell())
    assert (tmp_path / "a" / "b").read_bytes() == b"123"


def test_the_loop_thread_itself_may_not_block_on_it():
    async def inner():
        return 1

    async def outer():
        return sync(inner())

    with pytest.raises(RuntimeError, match="await the coroutine"):
        sync(outer())


def _in_child(queue):
    queue.put(sync(_answer("child"))[0])


# Python 3.12+ warns of any fork of a process with threads: forking one is what this test is about
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_starts_its_own_loop():
    sync(_answer(0))  # the parent's loop thread exists before the fork
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and queue.get(timeout=5) == "child"


def _buffer(data: bytes):
    from zarr.buffer.cpu import Buffer

    return Buffer.from_array_like(np.frombuffer(data, dtype=np.uint8))

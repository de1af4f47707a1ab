"""Tests of actstore.store.atomic on real files: whole-or-nothing folders and files, races, stale
staging leftovers, names with glob metacharacters, and the modes a shared store needs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from actstore.store import atomic
from actstore.store.atomic import (
    STALE_STAGING_SECONDS,
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
)


def _entries(parent: Path) -> list[str]:
    return sorted(os.listdir(parent))


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it afterwards."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


# ------------------------------------------------------------------------------------------
# atomic_directory
# ------------------------------------------------------------------------------------------


def test_target_appears_complete_and_only_at_the_end(tmp_path):
    target = tmp_path / "sub" / "ds"  # the parent is created
    with atomic_directory(target) as staging:
        assert staging.parent == target.parent and staging.is_dir()
        assert _entries(staging) == []
        (staging / "a.txt").write_text("alpha")
        (staging / "nested").mkdir()
        (staging / "nested" / "b.bin").write_bytes(b"\x00\x01")
        assert not target.exists()  # readers see nothing while the block runs
    assert (target / "a.txt").read_text() == "alpha"
    assert (target / "nested" / "b.bin").read_bytes() == b"\x00\x01"
    assert _entries(target.parent) == ["ds"]  # no staging folder left beside it


def test_every_file_and_folder_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    synced: list[Path] = []
    real = atomic.fsync_path
    monkeypatch.setattr(atomic, "fsync_path", lambda p: (synced.append(Path(p)), real(p)))
    target = tmp_path / "ds"
    with atomic_directory(target) as staging:
        (staging / "nested").mkdir()
        (staging / "nested" / "f").write_text("x")
        (staging / "g").write_text("y")
    names = {p.relative_to(staging) for p in synced if p.is_relative_to(staging)}
    assert names == {Path("."), Path("nested"), Path("nested/f"), Path("g")}
    assert synced[-1] == tmp_path  # the parent, after the rename, makes the rename durable


def test_an_error_inside_leaves_no_target_and_no_staging(tmp_path):
    target = tmp_path / "ds"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_directory(target) as staging:
            (staging / "half.txt").write_text("half")
            raise RuntimeError("boom")
    assert not target.exists()
    assert _entries(tmp_path) == []


def test_the_writer_that_finishes_second_gets_file_exists_and_the_first_survives(tmp_path):
    target = tmp_path / "ds"
    with pytest.raises(FileExistsError):
        with atomic_directory(target) as slow:
            (slow / "who").write_text("slow")
            with atomic_directory(target) as fast:  # starts later, finishes first
                (fast / "who").write_text("fast")
            assert (target / "who").read_text() == "fast"
    assert (target / "who").read_text() == "fast"
    assert _entries(tmp_path) == ["ds"]  # the loser's staging folder is gone


def test_an_existing_empty_folder_is_not_replaced(tmp_path):
    target = tmp_path / "ds"
    target.mkdir()  # rename(2) would silently replace an empty folder
    with pytest.raises(FileExistsError):
        with atomic_directory(target) as staging:
            (staging / "f").write_text("x")
    assert _entries(target) == []
    assert _entries(tmp_path) == ["ds"]


def test_stale_staging_folders_are_removed_young_ones_kept(tmp_path):
    stale = tmp_path / ".ds.staging-crashed"
    young = tmp_path / ".ds.staging-live"
    other = tmp_path / ".other.staging-crashed"  # another target's leftovers are not ours
    for d in (stale, young, other):
        d.mkdir()
        (d / "part").write_text("x")
    _age(stale, STALE_STAGING_SECONDS + 60)
    _age(other, STALE_STAGING_SECONDS + 60)
    _age(young, STALE_STAGING_SECONDS - 60)
    with atomic_directory(tmp_path / "ds") as staging:
        (staging / "f").write_text("x")
    assert _entries(tmp_path) == [".ds.staging-live", ".other.staging-crashed", "ds"]


def test_glob_metacharacters_in_the_name(tmp_path):
    target = tmp_path / "a[1]"
    stale = tmp_path / ".a[1].staging-crashed"
    lookalike = tmp_path / ".a1.staging-crashed"  # what an unescaped `.a[1].staging-*` matches
    for d in (stale, lookalike):
        d.mkdir()
        _age(d, STALE_STAGING_SECONDS + 60)
    with atomic_directory(target) as staging:
        (staging / "f").write_text("x")
    assert (target / "f").read_text() == "x"
    assert _entries(tmp_path) == [".a1.staging-crashed", "a[1]"]


def test_symlinks_inside_are_kept_not_followed(tmp_path):
    target = tmp_path / "ds"
    with atomic_directory(target) as staging:
        (staging / "real").write_text("x")
        os.symlink("real", staging / "link")
        os.symlink("missing", staging / "dangling")
    assert (target / "link").read_text() == "x"
    assert os.readlink(target / "dangling") == "missing"


# ------------------------------------------------------------------------------------------
# atomic_write_bytes / atomic_write_text
# ------------------------------------------------------------------------------------------


def test_atomic_write_text_replaces_content_and_leaves_no_staging(tmp_path):
    path = tmp_path / "state" / "status.json"  # the parent is created
    atomic_write_text(path, '{"state": "running"}')
    assert path.read_text() == '{"state": "running"}'
    atomic_write_text(path, "ünïcode ✓")
    assert path.read_bytes() == "ünïcode ✓".encode()
    atomic_write_bytes(path, b"\x00raw")
    assert path.read_bytes() == b"\x00raw"
    assert _entries(path.parent) == ["status.json"]


def test_a_failed_write_keeps_the_old_content(tmp_path):
    path = tmp_path / "status.json"
    atomic_write_text(path, "old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert _entries(tmp_path) == ["status.json"]


def test_stale_staging_files_are_removed_young_ones_kept(tmp_path):
    stale = tmp_path / ".status.json.staging-crashed"
    young = tmp_path / ".status.json.staging-live"
    for f in (stale, young):
        f.write_text("half")
    _age(stale, STALE_STAGING_SECONDS + 60)
    _age(young, 10)
    atomic_write_text(tmp_path / "status.json", "new")
    assert _entries(tmp_path) == [".status.json.staging-live", "status.json"]


# ------------------------------------------------------------------------------------------
# modes
# ------------------------------------------------------------------------------------------


def test_modes_are_for_a_shared_store_whatever_the_umask(tmp_path, umask):
    umask(0o077)  # mkdtemp's 0700 and mkstemp's 0600 must not leak through
    with atomic_directory(tmp_path / "ds") as staging:
        (staging / "f").write_text("x")
    atomic_write_text(tmp_path / "status.json", "x")
    assert os.stat(tmp_path / "ds").st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "status.json").st_mode & 0o777 == 0o644


def test_files_written_inside_keep_the_usual_modes(tmp_path, umask):
    umask(0o022)
    with atomic_directory(tmp_path / "ds") as staging:
        (staging / "f").write_text("x")
        (staging / "sub").mkdir()
    assert os.stat(tmp_path / "ds").st_mode & 0o777 == 0o755
    assert os.stat(tmp_path / "ds" / "f").st_mode & 0o777 == 0o644
    assert os.stat(tmp_path / "ds" / "sub").st_mode & 0o777 == 0o755

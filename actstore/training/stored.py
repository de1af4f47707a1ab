"""Training checkpoints in the store's files area, so that a training task can run on any node.

With an object store (``s3://``) the task trains in a scratch folder on its own node
(``scratch_folder``) and puts every checkpoint into the store as it appears (``upload``):

    training/<run>/state-<k>/training_state.pt   the resume state of step k (kept for the newest)
    training/<run>/step-<k>/                     the checkpoint without its state: a model folder
    training/<run>/progress.json                 the task's progress, which the job follows

Each folder goes in through ``StoreFiles.write_folder`` (every file, then the ``.complete``
marker), the state before the step folder: a complete ``step-<k>`` is a whole checkpoint, and its
state stays until a newer step folder is complete, when ``upload`` removes it. The server
registers the complete step folders from the store (``stored_checkpoints``), never from its own
disk. A task that starts (again, after a kill, on any node) first puts the newest checkpoint that
has a state into its scratch folder (``restore``), so the loop resumes from it.

With a local store the files area is the store's directory: the task trains in place, in
``<store>/training/<run>/`` (the layout of ``checkpoints``), and nothing is copied.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from actstore.store.backends.files import StoreFiles
from actstore.store.handle import StoreHandle

__all__ = ["LINEAGE_FILE", "PROGRESS_FILE", "read_progress", "restore", "run_prefix", "scratch_folder",
           "stored_checkpoints", "upload", "write_progress"]

PROGRESS_FILE = "progress.json"
_STEP = re.compile(r"^step-(\d+)$")  # checkpoints.CHECKPOINT_RE (that module imports torch)
_STATE = re.compile(r"^state-(\d+)$")
_STATE_FILE = "training_state.pt"  # checkpoints.STATE_FILE
LINEAGE_FILE = "lineage.json"  # checkpoints.LINEAGE_FILE


def run_prefix(key: str) -> str:
    """The files-area folder of the training run whose job key is ``key``."""
    return f"training/{key[:16]}"


def _numbered(files: StoreFiles, prefix: str, pattern: re.Pattern) -> list[tuple[int, str]]:
    found = []
    for key in files.folders(prefix):
        m = pattern.match(key.rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), key))
    return sorted(found)


def stored_checkpoints(store: StoreHandle, prefix: str) -> list[str]:
    """The complete checkpoints of the run at ``prefix``, in step order, as files-area keys."""
    if not store.is_remote:
        from actstore.training.checkpoints import list_checkpoints

        return [f"{prefix}/{path.name}" for path in list_checkpoints(store.path / prefix)]
    return [key for _, key in _numbered(store.files, prefix, _STEP)]


def read_progress(files: StoreFiles, prefix: str) -> dict | None:
    try:
        data = files.read(prefix, PROGRESS_FILE)
        return None if data is None else json.loads(data)
    except json.JSONDecodeError:
        return None


def write_progress(files: StoreFiles, prefix: str, record: dict) -> None:
    files.write(prefix, PROGRESS_FILE, json.dumps(record).encode())


def scratch_folder(prefix: str) -> Path:
    """This node's scratch folder for the run at ``prefix``, empty: whatever an earlier attempt
    left here (killed before it cleaned up) is removed, since the store holds what it finished.
    One task per run at a time (the server's jobs are keyed by run), so nothing else uses it."""
    folder = Path(tempfile.gettempdir()) / "actstore-training" / prefix.replace("/", "-")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def restore(files: StoreFiles, prefix: str, scratch: Path) -> int | None:
    """Put the newest stored checkpoint that has its state into ``scratch`` (``step-<k>`` with
    its ``training_state.pt``) and return k; None for a run with none (it starts afresh). The
    other stored states (an older one a kill left behind, or a newer one whose step folder never
    became complete) are removed, so the next upload of their steps writes them anew."""
    states = dict(_numbered(files, prefix, _STATE))
    steps = dict(_numbered(files, prefix, _STEP))
    resumable = sorted(set(states) & set(steps))
    step = resumable[-1] if resumable else None
    for k, key in states.items():
        if k != step:
            files.remove(key)
    if step is None:
        return None
    target = scratch / f"step-{step}"
    shutil.copytree(files.local(files.ref(steps[step])), target)
    state = files.read(states[step], _STATE_FILE)
    if state is None:  # complete folders hold their files; a missing one was deleted by hand
        from actstore.errors import DataLoss

        raise DataLoss(f"the stored state {states[step]} has no {_STATE_FILE}: remove that folder from the store "
                       "and submit the training again (it resumes from the checkpoint before)")
    (target / _STATE_FILE).write_bytes(state)
    return step


def upload(files: StoreFiles, prefix: str, checkpoint: Path) -> str:
    """Put the scratch checkpoint ``checkpoint`` (``step-<k>``) into the store: its state, then
    its other files, each folder complete only once whole; then remove the older states, and the
    older checkpoints from the scratch folder. Returns the step folder's key."""
    step = int(_STEP.match(checkpoint.name).group(1))
    state = checkpoint / _STATE_FILE
    if state.is_file():
        files.write_folder(f"{prefix}/state-{step}", lambda target: _copy_file(state, target))
    key = f"{prefix}/{checkpoint.name}"
    files.write_folder(key, lambda target: shutil.copytree(checkpoint, target,
                                                            ignore=shutil.ignore_patterns(_STATE_FILE)))
    for k, older in _numbered(files, prefix, _STATE):
        if k < step:
            files.remove(older)
    for sibling in checkpoint.parent.iterdir():
        m = _STEP.match(sibling.name)
        if m and int(m.group(1)) < step:
            shutil.rmtree(sibling, ignore_errors=True)
    return key


def _copy_file(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    shutil.copy2(source, target / source.name)

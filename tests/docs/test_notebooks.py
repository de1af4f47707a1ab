"""The example notebooks run top to bottom in a real Jupyter kernel (nbclient + ipykernel): no cell
may fail, and every code cell must show what its tags promise (`expect-html`: an answer's or a
record's HTML summary, `expect-png`: a figure, `expect-widget`: a job's tqdm bar, `expect-stdout`:
printed text, `expect-none`: nothing). The committed notebooks carry no outputs, so their diffs
stay readable.

docs/notebooks/quickstart.ipynb registers MiniLM-L6 and SmolLM2-135M (~20 s to dequantise) and
captures both on 48 reviews in a fresh store: about 2-3 minutes on 2 cores, so the file is `long`."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.long

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "docs" / "notebooks").glob("*.ipynb"))
MIME = {"html": "text/html", "png": "image/png", "widget": "application/vnd.jupyter.widget-view+json"}


def _shown(cell) -> set[str]:
    """What a cell's outputs show: mime types of its displays, and stdout."""
    shown = set()
    for output in cell.outputs:
        if output.output_type in ("display_data", "execute_result"):
            shown |= set(output.data)
        elif output.output_type == "stream" and output.name == "stdout":
            shown.add("stdout")
    return shown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_has_no_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel_and_shows_what_each_cell_promises(path, tmp_path, monkeypatch):
    monkeypatch.setenv("ACTSTORE_NOTEBOOK_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # Jupyter's own
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                   record_timing=True).execute()  # a failing cell raises CellExecutionError with its traceback
    seconds = time.perf_counter() - started
    nbformat.write(notebook, tmp_path / path.name)  # the executed notebook, to look at when a cell disappoints
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        promised = [tag.removeprefix("expect-") for tag in cell.metadata.get("tags", []) if tag.startswith("expect-")]
        assert promised, f"cell {index} promises nothing: tag it expect-html, -png, -widget, -stdout or -none"
        shown = _shown(cell)
        assert not [o for o in cell.outputs if o.output_type == "error"], f"cell {index} failed"
        if promised == ["none"]:
            assert not shown, f"cell {index} showed {shown}"
            continue
        missing = [what for what in promised if MIME.get(what, what) not in shown]
        assert not missing, f"cell {index} ({cell.source.splitlines()[0]!r}) shows no {missing}: it showed {shown}"
    print(f"{path.name}: {seconds:.0f} s, executed copy {tmp_path / path.name}")

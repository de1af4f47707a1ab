"""Every answer draws itself: `plot(ax)` draws into the Axes given and returns it, `plot()` makes
a figure, `help(result.plot)` says what is drawn, and without matplotlib plot() says how to
install it. The answers come from a real server on loopback (tiny models, real captures)."""

from __future__ import annotations

import os
import subprocess
import sys

import matplotlib
import numpy as np
import pytest

from actstore.errors import InvalidArgument
from actstore.report import write_outliers, write_plot, write_probes
from tests.factories import sentences

matplotlib.use("Agg")  # no window, and no non-interactive warning (warnings are errors here)
import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture(scope="module")
def answers(module_client, tiny_models):
    """One answer of every type the CLI plots, of two models on one labelled dataset."""
    c = module_client
    c.register_model(tiny_models["bert"], name="tiny-bert")
    c.register_model(tiny_models["gpt2"], name="tiny-gpt2")
    texts = sentences(40, seed=3)
    c.register_dataset(texts=texts, labels=[i % 2 for i in range(40)], name="toy-labelled")
    bert = c.capture("tiny-bert", "toy-labelled", pooling="mean", dtype="float32").run_key
    gpt2 = c.capture("tiny-gpt2", "toy-labelled", pooling="mean", dtype="float32").run_key
    tokens = c.capture("tiny-gpt2", "toy-labelled", pooling="tokens", dtype="float32").run_key
    return {
        "cka": c.cka(bert), "cka across": c.cka(bert, gpt2), "cos": c.cos(bert),
        "minibatch": c.minibatch_cka(bert, gpt2, batch_size=10), "measure": c.measure("cca-score", bert, gpt2),
        "cka matrix": c.cka_matrix([bert, gpt2]), "measure matrix": c.measure_matrix([bert, gpt2], "cca-score"),
        "entropy": c.entropy("dataset_entropy", bert), "residual": c.residual_norm(bert),
        "lens": c.lens(tokens), "outliers": c.outliers(gpt2, top_k=2),
        "cka stats": c.cka_stats(bert, gpt2, layers_a=[1, 2], layers_b=[0, 3], bootstrap=10, null=5),
        "cos stats": c.cos_stats(bert, layers_a=[1], layers_b=[2, 3], bootstrap=10),
        "probe": c.probe(bert), "probe against": c.probe_runs([bert, gpt2], against=["dataset-entropy"]),
        "names": {bert: "tiny-bert", gpt2: "tiny-gpt2"},
    }


PICTURES = [("cka", {}), ("cka", {"debiased": True}), ("cka", {"show": "to_last"}), ("cka across", {}),
            ("cos", {}), ("cos", {"show": "to_last"}), ("minibatch", {}), ("measure", {}), ("cka matrix", {}),
            ("cka matrix", {"debiased": True}), ("measure matrix", {}), ("entropy", {}), ("residual", {}),
            ("lens", {}), ("lens", {"show": "saturation"}), ("lens", {"show": "exits"}), ("outliers", {}),
            ("outliers", {"show": "dimensions"}), ("cka stats", {}), ("cka stats", {"debiased": True}),
            ("cos stats", {}), ("probe", {})]


@pytest.mark.parametrize(("answer", "options"), PICTURES, ids=[f"{a}-{o}" for a, o in PICTURES])
def test_plot_draws_into_the_axes_given(answers, answer, options):
    figure, (left, right) = plt.subplots(1, 2)
    try:
        assert answers[answer].plot(right, **options) is right
        assert right.has_data() and not left.has_data()
        assert right.get_title()
    finally:
        plt.close(figure)


def test_plot_without_axes_makes_a_figure_and_names_the_runs(answers):
    before = set(plt.get_fignums())
    ax = answers["cka across"].plot()
    try:
        assert set(plt.get_fignums()) - before == {ax.figure.number}
        assert (ax.get_ylabel(), ax.get_xlabel()) == ("layer of tiny-bert", "layer of tiny-gpt2")
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3"]
    finally:
        plt.close(ax.figure)
    ax = answers["cka matrix"].plot()
    try:
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks == [f"tiny-bert:{i}" for i in range(4)] + [f"tiny-gpt2:{i}" for i in range(4)]
    finally:
        plt.close(ax.figure)


def test_curves_of_several_models_compose_on_one_axes(answers):
    figure, ax = plt.subplots()
    try:
        answers["entropy"].plot(ax, relative=True)
        answers["lens"].plot(ax, relative=True, label="tiny-gpt2 lens", color="red")
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["tiny-bert", "tiny-gpt2 lens"]
        assert ax.get_xlabel() == "layer / last layer"
        assert ax.get_lines()[-2].get_color() == "red"  # style goes to the curve (the last line: the depth marker)
    finally:
        plt.close(figure)


def test_the_heatmap_is_the_matrix(answers):
    figure, ax = plt.subplots()
    try:
        cka = answers["cka"]
        answers["cka"].plot(ax)
        np.testing.assert_array_equal(ax.get_images()[0].get_array(), cka.biased)
        assert ax.get_images()[0].get_clim() == (0.0, 1.0)
    finally:
        plt.close(figure)


def test_help_says_what_is_drawn(answers):
    for answer, _ in PICTURES:
        doc = type(answers[answer]).plot.__doc__
        assert doc and "Draw" in doc and "Axes" in doc, answer
    assert "heatmap" in type(answers["cka"]).plot.__doc__ and "to_last" in type(answers["cka"]).plot.__doc__
    assert "saturation" in type(answers["lens"]).plot.__doc__


def test_an_unknown_picture_is_refused_before_drawing(answers):
    with pytest.raises(InvalidArgument, match="one of accuracy, saturation, exits"):
        answers["lens"].plot(show="heatmap")


def test_file_writers_draw_the_same_pictures(answers, tmp_path):
    write_plot(tmp_path / "cka.png", answers["cka"].plot)
    write_outliers(tmp_path / "o.png", answers["outliers"])
    write_probes(tmp_path / "p.png", answers["probe against"], ["tiny-bert", "tiny-gpt2"])
    for name in ("cka.png", "o.png", "p.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_plot_says_how_to_install_it(answers):
    """A client without matplotlib (the plots extra): imported without it, plot() refuses."""
    script = ("import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.pyplot'] = None\n"
              "import numpy as np\n"
              "from actstore.client import CKAResult\n"
              "from actstore.records import Provenance\n"
              "r = CKAResult(np.eye(2), np.eye(2), [0, 1], [0, 1], 5,\n"
              "              Provenance('cka', 1, {}, ['k'], True, 0.1, 'k'), [])\n"
              "assert '<img' not in r._repr_html_()\n"
              "try:\n    r.plot()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONWARNINGS": "error"}, check=True).stdout
    assert out.startswith("FailedPrecondition") and "pip install 'actstore[plots]'" in out

"""Answers and records show themselves: a short repr, an HTML summary in Jupyter naming the runs by
model and dataset (the server sends the names, kept current when an alias is set), a thumbnail
heatmap for a matrix, listings as tables, and one tqdm bar a job, closed when the job ends or fails.
A real server on loopback with tiny models."""

from __future__ import annotations

import matplotlib
import pytest
from tqdm import tqdm

from actstore.client.progress import followed
from actstore.client.results import JobInfo
from tests.factories import sentences

matplotlib.use("Agg")  # the thumbnails draw on pyplot-free figures; nothing here may open a window

TEXTS = sentences(24, seed=11)


@pytest.fixture(scope="module")
def runs(module_client, tiny_models):
    c = module_client
    c.register_model(tiny_models["bert"], name="shown-bert")
    c.register_model(tiny_models["gpt2"], name="shown-gpt2")
    c.register_dataset(texts=TEXTS, name="shown-toy")
    return {name: c.capture(f"shown-{name}", "shown-toy", pooling="mean", dtype="float32").run_key
            for name in ("bert", "gpt2")}


def test_the_reply_names_its_runs(module_client, runs):
    cka = module_client.cka(runs["bert"], runs["gpt2"])
    names = cka.provenance.run_names
    assert [(n.run_key, n.model, n.dataset, n.pooling, n.site) for n in names] == [
        (runs["bert"], "shown-bert", "shown-toy", "mean", "resid_post"),
        (runs["gpt2"], "shown-gpt2", "shown-toy", "mean", "resid_post")]
    stats = module_client.cka_stats(runs["bert"], layers_a=[1], layers_b=[2], bootstrap=10)  # Diagnostics RPC
    assert [n.model for n in stats.provenance.run_names] == ["shown-bert", "shown-bert"]  # A and B


def test_repr_is_one_short_line(module_client, runs):
    for answer in (module_client.cka(runs["bert"]), module_client.cos(runs["bert"], runs["gpt2"]),
                   module_client.entropy("dataset_entropy", runs["gpt2"]), module_client.outliers(runs["bert"])):
        text = repr(answer)
        assert "\n" not in text and "array(" not in text and len(text) < 400, text
        assert text.startswith(type(answer).__name__ + "(") and "shown-toy" in text
    assert repr(module_client.cka(runs["bert"])).startswith("CKAResult(linear CKA, 4 x 4 layers; runs shown-bert")


def test_html_summary_says_what_was_asked_and_where_it_came_from(module_client, runs):
    first = module_client.cka(runs["bert"], runs["gpt2"], layers_a=[0, 1, 2], refresh=True)
    page = first._repr_html_()
    for text in ("CKAResult", "<code>linear_cka</code>", "layers_a=0..2", "<b>shown-bert</b> on <b>shown-toy</b>",
                 "<b>shown-gpt2</b>", runs["gpt2"][:12], "computed in", "<img src='data:image/png;base64,"):
        assert text in page, text
    again = module_client.cka(runs["bert"], runs["gpt2"], layers_a=[0, 1, 2])._repr_html_()
    assert "cached (its computation took" in again
    stats = module_client.cka_stats(runs["bert"], layers_a=[1], layers_b=[2, 3], bootstrap=10, ci=0.9)
    assert "90% percentile bootstrap, 10 replicates" in stats._repr_html_()
    curve = module_client.entropy("dataset_entropy", runs["bert"])._repr_html_()
    assert "<img" not in curve and "dataset_entropy" in curve  # a thumbnail only for matrices


def test_a_new_alias_shows_in_the_next_reply(module_client, runs):
    """Names are kept per run and whole replies of cached queries are kept: an alias set since
    renews both."""
    assert module_client.cos(runs["bert"]).provenance.run_names[0].dataset == "shown-toy"
    module_client.register_dataset(texts=TEXTS, name="a-shown-toy")  # the same digest: an alias added
    assert module_client.cos(runs["bert"]).provenance.run_names[0].dataset == "a-shown-toy"


def test_records_and_listings_are_tables(module_client, runs):
    listing = module_client.runs(dataset="shown-toy")
    page = listing._repr_html_()
    assert page.startswith("<table>") and page.count("<tr>") == 1 + len(listing)
    assert runs["bert"][:12] in page and runs["bert"] not in page  # keys cut to 12 characters
    info = module_client.describe(runs["bert"])
    assert "<th style='text-align:left'>health</th><td style='text-align:left'>4 entries</td>" in info._repr_html_()
    assert "health" not in repr(info)  # one record per layer: not in the one-line repr
    assert "shown-bert" in module_client.models()._repr_html_()


def _job(status: str, done: int, total: int = 10, message: str = "") -> JobInfo:
    return JobInfo("j1", "train", status, "t", done, total, "steps", "", "", False, False, message)


def test_one_bar_follows_a_job_and_is_closed_when_it_fails(capsys):
    events = [_job("queued", 0, 0), _job("running", 3), _job("running", 7, message="loss 0.5"), _job("failed", 7)]
    assert followed(iter(events), "train vit")  == events[-1]
    err = capsys.readouterr().err
    assert "train vit" in err and "7/10" in err and "loss 0.5" in err
    assert not tqdm._instances  # closed


def test_capture_shows_a_bar_that_reaches_its_total(module_client, runs, tiny_models, capsys):
    module_client.register_dataset(texts=sentences(20, seed=12), name="shown-bar")
    module_client.capture("shown-bert", "shown-bar", pooling="mean", dtype="float32", progress=True)
    err = capsys.readouterr().err
    assert "capture shown-bert" in err and "100%" in err and "3/3 [" in err and " shards/s" in err  # 8-row shards
    assert not tqdm._instances

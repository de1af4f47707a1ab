"""Label sets and probes through gRPC, against scikit-learn on the same stored rows and folds."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.linear_model import LogisticRegression, Ridge, RidgeClassifier
from sklearn.metrics import f1_score

from actstore.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from tests.factories import sentences
from tests.probe_formulas import folds_by_the_documented_rule

N = 120


def animal(text: str) -> str:
    words = text.split()
    return "cat" if "cat" in words else "dog" if "dog" in words else "none"


@pytest.fixture(scope="module")
def client(module_client):
    return module_client


@pytest.fixture(scope="module")
def setup(client, tiny_models, tmp_path_factory):
    texts = sentences(N, seed=21)
    ids = [f"t{i}" for i in range(N)]
    client.register_model(tiny_models["bert"], name="bert")
    dataset = client.register_dataset(texts=texts, labels=[int("the" in t.split()) for t in texts], sample_ids=ids,
                                      name="probe-toy")
    pooled = client.capture("bert", "probe-toy", pooling="mean").run_key
    tokens = client.capture("bert", "probe-toy", pooling="tokens").run_key
    folder = tmp_path_factory.mktemp("labels")
    csv = folder / "animals.csv"
    pd.DataFrame({"id": ids[::-1], "animal": [animal(t) for t in texts][::-1]}).to_csv(csv, index=False)
    animals = client.register_labels("probe-toy", csv, label_column="animal")
    lengths = folder / "length.jsonl"
    rng = np.random.default_rng(0)
    values = [len(t) + float(rng.normal()) for t in texts]
    with open(lengths, "w") as f:
        for i in range(N):  # every tenth sample unlabelled: absent, or a null
            if i % 10 == 3:
                continue
            f.write(json.dumps({"sample": ids[i], "chars": None if i % 10 == 7 else values[i]}) + "\n")
    length = client.register_labels("probe-toy", lengths, id_column="sample", label_column="chars", name="length")
    return {"texts": texts, "ids": ids, "dataset": dataset, "pooled": pooled, "tokens": tokens, "folder": folder,
            "animals": animals, "length": length, "values": values}


def stored_layers(client, run):
    info = client.describe(run)
    return [client.read_activations(run, layer)[0].astype(np.float64) for layer in range(info.num_layers + 1)]


def codes_of(names):
    classes = sorted(set(names))
    return np.asarray([classes.index(n) for n in names]), classes


def test_label_sets_are_content_addressed_and_change_no_identity(client, setup):
    animals = setup["animals"]
    assert (animals.name, animals.kind, animals.classes, animals.labelled, animals.samples) == (
        "animals", "categorical", ["cat", "dog", "none"], N, N)
    # the same labels sent inline, in another order, under another name: the same digest
    order = np.random.default_rng(1).permutation(N)
    inline = client.register_labels("probe-toy", sample_ids=[setup["ids"][i] for i in order],
                                    labels=[animal(setup["texts"][i]) for i in order], name="animals-again")
    assert inline.digest == animals.digest and inline.source == {"inline": True}
    assert client.register_labels("probe-toy", sample_ids=setup["ids"], labels=[animal(t) for t in setup["texts"]],
                                  name="animals").digest == animals.digest  # the same set again: a no-op
    with pytest.raises(AlreadyExists, match="already has a label set named 'animals'"):
        client.register_labels("probe-toy", sample_ids=setup["ids"], labels=["x" if i % 2 else "y" for i in range(N)],
                               name="animals")
    length = setup["length"]
    assert (length.kind, length.labelled, length.classes) == ("continuous", N - 24, [])
    names = {s.name for s in client.label_sets("probe-toy")}
    assert {"animals", "animals-again", "length"} <= names
    # no dataset digest, no run key moved: capturing again is the same run
    assert client.datasets()[[d.digest for d in client.datasets()].index(setup["dataset"].digest)].n == N
    assert client.capture("bert", "probe-toy", pooling="mean").run_key == setup["pooled"]
    frame = client.sql("SELECT name, kind, labelled FROM label_sets WHERE name = 'length'").to_pandas()
    assert frame.to_dict("records") == [{"name": "length", "kind": "continuous", "labelled": N - 24}]


def test_ridge_classifier_probe_equals_scikit_learn_on_the_stored_rows(client, setup):
    codes, classes = codes_of([animal(t) for t in setup["texts"]])
    result = client.probe(setup["pooled"], labels="animals", alpha=3.0, folds=4)
    assert result.layers == [0, 1, 2, 3] and result.classes == classes and result.metric == "accuracy"
    fold = folds_by_the_documented_rule(setup["ids"], 4, codes)
    np.testing.assert_array_equal(result.arrays["fold_sizes"], np.bincount(fold))
    for i, rows in enumerate(stored_layers(client, setup["pooled"])):
        accuracy, f1 = [], []
        for f in range(4):
            model = RidgeClassifier(alpha=3.0).fit(rows[fold != f], codes[fold != f])
            predicted = model.predict(rows[fold == f])
            accuracy.append((predicted == codes[fold == f]).mean())
            f1.append(f1_score(codes[fold == f], predicted, average="macro", labels=[0, 1, 2], zero_division=0))
        np.testing.assert_array_equal(result.arrays["accuracy"][i], accuracy)  # exactly
        np.testing.assert_allclose(result.arrays["macro_f1"][i], f1, atol=1e-12)
        assert result.score[i] == pytest.approx(np.mean(accuracy), abs=1e-15)
    best = int(np.argmax(result.score))
    assert result.best_layer == best and result.scalars["best_score"] == result.score[best]
    majority = [np.mean(codes[fold == f] == np.argmax(np.bincount(codes[fold != f], minlength=3))) for f in range(4)]
    assert result.scalars["majority_accuracy"] == pytest.approx(np.mean(majority))
    assert result.scalars["chance"] == pytest.approx(1 / 3)
    assert any(note.startswith("folds: actstore-folds-v1") for note in result.notes)


def test_ridge_regression_probe_leaves_unlabelled_samples_out(client, setup):
    result = client.probe(setup["pooled"], labels="length", alpha=0.5, standardize=True)
    assert result.metric == "r2" and result.scalars["n"] == N - 24 and result.scalars["unlabelled"] == 24
    assert any("24 of 120 samples have no label" in note for note in result.notes)
    kept = np.asarray([i for i in range(N) if i % 10 not in (3, 7)])
    y = np.asarray(setup["values"])[kept]
    fold = folds_by_the_documented_rule([setup["ids"][i] for i in kept], 5)
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    for i, rows in enumerate(stored_layers(client, setup["pooled"])):
        rows = rows[kept]
        expected = [make_pipeline(StandardScaler(), Ridge(alpha=0.5)).fit(rows[fold != f], y[fold != f])
                    .score(rows[fold == f], y[fold == f]) for f in range(5)]
        np.testing.assert_allclose(result.arrays["r2"][i], expected, atol=1e-8)
    assert result.scalars["baseline_r2"] == 0.0


def test_inner_cross_validation_and_the_control_task(client, setup):
    """Without alpha, each fold's alpha is one of the grid; the control task is the same probe of
    the labels permuted by the seeded generator (class sizes kept): a label set holding exactly
    that permutation gives the control's scores."""
    result = client.probe(setup["pooled"], control=True, control_seed=5)
    grid = set(np.round(10.0 ** (np.arange(-6, 7) / 2), 12))
    assert set(np.round(result.arrays["alpha"].ravel(), 12)) <= grid
    labels = np.asarray([int("the" in t.split()) for t in setup["texts"]])
    permuted = labels[np.random.default_rng(5).permutation(N)]
    assert (np.bincount(permuted) == np.bincount(labels)).all()
    # a label set whose classes are the control's: the same probe, but folds stratified by its own classes;
    # so compare on its own folds, computed independently, with scikit-learn at the chosen alphas
    fold = folds_by_the_documented_rule(setup["ids"], 5, labels)
    for i, rows in enumerate(stored_layers(client, setup["pooled"])):
        accuracy = [(RidgeClassifier(alpha=float(result.arrays["control_alpha"][i, f]))
                     .fit(rows[fold != f], permuted[fold != f]).predict(rows[fold == f]) == permuted[fold == f]).mean()
                    for f in range(5)]
        np.testing.assert_array_equal(result.arrays["control_accuracy"][i], accuracy)
    np.testing.assert_allclose(result.selectivity, result.score - result.arrays["control_accuracy_mean"])


def test_logistic_probe_equals_scikit_learn(client, setup):
    codes, _ = codes_of([animal(t) for t in setup["texts"]])
    result = client.probe(setup["pooled"], labels="animals", method="logistic", C=0.5, tol=1e-6, folds=3)
    fold = folds_by_the_documented_rule(setup["ids"], 3, codes)
    for i, rows in enumerate(stored_layers(client, setup["pooled"])):
        for f in range(3):
            model = LogisticRegression(C=0.5, tol=1e-6, max_iter=1000).fit(rows[fold != f], codes[fold != f])
            assert abs(result.arrays["accuracy"][i, f] - model.score(rows[fold == f], codes[fold == f])) <= 1e-3
            from sklearn.metrics import log_loss

            expected = log_loss(codes[fold == f], model.predict_proba(rows[fold == f]), labels=[0, 1, 2])
            assert result.arrays["log_loss"][i, f] == pytest.approx(expected, abs=1e-3)
    assert "log_loss_mean" in result.arrays and result.arrays["iterations"].shape == (4, 3)


def test_a_token_level_run_is_pooled_as_named(client, setup, tiny_models):
    from transformers import AutoTokenizer

    with pytest.raises(InvalidArgument, match="token-level .* --pool mean, last or cls"):
        client.probe(setup["tokens"])
    with pytest.raises(InvalidArgument, match="pooled 'mean' already"):
        client.probe(setup["pooled"], pool="mean")
    tok = AutoTokenizer.from_pretrained(tiny_models["bert"])
    counts = [len(tok(t, truncation=True, max_length=128)["input_ids"]) for t in setup["texts"]]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    labels = np.asarray([int("the" in t.split()) for t in setup["texts"]])
    fold = folds_by_the_documented_rule(setup["ids"], 5, labels)
    for pool in ("mean", "last", "cls"):
        result = client.probe(setup["tokens"], pool=pool, alpha=1.0, layers=[1, 3])
        for i, layer in enumerate([1, 3]):
            tokens = client.read_activations(setup["tokens"], layer)[0].astype(np.float64)
            rows = np.stack([{"mean": tokens[a:b].mean(0), "last": tokens[b - 1], "cls": tokens[a]}[pool]
                             for a, b in zip(offsets[:-1], offsets[1:])])
            accuracy = [(RidgeClassifier(alpha=1.0).fit(rows[fold != f], labels[fold != f]).predict(rows[fold == f])
                         == labels[fold == f]).mean() for f in range(5)]
            np.testing.assert_array_equal(result.arrays["accuracy"][i], accuracy)


def test_against_sets_each_metric_beside_the_score(client, setup):
    result = client.probe(setup["pooled"], labels="animals", alpha=1.0, against=["dataset-entropy", "nc1",
                                                                                "residual-norm"])
    assert np.ptp(result.score) > 0
    assert result.against == ["dataset_entropy", "nc1", "residual_norm"]
    entropy = client.entropy("dataset_entropy", setup["pooled"]).values
    nc1 = client.neural_collapse(setup["pooled"]).values
    residual = client.residual_norm(setup["pooled"]).mean
    values = result.arrays["against_values"]
    np.testing.assert_allclose(values[0], entropy, rtol=1e-12)
    np.testing.assert_allclose(values[1], nc1, rtol=1e-12)
    np.testing.assert_allclose(values[2, :3], residual, rtol=1e-12)
    assert np.isnan(values[2, 3])  # the last layer has no next layer
    for name, row in zip(result.against, values):
        both = np.isfinite(row)
        rho = result.correlations[name]
        assert rho["spearman"] == pytest.approx(stats.spearmanr(row[both], result.score[both]).statistic, abs=1e-12)
        assert rho["pearson"] == pytest.approx(stats.pearsonr(row[both], result.score[both]).statistic, abs=1e-12)
        assert 0.0 <= rho["dcor"] <= 1.0
    preset = client.probe(setup["tokens"], pool="mean", against=["skean2025"])
    assert preset.against == ["dataset_entropy[skean2025]", "prompt_entropy[skean2025]", "curvature[skean2025]"]
    np.testing.assert_allclose(preset.arrays["against_values"][2],
                               client.entropy("curvature", setup["tokens"], preset="skean2025").values, rtol=1e-12)
    with pytest.raises(InvalidArgument, match="--against cka: cka has no value per layer of one run"):
        client.probe(setup["pooled"], against=["cka"])
    with pytest.raises(InvalidArgument, match="--against prompt_entropy: prompt_entropy needs a token-level run"):
        client.probe(setup["pooled"], against=["prompt-entropy"])


def test_a_probe_is_cached_under_its_label_set(client, setup):
    first = client.probe(setup["pooled"], labels="animals", alpha=2.0)
    again = client.probe(setup["pooled"], labels="animals-again", alpha=2.0)  # the same digest
    assert again.provenance.cached and again.provenance.result_key == first.provenance.result_key
    assert first.provenance.options["labels"] == setup["animals"].digest
    other = client.probe(setup["pooled"], alpha=2.0)
    assert other.provenance.result_key != first.provenance.result_key
    refreshed = client.probe(setup["pooled"], labels="animals", alpha=2.0, refresh=True)
    assert not refreshed.provenance.cached
    np.testing.assert_array_equal(refreshed.score, first.score)
    generic = client.metric("probe", setup["pooled"], labels="animals", alpha=2.0)
    assert generic.provenance.result_key == first.provenance.result_key


def test_bad_input_is_refused_with_what_to_do(client, setup):
    ids = setup["ids"]
    with pytest.raises(InvalidArgument, match=r"2 of 3 ids match no sample .*'nope-1'"):
        client.register_labels("probe-toy", sample_ids=[ids[0], "nope-1", "nope-2"], labels=["a", "b", "a"])
    with pytest.raises(InvalidArgument, match="one class 'same'"):
        client.register_labels("probe-toy", sample_ids=ids, labels=["same"] * N, name="one-class")
    with pytest.raises(InvalidArgument, match="labelled twice"):
        client.register_labels("probe-toy", sample_ids=[ids[0], ids[0]], labels=[1, 2], name="twice")
    with pytest.raises(InvalidArgument, match="has no column 'label'"):
        client.register_labels("probe-toy", setup["folder"] / "animals.csv", name="no-column")
    with pytest.raises(NotFound, match="no such file"):
        client.register_labels("probe-toy", setup["folder"] / "missing.csv")
    assert not {"one-class", "twice", "no-column"} & {s.name for s in client.label_sets()}  # nothing half-stored
    # labels of another dataset
    client.register_dataset(texts=setup["texts"][:20], sample_ids=[f"o{i}" for i in range(20)], name="other-toy")
    client.register_labels("other-toy", sample_ids=[f"o{i}" for i in range(20)], labels=[i % 2 for i in range(20)],
                           name="other-labels")
    with pytest.raises(NotFound, match="'other-labels' is a label set of dataset .* not of this one"):
        client.probe(setup["pooled"], labels="other-labels")
    few = client.register_labels("probe-toy", sample_ids=ids[:3], labels=[1.5, 2.5, 0.5], name="few")
    assert few.kind == "continuous"
    with pytest.raises(InvalidArgument, match="3 labelled samples .* for 5 folds"):
        client.probe(setup["pooled"], labels="few")
    client.register_labels("probe-toy", sample_ids=ids, labels=["rare" if i < 3 else "common" for i in range(N)],
                           name="rare")
    with pytest.raises(FailedPrecondition, match="class 'rare' has 3 labelled samples for 5 folds.*--folds 3"):
        client.probe(setup["pooled"], labels="rare")
    with pytest.raises(InvalidArgument, match="alpha -1.0 must be > 0"):
        client.probe(setup["pooled"], alpha=-1.0)
    with pytest.raises(InvalidArgument, match="needs --folds 3 or more .* or give --alpha"):
        client.probe(setup["pooled"], folds=2)
    assert client.probe(setup["pooled"], folds=2, alpha=1.0).arrays["accuracy"].shape == (4, 2)
    from actstore._proto.actstore.v1 import actstore_pb2 as pb

    with pytest.raises(InvalidArgument, match="alpha 0.0 must be > 0"):  # the server checks too
        client._connection.query.Measure(pb.MeasureRequest(measure="probe", run_a=setup["pooled"],
                                                           options_json='{"alpha": 0}'))
    with pytest.raises(InvalidArgument, match=r"C is not an option of the ridge probe"):
        client._connection.query.Measure(pb.MeasureRequest(measure="probe", run_a=setup["pooled"],
                                                           options_json='{"C": 2}'))
    with pytest.raises(InvalidArgument, match="alpha is not an option of the logistic probe"):
        client.probe(setup["pooled"], method="logistic", alpha=1.0)
    with pytest.raises(InvalidArgument, match="'length' is continuous: the logistic probe predicts classes"):
        client.probe(setup["pooled"], labels="length", method="logistic")
    with pytest.raises(NotFound, match="no label set 'nothing'"):
        client.probe(setup["pooled"], labels="nothing")


def test_a_logistic_probe_over_the_memory_limit_is_resource_exhausted(tmp_path, ray_cluster, tiny_models):
    from actstore.client import Client
    from actstore.server.app import start_server
    from tests.conftest import make_settings

    # 400 rows x 16 wide in memory (150 KiB) are over 60 kB; five folds' 16 x 16 moments (34 KiB) are not
    running = start_server(make_settings(tmp_path / "store", max_accumulator_bytes=60_000))
    try:
        with Client(f"127.0.0.1:{running.port}") as c:
            c.register_model(tiny_models["bert"], name="bert")
            c.register_dataset(texts=sentences(400, seed=2), labels=[i % 2 for i in range(400)], name="toy")
            run = c.capture("bert", "toy", pooling="mean").run_key
            with pytest.raises(ResourceExhausted, match="ACTSTORE_MAX_ACCUMULATOR_BYTES.*--method ridge"):
                c.probe(run, method="logistic")
            assert c.probe(run, alpha=1.0).layers == [0, 1, 2, 3]  # ridge streams: it fits
    finally:
        running.stop()


def test_folds_keep_augmented_views_together(client, setup):
    texts = setup["texts"][:40]
    augmented = client.register_dataset(texts=texts, labels=[int("the" in t.split()) for t in texts],
                                        name="probe-aug", augment_views=2)
    run = client.capture("bert", "probe-aug", pooling="mean").run_key
    result = client.probe(run, alpha=1.0, folds=4)
    rows = stored_layers(client, run)
    _, ids = client.read_activations(run, 0)
    groups = np.asarray([int(i.rsplit("#aug", 1)[0].removeprefix("row:")) for i in ids])
    labels = np.asarray([int("the" in texts[g].split()) for g in groups])
    fold = folds_by_the_documented_rule(ids, 4, labels, groups)
    assert all(len(set(fold[groups == g])) == 1 for g in set(groups))
    for i, layer in enumerate(rows):
        accuracy = [(RidgeClassifier(alpha=1.0).fit(layer[fold != f], labels[fold != f]).predict(layer[fold == f])
                     == labels[fold == f]).mean() for f in range(4)]
        np.testing.assert_array_equal(result.arrays["accuracy"][i], accuracy)
    assert augmented.has_groups


def test_the_cli_registers_labels_and_probes(client, setup, module_server, capsys, tmp_path):
    from actstore.cli import main

    address = ["--address", f"127.0.0.1:{module_server.port}"]
    parquet = tmp_path / "parity.parquet"
    pd.DataFrame({"id": setup["ids"], "label": [i % 2 for i in range(N)]}).to_parquet(parquet)
    assert main([*address, "register-labels", "probe-toy", str(parquet), "--name", "parity"]) == 0
    assert "label set 'parity'" in capsys.readouterr().out
    plot = tmp_path / "probe.png"
    assert main([*address, "probe", setup["pooled"][:12], "--labels", "parity", "--control", "--against",
                 "dataset-entropy", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "best layer" in out and "baselines: majority class" in out and "against dataset_entropy: Spearman" in out
    assert plot.stat().st_size > 10_000
    assert main([*address, "probe", setup["pooled"], "--labels", "parity", "--json"]) == 0
    [answer] = json.loads(capsys.readouterr().out)
    assert answer["metric"] == "accuracy" and len(answer["score"]) == 4 and answer["cached"] is False
    assert main([*address, "label-sets", "probe-toy"]) == 0
    assert "parity" in capsys.readouterr().out


def test_a_rebuilt_catalog_holds_the_label_sets(client, setup, module_server, tmp_path):
    """The store describes its label sets: a catalog rebuilt from the store alone has each under the
    name it was first registered with, and probes with it give the same answer."""
    from actstore.store.catalog import Catalog
    from actstore.store.handle import StoreHandle
    from actstore.store.upkeep.rebuild import rebuild_catalog_file

    settings = module_server.service.settings
    report = rebuild_catalog_file(StoreHandle.from_settings(settings), tmp_path / "rebuilt.duckdb")
    assert report.label_sets >= 2 and not [s for s in report.skipped if "labels/" in s]
    catalog = Catalog(tmp_path / "rebuilt.duckdb")
    try:
        rebuilt = {s.digest: s for s in catalog.label_sets.of(setup["dataset"].digest)}
    finally:
        catalog.close()
    for name in ("animals", "length"):
        original = setup[name]
        assert rebuilt[original.digest].name == name
        assert (rebuilt[original.digest].kind, rebuilt[original.digest].labelled) == (original.kind, original.labelled)


def test_excluded_dimensions_are_left_out_of_the_fit(client, setup):
    codes, _ = codes_of([animal(t) for t in setup["texts"]])
    result = client.probe(setup["pooled"], labels="animals", alpha=1.0, exclude_dims=[0, 5, 11], layers=[2])
    fold = folds_by_the_documented_rule(setup["ids"], 5, codes)
    rows = stored_layers(client, setup["pooled"])[2][:, [d for d in range(16) if d not in (0, 5, 11)]]
    accuracy = [(RidgeClassifier(alpha=1.0).fit(rows[fold != f], codes[fold != f]).predict(rows[fold == f])
                 == codes[fold == f]).mean() for f in range(5)]
    np.testing.assert_array_equal(result.arrays["accuracy"][0], accuracy)
    assert result.arrays["kept_dims"].tolist() == [13.0]
    with pytest.raises(InvalidArgument, match="exclude_dims value -1 must be >= 0"):
        client.probe(setup["pooled"], exclude_dims=[-1])

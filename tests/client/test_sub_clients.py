"""`Client` groups its calls in one sub-client a service area (`actstore.client.AREAS`), and every
call it had before the split is still its own: the same name, signature and documentation, and
the same call (tests/server/test_queries.py checks the answers are equal through both paths)."""

from __future__ import annotations

import inspect

import pytest

from actstore.client import AREAS, Client
from actstore.client.transport import Connection

# Client's public names before the sub-clients (issue 37): none may go, none may change meaning
BEFORE = {
    "backup_catalog", "batches", "cancel", "capture", "cka", "cka_matrix", "cka_stats", "close", "collect_garbage",
    "cos", "cos_stats", "create_token", "datasets", "delete_run", "describe", "embedded", "entropy",
    "import_activations", "job", "jobs", "label_sets", "lens", "locate_run", "measure", "measure_matrix", "metric",
    "minibatch_cka", "models", "mutual_knn", "neural_collapse", "outliers", "plan_capture", "plan_cka_matrix",
    "probe", "probe_runs", "progression", "read_activations", "register_dataset", "register_labels",
    "register_model", "residual_norm", "result", "revoke_token", "runs", "sql", "stitch", "submit_capture",
    "submit_cka_matrix", "submit_import", "submit_measure_matrix", "submit_verify", "to_xarray", "tokens",
    "torch_dataset", "train", "training_steps", "verify", "verify_report", "wait", "watch",
}


def test_every_public_call_of_before_is_still_there_and_callable():
    public = {name for name in dir(Client) if not name.startswith("_")}
    assert public == BEFORE
    assert all(callable(getattr(Client, name)) for name in public)


def _delegates():
    return [(area, name) for area, kind in AREAS.items() for name, method in vars(kind).items()
            if callable(method) and not name.startswith("_")]


def test_each_top_level_call_is_its_sub_clients_with_its_signature_and_docs():
    delegated = _delegates()
    assert len(delegated) == len({name for _, name in delegated}) == len(BEFORE - {"close", "embedded"})
    for area, name in delegated:
        top, sub = getattr(Client, name), getattr(AREAS[area], name)
        assert inspect.signature(top) == inspect.signature(sub), name
        assert inspect.getdoc(top).startswith(inspect.getdoc(sub) or ""), name
        assert f"Client.{area}.{name}" in inspect.getdoc(top), name


@pytest.mark.parametrize(("area", "name"), _delegates())
def test_a_top_level_call_calls_the_sub_client(monkeypatch, area, name):
    with Client("127.0.0.1:1") as client:
        sub = getattr(client, area)
        monkeypatch.setattr(sub, name, lambda *args, **kwargs: (args, kwargs))
        assert getattr(client, name)("x", k=1) == (("x",), {"k": 1})


def test_the_sub_clients_share_one_connection_and_hold_what_they_use():
    with Client("127.0.0.1:1") as client:
        connection = client._connection
        assert isinstance(connection, Connection) and connection.address == client.address
        assert all(getattr(client, area).connection is connection for area in AREAS)
        assert client.queries.captures is client.captures and client.admin.captures is client.captures
        assert client.probes.catalog is client.catalog
        training = client.training
        assert (training.catalog, training.captures, training.queries) == (client.catalog, client.captures,
                                                                           client.queries)

"""What the client refuses before it sends: an argument of the wrong type (each checked against its
annotation), an option value its table refuses (a 0 would travel as proto3's "not given" and come
back as the default), an int too large for its request field, and a call on a closed client.
The client points at a port nothing listens on, so anything that is sent fails UNAVAILABLE instead."""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from collections.abc import Sequence

import numpy as np
import pytest

from actstore.client import Client
from actstore.errors import FailedPrecondition, InvalidArgument, Unavailable
from tests.test_options import CLIENT


@pytest.fixture(scope="module")
def client():
    with Client("127.0.0.1:1") as c:
        yield c


def _valid(option):
    """A value the option allows."""
    if option.default is not None:
        return option.default
    if option.choices is not None:
        return option.choices[0]
    return option.type((option.minimum or 0) + 1)


def _bad(option):
    """A value just outside the option's bounds (None: it has none)."""
    if option.minimum is not None:
        return option.type(option.minimum if option.exclusive else option.minimum - 1)
    if option.maximum is not None:
        return option.type(option.maximum if option.exclusive else option.maximum + 1)
    return None


_VALID = {str: "run", int: 1, float: 0.5, bool: False}


def _well_typed(kind):
    """A value of the annotation `kind` (the first alternative of a union)."""
    if isinstance(kind, types.UnionType):
        kind = typing.get_args(kind)[0]
    if typing.get_origin(kind) is Sequence:
        return [_VALID[typing.get_args(kind)[0]]]
    return _VALID.get(kind, "path")


def _arguments(method, table=()) -> dict:
    """The method's required arguments, with allowed values."""
    hints = typing.get_type_hints(getattr(Client, method))
    parameters = list(inspect.signature(getattr(Client, method)).parameters.values())[1:]
    return {p.name: _valid(table[p.name]) if p.name in table else _well_typed(hints[p.name])
            for p in parameters if p.default is inspect.Parameter.empty}


@pytest.mark.parametrize("method", list(CLIENT))
def test_every_option_of_a_client_method_is_checked_before_sending(client, method):
    table, names = CLIENT[method]
    bounded = [name for name in names if _bad(table[name]) is not None]
    for name in bounded:
        bad = _bad(table[name])
        with pytest.raises(InvalidArgument, match=f"^{name}( value)? {bad!r} must be"):
            getattr(client, method)(**{**_arguments(method, table), name: [bad] if table[name].many else bad})


def test_a_zero_is_refused_not_sent_as_not_given(client):
    with pytest.raises(InvalidArgument, match="^k 0 must be >= 1$"):
        client.mutual_knn("run", k=0)
    with pytest.raises(InvalidArgument, match="^limit 0 must be >= 1$"):
        client.register_dataset(builtin="rotten-tomatoes", limit=0)
    with pytest.raises(InvalidArgument, match="^alpha 0.0 must be > 0: .* small alpha such as 1e-6$"):
        client.entropy("dataset_entropy", "run", alpha=0)


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.mutual_knn("run", k=2**63), "k 9223372036854775808 is out of range: request fields hold at most"
                                              " 64-bit integers"),
    (lambda c: c.minibatch_cka("run", batch_size=2**31), "batch_size 2147483648 is out of range: that request "
                                                         "field holds a 32-bit integer (-2147483648..2147483647)"),
    (lambda c: c.cka("run", layers_a=[1, 2**40]), "layers_a 1099511627776 is out of range: that request field "
                                                  "holds a 32-bit integer"),
    (lambda c: c.capture("m", "d", max_len=2**63), "max_len 9223372036854775808 is out of range"),
    (lambda c: c.register_dataset(builtin="rotten-tomatoes", limit=2**63), "limit 9223372036854775808 is out of"),
    (lambda c: c.read_activations("run", layer=-2**31 - 1), "layer -2147483649 is out of range"),
    (lambda c: c.read_activations("run", 3, stop=2**64), "stop 18446744073709551616 is out of range"),
    (lambda c: next(c.batches("run", batch_size=4, seed=2**64)), "seed 18446744073709551616 is out of range"),
    (lambda c: c.stitch("a", 2**31, "b", 1), "layer_a 2147483648 is out of range"),
])
def test_an_int_too_large_for_its_field_names_the_argument(client, call, message):
    with pytest.raises(InvalidArgument) as refused:
        call(client)
    assert str(refused.value).startswith(message), refused.value


# ---- types: every argument is checked against its annotation before anything is sent ---------------
PARAMETERS = [(name, p.name) for name, method in inspect.getmembers(Client, inspect.isfunction)
              if not name.startswith("_")
              for p in list(inspect.signature(method).parameters.values())[1:]
              if p.kind is not inspect.Parameter.VAR_KEYWORD]  # a measure's **options: its spec checks them


SHAPE = "shape_metric-alpha={alpha}-distance=angular"
MEASURE_CALLS = {"measure": lambda c, **o: c.measure(SHAPE, "run", **o),
                 "measure_matrix": lambda c, **o: c.measure_matrix(["run"], SHAPE, **o),
                 "submit_measure_matrix": lambda c, **o: c.submit_measure_matrix(["run"], SHAPE, **o)}


@pytest.mark.parametrize("method", list(MEASURE_CALLS))
def test_a_measures_own_option_is_checked_by_its_spec_before_any_call(client, method):
    with pytest.raises(InvalidArgument, match="^alpha must be a float, got 'x'"):
        MEASURE_CALLS[method](client, alpha="x")
    shape = SHAPE
    with pytest.raises(InvalidArgument, match="^alpha 2.0 must be in"):
        client.measure(shape, "run", alpha=2.0)
    with pytest.raises(InvalidArgument, match="cca-score does not take beta"):
        client.measure("cca-score", "run", beta=1)


@pytest.mark.parametrize(("method", "parameter"), PARAMETERS, ids=lambda x: x)
def test_every_argument_of_a_wrong_type_is_refused_naming_it(client, method, parameter):
    assert parameter in typing.get_type_hints(getattr(Client, method)), \
        f"Client.{method}'s {parameter} has no annotation: the client cannot check it"
    with pytest.raises(InvalidArgument, match=f"^{re.escape(parameter)} must be (a|an) "):
        getattr(client, method)(**{**_arguments(method), parameter: object()})


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.cka("run", layers_a=[1.5]), "layers_a[0] must be an int (a layer number), got 1.5"),
    (lambda c: c.cka("run", layers_a=[1.0]), "layers_a[0] must be an int (a layer number), got 1.0"),
    (lambda c: c.cka("run", layers_a=["1"]), "layers_a[0] must be an int (a layer number), got '1'"),
    (lambda c: c.cka("run", layers_a=[None]), "layers_a[0] must be an int (a layer number), got None"),
    (lambda c: c.cka("run", layers_a=[math.nan]), "layers_a[0] must be an int (a layer number), got nan"),
    (lambda c: c.cka("run", layers_a=[True]), "layers_a[0] must be an int (a layer number), got True"),
    (lambda c: c.cka("run", layers_b=np.array([1.0])), "layers_b[0] must be an int (a layer number), got"),
    (lambda c: c.cka("run", layers_a="1-3"), "layers_a must be a list of layer numbers (ints), got '1-3'"),
    (lambda c: c.cka("run", layers_a=3), "layers_a must be a list of layer numbers (ints), got 3: write [3] for one"),
    (lambda c: c.cka("run", layers_a={1: 2}), "layers_a must be a list of layer numbers (ints), got {1: 2}"),
    (lambda c: c.entropy("dataset_entropy", "run", layers=[1.0]), "layers[0] must be an int"),
    (lambda c: c.measure("cka", "run", layers_a=["1"]), "layers_a[0] must be an int"),
    (lambda c: c.residual_norm("run", layers=[1.5]), "layers[0] must be an int"),
    (lambda c: c.outliers("run", layers=[1.5]), "layers[0] must be an int"),
    (lambda c: c.batches("run", batch_size=8, layers=["1"]), "layers[0] must be an int"),
    (lambda c: c.torch_dataset("run", batch_size=8, layers=[1.5]), "layers[0] must be an int"),
    (lambda c: c.read_activations("run", layer="3"), "layer must be an int (a layer number), got '3'"),
    (lambda c: c.read_activations("run", layer=3.7), "layer must be an int (a layer number), got 3.7"),
    (lambda c: c.read_activations("run", layer=True), "layer must be an int (a layer number), got True"),
    (lambda c: c.read_activations("run", layer=None), "layer is required: give an int (a layer number)"),
    (lambda c: c.stitch("run", "1", "run", 2), "layer_a must be an int (a layer number), got '1'"),
    (lambda c: c.cka(123), "run_a must be a string (a run key), got 123"),
    (lambda c: c.cka(["run"]), "run_a must be a string (a run key), got ['run']"),
    (lambda c: c.mutual_knn("run", 5), "run_b must be a string (a run key), got 5"),
    (lambda c: c.runs(model=5), "model must be a string, got 5"),
    (lambda c: c.cka_matrix(None), "runs is required: give a list of run keys (strings)"),
    (lambda c: c.entropy(None, "run"), "metric is required: give a string"),
    (lambda c: c.minibatch_cka("run", batch_size=None), "batch_size is required: give an int"),
    (lambda c: c.register_dataset(texts=["a", None]), "texts[1] must be a string, got None"),
    (lambda c: c.register_dataset(texts=["a", "b"], labels=[1.5, 2.0]), "labels[0] must be an int, got 1.5"),
    (lambda c: c.register_dataset(texts=["a", "b"], labels=[math.nan, 1]), "labels[0] must be an int, got nan"),
    (lambda c: c.lens("run", taus=[0.5, "0.9"]), "taus[1] must be a number, got '0.9'"),
    (lambda c: c.cka("run", refresh=1), "refresh must be a bool, got 1"),
])
def test_a_wrong_type_is_invalid_argument_naming_the_argument_and_the_type(client, call, message):
    with pytest.raises(InvalidArgument) as refused:
        call(client)
    assert str(refused.value).startswith(message), refused.value


@pytest.mark.parametrize("call", [
    lambda c: c.register_dataset(texts="hello world", name="x"),
    lambda c: c.cka_matrix("0123456789abcdef"),
    lambda c: c.verify("0123456789abcdef"),
    lambda c: c.plan_cka_matrix("0123456789abcdef"),
    lambda c: c.submit_measure_matrix("0123456789abcdef", "cka"),
])
def test_a_string_where_a_list_of_strings_is_expected_is_refused_not_split(client, call):
    with pytest.raises(InvalidArgument, match=r"must be a list of (run keys \()?strings\)?, got '[^']+': write "
                                              r"\['[^']+'\] for one$"):
        call(client)


@pytest.mark.parametrize("call", [
    lambda c: c.cka("run", layers_a=np.array([1, 2]), layers_b=(np.int64(3), 4)),
    lambda c: c.read_activations("run", np.int32(2), start=np.int64(0), stop=np.uint8(3)),
    lambda c: next(c.batches("run", batch_size=np.int64(8), layers=np.array([1, 2], dtype=np.uint16))),
    lambda c: c.lens("run", taus=np.array([0.5, 0.9])),
    lambda c: c.cka_matrix(np.array(["run-a", "run-b"])),
])
def test_numpy_integers_and_arrays_are_accepted_and_sent(client, call):
    with pytest.raises(Unavailable):  # sent: nothing listens on the client's port
        call(client)


@pytest.mark.parametrize(("start", "stop"), [(0, 0), (5, 5), (5, 2)])
def test_an_empty_row_range_is_refused_not_read_to_the_end(client, start, stop):
    with pytest.raises(InvalidArgument, match=f"^rows {start}..{stop} are an empty range: give stop > start, or "
                                              "leave stop out to read to the end$"):
        client.read_activations("run", 1, start=start, stop=stop)


def test_a_closed_client_says_so():
    with Client("127.0.0.1:1") as closed:
        pass
    for call in (closed.runs, lambda: next(closed.batches("run", batch_size=8)), lambda: closed.outliers("run")):
        with pytest.raises(FailedPrecondition, match=r"^this Client is closed .*: make a new one$"):
            call()


@pytest.mark.parametrize("token", ["ß€", "abc\ndef", "tab\there"])
def test_a_token_that_is_not_printable_ascii_is_refused_before_sending(token):
    with pytest.raises(InvalidArgument, match=r"^the token is not printable ASCII.*check --token / ACTSTORE_TOKEN") \
            as refused:
        Client("127.0.0.1:1", token=token)
    assert token not in str(refused.value)  # a token is a secret: the message does not show it


class _Sent:
    """Stands in for the Capture and Planning stubs: keeps each request, answers a finished job."""

    def __init__(self) -> None:
        self.requests: list = []

    def SubmitCapture(self, request):
        from actstore._proto.actstore.v1 import actstore_pb2 as pb

        self.requests.append(request)
        return pb.Job(job_id="j", kind="capture", status="done", target="k" * 64, run_keys=["k" * 64])

    def PlanCapture(self, request):
        from actstore._proto.actstore.v1 import planning_pb2

        self.requests.append(request)
        return planning_pb2.CapturePlan()


@pytest.mark.parametrize("site", ["attn_out,mlp_out", ["attn_out", "mlp_out"], ["attn_out,mlp_out"],
                                  ("attn_out", " mlp_out", "attn_out")])
@pytest.mark.parametrize("method", ["capture", "submit_capture", "plan_capture"])
def test_a_capture_checks_its_arguments_once_and_sends_the_sites_parsed(monkeypatch, method, site):
    """`capture` submits through the same path as `submit_capture`, past its checks: each argument
    is checked against its annotation once and by the CAPTURE table once, and `site` in any of its
    spellings is sent as the list of sites (split at commas by the table's `site` option alone)."""
    from actstore.client import arguments
    from actstore.options import Option

    annotations, tables = [], []
    conform, check = arguments._conform, Option.check
    monkeypatch.setattr(arguments, "_conform", lambda name, *rest: annotations.append(name) or conform(name, *rest))
    monkeypatch.setattr(Option, "check", lambda self, *rest: tables.append(self.name) or check(self, *rest))
    sent = _Sent()
    with Client("127.0.0.1:1") as c:
        c._connection.capture = c._connection.planning = sent
        getattr(c, method)("gpt2", "toy", pooling="last", max_len=64, site=site)
    assert sorted(tables) == ["max_len", "pooling", "site"]  # dtype: its default, passed on unchecked
    assert sorted(n for n in annotations if n in ("pooling", "site", "max_len")) == ["max_len", "pooling", "site"]
    (request,) = sent.requests
    assert (request.model, request.pooling, request.max_len, list(request.sites)) == \
        ("gpt2", "last", 64, ["attn_out", "mlp_out"])

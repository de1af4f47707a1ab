"""What the client refuses before it sends: an option value its table refuses (a 0 would travel as
proto3's "not given" and come back as the default) and an int too large for its request field.
The client points at a port nothing listens on, so anything that is sent fails UNAVAILABLE instead."""

from __future__ import annotations

import inspect

import pytest

from actstore.client import Client
from actstore.errors import InvalidArgument
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


def _arguments(method, table) -> dict:
    """The method's required arguments, with allowed values."""
    parameters = list(inspect.signature(getattr(Client, method)).parameters.values())[1:]
    required = {p.name: p for p in parameters if p.default is inspect.Parameter.empty}
    return {name: _valid(table[name]) if name in table else ["run"] if "Sequence" in p.annotation else "run"
            for name, p in required.items()}


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

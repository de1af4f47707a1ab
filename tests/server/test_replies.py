"""Kept replies (server/replies.py): a repeated cached request is answered from its kept reply only
while that reply is still the answer. Each case changes the answer behind a request the server has
answered from its cache at least twice (so a reply is kept), then asks again."""

from __future__ import annotations

import numpy as np
import pytest

from actstore.errors import NotFound
from tests.factories import sentences


@pytest.fixture
def run(client, tiny_models):
    client.register_model(tiny_models["bert"], name="bert")
    client.register_dataset(texts=sentences(40, seed=5), name="toy")
    return client.capture("bert", "toy", pooling="mean").run_key


def ask_until_kept(client, run, **options):
    """The first answer (computed), then two from the cache: the second of them is a kept reply."""
    first = client.cka(run, **options)
    cached = [client.cka(run, **options) for _ in range(2)]
    assert not first.provenance.cached and all(c.provenance.cached for c in cached)
    np.testing.assert_array_equal(cached[1].biased, first.biased)
    return first


def test_a_refresh_replaces_the_kept_reply(client, run):
    ask_until_kept(client, run, layers_a=[1], layers_b=[2])
    refreshed = client.cka(run, layers_a=[1], layers_b=[2], refresh=True)
    again = client.cka(run, layers_a=[1], layers_b=[2])
    assert again.provenance.cached
    # the repeat reports the refresh's computation, not the first one's
    assert again.provenance.seconds == refreshed.provenance.seconds


def test_a_deleted_run_is_not_answered_from_a_kept_reply(client, run):
    ask_until_kept(client, run)
    client.delete_run(run)
    with pytest.raises(NotFound):
        client.cka(run)


def test_requests_differing_in_one_option_get_their_own_replies(client, run):
    whole = ask_until_kept(client, run)
    part = client.cka(run, layers_a=[0, 3])
    assert part.biased.shape == (2, whole.biased.shape[1])
    np.testing.assert_array_equal(part.biased, whole.biased[[0, 3]])
    entropy = [client.entropy("effective_rank", run, layers=[2]) for _ in range(3)]
    assert entropy[2].provenance.cached and entropy[2].provenance.metric != whole.provenance.metric

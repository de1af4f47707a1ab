"""Site resolution on the tiny models, bare and with a head: canonical names, patterns written with
or without the backbone prefix, and the errors (close matches, one module per block)."""

from __future__ import annotations

import pytest

from actstore.errors import InvalidArgument
from actstore.modeling.introspection import find_blocks
from actstore.modeling.sites import generic_name, resolve_site
from actstore.options import CAPTURE, from_wire
from tests.factories import build_tiny_model


def _resolve(name: str, site: str):
    model, _ = build_tiny_model(name)
    return resolve_site(model, find_blocks(model.base_model, model.config)[1], site)


@pytest.mark.parametrize(("name", "site", "pattern"), [
    ("bert", "attn_out", "encoder.layer.*.attention.output.dense"),
    ("bert-cls", "attn_out", "bert.encoder.layer.*.attention.output.dense"),
    ("bert-cls", "mlp_out", "bert.encoder.layer.*.output.dense"),
    ("gpt2-cls", "attn_out", "transformer.h.*.attn"),
    ("llama", "resid_post", "model.layers.*"),
    ("vit-cls", "mlp_out", "vit.layers.*.mlp"),
    ("vit", "vit.layers.*.mlp.fc2", "layers.*.mlp.fc2"),  # the prefix of the model with a head
    ("vit-cls", "layers.*.mlp.fc2", "vit.layers.*.mlp.fc2"),  # the bare backbone's spelling
])
def test_sites_resolve_to_one_module_per_block(name, site, pattern):
    resolved = _resolve(name, site)
    assert resolved.pattern == pattern
    assert list(resolved.modules) == [pattern.replace("*", str(i)) for i in range(3)]
    assert [generic_name(m) for m in resolved.modules] == [pattern] * 3


@pytest.mark.parametrize(("site", "message"), [
    ("model.layers.*.mlp.dwn_proj", r"close matches: model\.layers\.\*\.mlp\.down_proj"),
    ("zzzz.*", r"matches no module of LlamaForCausalLM; list them"),
    ("mlp", r"is not one of resid_post, attn_out, mlp_out and has no `\*`"),
])
def test_bad_sites(site, message):
    with pytest.raises(InvalidArgument, match=message):
        _resolve("llama", site)


def test_the_capture_tables_site_option_parses_the_sites():
    """The one place sites are split at commas, for the client and the server alike."""
    site = CAPTURE.site
    assert from_wire(CAPTURE, "site", []) == ["resid_post"]
    assert site.check(["mlp_out, attn_out", "mlp_out", ""]) == ["mlp_out", "attn_out"]
    assert site.check("a.*,b.*") == site.check(["a.*", "b.*"]) == site.check(["a.*,b.*"]) == ["a.*", "b.*"]
    assert site.check(site.check(" a.*, b.*,")) == ["a.*", "b.*"]
    with pytest.raises(InvalidArgument, match="^site must be a string, got 5$"):
        site.check(["a.*", 5])
    with pytest.raises(InvalidArgument, match="^site must be a list of str values, got 5$"):
        site.check(5)

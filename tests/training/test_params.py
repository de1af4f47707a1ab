"""Table 1 of the paper: multi-classifier vs single-classifier multi-exit parameter counts."""

from __future__ import annotations

import pytest
from transformers import GPT2Config, ViTConfig

from actstore.training.params import multi_exit_params, truncate_percent

DEIT_S = {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
              "image_size": 224, "patch_size": 16, "num_labels": 1000}
DEIT_B = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
              "intermediate_size": 3072, "image_size": 224, "patch_size": 16, "num_labels": 1000}


def millions(n):
    return round(n / 1e6, 2)


def test_deit_s_row():
    # paper: DeiT-S  384  1,000  12  26.27M  22.05M  16.07%
    c = multi_exit_params(ViTConfig(**DEIT_S))
    assert (c.hidden_size, c.num_classes, c.num_layers) == (384, 1000, 12)
    assert c.single == 22_050_664  # = timm's deit_small_patch16_224, head included
    assert millions(c.single) == 22.05
    assert millions(c.multiple) == 26.27  # 11 extra exits of 384 x 1000 weights, no bias
    assert truncate_percent(c.saving) == 16.07  # 16.076%, printed truncated
    # with a bias per exit the paper's 26.27M would not come out
    assert millions(multi_exit_params(ViTConfig(**DEIT_S), extra_bias=True).multiple) == 26.29


def test_deit_b_row():
    # paper: DeiT-B  768  1,000  12  95.02M  86.57M  8.89%
    c = multi_exit_params(ViTConfig(**DEIT_B))
    assert millions(c.single) == 86.57
    assert millions(c.multiple) == 95.02
    assert truncate_percent(c.saving) == 8.89


def test_gpt2_row():
    # paper: GPT-2  768  50,257  12  541.57M  117.35M  78.39%
    hf = multi_exit_params(GPT2Config())  # GPT2Config() is GPT-2 small
    assert (hf.hidden_size, hf.num_classes, hf.num_layers) == (768, 50257, 12)
    assert hf.extra_per_exit == 768 * 50257
    # Hugging Face's GPT-2 small has 124.44M parameters (tied embeddings), not the paper's 117.35M
    assert hf.single == 124_439_808
    # the paper's multi-classifier column is the nominal 117M plus 11 extra 768 x 50,257 heads
    paper = multi_exit_params(GPT2Config(), single_params=117_000_000)
    assert millions(paper.multiple) == 541.57
    assert truncate_percent(paper.saving) == 78.39
    assert paper.multiple - paper.single == hf.multiple - hf.single == 11 * 768 * 50257


def test_gpt3_row_follows_the_same_rule():
    # paper: GPT-3  12,288  50,257  96  233.67B  175.63B  25.10%
    cfg = GPT2Config(n_embd=12288, n_layer=96, n_head=96)
    c = multi_exit_params(cfg, single_params=175_000_000_000)
    assert round(c.multiple / 1e9, 2) == 233.67
    assert truncate_percent(c.saving) == 25.10


def test_any_config_and_tied_weights_counted_once():
    from transformers import BertConfig

    cfg = BertConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=64, vocab_size=100, num_labels=3)
    c = multi_exit_params(cfg, task="sequence-classification")
    assert c.num_classes == 3 and c.num_layers == 4
    assert c.multiple - c.single == 3 * 32 * 3
    small = multi_exit_params(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=50))
    # tied lm_head: wte counted once
    expected_single = 50 * 16 + 1024 * 16 + 2 * (2 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 2 * 16
                                                  + 16 * 64 + 64 + 64 * 16 + 16) + 2 * 16
    assert small.single == expected_single
    assert small.as_dict()["saving"] == pytest.approx(small.saved / small.multiple)

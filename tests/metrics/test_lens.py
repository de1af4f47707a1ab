"""Logit lens, saturation, effective depth, multi-exit, NC1 and residual norm ratio."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from actstore.metrics.lens import (
    DEFINITION_VERSION,
    LensAccumulator,
    NC1Accumulator,
    argmax_and_confidence,
    effective_depth,
    layer_accuracy,
    multi_exit_sweep,
    nc1,
    residual_norm_ratio,
    saturation_distribution,
    saturation_layers,
)
from actstore.metrics.lens_head import LensHead


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def random_row_chunks(rng, n):
    cuts = np.sort(rng.choice(np.arange(1, n), size=rng.integers(1, 8), replace=False))
    chunks = np.split(np.arange(n), cuts)
    return [chunks[i] for i in rng.permutation(len(chunks))]


def test_definition_version():
    assert DEFINITION_VERSION == 1


# ---------------------------------------------------------------- lens head


def make_head_arrays(rng, d=16, c=23):
    return {
        "norm_weight": rng.standard_normal(d),
        "norm_bias": rng.standard_normal(d),
        "weight": rng.standard_normal((c, d)),
        "bias": rng.standard_normal(c),
    }


def test_layernorm_head_matches_torch(rng):
    p = make_head_arrays(rng)
    head = LensHead("layernorm", p["norm_weight"], p["norm_bias"], 1e-5, p["weight"], p["bias"])
    h = rng.standard_normal((9, 16)) * 4 + 2
    t = {k: torch.from_numpy(v) for k, v in p.items()}
    normed = F.layer_norm(torch.from_numpy(h), (16,), t["norm_weight"], t["norm_bias"], 1e-5)
    expected = F.linear(normed, t["weight"], t["bias"]).numpy()
    np.testing.assert_allclose(head.logits(h), expected, rtol=1e-12, atol=1e-12)
    h16 = h.astype(np.float16)
    np.testing.assert_array_equal(head.logits(h16), head.logits(h16.astype(np.float64)))
    assert head.logits(h16).dtype == np.float64


def test_rmsnorm_head_matches_torch_and_llama_formula(rng):
    p = make_head_arrays(rng)
    head = LensHead("rmsnorm", p["norm_weight"], None, 1e-6, p["weight"], None)
    h = rng.standard_normal((9, 16)) * 4 + 2
    t = {k: torch.from_numpy(v) for k, v in p.items()}
    normed = F.rms_norm(torch.from_numpy(h), (16,), t["norm_weight"], 1e-6)
    np.testing.assert_allclose(
        head.logits(h), F.linear(normed, t["weight"]).numpy(), rtol=1e-12, atol=1e-12
    )
    llama = h / np.sqrt(np.mean(h**2, axis=1, keepdims=True) + 1e-6) * p["norm_weight"]
    np.testing.assert_allclose(head.logits(h), llama @ p["weight"].T, rtol=1e-12, atol=1e-12)


def test_rmsnorm_bias_is_added_after_the_scale(rng):
    """No HF RMSNorm has a bias (nor torch.nn.RMSNorm); one that has adds it like a LayerNorm."""
    p = make_head_arrays(rng)
    head = LensHead("rmsnorm", p["norm_weight"], p["norm_bias"], 1e-6, p["weight"], p["bias"])
    h = rng.standard_normal((9, 16)) * 4 + 2
    t = {k: torch.from_numpy(v) for k, v in p.items()}
    normed = F.rms_norm(torch.from_numpy(h), (16,), t["norm_weight"], 1e-6) + t["norm_bias"]
    expected = F.linear(normed, t["weight"], t["bias"]).numpy()
    np.testing.assert_allclose(head.logits(h), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["tanh", "relu", "gelu"])
def test_pooler_head_matches_torch(rng, activation):
    p = make_head_arrays(rng)
    pooler_w, pooler_b = rng.standard_normal((16, 12)), rng.standard_normal(16)
    head = LensHead("layernorm", p["norm_weight"][:12], p["norm_bias"][:12], 1e-5, p["weight"], p["bias"],
                    pooler_weight=pooler_w, pooler_bias=pooler_b, pooler_activation=activation,
                    position="cls", task="classifier")
    assert (head.width, head.num_classes) == (12, 23)
    h = rng.standard_normal((5, 12))
    x = F.layer_norm(torch.from_numpy(h), (12,), torch.from_numpy(p["norm_weight"][:12]),
                     torch.from_numpy(p["norm_bias"][:12]), 1e-5)
    x = {"tanh": torch.tanh, "relu": torch.relu, "gelu": F.gelu}[activation](
        F.linear(x, torch.from_numpy(pooler_w), torch.from_numpy(pooler_b)))
    expected = F.linear(x, torch.from_numpy(p["weight"]), torch.from_numpy(p["bias"])).numpy()
    np.testing.assert_allclose(head.logits(h), expected, rtol=1e-12, atol=1e-12)
    exit_head = head.with_classifier(p["weight"][:3], None)
    assert exit_head.num_classes == 3 and exit_head.pooler_activation == activation


def test_float32_arrays_stay_float32(rng):
    p = make_head_arrays(rng)
    head = LensHead("rmsnorm", p["norm_weight"].astype(np.float32), None, 1e-6,
                    p["weight"].astype(np.float32))
    assert head.weight.dtype == np.float32 and head.norm_weight.dtype == np.float32
    assert head.logits(rng.standard_normal((2, 16))).dtype == np.float64


def test_head_without_norm_is_affine(rng):
    p = make_head_arrays(rng)
    h = rng.standard_normal((4, 16))
    head = LensHead("none", None, None, 0.0, p["weight"], p["bias"])
    np.testing.assert_allclose(head.logits(h), h @ p["weight"].T + p["bias"], rtol=1e-13)


def test_head_validation(rng):
    p = make_head_arrays(rng)
    with pytest.raises(ValueError, match="norm must be"):
        LensHead("batchnorm", p["norm_weight"], None, 1e-5, p["weight"])
    with pytest.raises(ValueError, match="norm_weight"):
        LensHead("layernorm", None, None, 1e-5, p["weight"])
    with pytest.raises(ValueError, match="norm_bias"):
        LensHead("none", None, p["norm_bias"], 1e-5, p["weight"])
    with pytest.raises(ValueError, match="pooler"):
        LensHead("none", None, None, 0.0, p["weight"], pooler_weight=np.eye(16))
    with pytest.raises(ValueError, match="position"):
        LensHead("none", None, None, 0.0, p["weight"], position="middle")
    with pytest.raises(ValueError, match="bias must have shape"):
        LensHead("rmsnorm", p["norm_weight"], None, 1e-5, p["weight"], p["bias"][:-1])
    head = LensHead("rmsnorm", p["norm_weight"], None, 1e-5, p["weight"])
    with pytest.raises(ValueError, match="features"):
        head.logits(np.zeros((2, 15)))


def _last_block_output(model, block, ids):
    """Logits and the pre-final-norm output of the last block (HF's hidden_states[L] is normed)."""
    captured = {}
    handle = block.register_forward_hook(
        lambda module, args, out: captured.update(h=out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        logits = model(ids).logits
    handle.remove()
    width = captured["h"].shape[-1]
    return captured["h"].reshape(-1, width).numpy(), logits.reshape(-1, logits.shape[-1]).numpy()


def test_lens_layer_L_reproduces_tiny_hf_models():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 7))
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=4,
            vocab_size=50,
            n_positions=16,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    gpt2 = gpt2.double().eval()
    h, logits = _last_block_output(gpt2, gpt2.transformer.h[-1], ids)
    ln = gpt2.transformer.ln_f
    head = LensHead(
        "layernorm",
        ln.weight.detach().numpy(),
        ln.bias.detach().numpy(),
        ln.eps,
        gpt2.lm_head.weight.detach().numpy(),
    )
    np.testing.assert_allclose(head.logits(h), logits, rtol=1e-12, atol=1e-12)
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=50,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    llama = llama.double().eval()
    h, logits = _last_block_output(llama, llama.model.layers[-1], ids)
    norm = llama.model.norm
    head = LensHead(
        "rmsnorm",
        norm.weight.detach().numpy(),
        None,
        norm.variance_epsilon,
        llama.lm_head.weight.detach().numpy(),
    )
    # HF's LlamaRMSNorm normalises in float32 even in a float64 model
    np.testing.assert_allclose(head.logits(h), logits, rtol=1e-6, atol=1e-6)


def test_argmax_and_confidence_matches_torch_softmax(rng):
    logits = rng.standard_normal((3, 7, 11)) * 5
    logits[0, 0] = 1000.0 * np.arange(11)  # would overflow a naive exp
    preds, confidence = argmax_and_confidence(logits)
    probs = torch.softmax(torch.from_numpy(logits), dim=-1)
    np.testing.assert_array_equal(preds, probs.argmax(dim=-1).numpy())
    np.testing.assert_allclose(confidence, probs.max(dim=-1).values.numpy(), rtol=1e-13)


# ---------------------------------------------------------------- accuracy, saturation, depth

# 5 layers (L = 4), 6 samples; columns are samples.
PREDS = np.array(
    [
        [7, 1, 2, 3, 9, 0],  # layer 0
        [7, 2, 2, 3, 9, 1],
        [7, 2, 5, 0, 9, 1],
        [7, 2, 2, 3, 8, 1],
        [7, 2, 2, 3, 9, 1],  # layer L = 4
    ]
)
LABELS = np.array([7, 2, 3, 3, 9, 0])
# sample 0 never changes: 0; sample 1 final from layer 1: 1; sample 2 differs at 2: 3;
# sample 3 differs at 2: 3; sample 4 differs at 3: 4; sample 5 final from layer 1: 1.
SATURATION = np.array([0, 1, 3, 3, 4, 1])


def test_layer_accuracy_hand_table():
    expected = np.array([4, 4, 3, 3, 4]) / 6  # per layer: correct among LABELS
    np.testing.assert_allclose(layer_accuracy(PREDS, LABELS), expected)


def test_saturation_hand_table():
    np.testing.assert_array_equal(saturation_layers(PREDS), SATURATION)
    counts, cumulative = saturation_distribution(saturation_layers(PREDS), 4)
    np.testing.assert_array_equal(counts, [1, 2, 0, 2, 1])
    np.testing.assert_array_equal(cumulative, [1, 3, 3, 5, 6])
    with pytest.raises(ValueError):
        saturation_distribution(np.array([0, 5]), 4)


def test_effective_depth_both_variants():
    acc = np.array([1.0, 0.5, 0.8, 0.92, 0.95, 0.93])  # layer 0 never counts, even at 1.0
    assert effective_depth(acc, 0.1) == 3
    assert effective_depth(acc, 0.06, "absolute") == 4
    assert effective_depth(acc, 0.01) == 5  # none reaches 0.99: L
    assert effective_depth(acc, 0.05, "relative") == 3  # >= 0.88
    assert effective_depth(acc, 0.0, "relative") == 4  # >= 0.93
    assert effective_depth(np.array([0.2, 0.3, 0.1]), 0.0, "relative") == 1
    # exact ties in exact arithmetic count despite rounding of 1 - eps and acc_L - eps
    assert effective_depth(np.array([0.0, 0.7, 0.9]), 0.3) == 1
    assert effective_depth(np.array([0.0, 0.85, 0.95]), 0.1, "relative") == 1
    with pytest.raises(ValueError, match="variant"):
        effective_depth(acc, 0.1, "percent")


# ---------------------------------------------------------------- multi-exit


# L = 3, 4 samples; row 0 (the embedding) is never an exit.
CONF = np.array(
    [
        [0.99, 0.10, 0.20, 0.30],
        [0.60, 0.20, 0.95, 0.40],
        [0.95, 0.30, 0.50, 0.70],
        [0.99, 0.40, 0.60, 0.80],
    ]
)
EXIT_PREDS = np.array(
    [
        [1, 1, 1, 1],
        [5, 1, 2, 0],
        [1, 1, 0, 3],
        [1, 1, 0, 3],
    ]
)
EXIT_LABELS = np.array([1, 1, 2, 3])


def test_multi_exit_hand_case():
    rows = multi_exit_sweep(CONF, EXIT_PREDS, EXIT_LABELS, [0.5, 0.9, 1.1])
    # tau 0.5: exit layers [1, 3, 1, 2] -> m = [2, 1, 1]; preds [5, 1, 2, 3]: 3 of 4 correct
    # tau 0.9: exit layers [2, 3, 1, 3] -> m = [1, 1, 2]; preds [1, 1, 2, 3]: 4 of 4 correct
    # tau 1.1: all exit at L = 3 -> m = [0, 0, 4]; preds [1, 1, 0, 3]: 3 of 4 correct
    expected = [
        ([2, 1, 1], 3 / 4, 3 * 4 / (1 + 3 + 1 + 2)),
        ([1, 1, 2], 4 / 4, 3 * 4 / (2 + 3 + 1 + 3)),
        ([0, 0, 4], 3 / 4, 1.0),
    ]
    for row, tau, (exits, accuracy, speedup) in zip(rows, [0.5, 0.9, 1.1], expected):
        assert row.tau == tau
        np.testing.assert_array_equal(row.exits, exits)
        assert row.accuracy == pytest.approx(accuracy)
        assert row.speedup == pytest.approx(speedup)


def ref_exit(conf, preds, labels, tau):
    num_layers = preds.shape[0] - 1
    layers = []
    for i in range(preds.shape[1]):
        layers.append(next((k for k in range(1, num_layers + 1) if conf[k, i] >= tau), num_layers))
    layers = np.array(layers)
    exits = np.array([(layers == k).sum() for k in range(1, num_layers + 1)])
    accuracy = np.mean([preds[k, i] == labels[i] for i, k in enumerate(layers)])
    return exits, accuracy, num_layers * len(layers) / layers.sum()


def random_lens_outputs(rng, num_layers=6, n=200, classes=5):
    logits = (
        rng.standard_normal((num_layers + 1, n, classes))
        * np.linspace(0.5, 4, num_layers + 1)[:, None, None]
    )
    preds, conf = argmax_and_confidence(logits)
    labels = np.where(rng.random(n) < 0.8, preds[-1], rng.integers(0, classes, n))
    return preds, conf, labels


def test_lens_accumulator_streaming_equals_one_pass(rng):
    preds, conf, labels = random_lens_outputs(rng)
    taus = np.array([0.3, 0.5, 0.7, 0.9, 1.01])
    rows = multi_exit_sweep(conf, preds, labels, taus)
    for row, tau in zip(rows, taus):
        exits, accuracy, speedup = ref_exit(conf, preds, labels, tau)
        np.testing.assert_array_equal(row.exits, exits)
        assert row.accuracy == pytest.approx(accuracy, rel=1e-14)
        assert row.speedup == pytest.approx(speedup, rel=1e-14)
    counts, cumulative = saturation_distribution(saturation_layers(preds), 6)
    for _ in range(4):
        sequential = LensAccumulator(6, taus)
        merged = LensAccumulator(6, taus)
        for idx in random_row_chunks(rng, labels.size):
            sequential.update(preds[:, idx], conf[:, idx], labels[idx])
            merged.merge(LensAccumulator(6, taus).update(preds[:, idx], conf[:, idx], labels[idx]))
        for summary in (sequential.finalize(), merged.finalize()):
            np.testing.assert_array_equal(summary.accuracy, layer_accuracy(preds, labels))
            np.testing.assert_array_equal(summary.saturation_counts, counts)
            np.testing.assert_array_equal(summary.saturation_cumulative, cumulative)
            for got, want in zip(summary.exits, rows):
                np.testing.assert_array_equal(got.exits, want.exits)
                assert (got.tau, got.accuracy, got.speedup) == (
                    want.tau,
                    want.accuracy,
                    want.speedup,
                )
    with pytest.raises(ValueError, match="same layers and taus"):
        LensAccumulator(6, taus).merge(LensAccumulator(6, taus[:-1]))
    with pytest.raises(ValueError, match="layers"):
        LensAccumulator(5, taus).update(preds, conf, labels)
    with pytest.raises(ValueError, match="no samples"):
        LensAccumulator(6, taus).finalize()


# ---------------------------------------------------------------- NC1


def ref_nc1(h, y, rcond=1e-10):
    classes = np.unique(y)
    means = np.array([h[y == c].mean(axis=0) for c in classes])
    mu_g = means.mean(axis=0)
    sigma_w = sum(
        np.outer(x - means[classes == c][0], x - means[classes == c][0]) for x, c in zip(h, y)
    ) / len(h)
    sigma_b = sum(np.outer(m - mu_g, m - mu_g) for m in means) / len(classes)
    return np.trace(sigma_w @ np.linalg.pinv(sigma_b, rcond=rcond, hermitian=True)) / len(classes)


def class_data(rng, sizes, d, offset=0.0, spread=1.0):
    y = np.repeat(np.arange(len(sizes)) * 3 + 1, sizes)
    centres = rng.standard_normal((len(sizes), d)) * 3
    return centres[(y - 1) // 3] + spread * rng.standard_normal((y.size, d)) + offset, y


@pytest.mark.parametrize("sizes,d", [([5, 9, 4, 7], 10), ([6, 3, 8, 5, 4, 9], 3)])
def test_nc1_matches_direct_formula(rng, sizes, d):
    """C - 1 < d (Sigma_B rank-deficient: the threshold finds rank C-1) and C > d (full rank);
    unbalanced classes, so mu_G (unweighted mean of class means) is not the global mean."""
    h, y = class_data(rng, sizes, d)
    assert nc1(h, y) == pytest.approx(ref_nc1(h, y), rel=1e-10)
    assert nc1(h.astype(np.float16), y) == pytest.approx(
        ref_nc1(h.astype(np.float16).astype(np.float64), y), rel=1e-10
    )


def test_nc1_threshold_finds_the_rank_of_sigma_b(rng):
    """Collinear class means: Sigma_B = lam u u^T has rank 1, not C - 1 = 3. A fixed rank C - 1
    would invert rounding-noise eigenvalues; the rcond threshold keeps only u, so
    NC1 = (u^T Sigma_W u / lam) / C."""
    direction = rng.standard_normal(6)
    u = direction / np.linalg.norm(direction)
    y = np.repeat(np.arange(4), 10)
    noise = 0.3 * rng.standard_normal((40, 6))
    noise -= np.array([noise[y == c].mean(axis=0) for c in range(4)])[y]
    means = np.outer(np.arange(4.0), direction) + 5.0
    h = means[y] + noise
    lam = np.sum((means - means.mean(axis=0)) ** 2) / 4
    expected = (u @ (noise.T @ noise / 40) @ u) / lam / 4
    assert nc1(h, y) == pytest.approx(expected, rel=1e-9)
    assert nc1(h, y) == pytest.approx(ref_nc1(h, y), rel=1e-9)


def test_nc1_collapsed_classes_is_small_and_spread_is_large(rng):
    tight, y = class_data(rng, [20, 20, 20], 5, spread=1e-3)
    loose, _ = class_data(rng, [20, 20, 20], 5, spread=10.0)
    assert nc1(tight, y) < 1e-4 < 1.0 < nc1(loose, y)


def test_nc1_streaming_equals_one_pass(rng):
    h, y = class_data(rng, [30, 5, 22, 1, 14], 8, offset=1e4)  # large common offset
    order = rng.permutation(y.size)
    h, y = h[order], y[order]
    expected = ref_nc1(h, y)
    for _ in range(5):
        sequential, merged = NC1Accumulator(), NC1Accumulator()
        for idx in random_row_chunks(rng, y.size):
            sequential.update(h[idx], y[idx])
            merged.merge(NC1Accumulator().update(h[idx], y[idx]))
        for accumulator in (sequential, merged):
            assert accumulator.finalize() == pytest.approx(expected, rel=1e-9)
            np.testing.assert_array_equal(accumulator.counts, [30, 5, 22, 1, 14])
    with pytest.raises(ValueError, match="two classes"):
        nc1(h[y == 1], y[y == 1])


# ---------------------------------------------------------------- residual norm ratio


def test_residual_norm_ratio(rng):
    h = rng.standard_normal((6, 5)).astype(np.float16)
    h_next = h + 0.1 * rng.standard_normal((6, 5))
    h_next[2] = h[2]  # the block leaves sample 2 unchanged
    h64 = h.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ratio = residual_norm_ratio(h, h_next)
    mask = np.arange(6) != 2
    expected = [np.linalg.norm(a) / np.linalg.norm(b - a) for a, b in zip(h64[mask], h_next[mask])]
    np.testing.assert_allclose(ratio[mask], expected, rtol=1e-13)
    assert np.isinf(ratio[2])
    with pytest.raises(ValueError, match="same shape"):
        residual_norm_ratio(h, h_next[:, :4])

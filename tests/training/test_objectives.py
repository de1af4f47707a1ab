"""The training objectives against hand-computed values on tiny models built in code."""

from __future__ import annotations

import math

import pytest
import torch

from actstore.errors import InvalidArgument
from actstore.training import objectives as obj
from tests.factories import TEXTS, build_tiny_model

# ---------------------------------------------------------------------------------------------
# helpers: explicit formulas, no torch.nn.functional
# ---------------------------------------------------------------------------------------------


def hand_layer_norm(x, weight, bias, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def hand_ce(logits, target):
    """-log softmax(logits)[target] of one (C,) vector, written out."""
    m = logits.max()
    log_z = m + torch.log(torch.exp(logits - m).sum())
    return log_z - logits[target]


def hand_cos(a, b):
    return (a * b).sum() / torch.sqrt((a * a).sum() * (b * b).sum())


def lam(layer, L):
    return 2.0 * layer / (L * (L + 1))


def images(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g)


def vit_states_by_hand(model, x):
    """ViT's residual stream via explicit module calls (not the hooks under test)."""
    h = model.vit.embeddings(x)
    states = [h]
    for block in model.vit.layers:
        out = block(h)
        h = out[0] if isinstance(out, (tuple, list)) else out
        states.append(h)
    return states


# ---------------------------------------------------------------------------------------------
# weights and schedule
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [1, 2, 3, 6, 12, 30])
def test_layer_weights_sum_to_one(L):
    lin = obj.layer_weights(L, "linear")
    uni = obj.layer_weights(L, "uniform")
    assert lin.shape == uni.shape == (L,)
    assert float(lin.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(uni.sum()) == pytest.approx(1.0, abs=1e-12)
    for layer in range(1, L + 1):
        assert float(lin[layer - 1]) == pytest.approx(2 * layer / (L * (L + 1)), abs=1e-15)
        assert float(uni[layer - 1]) == pytest.approx(1 / L, abs=1e-15)
    assert torch.all(lin[1:] > lin[:-1])  # increasing with depth


def test_layer_weights_rejects_bad_input():
    with pytest.raises(InvalidArgument):
        obj.layer_weights(0)
    with pytest.raises(InvalidArgument):
        obj.layer_weights(3, "cubic")


def test_alternating_schedule_switches_on_parity():
    # steps are numbered from 1: odd -> last-layer CE, even -> the method's loss
    got = [obj.objective_for_step("aligned", t, alternating=True) for t in range(1, 9)]
    assert got == ["standard", "aligned"] * 4
    got = [obj.objective_for_step("multi-exit", t, alternating=True) for t in range(1, 5)]
    assert got == ["standard", "multi-exit"] * 2
    assert [obj.objective_for_step("aligned", t) for t in range(1, 5)] == ["aligned"] * 4
    assert [obj.objective_for_step("standard", t, True) for t in range(1, 5)] == ["standard"] * 4
    with pytest.raises(InvalidArgument):
        obj.objective_for_step("aligned", 0, alternating=True)
    with pytest.raises(InvalidArgument):
        obj.objective_for_step("dense", 1)


def test_alternating_loss_is_standard_on_odd_steps_and_aligned_on_even():
    model, _ = build_tiny_model("vit-cls")
    x, y = images(4), torch.tensor([0, 3, 9, 3])
    inputs = {"pixel_values": x}
    std = obj.training_loss(model, inputs, y, "standard").loss
    ali = obj.training_loss(model, inputs, y, "aligned").loss
    assert not torch.allclose(std, ali)
    for step in (1, 3, 5):
        out = obj.training_loss(model, inputs, y, "aligned", step=step, alternating=True)
        assert out.objective == "standard" and torch.equal(out.loss, std)
    for step in (2, 4, 6):
        out = obj.training_loss(model, inputs, y, "aligned", step=step, alternating=True)
        assert out.objective == "aligned" and torch.equal(out.loss, ali)


# ---------------------------------------------------------------------------------------------
# the residual stream and the head follow the ModelAdapter convention
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vit-cls", "bert-cls", "gpt2", "llama"])
def test_states_match_adapter_and_head_reproduces_logits(name, tmp_path):
    from actstore.modeling.adapter import ModelAdapter

    model, tok = build_tiny_model(name)
    model.save_pretrained(tmp_path)
    if tok is not None:
        tok.save_pretrained(tmp_path)
    adapter = ModelAdapter.load(tmp_path, device="cpu")
    batch = adapter.encode(images(3).numpy() if name == "vit-cls" else TEXTS, max_len=32)
    expected = adapter.hidden_states(batch)  # (L+1, b, s, d)
    loaded = adapter.model
    with torch.no_grad():
        states = obj.residual_states(loaded, batch.inputs)
        assert len(states) == expected.shape[0] == loaded.config.num_hidden_layers + 1
        for layer, s in enumerate(states):
            torch.testing.assert_close(s, expected[layer], rtol=0, atol=0)
        parts = obj.head_parts(loaded)
        own = loaded(**batch.inputs).logits
        mine = obj.apply_head(parts, states[-1] if parts.kind == "causal-lm" else states[-1][:, 0])
        torch.testing.assert_close(mine, own, rtol=1e-5, atol=1e-5)


def test_states_carry_gradients():
    model, _ = build_tiny_model("vit-cls")
    model.train()
    states = obj.residual_states(model, {"pixel_values": images(2)})
    assert all(s.requires_grad for s in states)
    states[1].sum().backward()
    assert model.vit.layers[0].mlp.fc2.weight.grad is not None
    assert model.vit.layers[2].mlp.fc2.weight.grad is None


# ---------------------------------------------------------------------------------------------
# hand-computed losses
# ---------------------------------------------------------------------------------------------


def test_aligned_loss_vit_by_hand():
    model, _ = build_tiny_model("vit-cls")
    x, y = images(4), torch.tensor([1, 7, 7, 2])
    L = model.config.num_hidden_layers
    ln = model.vit.layernorm
    W, b = model.classifier.weight, model.classifier.bias
    with torch.no_grad():
        states = vit_states_by_hand(model, x)
        total = 0.0
        per_layer = []
        for layer in range(1, L + 1):
            h = states[layer][:, 0]  # CLS
            z = hand_layer_norm(h, ln.weight, ln.bias, ln.eps) @ W.T + b
            ce = sum(hand_ce(z[i], int(y[i])) for i in range(len(y))) / len(y)
            per_layer.append(float(ce))
            total += lam(layer, L) * float(ce)
        # the last layer's hand logits are the model's own
        torch.testing.assert_close(z, model(pixel_values=x).logits, rtol=1e-5, atol=1e-5)
        got = obj.training_loss(model, {"pixel_values": x}, y, "aligned")
        std = obj.training_loss(model, {"pixel_values": x}, y, "standard")
        uni = obj.training_loss(model, {"pixel_values": x}, y, "aligned", weights="uniform")
    assert float(got.loss) == pytest.approx(total, rel=1e-5)
    assert got.layer_ce == pytest.approx(per_layer, rel=1e-5)
    assert float(std.loss) == pytest.approx(per_layer[-1], rel=1e-5)
    assert float(uni.loss) == pytest.approx(sum(per_layer) / L, rel=1e-5)


def test_aligned_loss_gpt2_next_token_by_hand():
    """Every token predicts the next one; pads are ignored; layer L is before ln_f."""
    model, tok = build_tiny_model("gpt2")
    tok.pad_token = tok.eos_token
    enc = tok(["the cat sat on the mat", "dog ran", "a big red dog"], padding="longest",
              return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    inputs = {"input_ids": ids, "attention_mask": mask}
    L = model.config.num_hidden_layers
    ln = model.transformer.ln_f
    E = model.lm_head.weight
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
        hs = out.hidden_states  # HF: [0..L-1] are block inputs, [L] has ln_f applied already
        total = 0.0
        for layer in range(1, L + 1):
            if layer < L:
                logits = hand_layer_norm(hs[layer], ln.weight, ln.bias, ln.eps) @ E.T
            else:
                logits = out.logits  # the model's own logits
            losses = []
            for i in range(ids.shape[0]):
                for t in range(ids.shape[1] - 1):
                    if mask[i, t + 1]:
                        losses.append(hand_ce(logits[i, t], int(ids[i, t + 1])))
            total += lam(layer, L) * float(sum(losses) / len(losses))
        got = obj.training_loss(model, inputs, None, "aligned")
    assert float(got.loss) == pytest.approx(total, rel=1e-5)


def test_aligned_loss_bert_with_pooler_by_hand():
    model, tok = build_tiny_model("bert-cls")
    enc = tok(TEXTS, padding="longest", return_tensors="pt")
    y = torch.tensor([0, 2, 1, 2])
    L = model.config.num_hidden_layers
    P, p = model.bert.pooler.dense.weight, model.bert.pooler.dense.bias
    W, b = model.classifier.weight, model.classifier.bias
    with torch.no_grad():
        hs = model.bert(**enc, output_hidden_states=True).hidden_states  # BERT: no final norm
        total = 0.0
        for layer in range(1, L + 1):
            z = torch.tanh(hs[layer][:, 0] @ P.T + p) @ W.T + b
            total += lam(layer, L) * float(sum(hand_ce(z[i], int(y[i])) for i in range(4)) / 4)
        torch.testing.assert_close(z, model(**enc).logits, rtol=1e-5, atol=1e-5)
        got = obj.training_loss(model, dict(enc), y, "aligned")
    assert float(got.loss) == pytest.approx(total, rel=1e-5)


def test_ce_reg_by_hand():
    model, _ = build_tiny_model("vit-cls")
    x, y = images(3, seed=1), torch.tensor([4, 0, 4])
    L = model.config.num_hidden_layers
    ln = model.vit.layernorm
    W, b = model.classifier.weight, model.classifier.bias
    with torch.no_grad():
        states = vit_states_by_hand(model, x)
        z = hand_layer_norm(states[L][:, 0], ln.weight, ln.bias, ln.eps) @ W.T + b
        ce = float(sum(hand_ce(z[i], int(y[i])) for i in range(3)) / 3)
        reg = 0.0
        for layer in range(1, L + 1):
            cos = [hand_cos(states[layer][i, 0], states[L][i, 0]) for i in range(3)]
            reg += lam(layer, L) * (1.0 - float(sum(cos) / 3))
        got = obj.training_loss(model, {"pixel_values": x}, y, "ce-reg", beta=0.5)
        got1 = obj.training_loss(model, {"pixel_values": x}, y, "ce-reg")
    assert got.regulariser == pytest.approx(reg, rel=1e-5)
    assert float(got.loss) == pytest.approx(ce + 0.5 * reg, rel=1e-5)
    assert obj.DEFAULT_BETA == 1.0
    assert float(got1.loss) == pytest.approx(ce + reg, rel=1e-5)
    assert reg > 0


def test_multi_exit_heads_are_independent_copies():
    model, _ = build_tiny_model("vit-cls")
    x, y = images(4, seed=2), torch.tensor([1, 2, 3, 4])
    inputs = {"pixel_values": x}
    L = model.config.num_hidden_layers
    heads = obj.make_exit_heads(model)
    assert sorted(heads.keys(), key=int) == [str(layer) for layer in range(1, L)]
    for head in heads.values():
        assert head.weight is not model.classifier.weight
        torch.testing.assert_close(head.weight, model.classifier.weight, rtol=0, atol=0)
    with torch.no_grad():
        # at initialisation the copies equal the shared head: multi-exit == aligned
        me = obj.training_loss(model, inputs, y, "multi-exit", exit_heads=heads)
        al = obj.training_loss(model, inputs, y, "aligned")
        assert float(me.loss) == pytest.approx(float(al.loss), rel=1e-6)
        # change exit 1 only: only layer 1's CE moves, and by the hand-computed amount
        heads["1"].weight.mul_(2.0)
        heads["1"].bias.add_(0.3)
        me2 = obj.training_loss(model, inputs, y, "multi-exit", exit_heads=heads)
        ln = model.vit.layernorm
        h1 = vit_states_by_hand(model, x)[1][:, 0]
        z = hand_layer_norm(h1, ln.weight, ln.bias, ln.eps) @ heads["1"].weight.T + heads["1"].bias
        ce1 = float(sum(hand_ce(z[i], int(y[i])) for i in range(4)) / 4)
    assert me2.layer_ce[0] == pytest.approx(ce1, rel=1e-5)
    assert me2.layer_ce[1:] == pytest.approx(al.layer_ce[1:], rel=1e-6)
    expected = sum(lam(layer, L) * ce for layer, ce in enumerate(me2.layer_ce, start=1))
    assert float(me2.loss) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(InvalidArgument):
        obj.training_loss(model, inputs, y, "multi-exit")


def test_gradients_reach_shallow_layers_only_with_aligned():
    """standard: block 1 gets gradient only through the later blocks; aligned adds a direct
    path, so its gradient differs; both reach the shared classifier."""
    model, _ = build_tiny_model("vit-cls")
    x, y = images(4, seed=3), torch.tensor([0, 1, 2, 3])
    grads = {}
    for method in ("standard", "aligned"):
        model.zero_grad()
        obj.training_loss(model, {"pixel_values": x}, y, method).loss.backward()
        grads[method] = model.vit.layers[0].mlp.fc2.weight.grad.clone()
        assert model.classifier.weight.grad is not None
    assert not torch.allclose(grads["standard"], grads["aligned"])
    assert math.isfinite(float(grads["aligned"].norm()))

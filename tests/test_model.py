"""The whole biLM forward against bilm-tf's, written down in docs/design.md, written here independently in float64 from bilm-tf's arrays."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elmo_cli.bilm_format import model_to_arrays
from elmo_cli.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_cli.model import encoder as encoder_module
from elmo_cli.model.bilm import BiLM, to_model_chars
from elmo_cli.model.encoder import distinct_rows
from elmo_cli.model.lstm import Dropout
from vocab.chars import ByteChars

CONFIG = ModelConfig(
    char_cnn=CharCNNConfig(filters=((1, 4), (2, 3), (3, 5)), n_highway=2, activation="tanh", embedding_dim=4,
                           n_characters=262, max_characters_per_token=12),
    lstm=LSTMConfig(dim=9, projection_dim=6, n_layers=2, cell_clip=1.0, proj_clip=0.9),
)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def reference_token(a: dict, chars: np.ndarray, config: ModelConfig) -> np.ndarray:
    """bilm-tf's token encoder for one token; `chars` are raw ids (W,)."""
    emb = np.concatenate([np.zeros((1, a["char_embed"].shape[1])), a["char_embed"]])[chars + 1]  # (W, E)
    W = len(chars)
    pooled = []
    for i, (width, count) in enumerate(config.char_cnn.filters):
        kern = a[f"CNN/W_cnn_{i}"][0]  # (width, E, count)
        conv = np.stack([np.einsum("ke,ken->n", emb[p : p + width], kern) for p in range(W - width + 1)])
        m = conv.max(0) + a[f"CNN/b_cnn_{i}"]
        pooled.append(np.maximum(m, 0) if config.char_cnn.activation == "relu" else np.tanh(m))
    x = np.concatenate(pooled)
    for k in range(config.char_cnn.n_highway):
        carry = _sig(x @ a[f"CNN_high_{k}/W_carry"] + a[f"CNN_high_{k}/b_carry"])
        transform = np.maximum(x @ a[f"CNN_high_{k}/W_transform"] + a[f"CNN_high_{k}/b_transform"], 0)
        x = carry * transform + (1 - carry) * x
    return x @ a["CNN_proj/W_proj"] + a["CNN_proj/b_proj"]


def reference_stack(a: dict, xs: np.ndarray, d: int, config: ModelConfig) -> list[np.ndarray]:
    """bilm-tf's LSTM stack for one direction over a sequence (T, P) from zero state."""
    H, P = config.lstm.dim, config.lstm.projection_dim
    layers, inp = [], xs
    for l in range(config.lstm.n_layers):
        pre = f"RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"
        h, c = np.zeros(P), np.zeros(H)
        outs = []
        for t in range(len(inp)):
            z = np.concatenate([inp[t], h]) @ a[pre + "W_0"] + a[pre + "B"]
            i, j, f, o = np.split(z, 4)
            c = np.clip(_sig(f + 1) * c + _sig(i) * np.tanh(j), -config.lstm.cell_clip, config.lstm.cell_clip)
            h = np.clip((_sig(o) * np.tanh(c)) @ a[pre + "W_P_0"], -config.lstm.proj_clip, config.lstm.proj_clip)
            outs.append(h)
        out = np.stack(outs)
        if l > 0:
            out = out + inp
        layers.append(out)
        inp = out
    return layers


def _model() -> BiLM:
    torch.manual_seed(0)
    model = BiLM(CONFIG, vocab_size=11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("char_embedding.weight"):
                p.normal_(0.0, 0.7)
        model.encoder.char_embedding.weight[1:].normal_(0.0, 1.0)
    return model.eval()


def test_full_forward_matches_spec():
    model = _model()
    chars = ByteChars(max_chars=12).encode_tokens(["<S>", "Th", "cat", "é!", "</S>"])  # raw (5, 12)
    layers, _ = model.embed(to_model_chars(chars)[None], torch.tensor([5]))
    a = {k: v.astype(np.float64) for k, v in model_to_arrays(model).items()}
    x = np.stack([reference_token(a, row.astype(np.int64), CONFIG) for row in chars])  # (T, P)
    fwd = reference_stack(a, x, 0, CONFIG)
    bwd = [o[::-1] for o in reference_stack(a, x[::-1], 1, CONFIG)]
    expected = [np.concatenate([x, x], 1)] + [np.concatenate([f, b], 1) for f, b in zip(fwd, bwd)]
    # the clips must bind somewhere for this to test them
    assert any(np.isclose(np.abs(o), CONFIG.lstm.proj_clip).any() for o in fwd)
    np.testing.assert_allclose(layers[:, 0].detach().double().numpy(), np.stack(expected), atol=2e-5)


def test_lm_hidden_tops_equal_embed_and_distinct_encoder_equals_plain():
    model = _model()
    chars = ByteChars(max_chars=12).encode_tokens(["<S>", "a", "b", "a", "c", "</S>"])
    c = to_model_chars(chars)[None]  # (1, 6, W)
    layers, _ = model.embed(c, torch.tensor([6]))
    f_top, b_top, _ = model.lm_hidden(c, c.flip(1))
    P = CONFIG.lstm.projection_dim
    torch.testing.assert_close(f_top, layers[-1, :, :, :P])
    torch.testing.assert_close(b_top.flip(1), layers[-1, :, :, P:])
    torch.testing.assert_close(model.encoder.forward_distinct(c), model.encoder(c[0])[None])


@pytest.mark.parametrize("words", [0, 5])
def test_distinct_tokens_found_before_the_step_encode_as_found_in_it(words):
    """`DistinctTokens.of` (the trainer's, on the host) gives `forward_distinct` the same values, and the trimmed
    width the encoder finds itself; with a word id after the characters (an ELMoForManyLangs model) the trim reads
    the characters only."""
    from elmo_cli.model.encoder import DistinctTokens, trimmed_positions

    cnn = dataclasses.replace(CONFIG.char_cnn, n_words=9 if words else 0, word_dim=words)
    model = BiLM(dataclasses.replace(CONFIG, char_cnn=cnn))
    chars = to_model_chars(ByteChars(max_chars=12).encode_tokens(["<S>", "a", "bb", "a", "cccc", "</S>"]))
    if words:  # word ids far above any character id, which a trim over all columns would count
        chars = torch.cat([chars, torch.tensor([[1], [8], [2], [8], [3], [4]])], dim=1)
    c = torch.stack([chars, chars.flip(0)])  # (2, 6, W)
    tokens = DistinctTokens.of(c, cnn.max_characters_per_token)
    assert tokens.rows.shape[0] == 5 and torch.equal(tokens.rows[tokens.inverse], c.reshape(-1, c.shape[-1]))
    assert tokens.n_pos == min(int(trimmed_positions(c.reshape(-1, c.shape[-1])[:, :12])) + 1, 12) < 12
    torch.testing.assert_close(model.encoder.embed_tokens(tokens).reshape(2, 6, -1), model.encoder.forward_distinct(c),
                               atol=0, rtol=0)


def test_dropout_only_in_training():
    model = BiLM(CONFIG, vocab_size=11, dropout=0.5)
    c = to_model_chars(ByteChars(max_chars=12).encode_tokens(["<S>", "a", "b", "</S>"]))[None]
    model.eval()
    a1, _, _ = model.lm_hidden(c, c.flip(1))
    a2, _, _ = model.lm_hidden(c, c.flip(1))
    torch.testing.assert_close(a1, a2)
    model.train()
    torch.manual_seed(0)
    t1, _, _ = model.lm_hidden(c, c.flip(1))
    assert not torch.allclose(t1, a1)


def _conv1d_encoder(enc, chars: torch.Tensor) -> torch.Tensor:
    """The token encoder the plain way: Conv1d per bank over all W positions, max over valid positions."""
    x = enc.char_embedding(chars).transpose(1, 2)  # (N, E, W)
    pooled = []
    for kern, bias in zip(enc.kernels, enc.biases):  # kern (w, E, n)
        conv = torch.nn.functional.conv1d(x, kern.permute(2, 1, 0), bias)  # (N, n, W - w + 1)
        pooled.append(conv.max(dim=2).values)
    h = torch.cat(pooled, 1)
    h = torch.relu(h) if enc.config.activation == "relu" else torch.tanh(h)
    for hw in enc.highways:
        h = hw(h)
    return enc.projection(h)


@pytest.mark.parametrize("tokens", [["<S>", "a", "bc", "</S>"], ["<S>", "x" * 11, "ab", "</S>"]])
def test_encoder_and_its_gradients_equal_conv1d_over_all_positions(tokens):
    """The encoder stops at the first all-padding window and skips the mask when no token is long."""
    model = _model()
    enc = model.encoder
    chars = to_model_chars(ByteChars(max_chars=12).encode_tokens(tokens))
    out = enc(chars)
    grads = torch.autograd.grad(out.pow(2).sum(), list(enc.parameters()))
    ref = _conv1d_encoder(enc, chars)
    ref_grads = torch.autograd.grad(ref.pow(2).sum(), list(enc.parameters()))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # inference pools with amax, training with max: the same values
        assert torch.equal(enc(chars), out.detach())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=3, max_size=3), min_size=1, max_size=40),
       st.sampled_from([torch.int16, torch.int32, torch.int64]))
def test_distinct_rows_are_exactly_the_unique_rows_and_map_back(rows, dtype):
    """The keyed distinct rows give what `torch.unique(dim=0)` gives, in their own order."""
    x = torch.tensor(rows, dtype=dtype)  # (N, 3)
    distinct, inverse = distinct_rows(x)
    expected = torch.unique(x, dim=0)
    assert distinct.dtype == dtype and inverse.dtype == torch.long and inverse.shape == (x.shape[0],)
    assert torch.equal(distinct[inverse], x)
    assert sorted(map(tuple, distinct.tolist())) == sorted(map(tuple, expected.tolist()))


def test_distinct_rows_stay_exact_when_different_rows_share_a_key(monkeypatch):
    """Keys that collide for every row (all weights zero): the result still separates the rows."""
    monkeypatch.setitem(encoder_module._ROW_WEIGHTS, (4, torch.device("cpu")), torch.zeros(4, dtype=torch.long))
    x = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1], [1, 2, 3, 4], [0, 0, 0, 0]])
    distinct, inverse = distinct_rows(x)
    assert distinct.shape == (3, 4) and torch.equal(distinct[inverse], x)


def test_training_dropout_keeps_one_minus_p_scaled_and_is_seeded():
    """The CPU mask: each element zero or x / (1 - p), kept at 1 - p; the same seed draws the same mask; the
    gradient passes through the kept elements with the same scale; bf16 stays bf16; eval mode is the identity."""
    drop = Dropout(0.3).train()
    x = torch.full((1000, 1000), 2.0, requires_grad=True)
    torch.manual_seed(5)
    y = drop(x)
    values = torch.unique(y.detach()).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(2.0 / 0.7)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.003  # 1e6 draws: the standard error is 4.6e-4
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y.detach() != 0).float() / 0.7)
    torch.manual_seed(5)
    assert torch.equal(drop(x.detach()), y.detach())
    assert drop(torch.ones(4, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert torch.equal(drop.eval()(x.detach()), x.detach())

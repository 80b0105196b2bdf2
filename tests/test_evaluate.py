"""elmo_cli.evaluate: perplexities checked against a float64 brute force, zero softmax = V, batch invariance."""
import json
import math
import random

import h5py
import numpy as np
import pytest
import torch

from elmo_cli import baselines
from elmo_cli import evaluate as ev
from elmo_cli.bilm_format import save_model_dir
from elmo_cli.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_cli.loading import LoadedModel, load_model
from elmo_cli.model import BiLM, to_model_chars
from lstm_stream import Float64BiLSTM, row_streams
from vocab.errors import ElmoError
from vocab.tokenize import TextEncoder
from vocab.vocabulary import Vocabulary

WORDS = "the cat sat on a mat dog ran fast".split()
TOKENS = ["<S>", "</S>", "<UNK>"] + WORDS
LINES = [
    "the cat sat",
    "",
    "on a mat zebra",  # zebra is OOV
    "the dog ran on the mat",
    "   ",
    "a",
    "dog dog dog ran fast fast the cat sat on a mat",
    "mat",
]
CONFIG = ModelConfig(char_cnn=CharCNNConfig(filters=((1, 4), (2, 4)), n_highway=1, embedding_dim=4),
                     lstm=LSTMConfig(dim=16, projection_dim=8, n_layers=2, cell_clip=3.0, proj_clip=3.0))


def make_model_dir(path, seed=0, zero_softmax=False, softmax=True, vocab_tokens=TOKENS):
    torch.manual_seed(seed)
    model = BiLM(CONFIG, vocab_size=len(TOKENS) if softmax else None)
    with torch.no_grad():
        for p in model.parameters():  # larger weights than the init, so that scores differ across contexts
            p.mul_(3.0)
        if zero_softmax:
            model.softmax.weight.zero_()
            model.softmax.bias.zero_()
    save_model_dir(model, path)
    TextEncoder(Vocabulary(list(vocab_tokens))).save_to(path)
    return path


@pytest.fixture
def model_dir(tmp_path):
    return make_model_dir(tmp_path / "model")


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "test.txt"
    p.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return p


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def brute_force(model: BiLM, vocab: Vocabulary, tokens: list[str], exclude_unk=False) -> tuple[float, float, int]:
    """One sentence in float64, each direction built from its own token list, full log_softmax over V."""
    m = BiLM(model.config, vocab_size=model.softmax.vocab_size).double()
    m.load_state_dict(model.state_dict())
    m.eval()
    text = TextEncoder(vocab)

    def direction(lstm, seq):  # seq: input tokens followed by the last target
        chars = to_model_chars(text.chars.encode_tokens(seq)).unsqueeze(0)  # (1, T, W)
        with torch.no_grad():
            x = m.encoder(chars.reshape(-1, chars.shape[-1])).reshape(1, len(seq), -1)
            out, _ = lstm(x[:, :-1])
            logp = torch.log_softmax(out[-1][0] @ m.softmax.weight.t() + m.softmax.bias, dim=-1)  # (T-1, V)
        targets = [vocab.id_of(t) for t in seq[1:]]
        keep = [i for i, t in enumerate(targets) if not (exclude_unk and t == vocab.unk_id)]
        return sum(logp[i, targets[i]].item() for i in keep), len(keep)

    f, n = direction(m.forward_lstm, ["<S>", *tokens, "</S>"])
    b, n_b = direction(m.backward_lstm, ["</S>", *reversed(tokens), "<S>"])
    assert n == n_b
    return f, b, n


def test_zero_softmax_scores_perplexity_v(model_dir, text_file):
    make_model_dir(model_dir, zero_softmax=True)
    r = ev.evaluate(load_model(model_dir), [text_file], batch_size=3)
    V = len(TOKENS)
    assert r.vocab_size == V
    for ppl in (r.forward_perplexity, r.backward_perplexity, r.average_perplexity, r.mean_loss_perplexity):
        assert ppl == pytest.approx(V, rel=1e-6)


def test_counts_and_per_sentence_sum_to_totals(model_dir, text_file, tmp_path):
    out = tmp_path / "scores.jsonl"
    r = ev.evaluate(load_model(model_dir), [text_file], batch_size=2, per_sentence_path=out)
    non_blank = [l for l in LINES if l.strip()]
    words = sum(len(l.split()) for l in non_blank)
    assert (r.sentences, r.blank_lines, r.words) == (len(non_blank), 2, words)
    assert r.tokens == words + len(non_blank)  # one </S> (forward) / <S> (backward) target per sentence
    assert r.oov_words == 1 and r.oov_rate == pytest.approx(1 / words)
    rows = read_jsonl(out)
    assert [row["index"] for row in rows] == list(range(len(LINES)))
    assert [row["source"] for row in rows] == [f"{text_file}:{i + 1}" for i in range(len(LINES))]
    assert [row["words"] for row in rows] == [len(l.split()) for l in LINES]
    blank = [row for row in rows if row["words"] == 0]
    assert len(blank) == 2 and all(row["forward_logprob"] is None and row["tokens"] == 0 for row in blank)
    scored = [row for row in rows if row["words"]]
    assert sum(row["tokens"] for row in scored) == r.tokens
    assert sum(row["forward_logprob"] for row in scored) == pytest.approx(r.forward_logprob, rel=1e-12)
    assert sum(row["backward_logprob"] for row in scored) == pytest.approx(r.backward_logprob, rel=1e-12)
    assert not list(tmp_path.glob(".scores.jsonl.tmp*"))


def test_perplexities_from_totals_hand_computed():
    """4 targets per direction at log-probabilities 4 ln(1/10) and 4 ln(1/40): perplexities 10 and 40, the paper's
    average 25, exp of the mean loss sqrt(10 * 40) = 20; an exp past float range is infinity, not an error."""
    r = ev.EvalResult(sentences=2, blank_lines=0, words=2, oov_words=0, tokens=4, excluded_unk=0,
                      forward_logprob=-4 * math.log(10), backward_logprob=-4 * math.log(40), exclude_unk=False,
                      stateful=False, vocab_size=50, seconds=2.0)
    assert (r.forward_perplexity, r.backward_perplexity) == (pytest.approx(10.0), pytest.approx(40.0))
    assert r.average_perplexity == pytest.approx(25.0) and r.mean_loss_perplexity == pytest.approx(20.0)
    assert r.tokens_per_second == 2.0 and r.to_dict()["average_perplexity"] == pytest.approx(25.0)
    diverged = ev.EvalResult(1, 0, 1, 0, 2, 0, -2000.0, -2.0, False, False, 50, 1.0)
    assert diverged.forward_perplexity == math.inf and diverged.average_perplexity == math.inf


@pytest.mark.parametrize("exclude_unk", [False, True])
def test_matches_float64_brute_force(model_dir, text_file, tmp_path, exclude_unk):
    loaded = load_model(model_dir)
    out = tmp_path / "scores.jsonl"
    r = ev.evaluate(loaded, [text_file], batch_size=3, per_sentence_path=out, exclude_unk=exclude_unk)
    total_f = total_b = 0.0
    total_n = 0
    for row, line in zip(read_jsonl(out), LINES):
        if not line.strip():
            continue
        f, b, n = brute_force(loaded.model, loaded.text.vocab, line.split(), exclude_unk)
        assert row["tokens"] == n
        assert row["forward_logprob"] == pytest.approx(f, rel=1e-5, abs=1e-5)
        assert row["backward_logprob"] == pytest.approx(b, rel=1e-5, abs=1e-5)
        total_f, total_b, total_n = total_f + f, total_b + b, total_n + n
    assert r.tokens == total_n
    assert r.excluded_unk == (1 if exclude_unk else 0)
    forward, backward = math.exp(-total_f / total_n), math.exp(-total_b / total_n)
    assert r.forward_perplexity == pytest.approx(forward, rel=1e-5)
    assert r.backward_perplexity == pytest.approx(backward, rel=1e-5)
    assert r.average_perplexity == pytest.approx((forward + backward) / 2, rel=1e-5)
    assert r.mean_loss_perplexity == pytest.approx(math.exp(-(total_f + total_b) / (2 * total_n)), rel=1e-5)
    assert r.forward_perplexity != pytest.approx(r.backward_perplexity, rel=1e-3)  # the directions really differ


def test_stateless_scores_independent_of_batch_size_and_order(model_dir, text_file, tmp_path):
    loaded = load_model(model_dir)

    def scores(path, batch_size):
        out = tmp_path / "s.jsonl"
        ev.evaluate(loaded, [path], batch_size=batch_size, per_sentence_path=out)
        return {row["index"]: row for row in read_jsonl(out) if row["words"]}

    base = scores(text_file, 1)
    for bs in (2, 3, 64):
        other = scores(text_file, bs)
        for i, row in base.items():
            assert other[i]["forward_logprob"] == pytest.approx(row["forward_logprob"], rel=1e-5, abs=1e-6)
            assert other[i]["backward_logprob"] == pytest.approx(row["backward_logprob"], rel=1e-5, abs=1e-6)
    order = list(range(len(LINES)))
    random.Random(1).shuffle(order)
    shuffled = tmp_path / "shuffled.txt"
    shuffled.write_text("\n".join(LINES[i] for i in order) + "\n", encoding="utf-8")
    other = scores(shuffled, 3)
    assert sorted(base) == sorted(order[i] for i in other)
    for new_index, old_index in enumerate(order):
        if old_index in base:
            a, b = base[old_index], other[new_index]
            assert a["words"] == b["words"]
            assert b["forward_logprob"] == pytest.approx(a["forward_logprob"], rel=1e-5, abs=1e-6)
            assert b["backward_logprob"] == pytest.approx(a["backward_logprob"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("batch_size, pool_batches", [(2, None), (3, 1)])
def test_stateful_carries_state_per_batch_row(model_dir, text_file, tmp_path, monkeypatch, batch_size, pool_batches):
    """--stateful against bilm-tf's training streams computed independently (tests/lstm_stream.py, float64 from
    weights.hdf5 and softmax.hdf5, one row at a time): the k-th non-blank line runs in row k % batch_size, the
    forward model reads <S> w1 .. wn and the backward </S> wn .. w1, each from its own final state after line
    k - batch_size (</S> and <S> are only targets, so never advance the state). pool_batches=1 carries the state
    across evaluate's pools."""
    if pool_batches is not None:
        monkeypatch.setattr(ev, "_POOL_BATCHES", pool_batches)
    loaded = load_model(model_dir)
    out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    stateless = ev.evaluate(loaded, [text_file], batch_size=batch_size, per_sentence_path=out_a)
    stateful = ev.evaluate(loaded, [text_file], batch_size=batch_size, per_sentence_path=out_b, stateful=True)
    assert stateful.stateful and not stateless.stateful and stateful.tokens == stateless.tokens
    rows = [r for r in read_jsonl(out_b) if r["words"]]
    sentences = [loaded.text.tokenize(line) for line in LINES if line.strip()]
    assert [r["words"] for r in rows] == [len(s) for s in sentences]

    lstm = Float64BiLSTM(model_dir / "weights.hdf5", json.loads((model_dir / "options.json").read_text())["lstm"])
    with h5py.File(model_dir / "softmax.hdf5") as f:
        W, b = f["W"][...].astype(np.float64), f["b"][...].astype(np.float64)  # (V, P), (V,)
    vocab = loaded.text.vocab

    def log_probs(h, targets):  # full softmax, float64
        logits = h @ W.T + b
        m = logits.max(1, keepdims=True)
        lp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
        return float(lp[np.arange(len(targets)), targets].sum())

    for row in row_streams(len(sentences), batch_size):
        forward_state, backward_state = lstm.zero_states(), lstm.zero_states()
        for k in row:
            words = sentences[k]
            with torch.no_grad():
                x = loaded.model.encoder(to_model_chars(loaded.text.chars.encode_tokens(["<S>", *words, "</S>"])))
            x = x.double().numpy()  # (n + 2, P)
            ids = [vocab.id_of(t) for t in ["<S>", *words, "</S>"]]
            fwd, forward_state = lstm.run(0, x[:-1], forward_state)  # <S> w1 .. wn
            bwd, backward_state = lstm.run(1, x[::-1][:-1], backward_state)  # </S> wn .. w1
            assert rows[k]["forward_logprob"] == pytest.approx(log_probs(fwd[-1], ids[1:]), rel=1e-6, abs=1e-5)
            assert rows[k]["backward_logprob"] == pytest.approx(log_probs(bwd[-1], ids[::-1][1:]), rel=1e-6,
                                                                abs=1e-5)
    # Not vacuous: every sentence after the first batch scores differently from zero state.
    plain = [r for r in read_jsonl(out_a) if r["words"]]
    assert all(abs(x["forward_logprob"] - y["forward_logprob"]) > 1e-2 for x, y in
               zip(plain[batch_size:], rows[batch_size:]))


def test_chunked_log_probs_match_log_softmax(monkeypatch):
    torch.manual_seed(0)
    from elmo_cli.model.softmax import SharedSoftmax

    sm = SharedSoftmax(13, 5)
    with torch.no_grad():
        sm.bias.normal_()
    h = torch.randn(11, 5)
    targets = torch.randint(0, 13, (11,))
    expected = torch.log_softmax(h.double() @ sm.weight.double().t() + sm.bias.double(), -1)[torch.arange(11), targets]
    monkeypatch.setattr(ev, "_LOGITS_BUDGET", 12)  # 3-row chunks -> 4-row blocks: both loops run several times
    with torch.no_grad():
        for chunk in (1, 3, 13, 100):
            got = ev.chunked_log_probs(sm, h, targets, chunk)
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_shard_directory_scores_like_text(model_dir, text_file):
    from vocab.shards import write_shards

    shards = model_dir.parent / "shards"
    write_shards([text_file], model_dir / "vocab.txt", shards, seed=3)
    loaded = load_model(model_dir)
    a = ev.evaluate(loaded, [text_file])
    b = ev.evaluate(loaded, [shards])
    assert (b.sentences, b.words, b.tokens, b.oov_words) == (a.sentences, a.words, a.tokens, a.oov_words)
    assert b.forward_logprob == pytest.approx(a.forward_logprob, rel=1e-5)
    assert b.backward_logprob == pytest.approx(a.backward_logprob, rel=1e-5)


def test_progress_reports_lines(model_dir, text_file):
    seen = []
    ev.evaluate(load_model(model_dir), [text_file, text_file], on_progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (2 * len(LINES), 2 * len(LINES))


def test_unigram_baseline_hand_computed(model_dir, tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("the cat\n\nthe zebra the\n", encoding="utf-8")
    test = tmp_path / "t.txt"
    test.write_text("the cat sat\n", encoding="utf-8")
    text = load_model(model_dir).text
    uni = baselines.unigram_model([train], text)
    V = len(TOKENS)
    # counts: the 3, cat 1, <UNK> 1, </S> 2 (sentences) -> N = 7
    assert uni.counts.sum() == 7 and uni.sentences == 2
    assert uni.counts[text.vocab.id_of("the")] == 3 and uni.counts[text.vocab.unk_id] == 1
    r = baselines.unigram_perplexity(uni, [test], text)
    logp = math.log(4 / (7 + V)) + math.log(2 / (7 + V)) + math.log(1 / (7 + V)) + math.log(3 / (7 + V))
    assert r.tokens == 4
    assert r.perplexity == pytest.approx(math.exp(-logp / 4))
    assert np.exp(uni.log_probs()).sum() == pytest.approx(1.0)


def test_model_without_softmax_says_how_to_get_one(tmp_path, text_file):
    d = make_model_dir(tmp_path / "nosoftmax", softmax=False)
    with pytest.raises(ElmoError, match="train --init-from"):
        ev.evaluate(load_model(d), [text_file])


def test_model_without_vocab(model_dir, text_file):
    loaded = load_model(model_dir)
    with pytest.raises(ElmoError, match="no vocab.txt"):
        ev.evaluate(LoadedModel(loaded.model, TextEncoder(), model_dir, loaded.device), [text_file])


def test_softmax_vocab_size_mismatch(model_dir, text_file):
    loaded = load_model(model_dir)
    small = TextEncoder(Vocabulary(TOKENS[:-1]))
    with pytest.raises(ElmoError, match=f"softmax has {len(TOKENS)} rows but vocab.txt has {len(TOKENS) - 1}"):
        ev.evaluate(LoadedModel(loaded.model, small, model_dir, loaded.device), [text_file])


def test_bad_inputs(model_dir, tmp_path):
    loaded = load_model(model_dir)
    with pytest.raises(ElmoError, match="no such file"):
        ev.evaluate(loaded, [tmp_path / "missing.txt"])
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat\nthe \xff\n")
    with pytest.raises(ElmoError, match=r"bad.txt:2: invalid UTF-8"):
        ev.evaluate(loaded, [bad], per_sentence_path=tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists() and not list(tmp_path.glob(".out.jsonl*"))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ElmoError, match="nothing to score"):
        ev.evaluate(loaded, [blank])
    with pytest.raises(ElmoError, match="--batch-size"):
        ev.evaluate(loaded, [bad], batch_size=0)

"""elmo_cli.embed: stateless batching, the token memo and cache, layer reductions, interrupt + resume."""
import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from pathlib import Path

from elmo_cli import h5dump
from elmo_cli.dump import DumpProgress, dump_embeddings, dump_token_embeddings
from elmo_cli.embed import TokenEmbeddings, embed_batch
from elmo_cli.inputs import length_sorted_batches
from elmo_cli.layers import LayerSelection
from elmo_cli.loading import load_model
from lstm_stream import Float64BiLSTM, row_streams
from vocab.errors import ElmoError

REFERENCE = Path(__file__).parent / "data" / "reference"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, REFERENCE / "options.json", REFERENCE / "weights.hdf5")


@pytest.fixture
def text_file(tmp_path, reference_dir):
    """The reference sentences with an empty line and a duplicate inserted."""
    lines = (reference_dir / "sentences.txt").read_text("utf-8").splitlines()
    lines = lines[:3] + ["", "   "] + lines[3:] + [lines[0]]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


def _read(path):
    with h5py.File(path, "r") as f:
        keys = [k for k in f.keys() if k.isdigit()]
        return {k: f[k][...] for k in keys}, (h5dump.read_sentence_index(f) if "sentence_to_index" in f else None)


def test_length_sorted_batches():
    assert length_sorted_batches([3, 9, 1, 8], 2) == [[1, 3], [0, 2]]
    assert length_sorted_batches([], 4) == []
    # A token budget: rows x (longest + 2) <= max_tokens, at least one row; every position exactly once.
    lengths = [300, 5, 40, 298, 6, 1000, 7]
    batches = length_sorted_batches(lengths, 4, max_tokens=700)
    assert batches == [[5], [0, 3], [2, 6, 4, 1]]
    assert sorted(k for b in batches for k in b) == list(range(len(lengths)))
    long = length_sorted_batches([200] * 300 + [20] * 300, 64)  # default budget 64 x 64 padded tokens
    assert [len(b) for b in long] == [20] * 15 + [64] * 4 + [44]  # 4096 // 202 = 20 rows of 200 tokens


def test_reduce_layers_hand_computed():
    """A batch of 2 sentences, layers (3, 2, 4, 3): layer l of sentence b is l-th of (1, 2, 6) plus 10 b; each
    selection's shape and values, and `line` taking tokens 1 .. n."""
    a = torch.stack([torch.stack([torch.full((4, 3), v + 10.0 * b) for b in range(2)]) for v in (1.0, 2.0, 6.0)])
    for sel, want in (("all", [[1.0, 2.0, 6.0], [11.0, 12.0, 16.0]]), ("top", [6.0, 16.0]),
                      ("average", [3.0, 13.0]), ("2,0", [[6.0, 1.0], [16.0, 11.0]])):
        out = LayerSelection.parse(sel).reduce_batch(a)
        assert out.shape == (2, *LayerSelection.parse(sel).shape(3, 4, 3)), sel
        for b in range(2):
            line = LayerSelection.line(out, b, 2)
            assert line.shape == LayerSelection.parse(sel).shape(3, 2, 3), sel
            expected = torch.tensor(want[b])  # one value per kept layer, or one for the whole line
            expected = expected.view(-1, 1, 1) if line.dim() == 3 else expected
            assert torch.equal(line, expected.expand(line.shape)), sel
    mixed = LayerSelection.parse(mix="0.5,0.25,0.25", gamma=2.0).reduce_batch(a)
    assert mixed.shape == (2, 4, 3) and torch.allclose(mixed[0], torch.full((4, 3), 2.0 * (0.5 + 0.5 + 1.5)))
    for sel, shape in (("all", (3, 4, 8)), ("top", (4, 8)), ("average", (4, 8)), ("1,2", (2, 4, 8))):
        assert LayerSelection.parse(sel).shape(3, 4, 8) == shape


@pytest.mark.parametrize("layers, mix, message", [("first", None, "expected all, top, average"),
                                                  ("1,1", None, "distinct"), ("top", "0.5,0.5", "replaces"),
                                                  ("all", "a,b", "comma-separated numbers")])
def test_layer_selection_refuses_bad_spellings(layers, mix, message):
    with pytest.raises(ElmoError, match=message):
        LayerSelection.parse(layers, mix)
    with pytest.raises(ElmoError, match="layers 0..2"):
        LayerSelection.parse("1,3").check(3)


def test_token_memo_eviction_gives_same_vectors(loaded):
    words = "the cat sat on the mat , said the dog to the cat".split()
    a = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device).lookup(words)
    small = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device, capacity=3)
    for k in range(0, len(words), 3):  # forces the memo to reset several times
        torch.testing.assert_close(small.lookup(words[k : k + 3]), a[k : k + 3], atol=1e-5, rtol=0)
    assert small.n <= 3 + len(set(words))


def test_batch_size_and_order_do_not_matter(loaded, text_file, tmp_path):
    path, lines = text_file
    outs = []
    for bs, window in ((1, 100), (4, 1), (64, 100)):
        out = tmp_path / f"o{bs}.hdf5"
        dump_embeddings(loaded, path, out, batch_size=bs, window_batches=window)
        outs.append(_read(out))
    base, index = outs[0]
    assert sorted(base, key=int) == [str(i) for i in range(len(lines))]
    assert base["3"].shape == (3, 0, 128) and base["4"].shape == (3, 0, 128)  # empty lines keep their keys
    for other, other_index in outs[1:]:
        assert other_index == index
        for k in base:
            np.testing.assert_allclose(other[k], base[k], atol=1e-5, rtol=0)
    assert index[lines[0].strip()] == str(len(lines) - 1)  # a duplicate: the last index wins
    assert index[""] == "4"


@pytest.mark.parametrize("ahead", [1, 2])
def test_embedding_ahead_of_the_writes_writes_the_same_file(loaded, text_file, tmp_path, monkeypatch, ahead):
    """A GPU's order (`dump.batches_ahead`: the window's first batches embedded before its datasets are made,
    each batch written after the next is embedded), run on the CPU: the file is the same bytes as the CPU's order
    gives, over several windows, an empty line and a resume."""
    import elmo_cli.dump as dump_module

    path, lines = text_file
    dump_embeddings(loaded, path, tmp_path / "now.hdf5", batch_size=2, window_batches=2)
    monkeypatch.setattr(dump_module, "batches_ahead", lambda device: ahead)
    dump_embeddings(loaded, path, tmp_path / "ahead.hdf5", batch_size=2, window_batches=2)
    assert (tmp_path / "ahead.hdf5").read_bytes() == (tmp_path / "now.hdf5").read_bytes()
    with pytest.raises(KeyboardInterrupt):  # stopped after the first window (4 lines), resumed
        dump_embeddings(loaded, path, tmp_path / "resumed.hdf5", batch_size=2, window_batches=2,
                        on_progress=lambda p: (_ for _ in ()).throw(KeyboardInterrupt) if p.lines >= 5 else None)
    dump_embeddings(loaded, path, tmp_path / "resumed.hdf5", batch_size=2, window_batches=2, resume=True)
    got, index = _read(tmp_path / "resumed.hdf5")
    want, want_index = _read(tmp_path / "now.hdf5")
    assert index == want_index and sorted(got, key=int) == sorted(want, key=int) == [str(i) for i in range(len(lines))]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_layers_dtype_and_mix(loaded, text_file, tmp_path):
    path, _ = text_file
    dump_embeddings(loaded, path, tmp_path / "all.hdf5")
    full, _ = _read(tmp_path / "all.hdf5")
    dump_embeddings(loaded, path, tmp_path / "top.hdf5", layers="top", dtype="float16", compression="gzip")
    dump_embeddings(loaded, path, tmp_path / "mix.hdf5", layers=LayerSelection.parse(mix="0.2,0.3,0.5", gamma=1.5),
                    compression="lzf",
                    sentence_index=False)
    top, _ = _read(tmp_path / "top.hdf5")
    mix, mix_index = _read(tmp_path / "mix.hdf5")
    assert mix_index is None
    for k, a in full.items():
        assert top[k].dtype == np.float16 and top[k].shape == a.shape[1:]
        np.testing.assert_allclose(top[k], a[-1], atol=2e-3, rtol=1e-3)
        np.testing.assert_allclose(mix[k], 1.5 * (0.2 * a[0] + 0.3 * a[1] + 0.5 * a[2]), atol=1e-5, rtol=0)
    with pytest.raises(ElmoError, match="3 layers"):
        dump_embeddings(loaded, path, tmp_path / "bad.hdf5", layers=LayerSelection.parse(mix="0.5,0.5"))


def _assert_cache_changes_nothing(loaded, path, cache, tmp_path) -> None:
    """A dump with the token cache equals one without it."""
    dump_embeddings(loaded, path, tmp_path / "plain.hdf5")
    dump_embeddings(loaded, path, tmp_path / "cached.hdf5", token_cache=cache)
    plain, _ = _read(tmp_path / "plain.hdf5")
    cached, _ = _read(tmp_path / "cached.hdf5")
    for k in plain:
        np.testing.assert_allclose(cached[k], plain[k], atol=1e-6, rtol=0)


def test_token_cache_gives_identical_output(loaded, text_file, tmp_path, reference_dir):
    path, lines = text_file
    words = sorted({w for line in lines for w in line.split()} - {"<S>", "</S>", "<UNK>"})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["<S>", "</S>", "<UNK>"] + words[: len(words) // 2]) + "\n", encoding="utf-8")
    cache = tmp_path / "cache.hdf5"
    dump_token_embeddings(loaded, vocab, cache)
    with h5py.File(cache) as f:
        assert f["embedding"].shape == (3 + len(words) // 2, 64) and f["embedding"].dtype == np.float32
    _assert_cache_changes_nothing(loaded, path, cache, tmp_path)


def test_token_cache_from_any_word_list(loaded, text_file, tmp_path):
    """bilm-tf's own test builds its cache from the sentence words plus <S> and </S>: no <UNK>, any order."""
    path, lines = text_file
    words = sorted({w for line in lines for w in line.split()} - {"<S>", "</S>", "<UNK>"})
    listed = tmp_path / "words.txt"
    listed.write_text("\n".join(words + ["</S>", "<S>"]) + "\n", encoding="utf-8")
    cache = tmp_path / "cache.hdf5"
    dump_token_embeddings(loaded, listed, cache)
    store = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)
    want = store.encode(["<S>", "</S>"]).numpy()  # the boundary character ids
    with h5py.File(cache) as f:
        assert f["embedding"].shape == (len(words) + 2, 64)
        np.testing.assert_allclose(f["embedding"][-1], want[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(f["embedding"][-2], want[1], atol=1e-5, rtol=0)
    _assert_cache_changes_nothing(loaded, path, cache, tmp_path)
    listed.write_text("cat\nthe dog\n", encoding="utf-8")
    with pytest.raises(ElmoError, match="words.txt:2: expected one word per line"):
        dump_token_embeddings(loaded, listed, tmp_path / "bad.hdf5")


def test_token_cache_rows_are_used(loaded, tmp_path):
    """A cache row is taken as is: a doctored row changes layer 0 of exactly that token."""
    store = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)
    emb = store.encode(["<S>", "</S>", "cat"]).numpy().copy()
    emb[2] = 7.0
    store.add_cache(["<S>", "</S>", "cat"], emb)
    layers, n, _ = embed_batch(loaded.model, store, [["the", "cat"]])
    layers = layers.numpy()
    assert np.all(layers[0, 0, 2] == 7.0) and not np.any(layers[0, 0, 1] == 7.0)


@pytest.mark.parametrize("batch_size, window_batches", [(2, 100), (3, 1)])
def test_stateful_dump_carries_each_rows_state_as_bilm_tf(loaded, text_file, tmp_path, batch_size, window_batches):
    """--stateful against the stream computed independently (tests/lstm_stream.py, float64, one row at a time, no
    batching): line i, an empty one as ``<S> </S>``, runs in row i % batch_size from the final states, per
    direction, of line i - batch_size. The input has empty lines, and a 120-token line whose batch partner is 5
    tokens long (padding must not move that partner's state); window_batches=1 carries the state across windows."""
    path, lines = text_file
    warnings = []
    dump_embeddings(loaded, path, tmp_path / "s.hdf5", stateful=True, batch_size=batch_size,
                    window_batches=window_batches, on_warning=warnings.append)
    assert len(warnings) == 1 and "--stateful" in warnings[0]
    got, _ = _read(tmp_path / "s.hdf5")
    assert sorted(got, key=int) == [str(i) for i in range(len(lines))]
    lstm = Float64BiLSTM(REFERENCE / "weights.hdf5", json.loads((REFERENCE / "options.json").read_text())["lstm"])
    encoder = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)  # layer 0, checked against allennlp
    worst = 0.0
    for row in row_streams(len(lines), batch_size):
        forward_state, backward_state = lstm.zero_states(), lstm.zero_states()
        for i in row:
            x = encoder.encode(["<S>", *lines[i].split(), "</S>"]).double().numpy()  # (n + 2, P)
            fwd, forward_state = lstm.run(0, x, forward_state)
            bwd, backward_state = lstm.run(1, x[::-1], backward_state)
            want = np.stack([np.concatenate([x, x], 1)] +
                            [np.concatenate([f, b[::-1]], 1) for f, b in zip(fwd, bwd)])[:, 1:-1]
            assert got[str(i)].shape == want.shape
            if want.size:
                worst = max(worst, float(np.abs(got[str(i)] - want).max()))
    assert worst < 1e-5  # measured 1.8e-6 (batch 2) and 2.2e-6 (batch 3)
    # Not vacuous: the carried states move the later lines far more than that (the first batch starts from zero).
    dump_embeddings(loaded, path, tmp_path / "p.hdf5", batch_size=batch_size)
    stateless, _ = _read(tmp_path / "p.hdf5")
    np.testing.assert_allclose(got["0"], stateless["0"], atol=1e-5, rtol=0)
    assert min(np.abs(got[k] - stateless[k]).max() for k in got if int(k) >= batch_size and got[k].size) > 1e-3


def test_interrupted_dump_resumes_to_the_same_file(loaded, text_file, tmp_path):
    path, lines = text_file
    out = tmp_path / "o.hdf5"

    class Stop(Exception):
        pass

    def stop_after(n):
        def cb(p: DumpProgress):
            if p.lines >= n:
                raise Stop
        return cb

    with pytest.raises(Stop):
        dump_embeddings(loaded, path, out, batch_size=2, window_batches=2, on_progress=stop_after(10))
    partial = h5dump.partial_path(out)
    assert not out.exists() and partial.exists()
    with h5py.File(partial) as f:
        completed = int(f.attrs[h5dump.COMPLETED_ATTR])
        assert 0 < completed < len(lines)
        assert any(int(k) >= completed for k in f.keys())  # a window was half written when it stopped
    result = dump_embeddings(loaded, path, out, batch_size=2, window_batches=2, resume=True)
    assert result.resumed_from == completed and out.exists() and not partial.exists()
    dump_embeddings(loaded, path, tmp_path / "ref.hdf5")
    got, got_index = _read(out)
    want, want_index = _read(tmp_path / "ref.hdf5")
    assert got_index == want_index and sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-5, rtol=0)
    with h5py.File(out) as f:
        assert h5dump.COMPLETED_ATTR not in f.attrs and h5dump.SETTINGS_ATTR not in f.attrs


def test_interrupted_stateful_dump_resumes_with_its_carried_states(loaded, text_file, tmp_path):
    """--resume of a --stateful dump goes on from the states each row had reached at the last complete window: the
    file equals an uninterrupted dump's (it used to restart every row from zero state, silently)."""
    path, lines = text_file
    out = tmp_path / "o.hdf5"

    class Stop(Exception):
        pass

    def stop(p: DumpProgress):
        if p.lines >= 10:
            raise Stop

    args = dict(stateful=True, batch_size=2, window_batches=2)
    with pytest.raises(Stop):
        dump_embeddings(loaded, path, out, on_progress=stop, **args)
    # A partial file without the states (as one written before they were kept) is refused, not restarted from zero.
    older = h5dump.partial_path(tmp_path / "older.hdf5")
    shutil.copy(h5dump.partial_path(out), older)
    with h5py.File(older, "a") as f:
        del f[h5dump.STATES_GROUP]
    with pytest.raises(ElmoError, match="cannot resume this --stateful dump: .* LSTM states carried past line 8"):
        dump_embeddings(loaded, path, tmp_path / "older.hdf5", resume=True, **args)
    result = dump_embeddings(loaded, path, out, resume=True, **args)
    assert result.resumed_from == 8  # two windows of 2 x 2 lines
    dump_embeddings(loaded, path, tmp_path / "straight.hdf5", **args)
    got, got_index = _read(out)
    want, want_index = _read(tmp_path / "straight.hdf5")
    assert got_index == want_index and sorted(got) == sorted(want) == sorted(str(i) for i in range(len(lines)))
    for k in want:
        np.testing.assert_allclose(got[k], want[k], atol=1e-6, rtol=0, err_msg=k)
    with h5py.File(out) as f:  # no bookkeeping left in the finished file
        assert set(f.keys()) == set(want) | {"sentence_to_index"} and not f.attrs.keys()


def test_stateful_refused_under_torchrun(loaded, text_file, tmp_path, monkeypatch):
    """Under torchrun each process would carry state through its own share of the lines (i % world == rank), so
    the vectors depended on the number of processes (up to 3.5 apart from a one-process --stateful dump at
    2 processes, batch 2); refused before any file is written or process group joined."""
    path, _ = text_file
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ElmoError, match="run a stateful dump as one process"):
        dump_embeddings(loaded, path, tmp_path / "o.hdf5", stateful=True)
    assert list(tmp_path.iterdir()) == [path]


def test_resume_refuses_other_settings(loaded, text_file, tmp_path):
    path, _ = text_file
    out = tmp_path / "o.hdf5"

    def stop(p):
        if p.lines > 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dump_embeddings(loaded, path, out, batch_size=2, window_batches=1, on_progress=stop)
    with pytest.raises(ElmoError, match="layers"):
        dump_embeddings(loaded, path, out, batch_size=2, layers="top", resume=True)
    assert not out.exists()


def test_invalid_utf8_leaves_no_output(loaded, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine line\nbad \xff byte\n")
    out = tmp_path / "o.hdf5"
    with pytest.raises(ElmoError, match=r"bad.txt:2: invalid UTF-8 at byte offset 4"):
        dump_embeddings(loaded, path, out)
    assert not out.exists()


def test_char_cnn_alone_equals_together(loaded):
    """The encoder cuts its windows at the longest token of its input: a token alone and in a batch of tokens of
    every length up to past the 48-byte cut get the same vector."""
    from elmo_cli.model import to_model_chars

    chars = loaded.text.chars
    tokens = ["<S>", "</S>", "a", "of", "naïve", "北京", "🙂", "x" * 44, "x" * 45, "y" * 47, "z" * 48, "w" * 60,
              "é" * 24, "東" * 17, "<UNK>", "tab\there"]
    ids = to_model_chars(chars.encode_tokens(tokens))
    with torch.no_grad():
        together = loaded.model.encoder(ids)
        for k in range(len(tokens)):
            torch.testing.assert_close(loaded.model.encoder(ids[k : k + 1]), together[k : k + 1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("boundaries", [False, True])
def test_batched_directions_equal_bilm_embed(loaded, boundaries):
    from elmo_cli.model.lstm import BiLSTMKernel

    torch.manual_seed(0)
    B, T, P = 4, 7, 64
    x = torch.randn(B, T, P) * 3  # large inputs so that cell and projection clipping fire
    lengths = torch.tensor([7, 2, 5, 3])
    if boundaries:  # every row <S> .. </S>: the kernel computes the first step once for all rows
        start, end = torch.randn(P) * 3, torch.randn(P) * 3
        for b, n in enumerate(lengths.tolist()):
            x[b, 0], x[b, n - 1] = start, end
    with torch.no_grad():
        want, _ = loaded.model.embed(torch.empty(B, T, 0, dtype=torch.long), lengths, token_embeddings=x)
        got = BiLSTMKernel(loaded.model.forward_lstm, loaded.model.backward_lstm)(x, lengths)
    assert got.shape == want.shape == (3, B, T, 128)
    for b, n in enumerate(lengths.tolist()):  # the boundary positions 0 and n-1 are never dumped
        torch.testing.assert_close(got[:, b, 1 : n - 1], want[:, b, 1 : n - 1], atol=1e-5, rtol=0)


def test_slice_states_cuts_and_pads_with_zeros():
    from elmo_cli.model.lstm import fit_both as slice_states

    h, c = torch.ones(2, 3), torch.ones(2, 5)
    states = ([(h, c)], [(h, c)])
    small = slice_states(states, 1)
    assert small[0][0][0].shape == (1, 3) and small[1][0][1].shape == (1, 5)
    big = slice_states(states, 4)
    assert big[0][0][0].shape == (4, 3) and big[0][0][0][:2].eq(1).all() and big[0][0][0][2:].eq(0).all()


def test_sentence_keys_resume_to_the_same_file(loaded, tmp_path):
    lines = [f"sentence {k % 7} of the input" for k in range(20)]  # 7 distinct sentences, repeated
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "o.hdf5"

    def stop(p: DumpProgress):
        if p.lines >= 9:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dump_embeddings(loaded, path, out, batch_size=2, window_batches=2, sentence_keys=True, on_progress=stop)
    with h5py.File(h5dump.partial_path(out)) as f:  # the partial file keeps index names and bookkeeping
        assert 0 < f.attrs[h5dump.COMPLETED_ATTR] < len(lines) and list(f.keys()) == [h5dump.LINES_GROUP]
    with pytest.raises(ElmoError, match="sentence_keys"):
        dump_embeddings(loaded, path, out, batch_size=2, window_batches=2, resume=True)
    result = dump_embeddings(loaded, path, out, batch_size=2, window_batches=2, sentence_keys=True, resume=True)
    assert result.resumed_from > 0 and result.repeats == 13 and not h5dump.partial_path(out).exists()
    dump_embeddings(loaded, path, tmp_path / "ref.hdf5")
    want, _ = _read(tmp_path / "ref.hdf5")
    with h5py.File(out) as f:
        assert list(f.keys()) == lines[:7] and not f.attrs.keys()
        for i, line in enumerate(lines):
            np.testing.assert_allclose(f[line][...], want[str(i)], atol=1e-5, rtol=0)


def test_sentence_keys_bad_line_on_stdin_leaves_no_partial_file(loaded, tmp_path, monkeypatch):
    import io
    import sys

    text = "".join(f"line {k}\n" for k in range(6)) + "either/or\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    out = tmp_path / "o.hdf5"
    with pytest.raises(ElmoError, match="<stdin>:7: the sentence contains '/'"):
        dump_embeddings(loaded, Path("-"), out, batch_size=2, window_batches=1, sentence_keys=True)
    assert list(tmp_path.iterdir()) == []

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import vocab.shards as shards_module
from vocab.errors import ElmoError
from vocab.shards import ShardDataset, write_shards
from vocab.vocabulary import Vocabulary, build_vocab, train_sentencepiece


def make_corpus(path: Path, n: int = 600, seed: int = 1) -> list[str]:
    """Random sentences over a Zipf-ish vocabulary, some blank lines, a few non-ASCII and long tokens."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(300)] + ["café", "北京", "y" * 55, "<S>", "</S>"]
    p = 1.0 / np.arange(1, len(words) + 1)
    lines = []
    for i in range(n):
        lines.append(" ".join(rng.choice(words, rng.integers(1, 15), p=p / p.sum())))
        if i % 97 == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [line for line in lines if line.split()]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    sentences = make_corpus(path)
    vocab_path = tmp_path / "vocab.txt"
    build_vocab(path, vocab_path, max_size=200)  # leaves some tokens out of the vocabulary
    return path, vocab_path, sentences


def decode_bytes(chars_rows: np.ndarray) -> list[str]:
    """Inverse of byte-mode encoding for tokens of at most 48 bytes (an independent check of the char table)."""
    out = []
    for row in chars_rows.tolist():
        if row[1] in (256, 257) and row[2] == 259:
            out.append("<S>" if row[1] == 256 else "</S>")
            continue
        end = row.index(259)
        out.append(bytes(row[1:end]).decode("utf-8", "replace"))
    return out


def test_manifest_counts_and_content(tmp_path, corpus):
    path, vocab_path, sentences = corpus
    summary = write_shards(path, vocab_path, tmp_path / "out", tokens_per_shard=1000)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    vocab = Vocabulary.load(vocab_path)
    n_tokens = sum(len(s.split()) for s in sentences)
    oov = sum(1 for s in sentences for t in s.split() if t not in vocab)
    assert m["format_version"] == 1 and m["vocab_sha256"] == vocab.sha256 and m["chars"] == "bytes"
    assert (m["total_sentences"], m["total_tokens"], m["oov_tokens"]) == (len(sentences), n_tokens, oov)
    assert m["blank_lines"] == 7 and m["max_characters_per_token"] == 50
    assert len(m["shards"]) == summary.shards == -(-n_tokens // 1000) > 1
    assert sum(s["tokens"] for s in m["shards"]) == n_tokens
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"manifest.json", "vocab.txt", "chars.json"}
    assert not (tmp_path / "out" / ".tmp-shard").exists()

    ds = ShardDataset(tmp_path / "out")
    assert (len(ds), ds.num_sentences, ds.total_tokens) == (len(sentences), len(sentences), n_tokens)
    got = []
    for i in range(len(ds)):
        ids, chars = ds.sentence(i)
        assert ids.dtype == np.int32 and chars.dtype == np.uint16 and chars.shape == (len(ids), 50)
        tokens = decode_bytes(chars)
        assert ids.tolist() == [vocab.id_of(t) if len(t) < 48 else vocab.unk_id for t in tokens]
        got.append(" ".join(tokens))
    expected = [" ".join(t if len(t) <= 48 else t[:48] for t in s.split()) for s in sentences]
    assert Counter(got) == Counter(expected)  # the same sentences ...
    assert got != expected  # ... shuffled
    streamed = [(a.tolist(), b.tolist()) for a, b in ds.iter_sentences()]
    assert streamed == [(a.tolist(), b.tolist()) for a, b in (ds.sentence(i) for i in range(len(ds)))]
    assert ds.sentence_lengths().sum() == n_tokens
    with pytest.raises(IndexError):
        ds.sentence(len(ds))


def test_shuffle_is_global_and_chunks(tmp_path, corpus):
    path, vocab_path, sentences = corpus
    write_shards(path, vocab_path, tmp_path / "out", tokens_per_shard=1000, seed=3)
    ds = ShardDataset(tmp_path / "out", verify=False)
    # the first shard holds sentences from all over the corpus, not just the beginning
    first_shard = {" ".join(decode_bytes(ds.sentence(i)[1])) for i in range(ds.shards[0]["sentences"])}
    positions = [i for i, s in enumerate(sentences) if s in first_shard]
    assert max(positions) > len(sentences) * 0.8 and min(positions) < len(sentences) * 0.2
    chunks = list(ds.iter_chunks(64))
    assert all(len(a) == 64 for a, _ in chunks[:-1])
    stream = np.concatenate([a for a, _ in chunks])
    assert len(stream) == ds.total_tokens + 2 * len(ds)
    assert stream[0] == ds.vocab.bos_id and stream[-1] == ds.vocab.eos_id
    assert np.concatenate([c for _, c in chunks])[0, 1] == 256


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_deterministic_and_workers(tmp_path, corpus):
    path, vocab_path, _ = corpus
    write_shards(path, vocab_path, tmp_path / "a", tokens_per_shard=700, seed=5)
    write_shards(path, vocab_path, tmp_path / "b", tokens_per_shard=700, seed=5)
    write_shards(path, vocab_path, tmp_path / "c", tokens_per_shard=700, seed=5, workers=2)
    write_shards(path, vocab_path, tmp_path / "d", tokens_per_shard=700, seed=6)
    a = files_of(tmp_path / "a")
    assert len(a) > 12
    assert a == files_of(tmp_path / "b") == files_of(tmp_path / "c")
    assert a != files_of(tmp_path / "d")


def test_codepoint_mode(tmp_path):
    corpus = tmp_path / "zh.txt"
    corpus.write_text("北京 欢迎 你\n长长长长长长长长长长长长长长长长长长长长 北京\n", encoding="utf-8")
    build_vocab(corpus, tmp_path / "v.txt")
    write_shards(corpus, tmp_path / "v.txt", tmp_path / "out", chars="codepoint", max_chars_vocab=3)
    ds = ShardDataset(tmp_path / "out")
    assert ds.manifest["chars"] == "codepoint" and ds.chars.mode == "codepoint"
    assert ds.chars.characters == ["长", "京", "北"]  # 20, 2, 2 occurrences; ties by code point
    assert ds.manifest["n_characters"] == 3 + 1 + 5
    rows = {tuple(c[1:4]) for _, c in ds.iter_sentences() for c in c.tolist()}
    fb, eow = ds.chars.fallback_char, ds.chars.eow_char
    assert (2, 1, eow) in rows  # 北京
    assert (fb, fb, eow) in rows  # 欢迎: neither kept
    assert (0, 0, 0) in rows  # 长 x20: whole characters, not bytes


def test_held_out_shards_reuse_the_training_character_table(tmp_path):
    """A codepoint table is built from the training corpus; held-out shards take it (`--chars TRAIN_SHARDS`) so that
    `train --validation` accepts them, and unseen characters take the fallback id."""
    train, held = tmp_path / "train.txt", tmp_path / "held.txt"
    train.write_text("北京 欢迎 你\n长长 北京\n", encoding="utf-8")
    held.write_text("上海 欢迎 你\n", encoding="utf-8")
    build_vocab(train, tmp_path / "v.txt")
    write_shards(train, tmp_path / "v.txt", tmp_path / "train", chars="codepoint")
    write_shards(held, tmp_path / "v.txt", tmp_path / "own", chars="codepoint")
    write_shards(held, tmp_path / "v.txt", tmp_path / "held", chars=str(tmp_path / "train"))
    table = (tmp_path / "train" / "chars.json").read_bytes()
    assert (tmp_path / "held" / "chars.json").read_bytes() == table != (tmp_path / "own" / "chars.json").read_bytes()
    ds = ShardDataset(tmp_path / "held")
    first = [c.tolist() for _, c in ds.iter_sentences()][0][0]
    assert first[1:3] == [ds.chars.fallback_char] * 2  # 上海: neither character is in the training table
    with pytest.raises(ElmoError, match="--chars .*whose character table to reuse"):
        write_shards(held, tmp_path / "v.txt", tmp_path / "x", chars=str(tmp_path / "nowhere"))
    assert not (tmp_path / "x").exists()


def test_sentencepiece_shards(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join(["the river runs to the sea", "the moon over the river", "wind and sea"] * 40) + "\n")
    train_sentencepiece(raw, tmp_path / "vocab.txt", vocab_size=30)
    write_shards(raw, tmp_path / "vocab.txt", tmp_path / "out")
    assert (tmp_path / "out" / "spm.model").read_bytes() == (tmp_path / "vocab.spm.model").read_bytes()
    ds = ShardDataset(tmp_path / "out")
    assert ds.manifest["tokenizer"] == "sentencepiece" and ds.encoder.tokenizer == "sentencepiece"
    pieces = ds.encoder.tokenize("the river runs to the sea")
    assert pieces[0].startswith("\u2581") and ds.total_tokens > 120 * 3
    ids, _ = ds.sentence(0)
    text = "".join(ds.vocab.tokens[i] for i in ids.tolist()).replace("\u2581", " ").strip()
    assert text in {"the river runs to the sea", "the moon over the river", "wind and sea"}


def test_reader_errors(tmp_path, corpus):
    path, vocab_path, _ = corpus
    out = tmp_path / "out"
    write_shards(path, vocab_path, out, tokens_per_shard=1000)
    m = json.loads((out / "manifest.json").read_text())
    victim = out / m["shards"][1]["files"]["char_table"]["path"]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(ElmoError, match=r"shard-00001/char_table.npy: sha256 does not match"):
        ShardDataset(out)
    ShardDataset(out, verify=False)  # opt out of the check
    victim.unlink()
    with pytest.raises(ElmoError, match=r"shard-00001/char_table.npy: shard file missing"):
        ShardDataset(out, verify=False)
    (out / "manifest.json").write_text("{\"format_version\": 1")
    with pytest.raises(ElmoError, match="manifest.json: corrupt manifest"):
        ShardDataset(out)
    (out / "manifest.json").unlink()
    with pytest.raises(ElmoError, match="manifest.json: missing"):
        ShardDataset(out)


def test_check_vocab(tmp_path, corpus):
    path, vocab_path, _ = corpus
    write_shards(path, vocab_path, tmp_path / "out")
    ds = ShardDataset(tmp_path / "out")
    ds.check_vocab(Vocabulary.load(vocab_path))
    with pytest.raises(ElmoError, match="vocabulary sha256"):
        ds.check_vocab(Vocabulary(["<S>", "</S>", "<UNK>", "other"]))


def test_interrupted_shard_leaves_no_manifest(tmp_path, corpus, monkeypatch):
    path, vocab_path, _ = corpus

    def boom(job, encoder):
        raise KeyboardInterrupt

    monkeypatch.setattr(shards_module, "_encode_bucket", boom)
    (tmp_path / "out").mkdir()
    with pytest.raises(KeyboardInterrupt):
        write_shards(path, vocab_path, tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "out" / ".tmp-shard").exists()
    with pytest.raises(ElmoError, match="manifest.json: missing"):
        ShardDataset(tmp_path / "out")


def test_force_and_non_empty_output(tmp_path, corpus):
    path, vocab_path, _ = corpus
    write_shards(path, vocab_path, tmp_path / "out", tokens_per_shard=500)
    with pytest.raises(ElmoError, match="out: output directory is not empty; pass --force"):
        write_shards(path, vocab_path, tmp_path / "out")
    (tmp_path / "out" / "notes.md").write_text("mine")
    write_shards(path, vocab_path, tmp_path / "out", force=True)
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert names == {"manifest.json", "vocab.txt", "chars.json", "notes.md", "shard-00000"}
    assert len(ShardDataset(tmp_path / "out").shards) == 1


def test_empty_corpus_writes_nothing(tmp_path, corpus):
    _, vocab_path, _ = corpus
    (tmp_path / "blank.txt").write_text("\n \n\t\n")
    with pytest.raises(ElmoError, match=r"blank.txt: corpus is empty \(3 blank lines"):
        write_shards(tmp_path / "blank.txt", vocab_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # created by the failed run, so removed again
    (tmp_path / "given").mkdir()
    with pytest.raises(ElmoError, match="corpus is empty"):
        write_shards(tmp_path / "blank.txt", vocab_path, tmp_path / "given")
    assert (tmp_path / "given").is_dir() and not any((tmp_path / "given").iterdir())

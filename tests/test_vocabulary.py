import subprocess
import sys

import numpy as np
import pytest

from vocab.errors import ElmoError
from vocab.vocabulary import Vocabulary, build_vocab, rank_counts, spm_path_for, train_sentencepiece


def test_build_vocab_hand_computed(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("b a b\n\n  \nc a b é Z\n" + "x" * 60 + "\n")
    out = tmp_path / "vocab.txt"
    stats = build_vocab([corpus], out)
    # b:3, a:2, then count 1 ties by UTF-8 bytes: "Z" (0x5a) < "c" < "x..." < "é" (0xc3 0xa9)
    assert out.read_text().split("\n") == ["<S>", "</S>", "<UNK>", "b", "a", "Z", "c", "x" * 60, "é", ""]
    assert (stats.lines, stats.blank_lines, stats.tokens, stats.types) == (3, 2, 9, 6)
    assert (stats.vocab_size, stats.kept_types, stats.coverage) == (9, 6, 1.0)
    assert (stats.truncated_tokens, stats.truncated_types) == (1, 1)
    assert stats.softmax_bytes == 9 * 513 * 4
    counts = (tmp_path / "vocab.txt.counts.tsv").read_text().splitlines()
    assert counts[:5] == ["<S>\t0", "</S>\t0", "<UNK>\t0", "b\t3", "a\t2"]


def test_min_count_max_size_and_literal_specials(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a a a b b c <UNK> <S>\n")
    out = tmp_path / "v.txt"
    stats = build_vocab(corpus, out, min_count=2)
    assert Vocabulary.load(out).tokens == ["<S>", "</S>", "<UNK>", "a", "b"]
    assert stats.covered_tokens == 5 + 2 and stats.oov_rate == pytest.approx(1 / 8)  # literal <S>, <UNK> in vocab
    stats = build_vocab(corpus, out, max_size=4)
    assert Vocabulary.load(out).tokens == ["<S>", "</S>", "<UNK>", "a"]
    # cut types are listed after the vocabulary lines
    assert (tmp_path / "v.txt.counts.tsv").read_text().splitlines()[4:] == ["b\t2", "c\t1"]
    with pytest.raises(ElmoError, match="--max-size"):
        build_vocab(corpus, out, max_size=2)


def test_empty_corpus(tmp_path):
    corpus = tmp_path / "empty.txt"
    corpus.write_text("\n  \n")
    with pytest.raises(ElmoError, match=r"empty.txt: corpus is empty \(2 blank lines"):
        build_vocab(corpus, tmp_path / "v.txt")
    assert not (tmp_path / "v.txt").exists()


def test_rank_counts_ties_by_bytes():
    assert [t for t, _ in rank_counts({"b": 2, "a": 2, "c": 5, "É": 2, "Z": 2})] == ["c", "Z", "a", "b", "É"]


def test_vocabulary_api(tmp_path):
    v = Vocabulary(["<S>", "</S>", "<UNK>", "the", "cat"])
    assert (len(v), v.bos_id, v.eos_id, v.unk_id, v.id_of("cat"), v.id_of("dog")) == (5, 0, 1, 2, 4, 2)
    ids = v.encode(["the", "dog", "cat"])
    assert ids.dtype == np.int32 and ids.tolist() == [3, 2, 4]
    v.save(tmp_path / "v.txt")
    assert (tmp_path / "v.txt").read_bytes() == b"<S>\n</S>\n<UNK>\nthe\ncat\n"
    # CRLF and BOM are the same vocabulary
    (tmp_path / "w.txt").write_bytes(b"\xef\xbb\xbf<S>\r\n</S>\r\n<UNK>\r\nthe\r\ncat")
    w = Vocabulary.load(tmp_path / "w.txt")
    assert w.tokens == v.tokens and w.sha256 == v.sha256 == Vocabulary.load(tmp_path / "v.txt").sha256


@pytest.mark.parametrize(
    "content, message",
    [
        ("<S>\n</S>\nthe\n", r"v.txt:1: missing special token\(s\) <UNK>"),
        ("the\ncat\n", r"v.txt:1: missing special token\(s\) <S>, </S>, <UNK>"),
        ("<S>\n</S>\n<UNK>\nthe\ncat\nthe\n", r"v.txt:6: duplicate token 'the' \(first on line 4\)"),
        ("<S>\n</S>\n\n<UNK>\n", r"v.txt:3: empty line"),
        ("<S>\n</S>\n<UNK>\na b\n", r"v.txt:4: token 'a b' contains whitespace"),
        ("", r"v.txt: vocabulary file is empty"),
    ],
)
def test_vocabulary_load_errors(tmp_path, content, message):
    (tmp_path / "v.txt").write_text(content)
    with pytest.raises(ElmoError, match=message):
        Vocabulary.load(tmp_path / "v.txt")


def test_vocabulary_missing_file(tmp_path):
    with pytest.raises(ElmoError, match="nope.txt: vocabulary file not found"):
        Vocabulary.load(tmp_path / "nope.txt")


def _raw_corpus(path):
    words = ["river", "mountain", "cloud", "moon", "wind", "flower", "spring", "autumn", "night", "light"]
    rng = np.random.default_rng(0)
    path.write_text("\n".join(" ".join(rng.choice(words, 8)) + "." for _ in range(300)) + "\n")


def test_sentencepiece_deterministic_specials_first(tmp_path):
    corpus = tmp_path / "raw.txt"
    _raw_corpus(corpus)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = train_sentencepiece(corpus, tmp_path / "a" / "vocab.txt", vocab_size=40)
    b = train_sentencepiece(corpus, tmp_path / "b" / "vocab.txt", vocab_size=40)
    assert a.spm_model_path == spm_path_for(tmp_path / "a" / "vocab.txt") == tmp_path / "a" / "vocab.spm.model"
    assert a.spm_model_path.read_bytes() == b.spm_model_path.read_bytes()
    assert (tmp_path / "a" / "vocab.txt").read_bytes() == (tmp_path / "b" / "vocab.txt").read_bytes()
    v = Vocabulary.load(tmp_path / "a" / "vocab.txt")
    assert v.tokens[:3] == ["<S>", "</S>", "<UNK>"] and len(v) == a.vocab_size <= 40
    assert a.lines == 300 and a.tokens > 300 and a.coverage == 1.0


def test_sentencepiece_bad_model_type(tmp_path):
    corpus = tmp_path / "raw.txt"
    _raw_corpus(corpus)
    with pytest.raises(ElmoError, match="model-type"):
        train_sentencepiece(corpus, tmp_path / "v.txt", vocab_size=40, model_type="word2")


def test_vocab_package_does_not_import_torch():
    code = "import sys, vocab.vocabulary, vocab.shards, vocab.tokenize, vocab.text, vocab.chars; " \
           "print('torch' in sys.modules, 'elmo_cli' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]

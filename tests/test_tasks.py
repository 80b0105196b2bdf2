"""elmo_cli.tasks formats and metrics: readers on hand-written fixtures, conlleval span F1 on hand-computed cases."""
from pathlib import Path

import pytest

from elmo_cli.tasks import formats
from elmo_cli.tasks.formats import Example
from elmo_cli.tasks.vectors import read_vectors
from elmo_cli.tasks.metrics import (chunks, classification_metrics, detect_scheme, per_label_f1, span_f1,
                                    tagging_metrics)
from vocab.errors import ElmoError

FIX = Path(__file__).parent / "fixtures" / "tasks"


# ---- readers --------------------------------------------------------------------------------------------------------
def test_conll_reads_last_column_skips_docstart_and_mixes_tabs_and_spaces():
    ex = formats.read_examples(FIX / "ner.conll", "tagging")
    assert [e.tokens for e in ex] == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"]]
    assert [e.labels for e in ex] == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"]]
    assert ex[0].where.endswith("ner.conll:3") and ex[1].where.endswith("ner.conll:10")
    assert formats.detect_format(FIX / "ner.conll", "tagging") == "conll"


def test_conllu_skips_comments_ranges_and_empty_nodes():
    ex = formats.read_examples(FIX / "tiny.conllu", "tagging")
    assert formats.detect_format(FIX / "tiny.conllu", "tagging") == "conllu"
    assert [e.tokens for e in ex] == [["I", "do", "n't", "know", "."], ["Hi", "#", "1"]]
    assert ex[0].labels == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
    assert ex[1].labels == ["INTJ", "SYM", "NUM"]
    assert formats.read_conllu(FIX / "tiny.conllu", "xpos")[0].labels == ["PRP", "VBP", "RB", "VB", "."]
    assert formats.read_conllu(FIX / "tiny.conllu", "DEPREL")[1].labels == ["root", "dep", "nummod"]


def test_tsv_reads_label_and_tokenized_text():
    ex = formats.read_examples(FIX / "tiny.tsv", "classification")
    assert [(e.labels, e.tokens) for e in ex] == [("pos", ["good", "film"]), ("neg", ["bad", "film", ",", "really"]),
                                                  ("pos", ["great"])]
    assert ex[2].where.endswith("tiny.tsv:4")
    upper = formats.read_tsv(FIX / "tiny.tsv", tokenize=lambda s: s.upper().split())
    assert upper[0].tokens == ["GOOD", "FILM"]


@pytest.mark.parametrize("name, kind, fmt, message", [
    ("one_column.conll", "tagging", "auto", "one_column.conll:2: expected at least 2 columns"),
    ("empty.conll", "tagging", "auto", "empty.conll: no sentences"),
    ("comments_only.conllu", "tagging", "conllu", "comments_only.conllu: no sentences"),
    ("short.conllu", "tagging", "conllu", "short.conllu:1: a CoNLL-U line has 10 tab-separated columns, got 8"),
    ("bad.tsv", "classification", "auto", "bad.tsv:2: expected label<TAB>text"),
    ("tiny.tsv", "tagging", "tsv", "does not fit --kind tagging"),
    ("missing.conll", "tagging", "auto", "missing.conll: no such file"),
])
def test_bad_input_is_one_line_naming_file_and_line(name, kind, fmt, message):
    with pytest.raises(ElmoError) as e:
        formats.read_examples(FIX / name, kind, fmt)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unknown_label_column():
    with pytest.raises(ElmoError, match="--label-column 'pos'.*upos, xpos"):
        formats.read_conllu(FIX / "tiny.conllu", "pos")


def test_predict_input_detection(tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("the cat sat\n\nhello world .\n")
    assert formats.detect_predict_format(text, "tagging") == "text"
    assert [e.tokens for e in formats.read_unlabelled(text, "tagging")] == [["the", "cat", "sat"],
                                                                              ["hello", "world", "."]]
    assert formats.detect_predict_format(FIX / "ner.conll", "tagging") == "conll"
    assert formats.detect_predict_format(FIX / "tiny.conllu", "tagging") == "conllu"
    assert formats.detect_predict_format(FIX / "tiny.tsv", "classification") == "tsv"
    assert formats.read_unlabelled(FIX / "ner.conll", "tagging")[1].labels is None


def test_split_long_and_piece_counts():
    ex = [Example(list("abcde"), list("vwxyz")), Example(["p"], ["q"]), Example(list("abcd"), "L")]
    pieces, n = formats.split_long(ex, 2)
    assert n == 2
    assert [p.tokens for p in pieces] == [["a", "b"], ["c", "d"], ["e"], ["p"], ["a", "b"], ["c", "d"]]
    assert [p.labels for p in pieces] == [["v", "w"], ["x", "y"], ["z"], ["q"], "L", "L"]
    assert formats.piece_counts(ex, 2) == [3, 1, 2]


def test_writers():
    assert formats.format_tagged([(["a", "b"], ["X", "Y"]), (["c"], ["Z"])]) == "a\tX\nb\tY\n\nc\tZ\n\n"
    assert formats.format_classified([("pos", ["good", "film"])]) == "pos\tgood film\n"


# ---- conlleval span F1 ----------------------------------------------------------------------------------------------
def test_chunks_bio_boundaries():
    assert chunks(["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"]) == [(0, 2, "PER"), (3, 4, "LOC"), (4, 6, "LOC")]
    assert chunks(["B-PER", "I-LOC"]) == [(0, 1, "PER"), (1, 2, "LOC")]  # a type change ends and starts


def test_chunks_iob1_i_after_o_starts_a_chunk():
    assert chunks(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == [(0, 2, "PER"), (3, 4, "LOC"), (4, 5, "LOC")]


def test_chunk_cut_at_sentence_end():
    assert chunks(["O", "B-ORG", "I-ORG"]) == [(1, 3, "ORG")]
    # two sentences: the open chunk of the first does not run into the second
    r = span_f1([["O", "B-X"], ["I-X", "O"]], [["O", "B-X"], ["I-X", "O"]])
    assert (r["gold_chunks"], r["correct_chunks"], r["f1"]) == (2, 2, 1.0)


def test_chunks_bioes():
    assert chunks(["S-PER", "B-ORG", "I-ORG", "E-ORG", "S-PER", "S-PER", "O"]) == [
        (0, 1, "PER"), (1, 4, "ORG"), (4, 5, "PER"), (5, 6, "PER")]
    assert chunks(["B-X", "E-X", "E-X"]) == [(0, 2, "X"), (2, 3, "X")]  # conlleval: E after E starts a chunk
    assert chunks(["E-X", "B-X"]) == [(0, 1, "X"), (1, 2, "X")]


def test_labels_with_hyphens_keep_the_type():
    assert chunks(["B-ORG-GOV", "I-ORG-GOV"]) == [(0, 2, "ORG-GOV")]


def test_span_f1_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    guess = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-MISC"]]
    r = span_f1(gold, guess)
    # gold: PER(0,2) LOC(3,4) ORG(0,1) = 3; guess: PER(0,1) LOC ORG MISC = 4; correct: LOC, ORG = 2
    assert (r["gold_chunks"], r["found_chunks"], r["correct_chunks"]) == (3, 4, 2)
    assert r["precision"] == pytest.approx(0.5) and r["recall"] == pytest.approx(2 / 3)
    assert r["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_span_f1_iob1_against_bio_guess():
    # gold in IOB1: I-X after O opens a chunk; a guess in BIO with the same spans is fully correct
    r = span_f1([["O", "I-X", "I-X", "B-X"]], [["O", "B-X", "I-X", "B-X"]])
    assert (r["correct_chunks"], r["f1"]) == (2, 1.0)


def test_detect_scheme():
    assert detect_scheme({"O", "B-X", "I-X"}) == "BIO"
    assert detect_scheme({"O", "I-X"}) == "BIO"
    assert detect_scheme({"S-X", "B-Y", "E-Y", "O"}) == "BIOES"
    assert detect_scheme({"NOUN", "VERB"}) is None
    assert detect_scheme({"O"}) is None


def test_token_metrics():
    f1 = per_label_f1(["a", "a", "b"], ["a", "b", "b"])
    assert f1 == pytest.approx({"a": 2 / 3, "b": 2 / 3})
    m = classification_metrics(["a", "a", "b", "c"], ["a", "b", "b", "b"])
    assert m["accuracy"] == 0.5
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0.5 + 0) / 3)
    t = tagging_metrics([["NOUN", "VERB"]], [["NOUN", "NOUN"]])
    assert t["accuracy"] == 0.5 and t["scheme"] is None and "span" not in t
    t = tagging_metrics([["B-X", "I-X"]], [["B-X", "I-X"]])
    assert t["span"]["f1"] == 1.0 and t["scheme"] == "BIO"


# ---- word vectors ---------------------------------------------------------------------------------------------------
def test_word_vectors_glove_and_word2vec(tmp_path):
    glove = tmp_path / "g.txt"
    glove.write_text("the 0.1 0.2\ncat 1 2\ndog 3 4\n")
    dim, found = read_vectors(glove, {"cat", "zebra"})
    assert dim == 2 and list(found) == ["cat"] and found["cat"].tolist() == [1.0, 2.0]
    w2v = tmp_path / "w.txt"
    w2v.write_text("2 3\ncat 1 2 3\ndog 4 5\n")
    with pytest.raises(ElmoError, match="w.txt:3: 2 values, but the first vector has 3"):
        read_vectors(w2v, {"cat"})

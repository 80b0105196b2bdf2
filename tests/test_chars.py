import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vocab.chars import ByteChars, CodepointChars, load_chars, read_chars, save_chars
from vocab.errors import ElmoError

REFERENCE = json.loads((Path(__file__).parent / "data" / "char_ids.json").read_text(encoding="utf-8"))["tokens"]


def test_reference_has_25_tokens():
    assert len(REFERENCE) == 25


@pytest.mark.parametrize("entry", REFERENCE, ids=lambda e: repr(e["token"])[:20])
def test_byte_chars_match_allennlp(entry):
    row = ByteChars().encode(entry["token"])
    assert row.dtype == np.uint16 and row.shape == (50,)
    assert row.tolist() == entry["raw_ids"]
    assert (row.astype(np.int64) + 1).tolist() == entry["allennlp_ids"]


def test_spec_examples():
    assert ByteChars(5).encode("thhhhh").tolist() == [258, 116, 104, 104, 259]
    bc = ByteChars()
    assert bc.encode("<S>")[:4].tolist() == [258, 256, 259, 260]
    assert bc.encode("</S>")[:4].tolist() == [258, 257, 259, 260]
    assert bc.encode("<UNK>")[:7].tolist() == [258, 60, 85, 78, 75, 62, 259]
    assert bc.n_characters == 261 and bc.pad_char == 260


def test_cached_rows_cannot_be_corrupted():
    bc = ByteChars()
    row = bc.encode("cat")
    with pytest.raises(ValueError):
        row[1] = 0
    batch = bc.encode_tokens(["cat", "cat"])
    batch[0, 1] = 0  # the stacked copy is writable and independent
    assert bc.encode("cat")[1] == ord("c")
    assert bc.encode_tokens([]).shape == (0, 50)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=80))
def test_byte_rows_property(token):
    assume(token not in ("<S>", "</S>"))
    row = ByteChars().encode(token).tolist()
    kept = list(token.encode("utf-8", "ignore")[:48])
    assert len(row) == 50
    assert row[0] == 258
    assert row[1 : 1 + len(kept)] == kept
    assert row[1 + len(kept)] == 259
    assert all(c == 260 for c in row[2 + len(kept) :])


def test_codepoint_hand_computed():
    cc = CodepointChars(["北", "京"])
    # ordinary ids 0, 1; fallback 2; specials 3..7
    assert (cc.n_base, cc.n_characters, cc.fallback_char) == (3, 8, 2)
    assert cc.encode("北京东")[:7].tolist() == [5, 0, 1, 2, 6, 7, 7]
    assert cc.encode("<S>")[:4].tolist() == [5, 3, 6, 7]
    assert cc.encode("</S>")[:4].tolist() == [5, 4, 6, 7]
    assert cc.encode_tokens(["北", "x"]).shape == (2, 50)


def test_codepoint_keeps_whole_characters():
    cc = CodepointChars(["长"])
    row = cc.encode("长" * 60).tolist()
    assert row[0] == cc.bow_char and row[1:49] == [0] * 48 and row[49] == cc.eow_char
    # byte mode would cut the 17th character of this token mid-character
    assert ByteChars().encode("长" * 17)[1:49].tolist() == list(("长" * 17).encode()[:48])


def test_codepoint_build_order_and_limit():
    cc = CodepointChars.build({"a": 5, "b": 5, "c": 9, "d": 1}, 2)
    assert cc.characters == ["c", "a"]
    assert cc.encode("dab")[1:4].tolist() == [2, 1, 2]
    with pytest.raises(ElmoError):
        CodepointChars.build({"a": 1}, 0)
    with pytest.raises(ElmoError):
        CodepointChars(["ab"])


@given(st.lists(st.characters(), unique=True, max_size=30), st.text(max_size=70))
@settings(max_examples=100, deadline=None)
def test_codepoint_rows_property(table, token):
    assume(token not in ("<S>", "</S>"))
    cc = CodepointChars(table)
    row = cc.encode(token).tolist()
    kept = [table.index(c) if c in table else len(table) for c in token[:48]]
    assert row[0] == cc.bow_char and row[1 : 1 + len(kept)] == kept and row[1 + len(kept)] == cc.eow_char
    assert all(c == cc.pad_char for c in row[2 + len(kept) :])


@pytest.mark.parametrize("chars", [ByteChars(), ByteChars(20), CodepointChars(["a", "é", "北"], 30)])
def test_chars_json_round_trip(tmp_path, chars):
    save_chars(chars, tmp_path / "chars.json")
    again = read_chars(tmp_path / "chars.json")
    assert type(again) is type(chars) and again.to_json() == chars.to_json()
    assert load_chars(chars.to_json()).encode("aé北x").tolist() == chars.encode("aé北x").tolist()


def test_load_chars_errors(tmp_path):
    with pytest.raises(ElmoError, match="unknown character mode"):
        load_chars({"mode": "words"})
    (tmp_path / "chars.json").write_text("{not json")
    with pytest.raises(ElmoError, match="chars.json"):
        read_chars(tmp_path / "chars.json")

"""Persistent sentence streams (bilm-tf's): pairs per sentence, continuity, exact restore, epochs, finite mode."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elmo_cli.data import IGNORE, SentenceStreams, steps_per_epoch
from vocab.errors import ElmoError
from vocab.shards import ShardDataset, write_shards
from vocab.vocabulary import build_vocab


@pytest.fixture
def small_shards(tmp_path: Path) -> ShardDataset:
    text = ["a b c", "d e", "f", "g h i j", "k l m", "n o"]
    (tmp_path / "c.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    build_vocab([tmp_path / "c.txt"], tmp_path / "vocab.txt")
    write_shards([tmp_path / "c.txt"], tmp_path / "vocab.txt", tmp_path / "shards", tokens_per_shard=6, seed=3)
    return ShardDataset(tmp_path / "shards")


def _words(ds: ShardDataset, ids) -> list[str]:
    return [ds.vocab.tokens[int(i)] for i in ids]


def _char_word(ds: ShardDataset, row: np.ndarray) -> str:
    """Decode one prediction-form char row back to its token (byte mode)."""
    raw = [int(c) - 1 for c in row if c > 0]
    if raw[1] == 256:
        return "<S>"
    if raw[1] == 257:
        return "</S>"
    return bytes(c for c in raw if c < 256).decode()


def test_pairs_of_one_sentence_both_directions(small_shards):
    ds = small_shards
    streams = SentenceStreams(ds, range(1), 1, seed=0, shuffle=False, finite=True)
    ids, _ = ds.sentence(0)
    words = _words(ds, ids)
    n = len(words)
    batch = streams.next_batch(n + 1)
    f_in = [_char_word(ds, r) for r in batch.fwd_chars[0].numpy()]
    b_in = [_char_word(ds, r) for r in batch.bwd_chars[0].numpy()]
    assert f_in == ["<S>"] + words
    assert _words(ds, batch.fwd_targets[0]) == words + ["</S>"]
    assert b_in == ["</S>"] + words[::-1]
    assert _words(ds, batch.bwd_targets[0]) == words[::-1] + ["<S>"]
    assert batch.n_tokens == n + 1


def test_rows_partition_each_epoch_and_roll_over(small_shards):
    ds = small_shards
    R, T = 2, 3
    streams = SentenceStreams(ds, range(R), R, seed=5)
    total_pairs = ds.total_tokens + ds.num_sentences  # n + 1 pairs per sentence
    seen_targets: list[list[str]] = [[], []]
    for _ in range(2 * total_pairs // (R * T) + 4):
        b = streams.next_batch(T)
        assert b.n_tokens == R * T and (b.fwd_targets != IGNORE).all()
        for r in range(R):
            seen_targets[r] += _words(ds, b.fwd_targets[r])
    perms = [np.random.default_rng([5, e]).permutation(ds.num_sentences) for e in range(4)]
    for r in range(R):
        expected = []
        for perm in perms:
            for sid in perm[r::R]:
                expected += _words(ds, ds.sentence(int(sid))[0]) + ["</S>"]
        assert seen_targets[r] == expected[: len(seen_targets[r])]
        assert len(seen_targets[r]) < len(expected)
    assert streams.state()[:, 0].min() >= 1


def test_state_restores_exactly(small_shards):
    ds = small_shards
    a = SentenceStreams(ds, [1, 2], 3, seed=1)
    for _ in range(5):
        a.next_batch(4)
    saved = a.state()
    expected = [a.next_batch(4) for _ in range(6)]
    b = SentenceStreams(ds, [1, 2], 3, seed=1)
    b.load_state(saved)
    for want in expected:
        got = b.next_batch(4)
        for name in ("fwd_chars", "fwd_targets", "bwd_chars", "bwd_targets"):
            assert np.array_equal(getattr(got, name).numpy(), getattr(want, name).numpy())
    with pytest.raises(ElmoError, match="rows"):
        b.load_state(np.zeros((3, 3), dtype=np.int64))


def test_finite_stream_pads_and_ends(small_shards):
    ds = small_shards
    s = SentenceStreams(ds, range(4), 4, shuffle=False, finite=True)
    n = 0
    while not s.exhausted:
        b = s.next_batch(5)
        n += b.n_tokens
        pad = b.fwd_targets == IGNORE
        assert (b.fwd_chars[pad] == 0).all() and (b.bwd_targets[pad] == IGNORE).all()
    assert n == ds.total_tokens + ds.num_sentences


def test_too_few_sentences_for_rows(small_shards):
    with pytest.raises(ElmoError, match="batch rows"):
        SentenceStreams(small_shards, range(10), 10)


def test_steps_per_epoch_as_bilm_tf():
    # bilm-tf's 1B Word Benchmark run: 768,648,884 tokens, batch 128, unroll 20, 3 GPUs -> 100,084 batches per
    # epoch (7,680 tokens per step; 100,084.49 rounded down)
    assert steps_per_epoch(768_648_884, 128, 20, 3) == 100_084
    assert steps_per_epoch(768_648_884, 128, 20) == 300_253
    assert steps_per_epoch(10, 128, 20) == 1

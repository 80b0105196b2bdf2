"""Torch-free corpus preparation: vocabulary, character ids, shard writing and reading.

Nothing here imports torch or `elmo_cli`, so corpus tools stay light and testable on their own.
"""
from vocab.chars import ByteChars, CodepointChars, load_chars
from vocab.errors import ElmoError
from vocab.shards import ShardDataset, write_shards
from vocab.text import read_lines
from vocab.tokenize import TextEncoder
from vocab.vocabulary import Vocabulary, build_vocab, train_sentencepiece

__all__ = [
    "ByteChars",
    "CodepointChars",
    "ElmoError",
    "ShardDataset",
    "TextEncoder",
    "Vocabulary",
    "build_vocab",
    "load_chars",
    "read_lines",
    "train_sentencepiece",
    "write_shards",
]

"""Torch-free corpus preparation: vocabulary, character ids, shard writing and reading.

Nothing here imports torch or `elmo_cli`, so corpus tools stay light and testable on their own.
"""
from vocab.errors import ElmoError

__all__ = ["ElmoError"]

"""elmo-cli: ELMo biLMs in PyTorch, compatible with bilm-tf and allennlp files.

    from elmo_cli import Embedder, ScalarMix

The public names are imported lazily, so ``import elmo_cli`` (and ``vocab``) stays light: torch is loaded only when
`Embedder` or `ScalarMix` is first touched. Importing it asks oneMKL for bitwise-repeatable products
(`elmo_cli.machine`), which takes effect when nothing in the process has multiplied matrices yet.
"""
from __future__ import annotations

from elmo_cli.machine import use_reproducible_blas

use_reproducible_blas()  # before torch's first matrix product: see elmo_cli/machine.py

__all__ = ["Embedder", "ScalarMix"]

_LAZY = {"Embedder": "elmo_cli.embed", "ScalarMix": "elmo_cli.model.scalar_mix"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'elmo_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

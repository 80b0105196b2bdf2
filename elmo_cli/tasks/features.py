"""ELMo features for a task model: the frozen biLM's layers, cached per distinct sentence, and their learned mix.

Shape letters: B batch rows, T timesteps (tokens of the longest sentence), L+1 biLM layers (the token layer and
L LSTM layers), 2P the width of every layer (``Embedder.dim``).

`LayerCache` runs the biLM once per distinct sentence (a token tuple) and keeps its layers `(L+1, n, 2P)`: in
memory (float32 or float16) up to ``max_bytes``, beyond that in a temporary HDF5 file of dump-embeddings' layout
(one dataset per sentence keyed by its 0-based index, ``sentence_to_index``). It can also read a precomputed
``elmo-cli dump-embeddings --layers all`` file, found by the sentence's tokens joined with single spaces (its
``sentence_to_index``). `ElmoFeatures` turns a batch of token lists into ``gamma * sum_k s_k * layer_k`` with
dropout, the representation a task model concatenates to its word embeddings.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import nn

from elmo_cli.layers import LayerSelection
from elmo_cli.model.scalar_mix import ScalarMix
from vocab.errors import ElmoError

Key = tuple[str, ...]
DTYPES = {"float32": np.float32, "float16": np.float16}
SENTENCE_INDEX = "sentence_to_index"  # the dump-embeddings layout (elmo_cli/h5dump.py's module docstring)


class LayerCache:
    """The biLM's layers of each distinct sentence, computed once.

    # Parameters
    embedder : `Embedder`, optional: computes what is not cached (None: only `precomputed` sentences exist).
    dtype : `str`, optional, (default = `"float32"`): ``float32`` or ``float16`` in memory and in the spill file.
    max_bytes : `int`, optional, (default = 2 GiB): memory for layers; later sentences go to a temporary HDF5 file.
    precomputed : `str | Path`, optional: an ``elmo-cli dump-embeddings --layers all`` file to read first.
    batch_size : `int`, optional, (default = `64`): sentences per biLM call.
    """

    def __init__(self, embedder=None, dtype: str = "float32", max_bytes: int = 2 << 30,
                 precomputed: str | Path | None = None, batch_size: int = 64, spill_dir: str | Path | None = None):
        if dtype not in DTYPES:
            raise ElmoError(f"cache dtype {dtype!r}: use float32 or float16")
        self.embedder, self.dtype, self.max_bytes, self.batch_size = embedder, DTYPES[dtype], max_bytes, batch_size
        self.memory: dict[Key, np.ndarray] = {}
        self.spilled: dict[Key, str] = {}
        self.bytes = 0
        self.bilm_seconds = self.bilm_cpu_seconds = 0.0  # wall and CPU time inside the biLM (filling the cache)
        self._spill, self._spill_path, self._spill_dir = None, None, spill_dir
        self._pre, self._pre_index = None, {}
        if precomputed is not None:
            self._open_precomputed(Path(precomputed))

    # ---- filling ----------------------------------------------------------------------------------------------------
    def fill(self, sentences: list[list[str]]) -> int:
        """Compute and keep the layers of every sentence not cached yet; returns how many were computed."""
        todo = list(dict.fromkeys(tuple(s) for s in sentences if tuple(s) not in self))
        from_file = [k for k in todo if " ".join(k) in self._pre_index]
        for key in from_file:
            self._put(key, self._read_precomputed(key))
        todo = [k for k in todo if " ".join(k) not in self._pre_index]
        if todo and self.embedder is None:
            raise ElmoError(f"sentence {' '.join(todo[0])[:60]!r} is not in the --embeddings file "
                            f"({self._pre.filename if self._pre else 'none given'}); give --model to embed it")
        for s in range(0, len(todo), 16 * self.batch_size):
            chunk = todo[s : s + 16 * self.batch_size]
            for key, layers in zip(chunk, self.embed([list(k) for k in chunk])):
                self._put(key, layers)
        return len(todo) + len(from_file)

    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """The biLM itself, no cache: one float32 `(L+1, n, 2P)` array per sentence (timed in `bilm_seconds`)."""
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            out = self.embedder.embed_sentences(sentences, batch_size=self.batch_size)
        self.bilm_seconds += time.perf_counter() - t0
        self.bilm_cpu_seconds += time.process_time() - c0
        return out

    def _put(self, key: Key, layers: np.ndarray) -> None:
        layers = layers.astype(self.dtype, copy=False)
        if self.bytes + layers.nbytes <= self.max_bytes:
            self.memory[key] = layers
            self.bytes += layers.nbytes
            return
        if self._spill is None:
            fd, name = tempfile.mkstemp(suffix=".hdf5", prefix="elmo-task-cache-", dir=self._spill_dir)
            os.close(fd)
            self._spill_path = Path(name)
            self._spill = h5py.File(name, "w")
        name = str(len(self.spilled))
        self._spill.create_dataset(name, data=layers)
        self.spilled[key] = name

    # ---- reading ----------------------------------------------------------------------------------------------------
    def __contains__(self, key: Key) -> bool:
        return key in self.memory or key in self.spilled

    def __len__(self) -> int:
        return len(self.memory) + len(self.spilled)

    def get(self, tokens: list[str]) -> np.ndarray:
        """The layers of one sentence, float32 `(L+1, n, 2P)`; computed now if missing."""
        key = tuple(tokens)
        if key not in self:
            self.fill([list(key)])
        if key in self.memory:
            return self.memory[key].astype(np.float32, copy=False)
        return self._spill[self.spilled[key]][...].astype(np.float32)

    # ---- precomputed file ---------------------------------------------------------------------------------------------
    def _open_precomputed(self, path: Path) -> None:
        if not path.is_file():
            raise ElmoError(f"{path}: --embeddings file not found")
        try:
            self._pre = h5py.File(path, "r")
        except OSError as e:
            raise ElmoError(f"{path}: not a readable HDF5 file ({e})") from None
        if SENTENCE_INDEX not in self._pre:
            raise ElmoError(f"{path}: no {SENTENCE_INDEX} dataset; write it with elmo-cli dump-embeddings "
                            f"--layers all")
        raw = self._pre[SENTENCE_INDEX][0]
        self._pre_index = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)

    def _read_precomputed(self, key: Key) -> np.ndarray:
        index = self._pre_index[" ".join(key)]
        layers = self._pre[str(index)][...]
        n_layers = self.embedder.n_layers if self.embedder is not None else None
        if layers.ndim != 3 or layers.shape[1] != len(key) or (n_layers and layers.shape[0] != n_layers):
            raise ElmoError(f"{self._pre.filename}: dataset {index} has shape {layers.shape}, expected "
                            f"(L+1, {len(key)}, 2P) for {' '.join(key)[:60]!r}; dump it with --layers all")
        return layers.astype(np.float32)

    @property
    def layer_shape(self) -> tuple[int, int]:
        """``(L+1, 2P)``, from the embedder or the first cached sentence."""
        if self.embedder is not None:
            return self.embedder.n_layers, self.embedder.dim
        first = next(iter(self.memory.values()), None)
        if first is None and self._pre_index:
            first = self._pre[str(next(iter(self._pre_index.values())))]
        if first is None:
            raise ElmoError("no biLM and no cached sentence: give --model or --embeddings")
        return first.shape[0], first.shape[2]

    def close(self) -> None:
        """Close and delete the spill file; close the precomputed file."""
        if self._spill is not None:
            self._spill.close()
            self._spill_path.unlink(missing_ok=True)
            self._spill = None
        if self._pre is not None:
            self._pre.close()
            self._pre = None


def pad_layers(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack per-sentence layers `(L+1, n_b, 2P)` into `(L+1, B, T, 2P)` zero-padded, plus a bool mask `(B, T)`."""
    n_layers, dim = arrays[0].shape[0], arrays[0].shape[2]
    T = max(1, max(a.shape[1] for a in arrays))
    out = np.zeros((n_layers, len(arrays), T, dim), dtype=np.float32)
    mask = np.zeros((len(arrays), T), dtype=bool)
    for b, a in enumerate(arrays):
        out[:, b, : a.shape[1]] = a
        mask[b, : a.shape[1]] = True
    return torch.from_numpy(out), torch.from_numpy(mask)


def tuned_layers(bilm, chars, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The layers of a biLM being fine-tuned, with gradients: `(L+1, B, T, 2P)` (the words only, zero at padding)
    and the mask `(B, T)`; the same values as the frozen path's for the same weights."""
    from elmo_cli.inputs import char_ids_batch

    device = next(bilm.parameters()).device
    ids, lengths = char_ids_batch(chars, sentences, device=device)  # (B, T + 2, W) with <S> and </S>
    layers, _ = bilm.embed(ids, lengths)  # (L+1, B, T + 2, 2P)
    T = max(1, max(len(s) for s in sentences))
    mask = torch.arange(T, device=device).unsqueeze(0) < (lengths - 2).unsqueeze(1)  # (B, T)
    words = layers[:, :, 1 : T + 1]
    if words.shape[2] < T:  # every sentence empty
        words = torch.nn.functional.pad(words, (0, 0, 0, T - words.shape[2]))
    return words * mask.unsqueeze(-1), mask


class ElmoFeatures(nn.Module):
    """``gamma * sum_k softmax(w)_k * layer_k`` of the frozen biLM, with dropout, for a batch of token lists.

    # Parameters
    embedder : `Embedder`, optional: the biLM (frozen: no gradient, dropout off). May be None with a `cache`
        that holds every sentence (a precomputed file).
    cache : `LayerCache`, optional: without one the biLM runs on every batch.
    layers : `LayerSelection | str`, optional, (default = `"all"`): ``all`` mixes the L+1 layers; ``top`` uses the
        top one only (times a learned gamma); layer indices such as ``"1,2"`` mix those layers (0 = token layer).
    dropout : `float`, optional, (default = `0.5`): on the mixed representation, as the paper's taggers.
    layer_norm : `bool`, optional, (default = `False`): ScalarMix's layer normalisation.
    """

    def __init__(self, embedder=None, cache: LayerCache | None = None, layers: LayerSelection | str = "all",
                 dropout: float = 0.5, layer_norm: bool = False):
        super().__init__()
        select = layers if isinstance(layers, LayerSelection) else LayerSelection.parse(str(layers))
        if select.mode not in ("all", "top", "indices"):
            raise ElmoError(f"ElmoFeatures layers={layers!r}: the task learns its own mix; use all, top or layer "
                            f"indices such as 1,2")
        if embedder is None and cache is None:
            raise ElmoError("ElmoFeatures needs an embedder or a LayerCache")
        self.embedder = embedder  # a plain attribute, not a submodule: the biLM is never trained or saved here
        self.cache = cache
        self.n_layers, self.dim = cache.layer_shape if cache is not None else (embedder.n_layers, embedder.dim)
        n_layers = self.n_layers
        select.check(n_layers)
        self.layers = select.mode if select.mode != "indices" else ",".join(map(str, select.indices))
        self.used = {"all": list(range(n_layers)), "top": [n_layers - 1]}.get(select.mode, list(select.indices))
        self.mix = ScalarMix(len(self.used), layer_norm=layer_norm)
        self.dropout = nn.Dropout(dropout)
        self.bilm_seconds = self.bilm_cpu_seconds = 0.0  # wall and CPU time inside the biLM when there is no cache

    def tune(self, bilm) -> None:
        """Run `bilm` (a `BiLM` module the task model owns and trains) with gradients instead of the frozen
        embedder: fine-tuning, so there is no cache."""
        self.tuned, self.cache = bilm, None

    def biLM_layers(self, sentences: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers `(L+1, B, T, 2P)` float32 and the mask `(B, T)`, from the cache or the biLM."""
        if getattr(self, "tuned", None) is not None:
            return tuned_layers(self.tuned, self.embedder.loaded.text.chars, sentences)
        if self.cache is not None:
            arrays = [self.cache.get(s) for s in sentences]
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.no_grad():
                arrays = self.embedder.embed_sentences([list(s) for s in sentences])
            self.bilm_seconds += time.perf_counter() - t0
            self.bilm_cpu_seconds += time.process_time() - c0
        return pad_layers(arrays)

    def forward(self, sentences: list[list[str]], layers: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """
        # Parameters
        sentences : B token lists.
        layers, mask : optional, `(L+1, B, T, 2P)` and `(B, T)` from `biLM_layers`, to share one lookup between
            two ElmoFeatures (ELMo at the input and at the output).

        # Returns
        the mixed representation `(B, T, 2P)` (zero at padding) and the bool mask `(B, T)`.
        """
        if layers is None:
            layers, mask = self.biLM_layers(sentences)
        device = self.mix.weights.device
        layers, mask = layers.to(device), mask.to(device)
        return self.mix_layers(layers, mask), mask

    def mix_layers(self, layers: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The learned mix of computed layers `(L+1, B, T, 2P)` with the bool mask `(B, T)`: `(B, T, 2P)`, zero at
        padding (tensors only, so an exported graph runs the same code)."""
        if len(self.used) < self.n_layers:
            layers = layers[self.used]
        mixed = self.mix(layers, mask)  # (B, T, 2P)
        return self.dropout(mixed) * mask.unsqueeze(-1)

    def mix_summary(self) -> dict:
        """The learned softmax-normalised weights over the L+1 layers (top only: 0, ..., 0, 1) and gamma."""
        w = [0.0] * self.n_layers
        for k, x in zip(self.used, torch.softmax(self.mix.weights.detach(), 0).tolist()):
            w[k] = x
        return {"layers": self.layers, "weights": [round(x, 4) for x in w],
                "gamma": round(float(self.mix.gamma.detach()), 4)}

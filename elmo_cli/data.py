"""Shards -> (B, T, W) batches for the biLM: persistent sentence streams, bilm-tf style (bilm-tf's).

Each of the R rows (over all processes) is an endless stream of sentences. Per sentence of n words the two
directions get n + 1 (input, target) pairs each::

    forward   <S>->w1  w1->w2  ...  wn->  </S>
    backward  </S>->wn  wn->wn-1 ... w1-> <S>

so both directions walk the same sentence in lockstep and a row's position is one triple. Epoch e orders the
sentences by ``default_rng([seed, e]).permutation(n_sentences)`` and row r reads ``perm[r::R]``; when its share
runs out it starts its share of epoch e + 1. A batch is the next T pairs of every row::

    row 0:  <S> the cat sat <S> a dog ...      (inputs; the targets are the same stream shifted by one)
    row 1:  <S> it was a dark ...
             |<-------- T -------->|  batch k, then batch k + 1 continues each row where it stopped

The whole position is ``state()``: an int64 array ``(rows, 3)`` of (epoch, index into the row's share, offset in
the sentence), exactly restorable with ``load_state``. Shape letters as in `elmo_cli.model`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vocab.errors import ElmoError

IGNORE = -1  # target id of padding positions (finite streams only)


@dataclass
class LMBatch:
    """One step of both directions. Char ids in prediction form (raw + 1; 0 = no token).

    The two directions' chars are views of one block, ``chars`` `(2, B, T, W)`: the step's encoder reads them as
    one `(2B, T, W)` batch and a GPU copy is one transfer."""

    chars: torch.Tensor  # (2, B, T, W) int64: [0] the forward stream, [1] the backward one (sentences reversed)
    fwd_targets: torch.Tensor  # (B, T) int64, IGNORE where padded
    bwd_targets: torch.Tensor  # (B, T) int64
    n_tokens: int  # target positions that are not padding (per direction)
    starts: torch.Tensor  # (B, T) bool, True at each sentence's first pair (<S> forward, </S> backward)

    @property
    def fwd_chars(self) -> torch.Tensor:  # (B, T, W)
        return self.chars[0]

    @property
    def bwd_chars(self) -> torch.Tensor:  # (B, T, W)
        return self.chars[1]

    def pin_memory(self) -> "LMBatch":
        """The batch in page-locked host memory, so that a GPU copy of it is queued without waiting (a copy from
        ordinary memory waits for the GPU to finish everything queued before it)."""
        return LMBatch(self.chars.pin_memory(), self.fwd_targets.pin_memory(), self.bwd_targets.pin_memory(),
                       self.n_tokens, self.starts.pin_memory())

    def to(self, device: torch.device) -> "LMBatch":
        return LMBatch(self.chars.to(device, non_blocking=True), self.fwd_targets.to(device, non_blocking=True),
                       self.bwd_targets.to(device, non_blocking=True), self.n_tokens,
                       self.starts.to(device, non_blocking=True))


class SentenceStreams:
    """Persistent sentence streams over a `vocab.shards.ShardDataset` (see the module docstring).

    # Parameters
    dataset : `ShardDataset`
    rows : the global row numbers this process reads (rank r of N with B rows each: ``range(r * B, (r + 1) * B)``).
    total_rows : R, the rows over all processes.
    seed : `int`, the shuffle seed (epoch e uses ``default_rng([seed, e])``).
    shuffle : `bool`, (default = `True`); False reads sentences in stored order (evaluation).
    finite : `bool`, (default = `False`); True stops every row after one pass (epoch 0) and pads the rest of the
        batch with char id 0 and target `IGNORE`; `exhausted` tells when every row is done.
    """

    def __init__(self, dataset, rows: range | list[int], total_rows: int, seed: int = 0, shuffle: bool = True,
                 finite: bool = False):
        self.dataset = dataset
        self.rows = list(rows)
        self.total_rows = total_rows
        self.seed, self.shuffle, self.finite = seed, shuffle, finite
        if not finite and dataset.num_sentences < total_rows:
            raise ElmoError(f"{dataset.directory}: {dataset.num_sentences} sentences cannot feed {total_rows} "
                            f"batch rows; use a smaller --batch-size (or fewer processes) or more text")
        vocab, chars = dataset.vocab, dataset.chars
        self.bos_id, self.eos_id = int(vocab.bos_id), int(vocab.eos_id)
        self.bos_row = chars.encode("<S>")[None].astype(np.int64)  # (1, W) raw
        self.eos_row = chars.encode("</S>")[None].astype(np.int64)
        self.width = self.bos_row.shape[1]
        self._perms: dict[int, np.ndarray] = {}
        self._pos = np.zeros((len(self.rows), 3), dtype=np.int64)  # (epoch, index, offset) per row
        self._current: list[tuple | None] = [None] * len(self.rows)  # cached arrays of each row's sentence

    # ---- position ------------------------------------------------------------------------------------------------
    def state(self) -> np.ndarray:
        """The exact position: int64 ``(rows, 3)`` of (epoch, index, offset)."""
        return self._pos.copy()

    def load_state(self, state: np.ndarray) -> None:
        state = np.asarray(state, dtype=np.int64)
        if state.shape != self._pos.shape:
            raise ElmoError(f"data position has {state.shape[0]} rows but this run has {self._pos.shape[0]} "
                            f"(the batch size and the number of processes must match the checkpoint's)")
        self._pos = state.copy()
        self._current = [None] * len(self.rows)

    @property
    def exhausted(self) -> bool:
        return self.finite and bool((self._pos[:, 0] > 0).all())

    # ---- reading -------------------------------------------------------------------------------------------------
    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            n = self.dataset.num_sentences
            if self.shuffle:
                perm = np.random.default_rng([self.seed, epoch]).permutation(n).astype(np.int64)
            else:
                perm = np.arange(n, dtype=np.int64)
            oldest = int(self._pos[:, 0].min()) if len(self._pos) else epoch
            for e in [e for e in self._perms if e < oldest]:
                del self._perms[e]
            self._perms[epoch] = perm
        return perm

    def _share(self, epoch: int, row: int) -> np.ndarray:
        return self._perm(epoch)[row :: self.total_rows]

    def _sentence(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Raw inputs and targets of row k's current sentence: fwd_in (n+1, W), fwd_tgt, bwd_in, bwd_tgt."""
        cur = self._current[k]
        e, i, _ = (int(v) for v in self._pos[k])
        if cur is not None and cur[0] == (e, i):
            return cur[1]
        sid = int(self._share(e, self.rows[k])[i])
        ids, chars = self.dataset.sentence(sid)
        ids = ids.astype(np.int64)
        chars = np.asarray(chars, dtype=np.int64)
        arrays = (
            np.concatenate([self.bos_row, chars]), np.concatenate([ids, [self.eos_id]]),
            np.concatenate([self.eos_row, chars[::-1]]), np.concatenate([ids[::-1], [self.bos_id]]),
        )
        self._current[k] = ((e, i), arrays)
        return arrays

    def _advance_sentence(self, k: int) -> None:
        e, i, _ = (int(v) for v in self._pos[k])
        i += 1
        if i >= len(self._share(e, self.rows[k])):
            e, i = e + 1, 0
        self._pos[k] = (e, i, 0)

    def next_batch(self, T: int) -> LMBatch:
        """The next T (input, target) pairs of every row, both directions."""
        B, W = len(self.rows), self.width
        chars = np.zeros((2, B, T, W), dtype=np.int64)
        fwd_chars, bwd_chars = chars[0], chars[1]
        fwd_tgt = np.full((B, T), IGNORE, dtype=np.int64)
        bwd_tgt = np.full((B, T), IGNORE, dtype=np.int64)
        starts = np.zeros((B, T), dtype=bool)
        n_tokens = 0
        for k in range(B):
            t = 0
            while t < T:
                if self.finite and self._pos[k, 0] > 0:
                    break
                if len(self._share(int(self._pos[k, 0]), self.rows[k])) == 0:  # finite mode, fewer sentences than rows
                    self._pos[k] = (1, 0, 0)
                    break
                f_in, f_tgt, b_in, b_tgt = self._sentence(k)
                off = int(self._pos[k, 2])
                m = min(T - t, len(f_tgt) - off)
                starts[k, t] = off == 0
                fwd_chars[k, t : t + m] = f_in[off : off + m] + 1
                bwd_chars[k, t : t + m] = b_in[off : off + m] + 1
                fwd_tgt[k, t : t + m] = f_tgt[off : off + m]
                bwd_tgt[k, t : t + m] = b_tgt[off : off + m]
                t += m
                n_tokens += m
                if off + m == len(f_tgt):
                    self._advance_sentence(k)
                else:
                    self._pos[k, 2] = off + m
        return LMBatch(torch.from_numpy(chars), torch.from_numpy(fwd_tgt), torch.from_numpy(bwd_tgt), n_tokens,
                       torch.from_numpy(starts))


def steps_per_epoch(total_tokens: int, batch_size: int, unroll_steps: int, world_size: int = 1) -> int:
    """bilm-tf's ``n_train_tokens / (batch_size * unroll_steps * n_gpus)``, at least 1."""
    return max(1, total_tokens // (batch_size * unroll_steps * world_size))

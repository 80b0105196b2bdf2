"""Embedding files: `dump_embeddings` (text -> HDF5, docs/formats.md) and `dump_token_embeddings` (the token cache).

A dump reads its input in windows of ``window_batches * batch_size`` lines; within a window the lines are sorted
by length into batches (stateless) or kept in input order (stateful), embedded by `elmo_cli.embed.embed_batch`,
reduced by a `LayerSelection` on the model's device and written in line order, so memory does not grow with the
input; on a GPU a batch is written while the next one computes. Output goes to
``OUTPUT.partial`` (layout and bookkeeping: `elmo_cli.h5dump`) and is renamed when complete; ``resume`` continues
an interrupted run from its last complete window (a stateful one from the LSTM states it had carried that far).
Under torchrun each rank embeds lines ``i % world == rank`` into its own part file and rank 0 merges them.

With ``sentence_keys`` (allennlp's ``elmo --use-sentence-keys``) a dataset is named by its sentence, the stripped
line, instead of its line index: `SentenceKeys` checks every line of a file before anything is written (a blank
line, a ``/`` or a lone ``.`` cannot be an HDF5 name) and embeds only the first line of each sentence, since the
stateless vectors of identical sentences are identical (with ``stateful`` they are not: a repeat is refused). The
partial file keeps its index-named datasets and bookkeeping, and the datasets are renamed at the end.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import torch

from elmo_cli import h5dump
from elmo_cli.distributed import init_distributed, launched_world_size, leaves_process_group
from elmo_cli.embed import ENCODER_CHUNK, TokenEmbeddings, compute_dtype_of, embed_batch, token_embeddings
from elmo_cli.machine import bf16_problem, cpu_has_bf16
from elmo_cli.inputs import count_lines, input_order_batches, length_sorted_batches
from elmo_cli.layers import LayerSelection
from elmo_cli.loading import LoadedModel, set_threads
from elmo_cli.model.bilm import BiLM
from elmo_cli.model.lstm import fit_both, zero_states
from vocab.errors import ElmoError
from vocab.text import STDIN, check_new_output, publish, read_lines

WINDOW_BATCHES = 100  # lines are sorted by length within windows of this many batches


@dataclass
class DumpProgress:
    """What `dump_embeddings` reports after each batch (this process's share of the lines under torchrun)."""

    lines: int  # lines done, resumed ones included
    tokens: int  # tokens embedded by this run
    total: int | None  # lines to do in all, when the input is a file


@dataclass
class DumpResult:
    output: Path
    lines: int
    tokens: int
    resumed_from: int
    repeats: int = 0  # with sentence keys: lines whose sentence came earlier (stored once)


class SentenceKeyError(ElmoError):
    """A line that cannot name its dataset with sentence keys (the dump stops and leaves no partial file)."""


def sentence_key(line: str, source: str) -> str:
    """The dataset name of a line with sentence keys: the stripped line, as allennlp's ``--use-sentence-keys``.

    ``sentence_key(" The cat . ", "in.txt:3") -> "The cat ."``; SentenceKeyError naming ``source`` for a blank
    line, a ``/`` (HDF5's path separator) or a lone ``.`` (HDF5's name for the group itself).
    """
    key = line.strip()
    if not key:
        raise SentenceKeyError(f"{source}: blank line, and with --use-sentence-keys a dataset is named by its "
                               f"sentence (an empty name is not possible); remove blank lines or drop "
                               f"--use-sentence-keys")
    if "/" in key:
        raise SentenceKeyError(f"{source}: the sentence contains '/', the HDF5 path separator, so it cannot name a "
                               f"dataset; drop --use-sentence-keys (datasets are then keyed by line index)")
    if key == ".":
        raise SentenceKeyError(f"{source}: the sentence '.' cannot name a dataset (HDF5 reads '.' as the group "
                               f"itself); drop --use-sentence-keys (datasets are then keyed by line index)")
    return key


class SentenceKeys:
    """The sentences of a dump with sentence keys: ``first`` maps each to the 0-based index of its first line, in
    input order. Only that line is embedded: stateless vectors of identical sentences are identical, so storing
    one dataset per sentence loses nothing. With ``stateful`` they differ, and a repeat is an error."""

    def __init__(self, stateful: bool):
        self.stateful = stateful
        self.first: dict[str, int] = {}

    def add(self, index: int, source: str, line: str) -> bool:
        """Record line ``index``; True when it is the first line of its sentence (to embed), False for a repeat.
        Adding the same line again gives the same answer (a file is checked once before the dump reads it)."""
        key = sentence_key(line, source)
        first = self.first.setdefault(key, index)
        if first != index and self.stateful:
            raise SentenceKeyError(f"{source}: repeats line {first + 1}, and with --stateful the vectors of a "
                                   f"sentence depend on the lines before it, so one key cannot hold both; drop "
                                   f"--stateful (stateless repeats are identical and stored once) or "
                                   f"--use-sentence-keys")
        return first == index

    def check_file(self, path: Path, errors: str) -> None:
        """Add every line of ``path``: a bad line stops the dump before anything is written."""
        for i, (display, lineno, line) in enumerate(read_lines([str(path)], errors=errors)):
            self.add(i, f"{display}:{lineno}", line)


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op elsewhere).

    Called after each batch: a batch's tensors of many sizes leave holes in the heap that later small
    allocations (tokens, HDF5 metadata) split, so without it resident memory grows with the input (tiny model,
    10x the input: 1.8x the peak RSS without, 1.12x with; it costs a few percent of speed on the small shapes,
    `python -m benchmarks.bench_embed memory`).
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


def model_fingerprint(model: BiLM) -> str:
    """A short digest of the weights, so `--resume` refuses to mix two models in one file."""
    h = hashlib.sha256(json.dumps(model.config.to_options(), sort_keys=True).encode())
    for name, p in sorted(model.state_dict().items()):
        if name.startswith("softmax"):
            continue
        h.update(name.encode())
        h.update(np.float64(p.detach().float().sum().item()).tobytes())
    return h.hexdigest()[:16]


def _check_arguments(input_path: Path, output: Path, select: LayerSelection, n_layers: int, batch_size: int,
                     dtype: str, compression: str, force: bool) -> None:
    select.check(n_layers)
    if dtype not in h5dump.DTYPES:
        raise ElmoError(f"--dtype {dtype!r}: expected one of {', '.join(h5dump.DTYPES)}")
    if compression not in h5dump.COMPRESSIONS:
        raise ElmoError(f"--compression {compression!r}: expected one of {', '.join(h5dump.COMPRESSIONS)}")
    if batch_size < 1:
        raise ElmoError(f"--batch-size must be at least 1, got {batch_size}")
    if str(input_path) != STDIN and not input_path.is_file():
        raise ElmoError(f"{input_path}: input file not found")
    check_new_output(output, force)


def batches_ahead(device: torch.device) -> int:
    """How many batches a dump embeds before writing the one before them: on a GPU one (the host writes a batch
    while the GPU computes the next, and makes a window's datasets while it computes the window's first batch); a
    CPU computes and writes in turn (0)."""
    return 1 if device.type == "cuda" else 0


@dataclass
class _Batch:
    """One embedded batch on its way to the file: `batch` (indices into the window's items), the lengths `n`, the
    reduced output `(B, ..., T, 2P)` in the file's dtype on the host, and on a GPU the event of its copy back."""

    batch: list[int]
    n: list[int]
    out: torch.Tensor | None
    copied: torch.cuda.Event | None


class _Window:
    """Embeds and writes one window of lines at a time into the open partial file (this rank's share)."""

    def __init__(self, f: h5py.File, lines: h5py.Group, loaded: LoadedModel, tokens: TokenEmbeddings,
                 select: LayerSelection, batch_size: int, dtype: str, compression: str, stateful: bool,
                 compute_dtype: str):
        self.f, self.model, self.device, self.tokens = f, loaded.model, loaded.device, tokens
        self.line_group = lines  # where line datasets go: the root, or h5dump.LINES_GROUP with sentence keys
        self.select, self.batch_size, self.dtype, self.compression = select, batch_size, dtype, compression
        self.stateful = stateful
        self.lstm = None if stateful else loaded.lstm_kernel(compute_dtype_of(compute_dtype))
        self.states: tuple | None = None
        self.lines = self.tokens_done = 0
        self.ahead = batches_ahead(self.device)

    def batches(self, items: list[tuple[int, list[str]]]) -> list[list[int]]:
        if self.stateful:  # input order, empty lines included as "<S> </S>" (they advance the state, as bilm-tf)
            return input_order_batches(len(items), self.batch_size)
        nonempty = [k for k, (_, toks) in enumerate(items) if toks]
        self.lines += len(items) - len(nonempty)  # an empty line's dataset is complete once created
        return [[nonempty[j] for j in b]
                for b in length_sorted_batches([len(items[k][1]) for k in nonempty], self.batch_size)]

    def write(self, items: list[tuple[int, list[str]]], end: int, report: Callable[[], None]) -> None:
        """Embed and write ``items`` (line index, tokens), then record lines < end as complete."""
        L1, D = self.model.n_layers, self.model.config.output_dim
        batches = self.batches(items)
        # embedded, not yet written (on a GPU, the batches still computing). With `ahead`, the window's first
        # batches are started before its datasets are made, so that the host makes them while the GPU computes.
        pending = [self._embed(items, batch) for batch in batches[:self.ahead]]
        # Created in line order, so the file lists them in input order, and closed at once: an open HDF5 dataset
        # keeps its own buffers (a window's worth of open datasets cost more memory than the model itself).
        for i, toks in items:
            h5dump.create_line_dataset(self.line_group, i, self.select.shape(L1, len(toks), D), self.dtype,
                                       self.compression)
        for batch in batches[self.ahead:]:
            pending.append(self._embed(items, batch))
            if len(pending) > self.ahead:
                self._write_batch(items, pending.pop(0), report)
        for done in pending:
            self._write_batch(items, done, report)
        h5dump.mark_completed(self.f, end, self.saved_states() if self.stateful else None)
        if not batches:  # a window of blank or repeated lines only: the progress still moves
            report()

    def _embed(self, items: list[tuple[int, list[str]]], batch: list[int]) -> _Batch:
        """Embed one batch and reduce it to what is written (`LayerSelection.reduce_batch`, cast to the file's
        dtype) on the model's device. On a GPU the copy back is only started: the host writes the batch before
        while the GPU computes this one (`write`), and waits for the copy in `_write_batch`."""
        if self.stateful:
            self.states = zero_states((self.model.forward_lstm, self.model.backward_lstm), len(batch),
                                      self.device) if self.states is None else fit_both(self.states, len(batch))
        layers, n, new_states = embed_batch(self.model, self.tokens, [items[k][1] for k in batch], self.states,
                                            self.lstm)
        if self.stateful:
            self.states = new_states
        out = self.select.reduce_batch(layers).to(getattr(torch, self.dtype))  # (B, ..., T, 2P)
        del layers
        if out.device.type != "cuda":
            return _Batch(batch, n, out, None)
        host = out.to("cpu", non_blocking=True)  # into pinned memory, in stream order
        copied = torch.cuda.Event()
        copied.record()
        return _Batch(batch, n, host, copied)

    def _write_batch(self, items: list[tuple[int, list[str]]], done: _Batch, report: Callable[[], None]) -> None:
        if done.copied is not None:
            done.copied.synchronize()
        out = done.out.numpy()
        for b, k in enumerate(done.batch):
            if done.n[b]:
                h5dump.write_line(self.line_group, items[k][0], LayerSelection.line(out, b, done.n[b]))
        del out
        done.out = None
        release_free_memory()
        self.lines += len(done.batch)
        self.tokens_done += sum(done.n)
        report()

    def saved_states(self) -> dict[str, np.ndarray]:
        """The carried states as `h5dump.mark_completed` stores them: ``h (2, L, B, P)``, ``c (2, L, B, H)``."""
        if self.states is None:
            return {}
        return {name: np.stack([np.stack([layer[k].cpu().numpy() for layer in direction])
                                for direction in self.states]) for k, name in enumerate(("h", "c"))}

    def restore_states(self, saved: dict[str, np.ndarray]) -> None:
        """Carry on from `saved_states` (a resumed dump)."""
        if not saved:
            self.states = None
            return
        h, c = (torch.from_numpy(saved[name]).to(self.device) for name in ("h", "c"))
        self.states = tuple([(h[d, l], c[d, l]) for l in range(h.shape[1])] for d in range(2))


@leaves_process_group()
def dump_embeddings(loaded: LoadedModel, input_path: Path, output: Path, *,
                    layers: LayerSelection | str = "all", batch_size: int = 64, dtype: str = "float32",
                    compression: str = "none", stateful: bool = False, resume: bool = False, force: bool = False,
                    sentence_index: bool = True, token_cache: Path | None = None, errors: str = "strict",
                    window_batches: int = WINDOW_BATCHES, threads: int | None = None, compute_dtype: str = "fp32",
                    on_progress: Callable[[DumpProgress], None] | None = None,
                    on_warning: Callable[[str], None] | None = None, sentence_keys: bool = False) -> DumpResult:
    """Embed every line of a text file into one HDF5 file (see the module docstring).

    # Parameters
    layers : a `LayerSelection` or its ``--layers`` spelling; ``all`` writes `(L+1, n, 2P)` per line.
    stateful : carry LSTM state from batch to batch in input order (the legacy bilm-tf/allennlp behaviour).
    threads : torch's CPU threads for this dump (default: torch's choice).
    compute_dtype : ``fp32`` (exact, the default) or ``bf16``: the LSTMs' matrix products in bfloat16, states and
        elementwise work in fp32 (approximate; stateless only).
    sentence_keys : name each dataset by its stripped line instead of its index, one per distinct sentence, no
        ``sentence_to_index`` (see the module docstring); ``sentence_index`` is then ignored.
    """
    output, input_path = Path(output), Path(input_path)
    select = layers if isinstance(layers, LayerSelection) else LayerSelection.parse(layers)
    _check_arguments(input_path, output, select, loaded.model.n_layers, batch_size, dtype, compression, force)
    set_threads(threads)
    for warning in _check_modes(loaded.device, stateful, compute_dtype):
        if on_warning:
            on_warning(warning)
    ddp, device = init_distributed(loaded.device)
    if device != loaded.device:  # a torchrun rank on a GPU takes the GPU of its LOCAL_RANK
        loaded.model.to(device)
        loaded = dataclasses.replace(loaded, device=device)
    rank, world = ddp.rank, ddp.world_size
    if world > 1 and str(input_path) == STDIN:
        raise ElmoError("under torchrun the input must be a file (every rank reads it), not standard input")
    settings = {  # what a --resume must find unchanged (h5dump.open_partial)
        "input": str(input_path.resolve()) if str(input_path) != STDIN else STDIN,
        "input_bytes": input_path.stat().st_size if str(input_path) != STDIN else None,
        **select.settings(), "dtype": dtype, "compression": compression, "stateful": stateful,
        "batch_size": batch_size if stateful else None, "model": model_fingerprint(loaded.model),
        "compute_dtype": compute_dtype, "world_size": world, "sentence_keys": sentence_keys,
    }
    keys = SentenceKeys(stateful) if sentence_keys else None
    if keys is not None and str(input_path) != STDIN:
        keys.check_file(input_path, errors)  # standard input is checked as it is read
    total = count_lines(input_path)
    my_total = None if total is None else len(range(rank, total, world))
    part = h5dump.partial_path(output, rank if world > 1 else None)
    f, completed = h5dump.open_partial(part, settings, resume)
    window = _Window(f, h5dump.line_group(f, sentence_keys), loaded, token_embeddings(loaded, token_cache), select,
                     batch_size, dtype, compression, stateful, compute_dtype)
    window.lines = len(range(rank, completed, world))

    def report() -> None:
        if on_progress:
            on_progress(DumpProgress(window.lines, window.tokens_done, my_total))

    try:
        if stateful and completed:
            window.restore_states(_carried_states(f, part, completed))
        report()
        n_lines, index = _embed_windows(input_path, errors, loaded.text.tokenize, completed, rank, world,
                                        max(1, window_batches) * batch_size, window, report,
                                        sentence_index and rank == 0 and keys is None, keys)
        tokens = _publish_dump(f, part, output, ddp, n_lines, index if sentence_index else None, keys,
                               window.tokens_done, device)
    except SentenceKeyError:  # a bad line of standard input: the partial file can never be completed
        f.close()
        part.unlink(missing_ok=True)
        raise
    finally:
        if f.id.valid:
            f.close()
    repeats = n_lines - len(keys.first) if keys is not None else 0
    if repeats and on_warning and rank == 0:
        on_warning(f"--use-sentence-keys: {repeats} line(s) repeat an earlier sentence and share its dataset "
                   f"(stateless vectors of identical sentences are identical): {len(keys.first)} datasets for "
                   f"{n_lines} lines")
    return DumpResult(output, n_lines, tokens, completed, repeats)


def _carried_states(f, part: Path, completed: int) -> dict[str, np.ndarray]:
    """The LSTM states a resumed --stateful dump carries past line `completed` (saved in its partial file)."""
    saved = h5dump.read_states(f, completed)
    if saved is None:
        raise ElmoError(f"{part}: cannot resume this --stateful dump: the file does not hold the LSTM states "
                        f"carried past line {completed}; run again without --resume")
    return saved


def _check_modes(device: torch.device, stateful: bool, compute_dtype: str) -> list[str]:
    """Refuse the combinations of --stateful, --compute-dtype and torchrun that cannot run; the warnings due."""
    if stateful and compute_dtype != "fp32":
        raise ElmoError("--compute-dtype bf16 applies to the stateless path; drop --stateful or --compute-dtype")
    if stateful and launched_world_size() > 1:  # each rank would carry state through its own share of the lines
        raise ElmoError("--stateful carries LSTM state from batch to batch through the input in order, which "
                        "torchrun's processes would split; run a stateful dump as one process")
    compute_dtype_of(compute_dtype)
    warnings = []
    if compute_dtype == "bf16":
        problem = bf16_problem(device)
        if problem:
            raise ElmoError(f"--compute-dtype bf16: {problem}; use fp32 (the exact default)")
        if device.type == "cpu" and cpu_has_bf16() is None:
            warnings.append("--compute-dtype bf16: cannot tell whether this CPU multiplies bf16 natively "
                            "(AVX512-BF16 or AMX); where it does not, bf16 is slower than fp32")
    if stateful:
        warnings.append("--stateful: LSTM state is carried from batch to batch, so a sentence's vectors depend on "
                        "the lines before it and on --batch-size (the legacy bilm-tf/allennlp behaviour)")
    return warnings


def _publish_dump(f, part: Path, output: Path, ddp, n_lines: int, index: dict | None, keys: "SentenceKeys | None",
                  tokens: int, device: torch.device) -> int:
    """Finish a dump whose lines are all written to the open partial file `f`: one process names its datasets (or
    writes ``sentence_to_index``) and renames `part` to `output`; under torchrun the ranks merge into rank 0's file.
    Returns the tokens embedded by all processes."""
    if ddp.world_size > 1:
        f.close()
        _merge_ranks(output, ddp.rank, ddp.world_size, n_lines, index if keys is None else None, keys)
        return _sum_over_ranks(tokens, device)
    h5dump.strip_bookkeeping(f)
    if keys is not None:
        h5dump.name_by_sentence(f, keys.first)
    elif index is not None:
        h5dump.write_sentence_index(f, index)
    f.close()
    publish(part, output)
    return tokens


def _sum_over_ranks(count: int, device: torch.device) -> int:
    """A count summed over the torchrun processes (each embedded its share of the lines)."""
    import torch.distributed as dist

    t = torch.tensor([count], dtype=torch.long, device=device)
    dist.all_reduce(t)
    return int(t.item())


def _embed_windows(input_path: Path, errors: str, tokenize: Callable[[str], list[str]], completed: int, rank: int,
                   world: int, size: int, window: _Window, report: Callable[[], None], index: bool,
                   keys: SentenceKeys | None = None) -> tuple[int, dict[str, str]]:
    """Read the input once, handing this rank's lines past ``completed`` to `window` ``size`` lines at a time
    (with ``keys``, only the first line of each sentence; every line is added to ``keys``, resumed ones too).

    # Returns
    the number of input lines and ``sentence_to_index`` (empty unless ``index``).
    """
    sentence_to_index: dict[str, str] = {}
    pending: list[tuple[int, list[str]]] = []
    start = completed
    i = -1
    for i, (display, lineno, line) in enumerate(read_lines([str(input_path)], errors=errors)):
        first = keys is None or keys.add(i, f"{display}:{lineno}", line)
        if index:
            sentence_to_index[line.strip()] = str(i)
        if i < completed:
            continue
        if i % world == rank:
            if first:
                pending.append((i, tokenize(line)))
            else:
                window.lines += 1  # a repeated sentence: its dataset is the first line's
        if i + 1 - start >= size:
            window.write(pending, i + 1, report)
            pending, start = [], i + 1
    if pending or i + 1 > start:
        window.write(pending, i + 1, report)
    return i + 1, sentence_to_index


def _merge_ranks(output: Path, rank: int, world: int, n_lines: int, sentence_to_index: dict | None,
                 keys: SentenceKeys | None = None) -> None:
    """After a barrier rank 0 copies every rank's part, in line order, into one file (with ``keys``, each
    sentence's dataset from the part of its first line, named by the sentence); the others wait for it."""
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        parts = [h5dump.partial_path(output, r) for r in range(world)]
        tmp = h5dump.partial_path(output)
        handles = [h5py.File(p, "r") for p in parts]
        try:
            names = ([(i, str(i)) for i in range(n_lines)] if keys is None else
                     [(i, sentence) for sentence, i in keys.first.items()])
            with h5py.File(tmp, "w", track_order=True) as f:
                for i, name in names:
                    src = handles[i % world]
                    src.copy(src[h5dump.line_path(i, keys is not None)], f, name=name)
                if sentence_to_index is not None:
                    h5dump.write_sentence_index(f, sentence_to_index)
        finally:
            for h in handles:
                h.close()
        publish(tmp, output)
        for p in parts:
            p.unlink(missing_ok=True)
    dist.barrier()


# ---- dump-token-embeddings ------------------------------------------------------------------------------------------
def read_word_list(path: Path) -> list[str]:
    """Words, one per line (a bilm-tf vocabulary, or any list: ``<UNK>`` and the boundaries are optional);
    ElmoError naming file and line for an empty line, a space inside a word, or a repeated word."""
    path = Path(path)
    if not path.is_file():
        raise ElmoError(f"{path}: word list not found")
    words: dict[str, int] = {}
    for _, lineno, line in read_lines([str(path)]):
        if not line or any(c.isspace() for c in line):
            raise ElmoError(f"{path}:{lineno}: expected one word per line, got {line!r}")
        if line in words:
            raise ElmoError(f"{path}:{lineno}: {line!r} repeats line {words[line]}")
        words[line] = lineno
    if not words:
        raise ElmoError(f"{path}: the word list is empty")
    return list(words)


def dump_token_embeddings(loaded: LoadedModel, vocab_path: Path, output: Path, force: bool = False,
                          on_progress: Callable[[int, int], None] | None = None) -> tuple[Path, int]:
    """bilm-tf's token cache: the encoder output of every word of a list, ``embedding (V, P)`` (+ ``tokens``).

    ``<S>`` and ``</S>`` rows, when listed, are computed from the sentence-boundary character ids, as the model
    reads them at the ends of every sentence.

    # Returns
    the output path and V.
    """
    output = Path(output)
    check_new_output(output, force)
    words = read_word_list(vocab_path)
    store = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)
    parts = []
    with torch.no_grad():
        for s in range(0, len(words), 4 * ENCODER_CHUNK):
            parts.append(store.encode(words[s : s + 4 * ENCODER_CHUNK]).cpu().numpy())
            if on_progress:
                on_progress(min(s + 4 * ENCODER_CHUNK, len(words)), len(words))
    h5dump.write_token_cache(output, words, np.concatenate(parts))
    return output, len(words)

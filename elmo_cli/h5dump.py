"""The HDF5 embedding layout (docs/formats.md), the token cache, and the partial-file bookkeeping of a dump.

Embedding dump, one file (what allennlp's ``elmo`` command and bilm-tf's ``dump_bilm_embeddings`` wrote)::

    "0", "1", ...          one dataset per input line, key str(0-based line index), float32 (or float16)
                             layers=all      (L+1, n_tokens, 2P)   other selections: `elmo_cli.layers`
                           an empty line keeps its key with n_tokens = 0 (indices never shift)
    sentence_to_index      shape (1,), variable-length UTF-8 string: JSON {stripped line: "index"}, last index wins

With sentence keys (allennlp's ``elmo --use-sentence-keys``) each dataset is named by its stripped line instead,
one per distinct sentence, in the order of first appearance, and there is no ``sentence_to_index``.

Token cache (bilm-tf's ``dump_token_embeddings``)::

    embedding              (V, P) float32: the token-encoder output of each vocabulary line, in order
    tokens                 (V,) variable-length UTF-8 strings, the vocabulary itself (elmo-cli's addition so the
                           file is self-describing; bilm-tf readers ignore it)

While a dump runs it writes ``OUTPUT.partial`` (``OUTPUT.partial.rank{r}`` per rank under torchrun) and renames it to
OUTPUT only when complete. The partial file carries two attributes that the final file never has:
``elmo_cli_settings`` (JSON of what determines the output, checked by ``--resume``) and ``elmo_cli_completed``
(lines [0, completed) are fully written; a dataset at or beyond it may be half-written and is redone), and, for a
``--stateful`` dump, the group ``elmo_cli_states``: the LSTM states carried past the completed lines (``h``
`(2, L, B, P)` and ``c`` `(2, L, B, H)`, direction-major; none while they are still zero), so that a resumed dump
goes on from them. A dump with
sentence keys keeps its datasets under index names in the group ``LINES_GROUP`` of the partial file, so this
bookkeeping is the same, and `name_by_sentence` moves them to their sentences when the dump is complete.
"""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import torch

from vocab.errors import ElmoError
from vocab.text import publish

SENTENCE_INDEX = "sentence_to_index"
TOKEN_CACHE_EMBEDDING = "embedding"
TOKEN_CACHE_TOKENS = "tokens"
SETTINGS_ATTR = "elmo_cli_settings"
COMPLETED_ATTR = "elmo_cli_completed"
STATES_GROUP = "elmo_cli_states"
DTYPES = {"float32": np.float32, "float16": np.float16}
COMPRESSIONS = ("none", "gzip", "lzf")
# The partial file's group of a sentence-keyed dump. Keys are stripped lines, so a name that starts with a space is
# never one: moving the datasets to their sentences cannot collide with it.
LINES_GROUP = " lines"

_STR = h5py.string_dtype(encoding="utf-8")


def partial_path(output: Path, rank: int | None = None) -> Path:
    """``out.hdf5 -> out.hdf5.partial`` (``out.hdf5.partial.rank1`` for a rank's part under torchrun)."""
    output = Path(output)
    suffix = ".partial" if rank is None else f".partial.rank{rank}"
    return output.with_name(output.name + suffix)


def open_partial(path: Path, settings: dict, resume: bool) -> tuple[h5py.File, int]:
    """Open the partial file of a dump; returns it and the number of lines already complete.

    Without ``resume`` any old partial file is replaced. With ``resume`` the file's settings must equal
    ``settings`` (else ElmoError naming what differs) and datasets at or past the completed mark are deleted.
    """
    path = Path(path)
    text = json.dumps(settings, sort_keys=True)
    if resume and path.exists():
        try:
            f = h5py.File(path, "a")
        except OSError as e:
            raise ElmoError(f"{path}: cannot reopen the interrupted dump ({e}); run again without --resume")
        old = json.loads(f.attrs.get(SETTINGS_ATTR, "{}"))
        if old != settings:
            f.close()
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise ElmoError(f"{path}: cannot resume, the interrupted dump used different "
                            f"{', '.join(diff)}; run again without --resume (or with the same options)")
        completed = int(f.attrs.get(COMPLETED_ATTR, 0))
        lines = f[LINES_GROUP] if LINES_GROUP in f else f
        for key in [k for k in lines.keys() if k.isdigit() and int(k) >= completed]:
            del lines[key]  # possibly half-written: redo it
        return f, completed
    try:
        f = h5py.File(path, "w", track_order=True)  # keys listed in creation (= line) order
    except OSError as e:
        raise ElmoError(f"{path}: cannot write ({e})")
    f.attrs[SETTINGS_ATTR] = text
    f.attrs[COMPLETED_ATTR] = 0
    return f, 0


def _plain_line_lists() -> tuple[h5py.h5p.PropDCID, h5py.h5p.PropLCID]:
    """The creation property lists h5py's ``create_dataset`` gives an uncompressed dataset (no timestamps, no
    attribute order; an ASCII link name, as h5py gives a name in ASCII such as a line's number), so a line made
    through the low-level API is the same bytes on disk."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)
    dcpl.set_attr_creation_order(0)
    lcpl = h5py.h5p.create(h5py.h5p.LINK_CREATE)
    lcpl.set_create_intermediate_group(True)
    lcpl.set_char_encoding(h5py.h5t.CSET_ASCII)
    return dcpl, lcpl


_PLAIN = _plain_line_lists()
_FILE_TYPES = {name: h5py.h5t.py_create(np.dtype(t), logical=True) for name, t in DTYPES.items()}


def create_line_dataset(f: h5py.Group, index: int, shape: tuple[int, ...], dtype: str = "float32",
                        compression: str = "none") -> None:
    """Make line `index`'s dataset, key ``str(index)``, filled later (`write_line`) and closed at once; empty ones
    are never compressed (HDF5 cannot chunk a zero-size dataset). An uncompressed one is made through h5py's
    low-level API, a third faster per line than ``create_dataset`` (`benchmarks.bench_writer`), the same bytes on
    disk, and no high-level ``h5py.Dataset`` is built around it (a few microseconds a line that nothing reads)."""
    if compression != "none" and all(shape):
        f.create_dataset(str(index), shape=shape, dtype=DTYPES[dtype], compression=compression, shuffle=True)
        return
    dcpl, lcpl = _PLAIN
    h5py.h5d.create(f.id, str(index).encode(), _FILE_TYPES[dtype], h5py.h5s.create_simple(shape), dcpl=dcpl,
                    lcpl=lcpl)


def write_line(f: h5py.Group, index: int, data: np.ndarray) -> None:
    """Fill line `index`'s dataset (made by `create_line_dataset`, same shape) with `data`, cast to the file's
    dtype by torch first: HDF5's own float32-to-float16 conversion took most of a float16 line's time, and torch's
    cast gives the same bits (round to nearest even) faster than numpy's (`benchmarks.bench_writer`). Through
    h5py's low-level API: a third of the time per line of ``f[key][...] = data``."""
    dataset = h5py.h5d.open(f.id, str(index).encode())
    if data.dtype != dataset.dtype:
        data = torch.from_numpy(data).to(getattr(torch, dataset.dtype.name)).numpy()
    data = np.ascontiguousarray(data)
    # An explicit memory space makes HDF5 check that the shapes agree (h5s.ALL would trust the buffer).
    dataset.write(h5py.h5s.create_simple(data.shape), h5py.h5s.ALL, data)


def line_group(f: h5py.File, sentence_keys: bool) -> h5py.Group:
    """Where a partial file keeps its line datasets: the root, or `LINES_GROUP` for a sentence-keyed dump."""
    return f.require_group(LINES_GROUP) if sentence_keys else f


def line_path(index: int, sentence_keys: bool) -> str:
    """A line's dataset in a partial file: ``"7"``, or ``" lines/7"`` for a sentence-keyed dump."""
    return f"{LINES_GROUP}/{index}" if sentence_keys else str(index)


def name_by_sentence(f: h5py.File, first: dict[str, int]) -> None:
    """Move each sentence's dataset from `LINES_GROUP` to the root under the sentence (``first`` maps a sentence to
    the index of its first line, in input order, which becomes the file's order), then drop the group."""
    for sentence, index in first.items():
        f.move(line_path(index, True), sentence)
    if LINES_GROUP in f:
        del f[LINES_GROUP]


def mark_completed(f: h5py.File, completed: int, states: dict[str, np.ndarray] | None = None) -> None:
    """Record that lines [0, completed) are written, and push it to disk. ``states`` (a stateful dump): the carried
    states after those lines (``{}`` while they are zero), kept with the mark they belong to."""
    if states is not None:
        group = f.require_group(STATES_GROUP)
        group.attrs[COMPLETED_ATTR] = -1  # not valid while being rewritten
        for name in [n for n in group if n not in states or group[n].shape != states[n].shape]:
            del group[name]
        for name, array in states.items():
            if name in group:
                group[name][...] = array  # in place: a deleted dataset's space is not reused by HDF5
            else:
                group.create_dataset(name, data=array)
        group.attrs[COMPLETED_ATTR] = completed
    f.attrs[COMPLETED_ATTR] = completed
    f.flush()


def read_states(f: h5py.File, completed: int) -> dict[str, np.ndarray] | None:
    """The carried states stored with the mark `completed` (``{}``: still zero), or None when the file has none."""
    group = f.get(STATES_GROUP)
    if group is None or int(group.attrs.get(COMPLETED_ATTR, -1)) != completed:
        return None
    return {name: group[name][...] for name in group}


def write_sentence_index(f: h5py.File, sentence_to_index: dict[str, str]) -> None:
    """``sentence_to_index``: shape (1,), variable-length UTF-8, the JSON of the mapping."""
    ds = f.create_dataset(SENTENCE_INDEX, (1,), dtype=_STR)
    ds[0] = json.dumps(sentence_to_index, ensure_ascii=False)


def read_sentence_index(f: h5py.File) -> dict[str, str]:
    raw = f[SENTENCE_INDEX][0]
    return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)


def strip_bookkeeping(f: h5py.File) -> None:
    for attr in (SETTINGS_ATTR, COMPLETED_ATTR):
        if attr in f.attrs:
            del f.attrs[attr]
    if STATES_GROUP in f:
        del f[STATES_GROUP]


# ---- token cache ----------------------------------------------------------------------------------------------
def write_token_cache(path: Path, tokens: list[str], embedding: np.ndarray) -> None:
    """``embedding (V, P)`` float32 plus ``tokens (V,)``, written to a temporary name and renamed."""
    if embedding.shape[0] != len(tokens):
        raise ValueError(f"{embedding.shape[0]} embedding rows for {len(tokens)} tokens")
    path = Path(path)
    tmp = partial_path(path)
    try:
        with h5py.File(tmp, "w") as f:
            f.create_dataset(TOKEN_CACHE_EMBEDDING, data=np.asarray(embedding, dtype=np.float32))
            f.create_dataset(TOKEN_CACHE_TOKENS, data=np.array(tokens, dtype=object), dtype=_STR)
        publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_token_cache(path: Path, projection_dim: int, tokens: list[str] | None = None
                     ) -> tuple[list[str], np.ndarray]:
    """The cache's tokens and ``(V, P)`` embedding; ``tokens`` names the rows of a file without a tokens dataset
    (one written by bilm-tf)."""
    path = Path(path)
    if not path.is_file():
        raise ElmoError(f"{path}: token cache not found")
    try:
        with h5py.File(path, "r") as f:
            if TOKEN_CACHE_EMBEDDING not in f:
                raise ElmoError(f"{path}: not a token cache (no '{TOKEN_CACHE_EMBEDDING}' dataset)")
            emb = f[TOKEN_CACHE_EMBEDDING][...].astype(np.float32)
            if TOKEN_CACHE_TOKENS in f:
                tokens = [t.decode("utf-8") if isinstance(t, bytes) else t for t in f[TOKEN_CACHE_TOKENS][...]]
    except OSError as e:
        raise ElmoError(f"{path}: not a readable HDF5 file ({e})")
    if tokens is None:
        raise ElmoError(f"{path}: the cache does not list its tokens; give the vocabulary it was made from")
    if emb.ndim != 2 or emb.shape != (len(tokens), projection_dim):
        raise ElmoError(f"{path}: embedding has shape {emb.shape}, expected ({len(tokens)}, {projection_dim}) "
                        f"for {len(tokens)} tokens and this model's projection_dim {projection_dim}")
    return tokens, emb

"""Contextual embeddings out of a biLM: the `Embedder` Python API, `dump_embeddings` and `dump_token_embeddings`.

Stateless by default: every sentence starts from zero LSTM state, so a sentence's vectors never depend on what else
is in its batch or what came before. The token encoder (char CNN + highway + projection) runs once per distinct
token string: its outputs are kept in `TokenEmbeddings`, a bounded memo that can be pre-filled from a token cache
file (`dump_token_embeddings`), so a cached token never goes through the char CNN.

    Embedder("model/").embed_sentences([["The", "cat", "."]])[0].shape -> (L+1, 3, 2P)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from elmo_cli import h5dump
from elmo_cli.distributed import init_distributed
from elmo_cli.loading import LoadedModel, length_sorted_batches, load_model
from elmo_cli.model.bilm import BiLM, reverse_padded, to_model_chars
from elmo_cli.model.lstm import fit_states
from vocab.chars import BOS_TOKEN, EOS_TOKEN
from vocab.errors import ElmoError
from vocab.text import publish, read_lines

ENCODER_CHUNK = 256  # distinct tokens per encoder call: (256, 50, F) conv activations = 100 MB at F = 2048
MEMO_CAPACITY = 50_000  # distinct tokens remembered between batches (50k x 512 floats = 100 MB for `original`)
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


# ---- token encoder outputs by token string ------------------------------------------------------------------------
class TokenEmbeddings:
    """Encoder outputs ``(P,)`` by token string: fixed rows from a token cache plus a bounded memo of the rest.

    ``lookup(["<S>", "the", "the", "</S>"])`` encodes "<S>", "the", "</S>" once each (unless already known) and
    returns shape `(4, P)`.
    """

    def __init__(self, model: BiLM, chars, device: torch.device, capacity: int = MEMO_CAPACITY):
        self.model, self.chars, self.device, self.capacity = model, chars, device, capacity
        P = model.config.lstm.projection_dim
        self.rows: dict[str, int] = {}
        self.store = torch.zeros(1024, P, device=device)
        self.n_fixed = self.n = 0

    def add_cache(self, tokens: list[str], embedding: np.ndarray) -> None:
        """Pre-fill from a token cache ``(V, P)``; these rows are never evicted."""
        self.rows = {t: i for i, t in enumerate(tokens)}
        self.store = torch.from_numpy(np.ascontiguousarray(embedding, dtype=np.float32)).to(self.device)
        self.n_fixed = self.n = len(tokens)

    @torch.no_grad()
    def encode(self, tokens: list[str]) -> torch.Tensor:
        """The encoder on `tokens`, shape `(n, P)`, in chunks of similar length (the encoder computes only the
        windows up to the longest token of its input, see `TokenEncoder.forward`)."""
        if not tokens:
            return self.store[:0]
        raw = self.chars.encode_tokens(tokens)  # (n, W)
        n_chars = (raw != self.chars.pad_char).sum(axis=1)  # BOW + kept chars + EOW
        order = np.argsort(n_chars, kind="stable")
        out = torch.empty(len(tokens), self.store.shape[1], device=self.device)
        for s in range(0, len(tokens), ENCODER_CHUNK):
            idx = order[s : s + ENCODER_CHUNK]
            chars = to_model_chars(raw[idx]).to(self.device)
            out[torch.from_numpy(idx).to(self.device)] = self.model.encoder(chars)
        return out


    def rows_of(self, tokens: list[str]) -> torch.Tensor:
        """Rows of `store` holding each token's encoder output (encoding the unknown ones), shape `(n,)`."""
        rows = self.rows
        distinct = dict.fromkeys(tokens)
        missing = [t for t in distinct if t not in rows]
        if missing:
            if self.n + len(missing) > self.n_fixed + self.capacity:  # full: forget the memo, keep the cache
                for t in list(rows)[self.n_fixed:]:
                    del rows[t]
                self.n = self.n_fixed
                missing = [t for t in distinct if t not in rows]
            emb = self.encode(missing)  # (M, P)
            need = self.n + len(missing)
            if need > self.store.shape[0]:
                grown = torch.zeros(max(need, 2 * self.store.shape[0]), self.store.shape[1], device=self.device)
                grown[: self.n] = self.store[: self.n]
                self.store = grown
            self.store[self.n : need] = emb
            for k, t in enumerate(missing):
                rows[t] = self.n + k
            self.n = need
        return torch.tensor([rows[t] for t in tokens], dtype=torch.long, device=self.device)

    def lookup(self, tokens: list[str]) -> torch.Tensor:
        """Encoder outputs of `tokens`, shape `(n, P)`."""
        return self.store.index_select(0, self.rows_of(tokens))


class StatelessBiLSTM:
    """Both LSTM stacks of a BiLM for stateless inference, the two directions computed together.

    The forward and backward weights of each layer are stacked on a leading axis of 2, so one step of both
    directions is one batched product (``baddbmm``: ``(2, B, P) @ (2, P, 4H)``) instead of two, and the gate columns
    are reordered once to ``i, f, o | j`` so each step takes one sigmoid and one tanh over contiguous blocks. The
    input product of all T steps is one product before the loop, and each step works in place on its slice of it.
    Same function as `BiLM.embed` without states at every token position; the boundary positions (``<S>``,
    ``</S>``), which the dump drops, are not all computed.
    """

    def __init__(self, model: BiLM):
        H = model.config.lstm.dim
        perm = torch.cat([torch.arange(0, H), torch.arange(2 * H, 3 * H), torch.arange(3 * H, 4 * H),
                          torch.arange(H, 2 * H)])  # i j f o -> i f o j
        self.H, self.residual = H, model.config.lstm.use_skip_connections
        self.cell_clip, self.proj_clip = model.config.lstm.cell_clip, model.config.lstm.proj_clip
        self.layers = []
        with torch.no_grad():
            for fl, bl in zip(model.forward_lstm.layers, model.backward_lstm.layers):
                both = (fl, bl)
                perm_d = perm.to(fl.bias.device)
                self.layers.append((
                    torch.stack([l.input_weight[perm_d].t() for l in both]).contiguous(),  # (2, P, 4H)
                    torch.stack([(l.bias + l.forget_bias)[perm_d] for l in both]).unsqueeze(1),  # (2, 1, 4H)
                    torch.stack([l.recurrent_weight[perm_d].t() for l in both]).contiguous(),  # (2, P, 4H)
                    torch.stack([l.projection_weight.t() for l in both]).contiguous(),  # (2, H, P)
                ))

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, lengths: torch.Tensor,
                 distinct: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """
        # Parameters
        x : token embeddings `(B, T, P)`, each row ``<S> .. </S>`` then padding; lengths : `(B,)`.
        distinct : optional ``(emb (U, P), idx (B, T))`` with ``x == emb[idx]``: the first layer's input product
            is then computed once per distinct token and gathered (a sentence batch repeats most tokens).

        # Returns
        layers `(L+1, B, T, 2P)` as `BiLM.embed` at positions 1 .. length-2 of each row (undefined elsewhere).
        """
        B, T, P = x.shape
        H = self.H
        inp = torch.stack([x, reverse_padded(x, lengths)])  # (2, B, T, P): the backward stack reads rows reversed
        outputs = [torch.cat([x, x], dim=-1)]
        for w_in, bias, w_rec, w_proj in self.layers:
            # Time-major, so that each step's slice is contiguous.
            if distinct is not None and len(outputs) == 1:
                emb, idx = distinct
                xw_u = torch.baddbmm(bias, emb.unsqueeze(0).expand(2, -1, -1), w_in)  # (2, U, 4H)
                idx_t = torch.stack([idx, reverse_padded(idx, lengths)]).transpose(1, 2)  # (2, T, B)
                xw = xw_u.new_empty(2, T * B, 4 * H)
                for d in range(2):
                    torch.index_select(xw_u[d], 0, idx_t[d].reshape(-1), out=xw[d])
                xw = xw.view(2, T, B, 4 * H)
            else:
                inp_t = inp.transpose(1, 2).reshape(2, T * B, P)  # (2, T * B, P)
                xw = torch.baddbmm(bias, inp_t, w_in).view(2, T, B, 4 * H)  # (2, T, B, 4H)
            h = x.new_zeros(2, B, P)
            c = x.new_zeros(2, B, H)
            steps = []
            # In place on this step's slice of xw (not needed afterwards): no new (2, B, 4H) tensor per step.
            # The last step is skipped: a direction's output at its final boundary token (</S> forward, <S>
            # backward) feeds nothing that is kept; position T-1 stays undefined like the padding.
            for z in xw.unbind(1)[: T - 1]:  # (2, B, 4H)
                z.baddbmm_(h, w_rec)
                gates = z[..., : 3 * H].sigmoid_()
                cand = z[..., 3 * H :].tanh_()
                c = c.mul_(gates[..., H : 2 * H]).addcmul_(gates[..., :H], cand)
                if self.cell_clip is not None:
                    c.clamp_(-self.cell_clip, self.cell_clip)
                h = torch.bmm(torch.tanh(c).mul_(gates[..., 2 * H :]), w_proj)  # (2, B, P)
                if self.proj_clip is not None:
                    h.clamp_(-self.proj_clip, self.proj_clip)
                steps.append(h)
            steps.append(torch.zeros_like(h))
            out = torch.stack(steps, dim=2)  # (2, B, T, P)
            if self.residual and len(outputs) > 1:
                out = out + inp
            outputs.append(torch.cat([out[0], reverse_padded(out[1], lengths)], dim=-1))
            inp = out
        return torch.stack(outputs)


@torch.no_grad()
def embed_batch(model: BiLM, tokens: TokenEmbeddings, sentences: list[list[str]], states: tuple | None = None,
                lstm: StatelessBiLSTM | None = None) -> tuple[np.ndarray, list[int], tuple | None]:
    """Embed one batch of token lists (boundaries added here); `lstm` (stateless only) is the fast path.

    # Returns
    layers `(L+1, B, T, 2P)` float32 numpy where sentence b's tokens are positions ``1 .. n_b`` (0 is ``<S>``),
    the lengths ``n_b``, and the final LSTM states (for the carried-state mode).
    """
    B = len(sentences)
    n = [len(s) for s in sentences]
    T = max(n) + 2
    flat, pos = [], []
    for b, s in enumerate(sentences):
        flat.append(BOS_TOKEN)
        flat.extend(s)
        flat.append(EOS_TOKEN)
        pos.extend(range(b * T, b * T + len(s) + 2))
    device = tokens.device
    distinct, inverse = torch.unique(tokens.rows_of(flat), return_inverse=True)  # (U,), (N,)
    idx = torch.zeros(B * T, dtype=torch.long, device=device)  # padding -> any distinct row
    idx[torch.tensor(pos, device=device)] = inverse
    idx = idx.view(B, T)
    emb = tokens.store.index_select(0, distinct)  # (U, P)
    x = emb[idx]  # (B, T, P)
    lengths = torch.tensor([k + 2 for k in n], device=device)
    if states is None and lstm is not None:
        layers, new_states = lstm(x, lengths, (emb, idx)), None
    else:
        shape_only = torch.empty(B, T, 0, dtype=torch.long, device=device)  # embed() reads only B, T here
        layers, new_states = model.embed(shape_only, lengths, states=states, token_embeddings=x)
    return layers.float().cpu().numpy(), n, new_states


def reduce_layers(layers: np.ndarray, mode: str = "all", mix: list[float] | None = None, gamma: float = 1.0
                  ) -> np.ndarray:
    """One sentence's `(L+1, n, 2P)` -> the dumped array: all as is, top `(n, 2P)`, average, or the mix
    ``gamma * sum_k mix_k * layer_k`` (weights used as given)."""
    if mix is not None:
        return (gamma * np.tensordot(np.asarray(mix, dtype=np.float32), layers, axes=1)).astype(np.float32)
    if mode == "top":
        return layers[-1]
    if mode == "average":
        return layers.mean(axis=0)
    return layers


def zero_states(model: BiLM, batch_size: int, device: torch.device) -> tuple:
    """All-zero `(forward, backward)` states, the start of the carried-state mode."""
    return tuple([layer.zero_state(batch_size, device) for layer in stack.layers]
                 for stack in (model.forward_lstm, model.backward_lstm))


def slice_states(states: tuple, batch_size: int) -> tuple:
    """The carried `(forward, backward)` states for a batch of `batch_size` rows (see `fit_states`)."""
    return tuple(fit_states(direction, batch_size) for direction in states)


# ---- the Python API -------------------------------------------------------------------------------------------------
class Embedder:
    """Contextual word vectors from a model directory or bilm-tf files.

    ``Embedder("model/")`` or ``Embedder(options_file="options.json", weight_file="weights.hdf5")``.

    # Parameters
    model_dir : `str | Path`, optional: a run directory or an `elmo-cli export` output.
    options_file, weight_file : `str | Path`, optional: bilm-tf's two files, instead of `model_dir`.
    device : `str`, optional, (default = `"cpu"`): ``cpu``, ``cuda``, ``cuda:1``, or ``auto``.
    token_cache : `str | Path`, optional: a `dump-token-embeddings` file; its tokens skip the char CNN.
    """

    def __init__(self, model_dir: str | Path | None = None, *, options_file: str | Path | None = None,
                 weight_file: str | Path | None = None, device: str = "cpu", token_cache: str | Path | None = None):
        self.loaded = load_model(model_dir, options_file, weight_file, device)
        self.model = self.loaded.model
        self.tokens = _token_embeddings(self.loaded, token_cache)
        self.lstm = StatelessBiLSTM(self.model)

    @property
    def n_layers(self) -> int:
        """L + 1."""
        return self.model.n_layers

    @property
    def dim(self) -> int:
        """2P, the width of every layer."""
        return self.model.config.output_dim

    def tokenize(self, line: str) -> list[str]:
        """How the command line splits a line: the model's SentencePiece pieces, else whitespace."""
        return self.loaded.text.tokenize(line)

    def embed_sentences(self, sentences: list[list[str]], batch_size: int = 64) -> list[np.ndarray]:
        """Embed tokenized sentences, stateless (the result never depends on batch size or order).

        # Parameters
        sentences : list of token lists (no ``<S>``/``</S>``: they are added).
        batch_size : `int`, optional, (default = `64`)

        # Returns
        one float32 array per sentence, shape `(L+1, n_tokens, 2P)`; an empty sentence gives `(L+1, 0, 2P)`.
        """
        if batch_size < 1:
            raise ElmoError(f"batch_size must be at least 1, got {batch_size}")
        for k, s in enumerate(sentences):
            if isinstance(s, str):
                raise ElmoError(f"sentence {k} is a string; give a list of tokens (e.g. line.split())")
        out: list[np.ndarray | None] = [None] * len(sentences)
        empty = np.zeros((self.n_layers, 0, self.dim), dtype=np.float32)
        todo = [k for k, s in enumerate(sentences) if len(s) > 0]
        for k in range(len(sentences)):
            if len(sentences[k]) == 0:
                out[k] = empty.copy()
        for batch in length_sorted_batches([len(sentences[k]) for k in todo], batch_size):
            ids = [todo[j] for j in batch]
            layers, n, _ = embed_batch(self.model, self.tokens, [list(sentences[k]) for k in ids], lstm=self.lstm)
            for b, k in enumerate(ids):
                out[k] = np.ascontiguousarray(layers[:, b, 1 : n[b] + 1])
        return out  # type: ignore[return-value]

    def embed_sentence(self, tokens: list[str]) -> np.ndarray:
        return self.embed_sentences([tokens])[0]


def _token_embeddings(loaded: LoadedModel, token_cache: str | Path | None) -> TokenEmbeddings:
    store = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)
    if token_cache is not None:
        vocab = loaded.text.vocab.tokens if loaded.text.vocab is not None else None
        tokens, emb = h5dump.read_token_cache(Path(token_cache), loaded.model.config.lstm.projection_dim, vocab)
        store.add_cache(tokens, emb)
    return store


# ---- dump-token-embeddings ------------------------------------------------------------------------------------------
def dump_token_embeddings(loaded: LoadedModel, vocab_path: Path, output: Path, force: bool = False,
                          on_progress: Callable[[int, int], None] | None = None) -> tuple[Path, int]:
    """bilm-tf's token cache: the encoder output of every vocabulary line, ``embedding (V, P)`` (+ ``tokens``).

    # Returns
    the output path and V.
    """
    from vocab.vocabulary import Vocabulary

    output = Path(output)
    _check_output(output, force)
    vocab = Vocabulary.load(vocab_path)
    store = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)
    parts = []
    for s in range(0, len(vocab), 4 * ENCODER_CHUNK):
        parts.append(store.encode(vocab.tokens[s : s + 4 * ENCODER_CHUNK]).cpu().numpy())
        if on_progress:
            on_progress(min(s + 4 * ENCODER_CHUNK, len(vocab)), len(vocab))
    h5dump.write_token_cache(output, vocab.tokens, np.concatenate(parts))
    return output, len(vocab)


# ---- dump-embeddings ------------------------------------------------------------------------------------------------
def _check_output(output: Path, force: bool) -> None:
    if output.exists() and not force:
        raise ElmoError(f"{output}: already exists; pass --force to overwrite it")
    if output.is_dir():
        raise ElmoError(f"{output}: is a directory")
    if not output.parent.is_dir():
        raise ElmoError(f"{output.parent}: output directory does not exist")


def count_lines(path: str | Path) -> int | None:
    """Lines in a plain or .gz file (None for standard input)."""
    path = str(path)
    if path == "-":
        return None
    import gzip

    n, last = 0, b"\n"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                n += block.count(b"\n")
                last = block[-1:]
    except OSError:
        return None
    return n + (last != b"\n")


def model_fingerprint(model: BiLM) -> str:
    """A short digest of the weights, so `--resume` refuses to mix two models in one file."""
    h = hashlib.sha256(json.dumps(model.config.to_options(), sort_keys=True).encode())
    for name, p in sorted(model.state_dict().items()):
        if name.startswith("softmax"):
            continue
        h.update(name.encode())
        h.update(np.float64(p.detach().float().sum().item()).tobytes())
    return h.hexdigest()[:16]


def _lines(input_path: Path, errors: str, tokenize: Callable[[str], list[str]]
           ) -> Iterator[tuple[int, str, list[str]]]:
    for i, (_, _, line) in enumerate(read_lines([str(input_path)], errors=errors)):
        yield i, line, tokenize(line)


def dump_embeddings(loaded: LoadedModel, input_path: Path, output: Path, *, layers: str = "all",
                    mix: list[float] | None = None, gamma: float = 1.0, batch_size: int = 64,
                    dtype: str = "float32", compression: str = "none", stateful: bool = False,
                    resume: bool = False, force: bool = False, sentence_index: bool = True,
                    token_cache: Path | None = None, errors: str = "strict", window_batches: int = WINDOW_BATCHES,
                    on_progress: Callable[[DumpProgress], None] | None = None,
                    on_warning: Callable[[str], None] | None = None) -> DumpResult:
    """Embed every line of a text file into one HDF5 file (layout: `elmo_cli.h5dump`).

    Lines are split like allennlp (``line.split()``) or into the model's SentencePiece pieces. Lines are read in
    windows of ``window_batches * batch_size``; within a window they are sorted by length into batches, so memory
    does not grow with the input. Output goes to ``OUTPUT.partial`` and is renamed when complete; ``resume``
    continues an interrupted run from its last complete window. Under torchrun each rank embeds lines
    ``i % world == rank`` into its own part file and rank 0 merges them.

    # Parameters
    layers : ``all`` `(L+1, n, 2P)`, ``top`` or ``average`` `(n, 2P)`; ``mix`` (L+1 weights) with ``gamma``
        gives ``gamma * sum_k mix_k * layer_k`` `(n, 2P)`.
    stateful : carry LSTM state from batch to batch in input order (the legacy bilm-tf/allennlp behaviour).
    """
    model = loaded.model
    output = Path(output)
    input_path = Path(input_path)
    L1, D = model.n_layers, model.config.output_dim
    if layers not in h5dump.LAYER_MODES:
        raise ElmoError(f"--layers {layers!r}: expected one of {', '.join(h5dump.LAYER_MODES)}")
    if mix is not None and len(mix) != L1:
        raise ElmoError(f"--mix has {len(mix)} weights but this model has {L1} layers (L+1)")
    if dtype not in h5dump.DTYPES:
        raise ElmoError(f"--dtype {dtype!r}: expected one of {', '.join(h5dump.DTYPES)}")
    if compression not in h5dump.COMPRESSIONS:
        raise ElmoError(f"--compression {compression!r}: expected one of {', '.join(h5dump.COMPRESSIONS)}")
    if batch_size < 1:
        raise ElmoError(f"--batch-size must be at least 1, got {batch_size}")
    if str(input_path) != "-" and not input_path.is_file():
        raise ElmoError(f"{input_path}: input file not found")
    _check_output(output, force)
    if stateful and on_warning:
        on_warning("--stateful: LSTM state is carried from batch to batch, so a sentence's vectors depend on the "
                   "lines before it and on --batch-size (the legacy bilm-tf/allennlp behaviour)")
    ddp, device = init_distributed(loaded.device)
    if device != loaded.device:  # a torchrun rank on a GPU takes the GPU of its LOCAL_RANK
        loaded.model.to(device)
        loaded = dataclasses.replace(loaded, device=device)
    rank, world = ddp.rank, ddp.world_size
    if world > 1 and str(input_path) == "-":
        raise ElmoError("under torchrun the input must be a file (every rank reads it), not standard input")
    mode = "mix" if mix is not None else layers
    settings = {
        "input": str(input_path.resolve()) if str(input_path) != "-" else "-",
        "input_bytes": input_path.stat().st_size if str(input_path) != "-" else None,
        "layers": mode, "mix": mix, "gamma": gamma if mix is not None else None, "dtype": dtype,
        "compression": compression, "stateful": stateful, "batch_size": batch_size if stateful else None,
        "model": model_fingerprint(model), "world_size": world,
    }
    tokens = _token_embeddings(loaded, token_cache)
    lstm = None if stateful else StatelessBiLSTM(model)
    total = count_lines(input_path)
    my_total = None if total is None else len(range(rank, total, world))
    part = h5dump.partial_path(output, rank if world > 1 else None)
    f, completed = h5dump.open_partial(part, settings, resume)
    sentence_to_index: dict[str, str] = {}
    done_lines = len(range(rank, completed, world))
    done_tokens = 0
    states = None
    window = max(1, window_batches) * batch_size

    def report() -> None:
        if on_progress:
            on_progress(DumpProgress(done_lines, done_tokens, my_total))

    def flush(items: list[tuple[int, list[str]]], end: int) -> None:
        """Embed and write one window's lines (this rank's share), then record lines < end as complete."""
        nonlocal done_lines, done_tokens, states
        datasets = {}
        for i, toks in items:  # created in line order, so the file lists them in input order
            datasets[i] = h5dump.create_line_dataset(f, i, h5dump.dataset_shape(mode, L1, len(toks), D), dtype,
                                                     compression)
        if stateful:  # input order, empty lines included as "<S> </S>" (they advance the state, as in bilm-tf)
            batches = [list(range(s, min(s + batch_size, len(items)))) for s in range(0, len(items), batch_size)]
        else:
            nonempty = [k for k, (_, toks) in enumerate(items) if toks]
            batches = [[nonempty[j] for j in b]
                       for b in length_sorted_batches([len(items[k][1]) for k in nonempty], batch_size)]
            done_lines += len(items) - len(nonempty)
        for batch in batches:
            if stateful:
                states = zero_states(model, len(batch), loaded.device) if states is None else \
                    slice_states(states, len(batch))
            out, n, new_states = embed_batch(model, tokens, [items[k][1] for k in batch], states, lstm)
            if stateful:
                states = new_states
            for b, k in enumerate(batch):
                if n[b]:
                    datasets[items[k][0]][...] = reduce_layers(out[:, b, 1 : n[b] + 1], layers, mix, gamma)
            done_lines += len(batch)
            done_tokens += sum(n)
            report()
        h5dump.mark_completed(f, end)

    try:
        report()
        pending: list[tuple[int, list[str]]] = []
        start = completed
        i = -1
        for i, line, toks in _lines(input_path, errors, loaded.text.tokenize):
            if sentence_index and rank == 0:
                sentence_to_index[line.strip()] = str(i)
            if i < completed:
                continue
            if i % world == rank:
                pending.append((i, toks))
            if i + 1 - start >= window:
                flush(pending, i + 1)
                pending, start = [], i + 1
        if pending or i + 1 > start:
            flush(pending, i + 1)
        n_lines = i + 1
        if world == 1:
            h5dump.strip_bookkeeping(f)
            if sentence_index:
                h5dump.write_sentence_index(f, sentence_to_index)
            f.close()
            publish(part, output)
        else:
            f.close()
            _merge_ranks(output, rank, world, n_lines, sentence_to_index if sentence_index else None)
    finally:
        if f.id.valid:
            f.close()
    return DumpResult(output, n_lines, done_tokens, completed)


def _merge_ranks(output: Path, rank: int, world: int, n_lines: int, sentence_to_index: dict | None) -> None:
    """After a barrier rank 0 copies every rank's part, in line order, into one file; the others wait for it."""
    import h5py
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        parts = [h5dump.partial_path(output, r) for r in range(world)]
        tmp = h5dump.partial_path(output)
        handles = [h5py.File(p, "r") for p in parts]
        try:
            with h5py.File(tmp, "w", track_order=True) as f:
                for i in range(n_lines):
                    src = handles[i % world]
                    src.copy(src[str(i)], f, name=str(i))
                if sentence_to_index is not None:
                    h5dump.write_sentence_index(f, sentence_to_index)
        finally:
            for h in handles:
                h.close()
        publish(tmp, output)
        for p in parts:
            p.unlink(missing_ok=True)
    dist.barrier()

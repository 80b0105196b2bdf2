"""Contextual embeddings out of a biLM: the token memo, `embed_batch` and the `Embedder` Python API.

Stateless by default: every sentence starts from zero LSTM state, so a sentence's vectors never depend on what else
is in its batch or what came before. The token encoder (char CNN + highway + projection) runs once per distinct
token string: its outputs are kept in `TokenEmbeddings`, a bounded memo that can be pre-filled from a token cache
file (`dump-token-embeddings`), so a cached token never goes through the char CNN. The LSTMs run in
`elmo_cli.model.lstm.BiLSTMKernel`; files are written by `elmo_cli.dump`.

    Embedder("model/").embed_sentences([["The", "cat", "."]])[0].shape -> (L+1, 3, 2P)
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from elmo_cli import h5dump
from elmo_cli.inputs import length_sorted_batches
from elmo_cli.layers import LayerSelection
from elmo_cli.loading import LoadedModel, load_model
from elmo_cli.machine import bf16_problem
from elmo_cli.model.bilm import BiLM, add_boundaries, bilm_layers, to_model_chars
from elmo_cli.model.lstm import BiLSTMKernel
from vocab.errors import ElmoError

ENCODER_CHUNK = 256  # distinct tokens per encoder call: (256, 50, F) conv activations = 100 MB at F = 2048
MEMO_CAPACITY = 50_000  # distinct tokens remembered between batches (50k x 512 floats = 100 MB for `original`)


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


@torch.no_grad()
def embed_batch(model: BiLM, tokens: TokenEmbeddings, sentences: list[list[str]], states: tuple | None = None,
                lstm: BiLSTMKernel | None = None) -> tuple[torch.Tensor, list[int], tuple | None]:
    """Embed one batch of token lists (boundaries added here): the token memo, then the biLM's one forward
    (`bilm_layers`); `lstm` (stateless only) is the fast path.

    # Parameters
    sentences : B token lists without boundaries. states : None (zero state) or the carried states.

    # Returns
    layers `(L+1, B, T, 2P)` float32 on the model's device (not waited for: a GPU may still be computing them)
    where sentence b's tokens are positions ``1 .. n_b`` (0 is ``<S>``), the lengths ``n_b``, and the final LSTM
    states (for the carried-state mode).
    """
    B = len(sentences)
    n = [len(s) for s in sentences]
    device = tokens.device
    flat = [t for s in sentences for t in s] + [tokens.chars.bos_token, tokens.chars.eos_token]  # then the boundaries
    distinct, inverse = torch.unique(tokens.rows_of(flat), return_inverse=True)  # (U,), (N + 2,)
    words = torch.zeros(B, max(n), dtype=torch.long, device=device)  # padding -> any distinct row
    n_words = torch.tensor(n, device=device)
    words[torch.arange(max(n), device=device).unsqueeze(0) < n_words.unsqueeze(1)] = inverse[:-2]
    idx, lengths = add_boundaries(words, n_words, inverse[-2], inverse[-1])  # (B, T) rows of <S> w1 .. wn </S>
    emb = tokens.store.index_select(0, distinct)  # (U, P)
    x = emb[idx]  # (B, T, P)
    layers, new_states = bilm_layers(model.stacks, x, lengths, states, kernel=lstm, distinct=(emb, idx))
    return layers.float(), n, new_states


# ---- the Python API -------------------------------------------------------------------------------------------------
class Embedder:
    """Contextual word vectors from a model directory or bilm-tf files.

    ``Embedder("model/")``, ``Embedder("elmo_2x4096_512_2048cnn_2xhighway_options.json")`` (the weights file
    beside it, named with ``weights`` for ``options`` and ``.hdf5``), or
    ``Embedder(options_file="options.json", weight_file="weights.hdf5")``. Each may be an http(s) URL, as allennlp
    took them: downloaded once into the cache (`elmo_cli.fetch`; ``elmo_cli.fetch.configure(cache_dir=...,
    offline=True)`` sets where, or forbids the network).

    # Parameters
    model_dir : `str | Path`, optional: a run directory, an `elmo-cli export` output, or an options.json file.
    options_file, weight_file : `str | Path`, optional: bilm-tf's two files, instead of `model_dir`; or
        `weight_file` alone beside an options.json `model_dir` with another name.
    device : `str`, optional, (default = `"auto"`): ``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:1``.
    token_cache : `str | Path`, optional: a `dump-token-embeddings` file; its tokens skip the char CNN.
    compute_dtype : `str`, optional, (default = `"fp32"`): ``bf16`` runs the LSTMs' matrix products in bfloat16
        (faster on CPUs with AVX512-BF16/AMX and on GPUs; approximate).
    """

    def __init__(self, model_dir: str | Path | None = None, *, options_file: str | Path | None = None,
                 weight_file: str | Path | None = None, device: str = "auto", token_cache: str | Path | None = None,
                 compute_dtype: str = "fp32"):
        self.loaded = load_model(model_dir, options_file, weight_file, device)
        self.model = self.loaded.model
        self.tokens = token_embeddings(self.loaded, token_cache)
        self.lstm = self.loaded.lstm_kernel(compute_dtype_of(compute_dtype))
        problem = bf16_problem(self.loaded.device) if compute_dtype == "bf16" else None
        if problem:
            warnings.warn(f"compute_dtype='bf16': {problem}; fp32 is exact and faster here", stacklevel=2)

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

    def embed_sentences(self, sentences: list[list[str]], batch_size: int = 64,
                        layers: LayerSelection | str = "all") -> list[np.ndarray]:
        """Embed tokenized sentences, stateless (the result never depends on batch size or order).

        # Parameters
        sentences : list of token lists (no ``<S>``/``</S>``: they are added).
        batch_size : `int`, optional, (default = `64`)
        layers : `LayerSelection` or its ``--layers`` spelling (``all``, ``top``, ``average``, ``1,2``),
            (default = ``"all"``).

        # Returns
        one float32 array per sentence of ``layers.shape(L+1, n_tokens, 2P)``: `(L+1, n_tokens, 2P)` for ``all``;
        an empty sentence gives a zero-length token axis.
        """
        select = layers if isinstance(layers, LayerSelection) else LayerSelection.parse(layers)
        select.check(self.n_layers)
        if batch_size < 1:
            raise ElmoError(f"batch_size must be at least 1, got {batch_size}")
        for k, s in enumerate(sentences):
            if isinstance(s, str):
                raise ElmoError(f"sentence {k} is a string; give a list of tokens (e.g. line.split())")
        out: list[np.ndarray | None] = [None] * len(sentences)
        todo = [k for k, s in enumerate(sentences) if len(s) > 0]
        for k in range(len(sentences)):
            if len(sentences[k]) == 0:
                out[k] = np.zeros(select.shape(self.n_layers, 0, self.dim), dtype=np.float32)
        for batch in length_sorted_batches([len(sentences[k]) for k in todo], batch_size):
            ids = [todo[j] for j in batch]
            layers_b, n, _ = embed_batch(self.model, self.tokens, [list(sentences[k]) for k in ids], lstm=self.lstm)
            result = select.reduce_batch(layers_b).cpu().numpy()  # (B, ..., T, 2P)
            for b, k in enumerate(ids):
                out[k] = np.ascontiguousarray(LayerSelection.line(result, b, n[b]))
        return out  # type: ignore[return-value]

    def embed_sentence(self, tokens: list[str]) -> np.ndarray:
        return self.embed_sentences([tokens])[0]


COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def compute_dtype_of(name: str) -> torch.dtype | None:
    """``"fp32"`` -> None (exact), ``"bf16"`` -> torch.bfloat16; ElmoError otherwise."""
    if name not in COMPUTE_DTYPES:
        raise ElmoError(f"--compute-dtype {name!r}: expected fp32 or bf16")
    return COMPUTE_DTYPES[name]


def token_embeddings(loaded: LoadedModel, token_cache: str | Path | None) -> TokenEmbeddings:
    """The memo of a loaded model, pre-filled from a `dump-token-embeddings` file when one is given."""
    store = TokenEmbeddings(loaded.model, loaded.text.chars, loaded.device)
    if token_cache is not None:
        vocab = loaded.text.vocab.tokens if loaded.text.vocab is not None else None
        tokens, emb = h5dump.read_token_cache(Path(token_cache), loaded.model.config.lstm.projection_dim, vocab)
        store.add_cache(tokens, emb)
    return store

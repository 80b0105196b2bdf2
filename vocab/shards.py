"""Shards: a corpus encoded once into memory-mappable numpy files, shuffled, with a manifest.

Directory layout (``FORMAT_VERSION`` 1)::

    DIR/manifest.json          written last and atomically: its presence means the directory is complete
    DIR/vocab.txt              the vocabulary the ids refer to (and DIR/spm.model when it came with one)
    DIR/chars.json             the character encoder (`vocab.chars.load_chars`)
    DIR/shard-00000/           one directory per shard, four .npy files (np.load(mmap_mode="r") works):
        token_ids.npy    int32  (n_tokens,)          vocabulary id of each running token
        char_index.npy   int32  (n_tokens,)          row of char_table for each running token
        char_table.npy   uint16 (n_distinct, W)      raw character ids, once per distinct token of the shard (an
                                                     ELMoForManyLangs model's encoder: int32 (n_distinct, W + 1),
                                                     the word id last, `vocab.chars.EfmlChars`)
        offsets.npy      int64  (n_sentences + 1,)   sentence i is tokens offsets[i]:offsets[i+1]

``<S>``/``</S>`` are not stored; readers add them. Blank lines are skipped (and counted).

How `write_shards` keeps memory bounded and the output deterministic:

1. pass 1 streams the corpus and counts sentences and tokens (and code points in codepoint mode);
   ``n_shards = ceil(tokens / tokens_per_shard)``;
2. pass 2 streams it again and sends each non-blank line to a bucket drawn from ``default_rng(seed)``; buckets
   are spill files of raw lines in ``DIR/.tmp-shard/`` (buffered, flushed every 8 MB);
3. each bucket (about ``tokens_per_shard`` tokens) is read, shuffled with ``default_rng([seed, k])``, tokenized
   and encoded into shard k, one bucket per worker process. Each shard depends only on its bucket, so ``--workers`` never
   changes the bytes.
"""
from __future__ import annotations

import array
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from vocab.chars import MAX_CHARS, CodepointChars, read_chars
from vocab.efml import is_efml_dir, read_efml_chars
from vocab.errors import ElmoError
from vocab.text import STDIN, atomic_write_bytes, expand_paths, read_json, read_lines
from vocab.tokenize import CHARS_FILE, SPM_FILE, VOCAB_FILE, TextEncoder
from vocab.vocabulary import Vocabulary

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TMP_DIR = ".tmp-shard"
SHARD_FILES = ("token_ids", "char_index", "char_table", "offsets")
_SPILL_FLUSH_BYTES = 8 << 20


@dataclass
class ShardSummary:
    """What `write_shards` wrote."""

    directory: Path
    manifest: dict
    sentences: int
    tokens: int
    blank_lines: int
    oov_tokens: int
    shards: int
    bytes: int
    text_bytes: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens if self.tokens else 0.0

    @property
    def oov_rate(self) -> float:
        return self.oov_tokens / self.tokens if self.tokens else 0.0


def _file_sha256(path: Path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def _shard_name(k: int) -> str:
    return f"shard-{k:05d}"


def _prepare_output(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ElmoError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ElmoError(f"{out}: output directory is not empty; pass --force to overwrite it")
        # The manifest goes first, so the directory stops looking like a dataset before anything else changes.
        (out / MANIFEST).unlink(missing_ok=True)
        for p in out.iterdir():
            if p.name.startswith("shard-") or p.name == TMP_DIR:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            elif p.name in (VOCAB_FILE, CHARS_FILE, SPM_FILE):
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _sentences(files: list[str], encoder: TextEncoder, errors: str, counts: dict) -> Iterator[list[str]]:
    """Token lists of non-blank lines; counts blank lines and text bytes into ``counts``."""
    for _, _, line in read_lines(files, errors):
        counts["text_bytes"] += len(line) + 1
        tokens = encoder.tokenize(line) if line and not line.isspace() else []
        if tokens:
            yield tokens
        else:
            counts["blank_lines"] += 1


def _spool_stdin(tmp: Path) -> str:
    path = tmp / "stdin.txt"
    import sys

    with open(path, "wb") as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
    return str(path)


def write_shards(
    corpus: list[str | Path] | str | Path,
    vocab: str | Path,
    output: str | Path,
    *,
    tokens_per_shard: int = 1_000_000,
    seed: int = 0,
    workers: int = 1,
    chars: str = "bytes",
    max_chars_vocab: int = 2000,
    max_characters_per_token: int = MAX_CHARS,
    errors: str = "strict",
    force: bool = False,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> ShardSummary:
    """Encode a corpus into shuffled shards in ``output`` (see the module docstring).

    # Parameters
    corpus : files, globs, ``-``, ``.gz``; one sentence per line (raw text when the vocabulary has an spm model).
    vocab : a vocabulary file (its ``<stem>.spm.model`` is used when present) or a directory with vocab.txt.
    output : the shard directory; must be empty or absent unless ``force``.
    tokens_per_shard : about this many running tokens per shard; bounds the memory of each worker.
    seed : the shuffle seed; the same input and seed give byte-identical files.
    workers : processes encoding shards in parallel; output identical to ``workers=1``.
    chars : ``"bytes"`` (bilm-tf compatible), ``"codepoint"`` (a table of the ``max_chars_vocab`` most frequent
        code points of the corpus tokens + one fallback id), or the path of a shard or model directory (or its
        chars.json) whose table to reuse: held-out shards for `train --validation` of a codepoint model.
    on_progress : called as ``on_progress(stage, done, total)`` with stage ``count``/``spill``/``encode``.

    # Returns
    `ShardSummary` with the manifest dict.
    """
    if tokens_per_shard < 1:
        raise ElmoError(f"--tokens-per-shard must be at least 1, got {tokens_per_shard}")
    if workers < 1:
        raise ElmoError(f"--workers must be at least 1, got {workers}")
    reused = None if chars in ("bytes", "codepoint") else _reused_chars(chars)
    files = expand_paths(corpus)
    encoder = TextEncoder.from_vocab_file(vocab)
    from vocab.chars import ByteChars

    encoder.chars = reused or ByteChars(max_characters_per_token)
    if reused is not None:
        chars = reused.mode + " (reused)"  # no table is built from this corpus
    out = Path(output)
    created = not out.exists()
    _prepare_output(out, force)
    tmp = out / TMP_DIR
    tmp.mkdir()
    progress = on_progress or (lambda stage, done, total: None)
    ok = False
    try:
        if STDIN in files:
            files = [_spool_stdin(tmp) if f == STDIN else f for f in files]
        counts = Counter(text_bytes=0, blank_lines=0)
        n_sentences, n_tokens = _count_pass(files, encoder, errors, counts, chars, max_chars_vocab,
                                            max_characters_per_token, progress)
        n_shards = max(1, math.ceil(n_tokens / tokens_per_shard))
        spill = _spill_pass(files, errors, n_shards, n_sentences, seed, tmp, progress)
        jobs = [(str(spill[k]), str(out / _shard_name(k)), seed, k) for k in range(n_shards)]
        results = _encode_pass(jobs, encoder, workers, progress)
        encoder.save_to(out)
        manifest = _manifest(encoder, results, counts, n_sentences, n_tokens, seed, tokens_per_shard, files, tmp)
        shutil.rmtree(tmp)
        atomic_write_bytes(out / MANIFEST, (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
        ok = True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok and created:
            shutil.rmtree(out, ignore_errors=True)  # we made it, so nothing of the user's is lost
    return ShardSummary(
        directory=out,
        manifest=manifest,
        sentences=manifest["total_sentences"],
        tokens=manifest["total_tokens"],
        blank_lines=manifest["blank_lines"],
        oov_tokens=manifest["oov_tokens"],
        shards=n_shards,
        bytes=manifest["shard_bytes"],
        text_bytes=counts["text_bytes"],
    )


def _reused_chars(where: str):
    """The character table of an earlier `shard` run (its directory or chars.json), or of a model directory
    (an ELMoForManyLangs one too): held-out shards must encode characters as the training shards do, and text to
    fine-tune a model as the model does."""
    path = Path(where)
    if path.is_dir() and is_efml_dir(path):
        return read_efml_chars(path)
    if path.is_dir():
        path = path / CHARS_FILE
    if not path.is_file():
        raise ElmoError(f"--chars {where!r}: expected bytes, codepoint, or the shard directory (or its chars.json) "
                        f"whose character table to reuse")
    return read_chars(path)


def _count_pass(files: list[str], encoder: TextEncoder, errors: str, counts: Counter, chars: str,
                max_chars_vocab: int, max_characters_per_token: int, progress) -> tuple[int, int]:
    """Pass 1: sentences and tokens (and, for ``codepoint``, the character table, set on ``encoder``)."""
    n_sentences = n_tokens = 0
    char_counts: Counter[str] = Counter()
    for tokens in _sentences(files, encoder, errors, counts):
        n_sentences += 1
        n_tokens += len(tokens)
        if chars == "codepoint":
            char_counts.update("".join(t for t in tokens if t not in ("<S>", "</S>")))
        if n_sentences % 50000 == 0:
            progress("count", n_sentences, 0)
    if n_sentences == 0:
        raise ElmoError(f"{', '.join(files)}: corpus is empty ({counts['blank_lines']} blank lines, no tokens)")
    if chars == "codepoint":
        encoder.chars = CodepointChars.build(char_counts, max_chars_vocab, max_characters_per_token)
    return n_sentences, n_tokens


def _spill_pass(files: list[str], errors: str, n_shards: int, n_sentences: int, seed: int, tmp: Path,
                progress) -> list[Path]:
    """Pass 2: each sentence to a seeded random bucket file (bounded buffers); returns the bucket paths."""
    rng = np.random.default_rng(seed)
    buffers: list[list[bytes]] = [[] for _ in range(n_shards)]
    buffered = 0
    spill = [tmp / f"bucket-{k:05d}.txt" for k in range(n_shards)]
    for p in spill:
        p.touch()

    def flush() -> None:
        for k, buf in enumerate(buffers):
            if buf:
                with open(spill[k], "ab") as f:
                    f.writelines(buf)
                buf.clear()

    block = np.empty(0, dtype=np.int64)
    pos = done = 0
    for _, _, line in read_lines(files, errors):
        if not line or line.isspace():
            continue
        if pos == len(block):
            block, pos = rng.integers(0, n_shards, size=65536), 0
        k = int(block[pos])
        pos += 1
        data = (line + "\n").encode("utf-8")
        buffers[k].append(data)
        buffered += len(data)
        if buffered >= _SPILL_FLUSH_BYTES:
            flush()
            buffered = 0
        done += 1
        if done % 50000 == 0:
            progress("spill", done, n_sentences)
    flush()
    if done < n_sentences:
        raise ElmoError(f"{', '.join(files)}: corpus changed while it was being read ({n_sentences} then {done} lines)")
    return spill


def _encode_pass(jobs: list[tuple], encoder: TextEncoder, workers: int, progress) -> list[dict]:
    """Pass 3: shuffle and encode each bucket into its shard, in ``workers`` processes (same output as one)."""
    n_shards = len(jobs)
    results = []
    if workers == 1 or n_shards == 1:
        for i, job in enumerate(jobs):
            results.append(_encode_bucket(job, encoder))
            progress("encode", i + 1, n_shards)
        return results
    # fork: workers need no re-import of __main__ and run numpy only (no torch, no OpenMP) after the fork.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(min(workers, n_shards), initializer=_init_worker, initargs=(encoder,)) as pool:
        for i, r in enumerate(pool.imap(_encode_bucket_in_worker, jobs)):
            results.append(r)
            progress("encode", i + 1, n_shards)
    return results


def _manifest(encoder: TextEncoder, results: list[dict], counts: Counter, n_sentences: int, n_tokens: int,
              seed: int, tokens_per_shard: int, files: list[str], tmp: Path) -> dict:
    shard_bytes = sum(r["bytes"] for r in results)
    manifest = {
        "format_version": FORMAT_VERSION,
        "vocab_sha256": encoder.vocab.sha256,
        "vocab_size": len(encoder.vocab),
        "tokenizer": encoder.tokenizer,
        "chars": encoder.chars.mode,
        "max_characters_per_token": encoder.chars.max_chars,
        "n_characters": encoder.chars.n_characters,
        "total_sentences": sum(r["sentences"] for r in results),
        "total_tokens": sum(r["tokens"] for r in results),
        "oov_tokens": sum(r["oov_tokens"] for r in results),
        "blank_lines": counts["blank_lines"] + n_sentences - sum(r["sentences"] for r in results),
        "text_bytes": counts["text_bytes"],
        "shard_bytes": shard_bytes,
        "bytes_per_token": round(shard_bytes / n_tokens, 4),
        "seed": seed,
        "tokens_per_shard": tokens_per_shard,
        "sources": [os.path.basename(f) if f.startswith(str(tmp)) else f for f in files],
        "shards": [{k: r[k] for k in ("path", "sentences", "tokens", "distinct_tokens", "sha256", "files")}
                   for r in results],
    }
    if encoder.tokenizer == "whitespace":
        assert (manifest["total_sentences"], manifest["total_tokens"]) == (n_sentences, n_tokens)
    return manifest


_worker_encoder: TextEncoder | None = None


def _init_worker(encoder: TextEncoder) -> None:
    global _worker_encoder
    _worker_encoder = encoder


def _encode_bucket_in_worker(job: tuple) -> dict:
    assert _worker_encoder is not None
    return _encode_bucket(job, _worker_encoder)


def _save_npy(path: Path, array: np.ndarray) -> tuple[str, int]:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return _file_sha256(path), path.stat().st_size


def _encode_bucket(job: tuple, encoder: TextEncoder) -> dict:
    """Shuffle one spill file's lines, tokenize them and write them as one shard."""
    spill, shard_dir, seed, k = job
    with open(spill, "rb") as f:
        sentences = f.read().decode("utf-8").split("\n")[:-1]
    os.unlink(spill)
    order = np.random.default_rng([seed, k]).permutation(len(sentences))
    # Distinct tokens in first-occurrence order: vocabulary lookup and character encoding once per type.
    # Sentences go in chunks through one join/split and C-level dict lookups (no Python loop per token).
    local: dict[str, int] = {}
    index = array.array("i")
    lengths: list[int] = []
    tokenize = encoder.tokenize
    for c0 in range(0, len(order), 2048):
        tok_lists = [tokenize(sentences[j]) for j in order[c0 : c0 + 2048]]
        lengths.extend(len(t) for t in tok_lists if t)  # a line may tokenize to nothing: it counts as blank
        toks = list(itertools.chain.from_iterable(tok_lists))
        for t in dict.fromkeys(toks):
            if t not in local:
                local[t] = len(local)
        index.extend(map(local.__getitem__, toks))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    del sentences
    char_index = np.frombuffer(index, dtype=np.int32) if len(index) else np.zeros(0, dtype=np.int32)
    distinct = list(local)
    distinct_ids = encoder.vocab.encode(distinct)
    token_ids = distinct_ids[char_index]
    chars = encoder.chars
    char_table = np.empty((len(distinct), chars.row_width), dtype=chars.row_dtype)
    for i, t in enumerate(distinct):
        char_table[i] = chars.encode(t)
    chars._cache.clear()

    d = Path(shard_dir)
    d.mkdir()
    name = d.name
    files = {}
    size = 0
    h = hashlib.sha256()
    for key, arr in zip(SHARD_FILES, (token_ids, char_index, char_table, offsets)):
        digest, n = _save_npy(d / f"{key}.npy", arr)
        files[key] = {"path": f"{name}/{key}.npy", "sha256": digest, "bytes": n}
        h.update(digest.encode())
        size += n
    return {
        "path": name,
        "sentences": len(offsets) - 1,
        "tokens": int(offsets[-1]),
        "distinct_tokens": len(distinct),
        "oov_tokens": int(np.count_nonzero(token_ids == encoder.vocab.unk_id)),
        # A shard's sha256 is the sha256 of its files' hex digests, concatenated in SHARD_FILES order.
        "sha256": h.hexdigest(),
        "files": files,
        "bytes": size,
    }


class ShardDataset:
    """Read a shard directory: sentences in stored (shuffled) order, by index or streamed.

    ``ShardDataset("shards/").sentence(0) -> (token_ids int32 (n,), char_ids uint16 (n, W))`` without ``<S>``/``</S>``.

    Shard files are memory-mapped lazily and cached; a global index of first sentences per shard makes
    `sentence` O(log n_shards). ``verify=True`` checks every file's sha256 against the manifest at open time.
    """

    def __init__(self, directory: str | Path, verify: bool = True):
        self.directory = Path(directory)
        self.manifest = _read_manifest(self.directory)
        m = self.manifest
        self.shards: list[dict] = m["shards"]
        self.num_sentences: int = m["total_sentences"]
        self.total_tokens: int = m["total_tokens"]
        self.oov_tokens: int = m.get("oov_tokens", 0)
        for shard in self.shards:
            for key in SHARD_FILES:
                path = self.directory / shard["files"][key]["path"]
                if not path.is_file():
                    raise ElmoError(f"{path}: shard file missing; re-run elmo-cli shard")
                if verify and _file_sha256(path) != shard["files"][key]["sha256"]:
                    raise ElmoError(f"{path}: sha256 does not match {self.directory / MANIFEST}; the file is corrupt")
        self.encoder = TextEncoder.from_dir(self.directory)
        if self.encoder.vocab is None:
            raise ElmoError(f"{self.directory / VOCAB_FILE}: missing; a shard directory carries its vocabulary")
        if self.encoder.vocab.sha256 != m["vocab_sha256"]:
            raise ElmoError(f"{self.directory / VOCAB_FILE}: sha256 differs from vocab_sha256 in {MANIFEST}")
        if self.encoder.chars.mode != m["chars"]:
            raise ElmoError(f"{self.directory / CHARS_FILE}: mode {self.encoder.chars.mode!r} but manifest says {m['chars']!r}")
        counts = [s["sentences"] for s in self.shards]
        if sum(counts) != self.num_sentences or sum(s["tokens"] for s in self.shards) != self.total_tokens:
            raise ElmoError(f"{self.directory / MANIFEST}: shard counts do not add up to total_sentences/total_tokens")
        # first[k] = global index of shard k's first sentence
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def vocab(self) -> Vocabulary:
        return self.encoder.vocab

    @property
    def chars(self):
        return self.encoder.chars

    def __len__(self) -> int:
        return self.num_sentences

    def __repr__(self) -> str:
        return f"ShardDataset({str(self.directory)!r}, {self.num_sentences} sentences, {self.total_tokens} tokens)"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}  # never pickle the memory maps (DataLoader workers reopen them)
        return state

    def _shard(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        arrays = self._cache.get(k)
        if arrays is None:
            files = self.shards[k]["files"]
            arrays = tuple(np.load(self.directory / files[key]["path"], mmap_mode="r") for key in SHARD_FILES)
            self._cache[k] = arrays
        return arrays

    def sentence(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids int32 ``(n,)`` and raw char ids uint16 ``(n, max_chars)`` of sentence ``i`` (no boundaries)."""
        if not 0 <= i < self.num_sentences:
            raise IndexError(f"sentence {i} out of range (0..{self.num_sentences - 1})")
        k = int(np.searchsorted(self._first, i, side="right")) - 1
        token_ids, char_index, char_table, offsets = self._shard(k)
        j = i - int(self._first[k])
        start, end = int(offsets[j]), int(offsets[j + 1])
        return np.array(token_ids[start:end]), char_table[char_index[start:end]]

    def sentence_lengths(self) -> np.ndarray:
        """Tokens per sentence in stored order, int64 ``(num_sentences,)``."""
        return np.concatenate([np.diff(np.asarray(self._shard(k)[3])) for k in range(len(self.shards))])

    def iter_sentences(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every sentence in stored order, as `sentence` returns them."""
        for k in range(len(self.shards)):
            token_ids, char_index, char_table, offsets = self._shard(k)
            table = np.asarray(char_table)
            for j in range(len(offsets) - 1):
                start, end = int(offsets[j]), int(offsets[j + 1])
                yield np.array(token_ids[start:end]), table[char_index[start:end]]

    def iter_chunks(self, n_tokens: int, add_boundaries: bool = True) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The dataset as one stream cut into chunks of ``n_tokens`` (the last may be shorter).

        With ``add_boundaries`` each sentence is ``<S> w1 .. wn </S>`` in the stream (bilm-tf's packing).
        Yields token ids int32 ``(n,)`` and char ids uint16 ``(n, max_chars)``.
        """
        if n_tokens < 1:
            raise ValueError("n_tokens must be positive")
        vocab, chars = self.vocab, self.chars
        bos = (np.array([vocab.bos_id], np.int32), chars.encode(chars.bos_token)[None])
        eos = (np.array([vocab.eos_id], np.int32), chars.encode(chars.eos_token)[None])
        ids_buf: list[np.ndarray] = []
        chr_buf: list[np.ndarray] = []
        have = 0
        for ids, ch in self.iter_sentences():
            parts = [bos, (ids, ch), eos] if add_boundaries else [(ids, ch)]
            for a, c in parts:
                ids_buf.append(a)
                chr_buf.append(c)
                have += len(a)
            while have >= n_tokens:
                all_ids, all_chr = np.concatenate(ids_buf), np.concatenate(chr_buf)
                yield all_ids[:n_tokens], all_chr[:n_tokens]
                ids_buf, chr_buf = [all_ids[n_tokens:]], [all_chr[n_tokens:]]
                have -= n_tokens
        if have:
            yield np.concatenate(ids_buf), np.concatenate(chr_buf)

    def check_vocab(self, vocab: Vocabulary) -> None:
        """Raise ElmoError unless ``vocab`` is the vocabulary these shards were encoded with."""
        if vocab.sha256 != self.manifest["vocab_sha256"]:
            raise ElmoError(
                f"{self.directory / MANIFEST}: shards were encoded with vocabulary sha256 "
                f"{self.manifest['vocab_sha256'][:12]}…, but the given vocabulary is {vocab.sha256[:12]}…"
            )


_REQUIRED = {
    "format_version": int,
    "vocab_sha256": str,
    "chars": str,
    "max_characters_per_token": int,
    "total_sentences": int,
    "total_tokens": int,
    "oov_tokens": int,
    "shards": list,
}


def _read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ElmoError(f"{directory}: no such shard directory")
    if not path.is_file():
        raise ElmoError(f"{path}: missing; not a shard directory, or `elmo-cli shard` did not finish (re-run it)")
    m = read_json(path, "manifest")
    if not isinstance(m, dict):
        raise ElmoError(f"{path}: corrupt manifest (not a JSON object)")
    for key, typ in _REQUIRED.items():
        if not isinstance(m.get(key), typ):
            raise ElmoError(f"{path}: corrupt manifest (key {key!r} missing or not {typ.__name__})")
    if m["format_version"] != FORMAT_VERSION:
        raise ElmoError(f"{path}: format_version {m['format_version']} is not supported (expected {FORMAT_VERSION})")
    for s in m["shards"]:
        if not (isinstance(s, dict) and isinstance(s.get("files"), dict) and all(k in s["files"] for k in SHARD_FILES)
                and isinstance(s.get("sentences"), int) and isinstance(s.get("tokens"), int)):
            raise ElmoError(f"{path}: corrupt manifest (bad shard entry {str(s)[:60]})")
    return m

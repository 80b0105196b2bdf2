"""elmo-cli's dump of an ELMoForManyLangs model beside ELMoForManyLangs' own `Embedder.sents2elmo`, one run.

The model: EFML's published shape (its packaged ``cnn_50_100_512_4096_sample.json``: char CNN with the 2,048
filters and 2 highways, word embeddings of 100 beside it, LSTM 4096 projected to 512, 2 layers), random weights,
its dictionaries from the sentences' own words and characters, written as EFML's directory (config.json, char.dic,
word.dic, token_embedder.pkl, encoder.pkl). The sentences: bench_embed's 200 Austen sentences (about 25 tokens).
Every layer, batch 64, 2 threads, each side in its own fresh process so that its peak RSS (VmHWM, model loading
included) is its own:
- elmo-cli: `dump_embeddings` (what `elmo-cli dump-embeddings --model DIR --layers all` runs), HDF5 written;
- EFML: ``Embedder(DIR, batch_size=64).sents2elmo(sentences, output_layer=-2)`` (its vectors in memory).
In each process: one warm-up call on the first CHECK sentences (one batch, so EFML starts it from zero LSTM state:
its encoder carries states between batches), whose vectors are compared across the sides before any figure, then
REPEATS timed passes over all sentences; min and median tokens/s. Result file: benchmarks/results/efml-DATE.json.

EFML is not a dependency of elmo-cli: the benchmark looks for it in bench-out/efml-site, where ``make bench``
installs it (``pip install --target bench-out/efml-site --no-deps elmoformanylangs==0.0.4.post2 overrides==3.1.0``:
EFML needs ``overrides`` below 4), and skips with one line when it is not there.

    python -m benchmarks.run efml        (or: python -m benchmarks.bench_efml)
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.results import Recording, child_figures, own_peak_rss_mb

ROOT = Path(__file__).resolve().parent.parent
EFML_SITE = ROOT / "bench-out" / "efml-site"
INSTALL = ("python -m pip install --target bench-out/efml-site --no-deps elmoformanylangs==0.0.4.post2 "
           "overrides==3.1.0")
THREADS, BATCH, CHECK, REPEATS = 2, 64, 16, 3
CONFIG_NAME = "cnn_50_100_512_4096_sample.json"


def efml_available() -> bool:
    return (EFML_SITE / "elmoformanylangs" / "__init__.py").is_file()


def write_model(directory: Path, sentences: list[list[str]], seed: int = 0) -> None:
    """An EFML model directory in the published shape with random weights (uniform +-0.05, biases 0)."""
    import torch

    from elmo_cli.efml import _expected_pkl_shapes, efml_config
    from vocab.efml import PACKAGED_CONFIGS

    directory.mkdir(parents=True)
    config = PACKAGED_CONFIGS[CONFIG_NAME]
    (directory / CONFIG_NAME).write_text(json.dumps(config))
    (directory / "config.json").write_text(json.dumps({"config_path": f"/models/configs/{CONFIG_NAME}"}))
    chars = ["<oov>", "<pad>", "<bow>", "<eow>", "<bos>", "<eos>"] + sorted({c for s in sentences for w in s for c in w})
    words = ["<oov>", "<pad>", "<bos>", "<eos>"] + [w for w, _ in Counter(w for s in sentences for w in s).most_common()]
    for name, entries in (("char.dic", chars), ("word.dic", words)):
        (directory / name).write_text("".join(f"{e}\t{i}\n" for i, e in enumerate(entries)), encoding="utf-8")
    cfg = efml_config(config, CONFIG_NAME, len(chars) + 1, len(words) + 1)
    emb_shapes, enc_shapes = _expected_pkl_shapes(cfg)
    emb_shapes["char_emb_layer.embedding.weight"] = (len(chars), cfg.char_cnn.embedding_dim)
    emb_shapes["word_emb_layer.embedding.weight"] = (len(words), cfg.char_cnn.word_dim)
    generator = torch.Generator().manual_seed(seed)

    def tensors(shapes: dict) -> dict:
        return {k: (torch.zeros(s) if k.endswith("bias") else torch.rand(s, generator=generator) * 0.1 - 0.05)
                for k, s in shapes.items()}

    torch.save(tensors(emb_shapes), directory / "token_embedder.pkl")
    torch.save(tensors(enc_shapes), directory / "encoder.pkl")


def child(side: str, model: str, plan_path: str, out_path: str) -> None:
    """One side in this (fresh) process: the warm-up (check) call, REPEATS timed passes, JSON figures."""
    sentences = json.loads(Path(plan_path).read_text())
    embed = _elmo_side(model, Path(out_path).parent) if side == "elmo" else _efml_side(model)
    check = embed(sentences[:CHECK])
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        embed(sentences)
        rates.append(sum(len(s) for s in sentences) / (time.perf_counter() - start))
    np.savez(out_path, *check)
    print(json.dumps({"tokens_per_s": rates, "peak_rss_mb": own_peak_rss_mb()}))


def _elmo_side(model: str, work: Path):
    import h5py
    import torch

    from elmo_cli.dump import dump_embeddings
    from elmo_cli.loading import load_model

    torch.set_num_threads(THREADS)
    loaded = load_model(model, device="cpu")

    def embed(rows: list[list[str]]) -> list[np.ndarray]:
        text, out = work / "input.txt", work / "dump.hdf5"
        text.write_text("".join(" ".join(s) + "\n" for s in rows), encoding="utf-8")
        dump_embeddings(loaded, text, out, layers="all", batch_size=BATCH, force=True, threads=THREADS)
        with h5py.File(out, "r") as f:
            return [f[str(i)][...] for i in range(len(rows))]

    return embed


def _efml_side(model: str):
    import logging
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(THREADS)
    sys.path.insert(0, str(EFML_SITE))
    from elmoformanylangs import Embedder

    embedder = Embedder(model, batch_size=BATCH)
    return lambda rows: embedder.sents2elmo(rows, output_layer=-2)


def _run_child(side: str, model: Path, plan: Path, out: Path) -> dict:
    return child_figures("benchmarks.bench_efml", [side, str(model), str(plan), str(out)], THREADS, ROOT)


def main(argv: list[str] | None = None) -> None:
    argv = argv or []
    if argv[:1] == ["--child"]:
        child(*argv[1:5])
        return
    if not efml_available():
        print(f"bench_efml: skipped, ELMoForManyLangs is not in bench-out/efml-site (install it with: {INSTALL})")
        return
    from benchmarks.bench_embed import load_sentences

    sentences = load_sentences()
    with tempfile.TemporaryDirectory(prefix="bench-efml-") as tmp, \
            Recording("efml", "python -m benchmarks.bench_efml", THREADS) as rec:
        work = Path(tmp)
        write_model(work / "model", sentences)
        plan = work / "sentences.json"
        plan.write_text(json.dumps(sentences))
        sides = {}
        for side in ("elmo", "efml"):
            (work / side).mkdir()
            sides[side] = _run_child(side, work / "model", plan, work / side / "check.npz")
        a, b = np.load(work / "elmo" / "check.npz"), np.load(work / "efml" / "check.npz")
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
        scale = max(float(np.abs(b[k]).max()) for k in b.files)
        assert diff <= 1e-5 * scale, f"elmo-cli's vectors differ from ELMoForManyLangs' by {diff} (scale {scale})"
        row = {side: {"tokens_per_s_min": round(min(r["tokens_per_s"])),
                      "tokens_per_s_median": round(statistics.median(r["tokens_per_s"])),
                      "peak_rss_mb": round(r["peak_rss_mb"])} for side, r in sides.items()}
        row["elmo_over_efml_speed"] = round(row["elmo"]["tokens_per_s_median"] / row["efml"]["tokens_per_s_median"], 2)
        row["elmo_over_efml_memory"] = round(sides["elmo"]["peak_rss_mb"] / sides["efml"]["peak_rss_mb"], 2)
        row.update(sentences=len(sentences), tokens=sum(len(s) for s in sentences), max_abs_diff=diff,
                   max_abs_value=scale, batch=BATCH)
        rec.figures["published_shape"] = row
        print(f"EFML published shape, {len(sentences)} sentences, batch {BATCH}: elmo-cli dump "
              f"{row['elmo']['tokens_per_s_median']:,} tokens/s (min {row['elmo']['tokens_per_s_min']:,}), "
              f"{row['elmo']['peak_rss_mb']:,} MB | ELMoForManyLangs sents2elmo {row['efml']['tokens_per_s_median']:,}"
              f" (min {row['efml']['tokens_per_s_min']:,}), {row['efml']['peak_rss_mb']:,} MB | elmo-cli/EFML "
              f"{row['elmo_over_efml_speed']:.2f}x speed, {row['elmo_over_efml_memory']:.2f}x memory | max |diff| "
              f"{diff:.1e} of {scale:.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

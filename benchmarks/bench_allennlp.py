"""`dump-embeddings` against allennlp 2.10.1's own `_ElmoBiLm`, in one process, on the same weights and sentences.

allennlp is not a dependency (it is archived and pins torch < 1.13). To take this measurement, install it into a
separate environment next to this project's requirements, without its torch pin, for example:

    python3.11 -m venv .venv-allennlp && .venv-allennlp/bin/pip install torch==2.13.0 h5py numpy typer rich sentencepiece
    .venv-allennlp/bin/pip install --no-deps allennlp==2.10.1
    .venv-allennlp/bin/pip install cached-path filelock requests tqdm nltk spacy transformers scipy scikit-learn \\
        tensorboardX termcolor more-itertools lmdb dill base58 huggingface_hub fairscale protobuf
    PYTHONPATH=. .venv-allennlp/bin/python -m benchmarks.bench_allennlp [small original]

The weights are random in the published shapes (seed 0), written once in bilm-tf's format; allennlp reads those
files, elmo-cli reads the same files. The sentences are bench_embed's 200 (about 25 tokens each), batch 64, float32,
the same thread count for both. allennlp is run as its `ElmoEmbedder` does: batches in input order, character ids
from `batch_to_ids`, no gradient, its carried LSTM state reset before each batch (so both compute the same stateless
vectors); elmo-cli is `dump_embeddings` to an HDF5 file (sorting, windows and file writing
included). Each side runs five times alternately (the host is shared and noisy); the best time of each is kept, and the layers are checked equal
(max |diff| < 1e-4) before any figure is printed; the figures go to benchmarks/results/allennlp-DATE.json with the
machine and load. Without allennlp importable, prints how to install it and returns.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.bench_embed import BATCH, load_sentences
from benchmarks.results import Recording
from elmo_cli.bilm_format import save_model_dir
from elmo_cli.dump import dump_embeddings
from elmo_cli.loading import load_model
from elmo_cli.model.bilm import BiLM
from elmo_cli.presets import PRESETS

REPEATS = 5


def allennlp_layers(bilm, sentences: list[list[str]]) -> list[np.ndarray]:
    """allennlp's forward pass, batch by batch in input order; `(3, n, 2P)` per sentence."""
    from allennlp.modules.elmo import batch_to_ids

    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), BATCH):
            batch = sentences[start : start + BATCH]
            bilm._elmo_lstm.reset_states()  # allennlp carries LSTM state across batches; elmo-cli is stateless
            result = bilm(batch_to_ids(batch))
            acts = torch.stack([a[:, 1:-1] for a in result["activations"]], dim=1)  # (B, 3, T, 2P), <S></S> cut
            out.extend(acts[b, :, : len(s)].numpy() for b, s in enumerate(batch))
    return out


def run_config(name: str, sentences: list[list[str]], tmp: Path) -> dict:
    from allennlp.modules.elmo import _ElmoBiLm

    torch.manual_seed(0)
    model_dir = tmp / name
    save_model_dir(BiLM(PRESETS[name].config.model).eval(), model_dir)
    options, weights = model_dir / "options.json", model_dir / "weights.hdf5"
    bilm = _ElmoBiLm(str(options), str(weights), requires_grad=False).eval()
    loaded = load_model(None, options, weights, "cpu")
    text = tmp / "input.txt"
    text.write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
    allennlp_layers(bilm, sentences[:8])  # warm both
    dump_embeddings(loaded, text, tmp / "warm.hdf5", batch_size=BATCH, force=True)
    times: dict[str, list[float]] = {"allennlp": [], "elmo-cli": []}
    for _ in range(REPEATS):
        t = time.perf_counter()
        reference = allennlp_layers(bilm, sentences)
        times["allennlp"].append(time.perf_counter() - t)
        t = time.perf_counter()
        dump_embeddings(loaded, text, tmp / "ours.hdf5", batch_size=BATCH, force=True)
        times["elmo-cli"].append(time.perf_counter() - t)
    with h5py.File(tmp / "ours.hdf5") as f:
        diff = max(float(np.abs(f[str(k)][...] - ref).max()) for k, ref in enumerate(reference))
    assert diff < 1e-4, f"{name}: elmo-cli and allennlp differ by {diff}"
    n_tokens = sum(len(s) for s in sentences)
    best = {k: min(v) for k, v in times.items()}
    return {"name": name, "tokens": n_tokens, "diff": diff, "best_seconds": best,
            "tokens_per_s": {k: n_tokens / v for k, v in best.items()}}


def main(configs: list[str] | None = None) -> None:
    try:
        import allennlp  # noqa: F401
    except ImportError:
        print("allennlp is not installed here (not a dependency); skipped. How to take this measurement: "
              "python -m pydoc benchmarks.bench_allennlp, or the docstring of benchmarks/bench_allennlp.py")
        return
    import allennlp.version

    sentences = load_sentences()
    print(f"allennlp {allennlp.version.VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{len(sentences)} sentences, batch {BATCH}, best of {REPEATS} alternate runs", flush=True)
    command = " ".join(["python -m benchmarks.bench_allennlp", *(configs or [])])
    with tempfile.TemporaryDirectory() as d, Recording("allennlp", command) as rec:
        rec.figures["allennlp"] = allennlp.version.VERSION
        for name in configs or ["small", "original"]:
            r = run_config(name, sentences, Path(d))
            a, e = r["tokens_per_s"]["allennlp"], r["tokens_per_s"]["elmo-cli"]
            rec.figures[name] = {"tokens": r["tokens"], "allennlp_tokens_per_s": round(a),
                                 "elmo_cli_tokens_per_s": round(e), "speedup": round(e / a, 2),
                                 "largest_difference": r["diff"], "best_seconds": r["best_seconds"]}
            print(f"{name:>9}: allennlp _ElmoBiLm {a:8,.0f} tokens/s | elmo-cli dump-embeddings {e:8,.0f} tokens/s | "
                  f"{e / a:4.1f}x | max |diff| {r['diff']:.1e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or None)

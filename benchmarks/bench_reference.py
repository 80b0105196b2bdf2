"""How close elmo-cli's vectors come to allennlp's reference (tests/data/reference): the largest absolute difference
over every sentence, layer and feature, by path and batch size, and against a float64 run of the same model.

- the dump's inference kernel (`Embedder`, what `dump-embeddings` runs) in fp32 at each batch size of `BATCHES`
  (the default is 64), and with ``compute_dtype="bf16"`` at 64 (on a CPU without bf16 instructions torch emulates
  it: the values are the same, only slower);
- the training LSTM (`BiLM.embed`): one sentence at a time and all 16 in one batch;
- the same model in float64 (`BiLM.embed` on a double copy), against which allennlp's float32 reference and the
  kernel's fp32 vectors are both measured: the rounding each carries.

A measurement of accuracy, not of time (a few seconds); the tests hold the bounds (`tests/allennlp_reference.py`).
Results: benchmarks/results/reference-DATE.json with the machine, since which batch sizes round highest follows the
matrix kernels torch picks on a CPU.

    python -m benchmarks.bench_reference
"""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.results import Recording
from elmo_cli.embed import Embedder
from elmo_cli.inputs import char_ids_batch
from elmo_cli.loading import load_model

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "data" / "reference"
BATCHES = (1, 2, 3, 4, 5, 6, 8, 16, 32, 64)


def largest(got, want) -> float:
    return max(float(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)).max(initial=0.0))
               for g, w in zip(got, want))


def training_lstm(model, chars, sentences, batch: int) -> list[np.ndarray]:
    """`BiLM.embed` layers `(L+1, n, 2P)` per sentence, `batch` sentences per call, boundaries cut."""
    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), batch):
            part = sentences[start : start + batch]
            ids, lengths = char_ids_batch(chars, part)
            layers, _ = model.embed(ids, lengths)  # (L+1, B, T, 2P)
            out.extend(layers[:, b, 1 : len(s) + 1].double().numpy() for b, s in enumerate(part))
    return out


def main() -> None:
    sentences = [line.strip().split() for line in (REFERENCE / "sentences.txt").read_text("utf-8").splitlines()]
    with h5py.File(REFERENCE / "expected_all.hdf5") as f:
        want = [f[str(i)][...] for i in range(len(sentences))]
    with Recording("reference", "python -m benchmarks.bench_reference") as rec:
        emb = Embedder(REFERENCE, device="cpu")
        kernel = {str(b): largest(emb.embed_sentences(sentences, batch_size=b), want) for b in BATCHES}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bf16 on a CPU without bf16 instructions warns
            bf16 = largest(Embedder(REFERENCE, device="cpu", compute_dtype="bf16").embed_sentences(sentences), want)
        loaded = load_model(REFERENCE, device="cpu")
        chars = loaded.text.chars
        model = loaded.model.eval()
        one, all16 = (largest(training_lstm(model, chars, sentences, b), want) for b in (1, len(sentences)))
        exact = training_lstm(copy.deepcopy(model).double(), chars, sentences, 1)
        fp32_64 = emb.embed_sentences(sentences, batch_size=64)
        rec.figures = {
            "kernel_fp32_by_batch_size": kernel,
            "kernel_fp32_batch_8_and_up": max(v for b, v in kernel.items() if int(b) >= 8),
            "kernel_fp32_batch_1_to_6": max(v for b, v in kernel.items() if int(b) <= 6),
            "kernel_bf16_batch_64": bf16,
            "training_lstm_one_sentence_at_a_time": one,
            "training_lstm_all_in_one_batch": all16,
            "float64_vs_allennlp": largest(want, exact),
            "float64_vs_kernel_fp32_batch_64": largest(fp32_64, exact),
            "float64_vs_kernel_fp32_batch_1": largest(emb.embed_sentences(sentences, batch_size=1), exact),
        }
        for key, value in rec.figures.items():
            print(f"{key}: {value if isinstance(value, dict) else f'{value:.3g}'}")


if __name__ == "__main__":
    main()

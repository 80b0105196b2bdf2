"""The host's part of a training step that is not the model: making its inputs (`train._Trainer._inputs`: the
batch, its distinct tokens, each direction's sampled negatives), and the negative sampler in it, before and after
the sampler stopped re-sorting all its draws at every chunk (2026-12-05), measured in one run.

    python -m benchmarks.bench_inputs [--corpus austen-0.2M] [--repeats 5] [--threads 1]

Why: on a GPU the queued step's pace is the host's (docs/gpu.md, "Speed on an H200": the GPU busy about 17 ms of a
24 ms step of `original` at 128 rows), and the inputs of the next step are made on the host while the GPU runs the
step before. TF's unique sampler draws until it has `n` distinct ids; with `original`'s 8,192 negatives from a
vocabulary of a few thousand to tens of thousands of words that takes hundreds of thousands of draws, and the
sampler of before made the whole history unique again after every chunk of 16,384.

Two parts, each alternating the two samplers (`resorting_sample`, the one of before, kept here as the reference
`tests/test_softmax.py` checks the present one against) REPEATS times, medians of milliseconds per call:

- ``sampler``: one draw of 8,192 (and of 1,024: `auto`'s and `laptop`'s) from vocabularies of 5,116 words (the
  demo's), 15,682 (Austen and the KJV), 100,000 and 793,471 (bilm-tf's 1B Word Benchmark vocabulary);
- ``inputs``: `_Trainer._inputs` of `original` at 128 rows (8,192 negatives) on the corpus's shards, on the CPU.

Results: benchmarks/results/inputs-DATE.json. Not part of `make bench`.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.results import Recording
from elmo_cli.model import softmax as softmax_module

VOCABS = (5_116, 15_682, 100_000, 793_471)
NEGATIVES = (8_192, 1_024)


def resorting_sample(n: int, vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, int]:
    """`softmax.log_uniform_sample` as it was until 2026-12-05: every chunk's draws appended and the whole history
    made unique again (the same ids, order and draw count as the present sampler, from the same generator)."""
    if n >= vocab_size:
        return torch.arange(vocab_size), -1
    log_range = math.log(vocab_size + 1.0)
    draws, chunk = [], max(2 * n, 1024)
    while True:
        u = torch.rand(chunk, generator=generator, dtype=torch.float64).numpy()
        draws.append(np.minimum(np.floor(np.exp(u * log_range)).astype(np.int64) - 1, vocab_size - 1))
        all_draws = np.concatenate(draws)
        _, first = np.unique(all_draws, return_index=True)
        if len(first) >= n:
            first.sort()
            return torch.from_numpy(all_draws[first[:n]].copy()), int(first[n - 1]) + 1


SAMPLERS = {"before": resorting_sample, "now": softmax_module.log_uniform_sample}


def _ms(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) * 1e3 / calls


def sampler_times(repeats: int, calls: int = 5) -> list[dict]:
    """Milliseconds per draw of each sampler, by vocabulary and negatives (medians of `repeats`, alternating)."""
    rows = []
    for n in NEGATIVES:
        for vocab in VOCABS:
            times: dict[str, list[float]] = {k: [] for k in SAMPLERS}
            tries = None
            for r in range(repeats + 1):  # the first round warms up
                for name, sample in SAMPLERS.items():
                    gen = torch.Generator().manual_seed(r)
                    ms = _ms(lambda: sample(n, vocab, gen), calls)
                    if r:
                        times[name].append(ms)
                tries = sample(n, vocab, torch.Generator().manual_seed(0))[1]
            row = {"negatives": n, "vocab": vocab, "draws": tries,
                   **{f"{k}_ms": round(statistics.median(v), 3) for k, v in times.items()}}
            row["speedup"] = round(row["before_ms"] / row["now_ms"], 2)
            rows.append(row)
            print(f"sampler {n:>5,} of {vocab:>7,}: {tries:>9,} draws  before {row['before_ms']:8.2f} ms  "
                  f"now {row['now_ms']:7.2f} ms  ({row['speedup']}x)", flush=True)
    return rows


def inputs_times(corpus: str, out: Path, repeats: int, calls: int = 10) -> dict:
    """Milliseconds per `_Trainer._inputs` of `original` at 128 rows on the corpus's shards, with each sampler."""
    from benchmarks.corpora import prepare
    from elmo_cli.presets import load_config
    import elmo_cli.train as train_module
    from elmo_cli.train import _Trainer, open_shards

    prepare(corpus, out / corpus)
    data = open_shards(out / corpus / "train")
    config = load_config(None, "original").with_training(batch_size=128, device="cpu")
    trainer = _Trainer.bare(config, data)
    negatives = trainer.tc.n_negative_samples
    times: dict[str, list[float]] = {k: [] for k in SAMPLERS}
    plain = train_module.log_uniform_sample
    try:
        for r in range(repeats + 1):
            for name, sample in SAMPLERS.items():
                train_module.log_uniform_sample = sample
                ms = _ms(trainer._inputs, calls)
                if r:
                    times[name].append(ms)
    finally:
        train_module.log_uniform_sample = plain
    row = {"corpus": corpus, "vocab": len(data.vocab), "preset": "original", "rows": 128, "negatives": negatives,
           **{f"{k}_ms": round(statistics.median(v), 3) for k, v in times.items()}}
    row["speedup"] = round(row["before_ms"] / row["now_ms"], 2)
    print(f"inputs of original at 128 rows on {corpus} ({row['vocab']:,} words, {negatives:,} negatives): before "
          f"{row['before_ms']:.2f} ms, now {row['now_ms']:.2f} ms ({row['speedup']}x)", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="austen-0.2M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench-out/inputs"))
    parser.add_argument("--label", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    command = "python -m benchmarks.bench_inputs " + " ".join(argv if argv is not None else sys.argv[1:])
    with Recording("inputs", command.strip(), threads=args.threads, label=args.label) as rec:
        rec.figures["sampler"] = sampler_times(args.repeats)
        rec.figures["inputs"] = inputs_times(args.corpus, args.out, args.repeats)


if __name__ == "__main__":
    main()

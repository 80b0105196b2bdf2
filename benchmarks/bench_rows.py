"""What decides the hour on a CPU, part one: training tokens/s of auto's two shapes by batch rows, in one run.

For each of auto's shapes (`elmo_cli.auto.LADDER`: LSTM 512/128 and 1024/256) and 32, 64 and 128 rows of 20
unrolled steps, fp32 (and bf16 where the CPU computes it natively), the throughput `train --preset auto` probes
(`elmo_cli.train.measure_throughput`: a fresh model, two warm-up steps, then real training steps) for SECONDS, three
times in alternating order; min and median. On the Austen training split of `make bench-quality` (0.78M tokens, made
here when missing), 2 threads. Result file: benchmarks/results/rows-DATE.json. What each row count costs in quality at
equal time is not measured here (an hour per cell).

    python -m benchmarks.bench_rows        (by name only: about 10 minutes on 2 cores)
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.corpora import prepare
from benchmarks.results import Recording

ROOT = Path(__file__).resolve().parent.parent
THREADS, ROWS, SECONDS, REPEATS = 2, (32, 64, 128), 15.0, 3


def main(argv: list[str] | None = None) -> None:
    from elmo_cli import auto, machine
    from elmo_cli.train import measure_throughput, open_shards

    data = ROOT / "bench-out" / "quality" / "data" / "austen"
    prepare("austen", data)
    dataset = open_shards(data / "train", "--data")
    facts = auto.Facts(dataset.total_tokens, dataset.num_sentences, len(dataset.vocab), 3600.0, None, THREADS, "cpu")
    base = auto._base(facts)
    negatives = min(base.training.n_negative_samples, facts.vocab_size)
    dtypes = ("fp32", "bf16") if machine.cpu_bf16() else ("fp32",)
    cells = [(shape, rows, dtype) for shape in auto.LADDER for rows in ROWS for dtype in dtypes]
    rates: dict[tuple, list[float]] = {cell: [] for cell in cells}
    with Recording("rows", "python -m benchmarks.bench_rows", THREADS) as rec:
        for repeat in range(REPEATS):
            for cell in (cells if repeat % 2 == 0 else cells[::-1]):
                shape, rows, dtype = cell
                config = auto._config(base, shape, dtype, negatives, THREADS).with_training(batch_size=rows)
                rates[cell].append(measure_throughput(config, dataset, SECONDS))
        for (shape, rows, dtype), r in rates.items():
            figures = {"tokens_per_s_median": round(statistics.median(r)), "tokens_per_s_min": round(min(r))}
            rec.figures.setdefault(shape.name, {}).setdefault(dtype, {})[f"rows_{rows}"] = figures
            print(f"{shape.name}, {dtype}, {rows} rows: {figures['tokens_per_s_median']:,} tokens/s (min "
                  f"{figures['tokens_per_s_min']:,})", flush=True)
        rec.figures["corpus"] = {"name": "austen", "train_tokens": dataset.total_tokens}


if __name__ == "__main__":
    main(sys.argv[1:])

"""What `--preset auto` measures before it chooses: training tokens/s of each shape of its ladder, in fp32 and (where
this CPU or GPU computes bf16 natively) in bf16, as its probe runs them (`train.measure_throughput`: a fresh model,
two warm-up steps, then training steps for SECONDS), on 2 threads, at the `laptop` recipe's 32 rows and 1,024
sampled negatives.

    python -m benchmarks.bench_probe [--corpus austen] [--seconds 20] [--repeats 3] [--threads 2]

Each (shape, dtype) is measured REPEATS times, alternating, with min and median kept; the bf16/fp32 ratio per shape
is the one `auto` compares with its 1.15x bar, and the larger shape's rate over the smaller's says how many passes
it gives up. The corpus is one of `benchmarks.corpora` (split and shards made once under bench-out/). Results:
benchmarks/results/probe-DATE.json with the machine and load: on a CPU other work slows the probe, which is what
makes a short probe fragile.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.corpora import CORPORA, prepare
from benchmarks.results import Recording
from elmo_cli import auto, machine
from elmo_cli.train import measure_throughput, open_shards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="austen", choices=CORPORA)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-out/probe"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    info = prepare(args.corpus, args.out / args.corpus)
    data = open_shards(args.out / args.corpus / "train")
    base = auto._base()
    negatives = min(base.training.n_negative_samples, len(data.vocab))
    dtypes = ("fp32", "bf16") if machine.cpu_bf16() else ("fp32",)
    command = " ".join(["python -m benchmarks.bench_probe", *argv])
    with Recording("probe", command, args.threads) as rec:
        rates: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for shape in auto.LADDER:
                for dtype in dtypes:
                    config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu")
                    rates.setdefault((shape.name, dtype), []).append(measure_throughput(config, data, args.seconds))
        rec.figures = {"corpus": args.corpus, "train_tokens": info["train_tokens"], "seconds": args.seconds,
                       "negatives": negatives, "bf16_native": "bf16" in dtypes, "torch_threads": torch.get_num_threads()}
        for (name, dtype), r in rates.items():
            rec.figures[f"{name} {dtype}"] = {"tokens_per_s_median": round(statistics.median(r)),
                                              "tokens_per_s_min": round(min(r)), "runs": [round(x) for x in r]}
        small, large = (s.name for s in auto.LADDER)
        for dtype in dtypes:
            rec.figures[f"{large} over {small}, {dtype}"] = round(
                statistics.median(rates[(large, dtype)]) / statistics.median(rates[(small, dtype)]), 2)
        if "bf16" in dtypes:
            for s in auto.LADDER:
                rec.figures[f"{s.name} bf16 over fp32"] = round(
                    statistics.median(rates[(s.name, "bf16")]) / statistics.median(rates[(s.name, "fp32")]), 2)
        for key, value in rec.figures.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()

"""A lever for `--preset auto`'s hour on a CPU, measured, not built into `train`: the LSTM layers' time loops
compiled by `torch.compile` (Inductor: C++ kernels that fuse a step's elementwise work) beside the eager loops, on
`auto`'s two shapes as its probe trains them (fp32, 32 rows, 1,024 sampled negatives, dropout 0.1).

    python -m benchmarks.bench_compile [--corpus austen] [--seconds 15] [--repeats 2] [--threads 2]

Two ways were tried on 2026-11-27: compiling the cell's elementwise work alone, called once a time step, ran
slower than eager (about 1,300-1,450 tokens/s against 1,580-1,660 for LSTM 512/128: each call pays the compiled
function's own overhead); compiling `ProjectedLSTMLayer.forward`, the whole 20-step loop of a layer, forward and
backward, is what this measures. Per shape: the first call's seconds (the compilation, with Inductor's on-disk cache
emptied first, as a first run pays it; the first shape's includes what both share), then
tokens/s as the probe measures (`train.measure_throughput`), REPEATS times alternating with eager, median; and the
largest difference between the training losses of 10 steps from one seed, eager against compiled (the compiled
kernels round differently). Needs a C++ compiler (Inductor's). Results: benchmarks/results/compile-DATE.json.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.corpora import probe_arguments, probe_corpus
from benchmarks.results import Recording
from elmo_cli import auto
from elmo_cli.model import lstm
from elmo_cli.train import measure_throughput, train

EAGER = lstm.ProjectedLSTMLayer.forward
COMPILED = torch.compile(EAGER, dynamic=False)


def use(compiled: bool) -> None:
    lstm.ProjectedLSTMLayer.forward = COMPILED if compiled else EAGER


def losses(config, train_dir: Path, compiled: bool, steps: int = 10) -> list[float]:
    use(compiled)
    got: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as run:
            train(config.with_training(max_steps=steps, validation_every=0), train_dir, Path(run) / "run",
                  on_step=lambda info: got.append(info.loss))
    finally:
        use(False)
    return got


def main(argv: list[str] | None = None) -> None:
    parser = probe_arguments(__doc__.split("\n")[0], seconds=15.0, repeats=2)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    _, data, base, negatives = probe_corpus(args)
    train_dir = args.out / args.corpus / "train"
    command = " ".join(["python -m benchmarks.bench_compile", *argv])
    # A cold compilation, as a user's first run pays it: Inductor's on-disk caches in a fresh folder.
    cache = tempfile.TemporaryDirectory(prefix="bench-compile-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    with cache, Recording("compile", command, args.threads, args.label) as rec:
        rec.figures = {"corpus": args.corpus, "seconds": args.seconds, "rows": 32, "negatives": negatives,
                       "torch_threads": args.threads}
        for shape in auto.LADDER:
            config = auto._config(base, shape, "fp32", negatives, args.threads).with_training(device="cpu",
                                                                                             dropout=0.1)
            use(True)
            start = time.perf_counter()
            first = measure_throughput(config, data, 1.0)  # compiles forward and backward of each distinct layer
            compile_seconds = time.perf_counter() - start
            use(False)
            rates: dict[str, list[float]] = {"eager": [], "compiled": []}
            for repeat in range(args.repeats):
                for name in (("eager", "compiled") if repeat % 2 == 0 else ("compiled", "eager")):
                    use(name == "compiled")
                    try:
                        rates[name].append(measure_throughput(config, data, args.seconds))
                    finally:
                        use(False)
            eager_losses, compiled_losses = losses(config, train_dir, False), losses(config, train_dir, True)
            med = {name: statistics.median(r) for name, r in rates.items()}
            rec.figures[shape.name] = {
                "first_call_seconds": round(compile_seconds, 1), "first_call_tokens_per_s": round(first),
                **{f"{name}_tokens_per_s_median": round(m) for name, m in med.items()},
                **{f"{name}_runs": [round(x) for x in r] for name, r in rates.items()},
                "compiled_over_eager": round(med["compiled"] / med["eager"], 2),
                "largest_loss_difference_10_steps": max(abs(a - b) for a, b in zip(eager_losses, compiled_losses))}
            print(f"{shape.name}: {rec.figures[shape.name]}", flush=True)


if __name__ == "__main__":
    main()

"""A lever for `--preset auto`'s hour on a CPU, measured, not built into `train`: the LSTM layers' time loops
compiled by `torch.compile` (Inductor: C++ kernels that fuse a step's elementwise work) beside the eager loops, on
`auto`'s two shapes as its probe trains them (fp32, 32 rows, 1,024 sampled negatives, dropout 0.1).

    python -m benchmarks.bench_compile [--corpus austen] [--seconds 15] [--repeats 2] [--threads 2] [--chunks 10]

Two ways were tried on 2026-11-27: compiling the cell's elementwise work alone, called once a time step, ran
slower than eager (about 1,300-1,450 tokens/s against 1,580-1,660 for LSTM 512/128: each call pays the compiled
function's own overhead); compiling `ProjectedLSTMLayer.forward`, the whole 20-step loop of a layer, forward and
backward, is what this measures. Per shape: the first call's seconds (the compilation, with Inductor's on-disk cache
emptied first, as a first run pays it; the first shape's includes what both share), then
tokens/s as the probe measures (`train.measure_throughput`), REPEATS times alternating with eager, median; and the
largest difference between the training losses of 10 steps from one seed, eager against compiled (the compiled
kernels round differently); and the first call's seconds again in a new process with the cache the cold one
filled, as a user's later runs on the machine pay it (`elmo_cli.compiled.use_cache_dir` keeps that cache).
`--chunks 10,5` also times the loop compiled 10 (5) steps at a time, called once per chunk of the window (a graph
a half, a quarter, the size): its cold first call in a new process with an empty cache of its own, and its tokens/s
in the same alternation. Needs a C++ compiler (Inductor's). Results: benchmarks/results/compile-DATE.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
# Each shape, window and state (None or given) is a graph of its own: with --chunks and both shapes this process
# makes more than Dynamo's default of 8, past which it would run the loop uncompiled (a train run makes 2 a shape)
torch._dynamo.config.recompile_limit = 32


def chunked(steps: int):
    """A layer's forward as the compiled loop of `steps` time steps at a time, called once per chunk of the window:
    a smaller graph to compile (the lever `--chunks` measures; `train` compiles the whole window)."""
    def forward(self, x, state=None, mask=None, reset=None):
        if not (self.training and torch.is_grad_enabled()):
            return EAGER(self, x, state, mask, reset)
        outputs = []
        for a in range(0, x.shape[1], steps):
            part = slice(a, a + steps)
            out, state = COMPILED(self, x[:, part], state, None if mask is None else mask[:, part],
                                  None if reset is None else reset[:, part])
            outputs.append(out)
        return torch.cat(outputs, 1), state
    return forward


def use(compiled: bool | int) -> None:
    """The eager loop (False), the compiled whole window (True) or the compiled loop in chunks of that many steps."""
    if isinstance(compiled, bool):
        lstm.ProjectedLSTMLayer.forward = COMPILED if compiled else EAGER
    else:
        lstm.ProjectedLSTMLayer.forward = chunked(compiled)


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


def probe_config(shape, base, negatives: int, threads: int):
    """`shape` as `auto`'s probe trains it (fp32, 32 rows, the negatives), on the CPU, dropout 0.1."""
    return auto._config(base, shape, "fp32", negatives, threads).with_training(device="cpu", dropout=0.1)


def first_calls(data, base, negatives, threads: int, way: bool | int = True) -> dict[str, float]:
    """Seconds of each shape's first compiled call (`use`'s `way`) in this process, which compiles it or reads it
    from the cache."""
    seconds = {}
    for shape in auto.LADDER:
        config = probe_config(shape, base, negatives, threads)
        use(way)
        start = time.perf_counter()
        try:
            measure_throughput(config, data, 1.0)
        finally:
            use(False)
        seconds[shape.name] = round(time.perf_counter() - start, 1)
    return seconds


def first_calls_elsewhere(argv: list[str], way: int, cache: str) -> dict[str, float]:
    """`first_calls` in a new process with Inductor's cache in `cache` (way 0: the whole window)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_compile", *argv, "--first-calls", str(way)],
                          check=True, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = probe_arguments(__doc__.split("\n")[0], seconds=15.0, repeats=2)
    parser.add_argument("--chunks", default="", help="also compile the loop in chunks of these many steps, e.g. 10,5")
    parser.add_argument("--first-calls", type=int, default=None, help=argparse.SUPPRESS)  # a new process's part
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    _, data, base, negatives = probe_corpus(args)
    if args.first_calls is not None:
        print(json.dumps(first_calls(data, base, negatives, args.threads, args.first_calls or True)))
        return
    chunks = [int(n) for n in args.chunks.split(",") if n.strip()]
    train_dir = args.out / args.corpus / "train"
    command = " ".join(["python -m benchmarks.bench_compile", *argv])
    # Cold compilations, as a user's first run pays them: each way in a new process with Inductor's on-disk caches
    # in a fresh folder; then the whole window's again in a new process from the cache its first one filled, as a
    # later run on the machine pays it (elmo_cli.compiled.use_cache_dir keeps that cache); this process then works
    # in that folder.
    cache = tempfile.TemporaryDirectory(prefix="bench-compile-cache-")
    with cache, Recording("compile", command, args.threads, args.label) as rec:
        rec.figures = {"corpus": args.corpus, "seconds": args.seconds, "rows": 32, "negatives": negatives,
                       "torch_threads": args.threads}
        cold = {0: first_calls_elsewhere(argv, 0, cache.name)}
        for steps in chunks:
            with tempfile.TemporaryDirectory(prefix="bench-compile-chunks-") as other:
                cold[steps] = first_calls_elsewhere(argv, steps, other)
        warm = first_calls_elsewhere(argv, 0, cache.name)
        print(f"first calls, cold: {cold}; the whole window's from its filled cache: {warm}", flush=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
        for shape in auto.LADDER:
            config = probe_config(shape, base, negatives, args.threads)
            use(True)
            first = measure_throughput(config, data, 1.0)  # from the cache filled above
            use(False)
            ways: dict[str, bool | int] = {"eager": False, "compiled": True}
            for steps in chunks:
                use(steps)
                measure_throughput(config, data, 1.0)  # compiles what the whole window's graph did not share
                use(False)
                ways[f"chunks_of_{steps}"] = steps
            rates: dict[str, list[float]] = {name: [] for name in ways}
            for repeat in range(args.repeats):
                for name in (list(ways) if repeat % 2 == 0 else list(ways)[::-1]):
                    use(ways[name])
                    try:
                        rates[name].append(measure_throughput(config, data, args.seconds))
                    finally:
                        use(False)
            eager_losses, compiled_losses = losses(config, train_dir, False), losses(config, train_dir, True)
            med = {name: statistics.median(r) for name, r in rates.items()}
            rec.figures[shape.name] = {
                "first_call_seconds": cold[0][shape.name], "first_call_seconds_cache_filled": warm[shape.name],
                "first_call_tokens_per_s": round(first),
                **{f"{name}_tokens_per_s_median": round(m) for name, m in med.items()},
                **{f"{name}_runs": [round(x) for x in r] for name, r in rates.items()},
                "compiled_over_eager": round(med["compiled"] / med["eager"], 2),
                "largest_loss_difference_10_steps": max(abs(a - b) for a, b in zip(eager_losses, compiled_losses))}
            for steps in chunks:
                rec.figures[shape.name][f"chunks_of_{steps}_first_call_seconds"] = cold[steps][shape.name]
                rec.figures[shape.name][f"chunks_of_{steps}_over_eager"] = round(
                    med[f"chunks_of_{steps}"] / med["eager"], 2)
            print(f"{shape.name}: {rec.figures[shape.name]}", flush=True)


if __name__ == "__main__":
    main()

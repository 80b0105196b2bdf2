"""`make bench`: the benchmarks of `ORDER` in one process, one after another: the speed and memory of every
command, the dump's HDF5 writer, the price of repeatable vectors, onnxruntime beside the dump, ELMoForManyLangs'
models beside its own code. Each needs nothing beyond the checkout and its install (ELMoForManyLangs' package the
Makefile puts in bench-out/).

Each benchmark prints its own figures, measured in this run (ratios against a baseline measured alongside, never
against stored numbers). `python -m benchmarks.run shard train` runs only the named ones. Every other
benchmarks/bench_*.py runs on its own, `python -m benchmarks.bench_NAME` with its arguments (docs/benchmarks.md):
they take hours (`quality`, `auto_cpu`), another checkout (`change`), a GPU (`gpu`, `launches`), allennlp
(`allennlp`), or answer one question of docs/ (`targets` times the make targets, `make bench` among them).
"""
from __future__ import annotations

import importlib
import sys
import time

ORDER = ["shard", "train", "evaluate", "embed", "writer", "repeat", "kn", "onnx", "efml"]


def main(argv: list[str]) -> int:
    unknown = [n for n in argv if n not in ORDER]
    if unknown:
        print(f"make bench has no benchmark {', '.join(unknown)} (it has {', '.join(ORDER)}); run another as "
              f"python -m benchmarks.bench_NAME", file=sys.stderr)
        return 2
    for name in argv or ORDER:
        print(f"\n=== benchmark: {name} ===", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"benchmarks.bench_{name}").main()
        print(f"=== {name} done in {time.perf_counter() - start:.0f} s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

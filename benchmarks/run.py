"""`make bench`: run every benchmarks/bench_*.py `main()` in one process, one after another, in a fixed order.

Each benchmark prints its own figures, measured in this run (ratios against a baseline measured alongside, never
against stored numbers). `python -m benchmarks.run shard train` runs only the named ones; `quality` (hours),
`change` (it compares with another checkout), `targets` (it times the make targets, `make bench` among them),
`probe` (auto's shapes by dtype and rows), `compile` (torch.compile of the LSTM loops) and `step` (a CPU training
step's costs outside the model, old ways against new, compiled too) run only by name.
"""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

ORDER = ["shard", "train", "evaluate", "embed", "repeat", "kn", "onnx", "efml"]
LONG = {"quality", "change", "targets", "probe", "compile", "step"}  # by name only (the module docstring)


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    found = sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))
    found = [n for n in found if n not in LONG]
    names = argv or [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]
    for name in names:
        print(f"\n=== benchmark: {name} ===", flush=True)
        start = time.perf_counter()
        importlib.import_module(f"benchmarks.bench_{name}").main()
        print(f"=== {name} done in {time.perf_counter() - start:.0f} s ===", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

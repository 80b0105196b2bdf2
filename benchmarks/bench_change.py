"""Did a change slow the dump? `dump_embeddings` of this checkout beside another checkout of the project (a commit
before the change), measured in one run: fresh processes alternating between the two trees, three each per shape,
on bench_embed's 200 sentences (batch 64, float32, random `small` and `original` weights), each after an 8-sentence
warm-up. Min and median tokens/s per tree, and whether the two trees wrote the same bytes. ``--layers`` and
``--dtype`` are the dump's (all layers in float32 by default; ``--layers average --dtype float16`` is the dump at
scale of docs/gpu.md).

    git worktree add --detach ../before COMMIT
    python -m benchmarks.bench_change ../before [small original] [--layers average --dtype float16]

Not part of `make bench`: it needs the second checkout.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_repeat import random_model, time_dump, write_inputs
from benchmarks.results import Recording
from elmo_cli.machine import REPRODUCIBLE_BLAS

REPEATS = 3
HERE = Path(__file__).resolve().parent.parent


def tree_commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True).stdout.strip()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="the other checkout (a commit before the change)")
    parser.add_argument("shapes", nargs="*", default=["small", "original"], choices=["small", "original"])
    parser.add_argument("--layers", default="all")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    args = parser.parse_args(argv)
    before, shapes = args.before.resolve(), args.shapes
    trees = {"before": before, "after": HERE}
    command = " ".join(["python -m benchmarks.bench_change", *argv])
    results_label = None if (args.layers, args.dtype) == ("all", "float32") else f"{args.layers}-{args.dtype}"
    with tempfile.TemporaryDirectory() as d, Recording("change", command, label=results_label) as rec:
        tmp = Path(d)
        n_tokens = write_inputs(tmp)
        rec.figures = {"tokens": n_tokens, "before_commit": tree_commit(before), "layers": args.layers,
                       "dtype": args.dtype}
        for name in shapes:
            model = random_model(name, tmp / name)
            seconds: dict[str, list[float]] = {t: [] for t in trees}
            digests: dict[str, set[str]] = {t: set() for t in trees}
            for k in range(REPEATS):
                for label, tree in trees.items():
                    env = {k: v for k, v in os.environ.items() if k not in REPRODUCIBLE_BLAS}  # each tree's own
                    env["PYTHONPATH"] = str(tree)
                    s, h = time_dump(model, tmp, tmp / f"{label}-{k}.hdf5", env, cwd=tree, layers=args.layers,
                                     dtype=args.dtype)
                    seconds[label].append(s)
                    digests[label].add(h)
            rates = {t: sorted(n_tokens / s for s in seconds[t]) for t in trees}
            r = rec.figures[name] = {
                t: {"tokens_per_s_min": round(rates[t][0]), "tokens_per_s_median": round(statistics.median(rates[t]))}
                for t in trees}
            r["median_ratio_after_over_before"] = round(statistics.median(rates["after"])
                                                        / statistics.median(rates["before"]), 3)
            r["same_bytes"] = len(digests["before"] | digests["after"]) == 1
            print(f"{name:>9}: before {r['before']['tokens_per_s_median']:8,} tokens/s (min "
                  f"{r['before']['tokens_per_s_min']:,}) | after {r['after']['tokens_per_s_median']:8,} (min "
                  f"{r['after']['tokens_per_s_min']:,}) | ratio {r['median_ratio_after_over_before']:.3f} | "
                  f"same bytes: {r['same_bytes']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The HDF5 writer of `dump-embeddings` alone: lines written a second as a dump writes them (`h5dump`'s low-level
dataset creation, torch's float16 cast: `h5dump.write_line`) beside h5py's ``create_dataset`` with HDF5
converting float32 to the file's dtype (how the writer made and filled a line before 2026-11-27), measured in one
run on the same data. Both write the same bytes (`tests/test_h5dump.py`).

On a GPU the writer was most of a dump's time: a host profile of the `original` dump at scale on an H200
(`benchmarks.bench_gpu`, `--layers average --dtype float16`) spent 2.6 of its 7.3 s in `write_line`, where HDF5
converted each line to float16, and 2.2 s waiting for the GPU. The lines here have the lengths of
examples/austen_heldout.txt's sentences, four times over (3,456 lines, 84,256 tokens), with random float32 vectors
as a model gives them: all three layers of the `original` shape, `(3, n, 1024)` into float32, and their average,
`(n, 1024)` into float16. Each writer fills a fresh file in a temporary folder, alternating, five times; the figures
are median tokens/s.

    python -m benchmarks.run writer        (or: python -m benchmarks.bench_writer)
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from benchmarks.results import Recording
from elmo_cli import h5dump

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "examples" / "austen_heldout.txt"
REPEATS = 5
CASES = {"all layers, float32": ((3,), "float32"), "average, float16": ((), "float16")}


def h5py_writer(f: h5py.File, lines: list[np.ndarray], dtype: str) -> None:
    """Every line made by ``create_dataset`` first (in line order, as a dump does), then filled, HDF5 converting."""
    for i, data in enumerate(lines):
        f.create_dataset(str(i), shape=data.shape, dtype=h5dump.DTYPES[dtype])
    for i, data in enumerate(lines):
        h5py.h5d.open(f.id, str(i).encode()).write(h5py.h5s.create_simple(data.shape), h5py.h5s.ALL, data)


def elmo_writer(f: h5py.File, lines: list[np.ndarray], dtype: str) -> None:
    """As `dump.dump_embeddings` writes: `h5dump`'s lines, made through h5py's low-level API, cast by torch."""
    for i, data in enumerate(lines):
        h5dump.create_line_dataset(f, i, data.shape, dtype)
    for i, data in enumerate(lines):
        h5dump.write_line(f, i, data)


WRITERS = {"h5py create_dataset, HDF5 converts": h5py_writer, "elmo-cli's writer": elmo_writer}


def seconds(writer, lines: list[np.ndarray], dtype: str, path: Path) -> float:
    with h5py.File(path, "w", track_order=True) as f:
        start = time.perf_counter()
        writer(f, lines, dtype)
        f.flush()
        return time.perf_counter() - start


def main() -> None:
    lengths = [len(l.split()) for l in HELDOUT.read_text("utf-8").splitlines() if l.strip()] * 4
    tokens = sum(lengths)
    rng = np.random.default_rng(0)
    with Recording("writer", "python -m benchmarks.bench_writer") as rec, \
            tempfile.TemporaryDirectory(prefix="bench-writer-") as tmp:
        rec.figures = {"lines": len(lengths), "tokens": tokens}
        for case, (lead, dtype) in CASES.items():
            lines = [rng.standard_normal((*lead, n, 1024), dtype=np.float32) for n in lengths]
            times: dict[str, list[float]] = {name: [] for name in WRITERS}
            seconds(elmo_writer, lines[:200], dtype, Path(tmp) / "warm.hdf5")  # warm-up
            for _ in range(REPEATS):
                for name, writer in WRITERS.items():
                    times[name].append(seconds(writer, lines, dtype, Path(tmp) / "out.hdf5"))
            rates = {name: tokens / statistics.median(t) for name, t in times.items()}
            ratio = rates["elmo-cli's writer"] / rates["h5py create_dataset, HDF5 converts"]
            rec.figures[case] = {**{f"{name} tokens/s": round(r) for name, r in rates.items()},
                                 "ratio": round(ratio, 2)}
            print(f"writer, {case}: " + " | ".join(f"{name} {r:,.0f} tokens/s" for name, r in rates.items())
                  + f" | {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()

"""The price of repeatable vectors: `dump_embeddings` with oneMKL in strict CNR mode (elmo-cli's default, see
`elmo_cli.machine`) beside oneMKL's defaults (``ELMO_CLI_BLAS=fast``), measured in one run.

The mode is fixed when a process first multiplies matrices, so every measurement is a fresh process: it loads the
model, dumps 8 sentences to warm up, then times the dump of bench_embed's 200 sentences (about 25 tokens, batch 64,
float32, random weights in the published `small` and `original` shapes). The two modes alternate, three processes
each; the figures are min and median tokens/s, and whether the three outputs of each mode were bit-identical.

    python -m benchmarks.run repeat        (or: python -m benchmarks.bench_repeat [small original])
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.bench_embed import load_sentences
from benchmarks.results import Recording
from elmo_cli.bilm_format import save_model_dir
from elmo_cli.machine import FAST_SWITCH, REPRODUCIBLE_BLAS
from elmo_cli.model.bilm import BiLM
from elmo_cli.presets import PRESETS

REPEATS = 3
MODES = {"repeatable": {}, "fast": {FAST_SWITCH: "fast"}}

# One measurement, in a fresh process: argv = model dir, warm-up text, text, output.
CHILD = """
import json, sys, time
from pathlib import Path
from elmo_cli.dump import dump_embeddings
from elmo_cli.loading import load_model
model, warm, text, out = map(Path, sys.argv[1:5])
layers, dtype = sys.argv[5:7]
loaded = load_model(model, device="cpu")
dump_embeddings(loaded, warm, out, batch_size=64, force=True, layers=layers, dtype=dtype)
start = time.perf_counter()
dump_embeddings(loaded, text, out, batch_size=64, force=True, layers=layers, dtype=dtype)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def digest(path: Path) -> str:
    import h5py

    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        for name in sorted((k for k in f if k.isdigit()), key=int):
            h.update(f[name][...].tobytes())
    return h.hexdigest()[:16]


def time_dump(model: Path, tmp: Path, out: Path, env: dict[str, str], cwd: Path | None = None,
              layers: str = "all", dtype: str = "float32") -> tuple[float, str]:
    """One fresh process: its dump seconds and the digest of what it wrote. `env` is the whole environment; `cwd`
    (with PYTHONPATH in `env`) runs another checkout's code; `layers` and `dtype` are the dump's."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(tmp / "warm.txt"), str(tmp / "text.txt"),
                           str(out), layers, dtype], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])["seconds"], digest(out)


def measure(model: Path, tmp: Path, mode: str, k: int) -> tuple[float, str]:
    env = {key: v for key, v in os.environ.items() if key not in REPRODUCIBLE_BLAS and key != FAST_SWITCH}
    return time_dump(model, tmp, tmp / f"{mode}-{k}.hdf5", env | MODES[mode])


def write_inputs(tmp: Path) -> int:
    """bench_embed's 200 sentences (text.txt) and the first 8 (warm.txt) in `tmp`; returns their tokens."""
    sentences = load_sentences()
    (tmp / "text.txt").write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
    (tmp / "warm.txt").write_text("\n".join(" ".join(s) for s in sentences[:8]) + "\n", encoding="utf-8")
    return sum(len(s) for s in sentences)


def random_model(name: str, directory: Path) -> Path:
    """A random biLM of the preset `name`'s shape (seed 0), written as a model directory."""
    torch.manual_seed(0)
    save_model_dir(BiLM(PRESETS[name].config.model).eval(), directory)
    return directory


def run_shape(name: str, tmp: Path, n_tokens: int) -> dict:
    model = random_model(name, tmp / name)
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    digests: dict[str, set[str]] = {m: set() for m in MODES}
    for k in range(REPEATS):
        for mode in MODES:
            s, d = measure(model, tmp, mode, k)
            seconds[mode].append(s)
            digests[mode].add(d)
    rates = {m: sorted(n_tokens / s for s in seconds[m]) for m in MODES}
    return {m: {"tokens_per_s_min": round(rates[m][0]), "tokens_per_s_median": round(statistics.median(rates[m])),
                "outputs_bit_identical": len(digests[m]) == 1} for m in MODES} | {
        "median_ratio_repeatable_over_fast": round(statistics.median(rates["repeatable"])
                                                   / statistics.median(rates["fast"]), 3)}


def main(shapes: list[str] | None = None) -> None:
    shapes = shapes or ["small", "original"]
    command = "python -m benchmarks.bench_repeat" + (f" {' '.join(shapes)}" if shapes != ["small", "original"] else "")
    with tempfile.TemporaryDirectory() as d, Recording("repeat", command) as rec:
        tmp = Path(d)
        rec.figures["tokens"] = n_tokens = write_inputs(tmp)
        for name in shapes:
            r = rec.figures[name] = run_shape(name, tmp, n_tokens)
            print(f"{name:>9}: strict CNR {r['repeatable']['tokens_per_s_median']:8,} tokens/s (min "
                  f"{r['repeatable']['tokens_per_s_min']:,}) | oneMKL defaults {r['fast']['tokens_per_s_median']:8,} "
                  f"(min {r['fast']['tokens_per_s_min']:,}) | ratio {r['median_ratio_repeatable_over_fast']:.3f} | "
                  f"bit-identical x{REPEATS}: {r['repeatable']['outputs_bit_identical']} / "
                  f"{r['fast']['outputs_bit_identical']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or None)

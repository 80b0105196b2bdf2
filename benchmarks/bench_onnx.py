"""Serving speed and memory: the exported ONNX graph in onnxruntime beside elmo-cli's own fp32 dump path
(`Embedder`, i.e. `embed_batch` with the `BiLSTMKernel`), on the same sentences, measured in one run.

bench_embed's Austen sentences (about 25 tokens each; all 200 at batch 64, the first 50 at batch 1), random weights
in the published `small` and `original` shapes, every layer (`--layers all`), 2 threads, batches in the same
length-sorted order for both. Each side runs in its own fresh process, so that its peak RSS (VmHWM, model
loading included) is its own; the onnxruntime process imports neither torch nor elmo_cli (character ids from the
torch-free `vocab` package). In each process: one warm-up batch, then REPEATS timed passes over all the batches;
min and median tokens/s of the passes. Before the figures, both sides' vectors of the first 16 sentences are checked
equal. The result file: benchmarks/results/onnx-DATE.json.

    python -m benchmarks.run onnx        (or: python -m benchmarks.bench_onnx [small] [original])
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.results import Recording, child_figures, own_peak_rss_mb

ROOT = Path(__file__).resolve().parent.parent
THREADS, CHECK, REPEATS = 2, 16, 3
BATCHES = {64: 200, 1: 50}  # batch size -> sentences embedded


def _sentences() -> list[list[str]]:
    from benchmarks.bench_embed import load_sentences

    return load_sentences()


def _batches(sentences: list[list[str]], batch: int) -> list[list[int]]:
    """The Embedder's batching: rows of similar length together (elmo_cli.inputs.length_sorted_batches)."""
    from elmo_cli.inputs import length_sorted_batches

    return length_sorted_batches([len(s) for s in sentences], batch)


def child(side: str, model: str, plan_path: str, out_path: str) -> None:
    """One side in this (fresh) process: a warm-up batch, REPEATS timed passes, JSON figures, the check vectors."""
    plan = json.loads(Path(plan_path).read_text())
    sentences, batches = plan["sentences"], plan["batches"]
    embed = _elmo_side(model) if side == "elmo" else _onnx_side(model)
    embed([sentences[k] for k in batches[0]])  # warm-up
    keep: dict[int, np.ndarray] = {}
    rates = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for batch in batches:
            for k, layers in zip(batch, embed([sentences[k] for k in batch])):
                if k < CHECK:
                    keep[k] = layers
        rates.append(sum(len(s) for s in sentences) / (time.perf_counter() - start))
    if side == "onnx":
        assert "torch" not in sys.modules and "elmo_cli" not in sys.modules
    np.savez(out_path, **{str(k): v for k, v in keep.items()})
    print(json.dumps({"tokens_per_s": rates, "peak_rss_mb": own_peak_rss_mb()}))


def _elmo_side(model: str):
    import torch

    from elmo_cli.embed import Embedder

    torch.set_num_threads(THREADS)
    embedder = Embedder(model, device="cpu")
    return lambda rows: embedder.embed_sentences(rows, batch_size=len(rows))


def _onnx_side(model: str):
    import onnxruntime as ort

    from vocab.chars import ByteChars

    chars = ByteChars()
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    def embed(rows: list[list[str]]) -> list[np.ndarray]:
        ids = np.zeros((len(rows), max(len(s) for s in rows), chars.max_chars), dtype=np.int64)
        for b, s in enumerate(rows):
            for t, token in enumerate(s):
                ids[b, t] = chars.encode(token)
        ids[ids.any(axis=-1)] += 1  # prediction form: +1 on every id of a token row, padding rows stay 0
        layers = session.run(["layers"], {"char_ids": ids})[0]  # (B, L+1, T, 2P)
        return [layers[b, :, : len(s)] for b, s in enumerate(rows)]

    return embed


def _run_child(side: str, model: Path, plan: Path, out: Path) -> dict:
    return child_figures("benchmarks.bench_onnx", [side, str(model), str(plan), str(out)], THREADS, ROOT)


def bench_shape(name: str, work: Path) -> dict:
    import torch

    from elmo_cli.bilm_format import save_model_dir
    from elmo_cli.graph_export import export_bilm
    from elmo_cli.model.bilm import BiLM
    from elmo_cli.presets import PRESETS

    torch.manual_seed(0)
    model_dir = work / name
    save_model_dir(BiLM(PRESETS[name].config.model), model_dir)
    onnx_path = work / f"{name}.onnx"
    export_bilm(onnx_path, "onnx", model_dir)
    figures = {}
    for batch, n in BATCHES.items():
        sentences = _sentences()[:n]
        plan = work / f"{name}-{batch}-plan.json"
        plan.write_text(json.dumps({"sentences": sentences, "batches": _batches(sentences, batch)}))
        sides = {side: _run_child(side, model_dir if side == "elmo" else onnx_path, plan, work / f"{side}.npz")
                 for side in ("elmo", "onnx")}
        a, b = np.load(work / "elmo.npz"), np.load(work / "onnx.npz")
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
        assert diff < 1e-4, f"{name}: onnxruntime differs from the dump by {diff}"
        row = {side: {"tokens_per_s_min": round(min(r["tokens_per_s"])),
                      "tokens_per_s_median": round(statistics.median(r["tokens_per_s"])),
                      "peak_rss_mb": round(r["peak_rss_mb"])} for side, r in sides.items()}
        row["onnx_over_elmo_speed"] = round(row["onnx"]["tokens_per_s_median"] / row["elmo"]["tokens_per_s_median"], 2)
        row["onnx_over_elmo_memory"] = round(sides["onnx"]["peak_rss_mb"] / sides["elmo"]["peak_rss_mb"], 2)
        row.update(sentences=n, tokens=sum(len(s) for s in sentences), max_abs_diff=diff)
        figures[f"batch_{batch}"] = row
        print(f"{name}, batch {batch}, {n} sentences: elmo-cli {row['elmo']['tokens_per_s_median']:,} tokens/s "
              f"(min {row['elmo']['tokens_per_s_min']:,}), {row['elmo']['peak_rss_mb']:,} MB | onnxruntime "
              f"{row['onnx']['tokens_per_s_median']:,} (min {row['onnx']['tokens_per_s_min']:,}), "
              f"{row['onnx']['peak_rss_mb']:,} MB | onnx/elmo-cli {row['onnx_over_elmo_speed']:.2f}x speed, "
              f"{row['onnx_over_elmo_memory']:.2f}x memory | max |diff| {diff:.1e}", flush=True)
    return figures


def main(argv: list[str] | None = None) -> None:
    argv = argv or []  # benchmarks.run calls main() with none: both shapes
    if argv[:1] == ["--child"]:
        child(*argv[1:5])
        return
    shapes = [a for a in argv if not a.startswith("-")] or ["small", "original"]
    command = "python -m benchmarks.bench_onnx" + ("" if shapes == ["small", "original"] else " " + " ".join(shapes))
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as tmp, Recording("onnx", command, THREADS) as rec:
        import onnxruntime

        rec.figures["onnxruntime"] = onnxruntime.__version__
        for name in shapes:
            rec.figures[name] = bench_shape(name, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])

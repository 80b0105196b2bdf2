"""Serving speed: the exported ONNX graph in onnxruntime against elmo-cli's own fp32 dump path (`Embedder`,
i.e. `embed_batch` with the `BiLSTMKernel`), on the same sentences, one run each.

The 200 Austen sentences of bench_embed (about 25 tokens each), random weights in the published `small` and
`original` shapes, batches of 64 in the same length-sorted order for both, every layer (`--layers all`), 2 threads.
Each side runs in its own fresh process so that its peak RSS (ru_maxrss, model loading included) is its own; the
onnxruntime process imports neither torch nor elmo_cli (character ids from the torch-free `vocab` package). Before the
figures, both sides' vectors of the first 16 sentences are checked equal (max abs difference printed).

    python -m benchmarks.run onnx        (or: python -m benchmarks.bench_onnx [small] [original])
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BATCH, THREADS, CHECK = 64, 2, 16


def _sentences() -> list[list[str]]:
    from benchmarks.bench_embed import load_sentences

    return load_sentences()


def _batches(sentences: list[list[str]]) -> list[list[int]]:
    """The Embedder's batching: rows of similar length together (elmo_cli.inputs.length_sorted_batches)."""
    from elmo_cli.inputs import length_sorted_batches

    return length_sorted_batches([len(s) for s in sentences], BATCH)


def child(side: str, model: str, plan_path: str, out_path: str) -> None:
    """One side in this (fresh) process: embed every batch once, print JSON figures, save the check vectors."""
    plan = json.loads(Path(plan_path).read_text())
    sentences, batches = plan["sentences"], plan["batches"]
    keep: dict[int, np.ndarray] = {}
    if side == "elmo":
        import torch

        from elmo_cli.embed import Embedder

        torch.set_num_threads(THREADS)
        embedder = Embedder(model, device="cpu")
        start = time.perf_counter()
        for batch in batches:
            for k, layers in zip(batch, embedder.embed_sentences([sentences[k] for k in batch], batch_size=BATCH)):
                if k < CHECK:
                    keep[k] = layers
    else:
        import onnxruntime as ort

        from vocab.chars import ByteChars

        chars = ByteChars()
        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        start = time.perf_counter()
        for batch in batches:
            rows = [sentences[k] for k in batch]
            ids = np.zeros((len(rows), max(len(s) for s in rows), chars.max_chars), dtype=np.int64)
            for b, s in enumerate(rows):
                for t, token in enumerate(s):
                    ids[b, t] = chars.encode(token)
            ids[ids.any(axis=-1)] += 1  # prediction form: +1 on every id of a token row, padding rows stay 0
            layers = session.run(["layers"], {"char_ids": ids})[0]
            for b, k in enumerate(batch):
                if k < CHECK:
                    keep[k] = layers[b, :, : len(sentences[k])]
        assert "torch" not in sys.modules and "elmo_cli" not in sys.modules
    seconds = time.perf_counter() - start
    np.savez(out_path, **{str(k): v for k, v in keep.items()})
    tokens = sum(len(s) for s in sentences)
    print(json.dumps({"seconds": seconds, "tokens_per_s": tokens / seconds,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _run_child(side: str, model: Path, plan: Path, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_onnx", "--child", side, str(model), str(plan),
                        str(out)], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{side} child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_shape(name: str, work: Path) -> None:
    import torch

    from elmo_cli.bilm_format import save_model_dir
    from elmo_cli.model.bilm import BiLM
    from elmo_cli.presets import PRESETS
    from elmo_cli.graph_export import export_bilm

    torch.manual_seed(0)
    model_dir = work / name
    save_model_dir(BiLM(PRESETS[name].config.model), model_dir)
    onnx_path = work / f"{name}.onnx"
    start = time.perf_counter()
    export_bilm(onnx_path, "onnx", model_dir)
    export_s = time.perf_counter() - start
    sentences = _sentences()
    plan = work / f"{name}-plan.json"
    plan.write_text(json.dumps({"sentences": sentences, "batches": _batches(sentences)}))
    elmo = _run_child("elmo", model_dir, plan, work / f"{name}-elmo.npz")
    onnx = _run_child("onnx", onnx_path, plan, work / f"{name}-onnx.npz")
    a, b = np.load(work / f"{name}-elmo.npz"), np.load(work / f"{name}-onnx.npz")
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a.files)
    assert diff < 1e-4, f"{name}: onnxruntime differs from the dump by {diff}"
    tokens = sum(len(s) for s in sentences)
    print(f"{name}: {len(sentences)} sentences, {tokens} tokens, batch {BATCH}, {THREADS} threads; "
          f"export {export_s:.0f} s, {onnx_path.stat().st_size / 1e6:.0f} MB; max |diff| {diff:.1e}")
    print(f"  elmo-cli fp32 dump (Embedder): {elmo['tokens_per_s']:8,.0f} tokens/s  peak RSS {elmo['peak_rss_mb']:6,.0f} MB")
    print(f"  onnxruntime {__import__('onnxruntime').__version__:>8}:        {onnx['tokens_per_s']:8,.0f} tokens/s  "
          f"peak RSS {onnx['peak_rss_mb']:6,.0f} MB")
    print(f"  onnxruntime / elmo-cli: {onnx['tokens_per_s'] / elmo['tokens_per_s']:.2f}x speed, "
          f"{onnx['peak_rss_mb'] / elmo['peak_rss_mb']:.2f}x memory")


def main(argv: list[str] | None = None) -> None:
    argv = argv or []  # benchmarks.run calls main() with none: both shapes
    if argv[:1] == ["--child"]:
        child(*argv[1:5])
        return
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name'"], capture_output=True, text=True).stdout.strip()
    print(f"{cpu}; load average {os.getloadavg()[0]:.2f} (a shared machine: figures vary run to run)")
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as tmp:
        for name in [a for a in argv if not a.startswith("-")] or ["small", "original"]:
            bench_shape(name, Path(tmp))


if __name__ == "__main__":
    main(sys.argv[1:])

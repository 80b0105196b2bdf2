"""Training throughput of `tiny` and `small` on this machine, and model FLOPs utilisation against its matmul rate.

MFU = nominal model FLOPs per token x tokens/s / (fp32 matmul FLOP/s measured in this run). Nominal FLOPs count
2 per multiply-add, the character CNN as if it ran over all W positions of every token (the distinct-token and
trailing-padding savings are the implementation's, not the model's), 4 LSTMs, the sampled softmax of both
directions (S + 1 logits each), and training = 3x forward. Tokens/s comes from `elmo_cli.train.train` itself
(the metrics.jsonl interval after a warm-up interval), over shards of examples/austen_train.txt.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.results import Recording

from elmo_cli.config import ModelConfig
from elmo_cli.train import train
from elmo_cli.presets import load_config

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "examples" / "austen_train.txt"


def matmul_rate(n: int = 1024, seconds: float = 2.0) -> float:
    """Best fp32 FLOP/s of an n x n x n matmul over a few repeats, at torch's current thread count."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t))
    return best


def flops_per_token(model: ModelConfig, negatives: int, vocab_size: int) -> float:
    """Nominal training FLOPs per token (see the module docstring)."""
    c, l = model.char_cnn, model.lstm
    W, E, F, P, H = c.max_characters_per_token, c.embedding_dim, c.n_filters, l.projection_dim, l.dim
    cnn = sum(2 * (W - w + 1) * w * E * n for w, n in c.filters)
    highway = c.n_highway * 2 * 2 * F * F
    projection = 2 * F * P
    lstms = 2 * l.n_layers * (2 * (P + P) * 4 * H + 2 * H * P)
    S = min(negatives, vocab_size)
    softmax = 2 * 2 * (S + 1) * P
    return 3.0 * (cnn + highway + projection + lstms + softmax)


def run_preset(preset: str, shards: Path, work: Path, warmup: int, measured: int, device: str = "cpu",
               **overrides) -> dict:
    cfg = load_config(None, preset).with_training(max_steps=warmup + measured, log_every=warmup,
                                                  checkpoint_every=0, checkpoint_minutes=0, device=device,
                                                  **overrides)
    run = work / f"run-{preset}"
    train(cfg, shards, run)
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    rate = records[-1]["tokens_per_s"]
    vocab = sum(1 for _ in open(shards / "vocab.txt", encoding="utf-8"))
    return {"preset": preset, "tokens_per_s": rate, "batch": cfg.training.batch_size,
            "negatives": min(cfg.training.n_negative_samples, vocab), "vocab": vocab,
            "flops_per_token": flops_per_token(cfg.model, cfg.training.n_negative_samples, vocab)}


def main() -> None:
    from vocab.shards import write_shards
    from vocab.vocabulary import build_vocab

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp, \
            Recording("train", "python -m benchmarks.bench_train") as rec:
        work = Path(tmp)
        build_vocab([CORPUS], work / "vocab.txt")
        write_shards([CORPUS], work / "vocab.txt", work / "shards")
        default_threads = torch.get_num_threads()
        # Both thread counts: on a shared host one busy neighbour makes 2-thread OpenMP regions wait on a
        # descheduled thread (10x slowdowns seen), while 1 thread only loses its share; compare like with like.
        for threads in sorted({default_threads, 1}, reverse=True):
            torch.set_num_threads(threads)
            rate = matmul_rate()
            print(f"fp32 matmul (1024^3, {threads} threads): {rate / 1e9:.0f} GFLOP/s", flush=True)
            results = [run_preset("tiny", work / "shards", work / f"t{threads}", warmup=8, measured=24,
                                  threads=threads),
                       run_preset("small", work / "shards", work / f"t{threads}", warmup=2, measured=5,
                                  threads=threads)]
            rate_after = matmul_rate(seconds=1.0)
            rate = max(rate, rate_after)  # the better of two measurements: a busy host only ever lowers it
            print(f"fp32 matmul after the runs: {rate_after / 1e9:.0f} GFLOP/s; using {rate / 1e9:.0f}")
            for r in results:
                mfu = r["flops_per_token"] * r["tokens_per_s"] / rate
                rec.figures[f"{r['preset']}_{threads}_threads"] = {
                    "tokens_per_s": round(r["tokens_per_s"]), "mfu_percent": round(100 * mfu),
                    "matmul_gflops": round(rate / 1e9), "gflops": round(r["flops_per_token"] * r["tokens_per_s"] / 1e9, 1)}
                print(f"train {r['preset']:5s} {threads} threads: {r['tokens_per_s']:7.0f} tokens/s  (batch "
                      f"{r['batch']}, {r['negatives']} negatives of {r['vocab']} words)  nominal "
                      f"{r['flops_per_token'] / 1e6:.0f} MFLOP/token -> "
                      f"{r['flops_per_token'] * r['tokens_per_s'] / 1e9:.1f} GFLOP/s, MFU {100 * mfu:.0f}%",
                      flush=True)
        torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()

"""Evaluation with an 800k-word full softmax: tokens/s and peak memory, against what dense logits would need.

The evaluation runs in a child process (a fresh interpreter, so its peak RSS is its own: VmHWM,
`benchmarks.results.own_peak_rss_mb`). The model is random: a small character encoder and LSTM
(the softmax dominates the work) with projection P = 512 and V = 800,000 output words, as the published
1B-Word model. The child reports its RSS after building the model, so the evaluation's own working memory
(peak - after build) can be set against the logits an unchunked softmax of the largest batch would hold.

    python -m benchmarks.bench_evaluate            (or `make bench`, which runs every benchmark)
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results import Recording, own_peak_rss_mb

VOCAB_SIZE = 800_000
PROJECTION_DIM = 512
SENTENCES = 200
BATCH_SIZE = 64
SEED = 0


def _lengths() -> list[int]:
    """Sentence lengths 3..9 words, fixed by the seed (short, so the run stays well under 2 minutes)."""
    import random

    rng = random.Random(SEED)
    return [rng.randint(3, 9) for _ in range(SENTENCES)]


def child(text_path: str) -> None:
    import torch

    from elmo_cli.config import CharCNNConfig, LSTMConfig, ModelConfig
    from elmo_cli.evaluate import evaluate
    from elmo_cli.loading import LoadedModel
    from elmo_cli.model import BiLM
    from vocab.tokenize import TextEncoder
    from vocab.vocabulary import Vocabulary

    torch.manual_seed(SEED)
    config = ModelConfig(char_cnn=CharCNNConfig(filters=((1, 32), (2, 32), (3, 64)), n_highway=1),
                         lstm=LSTMConfig(dim=1024, projection_dim=PROJECTION_DIM, n_layers=2))
    vocab = Vocabulary(["<S>", "</S>", "<UNK>"] + [f"w{i}" for i in range(VOCAB_SIZE - 3)])
    model = BiLM(config, vocab_size=VOCAB_SIZE).eval()
    loaded = LoadedModel(model, TextEncoder(vocab), None, torch.device("cpu"))
    rss_after_build = own_peak_rss_mb() * 2**20
    start = time.perf_counter()
    r = evaluate(loaded, [text_path], batch_size=BATCH_SIZE)
    seconds = time.perf_counter() - start
    peak = own_peak_rss_mb() * 2**20
    print(json.dumps({"rss_after_build": rss_after_build, "peak": peak, "seconds": seconds, "tokens": r.tokens,
                      "sentences": r.sentences, "average_perplexity": r.average_perplexity,
                      "threads": torch.get_num_threads()}))


def main() -> None:
    with Recording("evaluate", "python -m benchmarks.bench_evaluate") as rec:
        rec.figures.update(_run())


def _run() -> dict:
    import random

    lengths = _lengths()
    rng = random.Random(SEED + 1)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "test.txt"
        # Zipf-like word ids: frequent words low, as in a frequency-sorted vocabulary.
        lines = [" ".join(f"w{min(int(rng.paretovariate(0.8)) - 1, VOCAB_SIZE - 4)}" for _ in range(n))
                 for n in lengths]
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_evaluate", "--child", str(text)],
                              capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"evaluation child failed:\n{proc.stderr}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    peak = got["peak"]  # the child's own high-water mark (VmHWM), not ru_maxrss (inherited from this process)
    # The largest batch of the length-sorted run: BATCH_SIZE longest sentences, n + 1 targets each, both directions.
    biggest = 2 * sum(n + 1 for n in sorted(lengths, reverse=True)[:BATCH_SIZE])
    dense = biggest * VOCAB_SIZE * 4
    softmax_bytes = VOCAB_SIZE * (PROJECTION_DIM + 1) * 4
    working = peak - got["rss_after_build"]
    gb = 1e9
    print(f"vocabulary {VOCAB_SIZE:,} words x P={PROJECTION_DIM} (softmax weights {softmax_bytes / gb:.2f} GB), "
          f"{got['sentences']} sentences, batch {BATCH_SIZE}, {got['threads']} threads")
    print(f"targets scored: {got['tokens']:,} per direction ({2 * got['tokens']:,} softmax rows)")
    print(f"evaluation: {got['seconds']:.1f} s, {got['tokens'] / got['seconds']:,.0f} tokens/s "
          f"({2 * got['tokens'] / got['seconds']:,.0f} softmax rows/s, softmax alone "
          f"{2 * 2 * got['tokens'] * VOCAB_SIZE * PROJECTION_DIM / got['seconds'] / 1e9:.0f} GFLOP/s); "
          f"child wall {wall:.1f} s incl. model build")
    print(f"peak RSS {peak / gb:.2f} GB; after building the model {got['rss_after_build'] / gb:.2f} GB; "
          f"evaluation working memory {working / gb:.2f} GB")
    print(f"dense logits of the largest batch ({biggest:,} rows x {VOCAB_SIZE:,}): {dense / gb:.2f} GB "
          f"= {dense / max(working, 1):.0f}x the chunked evaluation's working memory")
    return {"tokens_per_s": round(got["tokens"] / got["seconds"]), "peak_rss_gb": round(peak / gb, 2),
            "after_build_gb": round(got["rss_after_build"] / gb, 2), "working_gb": round(working / gb, 2),
            "dense_logits_gb": round(dense / gb, 2), "dense_over_working": round(dense / max(working, 1))}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()

"""Kneser-Ney baseline: fit and score time, peak memory and held-out perplexity on the Austen corpus.

Every 20th line of the corpus is held out; the vocabulary is the training lines' types seen at least twice
(bilm-tf order, specials first), so held-out words outside it are ``<UNK>``. For each order (3 and 5) a fresh
child process (so its peak RSS is its own: VmHWM, `benchmarks.results.own_peak_rss_mb`) reads and encodes the
corpus, fits the forward and backward `elmo_cli.kneser_ney.KneserNey` models and scores the held-out lines, on
the same targets as `elmo-cli evaluate` (words + one boundary symbol per sentence). The target: 1M training
tokens at order 5 fitted and scored in under 2 minutes and 2 GB.

    python -m benchmarks.bench_kn            (or `make bench`, which runs every benchmark)
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.corpora import austen_novels
from benchmarks.results import Recording, own_peak_rss_mb

ROOT = Path(__file__).resolve().parents[1]
ORDERS = (3, 5)
HOLD_OUT_EVERY = 20
MIN_COUNT = 2


def child(corpus: str, order: int) -> None:
    from elmo_cli.kneser_ney import KneserNey, KneserNeyPerplexity
    from vocab.vocabulary import SPECIALS, Vocabulary, rank_counts

    t0 = time.perf_counter()
    lines = [ln.split() for ln in Path(corpus).read_text(encoding="utf-8").splitlines()]
    train = [w for i, w in enumerate(lines) if w and (i + 1) % HOLD_OUT_EVERY != 0]
    test = [w for i, w in enumerate(lines) if w and (i + 1) % HOLD_OUT_EVERY == 0]
    counts = Counter(w for s in train for w in s)
    vocab = Vocabulary(list(SPECIALS) + [w for w, c in rank_counts(counts) if c >= MIN_COUNT and w not in SPECIALS])
    train_ids = [vocab.encode(s) for s in train]
    test_ids = [vocab.encode(s) for s in test]
    t_prep = time.perf_counter() - t0
    out = {"order": order, "prep_seconds": t_prep, "vocab_size": len(vocab),
           "train_tokens": sum(len(s) for s in train), "test_words": sum(len(s) for s in test),
           "test_oov": int(sum((s == vocab.unk_id).sum() for s in test_ids))}
    sums = []
    for direction in ("forward", "backward"):
        t = time.perf_counter()
        model = KneserNey.fit(train_ids, len(vocab), order, vocab.bos_id, vocab.eos_id, direction)
        t_fit = time.perf_counter() - t
        t = time.perf_counter()
        sums.append(model.score(test_ids))
        out[f"{direction}_fit_seconds"], out[f"{direction}_score_seconds"] = t_fit, time.perf_counter() - t
        out[f"{direction}_discounts"] = model.discounts
    r = KneserNeyPerplexity(order, sums[0][1], sums[0][0], sums[1][0])
    out.update(tokens=r.tokens, forward=r.forward_perplexity, backward=r.backward_perplexity,
               average=r.average_perplexity, seconds=time.perf_counter() - t0,
               peak_rss=own_peak_rss_mb() * 2**20,
               torch_loaded="torch" in sys.modules)
    print(json.dumps(out))


def main() -> None:
    with Recording("kn", "python -m benchmarks.bench_kn", threads=1) as rec:
        _run(rec.figures)


def _run(figures: dict) -> None:
    corpus = austen_novels()
    print(f"corpus: {corpus} ({corpus.stat().st_size / 1e6:.1f} MB), every {HOLD_OUT_EVERY}th line held out, "
          f"vocabulary = training types seen >= {MIN_COUNT} times")
    for order in ORDERS:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_kn", "--child", str(corpus), str(order)],
                              capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"Kneser-Ney child (order {order}) failed:\n{proc.stderr}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        if order == ORDERS[0]:
            print(f"train {r['train_tokens']:,} words, vocabulary {r['vocab_size']:,}; held out {r['test_words']:,} "
                  f"words ({r['test_oov'] / r['test_words']:.2%} <UNK>), {r['tokens']:,} targets per direction")
        fit = r["forward_fit_seconds"] + r["backward_fit_seconds"]
        score = r["forward_score_seconds"] + r["backward_score_seconds"]
        print(f"KN{order}: fit {fit:.2f} s + score {score:.2f} s for both directions (read+vocab+encode "
              f"{r['prep_seconds']:.2f} s; child {r['seconds']:.1f} s, wall {wall:.1f} s incl. start-up), "
              f"peak RSS {r['peak_rss'] / 1e6:.0f} MB, torch imported: {r['torch_loaded']}")
        figures[f"kn{order}"] = {"fit_seconds": round(fit, 2), "score_seconds": round(score, 2),
                                 "peak_rss_mb": round(r["peak_rss"] / 1e6), "average_perplexity": round(r["average"], 2),
                                 "train_tokens": r["train_tokens"], "test_words": r["test_words"]}
        print(f"KN{order}: held-out perplexity forward {r['forward']:.2f}, backward {r['backward']:.2f}, "
              f"average {r['average']:.2f}")
        print(f"KN{order}: forward discounts (D1, D2, D3+) by order: "
              + "; ".join(f"{k}: " + ", ".join(f"{d:.3f}" for d in ds)
                          for k, ds in enumerate(r["forward_discounts"], start=1)))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()

"""Shard throughput and memory: `elmo-cli shard`'s library function on the Austen corpus, against `wc -w`.

Prints, all measured in this run: build-vocab and shard throughput (MB/s of text, tokens/s), peak RSS of the
sharding process (a fresh subprocess each time, its own VmHWM), bytes per token on disk, the time ratio
to `wc -w` over the same file, workers=2 vs 1, and peak RSS with a corpus ten times larger (the bound memory
should keep: at most +30%, since sharding streams the corpus; docs/design.md, "Memory bounds").
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.corpora import austen_novels
from benchmarks.results import Recording, run_measured

ROOT = Path(__file__).resolve().parents[1]
_SHARD = """
import json, sys, time
from vocab.shards import write_shards
t = time.perf_counter()
s = write_shards(sys.argv[1], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]))
print(json.dumps({"seconds": time.perf_counter() - t, "tokens": s.tokens, "bytes_per_token": s.bytes_per_token,
                  "text_bytes": s.text_bytes, "shards": s.shards}))
"""


def shard(corpus: Path, vocab: Path, out: Path, workers: int = 1) -> tuple[dict, float, float]:
    shutil.rmtree(out, ignore_errors=True)
    stdout, wall, rss = run_measured(["-c", _SHARD, str(corpus), str(vocab), str(out), str(workers)], cwd=ROOT)
    return json.loads(stdout.strip().splitlines()[-1]), wall, rss


def main() -> None:
    corpus = austen_novels()
    work = Path(tempfile.mkdtemp(prefix="bench-shard-"))
    with Recording("shard", "python -m benchmarks.bench_shard", threads=1) as rec:
        _run(corpus, work, rec.figures)


def _run(corpus: Path, work: Path, figures: dict) -> None:
    from vocab.vocabulary import build_vocab

    try:
        mb = corpus.stat().st_size / 1e6
        print(f"corpus: {corpus} ({mb:.1f} MB)")
        t = time.perf_counter()
        stats = build_vocab(corpus, work / "vocab.txt")
        t_vocab = time.perf_counter() - t
        print(f"build-vocab: {stats.tokens:,} tokens, {stats.vocab_size:,} types in {t_vocab:.2f} s "
              f"= {mb / t_vocab:.1f} MB/s, {stats.tokens / t_vocab:,.0f} tokens/s")

        t = time.perf_counter()
        subprocess.run(["wc", "-w", str(corpus)], check=True, capture_output=True)
        wc_wall = time.perf_counter() - t
        r1, wall1, rss1 = shard(corpus, work / "vocab.txt", work / "s1")
        print(f"shard (workers=1): {wall1:.2f} s wall (library {r1['seconds']:.2f} s) = {mb / wall1:.2f} MB/s, "
              f"{r1['tokens'] / wall1:,.0f} tokens/s, peak RSS {rss1:.0f} MB, {r1['bytes_per_token']:.2f} bytes/token, "
              f"{r1['shards']} shard(s)")
        print(f"wc -w same file: {wc_wall:.3f} s -> shard is {wall1 / wc_wall:.0f}x the time of wc -w")
        r2, wall2, rss2 = shard(corpus, work / "vocab.txt", work / "s2", workers=2)
        print(f"shard (workers=2): {wall2:.2f} s wall, peak RSS of the parent {rss2:.0f} MB, {r2['shards']} shard(s)"
              f" (one bucket per worker: no gain when there is one shard)")

        big = work / "corpus_x10.txt"
        with open(big, "wb") as f:
            data = corpus.read_bytes()
            for _ in range(10):
                f.write(data)
        r10, wall10, rss10 = shard(big, work / "vocab.txt", work / "s10")
        print(f"shard 10x corpus ({big.stat().st_size / 1e6:.0f} MB, {r10['tokens']:,} tokens, {r10['shards']} shards): "
              f"{wall10:.1f} s = {big.stat().st_size / 1e6 / wall10:.2f} MB/s, peak RSS {rss10:.0f} MB "
              f"= {rss10 / rss1:.2f}x the 1x corpus (limit 1.30x)")
        r10w, wall10w, _ = shard(big, work / "vocab.txt", work / "s10w", workers=2)
        same = all((work / "s10" / f).read_bytes() == (work / "s10w" / f).read_bytes() for f in ("manifest.json",))
        figures.update(corpus_mb=round(mb, 1), tokens=r1["tokens"], vocab_tokens_per_s=round(stats.tokens / t_vocab),
                       shard_mb_per_s=round(mb / wall1, 2), shard_tokens_per_s=round(r1["tokens"] / wall1),
                       times_wc=round(wall1 / wc_wall, 1), bytes_per_token=round(r1["bytes_per_token"], 2),
                       peak_rss_mb_1x=round(rss1), peak_rss_mb_10x=round(rss10), rss_10x_over_1x=round(rss10 / rss1, 2),
                       workers2_speedup_10x=round(wall10 / wall10w, 2), workers_identical=same)
        print(f"shard 10x corpus, workers=2: {wall10w:.1f} s ({wall10 / wall10w:.2f}x faster than workers=1; "
              f"identical manifest and shard checksums: {same})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

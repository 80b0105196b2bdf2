"""Quality at a time budget: held-out perplexity of `train --preset auto` and `--preset laptop` beside Kneser-Ney.

For every corpus (`benchmarks.corpora`: a fixed training/held-out split each), preset and budget:

    elmo-cli train --data TRAIN --validation HELDOUT --output RUN --preset PRESET --max-time MINUTES --threads 2

(the preset's own validation cadence; the run keeps the files of its best validation), then the model's held-out
average perplexity (full softmax, stateless: `elmo-cli evaluate`'s) over an order-5 Kneser-Ney model of the same
training text: biLM/KN5. The issue's targets, on a ~1M-token corpus and 2 threads: auto <= 0.70 at 60 minutes and
<= 0.62 at 120.

    python -m benchmarks.bench_quality [--corpus austen ...] [--preset auto laptop] [--minutes 60 ...]
                                       [--out DIR] [--threads 2]

`make bench-quality` runs the 60-minute column: austen-0.2M, austen, kjv and austen+kjv, auto and laptop (eight runs
of up to an hour, the two on austen-0.2M ending at their pass caps sooner, and the probes, splits and Kneser-Ney
models: 7 to 8.5 hours on 2 cores). Each run appends its record to
DIR/quality.jsonl and a rerun skips the (corpus, preset, minutes) already there; the table on stdout is made from
that file. Needs quiet cores: with other work on them, 2 torch threads crawl and the budget buys less.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.corpora import CORPORA, MissingCorpus, prepare
from benchmarks.results import commit, cpu_model

RESULTS = "quality.jsonl"
DEFAULT_CORPORA = ("austen-0.2M", "austen", "kjv", "austen+kjv")


def run(data: Path, info: dict, preset: str, minutes: float, threads: int, out: Path) -> dict:
    """One training run; returns its record (best validation over KN5, the auto line, speed)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = out / "runs" / f"{info['corpus']}-{preset}-{minutes:g}m-{stamp}"
    cmd = [sys.executable, "-c", "from elmo_cli.cli import app; app()", "train", "--data", str(data / "train"),
           "--validation", str(data / "heldout"), "--output", str(run_dir), "--preset", preset, "--max-time",
           f"{minutes}m", "--threads", str(threads)]
    start = time.monotonic()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    seconds = time.monotonic() - start
    (run_dir / "train-output.txt").write_text(done.stdout + done.stderr)
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    validations = [r for r in records if r.get("kind") == "validation"]
    rates = sorted(r["tokens_per_s"] for r in records if r.get("kind") == "train")
    best = min(validations, key=lambda v: v["average_perplexity"])
    baseline = next(r for r in records if r.get("kind") == "baseline")
    config = json.loads((run_dir / "config.json").read_text())
    return {"corpus": info["corpus"], "preset": preset, "minutes": minutes, "threads": threads,
            "train_tokens": info["train_tokens"], "vocab_size": info["vocab_size"],
            "kn5": round(baseline["average_perplexity"], 3), "best_average_perplexity": best["average_perplexity"],
            "best_step": best["step"], "ratio_kn5": round(best["average_perplexity"] / baseline["average_perplexity"], 4),
            "curve": [(round(v["elapsed"] / 60, 1), v["average_perplexity"]) for v in validations],
            "auto": next((ln for ln in done.stdout.splitlines() if ln.startswith("auto:")), None),
            "shape": f"{config['lstm']['dim']}/{config['lstm']['projection_dim']}",
            "dtype": config["training"]["dtype"], "dropout": config["training"]["dropout"],
            "epochs": records[-1].get("epoch") or max((r.get("epoch", 0) for r in records), default=0),
            "tokens_per_s_median": rates[len(rates) // 2] if rates else None, "seconds": round(seconds),
            "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"), "commit": commit(), "run": str(run_dir)}


def table(records: list[dict]) -> str:
    rows = [f"{'corpus':<12} {'tokens':>9} {'min':>5} {'preset':<7} {'shape':<9} {'dtype':<5} {'drop':>4} "
            f"{'epochs':>6} {'biLM':>8} {'KN5':>8} {'biLM/KN5':>8}"]
    for r in sorted(records, key=lambda r: (r["train_tokens"], r["minutes"], r["preset"])):
        rows.append(f"{r['corpus']:<12} {r['train_tokens']:>9,} {r['minutes']:>5g} {r['preset']:<7} {r['shape']:<9} "
                    f"{r['dtype']:<5} {r['dropout']:>4g} {r['epochs']:>6.1f} {r['best_average_perplexity']:>8.2f} "
                    f"{r['kn5']:>8.2f} {r['ratio_kn5']:>8.3f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPORA), choices=CORPORA)
    parser.add_argument("--preset", nargs="+", default=["auto", "laptop"])
    parser.add_argument("--minutes", nargs="+", type=float, default=[60.0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/quality"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    results = args.out / RESULTS
    args.out.mkdir(parents=True, exist_ok=True)
    done = [json.loads(ln) for ln in results.read_text().splitlines() if ln.strip()] if results.is_file() else []
    infos = {}
    for corpus in args.corpus:  # every split first: a missing corpus is said before hours of runs, not after
        try:
            infos[corpus] = prepare(corpus, args.out / "data" / corpus)
        except MissingCorpus as e:
            print(f"skipping {corpus}: {e}", file=sys.stderr, flush=True)
    for corpus, info in infos.items():
        data = args.out / "data" / corpus
        for minutes in args.minutes:
            for preset in args.preset:
                if any((r["corpus"], r["preset"], r["minutes"]) == (corpus, preset, minutes) for r in done):
                    continue
                print(f"{corpus}: {info['train_tokens']:,} training tokens; {preset}, {minutes:g} min ...",
                      flush=True)
                record = run(data, info, preset, minutes, args.threads, args.out)
                with open(results, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                done.append(record)
                print(f"  biLM/KN5 {record['ratio_kn5']:.3f} ({record['best_average_perplexity']:.2f} / "
                      f"{record['kn5']:.2f}); {record['auto'] or record['shape']}", flush=True)
    print(table(done))
    print(f"{cpu_model()}, {args.threads} threads; records in {results}")
    return done


if __name__ == "__main__":
    main()

"""Quality at a time budget: held-out perplexity of `train --preset laptop` against Kneser-Ney, on the Austen corpus.

The split is fixed: the corpus (one sentence per line, six novels) is cut into chapters: a chapter is a header line
``CHAPTER N`` / ``Chapter N`` and the lines after it, up to the next header or the next line made only of capital
letters and spaces (a novel's title, ``THE END``, ``FINIS``, ``VOLUME II``). Every 10th chapter, counted over the
whole file (the 10th, 20th, ...), is held out; everything else (other chapters, title pages, prefaces) is training
text. The vocabulary is the training types seen at least twice (``build-vocab --min-count 2``), so held-out words
outside it are ``<UNK>``. Then

    elmo-cli train --preset laptop --max-time MINUTES --threads 2 --validation HELDOUT --validation-every 1000000
                   --config {"training": {"validation_minutes": 15}}

validates (full softmax, stateless: `elmo-cli evaluate`'s average perplexity) every 15 minutes of training and at
the end; the table puts each validation next to order-3 and order-5 Kneser-Ney models of the same training text.
The laptop targets (issue): biLM/KN5 <= 0.95 at 60 minutes and <= 0.80 at 120 minutes, on 2 CPU cores.

    python -m benchmarks.bench_quality [--minutes 120] [--out DIR] [--threads 2]

takes the training budget plus 2-3 minutes (split, vocabulary and shards, made once per --out; Kneser-Ney; the
last validation); a budget under 60 minutes validates every quarter of it instead of every 15 minutes. Results:
DIR/quality.json and a table on stdout. Needs quiet cores: with other work on them, 2 torch threads crawl.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS_CANDIDATES = [ROOT.parent / "shared" / "corpora" / "en_austen_tok.txt",
                     Path("/work/shared/corpora/en_austen_tok.txt")]
HOLD_OUT_EVERY = 10
MIN_COUNT = 2
PRESET = "laptop"
CHAPTER = re.compile(r"^(CHAPTER|Chapter) [0-9IVXLC]+$")
CAPITALS = re.compile(r"^[A-Z][A-Z ]*$")  # a title, THE END, FINIS, VOLUME I: ends the chapter it follows


def split(corpus: Path, train_path: Path, heldout_path: Path) -> dict:
    """Write the training and held-out text of the fixed chapter split; returns counts."""
    train, heldout = [], []
    chapter, in_chapter = 0, False
    for line in corpus.read_text(encoding="utf-8").splitlines():
        if CHAPTER.match(line):
            chapter, in_chapter = chapter + 1, True
        elif CAPITALS.match(line):
            in_chapter = False
        held = in_chapter and chapter % HOLD_OUT_EVERY == 0
        (heldout if held else train).append(line)
    train_path.write_text("\n".join(train) + "\n", encoding="utf-8")
    heldout_path.write_text("\n".join(heldout) + "\n", encoding="utf-8")
    return {"chapters": chapter, "heldout_chapters": chapter // HOLD_OUT_EVERY,
            "train_lines": len(train), "train_tokens": sum(len(s.split()) for s in train),
            "heldout_lines": len(heldout), "heldout_tokens": sum(len(s.split()) for s in heldout)}


def elmo_cli(*args: str) -> None:
    cmd = [sys.executable, "-c", "from elmo_cli.cli import app; app()", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def prepare(corpus: Path, out: Path) -> dict:
    """Split, vocabulary, shards (kept in OUT/data for reruns with the same corpus)."""
    data = out / "data"
    if (data / "heldout" / "manifest.json").is_file():
        return json.loads((data / "split.json").read_text())
    data.mkdir(parents=True, exist_ok=True)
    info = split(corpus, data / "train.txt", data / "heldout.txt")
    elmo_cli("build-vocab", str(data / "train.txt"), "--output", str(data / "vocab.txt"), "--min-count",
             str(MIN_COUNT))
    info["vocab_size"] = sum(1 for _ in open(data / "vocab.txt", encoding="utf-8"))
    for part in ("train", "heldout"):
        elmo_cli("shard", str(data / f"{part}.txt"), "--vocab", str(data / "vocab.txt"), "--output",
                 str(data / part), "--force")
    (data / "split.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def kneser_ney(data: Path) -> dict:
    from elmo_cli.baselines import kneser_ney_baseline
    from vocab.tokenize import TextEncoder

    text = TextEncoder.from_dir(data / "train")
    return {f"kn{order}": kneser_ney_baseline([data / "train"], [data / "heldout"], text, order).average_perplexity
            for order in (3, 5)}


def train(data: Path, run: Path, minutes: float, threads: int) -> list[dict]:
    """The laptop preset for `minutes`; returns its validation records (metrics.jsonl)."""
    every = 15.0 if minutes >= 60 else minutes / 4
    config = run.parent / "validation.json"
    config.write_text(json.dumps({"training": {"validation_minutes": every}}))
    elmo_cli("train", "--data", str(data / "train"), "--validation", str(data / "heldout"), "--output", str(run),
             "--preset", PRESET, "--config", str(config), "--max-time", f"{minutes}m", "--threads", str(threads),
             "--validation-every", "1000000")
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    trains = [r for r in records if r.get("kind") == "train"]
    rates = sorted(r["tokens_per_s"] for r in trains)
    validations = [r for r in records if r.get("kind") == "validation"]
    for v in validations:
        if "elapsed" not in v:  # older metrics.jsonl: the training time of the last record at or before it
            v["elapsed"] = max((r["elapsed"] for r in trains if r["step"] <= v["step"]), default=0.0)
        v["tokens_per_s_median"] = rates[len(rates) // 2] if rates else None
    return validations


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=120.0, help="training budget (default 120)")
    parser.add_argument("--out", type=Path, default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corpus", type=Path, default=next((p for p in CORPUS_CANDIDATES if p.is_file()), None))
    args = parser.parse_args(argv)
    if args.corpus is None or not args.corpus.is_file():
        sys.exit("bench_quality: the Austen corpus (shared/corpora/en_austen_tok.txt) is not there; pass --corpus")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-quality-"))
    run = out / f"run-{args.minutes:g}m-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.monotonic()
    info = prepare(args.corpus, out)
    kn = kneser_ney(out / "data")
    validations = train(out / "data", run, args.minutes, args.threads)
    result = {"preset": PRESET, "minutes": args.minutes, "threads": args.threads, "corpus": str(args.corpus),
              "split": info, **kn, "run": str(run), "seconds": round(time.monotonic() - start),
              "validations": [{"minutes": round(v["elapsed"] / 60, 1), "step": v["step"],
                               "average_perplexity": v["average_perplexity"],
                               "forward_perplexity": v["forward_perplexity"],
                               "backward_perplexity": v["backward_perplexity"],
                               "ratio_kn5": round(v["average_perplexity"] / kn["kn5"], 3),
                               "ratio_kn3": round(v["average_perplexity"] / kn["kn3"], 3)} for v in validations],
              "train_tokens_per_s_median": validations[-1]["tokens_per_s_median"] if validations else None}
    (out / "quality.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"Austen, chapter split: {info['train_tokens']:,} training / {info['heldout_tokens']:,} held-out tokens, "
          f"vocabulary {info['vocab_size']:,}; preset {PRESET}, {args.minutes:g} min on {args.threads} threads, "
          f"{result['train_tokens_per_s_median'] or 0:,.0f} tokens/s (median)")
    print(f"{'minutes':>8} {'step':>7} {'avg ppl':>8} {'KN3':>8} {'KN5':>8} {'biLM/KN5':>9}")
    for v in result["validations"]:
        print(f"{v['minutes']:>8.1f} {v['step']:>7,} {v['average_perplexity']:>8.2f} {kn['kn3']:>8.2f} "
              f"{kn['kn5']:>8.2f} {v['ratio_kn5']:>9.3f}")
    print(f"targets: biLM/KN5 <= 0.95 at 60 min, <= 0.80 at 120 min; results in {out / 'quality.json'}")
    return result


if __name__ == "__main__":
    main()

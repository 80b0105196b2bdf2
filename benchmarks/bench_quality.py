"""Quality at a time budget: held-out perplexity of `train --preset auto` and `--preset laptop` beside Kneser-Ney.

For every corpus (`benchmarks.corpora`: a fixed training/held-out split each), preset and budget:

    elmo-cli train --data TRAIN --validation HELDOUT --output RUN --preset PRESET --max-time MINUTES --threads 2

(the preset's own validation cadence; the run keeps the files of its best validation), then the model's held-out
average perplexity (full softmax, stateless: `elmo-cli evaluate`'s) over an order-5 Kneser-Ney model of the same
training text: biLM/KN5, set beside the target for that preset and budget (`TARGETS`).

    python -m benchmarks.bench_quality [--corpus austen ...] [--preset auto laptop] [--minutes 60 ...]
                                       [--out DIR] [--threads 2] [--train-share 0.45] [--rows 32 64 ...]
                                       [--dropout 0.1 ...] [--lr 0.006 ...] [--weight-decay 0 ...]
                                       [--shape 1024/256 ...]
                                       [--epochs preset 200 ...]

`make bench-quality` runs the 60-minute column: austen-0.2M, austen, kjv and austen+kjv, auto and laptop (eight runs
of up to an hour, the two on austen-0.2M ending at their pass caps sooner, and the probes, splits and Kneser-Ney
models; a corpus that is not on the machine is skipped with one line naming the command that fetches it). Each run
appends its record to DIR/quality.jsonl and a rerun skips the (corpus, preset, minutes) already there; the table on
stdout is made from that file. The runs of one invocation, with the machine, load and the invocation's wall time,
go to benchmarks/results/quality-DATE.json (`benchmarks.results.Recording`). Needs quiet cores: with other work on
them, 2 torch threads crawl and the budget buys less.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.corpora import CORPORA, MissingCorpus, prepare
from benchmarks.results import Recording, commit, cpu_model, isa_caps
from elmo_cli.presets import MODEL_SHAPES

RESULTS = "quality.jsonl"
DEFAULT_CORPORA = ("austen-0.2M", "austen", "kjv", "austen+kjv")

# The quality targets, biLM/KN5 at the best validation of a run of that many minutes on 2 threads: their one
# statement (docs/auto.md and docs/benchmarks.md cite this table). Two recipes, two sets:
# - "auto": `--preset auto` on a corpus of about 1M training tokens (`AUTO_TARGET_TOKENS`), any of them;
# - "laptop": the `laptop` recipe on the `austen` split, the targets it was chosen against (elmo_cli/presets.py).
TARGETS = {"auto": {60.0: 0.70, 120.0: 0.62}, "laptop": {60.0: 0.95, 120.0: 0.80}}
AUTO_TARGET_TOKENS = (500_000, 2_000_000)


def target_for(record: dict) -> float | None:
    """The target a run's biLM/KN5 is held to, or None where none was set (other budgets, corpora, presets)."""
    target = TARGETS.get(record["preset"], {}).get(float(record["minutes"]))
    if record["preset"] == "auto":
        lo, hi = AUTO_TARGET_TOKENS
        return target if lo <= record["train_tokens"] <= hi else None
    return target if record["corpus"] == "austen" else None


# What a run may be asked over its preset's choice: the record's key, the `train` flag, the run directory's suffix.
ASKED = {"rows": ("--batch-size", "{:g}rows"), "dropout": ("--dropout", "dropout{:g}"), "lr": ("--lr", "lr{:g}"),
         "weight_decay": ("--weight-decay", "wd{:g}"), "shape": ("--config", "{}"), "epochs": ("--epochs", "{:g}ep")}


def shape_config(shape: str, run_dir: Path) -> Path:
    """A `--config` file in `run_dir` holding the model shape `shape` (a key of `MODEL_SHAPES`, e.g. "1024/256"),
    which `train` lays over its preset's (or `auto`'s) choice of model; training settings stay the preset's."""
    path = run_dir.parent / f"{run_dir.name}-shape.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(MODEL_SHAPES[shape].to_options(), indent=1) + "\n", encoding="utf-8")
    return path


def _flag_value(key: str, value, run_dir: Path) -> str:
    return str(shape_config(value, run_dir)) if key == "shape" else f"{value:g}"


def _suffix(key: str, value) -> str:
    return ASKED[key][1].format(value.replace("/", "-") if key == "shape" else value)


def asked_key(record: dict) -> tuple:
    """The cell a record fills: corpus, preset, minutes and what it was asked (None where the preset chose)."""
    return (record["corpus"], record["preset"], record["minutes"], *(record.get(f"asked_{k}") for k in ASKED))


def run(data: Path, info: dict, preset: str, minutes: float, threads: int, out: Path,
        **asked: float | str | None) -> dict:
    """One training run, with each of `asked` (rows, dropout, lr, weight decay, model shape, epochs; see `ASKED`)
    given to `train` over the preset's choice where not None; returns its record (best validation over KN5, the auto
    line, speed, and `asked_rows`, `asked_dropout`, ... `asked_epochs` where given)."""
    asked = {k: v for k, v in asked.items() if v is not None}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    suffix = "".join("-" + _suffix(k, v) for k, v in asked.items())
    run_dir = out / "runs" / f"{info['corpus']}-{preset}-{minutes:g}m{suffix}-{stamp}"
    cmd = [sys.executable, "-c", "from elmo_cli.cli import app; app()", "train", "--data", str(data / "train"),
           "--validation", str(data / "heldout"), "--output", str(run_dir), "--preset", preset, "--max-time",
           f"{minutes}m", "--threads", str(threads),
           *[a for k, v in asked.items() for a in (ASKED[k][0], _flag_value(k, v, run_dir))]]
    start = time.monotonic()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    seconds = time.monotonic() - start
    (run_dir / "train-output.txt").write_text(done.stdout + done.stderr)
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    validations = [r for r in records if r.get("kind") == "validation"]
    rates = sorted(r["tokens_per_s"] for r in records if r.get("kind") == "train")
    best = min(validations, key=lambda v: v["average_perplexity"])
    baseline = next(r for r in records if r.get("kind") == "baseline")
    chosen = next((r for r in records if r.get("kind") == "auto"), None)
    config = json.loads((run_dir / "config.json").read_text())
    return {"corpus": info["corpus"], "preset": preset, "minutes": minutes, "threads": threads,
            "train_tokens": info["train_tokens"], "vocab_size": info["vocab_size"],
            **({"train_share": info["train_share"]} if "train_share" in info else {}),
            "kn5": round(baseline["average_perplexity"], 3), "best_average_perplexity": best["average_perplexity"],
            "best_step": best["step"], "ratio_kn5": round(best["average_perplexity"] / baseline["average_perplexity"], 4),
            "curve": [(round(v["elapsed"] / 60, 1), v["average_perplexity"]) for v in validations],
            "auto": next((ln for ln in done.stdout.splitlines() if ln.startswith("auto:")), None),
            "shape": f"{config['lstm']['dim']}/{config['lstm']['projection_dim']}",
            "dtype": config["training"]["dtype"], "dropout": config["training"]["dropout"],
            "lr": config["training"]["lr"], "rows": config["training"]["batch_size"],
            "optimizer": config["training"]["optimizer"], "weight_decay": config["training"]["weight_decay"],
            "epochs": records[-1].get("epoch") or max((r.get("epoch", 0) for r in records), default=0),
            "tokens_per_s_median": rates[len(rates) // 2] if rates else None, "seconds": round(seconds),
            "tokens_per_s_by_5min": rate_by_window(records, 300.0),
            "tokens_per_s_mean": next(iter(rate_by_window(records, math.inf)), None),  # the rate `train` ends with
            "estimate": next((ln for ln in done.stdout.splitlines() if ln.startswith("auto expected")), None),
            **({"probe_tokens_per_s": chosen["tokens_per_s"], "probe_seconds": chosen["probe_seconds"],
                "probes": chosen["probes"]} if chosen else {}),
            **{"read": {k: v for k, v in r.items() if k != "kind"}  # rule 11's read of the run's first minute
               for r in records if r.get("kind") == "auto-read"},
            "cpu": cpu_model(), **isa_caps(), "date": time.strftime("%Y-%m-%d"), "commit": commit(), "run": str(run_dir),
            **{f"asked_{k}": v for k, v in asked.items()}}


def rate_by_window(records: list[dict], seconds: float) -> list[float]:
    """The training tokens/s of each `seconds` of a run's training clock, from metrics.jsonl's train records (each
    one's tokens/s is over the steps since the one before, validations left out: `train._Meter`): the tokens
    trained in the window over the time they took, to read a run's speed against its probe minute by minute."""
    windows: dict[int, list[float]] = {}  # window -> [tokens, seconds]
    for r, tokens, trained in trained_steps(records):
        w = windows.setdefault(int(r["elapsed"] // seconds), [0.0, 0.0])
        w[0] += tokens
        w[1] += trained
    return [round(t / s, 1) for _, (t, s) in sorted(windows.items()) if s > 0]


def trained_steps(records: list[dict]):
    """(record, tokens, seconds) of each train record of metrics.jsonl: the tokens trained since the record before
    and the seconds they took (its tokens/s is over those steps, validations and checkpoints left out:
    `train._Meter`)."""
    before = 0
    for r in (r for r in records if r.get("kind") == "train"):
        tokens, before = r["tokens"] - before, r["tokens"]
        yield r, tokens, tokens / max(r["tokens_per_s"], 1e-9)


def table(records: list[dict]) -> str:
    rows = [f"{'corpus':<12} {'tokens':>9} {'min':>5} {'preset':<7} {'shape':<9} {'dtype':<5} {'drop':>4} "
            f"{'epochs':>6} {'biLM':>8} {'KN5':>8} {'biLM/KN5':>8}  target"]
    for r in sorted(records, key=lambda r: (r["train_tokens"], r["minutes"], r["preset"])):
        target = target_for(r)
        met = "" if target is None else f"<= {target:.2f} {'met' if r['ratio_kn5'] <= target else 'NOT met'}"
        rows.append(f"{r['corpus']:<12} {r['train_tokens']:>9,} {r['minutes']:>5g} {r['preset']:<7} {r['shape']:<9} "
                    f"{r['dtype']:<5} {r['dropout']:>4g} {r['epochs']:>6.1f} {r['best_average_perplexity']:>8.2f} "
                    f"{r['kn5']:>8.2f} {r['ratio_kn5']:>8.3f}  {met}")
    return "\n".join(rows)


def epochs_asked(text: str) -> float | None:
    """`--epochs`' values: a positive number of epochs, or `preset` (None: the preset's own run length)."""
    if text == "preset":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a positive number of epochs nor `preset`")
    return value


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", nargs="+", default=list(DEFAULT_CORPORA), choices=CORPORA)
    parser.add_argument("--preset", nargs="+", default=["auto", "laptop"])
    parser.add_argument("--minutes", nargs="+", type=float, default=[60.0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/quality"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-share", type=float, default=1.0,
                        help="keep this share of each corpus's training lines, spread evenly (held-out text whole)")
    parser.add_argument("--label", default=None, help="results file quality-LABEL-DATE.json (runs side by side)")
    parser.add_argument("--rows", nargs="+", type=int, default=[None],
                        help="batch rows to train each preset at (quality at equal time by rows); default the preset's")
    parser.add_argument("--dropout", nargs="+", type=float, default=[None],
                        help="dropout to train each preset at (over auto's choice); default the preset's")
    parser.add_argument("--lr", nargs="+", type=float, default=[None],
                        help="peak learning rate to train each preset at; default the preset's")
    parser.add_argument("--weight-decay", nargs="+", type=float, default=[None],
                        help="weight decay to train each preset at (0: none, over auto's AdamW); default the preset's")
    parser.add_argument("--shape", nargs="+", default=[None], choices=[None, *MODEL_SHAPES],
                        help="model shape to train each preset at, e.g. 1024/256 (over auto's choice; auto's dropout "
                             "stays the one it chose for its own shape unless --dropout is given); default the preset's")
    parser.add_argument("--epochs", nargs="+", type=epochs_asked, default=[None],
                        help="epochs to train each preset for, `preset` for the preset's own run length: with the "
                             "time budget, past the passes the clock allows the schedule follows the clock, so "
                             "`--epochs preset 200` sets auto's pass cap (rule 5) beside no cap; default the preset's")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    results = args.out / RESULTS
    args.out.mkdir(parents=True, exist_ok=True)
    done = [json.loads(ln) for ln in results.read_text().splitlines() if ln.strip()] if results.is_file() else []
    command = " ".join(["python -m benchmarks.bench_quality", *argv])
    with Recording("quality", command, args.threads, args.label) as rec:
        infos, skipped = {}, {}
        for corpus in args.corpus:  # every split first: a missing corpus is said before hours of runs, not after
            try:
                infos[corpus] = prepare(corpus, args.out / "data" / corpus, args.train_share)
            except MissingCorpus as e:
                skipped[corpus] = str(e)
                print(f"skipping {corpus}: {e}", file=sys.stderr, flush=True)
        runs = []
        for corpus, info in infos.items():
            data = args.out / "data" / corpus
            for minutes, preset, *values in itertools.product(args.minutes, args.preset, args.rows, args.dropout,
                                                              args.lr, args.weight_decay, args.shape,
                                                              args.epochs):
                asked = dict(zip(ASKED, values))
                if any(asked_key(r) == (corpus, preset, minutes, *asked.values()) for r in done):
                    continue
                print(f"{corpus}: {info['train_tokens']:,} training tokens; {preset}, {minutes:g} min"
                      + "".join(f", {k} {v}" for k, v in asked.items() if v is not None) + " ...", flush=True)
                record = run(data, info, preset, minutes, args.threads, args.out, **asked)
                with open(results, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")
                done.append(record)
                runs.append(record)
                print(f"  biLM/KN5 {record['ratio_kn5']:.3f} ({record['best_average_perplexity']:.2f} / "
                      f"{record['kn5']:.2f}); {record['auto'] or record['shape']}", flush=True)
        # The whole invocation's wall time (splits, Kneser-Ney, probes and runs) is the record's `seconds`: with the
        # Makefile's arguments, the time of `make bench-quality` less the install.
        rec.figures = {"runs": [{k: v for k, v in r.items() if k != "run"} | {"target": target_for(r)}
                                for r in runs], "skipped": skipped}
    print(table(done))
    print(f"{cpu_model()}, {args.threads} threads; records in {results}")
    return done


if __name__ == "__main__":
    main()

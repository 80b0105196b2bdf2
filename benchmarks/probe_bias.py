"""How far `auto`'s probe reads from the run it chose, over every saved quality run: what sets
`auto.SUSTAINED_SHARE`, chosen on the corpora the rule was tuned on and reported on the held-out ones.

    python -m benchmarks.probe_bias [--share 0.95] [--label NAME] [--run-dirs bench-out/quality-*]

For each `--preset auto` run of ``benchmarks/results/quality-*.json`` that saved its probe (``probe_tokens_per_s``:
the rate the rule counted passes by) and its training rate, it takes the probe over the run; a run with another
shape laid over the rule's choice (``--shape``) is left out, since its probe read the shape it did not train. A
run that trained under `MIN_RUN_MINUTES` is left out too: it measured seconds, not a run of minutes; and so are
the runs of `DISTURBED`, whose probe was run beside other work on purpose (rule 11's measurement). The
run's rate is its mean (``tokens_per_s_mean``: tokens over the seconds that trained, validations and checkpoints left out), or in
runs saved before that was kept (2026-12-05) the median of its records (``tokens_per_s_median``). The median of
those ratios on the tuning corpora (`TUNING`: the rule's constants were chosen there, docs/auto.md) gives the
share of a probe's read that a run sustains, 1 / median, to two places. On the held-out corpora it counts the runs whose
probe lands within 10% of the run, as read and at that share (or at ``--share``), by CPU. Two figures say what a
longer read would buy: over every saved run with three 5-minute windows or more (any preset: the host is the same),
how often the first window reads the rest within 10%; and over the `auto` runs that printed their end line, those
whose own passes (made, not expected) would have taken another dropout under rule 3 as it is now. With
``--run-dirs``, a third: a read inside the run, its first 1, 2 and 3 minutes of training against the rest, over the
run directories there (``metrics.jsonl``; runs are not committed, so this figure is the machine's that ran them).
Reads saved files only: nothing is timed, so the machine and load it records are not the runs'. Results:
benchmarks/results/probe-bias-DATE.json.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.bench_quality import trained_steps
from benchmarks.results import RESULTS_DIR, Recording
from elmo_cli import auto

TUNING = ("austen-0.2M", "austen", "kjv", "austen+kjv", "zh")  # the rule's constants were chosen on these
WITHIN = 0.10  # how close to its run a probe should read (docs/auto.md, rule 10)
# A run that trained fewer minutes than this says nothing of the pace of a run of minutes, which rule 10 is about
# (the `zh` poems' capped quarter hours trained 0.9-1.6 minutes; with them the tuning median reads 1.032, not 1.065)
MIN_RUN_MINUTES = 3.0
# Runs whose probe was disturbed on purpose: they measure rule 11, not the probe's bias
DISTURBED = ("quality-web-rule11-hog-zen5-20m-2026-12-07.json",  # the probe beside two busy processes
             "quality-web-0p2-read-hog-zen5-15m-2026-12-07.json",  # beside three
             "quality-web-0p2-oldread-hog-zen5-15m-2026-12-07.json")
EARLY_MINUTES = (1.0, 2.0, 3.0)  # a read inside the run, after its first minutes of training, against the rest


def saved_runs(results_dir: Path = RESULTS_DIR):
    """(file, run) for every run of the saved quality results, in file order."""
    for path in sorted(results_dir.glob("quality-*.json")):
        for run in json.loads(path.read_text())["figures"].get("runs", []):
            yield path, run


def probe_over_run(results_dir: Path = RESULTS_DIR) -> list[dict]:
    """Every saved `auto` run's probe over its run: file, corpus, CPU, minutes and the ratio, in file order."""
    runs = []
    for path, run in saved_runs(results_dir):
        rate = run.get("tokens_per_s_mean") or run.get("tokens_per_s_median")
        if run.get("preset") != "auto" or not run.get("probe_tokens_per_s") or not rate:
            continue
        if probed_shape(run) != run["shape"]:  # `--shape` laid over the choice: the probe read another model
            continue
        if path.name in DISTURBED:
            continue
        if run.get("epochs") and run.get("train_tokens") and \
                run["epochs"] * run["train_tokens"] / rate < 60 * MIN_RUN_MINUTES:  # a run of seconds, not minutes
            continue
        runs.append({"file": path.name, "corpus": run["corpus"], "cpu": run.get("cpu", "?"),
                     "minutes": run.get("minutes"), "run_rate": "mean" if run.get("tokens_per_s_mean") else
                     "median", "ratio": round(run["probe_tokens_per_s"] / rate, 4)})
    return runs


def probed_shape(run: dict) -> str | None:
    """The shape the rule chose and probed, from its line (`auto: LSTM 1024/256, ...`), as `run["shape"]` spells it."""
    match = re.match(r"auto: LSTM (\d+/\d+)", run.get("auto") or "")
    return match.group(1) if match else None


def first_window_over_rest(results_dir: Path = RESULTS_DIR) -> list[float]:
    """Every saved run's first 5-minute rate over the mean of its later 5-minute rates (runs with three or more)."""
    ratios = []
    for _, run in saved_runs(results_dir):
        windows = run.get("tokens_per_s_by_5min") or []
        if len(windows) >= 3:
            ratios.append(round(windows[0] / statistics.mean(windows[1:]), 4))
    return ratios


def early_over_rest(run_dirs: list[Path], minutes: float) -> list[float]:
    """A read inside the run: for every run under `run_dirs` (its ``metrics.jsonl``, any preset) that trained at
    least three times `minutes` more after them, the rate of its first `minutes` of training over the rate of the
    rest. Training time is each train record's (`bench_quality.trained_steps`); a record is in the first part while
    the time before it is under `minutes`."""
    ratios = []
    for path in sorted(p for d in run_dirs for p in Path(d).rglob("metrics.jsonl")):
        records = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        parts, seconds = [[0.0, 0.0], [0.0, 0.0]], 0.0  # [tokens, seconds] before and after `minutes`
        for _, tokens, trained in trained_steps(records):
            part = parts[seconds >= 60 * minutes]
            part[0] += tokens
            part[1] += trained
            seconds += trained
        (early_tokens, early_s), (rest_tokens, rest_s) = parts
        if early_s > 0 and rest_s >= 3 * 60 * minutes:
            ratios.append(round((early_tokens / early_s) / (rest_tokens / rest_s), 4))
    return ratios


def dropout_moved(results_dir: Path = RESULTS_DIR) -> tuple[int, list[dict]]:
    """(runs weighed, those moved): the `auto` runs whose passes as made would have taken another dropout than
    their passes as expected, under rule 3 as it is now (`auto.dropout_for`, the smallest shape held to
    `auto.SMALLEST_MAX_DROPOUT`). Not weighed: runs without the end line (``auto expected N passes ...``), with a
    shape or passes laid over the choice, and runs expected to reach the pass cap (a capped run's passes are the
    cap's, not its rate's)."""
    weighed, moved = 0, []
    for path, run in saved_runs(results_dir):
        match = re.match(r"auto expected ([\d.]+) passes", run.get("estimate") or "")
        if (run.get("preset") != "auto" or not match or not run.get("epochs") or run.get("asked_epochs")
                or probed_shape(run) != run["shape"] or path.name in DISTURBED):
            continue
        expected, made, tokens = float(match.group(1)), run["epochs"], run["train_tokens"]
        if expected >= auto.max_epochs(tokens):
            continue
        weighed += 1
        limit = auto.SMALLEST_MAX_DROPOUT if run["shape"] == "512/128" else 1.0
        before, after = (min(auto.dropout_for(x, tokens), limit) for x in (expected, made))
        if before != after:
            moved.append({"file": path.name, "corpus": run["corpus"], "train_tokens": tokens,
                          "passes_expected": expected, "passes_made": round(made, 1),
                          "dropout_expected": before, "dropout_made": after})
    return weighed, moved


def sustained_share(runs: list[dict]) -> float:
    """1 / the median probe-over-run ratio of the tuning corpora's runs, to two places."""
    return round(1 / statistics.median(r["ratio"] for r in runs if r["corpus"] in TUNING), 2)


def within(ratios: list[float], share: float) -> int:
    """How many probes, scaled by `share`, land within `WITHIN` of their runs."""
    return sum(abs(share * x - 1) <= WITHIN + 1e-9 for x in ratios)


def early_figures(run_dirs: list[Path], minutes: float, share: float) -> dict:
    """How a read of a run's first `minutes` stands against the rest: runs, median, and within 10% as read, at the
    probe's `share`, and at the share its own median would give (the best any one share could do, in-sample)."""
    ratios = early_over_rest(run_dirs, minutes)
    if not ratios:
        return {"runs": 0}
    median = statistics.median(ratios)
    return {"runs": len(ratios), "median": round(median, 3), "within_10pct_as_read": within(ratios, 1.0),
            "within_10pct_at_share": within(ratios, share),
            "within_10pct_at_own_median": within(ratios, 1 / median)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--share", type=float, default=None, help="the share to report (default: the tuning one)")
    parser.add_argument("--label", default=None)
    parser.add_argument("--run-dirs", nargs="*", type=Path, default=[],
                        help="folders of run directories (bench_quality's --out) to read a run's first minutes from")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    runs = probe_over_run()
    share = args.share or sustained_share(runs)
    windows = first_window_over_rest()
    weighed, moved = dropout_moved()
    with Recording("probe-bias", " ".join(["python -m benchmarks.probe_bias", *argv]), label=args.label) as rec:
        tuning = [r["ratio"] for r in runs if r["corpus"] in TUNING]
        held = [r for r in runs if r["corpus"] not in TUNING]
        by_cpu: dict[str, list[float]] = defaultdict(list)
        for r in held:
            by_cpu[r["cpu"]].append(r["ratio"])
        rec.figures = {
            "tuning_corpora": list(TUNING), "tuning_runs": len(tuning),
            "tuning_median_probe_over_run": round(statistics.median(tuning), 3),
            "tuning_within_10pct_as_read": within(tuning, 1.0), "tuning_within_10pct_at_share": within(tuning, share),
            "sustained_share": sustained_share(runs), "share_reported": share,
            "held_out_runs": len(held),
            "held_out_median_probe_over_run": round(statistics.median(r["ratio"] for r in held), 3),
            "held_out_within_10pct_as_read": within([r["ratio"] for r in held], 1.0),
            "held_out_within_10pct_at_share": within([r["ratio"] for r in held], share),
            "held_out_outside_at_share": sorted(r["ratio"] for r in held if not within([r["ratio"]], share)),
            "held_out_by_cpu": {cpu: {"runs": len(x), "median_probe_over_run": round(statistics.median(x), 3),
                                      "within_10pct_as_read": within(x, 1.0),
                                      "within_10pct_at_share": within(x, share)} for cpu, x in by_cpu.items()},
            "first_5min_over_rest": {"runs": len(windows), "median": round(statistics.median(windows), 3),
                                     "within_10pct": within(windows, 1.0)},
            **({"early_over_rest": {f"{m:g}min": early_figures(args.run_dirs, m, share) for m in EARLY_MINUTES}}
               if args.run_dirs else {}),
            "dropout_weighed": weighed, "dropout_moved_by_passes_made": moved,
            "runs": runs,
        }
        for key, value in rec.figures.items():
            if key not in ("runs", "dropout_moved_by_passes_made"):
                print(f"{key}: {value}")
        for m in moved:
            print(f"dropout moved: {m['file']} {m['corpus']}: {m['passes_expected']} passes expected, "
                  f"{m['passes_made']} made: {m['dropout_expected']} -> {m['dropout_made']}")


if __name__ == "__main__":
    main()

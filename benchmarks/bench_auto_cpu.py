"""`--preset auto` for an hour on this CPU, its choice and its opening minutes: every probe behind the choice, then
the chosen configuration trained for a few minutes, the run's own tokens/s beside the probe's estimate.

    python -m benchmarks.bench_auto_cpu [--corpus sotu] [--minutes 60] [--run-seconds 180] [--threads 2]
                                        [--label NAME] [--out DIR]

The choice is the one ``elmo-cli train --data TRAIN --preset auto --max-time MINUTES --threads THREADS`` makes
(`auto.auto_config`, the probe in this process); the run is `train` with that configuration and the
run's length cut to RUN_SECONDS (only the learning rate's schedule depends on the length, not the speed). Its speed
is the median of the per-step rates `train` reports after its first 20 steps (its first quarter, in a run of
fewer than 80). ``probe_over_run`` is how far the
estimate that set the passes is from the run: ``auto``'s rule asks it to be within 10%. Run it on pinned cores
(``taskset -c 0,1``), several side by side on one large CPU, each under its own ``ONEDNN_MAX_CPU_ISA`` (the record
names it): ``AVX512_CORE_BF16`` holds oneDNN, which computes torch's bf16 products on a CPU, to AVX512-BF16
without AMX; ``AVX512_CORE`` to AVX-512 without bf16 instructions. Results: benchmarks/results/auto-cpu-DATE.json
(auto-cpu-LABEL-DATE.json with --label).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.corpora import CORPORA, prepare
from benchmarks.results import Recording
from elmo_cli import auto
from elmo_cli.train import train


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="sotu", choices=CORPORA)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--run-seconds", type=float, default=180.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--label", default=None, help="results file auto-cpu-LABEL-DATE.json (runs side by side)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/probe"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    info = prepare(args.corpus, args.out / args.corpus)
    shards = args.out / args.corpus / "train"
    command = " ".join(["python -m benchmarks.bench_auto_cpu", *argv])
    with Recording("auto-cpu", command, args.threads, args.label) as rec:
        config, choice = auto.auto_config(shards, None, None, {"max_time": 60.0 * args.minutes,
                                                                "threads": args.threads, "device": "cpu"})
        print(choice.reason, flush=True)
        rec.figures = {"corpus": args.corpus, "train_tokens": info["train_tokens"], "minutes": args.minutes,
                       "line": choice.reason, "probe_seconds": round(choice.probe_seconds, 1),
                       "probes": [dict(shape=p.shape, dtype=p.dtype, rows=p.rows, tokens_per_s=round(p.tokens_per_s))
                                  for p in choice.probes],
                       "chosen": {"shape": choice.shape, "dtype": config.training.dtype,
                                  "probe_tokens_per_s": round(choice.tokens_per_s)}}
        rec.save()
        rates: list[tuple[int, float]] = []
        with tempfile.TemporaryDirectory() as run:
            start = time.monotonic()
            train(config.with_training(max_time=args.run_seconds, validation_every=0), shards, Path(run) / "run",
                  on_step=lambda step: rates.append((step.step, step.tokens_per_s)))
            seconds = time.monotonic() - start
        settled = [r for step, r in rates if step > min(20, len(rates) // 4)]
        run_rate = statistics.median(settled)
        rec.figures["run"] = {"seconds": round(seconds), "steps": len(rates), "steps_measured": len(settled),
                              "tokens_per_s_median": round(run_rate),
                              "probe_over_run": round(choice.tokens_per_s / run_rate, 3)}
        print(f"run: {run_rate:,.0f} tokens/s over {seconds:.0f} s; the probe said {choice.tokens_per_s:,.0f} "
              f"({choice.tokens_per_s / run_rate:.2f}x the run)", flush=True)
    return rec.figures


if __name__ == "__main__":
    main()

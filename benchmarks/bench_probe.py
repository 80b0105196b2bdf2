"""What `--preset auto` measures before it chooses: training tokens/s of each shape of its ladder, in fp32 and (where
this CPU or GPU computes bf16 natively) in bf16, as its probe runs them (`train.measure_throughput`: a fresh model,
two warm-up steps, then training steps for SECONDS), on 2 threads, with 1,024 sampled negatives, at 32 rows (the
`laptop` recipe's, which auto trains at) and at 64 and 128 (what more rows buy in tokens/s on this CPU; what they
cost in quality at equal time is not measured here: an hour per cell).

    python -m benchmarks.bench_probe [--corpus austen] [--seconds 20] [--repeats 3] [--threads 2] [--rows 32 64 128]
    python -m benchmarks.bench_probe --trace 24 [--compiled] [--corpus sotu] [--label NAME]
    python -m benchmarks.bench_probe --validation [--corpus sotu] [--rows 32] [--label NAME]
    python -m benchmarks.bench_probe --settle 40 [--idle 30] [--repeats 2] [--corpus sotu] [--label NAME]
    python -m benchmarks.bench_probe --pairs 6 [--rows 64] [--seconds 30] [--repeats 2] [--corpus tang] [--label NAME]
    python -m benchmarks.bench_probe --run 600 [--rows 64] [--repeats 4] [--compiled] [--corpus sotu] [--label NAME]

``--validation`` also times, REPEATS times per shape, one validation of the corpus's held-out shards as `train`
makes it (`train.validation_perplexity`: full softmax, fp32, eager, 64 rows) on a fresh model, and its tokens/s
over the shape's fp32 training rate: what `auto`'s rule 9 counts a validation's seconds by
(`auto.VALIDATION_OVER_TRAINING`).

``--trace SECONDS`` measures instead how a probe's rate settles: each shape and dtype at 32 rows trains SECONDS
once, as the probe does, and the record keeps the tokens/s of each 2-second interval, the rate a probe of
`auto.PROBE_SECONDS`'s longest (6 s) would report, and the rate of the steps after it (what the run goes on at). ``--compiled`` traces the compiled step too where
rule 8 probes it (a bf16 step: `auto.COMPILE_DTYPES`), after the eager one; like `auto`'s probe it is timed after
6 s of untimed steps (`train.measure_throughput`'s warm-up of a compiled step; traces before 2026-12-04 timed it
from its third step).

``--settle SECONDS`` asks why a probe's first seconds can read above the run that follows: it traces `auto`'s first
probe (`512/128`, fp32, eager, 32 rows) for SECONDS on a fresh model (a), at once again on another fresh model
(b), then after ``--idle`` seconds with the CPUs idle on a third (c), REPEATS times. Where (a) and (c) start high
and (b) does not, the CPU runs faster after idling (its clock, or the host's other load) and a probe taken cold
reads high; where all three do, it is the fresh model or process; where none does, neither.

``--pairs ROUNDS`` asks how well a few 6-s reads give the larger shape's speed over the smaller one's, which rule 1
weighs against `auto.MIN_PASS_SHARE`: each round reads the eager bf16 step (fp32 where bf16 is not native) of the
smaller shape, the larger, the smaller and the larger again, 6 s each, at the first of ``--rows``; then REPEATS
rounds read each shape for ``--seconds`` (the slower reference). From each round it keeps the larger over the
smaller from its first read (``first``), from the faster of the larger's two reads over the smaller's first, as
rule 1 weighed a second read until 2026-12-06 (``bare``), from the better of the two adjacent pairs (``paired``),
and from the larger's two reads over the smaller's two, as rule 1 weighs them now (``pairs``; where the larger's
reads are `auto.READ_SPREAD_MAX` apart it takes ``paired``), each against the long reads' ratio and counted where
it reaches `auto.MIN_PASS_SHARE` (a rate ratio stands in for rule 1's share of passes, which also counts each
shape's validations).

``--run SECONDS`` asks whether a run slows against the probe that chose it: `auto`'s probe of the smaller shape's
step (bf16 where native, eager, or compiled with ``--compiled``, at the first of ``--rows``) in REPEATS rounds of
one read in this process and one in a new one (spawned, in alternating order), a real run of that step
(`train.train`: no validation, no checkpoint until its end) for SECONDS in this process, and the rounds again. It
keeps the run's tokens/s by minute (the median of its records), its mean and the process's resident memory
before and after. Where the reads after the run, in both kinds of process, read as the run's last minutes, the
host slowed; where the new processes read faster than the one that ran, the run's own state (its heap, its
thread pools) is the cause. Runs before 2026-12-06 evening read twice in this process before and after, and no
new process.

Each (shape, dtype, rows) is measured REPEATS times, in alternating order, with min and median kept; the bf16/fp32
ratio per shape
is the one `auto` compares with its 1.15x bar, and the larger shape's rate over the smaller's says how many passes
it gives up. The corpus is one of `benchmarks.corpora` (split and shards made once under bench-out/). Results:
benchmarks/results/probe-DATE.json with the machine and load: on a CPU other work slows the probe, which is what
makes a short probe fragile.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.corpora import probe_arguments, probe_corpus
from benchmarks.results import Recording
from elmo_cli import auto, machine
from elmo_cli.model import BiLM
from elmo_cli.train import measure_throughput, open_shards, train, validation_perplexity


def main(argv: list[str] | None = None) -> None:
    parser = probe_arguments(__doc__.split("\n")[0], seconds=20.0, repeats=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--trace", type=float, default=0.0, help="seconds of one traced probe per shape and dtype")
    parser.add_argument("--validation", action="store_true", help="time a validation of the held-out shards too")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds of each of the three traces of --settle (see above)")
    parser.add_argument("--idle", type=float, default=30.0, help="with --settle: seconds idle before trace (c)")
    parser.add_argument("--pairs", type=int, default=0, help="rounds of adjacent 6-s reads of both shapes (see above)")
    parser.add_argument("--run", type=float, default=0.0, help="seconds of a real run between probes (see above)")
    parser.add_argument("--compiled", action="store_true",
                        help="with --trace: also trace the compiled step where rule 8 probes it (a bf16 step); "
                             "with --run: probe and train the compiled step")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    info, data, base, negatives = probe_corpus(args)
    dtypes = ("fp32", "bf16") if machine.cpu_bf16() else ("fp32",)
    command = " ".join(["python -m benchmarks.bench_probe", *argv])
    if args.trace > 0:
        return trace_probes(data, base, negatives, dtypes, args, command)
    if args.settle > 0:
        return settle_probes(data, base, negatives, args, command)
    if args.pairs > 0:
        return pair_probes(data, base, negatives, dtypes[-1], args, command)
    if args.run > 0:
        return run_between_probes(data, base, negatives, dtypes[-1], args, command)
    with Recording("probe", command, args.threads, args.label) as rec:
        cells = [(shape, dtype, rows) for shape in auto.LADDER for dtype in dtypes for rows in args.rows]
        rates: dict[tuple[str, str, int], list[float]] = {}
        validations: dict[str, list[tuple[float, float]]] = {}  # shape -> (seconds, tokens/s) of each validation
        heldout = open_shards(args.out / args.corpus / "heldout") if args.validation else None
        for repeat in range(args.repeats):
            for shape, dtype, rows in (cells if repeat % 2 == 0 else cells[::-1]):
                config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu",
                                                                                                 batch_size=rows)
                rates.setdefault((shape.name, dtype, rows), []).append(measure_throughput(config, data, args.seconds))
            for shape in (auto.LADDER if heldout is not None else ()):
                validations.setdefault(shape.name, []).append(time_validation(shape, data, heldout, base))
        rec.figures = {"corpus": args.corpus, "train_tokens": info["train_tokens"], "seconds": args.seconds,
                       "negatives": negatives, "bf16_native": "bf16" in dtypes, "torch_threads": torch.get_num_threads()}
        median = {cell: statistics.median(r) for cell, r in rates.items()}
        for (name, dtype, rows), r in rates.items():
            key = f"{name} {dtype}" + ("" if rows == 32 else f" {rows} rows")
            rec.figures[key] = {"tokens_per_s_median": round(median[(name, dtype, rows)]),
                                "tokens_per_s_min": round(min(r)), "runs": [round(x) for x in r]}
        small = auto.LADDER[0].name
        for dtype in dtypes:
            for larger in (s.name for s in auto.LADDER[1:]) if 32 in args.rows else ():
                rec.figures[f"{larger} over {small}, {dtype}"] = round(median[(larger, dtype, 32)] /
                                                                      median[(small, dtype, 32)], 2)
            for s in auto.LADDER:
                for rows in args.rows:
                    if rows != 32 and 32 in args.rows:
                        rec.figures[f"{s.name} {dtype} {rows} over 32 rows"] = round(
                            median[(s.name, dtype, rows)] / median[(s.name, dtype, 32)], 2)
        for name, runs in validations.items():
            seconds = statistics.median(t for t, _ in runs)
            rate = statistics.median(r for _, r in runs)
            rec.figures[f"{name} validation"] = {"seconds_median": round(seconds, 1), "tokens_per_s_median": round(rate),
                                                 "heldout_tokens": heldout.total_tokens,
                                                 "runs": [round(r) for _, r in runs]}
            if 32 in args.rows:
                rec.figures[f"{name} validation over fp32 training"] = round(rate / median[(name, "fp32", 32)], 2)
        if "bf16" in dtypes and 32 in args.rows:
            for s in auto.LADDER:
                rec.figures[f"{s.name} bf16 over fp32"] = round(median[(s.name, "bf16", 32)] /
                                                                median[(s.name, "fp32", 32)], 2)
        for key, value in rec.figures.items():
            print(f"{key}: {value}")


def time_validation(shape, data, heldout, base) -> tuple[float, float]:
    """(seconds, held-out tokens/s) of one validation of a fresh `shape` model, as a run makes it."""
    model = BiLM(shape.model, vocab_size=len(data.vocab))
    batch = max(base.training.batch_size, 64)  # train.validate's rows
    start = time.monotonic()
    validation_perplexity(model, heldout, batch, torch.device("cpu"))
    seconds = time.monotonic() - start
    return seconds, heldout.total_tokens / seconds


def traced(config, data, seconds: float) -> dict:
    """One probe of `config` for `seconds` on a fresh model (`measure_throughput`, as `auto` runs it): its tokens/s
    by 2-second interval, the rate a 6-s probe reports and the rate after it."""
    probe_s = auto.PROBE_SECONDS[1]
    trace: list[tuple[float, int]] = []
    measure_throughput(config, data, seconds, trace=trace, warm=probe_s)

    def rate(t0: float, t1: float) -> float | None:
        inside = [(t, n) for t, n in [(0.0, 0), *trace] if t0 <= t <= t1]
        if len(inside) < 2:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
    return {"tokens_per_s_by_2s": [None if r is None else round(r) for r in
                                   (rate(t, t + 2.0) for t in range(0, int(seconds), 2))],
            "probe_6s": round(rate(0.0, probe_s) or 0), "after_6s": round(rate(probe_s, seconds) or 0),
            "steps": len(trace)}


def settle_probes(data, base, negatives: int, args, command: str) -> None:
    """``--settle``: `auto`'s first probe traced cold (a), at once again (b) and after ``--idle`` seconds (c)."""
    if args.settle <= auto.PROBE_SECONDS[1]:
        raise SystemExit(f"--settle: more than a probe's {auto.PROBE_SECONDS[1]:g} s, so that a rate after it is read")
    config = auto._config(base, auto.LADDER[0], "fp32", negatives, args.threads).with_training(device="cpu")
    with Recording("probe", command, args.threads, args.label) as rec:
        rec.figures = {"corpus": args.corpus, "settle_seconds": args.settle, "idle_seconds": args.idle,
                       "negatives": negatives, "rows": 32, "torch_threads": args.threads, "step": "512/128 fp32",
                       "rounds": []}
        for _ in range(args.repeats):
            cold = traced(config, data, args.settle)
            again = traced(config, data, args.settle)
            time.sleep(args.idle)
            idled = traced(config, data, args.settle)
            rec.figures["rounds"].append({"a_cold": cold, "b_again": again, "c_after_idle": idled})
            for key, t in rec.figures["rounds"][-1].items():
                print(f"{key}: probe 6 s {t['probe_6s']:,}, after {t['after_6s']:,}; "
                      f"by 2 s {t['tokens_per_s_by_2s']}", flush=True)
        for key in ("a_cold", "b_again", "c_after_idle"):
            rec.figures[f"{key} probe over after (median)"] = round(statistics.median(
                r[key]["probe_6s"] / r[key]["after_6s"] for r in rec.figures["rounds"]), 3)
        for key, value in rec.figures.items():
            if key != "rounds":
                print(f"{key}: {value}")


def pair_probes(data, base, negatives: int, dtype: str, args, command: str) -> None:
    """``--pairs``: the larger shape's speed over the smaller's, from 6-s reads as rule 1 takes them and as adjacent
    pairs, against reads of ``args.seconds``."""
    small, large = auto.LADDER[0], auto.LADDER[1]
    rows = args.rows[0]
    probe_s = auto.PROBE_SECONDS[1]

    def read(shape, seconds: float) -> float:
        config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu", batch_size=rows)
        return measure_throughput(config, data, seconds)
    with Recording("probe", command, args.threads, args.label) as rec:
        rec.figures = {"corpus": args.corpus, "rows": rows, "dtype": dtype, "negatives": negatives,
                       "read_seconds": probe_s, "long_seconds": args.seconds, "torch_threads": args.threads,
                       "rounds": [], "long": []}
        for _ in range(args.pairs):
            s1, l1, s2, l2 = (read(shape, probe_s) for shape in (small, large, small, large))
            rec.figures["rounds"].append({"small": [round(s1), round(s2)], "large": [round(l1), round(l2)],
                                          "first": round(l1 / s1, 3), "bare": round(max(l1, l2) / s1, 3),
                                          "paired": round(max(l1 / s1, l2 / s2), 3),
                                          "pairs": round((l1 + l2) / (s1 + s2), 3)})
            print(rec.figures["rounds"][-1], flush=True)
        for _ in range(args.repeats):
            s, l = read(small, args.seconds), read(large, args.seconds)
            rec.figures["long"].append({"small": round(s), "large": round(l), "ratio": round(l / s, 3)})
            print(rec.figures["long"][-1], flush=True)
        truth = statistics.median(r["ratio"] for r in rec.figures["long"])
        rec.figures["long ratio (median)"] = round(truth, 3)
        for key in ("first", "bare", "paired", "pairs"):
            rec.figures[f"{key}: lowest, highest"] = [min(r[key] for r in rec.figures["rounds"]),
                                                     max(r[key] for r in rec.figures["rounds"])]
            errors = [r[key] / truth - 1 for r in rec.figures["rounds"]]
            rec.figures[f"{key} over long: median, worst"] = [round(statistics.median(errors), 3),
                                                              round(max(errors, key=abs), 3)]
            rec.figures[f"{key}: rounds at or over the share"] = sum(r[key] >= auto.MIN_PASS_SHARE
                                                                     for r in rec.figures["rounds"])
        for name in ("small", "large"):
            reads = [x for r in rec.figures["rounds"] for x in r[name]]
            rec.figures[f"{name} 6-s reads: spread (max/min)"] = round(max(reads) / min(reads), 3)
        for key, value in rec.figures.items():
            if key not in ("rounds", "long"):
                print(f"{key}: {value}")


def run_between_probes(data, base, negatives: int, dtype: str, args, command: str) -> None:
    """``--run``: probes in this process and in new ones, a real run of ``args.run`` seconds in this one, the probes
    again."""
    rows, probe_s = args.rows[0], auto.PROBE_SECONDS[1]
    config = auto._config(base, auto.LADDER[0], dtype, negatives, args.threads).with_training(
        device="cpu", batch_size=rows, compile=args.compiled)
    run_config = config.with_training(max_time=args.run, epochs=1000.0, checkpoint_minutes=0.0, checkpoint_every=0,
                                      baseline=False, log_every=10)
    train_dir = args.out / args.corpus / "train"

    def rounds() -> tuple[list[float], list[float]]:
        """``--repeats`` rounds of one read in this process and one in a new process, in alternating order."""
        here, fresh = [], []
        for r in range(args.repeats):
            for where in (("here", "fresh") if r % 2 == 0 else ("fresh", "here")):
                if where == "here":
                    here.append(measure_throughput(config, data, probe_s))
                else:
                    fresh.append(_read_in_a_new_process(config, train_dir, probe_s))
        return here, fresh

    with Recording("probe", command, args.threads, args.label) as rec:
        before, before_fresh = rounds()
        rss_before = _rss_mib()
        with tempfile.TemporaryDirectory() as tmp:
            result = train(run_config, train_dir, Path(tmp) / "run")
            records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        rss_after = _rss_mib()
        after, after_fresh = rounds()
        timed = [r for r in records if r.get("kind") == "train"][1:]  # the first record holds the first steps
        by_minute = [statistics.median(r["tokens_per_s"] for r in timed if m * 60 <= r["elapsed"] < (m + 1) * 60)
                     for m in range(int(timed[-1]["elapsed"] // 60) + 1)]
        mean = result.mean_tokens_per_s
        rec.figures = {"corpus": args.corpus, "rows": rows, "dtype": dtype, "compiled": args.compiled,
                       "negatives": negatives, "run_seconds": args.run, "torch_threads": args.threads,
                       "probes_before": [round(x) for x in before],
                       "probes_before_fresh_process": [round(x) for x in before_fresh],
                       "probes_after": [round(x) for x in after],
                       "probes_after_fresh_process": [round(x) for x in after_fresh],
                       "rss_mib_before_run": rss_before, "rss_mib_after_run": rss_after,
                       "run_tokens_per_s_by_minute": [round(x) for x in by_minute],
                       "run_tokens_per_s_mean": round(mean, 1),
                       "probes before over the run's mean": [round(x / mean, 3) for x in before],
                       "probes after over the run's mean": [round(x / mean, 3) for x in after],
                       "fresh processes' probes before, after over the run's mean": [
                           round(statistics.median(before_fresh) / mean, 3),
                           round(statistics.median(after_fresh) / mean, 3)],
                       "run's minutes: slowest, fastest over its mean": [round(min(by_minute) / mean, 3),
                                                                        round(max(by_minute) / mean, 3)]}
        for key, value in rec.figures.items():
            print(f"{key}: {value}")


def _read_in_a_new_process(config, train_dir: Path, seconds: float) -> float:
    """One probe of `config` in a new interpreter (spawned, nothing inherited but the arguments): what the same
    step reads outside the process that ran, in the same minute."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_read_here, (config, train_dir, seconds))


def _read_here(config, train_dir: Path, seconds: float) -> float:
    return measure_throughput(config, open_shards(train_dir), seconds)


def _rss_mib() -> float:
    """This process's resident memory now (Linux), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def trace_probes(data, base, negatives: int, dtypes, args, command: str) -> None:
    """``--trace``: one probe of ``args.trace`` seconds per shape and dtype, its rate by 2-second interval."""
    with Recording("probe", command, args.threads, args.label) as rec:
        rec.figures = {"corpus": args.corpus, "trace_seconds": args.trace, "negatives": negatives, "rows": 32,
                       "torch_threads": args.threads}
        steps = [(shape, dtype, compiled) for shape in auto.LADDER for dtype in dtypes
                 for compiled in ((False, True) if args.compiled and dtype in auto.COMPILE_DTYPES else (False,))]
        for shape, dtype, compiled in steps:
            config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu",
                                                                                            compile=compiled)
            key = f"{shape.name} {dtype}" + (" compiled" if compiled else "")
            rec.figures[key] = traced(config, data, args.trace)  # a compiled step warms up as auto's does
            print(f"{key}: {rec.figures[key]}", flush=True)


if __name__ == "__main__":
    main()

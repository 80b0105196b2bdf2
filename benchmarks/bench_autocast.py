"""bf16 training on a CPU or GPU: the LSTM's recurrent and projection weights cast to bf16 once a window
(`model.lstm.autocast_once`, the code as it is) against once a step (autocast's own behaviour for the loop's
transposed weights, which are not leaves and so miss its cast cache; the code before 2026-11-27), beside fp32.

    python -m benchmarks.bench_autocast [--corpus austen] [--seconds 10] [--repeats 3] [--threads 2]
                                        [--profile 4] [--label NAME]

Each (shape, variant) is measured as `--preset auto`'s probe measures (`train.measure_throughput`: a fresh model,
two warm-up steps, then training steps for SECONDS, 32 rows, 1,024 sampled negatives), REPEATS times in
alternating order; min and median kept, and the ratios within this one run. On a CPU without bf16 matrix
instructions torch emulates bf16 (slower than fp32): the figure there is the cost of the casts, not bf16's gain.
Results: benchmarks/results/autocast-DATE.json with the machine and load (autocast-NAME-DATE.json with --label,
for runs side by side on one machine: each on its own cores, e.g. under another ``ONEDNN_MAX_CPU_ISA``, which the
record names).

``--profile SECONDS`` then says where the time goes: for each shape, bf16 (cast once a window) and fp32 each train
SECONDS under torch's profiler (CPU activities), and the operators with the most own time are kept, with their
share of the profiled time and their calls; the matrix products (``aten::mm``, ``aten::addmm``, ``aten::bmm``...)
beside the casts (``aten::to``, ``aten::_to_copy``, ``aten::copy_``) answer whether bf16's products or its casts
set its pace on a CPU.
"""
from __future__ import annotations

import statistics
import sys

import torch

from benchmarks.corpora import probe_arguments, probe_corpus
from benchmarks.results import Recording
from elmo_cli import auto, machine
from elmo_cli.model import lstm
from elmo_cli.train import measure_throughput

VARIANTS = ("bf16, cast once a window", "bf16, cast every step", "fp32")
PROFILE_TOP = 14


def profile(config, data, seconds: float) -> dict:
    """`measure_throughput` of `config` for `seconds` under torch's profiler: tokens/s (with the profiler's own
    cost in it) and the `PROFILE_TOP` operators by own CPU time, ``[name, share of all own time, calls]``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        rate = measure_throughput(config, data, seconds)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:PROFILE_TOP]
    return {"tokens_per_s_profiled": round(rate), "own_seconds": round(total / 1e6, 2),
            "top": [[e.key, round(e.self_cpu_time_total / total, 4), e.count] for e in top]}


def main(argv: list[str] | None = None) -> None:
    parser = probe_arguments(__doc__.split("\n")[0], seconds=10.0, repeats=3)
    parser.add_argument("--profile", type=float, default=0.0, help="seconds of profiled training per shape and dtype")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    _, data, base, negatives = probe_corpus(args)
    once = lstm.autocast_once
    command = " ".join(["python -m benchmarks.bench_autocast", *argv])
    with Recording("autocast", command, args.threads, args.label) as rec:
        cells = [(shape, variant) for shape in auto.LADDER for variant in VARIANTS]
        rates: dict[tuple[str, str], list[float]] = {}
        for repeat in range(args.repeats):
            for shape, variant in (cells if repeat % 2 == 0 else cells[::-1]):
                dtype = "fp32" if variant == "fp32" else "bf16"
                lstm.autocast_once = once if variant != VARIANTS[1] else (lambda device_type, *weights: weights)
                try:
                    config = auto._config(base, shape, dtype, negatives, args.threads).with_training(device="cpu")
                    rates.setdefault((shape.name, variant), []).append(measure_throughput(config, data, args.seconds))
                finally:
                    lstm.autocast_once = once
        rec.figures = {"corpus": args.corpus, "seconds": args.seconds, "negatives": negatives, "rows": 32,
                       "bf16_native": bool(machine.cpu_bf16()), "torch_threads": torch.get_num_threads()}
        for (name, variant), r in rates.items():
            rec.figures[f"{name} {variant}"] = {"tokens_per_s_median": round(statistics.median(r)),
                                                "tokens_per_s_min": round(min(r)), "runs": [round(x) for x in r]}
        for shape in auto.LADDER:
            med = {v: statistics.median(rates[(shape.name, v)]) for v in VARIANTS}
            rec.figures[f"{shape.name}: once over every step"] = round(med[VARIANTS[0]] / med[VARIANTS[1]], 2)
            rec.figures[f"{shape.name}: bf16 (once) over fp32"] = round(med[VARIANTS[0]] / med["fp32"], 2)
        for shape in auto.LADDER if args.profile > 0 else ():
            for variant in (VARIANTS[0], "fp32"):
                config = auto._config(base, shape, "fp32" if variant == "fp32" else "bf16", negatives,
                                      args.threads).with_training(device="cpu")
                rec.figures[f"{shape.name} {variant} profile"] = profile(config, data, args.profile)
        for key, value in rec.figures.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()

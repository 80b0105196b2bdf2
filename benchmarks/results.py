"""What every benchmark saves beside its figures: the machine, the load, the commit, the command, the date.

    with Recording("repeat", "python -m benchmarks.bench_repeat") as rec:
        rec.figures["small"] = {...}
    # -> benchmarks/results/repeat-2026-11-26.json

The load average is read before and after; a run that starts with the 1-minute load above the threads it uses is
marked ``"under_load": true`` and says so on stderr, since other work on the cores slows every figure.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU as a figure needs it: model name, family/model and the vector units that set the speed, e.g.
    ``AMD EPYC (family 25 model 1, AVX2)`` or ``AMD EPYC (family 25 model 17, AVX-512, AVX512-BF16)``."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                    if ":" in line)
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = set(info.get("flags", "").split())
    units = [name for flag, name in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX"))
             if flag in flags] or (["AVX2"] if "avx2" in flags else [])
    where = ", ".join([f"family {info.get('cpu family', '?')} model {info.get('model', '?')}"] + units)
    return f"{info.get('model name', platform.machine())} ({where})"


def commit() -> str:
    """The checkout's short commit, with ``+changes`` when the tree differs from it."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=RESULTS_DIR.parent).stdout
        except OSError:
            return ""
    head = git("rev-parse", "--short", "HEAD").strip()
    return head + ("+changes" if head and git("status", "--porcelain", "--untracked-files=no").strip() else "")


def machine(threads: int) -> dict:
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "python": platform.python_version()}


class Recording:
    """A benchmark run's record: fill ``figures``; on exit it is written to ``results/NAME-DATE.json``."""

    def __init__(self, name: str, command: str, threads: int | None = None):
        import torch

        self.name, self.command = name, command
        self.threads = threads or torch.get_num_threads()
        self.figures: dict = {}
        self.path: Path | None = None

    def __enter__(self) -> "Recording":
        self.load_before = os.getloadavg()[0]
        self.under_load = self.load_before > self.threads
        if self.under_load:
            print(f"warning: load average {self.load_before:.2f} above the {self.threads} threads this benchmark "
                  f"uses: other work is slowing it; the result file says so", file=sys.stderr)
        self.started = time.time()
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            return
        record = {"benchmark": self.name, "command": self.command, "commit": commit(),
                  "date": time.strftime("%Y-%m-%d", time.localtime(self.started)),
                  "seconds": round(time.time() - self.started, 1), "machine": machine(self.threads),
                  "load_before": round(self.load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                  "under_load": self.under_load, "figures": self.figures}
        RESULTS_DIR.mkdir(exist_ok=True)
        self.path = RESULTS_DIR / f"{self.name}-{record['date']}.json"
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(self.path)
        print(f"results: {self.path.relative_to(RESULTS_DIR.parent.parent)}")

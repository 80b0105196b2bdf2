"""What every benchmark saves beside its figures: the machine, the load, the commit, the command, the date.

    with Recording("repeat", "python -m benchmarks.bench_repeat") as rec:
        rec.figures["small"] = {...}
    # -> benchmarks/results/repeat-2026-11-26.json

The load average is read before and after. Whether other work shares the cores is measured when the run starts: the
CPUs busy during one second while this benchmark waits (from /proc/stat; the 1-minute load average still carries the
previous benchmark's own work). A run that starts with more than half a core busy elsewhere is marked
``"under_load": true`` and says so on stderr, since other work on the cores slows every figure.
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
    """The checkout's short commit, with ``+changes`` when the tree differs from it; ``$ELMO_BENCH_COMMIT`` where
    it is set (a copy of the tree on another machine, whose .git, if any, need not match the tree: on one GPU
    machine the copy's git named an older commit, with changes)."""
    if os.environ.get("ELMO_BENCH_COMMIT"):
        return os.environ["ELMO_BENCH_COMMIT"]
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=RESULTS_DIR.parent).stdout
        except OSError:
            return ""
    head = git("rev-parse", "--short", "HEAD").strip()
    return head + ("+changes" if head and git("status", "--porcelain", "--untracked-files=no").strip() else "")


def busy_cpus(seconds: float = 1.0) -> float | None:
    """How many CPUs other processes keep busy, measured over `seconds` while this one sleeps (None off Linux)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(total1 - total0, 1))


def own_peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM of /proc/self/status, the high-water mark of this program's
    own address space. Not ru_maxrss: Linux carries that over from the parent through fork and exec, so a child of
    a large benchmark process reports at least the parent's size (measured: an empty `python -c pass` started by a
    600 MB parent reports 613 MB)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


PEAK_FILE = "ELMO_BENCH_PEAK_FILE"
# Runs ``python -c CODE ARGS`` or ``python -m MODULE ARGS`` given after it, and writes the run's own VmHWM (kB) to
# the file named by $ELMO_BENCH_PEAK_FILE when the interpreter exits.
_MEASURE = """
import atexit, os, runpy, sys
def _peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(os.environ["ELMO_BENCH_PEAK_FILE"], "w").write(line.split()[1])
atexit.register(_peak)
flag, what, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
if flag == "-c":
    sys.argv[0] = "-c"
    exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
else:
    runpy.run_module(what, run_name="__main__", alter_sys=True)
"""


def run_measured(args: list[str], cwd: Path | None = None, env: dict | None = None) -> tuple[str, float, float]:
    """``python ARGS`` (``["-c", CODE, ...]`` or ``["-m", MODULE, ...]``) in a fresh process: its stdout, wall seconds
    and its own peak RSS in MB (VmHWM, see `own_peak_rss_mb`). RuntimeError with its stderr if it fails."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        peak_file = Path(d) / "peak"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, cwd=cwd,
                              env={**(env if env is not None else os.environ), PEAK_FILE: str(peak_file)})
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"python {' '.join(args[:2])[:80]} failed: {proc.stderr[-2000:]}")
        peak = int(peak_file.read_text()) / 1024 if peak_file.is_file() else float("nan")
    return proc.stdout, wall, peak


def child_figures(module: str, args: list[str], threads: int, root: Path) -> dict:
    """``python -m MODULE --child ARGS`` in a fresh process with `threads` OpenMP threads: the JSON object on the
    last line of its stdout (the side of a side-by-side benchmark measured in a process of its own)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", module, "--child", *args], capture_output=True, text=True, env=env,
                       cwd=root)
    if r.returncode != 0:
        raise RuntimeError(f"{module} {args[0]} child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def machine(threads: int) -> dict:
    import torch

    facts = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": threads, "torch": torch.__version__,
             "python": platform.python_version()}
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < (os.cpu_count() or 1):
        facts["cpus_allowed"] = sorted(os.sched_getaffinity(0))  # pinned (taskset) to these
    facts.update(isa_caps())
    if torch.cuda.is_available():
        facts.update(gpu=torch.cuda.get_device_name(), gpus=torch.cuda.device_count(), cuda=torch.version.cuda,
                     driver=gpu_driver())
    return facts


# The variables that hold a library to an instruction set below the CPU's own: ATen's vectorised kernels and
# Inductor's generated C++ (ATEN_CPU_CAPABILITY), MKL's matrix products, oneDNN's (bf16) products. All three at
# AVX2 run an AVX-512 CPU as an AVX2-only one would be run.
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def isa_caps() -> dict[str, str]:
    """``{"onednn_max_cpu_isa": "AVX2", ...}``: each of `ISA_CAPS` set in this process's environment, lower-cased."""
    return {name.lower(): os.environ[name] for name in ISA_CAPS if os.environ.get(name)}


def gpu_driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (None where it cannot be run)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


class Recording:
    """A benchmark run's record: fill ``figures``; on exit it is written to ``results/NAME-DATE.json``."""

    def __init__(self, name: str, command: str, threads: int | None = None, label: str | None = None):
        import torch

        # ``label``: results/NAME-LABEL-DATE.json, for runs of one benchmark side by side (each its own file)
        self.name, self.command = name + (f"-{label}" if label else ""), command
        self.threads = threads or torch.get_num_threads()
        self.figures: dict = {}
        self.path: Path | None = None

    def __enter__(self) -> "Recording":
        self.load_before = os.getloadavg()[0]
        self.busy_before = busy_cpus()
        self.under_load = self.busy_before is not None and self.busy_before > 0.5
        if self.under_load:
            print(f"warning: {self.busy_before:.1f} CPUs busy with other work as this benchmark starts: it slows "
                  f"every figure; the result file says so", file=sys.stderr)
        self.started = time.time()
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.save()

    def save(self) -> None:
        """Write the record as it stands (on exit; a long benchmark may also save after each part, so that a run
        cut short keeps what it measured)."""
        record = {"benchmark": self.name, "command": self.command, "commit": commit(),
                  "date": time.strftime("%Y-%m-%d", time.localtime(self.started)),
                  "seconds": round(time.time() - self.started, 1), "machine": machine(self.threads),
                  "load_before": round(self.load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                  "busy_cpus_before": None if self.busy_before is None else round(self.busy_before, 2),
                  "under_load": self.under_load, "figures": self.figures}
        RESULTS_DIR.mkdir(exist_ok=True)
        self.path = RESULTS_DIR / f"{self.name}-{record['date']}.json"
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(self.path)
        print(f"results: {self.path.relative_to(RESULTS_DIR.parent.parent)}", flush=True)

"""How long the `make` targets take: `make install`, `make test`, `make demo`, `make demo-task`, `make bench`,
`make bench-quality`, each timed as a user runs it.

    python -m benchmarks.bench_targets [TARGET ...] [--here]

By default the targets run, in the order given (default: install test demo demo-task bench), in a fresh clone of
this checkout's HEAD in a temporary directory, so `make install` is a real first install (the CPU build of torch and
the dependencies, fetched as the Makefile fetches them) and every later target finds only what the earlier ones
made (`make demo-task` the demo's biLM). `--here` runs them in this checkout instead (with its `.venv/`: install then
costs nothing). For each target: wall seconds and the CPU seconds of its processes (user + system, from
`resource.getrusage(RUSAGE_CHILDREN)`). `make bench-quality` takes hours; it runs only when named.

Results: benchmarks/results/targets-DATE.json (`benchmarks.results.Recording`), with the machine and the load, and
each target's last lines of output. A failing target stops the run there.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results import Recording

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("install", "test", "demo", "demo-task", "bench")


def run_target(target: str, where: Path) -> dict:
    """`make TARGET` in `where`: wall and CPU seconds, exit status and the last lines of its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(["make", target], cwd=where, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = (done.stdout + done.stderr).splitlines()[-5:]
    print(f"make {target}: {wall:.0f} s wall ({wall / 60:.1f} min), {cpu:.0f} CPU s, exit {done.returncode}",
          flush=True)
    return {"seconds": round(wall, 1), "minutes": round(wall / 60, 1), "cpu_seconds": round(cpu, 1),
            "exit_code": done.returncode, "last_lines": tail}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("targets", nargs="*", default=list(DEFAULT))
    parser.add_argument("--here", action="store_true", help="run in this checkout instead of a fresh clone")
    parser.add_argument("--label", default=None, help="results file targets-LABEL-DATE.json (runs side by side)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    command = " ".join(["python -m benchmarks.bench_targets", *argv])
    with tempfile.TemporaryDirectory(prefix="bench-targets-") as tmp, \
            Recording("targets", command, label=args.label) as rec:
        where = ROOT
        if not args.here:
            where = Path(tmp) / "clone"
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(where)], check=True)
            # the record names the commit cloned, not this checkout's HEAD when the targets end
            os.environ["ELMO_BENCH_COMMIT"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where,
                                                             capture_output=True, text=True).stdout.strip()
        rec.figures = {"where": "this checkout" if args.here else "a fresh clone of HEAD"}
        for target in args.targets:
            rec.figures[target] = run_target(target, where)
            if rec.figures[target]["exit_code"] != 0:
                print(f"make {target} failed; the targets after it are not run", file=sys.stderr)
                break


if __name__ == "__main__":
    main()

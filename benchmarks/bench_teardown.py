"""How often a torchrun job's processes fail at exit after their work is done, by how a run leaves gloo's process
group: each trial is two fresh processes (gloo on the CPU, a world of two, joined as torchrun joins them) that train
a tiny biLM for three steps, then exit; a trial fails when either exit status is not 0 (SIGABRT: "terminate called
without an active exception" in gloo's threads). The modes alternate trial by trial:

- ``left``: `elmo_cli.train.train` as it ships: the run leaves the group when it returns
  (`distributed.leaves_process_group`: the trainer collected, a barrier, the group destroyed);
- ``never-left``: the same run without that (``train.__wrapped__``): the process exits with the group up, as
  `train` did before 2026-12-06;
- ``destroyed-model-alive``: three steps of the same trainer (`_Trainer.bare`), then the group destroyed while the
  trainer and its DistributedDataParallel model are alive (a test's fixture did this before 2026-12-06).

The processes meet through torchrun's TCP store (``--store tcp``, the default) or, as that test's
`torch.multiprocessing.spawn` fixture meets, through a file (``--store file``).

    python -m benchmarks.bench_teardown [--trials 60] [--modes left never-left destroyed-model-alive] [--store file]
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results import Recording
from vocab.shards import write_shards
from vocab.vocabulary import build_vocab

MODES = ("left", "never-left", "destroyed-model-alive")
CORPUS = Path(__file__).resolve().parent.parent / "examples" / "austen_train.txt"

# One process of a trial: argv = mode, rank, port, shards, output directory, store.
CHILD = """
import os, sys
from pathlib import Path
mode, rank, port, store = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[6]
data, out = Path(sys.argv[4]), Path(sys.argv[5])
os.environ.update(RANK=rank, LOCAL_RANK=rank, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
import torch
import torch.distributed as dist
if store == "file":  # every join (elmo_cli.distributed's too) meets through a file instead
    join = dist.init_process_group
    dist.init_process_group = lambda backend: join(backend, init_method=f"file://{out}/store", rank=int(rank),
                                                   world_size=2)
from elmo_cli.presets import build_config
from elmo_cli.train import train, _Trainer
from elmo_cli.distributed import Dist
from vocab.shards import ShardDataset
config = build_config({"lstm": {"dim": 32, "projection_dim": 16, "n_layers": 2, "cell_clip": 3, "proj_clip": 3},
                       "char_cnn": {"filters": [[1, 8], [2, 8]], "n_highway": 1, "embedding": {"dim": 4}},
                       "training": {"batch_size": 4, "unroll_steps": 8, "n_negative_samples": 16, "threads": 1,
                                    "device": "cpu", "max_steps": 3, "dropout": 0.3, "checkpoint_every": 0,
                                    "checkpoint_minutes": 0}}, "tiny")
if mode == "left":
    train(config, data, out / "run")
elif mode == "never-left":
    train.__wrapped__(config, data, out / "run")
else:
    dist.init_process_group("gloo")
    trainer = _Trainer.bare(config, ShardDataset(data), Dist(int(rank), 2, int(rank)))
    trainer.state.total_steps = 3
    for _ in range(3):
        trainer.step()
    dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(mode: str, data: Path, out: Path, store: str) -> tuple[int, int]:
    """Both processes' exit statuses (negative: the signal that ended it)."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, mode, str(rank), port, str(data), str(out), store],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    codes = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        codes.append(p.returncode)
        if p.returncode not in (0, -6):  # anything but the abort measured here is the benchmark's own failure
            raise RuntimeError(f"{mode}: a process exited with {p.returncode}:\n{err[-2000:]}")
    return codes[0], codes[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=60, help="trials per mode (default 60)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--store", choices=("tcp", "file"), default="tcp",
                        help="how the processes meet: torchrun's TCP store (default) or a file")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.bench_teardown" + (f" --trials {args.trials}" if args.trials != 60 else "") + (
        f" --modes {' '.join(args.modes)}" if args.modes != list(MODES) else "") + (
        " --store file" if args.store == "file" else "")
    label = "file" if args.store == "file" else None
    with tempfile.TemporaryDirectory() as d, Recording("teardown", command, threads=1, label=label) as rec:
        tmp = Path(d)
        lines = CORPUS.read_text(encoding="utf-8").splitlines()[:2000]
        (tmp / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        build_vocab([tmp / "train.txt"], tmp / "vocab.txt")
        write_shards([tmp / "train.txt"], tmp / "vocab.txt", tmp / "shards", seed=0)
        failed = {m: 0 for m in args.modes}
        statuses: dict[str, list[list[int]]] = {m: [] for m in args.modes}
        start = time.monotonic()
        for k in range(args.trials):
            for mode in args.modes:
                out = tmp / f"{mode}-{k}"
                out.mkdir()
                codes = trial(mode, tmp / "shards", out, args.store)
                failed[mode] += codes != (0, 0)
                if codes != (0, 0):
                    statuses[mode].append(list(codes))
            print(f"trial {k + 1}/{args.trials} ({time.monotonic() - start:.0f} s): failed " +
                  ", ".join(f"{m} {failed[m]}" for m in args.modes), flush=True)
        rec.figures = {"store": args.store, "trials_per_mode": args.trials, "processes_per_trial": 2, "steps": 3,
                       "failed_trials": failed, "failed_exit_statuses": statuses}


if __name__ == "__main__":
    main()

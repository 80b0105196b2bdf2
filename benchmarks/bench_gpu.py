"""On a CUDA GPU: allennlp's reference reproduced there, training tokens/s and dump tokens/s, fp32 beside bf16.

1. Reference: `Embedder(device="cuda")` on the allennlp reference model and sentences (tests/data/reference), the
   largest difference from allennlp's vectors for fp32 and for ``compute_dtype="bf16"`` (the CPU figure for fp32,
   measured in this run on the same host, beside them).
2. Training: `small` and `original` (bilm-tf's shape, batch 128, 8192 negatives) on shards of
   examples/austen_train.txt, ``--dtype fp32`` and ``bf16``, tokens/s over the steps after a warm-up interval (the
   metrics.jsonl interval, as `bench_train`).
3. Dump: `dump_embeddings` of examples/austen_heldout.txt (864 lines, 21,064 tokens) with random weights in the
   `original` shape, fp32 and bf16, tokens/s; the same input on the host's CPU in fp32 in this run for the ratio.
4. `--preset auto` on the GPU: the line `--preset auto --max-time 15m` prints on these shards, its own probes and
   choice (docs/auto.md, "On a GPU"); then the probe `auto` runs (`train.measure_throughput`, 3 s after two
   warm-up steps) for each shape of `auto.LADDER` at each rung of `auto.ROWS_LADDER` (32 to 1,024 rows), fp32 and
   bf16, with each doubling's gain beside the `auto.ROWS_GAIN` that `auto` asks of it.

5. Steps: tokens/s of `laptop`, `small` and `original` at 32, 128 and 512 rows, fp32 and bf16,
   the eager step beside the CUDA-graph step (`--no-cuda-graphs` / the default), each as `--preset auto`'s probe
   measures (`train.measure_throughput`, 3 s after two warm-up steps), with MFU: tokens/s x the nominal training
   FLOPs per token (`bench_train.flops_per_token`) over the GPU's dense peak (`PEAKS`: bf16 tensor cores for bf16;
   plain fp32, since torch leaves TF32 off, for fp32).
6. Profile: where a default step's time goes (`step_profile`: wall and GPU-busy ms, kernels, the host's waits
   and the lines that make them), beside the step that reads its results as it goes.
7. DDP on one GPU (`ddp_rates`): a torchrun process's step (DistributedDataParallel over NCCL, a world of one)
   beside the single-GPU default, and beside the torchrun step before 2026-12-05 (no CUDA graphs, the softmax's
   gradient dense); what several GPUs cost cannot be measured on one.
8. The dump at scale: `original` with `--layers average --dtype float16` on examples/austen_heldout.txt eight times
   over (168,512 tokens) at 64 and 512 rows a batch, beside the same sentences through `Embedder` without HDF5
   (what the writer and the host cost), and a host profile of the 512-row dump (cProfile: the functions with the
   most own time).

Prints "no CUDA device" and returns where torch sees none (`make bench` on a CPU machine). Where there is one, the
figures go to benchmarks/results/gpu-DATE.json with the GPU's name, driver, CUDA version, the torch build and the
host's load. `--parts` runs some of them, in the order given; by default all, in the order steps, profile, ddp,
dump-scale, dump, reference, auto, train (the GPU targets of docs/gpu.md first). `--budget SECONDS` leaves out the parts and rows not started by then, so
that a run on a GPU machine held for a fixed time ends, and saves what it measured, within it
(benchmarks/gpu_check.sh).

    python -m benchmarks.bench_gpu [--parts steps dump-scale] [--budget 300]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import math
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from benchmarks.bench_embed import max_diff
from benchmarks.bench_train import flops_per_token, run_preset
from benchmarks.results import Recording
from elmo_cli import auto
from elmo_cli.bilm_format import save_model_dir
from elmo_cli.distributed import Dist
from elmo_cli.dump import dump_embeddings
from elmo_cli.embed import Embedder
from elmo_cli.loading import load_model
from elmo_cli.model.bilm import BiLM
from elmo_cli.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "data" / "reference"
CORPUS = ROOT / "examples" / "austen_train.txt"
HELDOUT = ROOT / "examples" / "austen_heldout.txt"


def reference_difference(device: str, compute_dtype: str) -> float:
    """Largest |difference| from allennlp's reference vectors, every sentence, layer and feature."""
    sentences = [l.split() for l in (REFERENCE / "sentences.txt").read_text("utf-8").splitlines()]
    emb = Embedder(options_file=REFERENCE / "options.json", weight_file=REFERENCE / "weights.hdf5", device=device,
                   compute_dtype=compute_dtype)
    got = emb.embed_sentences(sentences)
    with h5py.File(REFERENCE / "expected_all.hdf5") as f:
        want = [f[str(i)][...] for i in range(len(sentences))]
    return max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in zip(got, want))


def dump_rate(model_dir: Path, text: Path, out: Path, device: str, compute_dtype: str) -> tuple[float, int]:
    """(tokens/s, tokens) of one `dump_embeddings` of `text`, after a 64-line warm-up."""
    loaded = load_model(model_dir, device=device)
    warm = out.with_suffix(".warm.txt")
    warm.write_text("".join(text.read_text("utf-8").splitlines(keepends=True)[:64]), encoding="utf-8")
    dump_embeddings(loaded, warm, out, force=True, compute_dtype=compute_dtype)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    result = dump_embeddings(loaded, text, out, force=True, compute_dtype=compute_dtype)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize()
    return result.tokens / (time.perf_counter() - t), result.tokens


def auto_batch_rates(shards: Path, device: str = "cuda", rows=None, seconds: float = 5.0,
                     deadline: float = math.inf) -> list[dict]:
    """Training tokens/s of each `auto.LADDER` shape by batch rows (`auto.ROWS_LADDER`) and dtype, as
    `--preset auto` probes them; 0 where the step did not fit in the GPU's memory. Those not started by
    `deadline` (time.monotonic) are left out."""
    from elmo_cli.train import open_shards

    data = open_shards(shards)
    base = auto._base()
    negatives = min(base.training.n_negative_samples, len(data.vocab))
    out = []
    for shape in auto.LADDER:
        for dtype in ("fp32", "bf16"):
            for batch in rows or auto.ROWS_LADDER:
                if time.monotonic() > deadline:
                    return out
                config = auto._config(base, shape, dtype, negatives, torch.get_num_threads())
                config = config.with_training(batch_size=batch, device=device)
                out.append(dict(shape=shape.name, dtype=dtype, batch=batch, tokens_per_s=auto.probe_rate(config, data, seconds)))
    return out


def auto_choice(shards: Path, minutes: float = 15.0) -> dict:
    """The line `train --preset auto --max-time MINUTES` prints on `shards` on the GPU, with its probes."""
    _, choice = auto.auto_config(shards, None, None, {"max_time": 60.0 * minutes, "device": "cuda"})
    return {"minutes": minutes, "line": choice.reason, "probe_seconds": round(choice.probe_seconds, 1),
            "probes": [dict(shape=p.shape, dtype=p.dtype, rows=p.rows, tokens_per_s=round(p.tokens_per_s))
                       for p in choice.probes]}


# Dense peak rates (FLOP/s) by GPU model, from NVIDIA's datasheets (H100 and H200 Tensor Core GPU datasheets, 2023-24:
# the sparsity figures halved): (bf16 tensor cores, fp32 without tensor cores).
PEAKS = {"H100 PCIe": (756e12, 51e12), "H100 NVL": (835e12, 60e12), "H100": (989e12, 67e12), "H200": (989e12, 67e12)}
# In the order a run takes them: the step table and the dump at scale (what `against_targets` reads) first.
PARTS = ("steps", "profile", "ddp", "dump-scale", "dump", "reference", "auto", "train")
# Seconds a part needs at least, so that none starts that would run far past --budget (the step table and the
# shape-by-rows rates stop at the budget themselves; `auto`'s 15-minute choice took 20 s of probes on an H200).
PART_SECONDS = {"profile": 40, "ddp": 40, "dump-scale": 40, "dump": 45, "reference": 15, "auto": 60, "train": 90}


def peak_rates(name: str) -> tuple[float, float] | None:
    """(bf16, fp32) dense FLOP/s of the GPU called `name`, None for a model not in `PEAKS`."""
    return next((rates for key, rates in PEAKS.items() if key in name), None)


# The training steps a row of the step table times: (CUDA graphs, fused cells, the LSTM's gradient by hand, the
# step queued: `train._TrainState.queue_step`). "queued" is the default on a GPU; "fused+graphs" the default of
# 2026-12-04 (reading its results as it went); "graphs" and "eager" the steps before the fused loop (autograd over
# the LSTM's loop, as on 2026-11-27), "fused" the fused loop without graphs (`--no-cuda-graphs`, as under torchrun).
STEPS = {"eager": (False, False, False, False), "graphs": (True, False, False, False),
         "fused": (False, True, True, False), "fused+graphs": (True, True, True, False),
         "queued": (True, True, True, True)}


@contextlib.contextmanager
def queued_step(on: bool):
    """With `on` False, a GPU training step reads its results as it goes (the step before `queue_step`)."""
    from elmo_cli.train import _TrainState

    plain = _TrainState.queue_step
    if not on:
        _TrainState.queue_step = lambda self, _on: plain(self, False)
    try:
        yield
    finally:
        _TrainState.queue_step = plain


@contextlib.contextmanager
def lstm_gradient(by_hand: bool):
    """With `by_hand` False, a GPU training step's LSTM runs autograd over its loop (the step before
    `lstm.ClippedLSTMFunction` ran on GPUs) instead of the hand-written loop."""
    from elmo_cli.model.lstm import ProjectedLSTMLayer

    plain = ProjectedLSTMLayer.by_hand
    if not by_hand:
        ProjectedLSTMLayer.by_hand = lambda self, x, mask: plain(self, x, mask) and x.device.type == "cpu"
    try:
        yield
    finally:
        ProjectedLSTMLayer.by_hand = plain


def step_rate(shards: Path, preset: str, dtype: str, batch: int, step: str, seconds: float = 3.0) -> dict:
    """One row of the step table: training tokens/s of `preset` at `batch` rows in `dtype` with the `STEPS` step
    (as `--preset auto`'s probe measures: `train.measure_throughput`), with MFU where the GPU's peak is known."""
    from elmo_cli.presets import load_config
    from elmo_cli.train import measure_throughput, open_shards

    data = open_shards(shards)
    graphs, fused, by_hand, queued = STEPS[step]
    cfg = load_config(None, preset).with_training(batch_size=batch, device="cuda", dtype=dtype, cuda_graphs=graphs,
                                                  fuse_lstm=fused)
    notes: list[str] = []
    try:
        with lstm_gradient(by_hand), queued_step(queued):
            rate = measure_throughput(cfg, data, seconds, notes)
    except torch.OutOfMemoryError:
        rate = None
    gc.collect()  # the trainer and its captured graphs, before the next configuration's
    torch.cuda.empty_cache()
    flops = flops_per_token(cfg.model, cfg.training.n_negative_samples, len(data.vocab))
    row = dict(preset=preset, dtype=dtype, batch=batch, step=step, tokens_per_s=None if rate is None else round(rate),
               flops_per_token=round(flops))
    peaks = peak_rates(torch.cuda.get_device_name())
    if peaks is not None and rate is not None:
        row["mfu"] = round(rate * flops / peaks[0 if dtype == "bf16" else 1], 4)
    if graphs and not any("run as captured graphs" in n for n in notes):
        row["graphs_not_used"] = notes  # the fallback's note: this row is the eager step
    if fused and any("fused LSTM cells" in n for n in notes):
        row["fused_not_used"] = notes
    print(f"  {preset:8s} {dtype} {batch:4d} rows {step:12s}: "
          + ("out of memory" if rate is None else f"{rate:10,.0f} tokens/s"
             + (f"  MFU {row['mfu']:.1%}" if "mfu" in row else ""))
          + (f"  (notes: {notes})" if "graphs_not_used" in row or "fused_not_used" in row else ""), flush=True)
    return row


def step_table(shards: Path, presets=("laptop", "small", "original"), rows=(32, 128, 512), seconds: float = 3.0,
               out: list | None = None, deadline: float = math.inf, steps=("fused+graphs", "queued"),
               only=None) -> list[dict]:
    """Training tokens/s (and MFU where the GPU's peak is known) by preset, rows, dtype and step (`STEPS`),
    appended to `out` as measured; configurations not started by `deadline` (time.monotonic) are left out.
    `only`: a set of ``(preset, dtype, rows)`` outside which the steps other than the last are not timed."""
    out = [] if out is None else out
    for preset in presets:
        for dtype in ("fp32", "bf16"):
            for batch in rows:
                for step in steps:
                    if only is not None and step != steps[-1] and (preset, dtype, batch) not in only:
                        continue
                    if time.monotonic() > deadline:
                        return out
                    out.append(step_rate(shards, preset, dtype, batch, step, seconds))
    return out


def sync_sites(trainer, steps: int = 3) -> dict[str, float]:
    """Where a trainer's steps make the host wait for the GPU: torch's sync debug mode over `steps` steps, each
    synchronizing call counted by the file and line that made it (per step)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                trainer.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites: dict[str, float] = {}
    for w in caught:
        if "synchroniz" in str(w.message):
            where = f"{Path(w.filename).name}:{w.lineno}"
            sites[where] = sites.get(where, 0) + 1 / steps
    return {k: round(v, 2) for k, v in sorted(sites.items(), key=lambda kv: -kv[1])}


def step_profile(shards: Path, preset: str = "original", dtype: str = "bf16", batch: int = 128,
                 steps: int = 5, queued: bool = True) -> dict:
    """Where a default GPU step's time goes (torch.profiler over `steps` steps after warm-up): the wall time per
    step, the GPU's busy time per step (the union of its kernels' intervals), the kernels launched per step, the
    host's waits for the GPU per step (synchronizations and blocking copies: their count and time) and the CUDA
    time of the most costly kernels. `queued` False: the step that reads its results as it goes."""
    from elmo_cli.presets import load_config
    from elmo_cli.train import _Trainer, _training_process, open_shards
    from torch.profiler import ProfilerActivity, profile

    data = open_shards(shards)
    cfg = load_config(None, preset).with_training(batch_size=batch, device="cuda", dtype=dtype)
    with _training_process(cfg.training.threads), queued_step(queued):
        trainer = _Trainer.bare(cfg, data)
        trainer.state.total_steps = 1_000_000
        for _ in range(4):
            trainer.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):  # the profiler's own start-up
            torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            for _ in range(steps):
                trainer.step()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) / steps
        sites = sync_sites(trainer)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    host = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    waits = [e for e in host if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
             or (e.name.startswith("cudaMemcpy") and not e.name.startswith("cudaMemcpyAsync"))]
    wait_us = sum(e.time_range.end - e.time_range.start for e in waits)
    copy_us = sum(e.time_range.end - e.time_range.start for e in host if e.name.startswith("cudaMemcpyAsync"))
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, end = 0.0, -math.inf
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    by_name: dict[str, list] = {}
    for e in kernels:
        acc = by_name.setdefault(e.name[:90], [0.0, 0])
        acc[0] += e.time_range.end - e.time_range.start
        acc[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]
    host_ops = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:12]
    del trainer
    gc.collect()
    torch.cuda.empty_cache()
    return {"preset": preset, "dtype": dtype, "batch": batch, "wall_ms_per_step": round(wall * 1e3, 2),
            "sync_sites_per_step": sites,
            "gpu_busy_ms_per_step": round(busy / 1e3 / steps, 2), "kernels_per_step": round(len(kernels) / steps),
            "host_waits_per_step": round(len(waits) / steps, 1),
            "host_wait_ms_per_step": round(wait_us / 1e3 / steps, 2),
            "host_copy_call_ms_per_step": round(copy_us / 1e3 / steps, 2), "queued": queued,
            "top_host_ops_self_ms_per_step": [[a.key[:60], round(a.self_cpu_time_total / 1e3 / steps, 3),
                                               a.count // steps] for a in host_ops],
            "top_kernels_ms_per_step": [[n, round(t / 1e3 / steps, 3), c // steps] for n, (t, c) in top]}


class OneProcessJob(Dist):
    """A torchrun job of one process (a process group of one already joined), wrapped and gathered as a process of
    a larger job would be."""

    @property
    def enabled(self) -> bool:
        return True


def ddp_rates(shards: Path, preset: str = "original", dtype: str = "bf16", batch: int = 128,
              seconds: float = 3.0) -> dict:
    """What a torchrun process's step costs on one GPU: training tokens/s of one process wrapped in
    DistributedDataParallel (NCCL, a world of one: its bucketed all-reduce hooks fire as the backward pass makes
    each bucket's gradients, each all-reduce a copy; the sparse softmax's rows all-gathered, a copy too) as torchrun
    now runs it (CUDA graphs, the sparse softmax), beside the default single-GPU step and beside the torchrun step
    before 2026-12-05 (no graphs, the softmax's gradient dense and all-reduced by DDP). What it cannot measure: the
    collectives' time across GPUs (NCCL over NVLink or a network) and their overlap with the backward pass there."""
    import torch.distributed as dist
    from elmo_cli.presets import load_config
    from elmo_cli.train import _Trainer, _training_process, open_shards

    data = open_shards(shards)
    base = load_config(None, preset).with_training(batch_size=batch, device="cuda", dtype=dtype)
    before = base.with_training(cuda_graphs=False, sparse_softmax=False)
    out = {"preset": preset, "dtype": dtype, "batch": batch}
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for key, cfg, wrapped in (("single_gpu_default", base, False), ("ddp_one_process", base, True),
                                  ("ddp_before", before, True)):
            with _training_process(cfg.training.threads):
                trainer = _Trainer.bare(cfg, data, OneProcessJob() if wrapped else Dist())
                assert isinstance(trainer.state.wrapped, torch.nn.parallel.DistributedDataParallel) == wrapped
                trainer.state.total_steps = 1_000_000
                for _ in range(3):
                    trainer.step()
                torch.cuda.synchronize()
                tokens, steps, start = 0, 0, time.monotonic()
                while steps < 5 or time.monotonic() - start < seconds:
                    tokens += trainer.step()[3]
                    steps += 1
                torch.cuda.synchronize()
                out[key + "_tokens_per_s"] = round(tokens / (time.monotonic() - start))
                if trainer.state.stacks is not None:
                    out[key + "_graphs"] = trainer.state.stacks.graphed is not None
            del trainer
            gc.collect()
            torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    out["ddp_over_single"] = round(out["ddp_one_process_tokens_per_s"] / out["single_gpu_default_tokens_per_s"], 3)
    out["ddp_over_before"] = round(out["ddp_one_process_tokens_per_s"] / out["ddp_before_tokens_per_s"], 3)
    return out


def against_targets(figures: dict) -> list[str]:
    """The GPU targets (docs/gpu.md, "Speed on an H200") beside what this run measured (the best step)."""
    def rate(preset: str, batch: int) -> str:
        got = [r["tokens_per_s"] for r in figures.get("steps", []) if (r["preset"], r["batch"]) == (preset, batch)
               and r["tokens_per_s"] is not None]
        return f"{max(got):,} tokens/s (best of eager/graphs, fp32/bf16)" if got else "not measured"
    scale = figures.get("dump_original_scale", {})
    dump = max((v for k, v in scale.items() if k.startswith("dump_average")), default=None)
    return [f"original, 128 rows: {rate('original', 128)}; target >= 150,000",
            f"laptop, 32 rows: {rate('laptop', 32)}; target >= 30,000",
            f"dump original --layers average --dtype float16: "
            + (f"{dump:,} tokens/s" if dump else "not measured") + "; target >= 100,000"]


def host_profile(run, top: int = 12) -> list[list]:
    """Where the host's time goes in `run()` (cProfile; the GPU's work shows as time in the calls that wait for
    it): the `top` functions by their own time, ``[function, own seconds, calls]``, and the total as the first."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    run()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(((f"{Path(file).name}:{line}({name})", tt, calls) for (file, line, name), (_, calls, tt, _, _)
                   in stats.stats.items()), key=lambda r: -r[1])
    return [["total", round(stats.total_tt, 3), 0]] + [[n, round(t, 3), c] for n, t, c in rows[:top]]


def dump_scale(model_dir: Path, text: Path, work: Path) -> dict:
    """The dump at scale on the GPU: `--layers average --dtype float16` at 64 and 512 rows, and the embedding alone.
    Each timed dump writes a new file, as a user's does: the one before it is removed first. Until 2026-12-05 each
    replaced it, and the rename that frees a replaced file's blocks was counted as the dump's (the 2026-12-04
    profile: ``posix.replace`` 0.11 s of 1.83 s; renaming a new 345 MB file over another took 57-64 ms on an ext4
    disk, onto a free name 0.1 ms)."""
    lines = text.read_text("utf-8").splitlines() * 8
    big = work / "big.txt"
    big.write_text("\n".join(lines) + "\n", encoding="utf-8")
    loaded = load_model(model_dir, device="cuda")
    out = {"tokens": sum(len(l.split()) for l in lines)}
    for batch in (64, 512):
        dump_embeddings(loaded, text, work / "warm.hdf5", layers="average", dtype="float16", batch_size=batch,
                        force=True)
        torch.cuda.synchronize()
        (work / "big.hdf5").unlink(missing_ok=True)
        t = time.perf_counter()
        result = dump_embeddings(loaded, big, work / "big.hdf5", layers="average", dtype="float16",
                                 batch_size=batch, force=True)
        torch.cuda.synchronize()
        out[f"dump_average_float16_batch{batch}_tokens_per_s"] = round(result.tokens / (time.perf_counter() - t))
    (work / "big.hdf5").unlink()
    out["profile_dump_batch512"] = host_profile(lambda: dump_embeddings(
        loaded, big, work / "big.hdf5", layers="average", dtype="float16", batch_size=512, force=True))
    emb = Embedder(model_dir=model_dir, device="cuda")
    sentences = [l.split() for l in lines]
    emb.embed_sentences(sentences[:512])
    torch.cuda.synchronize()
    t = time.perf_counter()
    emb.embed_sentences(sentences)
    torch.cuda.synchronize()
    out["embed_sentences_all_layers_tokens_per_s"] = round(out["tokens"] / (time.perf_counter() - t))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=["fused+graphs", "queued"],
                        help="the steps of the step table (the last timed everywhere, the others where --compare)")
    parser.add_argument("--compare", nargs="*", default=["original:bf16:128", "original:fp32:128", "laptop:fp32:32"],
                        help="PRESET:DTYPE:ROWS where every step of --steps is timed")
    parser.add_argument("--presets", nargs="+", default=["laptop", "small", "original"])
    parser.add_argument("--rows", nargs="+", type=int, default=[32, 128, 512])
    parser.add_argument("--label", default=None, help="results/gpu-LABEL-DATE.json (beside a run of the same day)")
    parser.add_argument("--budget", type=float, default=math.inf,
                        help="seconds: parts and rows not started by then are left out (and listed as skipped)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: bench_gpu skipped")
        return
    from vocab.shards import write_shards
    from vocab.vocabulary import build_vocab

    deadline = time.monotonic() + args.budget
    only = {(p, d, int(r)) for p, d, r in (c.split(":") for c in args.compare)}
    STEP_CHOICE.update(steps=tuple(args.steps), only=only, presets=tuple(args.presets), rows=tuple(args.rows))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"host CPU threads {torch.get_num_threads()}", flush=True)
    parts = list(dict.fromkeys(args.parts))  # in the order given (PARTS' by default)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp, \
            Recording("gpu", "python -m benchmarks.bench_gpu" + (f" --parts {' '.join(args.parts)}"
                                                                 if parts != list(PARTS) else "")
                      + "".join(f" --{name} {' '.join(map(str, getattr(args, name)))}" for name in
                                ("steps", "compare", "presets", "rows") if getattr(args, name) != parser.get_default(name))
                      + (f" --budget {args.budget:g}" if math.isfinite(args.budget) else "")
                      + (f" --label {args.label}" if args.label else ""), label=args.label) as rec:
        rec.figures = {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
                       "peaks_bf16_fp32": peak_rates(torch.cuda.get_device_name())}
        work = Path(tmp)
        build_vocab([CORPUS], work / "vocab.txt")
        write_shards([CORPUS], work / "vocab.txt", work / "shards")
        torch.manual_seed(0)
        save_model_dir(BiLM(PRESETS["original"].config.model).eval(), work / "model")
        lines = [l for l in HELDOUT.read_text("utf-8").splitlines() if l.strip()]
        text = work / "input.txt"
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        for part in parts:
            if time.monotonic() + PART_SECONDS.get(part, 0) > deadline:
                rec.figures.setdefault("skipped", []).append(part)
                print(f"{part}: skipped (it would not end within --budget)", flush=True)
                continue
            run_part(part, rec.figures, work, text, len(lines), deadline)
            rec.save()  # a run cut short keeps the parts it finished
        for line in against_targets(rec.figures):
            print(line, flush=True)


STEP_CHOICE: dict = {"steps": ("fused+graphs", "queued")}  # the step table's arguments from the command line


def run_part(part: str, figures: dict, work: Path, text: Path, n_lines: int, deadline: float) -> None:
    """One of `PARTS`, its figures put into `figures` (see the module's docstring)."""
    if part == "steps":
        print("training steps by preset, dtype and rows: " + ", ".join(STEP_CHOICE["steps"]), flush=True)
        step_table(work / "shards", out=figures.setdefault("steps", []), deadline=deadline, **STEP_CHOICE)
    elif part == "profile":
        for key, queued in (("step_profile", True), ("step_profile_unqueued", False)):
            prof = figures[key] = step_profile(work / "shards", queued=queued)
            print(f"profile of the {'default' if queued else 'unqueued'} step, {prof['preset']} {prof['dtype']} "
                  f"{prof['batch']} rows: {prof['wall_ms_per_step']} ms a step, the GPU busy "
                  f"{prof['gpu_busy_ms_per_step']} ms, {prof['kernels_per_step']:,} kernels, the host waiting "
                  f"{prof['host_waits_per_step']} times ({prof['host_wait_ms_per_step']} ms), copy calls "
                  f"{prof['host_copy_call_ms_per_step']} ms", flush=True)
            print(f"  waits by site, per step: {prof['sync_sites_per_step']}", flush=True)
            print("  host, own ms a step: " + " | ".join(f"{n} {ms:.2f} ({c})" for n, ms, c in
                                                      prof["top_host_ops_self_ms_per_step"][:8]), flush=True)
            for name, ms, calls in prof["top_kernels_ms_per_step"][:8 if queued else 4]:
                print(f"  {ms:8.3f} ms {calls:6,}  {name}", flush=True)
    elif part == "ddp":
        d = figures["ddp_one_gpu"] = ddp_rates(work / "shards")
        print(f"DDP on one GPU, {d['preset']} {d['dtype']} {d['batch']} rows: the default single-GPU step "
              f"{d['single_gpu_default_tokens_per_s']:,} tokens/s; a torchrun process "
              f"{d['ddp_one_process_tokens_per_s']:,} ({d['ddp_over_single']}x the single GPU's; graphs "
              f"{d.get('ddp_one_process_graphs')}), before 2026-12-05 (no graphs, dense softmax) "
              f"{d['ddp_before_tokens_per_s']:,} ({d['ddp_over_before']}x)", flush=True)
    elif part == "dump-scale":
        scale = figures["dump_original_scale"] = dump_scale(work / "model", text, work)
        print("dump original at scale, --layers average --dtype float16: " + " | ".join(
            f"{k}: {v:,}" for k, v in scale.items() if not k.startswith("profile")), flush=True)
        print("  host profile of the 512-row dump (own seconds, calls): " + " | ".join(
            f"{n} {t:.2f} s {c:,}" for n, t, c in scale["profile_dump_batch512"]), flush=True)
    elif part == "dump":
        cpu_rate, n = dump_rate(work / "model", text, work / "cpu.hdf5", "cpu", "fp32")
        rates = {dtype: dump_rate(work / "model", text, work / f"cuda-{dtype}.hdf5", "cuda", dtype)[0]
                 for dtype in ("fp32", "bf16")}
        diff = max_diff(work / "cpu.hdf5", work / "cuda-fp32.hdf5")
        figures["dump_original"] = {"tokens": n, "cuda_fp32_tokens_per_s": round(rates["fp32"]),
                                    "cuda_bf16_tokens_per_s": round(rates["bf16"]),
                                    "cpu_fp32_tokens_per_s": round(cpu_rate), "cpu_threads": torch.get_num_threads(),
                                    "cuda_over_cpu": round(rates["fp32"] / cpu_rate, 2),
                                    "largest_cuda_cpu_difference": diff}
        print(f"dump original, {n_lines:,} lines, {n:,} tokens: cuda fp32 {rates['fp32']:9,.0f} tokens/s | "
              f"cuda bf16 {rates['bf16']:9,.0f} | host CPU fp32 ({torch.get_num_threads()} threads) "
              f"{cpu_rate:7,.0f} | cuda fp32 / CPU {rates['fp32'] / cpu_rate:.1f}x | largest cuda-CPU "
              f"difference {diff:.1e}", flush=True)
    elif part == "reference":
        cpu = figures["reference_cpu_fp32"] = reference_difference("cpu", "fp32")
        for dtype in ("fp32", "bf16"):
            diff = figures[f"reference_cuda_{dtype}"] = reference_difference("cuda", dtype)
            print(f"reference on cuda, {dtype}: largest difference from allennlp {diff:.2e} (CPU fp32 in this "
                  f"run: {cpu:.2e})", flush=True)
    elif part == "auto":
        choice = figures["auto_choice_15m"] = auto_choice(work / "shards")
        print(f"--preset auto --max-time 15m here ({choice['probe_seconds']} s of probes): {choice['line']}",
              flush=True)
        rates = auto_batch_rates(work / "shards", seconds=3.0, deadline=deadline)
        figures["auto_batch_rates"] = [dict(r, tokens_per_s=round(r["tokens_per_s"])) for r in rates]
        for a, b in zip(rates, rates[1:]):
            if (a["shape"], a["dtype"]) == (b["shape"], b["dtype"]) and a["tokens_per_s"]:
                gain = b["tokens_per_s"] / a["tokens_per_s"]
                print(f"  {a['shape']} {a['dtype']}: {a['batch']} -> {b['batch']} rows {gain:.2f}x "
                      f"({'kept' if gain >= auto.ROWS_GAIN else 'not kept'} by auto's {auto.ROWS_GAIN:g}x)",
                      flush=True)
    elif part == "train":
        for preset, warmup, measured in (("small", 10, 40), ("original", 5, 20)):
            rates = {}
            for dtype in ("fp32", "bf16"):
                r = run_preset(preset, work / "shards", work / f"{preset}-{dtype}", warmup=warmup,
                               measured=measured, device="cuda", dtype=dtype)
                rates[dtype] = r["tokens_per_s"]
            figures[f"train_{preset}"] = {"fp32_tokens_per_s": round(rates["fp32"]),
                                          "bf16_tokens_per_s": round(rates["bf16"]),
                                          "batch": PRESETS[preset].config.training.batch_size,
                                          "negatives": r["negatives"]}
            print(f"train {preset:8s} on cuda: fp32 {rates['fp32']:9,.0f} tokens/s | bf16 {rates['bf16']:9,.0f} "
                  f"tokens/s | bf16/fp32 {rates['bf16'] / rates['fp32']:.2f}x (batch "
                  f"{PRESETS[preset].config.training.batch_size}, {r['negatives']} negatives)", flush=True)


if __name__ == "__main__":
    main()

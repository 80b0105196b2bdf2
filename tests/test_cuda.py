"""The GPU paths, where torch sees a CUDA device (skipped elsewhere, so on the project's CPU machines and in CI):
allennlp's reference reproduced on the GPU, training in fp32 and bf16 with an exact-enough resume, evaluate and
the token cache agreeing with the CPU, and a task model trained there.

The rest of the suite hides the GPU (tests/conftest.py), since its bounds were measured on the CPU; these tests put
torch's own `is_available` back. Bounds here were measured on an NVIDIA H200 (torch 2.11, CUDA 13.0).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from allennlp_reference import WITHIN, assert_matches_reference, largest_difference, reference_layers
from elmo_cli.checkpoint import latest_checkpoint, load_checkpoint
from elmo_cli.cli import app
from elmo_cli.embed import Embedder
from elmo_cli.evaluate import evaluate
from elmo_cli.loading import load_model
from elmo_cli.train import train
from train_fixtures import make_shards, tiny_config

REAL_IS_AVAILABLE = torch.cuda.is_available  # read at collection, before conftest hides the GPU
REFERENCE = Path(__file__).parent / "data" / "reference"
FILES = dict(options_file=REFERENCE / "options.json", weight_file=REFERENCE / "weights.hdf5")

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not REAL_IS_AVAILABLE(), reason="no CUDA device")]
runner = CliRunner()


@pytest.fixture(autouse=True)
def gpu_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", REAL_IS_AVAILABLE)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("corpus"))


def _sentences() -> list[list[str]]:
    return [l.split() for l in (REFERENCE / "sentences.txt").read_text("utf-8").splitlines()]


def test_dump_on_the_gpu_reproduces_allennlp(tmp_path):
    """`--device auto` is the GPU; fp32 within the README's 5e-6 (measured 3.9e-6 on an H200), bf16 within 0.05 and
    far above fp32 rounding (measured 0.045)."""
    out = tmp_path / "out.hdf5"
    result = runner.invoke(app, ["dump-embeddings", str(REFERENCE / "sentences.txt"), str(out), "--options",
                                 str(FILES["options_file"]), "--weights", str(FILES["weight_file"])])
    assert result.exit_code == 0, result.output
    with h5py.File(out) as f:
        got = [f[str(i)][...] for i in range(len(f) - 1)]
    assert_matches_reference(got, reference_layers(), WITHIN)
    emb = Embedder(**FILES, compute_dtype="bf16")
    assert emb.loaded.device.type == "cuda"
    assert 0.01 < largest_difference(emb.embed_sentences(_sentences()), reference_layers()) <= 0.05


def test_token_cache_dump_agrees_with_the_cpu(tmp_path):
    """A dump on the GPU through a token cache made there equals a plain dump on the CPU, within fp32 rounding
    (1e-5: the two devices sum in different orders)."""
    from elmo_cli.dump import dump_embeddings, dump_token_embeddings

    gpu = load_model(None, REFERENCE / "options.json", REFERENCE / "weights.hdf5")
    cpu = load_model(None, REFERENCE / "options.json", REFERENCE / "weights.hdf5", device="cpu")
    assert gpu.device.type == "cuda"
    words = tmp_path / "words.txt"
    words.write_text("\n".join(sorted({w for s in _sentences() for w in s} | {"<S>", "</S>"})) + "\n", "utf-8")
    dump_token_embeddings(gpu, words, tmp_path / "cache.hdf5")
    dump_embeddings(gpu, REFERENCE / "sentences.txt", tmp_path / "gpu.hdf5", token_cache=tmp_path / "cache.hdf5")
    dump_embeddings(cpu, REFERENCE / "sentences.txt", tmp_path / "cpu.hdf5")
    with h5py.File(tmp_path / "gpu.hdf5") as a, h5py.File(tmp_path / "cpu.hdf5") as b:
        assert sorted(a) == sorted(b)
        for key in b:
            if key != "sentence_to_index":
                np.testing.assert_allclose(a[key][...], b[key][...], atol=1e-5, rtol=0, err_msg=key)


def test_training_fp32_and_bf16_and_resume(shards, tmp_path):
    """Training on the GPU (fp32 and bf16 autocast) learns; stopping at step 10 and resuming to 20 lands where 20
    straight steps do (dropout masks and negatives from the restored CUDA and sampler states; the GPU's atomic
    gradient sums are not bitwise repeatable, so within 1e-4)."""
    _, train_dir, valid_dir = shards
    first = train(tiny_config(max_steps=20, device="cuda", dropout=0.2), train_dir, tmp_path / "a",
                  validation_dir=valid_dir)
    assert math.isfinite(first.train_loss) and first.validation["average_perplexity"] < 30  # about 40 word types
    train(tiny_config(max_steps=10, device="cuda", dropout=0.2), train_dir, tmp_path / "b")
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "b"))
    assert ckpt["ranks"][0]["cuda_rng"] is not None
    r = train(tiny_config(max_steps=20, device="cuda", dropout=0.2), train_dir, tmp_path / "b", resume=True)
    assert (r.resumed_from, r.step) == (10, 20)
    a, b = (load_checkpoint(latest_checkpoint(tmp_path / d))["model"] for d in "ab")
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=0, msg=k)
    bf16 = train(tiny_config(max_steps=20, device="cuda", dtype="bf16"), train_dir, tmp_path / "c",
                 validation_dir=valid_dir)
    assert math.isfinite(bf16.train_loss) and bf16.validation["average_perplexity"] < 30
    # the trained model is read back on either device: the same perplexity
    on = [evaluate(load_model(tmp_path / "a", device=d), [train_dir.parent / "valid.txt"]) for d in ("cuda", "cpu")]
    assert on[0].average_perplexity == pytest.approx(on[1].average_perplexity, rel=1e-5)


def test_task_model_trains_on_the_gpu(shards, tmp_path):
    """`task train` with ELMo features on the GPU, then `task predict` there."""
    from elmo_cli.tasks.cli import task_app

    train(tiny_config(max_steps=10, device="cuda"), shards[1], tmp_path / "bilm")
    lines = (shards[1].parent / "train.txt").read_text().splitlines()
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{l.split()[1] if l.split()[0] in ('the', 'a', 'my', 'her', 'our') else 'x'}\t{l}\n"
                           for l in lines[:120]), encoding="utf-8")
    r = runner.invoke(task_app, ["train", "--kind", "classification", "--train", str(tsv), "--dev", str(tsv),
                                 "--model", str(tmp_path / "bilm"), "--output", str(tmp_path / "task"), "--epochs",
                                 "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["dev"]["accuracy"] > 0
    (tmp_path / "in.txt").write_text("the cat sees the river .\n")
    r = runner.invoke(task_app, ["predict", "--task", str(tmp_path / "task"), str(tmp_path / "in.txt"),
                                 str(tmp_path / "out.tsv")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out.tsv").read_text().strip()


def _losses(config, train_dir, run_dir, resume=False):
    losses = {}
    result = train(config, train_dir, run_dir, resume=resume, on_step=lambda i: losses.__setitem__(i.step, i.loss))
    return result, losses


def test_cuda_graph_steps_give_the_eager_losses_and_resume_exactly(shards, tmp_path):
    """The CUDA-graph step (the default on a GPU) against `--no-cuda-graphs` on one seed: the same losses over 20
    steps in fp32, within 1e-5 (the GPU's atomic sums aside they are the same kernels on the same values); with
    dropout, a run stopped at 10 and resumed (it recaptures at its first step) gives the losses of 20 straight
    steps to the same bound; bf16 runs through graphs too."""
    _, train_dir, _ = shards
    graphed, g = _losses(tiny_config(max_steps=20, device="cuda", dropout=0.0), train_dir, tmp_path / "g")
    assert any("CUDA graphs: the LSTM stacks run as captured graphs" in n for n in graphed.notes), graphed.notes
    eager, e = _losses(tiny_config(max_steps=20, device="cuda", dropout=0.0, cuda_graphs=False), train_dir,
                       tmp_path / "e")
    assert not any("CUDA graphs" in n for n in eager.notes)
    assert list(g) == list(e) == list(range(1, 21))
    assert max(abs(g[k] - e[k]) for k in g) <= 1e-5
    straight, s = _losses(tiny_config(max_steps=20, device="cuda", dropout=0.2), train_dir, tmp_path / "s")
    _losses(tiny_config(max_steps=10, device="cuda", dropout=0.2), train_dir, tmp_path / "r")
    resumed, r = _losses(tiny_config(max_steps=20, device="cuda", dropout=0.2), train_dir, tmp_path / "r",
                         resume=True)
    assert resumed.notes == ["step 11: CUDA graphs: the LSTM stacks run as captured graphs from this step"]
    assert list(r) == list(range(11, 21)) and max(abs(r[k] - s[k]) for k in r) <= 1e-5
    bf16, b = _losses(tiny_config(max_steps=20, device="cuda", dtype="bf16"), train_dir, tmp_path / "b")
    assert any("captured graphs" in n for n in bf16.notes) and all(math.isfinite(v) for v in b.values())


def test_a_capture_that_fails_leaves_the_eager_step_running_with_the_same_losses(shards, tmp_path, monkeypatch):
    """A capture made to fail (a device synchronisation inside it, which a capture does not allow): one note, and
    the eager step goes on with dropout's draws where a `--no-cuda-graphs` run has them, so the same losses over 8
    steps (within 1e-5). A failed capture leaves torch's CUDA generator in capture mode; without `graphed`'s
    repair the next dropout fails."""
    from elmo_cli.model.bilm import BiLM

    _, train_dir, _ = shards
    eager, e = _losses(tiny_config(max_steps=8, device="cuda", dropout=0.2, cuda_graphs=False), train_dir,
                       tmp_path / "e")
    plain = BiLM.lm_stacks

    def synchronising(self, *args, **kwargs):
        out = plain(self, *args, **kwargs)
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # not permitted while capturing: the capture fails
        return out

    monkeypatch.setattr(BiLM, "lm_stacks", synchronising)
    failed, f = _losses(tiny_config(max_steps=8, device="cuda", dropout=0.2), train_dir, tmp_path / "f")
    notes = [n for n in failed.notes if "CUDA graphs" in n]
    assert len(notes) == 1 and notes[0].startswith("step 2: CUDA graphs: ") and "eager step continues" in notes[0]
    assert list(f) == list(e) == list(range(1, 9)) and max(abs(f[k] - e[k]) for k in f) <= 1e-5


def test_a_batch_that_does_not_fit_names_the_rows_that_do(tmp_path):
    """With the GPU's memory capped (`set_per_process_memory_fraction`) at what 256 rows of the tiny model need
    three times over, 4,096 rows stop before anything is written, with one line naming rows that do fit."""
    from elmo_cli import train as training
    from elmo_cli.distributed import Dist
    from elmo_cli.train import _TrainState, fit_to_data, open_shards
    from vocab.errors import ElmoError

    _, train_dir, _ = make_shards(tmp_path / "corpus", n_train=4_500, n_valid=10)  # enough sentences for 4,096 rows
    data = open_shards(train_dir)
    config = fit_to_data(tiny_config(device="cuda", unroll_steps=20), data)
    device = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    state = _TrainState(config, data, Dist(), device, None, None, False)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    assert training.step_fits(state, config, device, None, 256)
    need = torch.cuda.max_memory_allocated(device) - base
    total = torch.cuda.get_device_properties(device).total_memory
    del state
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction((base + 3 * need) / total, device)  # base: the model and the rest
    try:
        with pytest.raises(ElmoError) as e:
            train(tiny_config(device="cuda", unroll_steps=20, batch_size=4096, max_steps=2), train_dir,
                  tmp_path / "run")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    line = str(e.value)
    assert line.startswith("--batch-size 4096: a training step of this model does not fit in the "), line
    rows = int(line.split("; ")[1].split(" rows do")[0])
    assert 256 <= rows < 4096 and line.endswith(f"give --batch-size {rows} (nothing was written)")
    assert not (tmp_path / "run").exists()


def test_auto_on_the_gpu_doubles_its_rows_past_the_cpus_32(tmp_path):
    """`--preset auto --max-time` on CUDA probes each shape at doubling rows and keeps those a doubling paid 1.5x
    for: a step of 32 rows leaves a GPU waiting on launches, so at least one doubling pays (docs/auto.md; on an
    H200 the first doubling bought 1.65-1.70x; under the former 1.8x bound this test failed there). About
    0.3M tokens and a minute's budget, so that no rung reaches the pass cap (about 18 passes) before the rows stop paying."""
    import re

    from elmo_cli import auto

    _, train_dir, _ = make_shards(tmp_path / "corpus", n_train=40_000, n_valid=10)
    config, choice = auto.auto_config(train_dir, None, None, {"max_time": 60.0, "device": "cuda"})
    m = re.match(r"auto: LSTM \S+, (fp32|bf16), ([\d,]+) rows, ", choice.reason)
    assert m, choice.reason
    rows = int(m[2].replace(",", ""))
    assert rows == config.training.batch_size >= 64, choice.reason
    assert {p.rows for p in choice.probes} >= {32, 64} and all(p.tokens_per_s > 0 for p in choice.probes
                                                               if p.rows <= rows), choice.probes


@pytest.mark.parametrize("layers, dtype, stateful, atol", [("average", "float16", False, 2e-3),
                                                           ("all", "float32", True, 1e-5)])
def test_dump_reduced_on_the_gpu_and_written_while_the_next_batch_runs(tmp_path, layers, dtype, stateful, atol):
    """The GPU reduces each batch (`LayerSelection.reduce_batch`) and casts it before the copy back, and writes a
    batch while the next one computes; at 2 rows a batch (many batches in flight) every line equals the CPU's
    dump: within fp32 rounding, or one float16 step of the values here (|x| < 2)."""
    from elmo_cli.dump import dump_embeddings

    gpu = load_model(None, REFERENCE / "options.json", REFERENCE / "weights.hdf5")
    cpu = load_model(None, REFERENCE / "options.json", REFERENCE / "weights.hdf5", device="cpu")
    for loaded, name in ((gpu, "gpu"), (cpu, "cpu")):
        dump_embeddings(loaded, REFERENCE / "sentences.txt", tmp_path / f"{name}.hdf5", layers=layers, dtype=dtype,
                        batch_size=2, window_batches=2, stateful=stateful)
    with h5py.File(tmp_path / "gpu.hdf5") as a, h5py.File(tmp_path / "cpu.hdf5") as b:
        assert sorted(a) == sorted(b)
        for key in b:
            if key != "sentence_to_index":
                assert a[key].dtype == np.dtype(dtype) and a[key].shape == b[key].shape
                np.testing.assert_allclose(a[key][...].astype(np.float32), b[key][...].astype(np.float32),
                                           atol=atol, rtol=0, err_msg=key)


def test_fused_cells_compute_the_eager_cells_and_autograds_gradients():
    """A training layer on the GPU: the hand-written loop with its compiled cells (`compiled.FusedGpuCells`, the
    default) against autograd over the layer's loop, in fp32 within 1e-5 of the largest value (outputs, final
    state, every gradient), and in bf16 within bf16's rounding, its gradients float32."""
    from elmo_cli import compiled
    from elmo_cli.model import lstm
    from elmo_cli.model.lstm import ProjectedLSTMLayer

    notes: list[str] = []
    compiled.fuse_gpu_cells(True, notes.append)
    torch.manual_seed(0)
    layer = ProjectedLSTMLayer(64, 256, 64, cell_clip=3.0, proj_clip=3.0).cuda().train()
    x = torch.randn(16, 20, 64, device="cuda", requires_grad=True)
    state = tuple((torch.randn(16, n, device="cuda") * 0.5).requires_grad_() for n in (64, 256))
    reset = torch.rand(16, 20, device="cuda") < 0.1

    def run(by_hand: bool, dtype):
        layer.hand_gradient = by_hand
        leaves = [x, *state, *layer.parameters()]
        for t in leaves:
            t.grad = None
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            out, (h, c) = layer(x, state, None, reset)
            loss = (out.float() * torch.linspace(-1, 1, out.shape[-1], device="cuda")).sum() + h.float().sum()
        loss.backward()
        return [out.float(), h.float(), c.float()] + [t.grad for t in leaves]

    try:
        for dtype, within in ((None, 1e-5), (torch.bfloat16, 3e-2)):
            fused, plain = run(True, dtype), run(False, dtype)
            for a, b in zip(fused, plain):
                assert a.dtype == torch.float32
                assert (a - b).abs().max() <= within * b.abs().max()
    finally:
        layer.hand_gradient = True
        compiled.fuse_gpu_cells(False)
    assert not notes  # compiled: no fallback to the eager cells


def test_the_fast_step_gives_the_eager_steps_losses(shards, tmp_path, monkeypatch):
    """The default GPU step (the hand-written LSTM loop, its cells compiled, CUDA graphs, the step queued: the
    softmax updated from its gathered rows, one read at its end) against the plain eager step (autograd over the
    loop, no graphs, no compiled cells, torch's sparse Adagrad, results read as they come) on one seed: the same
    losses over 20 steps in fp32, within 1e-5."""
    from elmo_cli.model.lstm import ProjectedLSTMLayer
    from elmo_cli.train import _TrainState

    _, train_dir, _ = shards
    fast, f = _losses(tiny_config(max_steps=20, device="cuda", dropout=0.0), train_dir, tmp_path / "fast")
    assert any("captured graphs" in n for n in fast.notes) and not any("fused LSTM" in n for n in fast.notes)
    plain = ProjectedLSTMLayer.by_hand
    monkeypatch.setattr(ProjectedLSTMLayer, "by_hand", lambda self, x, mask: plain(self, x, mask) and not x.is_cuda)
    queue = _TrainState.queue_step
    monkeypatch.setattr(_TrainState, "queue_step", lambda self, on: queue(self, False))
    eager, e = _losses(tiny_config(max_steps=20, device="cuda", dropout=0.0, cuda_graphs=False, fuse_lstm=False),
                       train_dir, tmp_path / "eager")
    assert list(f) == list(e) == list(range(1, 21))
    assert max(abs(f[k] - e[k]) for k in f) <= 1e-5


def test_a_queued_step_waits_for_the_gpu_once(shards):
    """After its warm-up (the graphs captured, the cells compiled), a default GPU step makes the host wait for the
    GPU at one place of the project's code, its final read of the losses and norm (`_Trainer.step`): torch's sync
    debug mode reports every synchronizing call with the line that made it. (torch's own lazy start-up work, such
    as the compiler's first pattern passes, may add one in a process's first steps: not counted.)"""
    import warnings
    from collections import Counter

    from elmo_cli.train import _Trainer
    from vocab.shards import ShardDataset

    _, train_dir, _ = shards
    trainer = _Trainer.bare(tiny_config(device="cuda", dropout=0.1), ShardDataset(train_dir))
    assert trainer.state.queued and trainer.state.model.softmax.row_grads
    for _ in range(4):
        trainer.step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(3):
                trainer.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    project = str(Path(__file__).resolve().parent.parent / "elmo_cli")
    sites = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                    if "synchroniz" in str(w.message) and str(Path(w.filename).resolve()).startswith(project))
    assert sum(sites.values()) == 3 and len(sites) == 1 and next(iter(sites)).startswith("train.py:"), sites


def test_a_torchrun_process_steps_as_the_single_gpu_default(shards):
    """A torchrun process on a GPU (DistributedDataParallel over NCCL, here a world of one) runs the single-GPU
    default step: the LSTM stacks replayed as CUDA graphs, DDP's hooks all-reducing their gradients outside them,
    and the sparse softmax updated from the all-gathered rows. Its 20 losses (fp32) are the default's within 1e-5."""
    import torch.distributed as dist

    from benchmarks.bench_gpu import OneProcessJob
    from elmo_cli.train import _Trainer
    from vocab.shards import ShardDataset

    _, train_dir, _ = shards
    dataset, config = ShardDataset(train_dir), tiny_config(device="cuda", dropout=0.0)
    single = _Trainer.bare(config, dataset)
    expected = [single.step()[:2] for _ in range(20)]
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        job = _Trainer.bare(config, dataset, OneProcessJob())
        assert isinstance(job.state.wrapped, torch.nn.parallel.DistributedDataParallel)
        assert job.state.stacks is not None and job.state.model.softmax.row_grads
        got = [job.step()[:2] for _ in range(20)]
        assert job.state.stacks.graphed is not None and not job.state.stacks.failed
    finally:
        dist.destroy_process_group()
    assert max(abs(a - b) for x, y in zip(expected, got) for a, b in zip(x, y)) <= 1e-5

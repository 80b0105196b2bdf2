"""Training: the loss falls, resume is exact (in process and after SIGKILL), SIGTERM checkpoints, torchrun."""
from __future__ import annotations

import copy
import dataclasses
import json
import re
import shutil
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from elmo_cli.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from elmo_cli.loading import load_model
from elmo_cli.model.bilm import BiLM
from elmo_cli.loading import init_from as _init_from
from elmo_cli.train import clip_grad_norm, make_optimizer, train
from train_fixtures import TINY_MODEL, make_shards, tiny_config
from vocab.errors import ElmoError
from vocab.shards import ShardDataset, write_shards
from vocab.tokenize import TextEncoder
from vocab.vocabulary import build_vocab

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_shards(tmp_path_factory.mktemp("corpus"))


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(latest_checkpoint(run_dir))["model"]


def _assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_loss_falls_and_beats_unigram(shards, tmp_path):
    _, train_dir, valid_dir = shards
    # 64 negatives >= the 35 words: the training loss is the full softmax cross-entropy here
    cfg = tiny_config(max_steps=250, dropout=0.0, checkpoint_every=0, n_negative_samples=64, lr=0.5)
    result = train(cfg, train_dir, tmp_path / "run", validation_dir=valid_dir)
    records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss_sampled"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.6 * losses[0]
    # held-out full-softmax perplexity against a unigram model of the training text (add-one smoothed)
    ds = ShardDataset(train_dir)
    counts = Counter()
    for ids, _ in ds.iter_sentences():
        counts.update(ids.tolist())
        counts[ds.vocab.eos_id] += 1
    V, total = len(ds.vocab), sum(counts.values())
    vds = ShardDataset(valid_dir)
    nll, n = 0.0, 0
    for ids, _ in vds.iter_sentences():
        for t in ids.tolist() + [vds.vocab.eos_id]:
            nll -= math.log((counts[t] + 1) / (total + V))
            n += 1
    unigram = math.exp(nll / n)
    v = result.validation
    assert v["tokens"] == n
    assert v["forward_perplexity"] < 0.5 * unigram and v["backward_perplexity"] < 0.5 * unigram
    assert any(r["kind"] == "validation" and r["softmax"] == "full" for r in records)
    # the run directory is a loadable model directory
    loaded = load_model(tmp_path / "run")
    assert loaded.model.softmax.vocab_size == V and loaded.model.config.char_cnn.n_characters == 262


def test_autos_read_of_the_runs_own_rate_moves_its_dropout_and_a_resume_keeps_it(shards, tmp_path):
    """`auto`'s rule 11: a fresh run reads its own rate after `after_seconds` of training (0 here: at its first
    record, step 5) and where rule 3 gives the passes it now expects another dropout (a corpus counted at 10^12
    tokens: under a pass, 0.1), trains at that one from there: its record, config.json, the note. A run stopped
    at step 20 and resumed from its config.json ends where the unbroken run did."""
    from elmo_cli.train import resume_config

    _, train_dir, _ = shards
    plan = _plan(train_tokens=10**12)
    cfg = tiny_config(max_steps=40, max_time=3600.0, dropout=0.4)
    r = train(cfg, train_dir, tmp_path / "a", chosen={"reread": plan})
    records = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    read = [x for x in records if x["kind"] == "auto-read"]
    assert len(read) == 1 and (read[0]["step"], read[0]["dropout"], read[0]["dropout_before"]) == (5, 0.1, 0.4)
    assert read[0]["expected_epochs"] < 0.01 and r.read == {k: v for k, v in read[0].items() if k != "kind"}
    assert json.loads((tmp_path / "a" / "config.json").read_text())["training"]["dropout"] == 0.1
    assert any("dropout 0.1 from here, not 0.4 (rule 3)" in n for n in r.notes), r.notes
    train(tiny_config(max_steps=20, max_time=3600.0, dropout=0.4), train_dir, tmp_path / "b", chosen={"reread": plan})
    with pytest.raises(ElmoError, match="cannot resume with training.dropout = 0.4: the run was started with 0.1"):
        train(cfg, train_dir, tmp_path / "b", resume=True)
    again = train(resume_config(tmp_path / "b").with_training(max_steps=40), train_dir, tmp_path / "b", resume=True)
    assert again.resumed_from == 20 and again.read is None  # a resumed run is not read again
    _assert_same_params(_params(tmp_path / "a"), _params(tmp_path / "b"))
    # a run without auto's facts, or with a dropout already rule 3's, keeps its own
    same = train(tiny_config(max_steps=10, max_time=3600.0, dropout=0.1), train_dir, tmp_path / "c",
                 chosen={"reread": {**plan, "dropout": 0.1}})
    assert same.read["dropout"] == 0.1 and not any("from here" in n for n in same.notes)


def _plan(**over) -> dict:
    """`auto`'s rule 11 facts (`Choice.reread`) for the tiny runs: read at the first record (0 s), nothing validated,
    a probe that expected 30 passes at dropout 0.4, Adam, the clock ending the run."""
    return {"after_seconds": 0.0, "train_tokens": 10**12, "sustained": 0.94, "probe_tokens_per_s": 1_000.0,
            "validation_seconds": 0.0, "validation_minutes": 10.0, "cadence_given": False, "budget_seconds": 3600.0,
            "cap": 10**6, "decay_from": 10**6, "base_epochs": 10, "max_dropout": 1.0, "decays": True,
            "expected_epochs": 30.0, "dropout": 0.4, "capped": False, "epochs": 10, **over}


def test_autos_read_reaching_the_pass_cap_trains_with_decay_and_stops_there_and_a_resume_keeps_both(shards,
                                                                                                    tmp_path):
    """Rule 11 with rules 4 and 5: a run whose probe expected no cap and Adam reads, at its first record (step 5),
    that an hour's passes reach the cap of 2 passes: from step 6 it trains with AdamW decay 0.2 and stops at the
    cap's last step (the schedule laid over those steps). A run stopped at step 10 and resumed from its config.json
    ends bit-identical to the unbroken one."""
    from elmo_cli.train import resume_config, steps_per_epoch

    _, train_dir, _ = shards
    tokens = ShardDataset(train_dir).total_tokens
    cap_steps = math.ceil(2 * steps_per_epoch(tokens, 4, 8))
    assert cap_steps > 10
    plan = _plan(train_tokens=tokens, cap=2.0, decay_from=1.5, max_dropout=0.4)
    cfg = tiny_config(epochs=40, max_time=3600.0, dropout=0.4, optimizer="adam", lr=4e-3)
    r = train(cfg, train_dir, tmp_path / "a", chosen={"reread": plan})
    assert (r.step, r.stopped) == (cap_steps, "finished")
    saved = json.loads((tmp_path / "a" / "config.json").read_text())["training"]
    assert (saved["optimizer"], saved["weight_decay"], saved["epochs"], saved["dropout"]) == ("adamw", 0.2, 2.0, 0.4)
    assert r.read["capped"] and (r.read["weight_decay"], r.read["weight_decay_before"]) == (0.2, 0.0)
    assert any("AdamW decay 0.2 from here (rule 4); it stops after its cap of 2 passes (rule 5)" in n
               for n in r.notes), r.notes
    groups = load_checkpoint(latest_checkpoint(tmp_path / "a"))["optimizer"]["param_groups"]
    assert all(g["weight_decay"] == 0.2 and g.get("decoupled_weight_decay", True) for g in groups)
    train(tiny_config(epochs=40, max_time=3600.0, dropout=0.4, optimizer="adam", lr=4e-3, max_steps=10), train_dir,
          tmp_path / "b", chosen={"reread": plan})
    with pytest.raises(ElmoError, match="cannot resume with training.optimizer = 'adam'"):
        train(cfg, train_dir, tmp_path / "b", resume=True)
    again = train(resume_config(tmp_path / "b").with_training(max_steps=0), train_dir, tmp_path / "b", resume=True)
    assert (again.resumed_from, again.step) == (10, cap_steps)
    _assert_same_params(_params(tmp_path / "a"), _params(tmp_path / "b"))


def test_autos_read_lengthens_a_run_whose_probe_read_under_half_its_pace(shards, tmp_path):
    """A time-budgeted `auto` run is twice its expected passes long (at least the recipe's), so that its clock ends
    it; where the probe read under half the host's pace, that length would end the run first. Rule 11's read sets
    it from the run's own rate: a 4-s run whose length was one pass trains on to its clock."""
    from elmo_cli.train import steps_per_epoch

    _, train_dir, _ = shards
    tokens = ShardDataset(train_dir).total_tokens
    plan = _plan(train_tokens=tokens, base_epochs=1, epochs=1, budget_seconds=4.0, expected_epochs=0.5,
                 dropout=0.1, max_dropout=0.1)
    r = train(tiny_config(epochs=1, max_time=4.0, dropout=0.1, optimizer="adam"), train_dir, tmp_path / "a",
              chosen={"reread": plan})
    saved = json.loads((tmp_path / "a" / "config.json").read_text())["training"]
    assert r.read["epochs"] == saved["epochs"] == math.ceil(2 * r.read["expected_epochs"]) > 1
    assert r.stopped == "max_time" and r.step > steps_per_epoch(tokens, 4, 8)
    assert any("the clock ends it, not 1 passes" in n for n in r.notes), r.notes


def test_adam_switched_to_adamw_keeps_its_moments_and_decays_from_there():
    """`_TrainState.switch_optimizer`'s arithmetic: Adam for 3 steps, then AdamW decay 0.2 for 2, equals AdamW at
    decay 0 for 3 steps (Adam's update) and 0.2 for 2."""
    from elmo_cli.train import _TrainState

    def steps(opt, p, n):
        for i in range(n):
            opt.zero_grad()
            ((p - torch.arange(4.0)) ** 2 * (i + 1)).sum().backward()
            opt.step()

    torch.manual_seed(0)
    start = torch.randn(4)
    a, b = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    adam, decayed = tiny_config(optimizer="adam", lr=0.1).training, tiny_config(optimizer="adamw", lr=0.1,
                                                                               weight_decay=0.2).training
    holder = type("Holder", (), {})()  # the part of a _TrainState the switch reads: params and optimizer
    holder.params, holder.optimizer = [a], make_optimizer([a], adam)
    steps(holder.optimizer, a, 3)
    _TrainState.switch_optimizer(holder, decayed)
    assert isinstance(holder.optimizer, torch.optim.AdamW)
    steps(holder.optimizer, a, 2)
    reference = make_optimizer([b], dataclasses.replace(decayed, weight_decay=0.0))
    steps(reference, b, 3)
    reference.param_groups[0]["weight_decay"] = 0.2
    steps(reference, b, 2)
    assert torch.equal(a, b) and not torch.equal(a, start)


def test_resume_20_then_40_equals_40(shards, tmp_path):
    _, train_dir, _ = shards
    train(tiny_config(max_steps=40), train_dir, tmp_path / "a")
    train(tiny_config(max_steps=20), train_dir, tmp_path / "b")
    r = train(tiny_config(max_steps=40), train_dir, tmp_path / "b", resume=True)
    assert r.resumed_from == 20 and r.step == 40
    _assert_same_params(_params(tmp_path / "a"), _params(tmp_path / "b"))
    a, b = load_checkpoint(latest_checkpoint(tmp_path / "a")), load_checkpoint(latest_checkpoint(tmp_path / "b"))
    assert torch.equal(a["ranks"][0]["data"], b["ranks"][0]["data"])
    assert len(list_checkpoints(tmp_path / "a")) == 3  # keep_checkpoints
    with pytest.raises(ElmoError, match="already holds a run"):
        train(tiny_config(max_steps=40), train_dir, tmp_path / "a")
    with pytest.raises(ElmoError, match="cannot resume with training.batch_size = 5: the run was started with 4"):
        train(tiny_config(max_steps=50, batch_size=5), train_dir, tmp_path / "a", resume=True)
    with pytest.raises(ElmoError, match="training.lr = 0.5"):
        train(tiny_config(max_steps=50, lr=0.5), train_dir, tmp_path / "a", resume=True)
    r = train(tiny_config(max_steps=45), train_dir, tmp_path / "a", resume=True)  # the same command, longer
    assert (r.resumed_from, r.step) == (40, 45)


def _cli(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "elmo-cli"), "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _write_config(path: Path, **training) -> Path:
    cfg = tiny_config(**training)
    path.write_text(json.dumps(cfg.to_dict()), encoding="utf-8")
    return path


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(0.05)


def two_thread_config(**training):
    """Two threads (the default on a 2-core machine) and a batch whose encoder gradient (2 x 32 x 8 tokens x P 64 =
    32,768 floats) is large enough for torch's multithreaded CPU kernels: what made training non-reproducible."""
    from elmo_cli.presets import build_config

    model = {**TINY_MODEL, "lstm": {**TINY_MODEL["lstm"], "projection_dim": 64}}
    base = {"batch_size": 32, "unroll_steps": 8, "n_negative_samples": 16, "log_every": 5, "checkpoint_minutes": 0,
            "threads": 2, "device": "cpu"}
    return build_config({**model, "training": {**base, **training}}, "tiny")


def test_two_threads_are_bit_reproducible(shards, tmp_path):
    _, train_dir, _ = shards
    for name in ("a", "b"):
        train(two_thread_config(max_steps=30, checkpoint_every=0), train_dir, tmp_path / name)
    _assert_same_params(_params(tmp_path / "a"), _params(tmp_path / "b"))
    assert (tmp_path / "a" / "softmax.hdf5").read_bytes() == (tmp_path / "b" / "softmax.hdf5").read_bytes()


def test_sigkill_then_resume_equals_uninterrupted(shards, tmp_path):
    _, train_dir, _ = shards
    config = tmp_path / "config.json"
    config.write_text(json.dumps(two_thread_config(checkpoint_every=10).to_dict()), encoding="utf-8")
    steps = "80"
    killed = tmp_path / "killed"
    proc = _cli(["--data", str(train_dir), "--output", str(killed), "--config", str(config), "--max-steps", steps])
    _wait_for(lambda: len(list_checkpoints(killed)) >= 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = load_checkpoint(latest_checkpoint(killed))["step"]
    assert killed_at < int(steps)
    # The command that started the run, repeated as a scheduler would, plus --resume.
    resumed = _cli(["--data", str(train_dir), "--output", str(killed), "--config", str(config), "--max-steps", steps,
                    "--resume"])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    train(two_thread_config(checkpoint_every=10, max_steps=int(steps)), train_dir, tmp_path / "straight")
    _assert_same_params(_params(killed), _params(tmp_path / "straight"))
    steps_logged = [json.loads(l)["step"] for l in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps_logged == sorted(set(steps_logged))  # records after the checkpoint were not duplicated


def test_sigterm_writes_a_checkpoint_and_exits_cleanly(shards, tmp_path):
    _, train_dir, _ = shards
    config = _write_config(tmp_path / "config.json", checkpoint_every=0, log_every=1)
    run = tmp_path / "run"
    proc = _cli(["--data", str(train_dir), "--output", str(run), "--config", str(config), "--max-steps", "100000"])
    metrics = run / "metrics.jsonl"
    _wait_for(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "interrupted" in out
    ckpt = load_checkpoint(latest_checkpoint(run))
    assert 3 <= ckpt["step"] < 100000
    assert load_model(run).model.softmax is not None


def test_nan_loss_stops_with_a_clear_message(shards, tmp_path):
    _, train_dir, _ = shards
    with pytest.raises(ElmoError, match=r"loss became (nan|inf)|gradient norm became") as e:
        train(tiny_config(max_steps=50, lr=1e30, clip_norm=0.0, checkpoint_every=1), train_dir, tmp_path / "run")
    assert "step-" in str(e.value)
    load_checkpoint(latest_checkpoint(tmp_path / "run"))  # the last good one is intact


def test_clip_grad_norm_counts_sparse_gradients():
    torch.manual_seed(0)
    dense = torch.nn.Parameter(torch.randn(3, 4))
    table = torch.nn.Parameter(torch.randn(10, 4))
    ids = torch.tensor([1, 1, 7])  # a repeated row: coalescing must sum it before the norm
    loss = (torch.nn.functional.embedding(ids, table, sparse=True).sum(0) * dense).sum() * 10
    loss.backward()
    dense_table_grad = table.grad.to_dense().clone()
    expected = torch.cat([dense.grad.flatten(), dense_table_grad.flatten()]).norm().item()
    norm = clip_grad_norm([dense, table], 1.0)
    assert norm == pytest.approx(expected, rel=1e-5)
    after = torch.cat([dense.grad.flatten(), table.grad.to_dense().flatten()]).norm().item()
    assert after == pytest.approx(1.0, rel=1e-5)


def test_init_from_maps_softmax_rows_by_word(shards, tmp_path):
    vocab, train_dir, _ = shards
    r = train(tiny_config(max_steps=5), train_dir, tmp_path / "base")
    # a domain corpus with some new words: its own vocabulary, different ids
    (tmp_path / "domain.txt").write_text("the zebra sees a small house .\nthe cat finds the zebra again .\n" * 10)
    build_vocab([tmp_path / "domain.txt"], tmp_path / "dvocab.txt")
    write_shards([tmp_path / "domain.txt"], tmp_path / "dvocab.txt", tmp_path / "domain")
    enc = TextEncoder.from_dir(tmp_path / "domain")
    src = load_model(tmp_path / "base").model
    old = TextEncoder.from_dir(tmp_path / "base").vocab
    cfg = dataclasses.replace(src.config)
    model = BiLM(cfg, vocab_size=len(enc.vocab))
    notes = _init_from(model, tmp_path / "base", enc, reset_softmax=False)
    assert "mapped" in notes[0]
    for word in ("the", "cat", "house", "<S>"):
        torch.testing.assert_close(model.softmax.weight[enc.vocab.id_of(word)], src.softmax.weight[old.id_of(word)])
    torch.testing.assert_close(model.forward_lstm.layers[1].recurrent_weight, src.forward_lstm.layers[1].recurrent_weight)
    r = train(tiny_config(max_steps=3), tmp_path / "domain", tmp_path / "tuned", init_from=tmp_path / "base",
              reset_softmax=True)
    assert r.step == 3 and "afresh" in r.notes[0]


def test_init_from_published_files_takes_their_architecture(shards, reference_dir, tmp_path):
    """A bilm-tf model (options.json + weights.hdf5, no softmax) fine-tunes whatever the preset's shape."""
    _, train_dir, _ = shards
    published = tmp_path / "published"
    published.mkdir()
    for name in ("options.json", "weights.hdf5"):
        shutil.copy(reference_dir / name, published / name)
    r = train(tiny_config(max_steps=2), train_dir, tmp_path / "tuned", init_from=published)
    assert r.step == 2 and "no softmax.hdf5" in r.notes[0]
    tuned = load_model(tmp_path / "tuned").model
    src = load_model(published).model
    assert tuned.config.lstm == src.config.lstm and tuned.config.char_cnn.filters == src.config.char_cnn.filters
    assert tuned.softmax is not None


def test_bf16_autocast_trains_on_cpu(shards, tmp_path):
    _, train_dir, valid_dir = shards
    r = train(tiny_config(max_steps=4, dtype="bf16"), train_dir, tmp_path / "run", validation_dir=valid_dir)
    assert math.isfinite(r.train_loss) and math.isfinite(r.validation["average_perplexity"])


def _one_rank_gradient(model: BiLM, batch, negatives_seed: int, tc) -> list[torch.Tensor]:
    """The gradient of one process's first-step loss, computed alone: its rows, its own negatives."""
    from elmo_cli.model.softmax import log_uniform_sample
    from elmo_cli.train import BiLMLoss

    sampler = torch.Generator().manual_seed(negatives_seed)
    drawn = [log_uniform_sample(tc.n_negative_samples, model.softmax.vocab_size, sampler) for _ in range(2)]
    model.zero_grad(set_to_none=True)
    f_loss, b_loss, _ = BiLMLoss(model)(batch.fwd_chars, batch.bwd_chars, batch.fwd_targets, batch.bwd_targets,
                                        (None, None), tuple(d[0] for d in drawn), tuple(d[1] for d in drawn),
                                        batch.starts)
    ((f_loss + b_loss) / 2).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def test_torchrun_two_processes_gloo(shards, tmp_path):
    """Two gloo processes; their first step is the one-process step on both processes' rows with the gradients
    averaged (DistributedDataParallel's all-reduce), each process drawing its own negatives."""
    from elmo_cli.data import SentenceStreams
    from elmo_cli.train import fit_to_data, lr_factor

    _, train_dir, _ = shards
    steps = 4
    # No dropout (its masks are per process) and no clipping (it would hide a sum of gradients behind a rescale).
    config = _write_config(tmp_path / "config.json", checkpoint_every=1, keep_checkpoints=steps, dropout=0.0,
                           clip_norm=0.0)
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(29500 + os.getpid() % 1000),
         str(BIN / "elmo-cli"), "train", "--data", str(train_dir), "--output", str(run), "--config", str(config),
         "--max-steps", str(steps)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # nothing for the user to wonder about
    ckpt = load_checkpoint(latest_checkpoint(run))
    assert ckpt["step"] == steps and len(ckpt["ranks"]) == 2
    # each process read its own rows: rank 1's positions are not rank 0's
    assert not torch.equal(ckpt["ranks"][0]["data"], ckpt["ranks"][1]["data"])
    assert load_model(run).model.softmax is not None
    assert proc.stdout.count(f"finished: step {steps}/{steps}") == 1  # only rank 0 reports

    # The first step again in this process. The two processes' rows are rows 0..B-1 and B..2B-1 of one 2B-row
    # layout of the streams; each process draws its negatives from its own generator (seed * 1_000_003 + rank + 1).
    first = load_checkpoint(list_checkpoints(run)[0])
    assert first["step"] == 1
    dataset = ShardDataset(train_dir)
    cfg = fit_to_data(tiny_config(dropout=0.0, clip_norm=0.0), dataset)
    tc, B = cfg.training, cfg.training.batch_size
    lr = tc.lr * lr_factor(0.0, tc)  # the first step's learning rate
    torch.manual_seed(tc.seed)  # the model every process starts from
    model = BiLM(cfg.model, vocab_size=len(dataset.vocab), dropout=0.0)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    both = SentenceStreams(dataset, range(2 * B), 2 * B, seed=tc.seed).next_batch(tc.unroll_steps)
    grads = []
    for rank in range(2):
        rows = slice(rank * B, (rank + 1) * B)
        batch = dataclasses.replace(both, chars=both.chars[:, rows],
                                    fwd_targets=both.fwd_targets[rows], bwd_targets=both.bwd_targets[rows],
                                    starts=both.starts[rows])
        grads.append(_one_rank_gradient(model, batch, tc.seed * 1_000_003 + rank + 1, tc))
    names = [name for name, _ in model.named_parameters()]
    state = first["optimizer"]["state"]

    def adagrad(kind: str) -> tuple[dict, dict]:
        """One Adagrad step (torch's: sum += g^2, w -= lr g / (sqrt(sum) + 1e-10)) with the gradients combined."""
        weights, sums = {}, {}
        for k, name in enumerate(names):
            g = {"mean": (grads[0][k] + grads[1][k]) / 2, "sum": grads[0][k] + grads[1][k], "rank 0": grads[0][k],
                 "rank 1": grads[1][k]}[kind]
            sums[name] = tc.initial_accumulator + g * g
            weights[name] = start[name] - lr * g / (sums[name].sqrt() + 1e-10)
        return weights, sums

    weights, sums = adagrad("mean")
    for k, name in enumerate(names):
        torch.testing.assert_close(first["model"][name], weights[name], atol=1e-6, rtol=1e-5, msg=name)
        torch.testing.assert_close(state[k]["sum"], sums[name], atol=1e-6, rtol=1e-6, msg=name)
    for kind in ("sum", "rank 0", "rank 1"):  # what a wrong reduction would give is far from it
        other, _ = adagrad(kind)
        assert max(float((first["model"][n] - other[n]).abs().max()) for n in names) > 1e-3, kind


def test_moving_average_follows_the_horizon():
    from elmo_cli.train import _MovingAverage

    ema, avg, w = _MovingAverage(), [torch.zeros(3)], [torch.ones(3)]
    ema.horizon = 4.0
    ema(avg, w, 0)  # after 0 updates the warm start allows 1/10 of the old average: 0.9 of the new weights
    assert torch.allclose(avg[0], torch.full((3,), 0.9))
    ema(avg, [torch.zeros(3)], 1000)  # later the horizon rules: decay 1 - 1/4
    assert torch.allclose(avg[0], torch.full((3,), 0.9 * 0.75))


def test_weight_average_is_what_is_validated_written_and_resumed(shards, tmp_path):
    _, train_dir, valid_dir = shards
    cfg = tiny_config(max_steps=40, average=0.25, keep_best=False, lr=0.05)
    result = train(cfg, train_dir, tmp_path / "a", validation_dir=valid_dir)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "a"))
    averaged = {k[len("module."):]: v for k, v in ckpt["average"].items() if k.startswith("module.")}
    assert int(ckpt["average"]["n_averaged"]) == 40 and averaged.keys() == ckpt["model"].keys()
    # the model files are the average, not the trained weights
    written = load_model(tmp_path / "a").model.state_dict()
    name = "softmax.weight" if "softmax.weight" in written else next(iter(written))
    assert torch.allclose(written[name], averaged[name]) and not torch.allclose(written[name], ckpt["model"][name])
    records = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r["kind"] == "validation"][-1]
    assert last["weights"] == "average" and last["average_perplexity"] == round(result.validation["average_perplexity"], 4)
    # interrupted (SIGINT after step 20) and resumed: the same trained weights and the same average
    def interrupt(info):
        if info.step == 20:
            os.kill(os.getpid(), signal.SIGINT)

    assert train(cfg, train_dir, tmp_path / "b", on_step=interrupt).stopped == "signal"
    assert train(cfg, train_dir, tmp_path / "b", resume=True).resumed_from in (20, 21)
    other = load_checkpoint(latest_checkpoint(tmp_path / "b"))
    _assert_same_params(ckpt["model"], other["model"])
    _assert_same_params(ckpt["average"], other["average"])
    with pytest.raises(ElmoError, match="training.average must be in"):
        tiny_config(average=1.5)


def test_a_time_budget_paces_validation_by_the_clock_alone():
    from elmo_cli.train import _validation_due

    hour = tiny_config(max_time=3600.0, validation_minutes=10.0, validation_every=0).training
    # the nominal length (here 40,000 steps) will not be reached: its twentieth does not add validations
    assert not _validation_due(hour, 2000, 40_000, 60.0, clock_leads=True)
    assert _validation_due(hour, 2001, 40_000, 600.0, clock_leads=True)
    # where the steps end the run first, their cadence stays; an explicit --validation-every always does
    assert _validation_due(hour, 2000, 40_000, 60.0, clock_leads=False)
    explicit = tiny_config(max_time=3600.0, validation_every=500).training
    assert _validation_due(explicit, 2000, 40_000, 60.0, clock_leads=True)


STEP_LIMIT_SCRIPT = """
import os, sys
from elmo_cli import train as training
real = training.step_fits
limit = {0: 5, 1: 3}[int(os.environ["RANK"])]  # the second GPU has less room: it decides
training._checks_memory = lambda device: True
training.step_fits = lambda state, config, device, autocast, rows: (
    print(f"rank {os.environ['RANK']} tries {rows}", flush=True) or
    (rows <= limit and real(state, config, device, autocast, rows)))
from elmo_cli.cli import app
sys.argv = ["elmo-cli", *sys.argv[1:]]
app()
"""


def test_torchrun_a_step_that_does_not_fit_one_gpu_stops_every_process_with_one_line(shards, tmp_path):
    """Under torchrun each process tries the step on its own device and they agree after every try: both ask the
    same sizes and stop with the rows that fit on every GPU; nothing is written. The devices' memories are
    stand-ins around the real trial step (5 rows fit on rank 0, 3 on rank 1), as tests/test_graphed.py does for one
    process."""
    _, train_dir, _ = shards
    script = tmp_path / "limited.py"
    script.write_text(STEP_LIMIT_SCRIPT)
    config = _write_config(tmp_path / "config.json", batch_size=16)
    run = tmp_path / "run"
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(29500 + (os.getpid() + 7) % 1000),
         str(script), "train", "--data", str(train_dir), "--output", str(run), "--config", str(config),
         "--max-steps", "2"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    tried = re.findall(r"rank (\d) tries (\d+)", proc.stdout)  # the two processes' lines may interleave
    for rank in "01":
        assert [int(rows) for r, rows in tried if r == rank] == [16, 8, 4, 2, 3], proc.stdout
    line = ("error: --batch-size 16: a training step of this model does not fit in the memory of the cpu device; "
            "3 rows do: give --batch-size 3 (nothing was written)")
    assert proc.stderr.count(line) == 2, proc.stderr[-3000:]  # each process says why it stopped
    assert not run.exists()


def test_torchrun_more_processes_than_gpus_is_one_clear_error(monkeypatch):
    """`torchrun --nproc-per-node 2` on a one-GPU machine: every process says why, before joining NCCL
    (rank 0 from torchrun's LOCAL_WORLD_SIZE, and rank 1 from its own LOCAL_RANK without it)."""
    from elmo_cli.distributed import init_distributed

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, local_world in (("0", "2"), ("1", None)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        if local_world is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
        with pytest.raises(ElmoError, match=r"torchrun started 2 processes on this machine, but torch sees 1 "
                                            r"GPU\(s\).*nproc-per-node"):
            init_distributed(torch.device("cuda"))


def test_a_run_that_joined_the_process_group_leaves_it_and_one_joined_before_it_stays(shards, tmp_path,
                                                                                       monkeypatch):
    """`train` and `dump_embeddings` leave the group they joined when they return (a process that exits with
    gloo's group up can abort after its work is done: `benchmarks.bench_teardown`); a group the caller joined
    before them is the caller's to leave."""
    import torch.distributed as dist
    from elmo_cli import dump as dumping
    from elmo_cli import train as training
    from elmo_cli.distributed import Dist
    from elmo_cli.dump import dump_embeddings

    _, train_dir, _ = shards
    joins = iter(range(3))

    def joining(device):  # the run joins a group (of one process here, as torchrun's join would)
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'init{next(joins)}'}", rank=0,
                                world_size=1)
        return Dist(), device

    monkeypatch.setattr(training, "init_distributed", joining)
    monkeypatch.setattr(dumping, "init_distributed", joining)
    train(tiny_config(max_steps=2), train_dir, tmp_path / "run")
    assert not dist.is_initialized()
    (tmp_path / "text.txt").write_text("the cat sees the river .\n", encoding="utf-8")
    loaded = load_model(tmp_path / "run")
    dump_embeddings(loaded, tmp_path / "text.txt", tmp_path / "out.hdf5")
    assert not dist.is_initialized() and (tmp_path / "out.hdf5").exists()

    monkeypatch.setattr(dumping, "init_distributed", lambda device: (Dist(), device))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init-caller'}", rank=0, world_size=1)
    try:
        dump_embeddings(loaded, tmp_path / "text.txt", tmp_path / "out.hdf5", force=True)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adam_on_a_cpu_is_the_fused_kernel_and_updates_as_the_default_does(optimizer):
    """`make_optimizer` takes torch's fused Adam(W) on a CPU; five updates agree with the default (foreach) ones."""
    tc = dataclasses.replace(tiny_config().training, optimizer=optimizer, lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(30, 7)), torch.nn.Parameter(torch.randn(7))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    fused = make_optimizer(a, tc)
    default = torch.optim.Adam(b, lr=1e-2, weight_decay=0.1) if optimizer == "adam" else \
        torch.optim.AdamW(b, lr=1e-2, weight_decay=0.1)
    assert fused.defaults["fused"] is True
    for step in range(5):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads):
            p.grad, q.grad = g.clone(), g.clone()
        fused.step()
        default.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


def test_adagrad_with_a_sparse_group_updates_as_one_group_and_resumes_across_layouts():
    """`make_optimizer` gives the sparse softmax its own Adagrad group (on a GPU, so that the dense group takes the
    multi-tensor update): five steps equal one group's, and `load_optimizer_state` reads either layout's state
    into the other (a run resumed on another device), continuing identically."""
    from elmo_cli.train import load_optimizer_state

    tc = tiny_config().training
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(6, 3)), torch.nn.Parameter(torch.randn(10, 3))]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    split, whole = make_optimizer(a, tc, sparse=a[1:]), make_optimizer(b, tc)
    assert [len(g["params"]) for g in split.param_groups] == [1, 1] and len(whole.param_groups) == 1

    def step(pairs):
        g_dense = torch.randn(6, 3)
        rows = torch.tensor([[1, 4, 4]])
        g_sparse = torch.sparse_coo_tensor(rows, torch.randn(3, 3), (10, 3))
        for params, opt in pairs:
            params[0].grad, params[1].grad = g_dense.clone(), g_sparse.clone()
            opt.step()

    for _ in range(5):
        step([(a, split), (b, whole)])
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, atol=0, rtol=0)
    c = [torch.nn.Parameter(p.detach().clone()) for p in a]
    d = [torch.nn.Parameter(p.detach().clone()) for p in a]
    into_whole, into_split = make_optimizer(c, tc), make_optimizer(d, tc, sparse=d[1:])
    load_optimizer_state(into_whole, copy.deepcopy(split.state_dict()))  # as read back from a checkpoint file
    load_optimizer_state(into_split, copy.deepcopy(whole.state_dict()))
    for _ in range(3):
        step([(a, split), (c, into_whole), (d, into_split)])
    for p, q, r in zip(a, c, d):
        torch.testing.assert_close(p, q, atol=0, rtol=0)
        torch.testing.assert_close(p, r, atol=0, rtol=0)


@pytest.mark.parametrize("clip", [10.0, 0.05])
def test_queued_step_equals_the_step_that_reads_as_it_goes(shards, clip):
    """A GPU's step (`_TrainState.queue_step`: the softmax updated from its gathered rows, the clip's scale on the
    device, one read at the end), run here on the CPU, gives the CPU step's losses, norms and weights over 8 steps,
    with the clip idle and with it scaling every step."""
    from elmo_cli.train import _Trainer

    config = tiny_config(clip_norm=clip)
    dataset = ShardDataset(shards[1])

    def run(queue: bool):
        trainer = _Trainer.bare(config, dataset)  # seeds the global RNG (dropout) as a run does
        trainer.state.queue_step(queue)
        assert trainer.state.model.softmax.row_grads == queue
        return trainer, [trainer.step() for _ in range(8)]

    (plain, by_plain), (queued, by_queued) = run(False), run(True)
    for step, (a, b) in enumerate(zip(by_plain, by_queued)):
        assert a[3] == b[3] and a[4] == b[4]
        for x, y in zip(a[:3], b[:3]):
            assert math.isfinite(x) and abs(x - y) <= 1e-5 * max(1.0, abs(x)), (step, a, b)
        if clip < 1:
            assert a[2] > clip  # the clip scaled this step
    for (name, p), q in zip(plain.state.model.named_parameters(), queued.state.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=name)
    ps, qs = plain.state.optimizer.state, queued.state.optimizer.state
    for p, q in zip(plain.state.model.parameters(), queued.state.model.parameters()):
        torch.testing.assert_close(ps[p]["sum"], qs[q]["sum"], atol=1e-5, rtol=1e-5)
        assert float(ps[p]["step"]) == float(qs[q]["step"]) == 8


def test_adagrad_rows_is_torchs_sparse_adagrad():
    """`row_updates.adagrad_rows_` from gathered rows (repeats included, in any order) equals torch's Adagrad from
    the same sparse gradient, in float64, over three steps; the summed rows' norm is the coalesced gradient's."""
    from elmo_cli import row_updates

    torch.manual_seed(0)
    tc = tiny_config().training
    a = torch.nn.Parameter(torch.randn(12, 5, dtype=torch.float64))
    b = torch.nn.Parameter(a.detach().clone())
    by_torch, by_rows = make_optimizer([a], tc), make_optimizer([b], tc)
    for _ in range(3):
        ids = torch.tensor([7, 2, 7, 11, 0, 2, 7, 5])
        grads = torch.randn(len(ids), 5, dtype=torch.float64)
        a.grad = torch.sparse_coo_tensor(ids[None], grads, a.shape)
        by_torch.step()
        rows = row_updates.summed_rows(ids, grads)
        dense = torch.zeros(12, 5, dtype=torch.float64).index_add_(0, ids, grads)
        assert torch.allclose(rows.summed.norm(), dense.norm(), atol=1e-12)
        row_updates.adagrad_rows_(by_rows, b, rows)
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(by_torch.state[a]["sum"], by_rows.state[b]["sum"], atol=1e-12, rtol=1e-12)
    untouched = torch.tensor([1, 3, 4, 6, 8, 9, 10])
    assert torch.equal(by_rows.state[b]["sum"][untouched], torch.full((7, 5), tc.initial_accumulator,
                                                                      dtype=torch.float64))


def test_queued_step_resumes_exactly_with_its_next_inputs_made_ahead(shards, tmp_path, monkeypatch):
    """A queued step makes the next step's inputs before reading its results (`_Trainer._prefetch`), moving the
    data position and the sampler past them; its checkpoints save the position before them, so 10 steps then 10
    resumed equal 20 straight (weights and the data position), as the step that reads as it goes does."""
    from elmo_cli.train import _TrainState

    plain = _TrainState.queue_step
    monkeypatch.setattr(_TrainState, "queue_step", lambda self, on: plain(self, True))
    _, train_dir, _ = shards
    straight = train(tiny_config(max_steps=20, checkpoint_every=7), train_dir, tmp_path / "a")
    train(tiny_config(max_steps=10, checkpoint_every=7), train_dir, tmp_path / "b")
    r = train(tiny_config(max_steps=20, checkpoint_every=7), train_dir, tmp_path / "b", resume=True)
    assert (straight.step, r.resumed_from, r.step) == (20, 10, 20)
    _assert_same_params(_params(tmp_path / "a"), _params(tmp_path / "b"))
    a, b = load_checkpoint(latest_checkpoint(tmp_path / "a")), load_checkpoint(latest_checkpoint(tmp_path / "b"))
    assert torch.equal(a["ranks"][0]["data"], b["ranks"][0]["data"])
    assert torch.equal(a["ranks"][0]["sampler_rng"], b["ranks"][0]["sampler_rng"])
    monkeypatch.undo()
    unqueued = load_checkpoint(latest_checkpoint(tmp_path / "a"))
    train(tiny_config(max_steps=20, checkpoint_every=7), train_dir, tmp_path / "c")
    c = load_checkpoint(latest_checkpoint(tmp_path / "c"))
    assert torch.equal(unqueued["ranks"][0]["data"], c["ranks"][0]["data"])  # the same position either way


def test_torchrun_processes_make_the_same_update_with_the_sparse_softmax(shards, tmp_path):
    """Under torchrun the sparse softmax is left out of DistributedDataParallel and updated from every process's
    gathered rows (`distributed.all_gather_rows`): after steps with dropout and clipping, both processes hold the
    same weights and Adagrad sums to the bit, softmax included, though each trained on its own rows."""
    import torch.multiprocessing as mp

    from train_fixtures import two_process_steps

    _, train_dir, _ = shards
    mp.spawn(two_process_steps, args=(2, str(tmp_path / "init"), str(train_dir), str(tmp_path), 3), nprocs=2)
    a, b = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert a["ddp"] == "DistributedDataParallel"
    assert a["losses"] != b["losses"]  # their own rows, negatives and dropout
    assert a["params"].keys() == b["params"].keys() and "softmax.weight" in a["params"]
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name
        assert torch.equal(a["sums"][name], b["sums"][name]), name
    # the softmax was trained by the rows: its Adagrad sums grew
    assert bool((a["sums"]["softmax.weight"] > tiny_config().training.initial_accumulator).any())

"""The training step's route through CUDA graphs (`elmo_cli.graphed`), as far as a CPU can check it: when the
trainer captures (the first step with states; a resumed run's first step), what it hands the capture, that a
failed capture or replay leaves the run on the eager step with one note, and that the CPU never tries. The
captures themselves run in tests/test_cuda.py, on a GPU."""
from __future__ import annotations

import json

import pytest
import torch

from elmo_cli import graphed, train as training
from elmo_cli.checkpoint import latest_checkpoint, load_checkpoint
from elmo_cli.train import train
from train_fixtures import make_shards, tiny_config


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("corpus"), n_train=120, n_valid=10)


class Replay:
    """Stands in for `GraphedStacks` where there is no GPU: records what it was captured with, then runs
    `BiLM.lm_stacks` eagerly at every call."""

    made: list = []

    def __init__(self, bilm, fwd_x, bwd_x, states, starts):
        self.bilm, self.calls = bilm, 0
        Replay.made.append(dict(x=tuple(fwd_x.shape), states=[tuple(t.shape) for h_c in states[0] for t in h_c],
                                starts=None if starts is None else tuple(starts.shape), self=self))

    def __call__(self, fwd_x, bwd_x, states, starts):
        self.calls += 1
        return self.bilm.lm_stacks(fwd_x, bwd_x, states, starts)


class Broken:
    def __init__(self, *args):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nsecond line")


def _weights(run_dir):
    return load_checkpoint(latest_checkpoint(run_dir))["model"]


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_capture_comes_at_the_first_step_with_states_and_a_resumed_run_recaptures(shards, tmp_path, monkeypatch):
    _, train_dir, _ = shards
    eager = train(tiny_config(max_steps=8, dropout=0.2), train_dir, tmp_path / "eager")
    assert not any("CUDA graphs" in n for n in eager.notes)  # the CPU: nothing tried, nothing said
    monkeypatch.setattr(training, "reason_not", lambda *a: None)
    monkeypatch.setattr(graphed, "GraphedStacks", Replay)
    Replay.made = []
    r = train(tiny_config(max_steps=8, dropout=0.2), train_dir, tmp_path / "graphed")
    (made,) = Replay.made
    # captured on step 2's tensors: B=4 rows, T=8 steps, P=16, H=32; every step after the first replays
    assert made["x"] == (4, 8, 16) and made["states"] == [(4, 16), (4, 32)] * 2 and made["starts"] == (4, 8)
    assert made["self"].calls == 7
    assert r.notes == ["step 2: CUDA graphs: the LSTM stacks run as captured graphs from this step"]
    records = [json.loads(l) for l in (tmp_path / "graphed" / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["text"]) for x in records if x["kind"] == "note"] == [(2, r.notes[0][len("step 2: "):])]
    _same(_weights(tmp_path / "eager"), _weights(tmp_path / "graphed"))
    # stopped at 4 and resumed: the resumed invocation captures at its first step (its states come from the
    # checkpoint) and lands on the same weights
    Replay.made = []
    train(tiny_config(max_steps=4, dropout=0.2), train_dir, tmp_path / "resumed")
    resumed = train(tiny_config(max_steps=8, dropout=0.2), train_dir, tmp_path / "resumed", resume=True)
    assert [m["self"].calls for m in Replay.made] == [3, 4]
    assert resumed.notes == ["step 5: CUDA graphs: the LSTM stacks run as captured graphs from this step"]
    _same(_weights(tmp_path / "eager"), _weights(tmp_path / "resumed"))


def test_a_failed_capture_leaves_the_eager_step_and_one_note(shards, tmp_path, monkeypatch):
    _, train_dir, _ = shards
    monkeypatch.setattr(training, "reason_not", lambda *a: None)
    monkeypatch.setattr(graphed, "GraphedStacks", Broken)
    r = train(tiny_config(max_steps=6), train_dir, tmp_path / "broken")
    assert r.step == 6
    assert r.notes == ["step 2: CUDA graphs: RuntimeError: CUDA error: operation not permitted when stream is "
                       "capturing - the eager step continues (--no-cuda-graphs skips the attempt)"]
    monkeypatch.undo()
    train(tiny_config(max_steps=6, cuda_graphs=False), train_dir, tmp_path / "off")
    _same(_weights(tmp_path / "off"), _weights(tmp_path / "broken"))


def test_reason_not():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert graphed.reason_not(cpu, True) == "" and graphed.reason_not(gpu, False) == ""
    assert graphed.reason_not(gpu, True) is None


def test_a_step_that_does_not_fit_names_the_rows_that_do_and_writes_nothing(shards, tmp_path, monkeypatch):
    """On a GPU the trainer tries one step at the asked rows before writing anything (`step_fits`); here the
    device's memory is a stand-in that takes 3 rows at most, around the real trial step."""
    from vocab.errors import ElmoError

    _, train_dir, _ = shards
    real = training.step_fits
    tried = []

    def fits(state, config, device, autocast, rows):
        tried.append(rows)
        return rows <= 3 and real(state, config, device, autocast, rows)

    monkeypatch.setattr(training, "_checks_memory", lambda device: True)
    monkeypatch.setattr(training, "step_fits", fits)
    with pytest.raises(ElmoError) as e:
        train(tiny_config(max_steps=2, batch_size=16), train_dir, tmp_path / "run")
    assert str(e.value) == ("--batch-size 16: a training step of this model does not fit in the memory of the cpu "
                            "device; 3 rows do: give --batch-size 3 (nothing was written)")
    assert tried == [16, 8, 4, 2, 3] and not (tmp_path / "run").exists()
    # a step that fits: the run goes on, and the trial left no trace (the same weights as without it)
    train(tiny_config(max_steps=4, batch_size=3), train_dir, tmp_path / "checked")
    monkeypatch.undo()
    train(tiny_config(max_steps=4, batch_size=3), train_dir, tmp_path / "plain")
    _same(_weights(tmp_path / "checked"), _weights(tmp_path / "plain"))


def test_rows_that_fit():
    assert training.rows_that_fit(128, lambda n: n <= 100) in range(88, 101)
    assert training.rows_that_fit(128, lambda n: n <= 64) == 64
    assert training.rows_that_fit(8, lambda n: False) == 0

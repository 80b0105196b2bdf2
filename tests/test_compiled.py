"""`train --compile` on a CPU, as far as the suite can check it without compiling (a compilation takes minutes:
`python -m benchmarks.bench_compile` measures the compiled step's speed and its losses against the eager step's):
which calls run compiled, that a failed compilation leaves the run on the eager step with one note and the eager
run's weights, and that without a C++ compiler nothing is tried and the run says so."""
from __future__ import annotations

import json
import os

import pytest
import torch

from elmo_cli import compiled, machine
from elmo_cli.checkpoint import latest_checkpoint, load_checkpoint
from elmo_cli.model.bilm import BiLM
from elmo_cli.model.lstm import ProjectedLSTMLayer
from elmo_cli.train import train
from train_fixtures import make_shards, tiny_config


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("corpus"), n_train=120, n_valid=10)


class InductorFailure(RuntimeError):
    """What a compilation that fails raises: an exception of torch.compile's own modules."""


InductorFailure.__module__ = "torch._inductor.exc"


def _weights(run_dir):
    return load_checkpoint(latest_checkpoint(run_dir))["model"]


def test_only_a_training_steps_layers_run_compiled_and_the_weights_keep_their_names(monkeypatch):
    calls = []
    monkeypatch.setattr(compiled, "_COMPILED", lambda self, *a: calls.append(self) or ProjectedLSTMLayer.forward(self, *a))
    config = tiny_config()
    model = BiLM(config.model, vocab_size=50)
    names = set(model.state_dict())
    compiled.compile_layers(model)
    layers = [m for m in model.modules() if isinstance(m, ProjectedLSTMLayer)]
    assert len(layers) == 2 * config.model.lstm.n_layers
    assert not any(layer.hand_gradient for layer in layers)  # autograd over the compiled loop
    x = torch.randn(2, 3, layers[0].input_weight.shape[1])
    out, _ = layers[0](x)
    assert calls == [layers[0]] and out.shape == (2, 3, layers[0].projection_dim)
    model.eval()
    layers[0](x)  # validation and inference: eager
    model.train()
    with torch.no_grad():
        layers[0](x)
    assert len(calls) == 1
    assert set(model.state_dict()) == names  # checkpoints and model files as an eager run writes them
    compiled.eager_layers(model)
    layers[0](x)
    assert len(calls) == 1
    assert all(layer.hand_gradient for layer in layers)  # the eager step's gradient by hand again


def test_a_compilation_that_fails_leaves_the_eager_step_one_note_and_the_eager_weights(shards, tmp_path,
                                                                                        monkeypatch):
    _, train_dir, _ = shards
    monkeypatch.setattr(machine, "cxx_compiler", lambda environ=None: "/usr/bin/g++")

    def broken(self, *args):
        raise InductorFailure("C++ compile error: cannot run g++\nthe compiler's output")
    monkeypatch.setattr(compiled, "_COMPILED", broken)
    r = train(tiny_config(max_steps=6, dropout=0.0, compile=True), train_dir, tmp_path / "broken")
    assert r.step == 6
    assert r.notes == ["step 1: --compile: torch.compile failed (InductorFailure: C++ compile error: cannot run g++); "
                       "the eager step runs"]
    records = [json.loads(line) for line in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["kind"]) for x in records if x["kind"] == "note"] == [(1, "note")]
    monkeypatch.undo()
    train(tiny_config(max_steps=6, dropout=0.0), train_dir, tmp_path / "eager")
    a, b = _weights(tmp_path / "broken"), _weights(tmp_path / "eager")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_error_of_the_model_is_not_taken_for_a_failed_compilation(shards, tmp_path, monkeypatch):
    _, train_dir, _ = shards
    monkeypatch.setattr(machine, "cxx_compiler", lambda environ=None: "/usr/bin/g++")

    def out_of_memory(self, *args):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")
    monkeypatch.setattr(compiled, "_COMPILED", out_of_memory)
    with pytest.raises(RuntimeError, match="not enough memory"):
        train(tiny_config(max_steps=2, compile=True), train_dir, tmp_path / "oom")
    assert compiled.is_compile_failure(RuntimeError("x")) is False
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = InductorFailure("inner")
    assert compiled.is_compile_failure(wrapped) is True
    # a plain RuntimeError raised inside Dynamo's own code (as on a Python it does not support) counts as well
    code = compile("def unsupported():\n    raise RuntimeError('Dynamo is not supported on this Python')\n",
                   "/site-packages/torch/_dynamo/eval_frame.py", "exec")
    scope: dict = {}
    exec(code, scope)
    with pytest.raises(RuntimeError) as raised:
        scope["unsupported"]()
    assert compiled.is_compile_failure(raised.value) is True


def test_without_a_cpp_compiler_the_run_says_so_and_trains_eagerly(shards, tmp_path, monkeypatch):
    _, train_dir, _ = shards
    monkeypatch.setattr(machine, "cxx_compiler", lambda environ=None: None)
    monkeypatch.setattr(compiled, "_COMPILED", None)
    r = train(tiny_config(max_steps=3, compile=True), train_dir, tmp_path / "run")
    assert r.step == 3 and r.notes == ["--compile: no C++ compiler found (torch.compile's Inductor needs one: g++ "
                                       "or clang++, or $CXX); the eager step runs"]
    assert compiled._COMPILED is None  # nothing compiled, nothing swapped


def test_cxx_compiler_reads_cxx_first(tmp_path):
    fake = tmp_path / "my-c++"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert machine.cxx_compiler({"CXX": str(fake)}) == str(fake)
    assert compiled.reason_not(torch.device("cuda", 0), True) == "" and compiled.reason_not(torch.device("cpu"),
                                                                                            False) == ""


def test_inductors_cache_lives_in_the_users_cache_folder_unless_they_chose_one(tmp_path):
    # A later run on the machine compiles from this cache (6.3 s against 104.2 s cold on 2 Zen 3 cores): it must
    # outlive /tmp, and a folder the user set is theirs.
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = compiled.use_cache_dir(environ)
    assert folder == str(tmp_path / "xdg" / "elmo-cli" / "inductor")
    assert environ[compiled.CACHE_VARIABLE] == folder and (tmp_path / "xdg" / "elmo-cli" / "inductor").is_dir()
    mine = {compiled.CACHE_VARIABLE: str(tmp_path / "mine"), "XDG_CACHE_HOME": str(tmp_path / "xdg2")}
    assert compiled.use_cache_dir(mine) is None
    assert mine[compiled.CACHE_VARIABLE] == str(tmp_path / "mine") and not (tmp_path / "xdg2").exists()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    environ = {"XDG_CACHE_HOME": str(blocked)}
    assert compiled.use_cache_dir(environ) is None and compiled.CACHE_VARIABLE not in environ  # torch's default


def test_the_first_compiled_layers_set_the_cache_folder_before_inductor_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(compiled.CACHE_VARIABLE, raising=False)
    monkeypatch.setattr(compiled, "_COMPILED", None)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # no compilation: what matters is the order
    compiled.compile_layers(BiLM(tiny_config().model, vocab_size=50))
    assert os.environ[compiled.CACHE_VARIABLE] == str(tmp_path / "elmo-cli" / "inductor")

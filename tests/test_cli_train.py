"""`elmo-cli train` through the CLI: a short run, and each bad input as one line on stderr with exit code 1."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from elmo_cli.cli import app
from elmo_cli.loading import load_model
from train_fixtures import make_shards, tiny_config
from vocab.shards import write_shards
from vocab.vocabulary import build_vocab

runner = CliRunner()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_shards(tmp_path_factory.mktemp("corpus"))


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_config().to_dict()), encoding="utf-8")
    return path


def _train(*args: str):
    return runner.invoke(app, ["train", *args])


def _one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    err = result.stderr.strip()
    assert err.startswith("error:") and "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for f in fragments:
        assert f in " ".join(err.split()), err


def test_short_run_writes_a_model_directory(shards, config, tmp_path):
    _, train_dir, valid_dir = shards
    out = tmp_path / "run"
    r = _train("--data", str(train_dir), "--output", str(out), "--config", str(config), "--max-steps", "6",
               "--validation", str(valid_dir), "--lr", "0.3", "--seed", "4", "--average", "0.2")
    assert r.exit_code == 0, r.output
    assert "finished: step 6/6" in r.stdout and "validation perplexity (full softmax)" in r.stdout
    # stderr is not a terminal: plain progress lines (the last step's always), one line each however long
    last = [line for line in r.stderr.splitlines() if line.startswith("step 6/6 ")]
    assert len(last) == 1 and re.fullmatch(r"step 6/6  epoch [0-9.]+  loss [0-9.]+  lr \S+  [0-9,]+ tok/s  ETA "
                                           r"\d+:\d\d:\d\d", last[0]), r.stderr
    for name in ("options.json", "weights.hdf5", "softmax.hdf5", "vocab.txt", "chars.json", "config.json",
                 "metrics.jsonl"):
        assert (out / name).is_file(), name
    options = json.loads((out / "options.json").read_text())
    assert options["char_cnn"]["n_characters"] == 262
    effective = json.loads((out / "config.json").read_text())
    assert effective["training"]["lr"] == 0.3 and effective["training"]["seed"] == 4
    assert effective["training"]["average"] == 0.2  # validated and written: the moving average of the weights
    assert [json.loads(l)["weights"] for l in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(l)["kind"] == "validation"][-1] == "average"
    assert load_model(out).model.softmax is not None


def test_preset_and_config_keys(shards, tmp_path):
    from elmo_cli.presets import build_config, load_config

    small = load_config(None, "small")
    assert (small.model.lstm.dim, small.model.lstm.projection_dim, small.model.char_cnn.n_highway) == (1024, 128, 1)
    assert (small.training.lr, small.training.batch_size, small.training.n_negative_samples) == (0.2, 128, 8192)
    bilm_tf = build_config({"lstm": {"dim": 64}, "n_epochs": 3, "n_train_tokens": 99, "dropout": 0.2}, "small")
    assert bilm_tf.training.epochs == 3 and bilm_tf.training.dropout == 0.2 and bilm_tf.model.lstm.dim == 64


@pytest.mark.parametrize("bad, fragments", [
    ({"training": {"batch_sise": 3}}, ["training.batch_sise", "batch_size", "unroll_steps"]),
    ({"lsmt": {}}, ["'lsmt'", "char_cnn", "lstm", "training"]),
    ({"lstm": {"dimension": 3}}, ["lstm.dimension", "projection_dim"]),
    ({"training": {"dtype": "fp8"}}, ["dtype"]),
])
def test_unknown_or_bad_config_keys(shards, tmp_path, bad, fragments):
    _, train_dir, _ = shards
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = _train("--data", str(train_dir), "--output", str(tmp_path / "run"), "--config", str(path))
    _one_line_error(r, *fragments)


def test_missing_shards(tmp_path):
    r = _train("--data", str(tmp_path / "nowhere"), "--output", str(tmp_path / "run"))
    _one_line_error(r, "--data", "nowhere")


def test_corrupt_shard_fails_its_checksum(shards, tmp_path):
    _, train_dir, _ = shards
    copy = tmp_path / "shards"
    shutil.copytree(train_dir, copy)
    victim = copy / "shard-00000" / "token_ids.npy"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = _train("--data", str(copy), "--output", str(tmp_path / "run"))
    _one_line_error(r, "sha256", "token_ids.npy")


def test_validation_with_another_vocabulary(shards, tmp_path):
    _, train_dir, _ = shards
    (tmp_path / "other.txt").write_text("completely different words here .\n" * 5)
    build_vocab([tmp_path / "other.txt"], tmp_path / "v.txt")
    write_shards([tmp_path / "other.txt"], tmp_path / "v.txt", tmp_path / "other")
    r = _train("--data", str(train_dir), "--output", str(tmp_path / "run"), "--validation", str(tmp_path / "other"))
    _one_line_error(r, "--validation", "vocabulary")


def test_shards_whose_vocabulary_was_swapped(shards, tmp_path):
    _, train_dir, _ = shards
    copy = tmp_path / "shards"
    shutil.copytree(train_dir, copy)
    lines = (copy / "vocab.txt").read_text().splitlines()
    (copy / "vocab.txt").write_text("\n".join(lines[:3] + lines[4:] + lines[3:4]) + "\n")
    r = _train("--data", str(copy), "--output", str(tmp_path / "run"))
    _one_line_error(r, "vocab.txt", "sha256")


def test_unwritable_output(shards, tmp_path):
    _, train_dir, _ = shards
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = _train("--data", str(train_dir), "--output", str(blocker / "run"))
    _one_line_error(r, "not writable")


def test_resume_with_nothing_to_resume(shards, tmp_path):
    _, train_dir, _ = shards
    r = _train("--data", str(train_dir), "--output", str(tmp_path / "empty"), "--resume")
    _one_line_error(r, "nothing to resume")


def test_bad_max_time(shards, tmp_path):
    _, train_dir, _ = shards
    r = _train("--data", str(train_dir), "--output", str(tmp_path / "run"), "--max-time", "soon")
    _one_line_error(r, "--max-time")


def test_weight_decay_flag_shrinks_the_weights(shards, config, tmp_path):
    """`--weight-decay` reaches the optimizer: with adamw the same run ends with smaller weights."""
    _, train_dir, _ = shards
    norms = {}
    for wd in ("0", "0.5"):
        out = tmp_path / f"wd{wd}"
        r = _train("--data", str(train_dir), "--output", str(out), "--config", str(config), "--max-steps", "3",
                   "--optimizer", "adamw", "--lr", "0.01", "--weight-decay", wd, "--seed", "4", "--no-baseline")
        assert r.exit_code == 0, r.output
        assert json.loads((out / "config.json").read_text())["training"]["weight_decay"] == float(wd)
        model = load_model(out).model
        norms[wd] = sum(float(p.detach().double().pow(2).sum()) for p in model.parameters()) ** 0.5
    assert norms["0.5"] < norms["0"] * (1 - 1e-4), norms


def test_weight_decay_with_adagrad(shards, tmp_path):
    _, train_dir, _ = shards
    r = _train("--data", str(train_dir), "--output", str(tmp_path / "run"), "--optimizer", "adagrad",
               "--weight-decay", "0.1")
    _one_line_error(r, "weight_decay", "adagrad")
    assert not (tmp_path / "run").exists()

"""A published model as users download it (x_options.json + x_weights.hdf5) works with every command that reads a
biLM, under its own names and under names of the user's choosing; each mistake with the pair is one line, exit 1,
nothing written."""
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from elmo_cli.cli import app

REFERENCE = Path(__file__).parent / "data" / "reference"
FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
NAME = "elmo_2x256_64_test"
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def published(tmp_path) -> Path:
    """The reference model under the published naming: NAME_options.json beside NAME_weights.hdf5."""
    d = tmp_path / "downloads"
    d.mkdir()
    shutil.copy(REFERENCE / "options.json", d / f"{NAME}_options.json")
    shutil.copy(REFERENCE / "weights.hdf5", d / f"{NAME}_weights.hdf5")
    return d / f"{NAME}_options.json"


def _run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r, r.stdout + (r.stderr if r.stderr_bytes is not None else "")


def _one_line_error(r, text: str, *needles: str) -> None:
    assert r.exit_code == 1, text
    err = r.stderr.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def _vectors(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path) as f:
        return {k: f[k][...] for k in f if k != "sentence_to_index"}


def test_dump_with_the_options_file_alone_equals_the_reference(published, tmp_path):
    out = tmp_path / "v.hdf5"
    r, text = _run("dump-embeddings", REFERENCE / "sentences.txt", out, "--model", published)
    assert r.exit_code == 0, text
    got = _vectors(out)
    with h5py.File(REFERENCE / "expected_all.hdf5") as want:
        assert set(got) == {k for k in want if k != "sentence_to_index"}
        for k, v in got.items():
            np.testing.assert_allclose(v, want[k][...], atol=5e-6, rtol=0, err_msg=k)


def test_every_way_of_naming_the_pair_gives_the_same_vectors(published, tmp_path):
    odd = tmp_path / "odd"
    odd.mkdir()
    shutil.copy(published, odd / "my model.json")
    shutil.copy(published.with_name(f"{NAME}_weights.hdf5"), odd / "w.h5")
    base = tmp_path / "base.hdf5"
    assert _run("dump-embeddings", REFERENCE / "sentences.txt", base, "--model", published)[0].exit_code == 0
    ways = {
        "options+weights": ["--options", odd / "my model.json", "--weights", odd / "w.h5"],
        "model json + weights": ["--model", odd / "my model.json", "--weights", odd / "w.h5"],
        "-o output": ["-m", published],
    }
    want = _vectors(base)
    for label, args in ways.items():
        out = tmp_path / f"{label}.hdf5"
        where = ["-o", out] if label == "-o output" else [out]
        r, text = _run("dump-embeddings", REFERENCE / "sentences.txt", *where, *args)
        assert r.exit_code == 0, (label, text)
        got = _vectors(out)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want), label


def test_token_dump_export_and_evaluate_take_the_options_file(published, tmp_path):
    (tmp_path / "words.txt").write_text("the\ncat\n<UNK>\n")
    r, text = _run("dump-token-embeddings", "--model", published, "--vocab", tmp_path / "words.txt",
                   "-o", tmp_path / "tokens.hdf5")
    assert r.exit_code == 0, text
    with h5py.File(tmp_path / "tokens.hdf5") as f:
        assert f["embedding"].shape == (3, 64)
    r, text = _run("export", "--model", published, "-o", tmp_path / "model")
    assert r.exit_code == 0, text
    assert {"options.json", "weights.hdf5"} <= {p.name for p in (tmp_path / "model").iterdir()}
    with h5py.File(tmp_path / "model" / "weights.hdf5") as a, \
            h5py.File(published.with_name(f"{NAME}_weights.hdf5")) as b:
        np.testing.assert_array_equal(a["CNN_proj/W_proj"][...], b["CNN_proj/W_proj"][...])
    # published files carry no softmax: evaluate says how to get one, with a command that takes these files
    r, text = _run("evaluate", "--model", published, REFERENCE / "sentences.txt")
    _one_line_error(r, text, "no softmax weights", f"elmo-cli train --init-from {published}")


def test_train_init_from_the_options_file(published, tmp_path):
    from elmo_cli.bilm_format import load_bilm
    from vocab.shards import write_shards
    from vocab.vocabulary import build_vocab

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat .\na dog saw the cat .\n" * 20)
    build_vocab([corpus], tmp_path / "vocab.txt")
    write_shards([corpus], tmp_path / "vocab.txt", tmp_path / "shards")
    r, text = _run("train", "--data", tmp_path / "shards", "-o", tmp_path / "run", "--init-from", published,
                   "--max-steps", "2", "--batch-size", "4", "--unroll-steps", "5", "--n-negative-samples", "8",
                   "--threads", "1", "--device", "cpu")
    assert r.exit_code == 0, text
    assert "no softmax.hdf5" in text
    tuned = json.loads((tmp_path / "run" / "options.json").read_text())
    assert tuned["lstm"]["dim"] == 256 and tuned["lstm"]["projection_dim"] == 64
    # the same start given as --options/--weights under other names
    shutil.copy(published, tmp_path / "o.json")
    shutil.copy(published.with_name(f"{NAME}_weights.hdf5"), tmp_path / "w.h5")
    r, text = _run("train", "--data", tmp_path / "shards", "-o", tmp_path / "run2", "--options", tmp_path / "o.json",
                   "--weights", tmp_path / "w.h5", "--max-steps", "2", "--batch-size", "4", "--unroll-steps", "5",
                   "--n-negative-samples", "8", "--threads", "1", "--device", "cpu")
    assert r.exit_code == 0, text
    a = load_bilm(tmp_path / "run" / "options.json", tmp_path / "run" / "weights.hdf5")
    b = load_bilm(tmp_path / "run2" / "options.json", tmp_path / "run2" / "weights.hdf5")
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(va, vb, rtol=0, atol=0, msg=k)


def test_task_model_on_the_published_files_predicts_after_training(published, tmp_path):
    r, text = _run("task", "train", "--kind", "tagging", "--train", FIXTURES / "tiny.conllu", "--dev",
                   FIXTURES / "tiny.conllu", "--model", published, "-o", tmp_path / "tagger", "--epochs", "2",
                   "--device", "cpu")
    assert r.exit_code == 0, text
    config = json.loads((tmp_path / "tagger" / "config.json").read_text())
    assert config["elmo_model"] == str(published.resolve())
    assert config["elmo_weights"] == str(published.with_name(f"{NAME}_weights.hdf5").resolve())
    (tmp_path / "s.txt").write_text("the cat sat\n")
    r, text = _run("task", "predict", "--task", tmp_path / "tagger", tmp_path / "s.txt", "-o", tmp_path / "out.conll")
    assert r.exit_code == 0, text
    assert [line.split("\t")[0] for line in (tmp_path / "out.conll").read_text().split("\n") if line] == \
        ["the", "cat", "sat"]
    # the weights moved away: the task says which file it recorded
    published.with_name(f"{NAME}_weights.hdf5").unlink()
    r, text = _run("task", "predict", "--task", tmp_path / "tagger", tmp_path / "s.txt", tmp_path / "out2.conll")
    _one_line_error(r, text, "config.json", "weights file not found")
    assert not (tmp_path / "out2.conll").exists()


def _bad_pairs(published: Path, tmp_path: Path) -> dict[str, tuple[list, tuple[str, ...]]]:
    weights = published.with_name(f"{NAME}_weights.hdf5")
    lonely = tmp_path / "lonely_options.json"
    shutil.copy(published, lonely)
    nameless = tmp_path / "model.json"
    shutil.copy(published, nameless)
    cut_json = tmp_path / "cut_options.json"
    cut_json.write_bytes(published.read_bytes()[:40])
    cut_h5 = tmp_path / "cut_weights.hdf5"
    cut_h5.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    empty_h5 = tmp_path / "empty.hdf5"
    empty_h5.write_bytes(b"")
    return {
        "weights not beside": (["--model", lonely], ("lonely_weights.hdf5 is not beside it", "--weights")),
        "no options in the name": (["--model", nameless], ("cannot tell its weights file", "--weights F")),
        "options without weights": (["--options", published], ("needs --weights",)),
        "weights without options": (["--weights", weights], ("needs the options.json", "--options F or --model F")),
        "swapped": (["--options", weights, "--weights", published], ("swapped",)),
        "weights as model": (["--model", weights], ("an HDF5 file, not an options JSON file", "swapped")),
        "truncated options": (["--model", cut_json, "--weights", weights], ("cut_options.json", "not valid JSON")),
        "truncated weights": (["--options", published, "--weights", cut_h5], ("cut_weights.hdf5", "HDF5")),
        "empty weights": (["--options", published, "--weights", empty_h5], ("empty.hdf5", "not an HDF5")),
        "missing options": (["--model", tmp_path / "nope_options.json"], ("nope_options.json: not found",)),
        "cuda without cuda": (["--model", published, "--device", "cuda"], ("--device cuda", "CUDA is not available")),
    }


@pytest.mark.parametrize("case", ["weights not beside", "no options in the name", "options without weights",
                                  "weights without options", "swapped", "weights as model", "truncated options",
                                  "truncated weights", "empty weights", "missing options", "cuda without cuda"])
def test_bad_model_files_are_one_line_and_write_nothing(published, tmp_path, case):
    if case == "cuda without cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args, needles = _bad_pairs(published, tmp_path)[case]
    out = tmp_path / "out.hdf5"
    r, text = _run("dump-embeddings", REFERENCE / "sentences.txt", out, *args)
    _one_line_error(r, text, *needles)
    assert not out.exists() and not list(tmp_path.glob("out.hdf5*"))
    if case == "cuda without cuda":
        return  # export always works on the CPU
    r, text = _run("export", *args, "-o", tmp_path / "exported")
    _one_line_error(r, text, *needles)
    assert not (tmp_path / "exported").exists()

"""The embedding commands through the CLI: allennlp's reference reproduced, export, token cache, bad input."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from allennlp_reference import REFERENCE, SMALL_BATCH_WITHIN, WITHIN, assert_matches_reference, reference_layers
from elmo_cli.cli import app

MODEL_ARGS = ["--options", str(REFERENCE / "options.json"), "--weights", str(REFERENCE / "weights.hdf5")]
runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_thread")


def _invoke(args):
    result = runner.invoke(app, [str(a) for a in args])
    return result, result.output + (result.stderr if result.stderr_bytes is not None else "")


def _dumped_layers(path: Path) -> list[np.ndarray]:
    """A dump's datasets in line order (float32 checked), for `assert_matches_reference`."""
    with h5py.File(path) as f:
        assert all(f[str(i)].dtype == np.float32 for i in range(len(f) - 1))
        return [f[str(i)][...] for i in range(len(f) - 1)]


# The README's 5e-6 at the default --batch-size 64 (measured 4.77e-6); --batch-size 1 and 5 measure 5.72e-6, above
# it (the 120-token sentence, layer 2; fp32 rounding, see allennlp_reference).
@pytest.mark.parametrize("batch_size, within", [(None, WITHIN), ("1", SMALL_BATCH_WITHIN), ("5", SMALL_BATCH_WITHIN)])
def test_dump_embeddings_reproduces_allennlp_reference(tmp_path, batch_size, within):
    out = tmp_path / "out.hdf5"
    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, *MODEL_ARGS,
                            *(["--batch-size", batch_size] if batch_size else [])])
    assert result.exit_code == 0, text
    with h5py.File(out) as got, h5py.File(REFERENCE / "expected_all.hdf5") as want:
        assert sorted(got.keys()) == sorted(want.keys())
        assert json.loads(got["sentence_to_index"][0]) == json.loads(want["sentence_to_index"][0])
    assert_matches_reference(_dumped_layers(out), reference_layers(), within)
    assert not (tmp_path / "out.hdf5.partial").exists()


def test_existing_output_refused_without_force(tmp_path):
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"keep me")
    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, *MODEL_ARGS])
    assert result.exit_code == 1 and "already exists; pass --force" in text
    assert out.read_bytes() == b"keep me"
    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, *MODEL_ARGS, "--force",
                            "--layers", "average", "--dtype", "float16", "--compression", "gzip"])
    assert result.exit_code == 0, text
    with h5py.File(out) as f:
        assert f["0"].dtype == np.float16 and f["0"].ndim == 2


def test_bad_inputs_exit_1_and_leave_no_output(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nstill ok\n caf\xe9 au lait\n")
    out = tmp_path / "out.hdf5"
    result, text = _invoke(["dump-embeddings", bad, out, *MODEL_ARGS])
    assert result.exit_code == 1 and "bad.txt:3: invalid UTF-8 at byte offset 4" in text
    assert not out.exists()

    options = json.loads((REFERENCE / "options.json").read_text())
    options["lstm"]["projection_dim"] = 32
    (tmp_path / "options.json").write_text(json.dumps(options))
    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, "--options",
                            tmp_path / "options.json", "--weights", REFERENCE / "weights.hdf5"])
    assert result.exit_code == 1
    assert "CNN_proj/W_proj has shape (128, 64), options.json implies (128, 32)" in text
    assert "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0 has shape (256, 64)" in text
    assert not out.exists()

    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, "--options",
                            REFERENCE / "options.json", "--weights", tmp_path / "missing.hdf5"])
    assert result.exit_code == 1 and "missing.hdf5: weights file not found" in text
    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, *MODEL_ARGS, "--mix", "1,2"])
    assert result.exit_code == 1 and "2 weights but this model has 3 layers" in text
    result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, *MODEL_ARGS, "--threads", "0"])
    assert result.exit_code == 1 and "--threads must be at least 1" in text
    assert not out.exists()


def test_export_then_token_cache_then_cached_dump(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    options = json.loads((REFERENCE / "options.json").read_text())
    options["char_cnn"]["n_characters"] = 261  # a training-time options file
    options["n_epochs"] = 3
    (run / "options.json").write_text(json.dumps(options))
    shutil.copy(REFERENCE / "weights.hdf5", run / "weights.hdf5")
    (run / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n,\n.\nand\n", encoding="utf-8")
    (run / "checkpoint.pt").write_bytes(b"training state, not exported")
    export = tmp_path / "export"
    result, text = _invoke(["export", "--model", run, "--output", export])
    assert result.exit_code == 0, text
    assert sorted(p.name for p in export.iterdir()) == ["options.json", "vocab.txt", "weights.hdf5"]
    exported = json.loads((export / "options.json").read_text())
    assert exported["char_cnn"]["n_characters"] == 262 and "n_epochs" not in exported
    with h5py.File(REFERENCE / "weights.hdf5") as a, h5py.File(export / "weights.hdf5") as b:
        names = []
        a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert all(np.array_equal(a[n][...], b[n][...]) for n in names)
    result, text = _invoke(["export", "--model", run, "--output", export])
    assert result.exit_code == 1 and "already exists" in text
    # the run's options.json names the same model directory: its vocabulary comes along too
    result, text = _invoke(["export", "--model", run / "options.json", "--output", tmp_path / "export2"])
    assert result.exit_code == 0, text
    assert sorted(p.name for p in (tmp_path / "export2").iterdir()) == ["options.json", "vocab.txt", "weights.hdf5"]

    cache = tmp_path / "cache.hdf5"
    result, text = _invoke(["dump-token-embeddings", "--model", export, "--vocab", export / "vocab.txt",
                            "--output", cache])
    assert result.exit_code == 0, text
    with h5py.File(cache) as f:
        assert f["embedding"].shape == (7, 64)
    plain, cached = tmp_path / "plain.hdf5", tmp_path / "cached.hdf5"
    for out, extra in ((plain, []), (cached, ["--token-cache", cache])):
        result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, "--model", export, *extra])
        assert result.exit_code == 0, text
    with h5py.File(plain) as a, h5py.File(cached) as b:
        for key in a:
            if key != "sentence_to_index":
                np.testing.assert_allclose(b[key][...], a[key][...], atol=1e-6, rtol=0)


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed")
def test_torchrun_two_ranks_write_one_file(tmp_path):
    out = tmp_path / "out.hdf5"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with socket.socket() as sock:  # a free port, so parallel runs do not collide
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-port", str(port),
           "-m", "elmo_cli.cli", "dump-embeddings", str(REFERENCE / "sentences.txt"), str(out), *map(str, MODEL_ARGS),
           "--batch-size", "3", "--device", "cpu"]  # gloo: the CPU path, also where a GPU is present
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.hdf5"]  # part files removed
    with h5py.File(out) as got, h5py.File(REFERENCE / "expected_all.hdf5") as want:
        assert sorted(got.keys()) == sorted(want.keys())
        assert list(got.keys())[:3] == ["0", "1", "2"]  # in line order
        assert json.loads(got["sentence_to_index"][0]) == json.loads(want["sentence_to_index"][0])
    # each rank embeds its 8 lines in batches of 3: measured 5.72e-6, as --batch-size 1 to 6 in one process
    assert_matches_reference(_dumped_layers(out), reference_layers(), SMALL_BATCH_WITHIN)
    # the summary counts every rank's tokens, not rank 0's share
    words = sum(len(line.split()) for line in (REFERENCE / "sentences.txt").read_text(encoding="utf-8").splitlines())
    assert f"16 lines, {words} tokens embedded" in " ".join(proc.stdout.split()), proc.stdout


def test_model_dir_with_sentencepiece_tokenizes_with_it(tmp_path):
    from vocab.vocabulary import spm_path_for, train_sentencepiece

    model = tmp_path / "model"
    model.mkdir()
    for name in ("options.json", "weights.hdf5"):
        shutil.copy(REFERENCE / name, model / name)
    raw = Path(__file__).parent.parent / "examples" / "austen_raw_sample.txt"
    train_sentencepiece([raw], tmp_path / "sp" / "vocab.txt", vocab_size=300)
    shutil.copy(spm_path_for(tmp_path / "sp" / "vocab.txt"), model / "spm.model")
    text = tmp_path / "in.txt"
    text.write_text("Elinor, who was the eldest daughter.\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result, output = _invoke(["dump-embeddings", text, out, "--model", model])
    assert result.exit_code == 0, output
    from vocab.tokenize import TextEncoder

    pieces = TextEncoder.from_dir(model).tokenize("Elinor, who was the eldest daughter.")
    assert len(pieces) > 6  # pieces, not the 6 whitespace tokens
    with h5py.File(out) as f:
        assert f["0"].shape == (3, len(pieces), 128)


def _sentence_keyed_input(tmp_path) -> tuple[Path, list[str]]:
    """The reference sentences without '/', one with spaces around it, "..." (a valid name), and a repeat of the
    first."""
    lines = [line for line in (REFERENCE / "sentences.txt").read_text("utf-8").splitlines() if "/" not in line]
    lines = lines[:2] + ["  " + lines[2] + " \t", "..."] + lines[3:] + [lines[0]]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


def test_sentence_keys_name_datasets_by_sentence(tmp_path):
    path, lines = _sentence_keyed_input(tmp_path)
    by_index, by_sentence = tmp_path / "index.hdf5", tmp_path / "keys.hdf5"
    result, text = _invoke(["dump-embeddings", path, by_index, *MODEL_ARGS, "--batch-size", "4"])
    assert result.exit_code == 0, text
    result, text = _invoke(["dump-embeddings", path, by_sentence, *MODEL_ARGS, "--batch-size", "4",
                            "--use-sentence-keys"])
    assert result.exit_code == 0, text
    assert "1 line(s) repeat an earlier sentence" in text and f"{len(lines) - 1} datasets for {len(lines)} lines" \
        in " ".join(text.split())
    sentences = [line.strip() for line in lines[:-1]]  # the last line repeats the first
    with h5py.File(by_index) as want, h5py.File(by_sentence) as got:
        assert list(got.keys()) == sentences  # the stripped text, in input order, once each, no sentence_to_index
        for i, line in enumerate(lines):  # equal up to the float order of different batches
            np.testing.assert_allclose(got[line.strip()][...], want[str(i)][...], atol=1e-5, rtol=0, err_msg=line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "index.hdf5", "keys.hdf5"]


@pytest.mark.parametrize("bad, message", [
    ("and/or", "in.txt:2: the sentence contains '/', the HDF5 path separator"),
    ("", "in.txt:2: blank line, and with --use-sentence-keys a dataset is named by its sentence"),
    (" \t ", "in.txt:2: blank line"),
    (" . ", "in.txt:2: the sentence '.' cannot name a dataset"),
])
def test_sentence_keys_refuse_names_hdf5_cannot_hold(tmp_path, bad, message):
    path = tmp_path / "in.txt"
    path.write_text(f"a fine line\n{bad}\nanother line\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result, text = _invoke(["dump-embeddings", path, out, *MODEL_ARGS, "--use-sentence-keys"])
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and message in " ".join(result.stderr.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]  # no output, no partial file


def test_sentence_keys_with_stateful_refuse_a_repeat(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("the cat sat\na dog\nthe cat sat\n", encoding="utf-8")
    out = tmp_path / "out.hdf5"
    result, text = _invoke(["dump-embeddings", path, out, *MODEL_ARGS, "--use-sentence-keys", "--stateful"])
    assert result.exit_code == 1
    assert "in.txt:3: repeats line 1, and with --stateful the vectors" in " ".join(text.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    # Without a repeat the carried-state vectors are those of the index-keyed stateful dump.
    path.write_text("the cat sat\na dog\nthe dog sat\n", encoding="utf-8")
    for name, extra in (("keys.hdf5", ["--use-sentence-keys"]), ("index.hdf5", [])):
        result, text = _invoke(["dump-embeddings", path, tmp_path / name, *MODEL_ARGS, "--stateful",
                                "--batch-size", "1", *extra])
        assert result.exit_code == 0, text
    with h5py.File(tmp_path / "keys.hdf5") as got, h5py.File(tmp_path / "index.hdf5") as want:
        assert list(got.keys()) == ["the cat sat", "a dog", "the dog sat"]
        for i, key in enumerate(got.keys()):
            np.testing.assert_allclose(got[key][...], want[str(i)][...], atol=1e-5, rtol=0)


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun not installed")
def test_torchrun_two_ranks_with_sentence_keys(tmp_path):
    path, lines = _sentence_keyed_input(tmp_path)
    out, single = tmp_path / "out.hdf5", tmp_path / "single.hdf5"
    result, text = _invoke(["dump-embeddings", path, single, *MODEL_ARGS, "--use-sentence-keys"])
    assert result.exit_code == 0, text
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-port", str(port),
           "-m", "elmo_cli.cli", "dump-embeddings", str(path), str(out), *map(str, MODEL_ARGS), "--batch-size", "3",
           "--use-sentence-keys", "--device", "cpu"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.hdf5", "single.hdf5"]
    with h5py.File(out) as got, h5py.File(single) as want:
        assert list(got.keys()) == list(want.keys()) == [line.strip() for line in lines[:-1]]
        for key in want:
            np.testing.assert_allclose(got[key][...], want[key][...], atol=1e-5, rtol=0)

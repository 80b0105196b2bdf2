"""Serving: the exported biLM (ONNX in onnxruntime, torch.export .pt2) equals the dump and allennlp; exported task
models give the PyTorch model's labels; the worked example runs without torch; every bad input is one line, exit 1,
and leaves no file under the final name.

Exporting costs seconds (tracing, not weights), so each exported file is made once per module: the reference model
(2x256_64, allennlp's expected values beside it) as ONNX and .pt2, `small` once, and two task models.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from allennlp_reference import WITHIN, assert_matches_reference
from elmo_cli.bilm_format import save_model_dir
from elmo_cli.cli import app
from elmo_cli.embed import Embedder
from elmo_cli.model import BiLM
from elmo_cli.presets import PRESETS
from elmo_cli.graph_export import char_batch, read_metadata
from elmo_cli.tasks.cli import task_app
from elmo_cli.tasks.train import TrainSettings, train_task
from vocab.chars import ByteChars

ort = pytest.importorskip("onnxruntime", reason='the serve extra: pip install -e ".[serve]" (make test installs it)')

REFERENCE = Path(__file__).parent / "data" / "reference"
EXAMPLE = Path(__file__).parent.parent / "examples" / "serve_onnx.py"
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")

# Hard sentences: one token, a token of exactly 50 bytes and longer ones (cut at 48 bytes, a three-byte character
# cut), non-ASCII, literal boundary tokens, and 60 tokens.
HARD = [
    ["Hello"],
    ["x" * 50, "and", "y" * 70],
    ["長" * 20, "Café", "naïve", "🙂", "\u00a0nbsp"],
    ["<S>", "literal", "</S>"],
    [f"w{k}" for k in range(60)],
    ["a"],
]


def _run(app_, *args):
    r = runner.invoke(app_, [str(a) for a in args])
    return r, r.stdout + (r.stderr if r.stderr_bytes is not None else "")


def _one_line_error(r, *needles):
    assert r.exit_code == 1, r.stdout
    err = r.stderr.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def _session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _layers(session, sentences):
    layers, mask = session.run(["layers", "mask"], {"char_ids": char_batch(ByteChars(), sentences)})
    return layers, mask


def _assert_equal_to_dump(embedder, session, sentences, batch, atol=WITHIN):
    """ONNX layers at batch `batch` vs the dump's (Embedder, stateless) for every sentence, within docs/serving.md's
    5e-6 (allennlp's reference bound; measured 4.3e-6 on the reference model); padding zero."""
    want = embedder.embed_sentences(sentences, batch_size=64)
    for s in range(0, len(sentences), batch):
        part = sentences[s : s + batch]
        layers, mask = _layers(session, part)
        for b, sent in enumerate(part):
            n = len(sent)
            assert mask[b].tolist() == [True] * n + [False] * (mask.shape[1] - n)
            np.testing.assert_allclose(layers[b, :, :n], want[s + b], atol=atol, rtol=0, err_msg=" ".join(sent))
            assert not layers[b, :, n:].any()


@pytest.fixture(scope="module")
def reference_onnx(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "model.onnx"
    r, text = _run(app, "export", "--model", REFERENCE, "--format", "onnx", "--output", out)
    assert r.exit_code == 0, text
    return out


@pytest.fixture(scope="module")
def sentences():
    lines = [line.split() for line in (REFERENCE / "sentences.txt").read_text(encoding="utf-8").splitlines()]
    return [s for s in lines if s] + HARD


def test_onnx_equals_allennlp_reference(reference_onnx, sentences):
    """Within the 5e-6 docs/serving.md states (allennlp's reference bound; measured 4.8e-6), in one batch and one
    sentence at a time."""
    session = _session(reference_onnx)
    with h5py.File(REFERENCE / "expected_all.hdf5") as f:
        index = json.loads(f["sentence_to_index"][0])
        ref = [s for s in sentences if " ".join(s) in index]
        want = [f[index[" ".join(s)]][...] for s in ref]
    layers, _ = _layers(session, ref)
    assert_matches_reference([layers[b, :, : len(s)] for b, s in enumerate(ref)], want, WITHIN)
    assert_matches_reference([_layers(session, [s])[0][0] for s in ref], want, WITHIN)
    assert len(ref) >= 15


def test_onnx_equals_the_dump_at_batch_1_and_64(reference_onnx, sentences):
    embedder = Embedder(REFERENCE, device="cpu")
    session = _session(reference_onnx)
    batch64 = (sentences * 4)[:64]  # lengths 1 to 120 in one batch
    assert {1, 60} <= {len(s) for s in batch64}
    _assert_equal_to_dump(embedder, session, batch64, 64)
    _assert_equal_to_dump(embedder, session, sentences, 1)


def test_onnx_file_carries_chars_options_and_dynamic_axes(reference_onnx):
    meta = read_metadata(reference_onnx)
    assert json.loads(meta["elmo_cli.chars"]) == ByteChars().to_json()
    assert json.loads(meta["elmo_cli.options"]) == json.loads((REFERENCE / "options.json").read_text())
    session = _session(reference_onnx)
    (char_ids,) = session.get_inputs()
    assert char_ids.name == "char_ids" and char_ids.type == "tensor(int64)" and char_ids.shape[2] == 50
    assert all(isinstance(d, str) for d in char_ids.shape[:2])  # dynamic batch and token axes
    assert [o.name for o in session.get_outputs()] == ["layers", "mask"]


def test_torch_export_program_equals_the_dump(tmp_path, sentences):
    out = tmp_path / "model.pt2"
    r, text = _run(app, "export", "--model", REFERENCE / "options.json", "--weights", REFERENCE / "weights.hdf5",
                   "--format", "torch-export", "-o", out)
    assert r.exit_code == 0, text
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt2"]
    meta = read_metadata(out)
    assert json.loads(meta["elmo_cli.options"])["lstm"]["projection_dim"] == 64
    program = torch.export.load(str(out)).module()
    want = Embedder(REFERENCE, device="cpu").embed_sentences(HARD)
    with torch.no_grad():
        layers, mask = program(torch.from_numpy(char_batch(ByteChars(), HARD)))
    for b, s in enumerate(HARD):
        np.testing.assert_allclose(layers[b, :, : len(s)].numpy(), want[b], atol=WITHIN, rtol=0)
    assert mask.sum(1).tolist() == [len(s) for s in HARD]


def test_small_shape_onnx_equals_the_dump(tmp_path, sentences):
    torch.manual_seed(0)
    save_model_dir(BiLM(PRESETS["small"].config.model), tmp_path / "small")
    out = tmp_path / "small.onnx"
    r, text = _run(app, "export", "--model", tmp_path / "small", "--format", "onnx", "-o", out)
    assert r.exit_code == 0, text
    # A short batch at `small` (the reference shape above covers batch 64).
    embedder, session = Embedder(tmp_path / "small", device="cpu"), _session(out)
    _assert_equal_to_dump(embedder, session, HARD, len(HARD))
    _assert_equal_to_dump(embedder, session, HARD[:2], 1)


def test_example_runs_without_torch_or_elmo_cli(reference_onnx, tmp_path):
    """examples/serve_onnx.py in a fresh interpreter: the same vectors as the dump, and neither torch nor
    elmo_cli imported."""
    sentence = "Café naïve " + "x" * 55 + " <S> end"
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'elmo_cli')]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code, str(EXAMPLE), str(reference_onnx), sentence,
                        str(tmp_path / "v.npy")], capture_output=True, text=True, env={**os.environ,
                        "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert "5 tokens -> layers (1, 3, 5, 128)" in r.stdout
    want = Embedder(REFERENCE, device="cpu").embed_sentence(sentence.split())
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), want, atol=1e-4, rtol=0)


# ---- task models ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A tiny random biLM and the toy tagging / classification data of test_tasks_model."""
    from test_tasks_model import CONFIG, GRAMMAR, toy_sentences, write_classification, write_tagging
    from vocab.tokenize import TextEncoder
    from vocab.vocabulary import Vocabulary

    d = tmp_path_factory.mktemp("toy")
    torch.manual_seed(0)
    words = sorted({w for ws in GRAMMAR.values() for w in ws})
    save_model_dir(BiLM(CONFIG, vocab_size=len(words) + 3), d / "bilm")
    TextEncoder(Vocabulary(["<S>", "</S>", "<UNK>"] + words)).save_to(d / "bilm")
    lines = [" ".join(s) for s, _ in toy_sentences(30, 2)] + ["zebra", "the ünknown cat " + "z" * 60,
                                                              " ".join(["the old dog sees a cat ."] * 9)]
    (d / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"bilm": d / "bilm", "dir": d, "train": write_tagging(d / "train.conll", toy_sentences(48, 0)),
            "dev": write_tagging(d / "dev.conll", toy_sentences(16, 1)),
            "train_tsv": write_classification(d / "train.tsv", toy_sentences(48, 0)),
            "dev_tsv": write_classification(d / "dev.tsv", toy_sentences(16, 1))}


def _same_labels_both_ways(task, onnx_dir, text, tmp_path) -> str:
    """`task predict --task` and `--onnx` on the same file write the same labels; returns them."""
    r, out = _run(task_app, "predict", "--task", task, text, tmp_path / "torch.out")
    assert r.exit_code == 0, out
    r, out = _run(task_app, "predict", "--onnx", onnx_dir, text, tmp_path / "onnx.out")
    assert r.exit_code == 0, out
    got, want = (tmp_path / "onnx.out").read_text(), (tmp_path / "torch.out").read_text()
    assert got == want and len(want.splitlines()) >= 33
    return want


@pytest.mark.parametrize("kind,elmo,elmo_output", [("tagging", "mix", True), ("classification", "none", False)])
def test_task_onnx_gives_the_pytorch_labels(toy, tmp_path, kind, elmo, elmo_output):
    train, dev = (toy["train"], toy["dev"]) if kind == "tagging" else (toy["train_tsv"], toy["dev_tsv"])
    task = tmp_path / "task"
    train_task(TrainSettings(kind=kind, train_path=train, dev_path=dev, output=task, elmo=elmo,
                             model_dir=toy["bilm"] if elmo != "none" else None, elmo_output=elmo_output, epochs=2,
                             batch_size=8, lr=0.02, word_dim=16, hidden_dim=16, max_length=20))
    r, text = _run(task_app, "export", "--task", task, "--format", "onnx", "--output", tmp_path / "onnx")
    assert r.exit_code == 0, text
    info = json.loads((tmp_path / "onnx" / "task.json").read_text())
    assert info["unknown_word_id"] == 1 and (tmp_path / "onnx" / "words.txt").read_text().split("\n")[1] == "<UNK>"
    _same_labels_both_ways(task, tmp_path / "onnx", toy["dir"] / "in.txt", tmp_path)
    inputs = [i.name for i in _session(tmp_path / "onnx" / "model.onnx").get_inputs()]
    assert inputs == (["char_ids", "word_ids"] if elmo != "none" else ["word_ids"])
    if kind == "tagging":  # a different vocabulary beside the graph is refused
        words = tmp_path / "onnx" / "words.txt"
        words.write_text(words.read_text().replace("cat", "kat"))
        r, _ = _run(task_app, "predict", "--onnx", tmp_path / "onnx", toy["dir"] / "in.txt", tmp_path / "bad.out")
        _one_line_error(r, "words.txt", "different vocabulary")
        assert not (tmp_path / "bad.out").exists()


# ---- bad input: one line, exit 1, nothing under the final name ------------------------------------------------------
def _no_files(directory: Path) -> None:
    assert not [p.name for p in directory.iterdir() if p.name != "src"], list(directory.iterdir())


def test_model_directory_without_weights(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "options.json").write_text((REFERENCE / "options.json").read_text())
    r, _ = _run(app, "export", "--model", tmp_path / "src", "--format", "onnx", "-o", tmp_path / "m.onnx")
    _one_line_error(r, "weights")
    _no_files(tmp_path)


def test_unknown_format(tmp_path):
    r, _ = _run(app, "export", "--model", REFERENCE, "--format", "tflite", "-o", tmp_path / "m.onnx")
    _one_line_error(r, "--format 'tflite'", "onnx", "torch-export")
    _no_files(tmp_path)


def test_task_directory_of_an_older_layout(tmp_path):
    old = tmp_path / "src"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"format_version": 0, "kind": "tagging"}))
    (old / "weights.pt").write_bytes(b"")
    r, _ = _run(task_app, "export", "--task", old, "-o", tmp_path / "out")
    _one_line_error(r, "format version 1")
    _no_files(tmp_path)


def test_missing_serving_packages_name_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    r, _ = _run(app, "export", "--model", REFERENCE, "--format", "onnx", "-o", tmp_path / "m.onnx")
    _one_line_error(r, "onnxscript", 'pip install -e ".[serve]"')
    _no_files(tmp_path)


def test_predict_needs_one_of_task_and_onnx(tmp_path):
    (tmp_path / "in.txt").write_text("a b\n")
    r, _ = _run(task_app, "predict", tmp_path / "in.txt", tmp_path / "out")
    _one_line_error(r, "--task", "--onnx")


HEADS = {"crf": {"crf": True}, "char_cnn": {"char_cnn": True}, "fine_tune_bilm": {"fine_tune_bilm": True},
         "all": {"crf": True, "char_cnn": True, "fine_tune_bilm": True}}
SPANS = {"DET": "B-NP", "ADJ": "I-NP", "NOUN": "I-NP", "VERB": "O", "PUNCT": "O"}  # BIO: the CRF's constraints


def _train_tiny(toy, task, flags, epochs=2):
    from test_tasks_model import toy_sentences, write_tagging

    train, dev = toy["train"], toy["dev"]
    if flags.get("crf"):
        train, dev = (write_tagging(task.with_name(f"spans-{n}.conll"),
                                    [(s, [SPANS[t] for t in tags]) for s, tags in toy_sentences(n, seed)])
                      for n, seed in ((48, 0), (16, 1)))
    elmo = "mix" if flags.get("fine_tune_bilm") else "none"
    train_task(TrainSettings(kind="tagging", train_path=train, dev_path=dev, output=task, elmo=elmo,
                             model_dir=toy["bilm"] if elmo != "none" else None, epochs=epochs, batch_size=8,
                             lr=0.02, word_dim=8, hidden_dim=8, max_length=20, **flags))


@pytest.mark.parametrize("head", list(HEADS))
def test_every_tagger_exports_and_gives_the_pytorch_labels(toy, tmp_path, head):
    """--crf (Viterbi in the graph), --char-cnn (its own word_chars input), --fine-tune-bilm (the tuned biLM in the
    graph) and all three: onnxruntime labels the whole test file (unknown words, a word over 22 bytes, a sentence
    split at max_length) exactly as PyTorch does."""
    task = tmp_path / "task"
    _train_tiny(toy, task, HEADS[head])
    r, text = _run(task_app, "export", "--task", task, "--format", "onnx", "--output", tmp_path / "onnx")
    assert r.exit_code == 0, text
    info = json.loads((tmp_path / "onnx" / "task.json").read_text())
    want_inputs = ((["char_ids"] if head in ("fine_tune_bilm", "all") else []) + ["word_ids"] +
                   (["word_chars"] if head in ("char_cnn", "all") else []))
    assert [i.name for i in _session(tmp_path / "onnx" / "model.onnx").get_inputs()] == want_inputs
    assert info["inputs"] == want_inputs and info["crf"] == HEADS[head].get("crf", False)
    want = _same_labels_both_ways(task, tmp_path / "onnx", toy["dir"] / "in.txt", tmp_path)
    if head in ("crf", "all"):  # the graph decoded only the moves BIO allows: no I-NP after O or at a start
        assert info["decoding"] == "crf viterbi in the graph"
        for block in want.strip().split("\n\n"):
            labels = ["O"] + [line.split("\t")[1] for line in block.splitlines()]
            assert not any(a == "O" and b == "I-NP" for a, b in zip(labels, labels[1:])), block


def test_task_export_refuses_a_graph_that_does_not_give_the_pytorch_labels(toy, tmp_path, monkeypatch):
    from elmo_cli.tasks.graph_export import TaskGraph

    task = tmp_path / "src"
    _train_tiny(toy, task, HEADS["crf"], epochs=1)
    real = TaskGraph.forward

    def wrong(self, *inputs):  # a graph that labels every token one label further on
        label_ids, scores = real(self, *inputs)
        return (label_ids + 1) % scores.shape[-1], scores

    monkeypatch.setattr(TaskGraph, "forward", wrong)
    r, _ = _run(task_app, "export", "--task", task, "--format", "onnx", "-o", tmp_path / "out")
    _one_line_error(r, "labels other than the PyTorch model's", "nothing written", "task predict --task")
    assert not [p.name for p in tmp_path.iterdir() if not p.name.startswith(("src", "spans"))]

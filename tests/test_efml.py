"""ELMoForManyLangs models as they are unzipped: every command reads them and gives EFML's own vectors.

The two models under tests/data/efml were made by EFML's own classes and its vectors by its own
``Embedder.sents2elmo(..., output_layer=-2)`` (tests/data/efml/make_fixture.py, which needs elmoformanylangs; elmo-cli
never imports it): ``words`` embeds words beside the characters (as the published models do) and was saved in
torch's legacy pickle format, ``chars_only`` has no word embedding, a tanh CNN and one highway. The sentences hold
unknown words and characters, 49- and 60-character tokens, non-Latin scripts, literal ``<bos>``/``<S>`` tokens and a
one-token sentence.
"""
import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from elmo_cli.cli import app
from elmo_cli.embed import Embedder
from elmo_cli.tasks.cli import task_app
from vocab.efml import efml_chars, read_dictionary

EFML = Path(__file__).parent / "data" / "efml"
SENTENCES = EFML / "sentences.txt"
MODELS = ("words", "chars_only")
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


def expected(model: str) -> list[np.ndarray]:
    with h5py.File(EFML / f"{model}_expected.hdf5", "r") as f:
        return [f[str(i)][...] for i in range(len(f))]


def close_to_efml(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Every sentence within 1e-5 of the largest value (EFML computes in another order, in float32)."""
    assert len(got) == len(want)
    scale = max(float(np.abs(w).max()) for w in want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (k, g.shape, w.shape)
        assert np.abs(g - w).max() <= 1e-5 * scale, (k, float(np.abs(g - w).max()), scale)


def _invoke(application, *args):
    return runner.invoke(application, [str(a) for a in args])


def _dump(model, out: Path, *extra) -> list[np.ndarray]:
    r = _invoke(app, "dump-embeddings", "--model", model, SENTENCES, "-o", out, "--force", *extra)
    assert r.exit_code == 0, r.stdout + (r.stderr or "")
    with h5py.File(out, "r") as f:
        return [f[str(i)][...] for i in range(len(SENTENCES.read_text("utf-8").splitlines()))]


@pytest.mark.parametrize("model", MODELS)
def test_dump_gives_efml_own_vectors(model, tmp_path):
    got = _dump(EFML / model, tmp_path / "all.hdf5", "--layers", "all")
    close_to_efml(got, expected(model))
    average = _dump(EFML / model, tmp_path / "avg.hdf5", "--layers", "average")  # EFML's output_layer=-1
    close_to_efml(average, [w.mean(axis=0) for w in expected(model)])


def test_embedder_api_reads_the_directory_or_its_config_json():
    sentences = [line.split() for line in SENTENCES.read_text("utf-8").splitlines()]
    for model in (EFML / "words", EFML / "words" / "config.json"):
        got = Embedder(str(model), device="cpu").embed_sentences(sentences)
        close_to_efml([np.asarray(g) for g in got], expected("words"))


def test_character_rows_as_efml_code_assigns_them():
    """Position 0 holds char.dic's <eow> row and the end of the word its <bow> row (frontend.create_one_batch);
    <bos>/<eos> are the boundary rows; the word id is that of the token cut to 48 characters."""
    chars, rows = efml_chars(EFML / "words")
    cdic = read_dictionary(EFML / "words" / "char.dic", ())
    wdic = read_dictionary(EFML / "words" / "word.dic", ())
    row = chars.encode("cat")
    assert [rows[i] for i in row[:5]] == [cdic["<eow>"], cdic["c"], cdic["a"], cdic["t"], cdic["<bow>"]]
    assert all(rows[i] == cdic["<pad>"] for i in row[5:50])
    assert row[50] == wdic["cat"]
    unknown = chars.encode("😀x")
    assert rows[unknown[1]] == cdic["<oov>"] and unknown[50] == wdic["<oov>"]
    bos = chars.encode("<bos>")
    assert [rows[i] for i in bos[:3]] == [cdic["<eow>"], cdic["<bos>"], cdic["<bow>"]] and bos[50] == wdic["<bos>"]
    assert [rows[i] for i in chars.encode("<S>")[1:4]] == [cdic["<"], cdic["<oov>"], cdic[">"]]  # not a boundary
    long_word = next(w for w in wdic if len(w) == 48)  # a 60-character token in the sentences starts with it
    assert chars.encode(long_word + "x" * 12)[50] == wdic[long_word]


def test_export_keeps_the_vectors_and_onnx_runs_them(tmp_path):
    r = _invoke(app, "export", "--model", EFML / "words", "-o", tmp_path / "exported")
    assert r.exit_code == 0, r.stdout
    options = json.loads((tmp_path / "exported" / "options.json").read_text())
    assert options["char_cnn"]["word_embedding"]["dim"] == 8
    assert json.loads((tmp_path / "exported" / "chars.json").read_text())["mode"] == "efml"
    direct = _dump(EFML / "words", tmp_path / "a.hdf5", "--layers", "all")
    for a, b in zip(direct, _dump(tmp_path / "exported", tmp_path / "b.hdf5", "--layers", "all")):
        np.testing.assert_array_equal(a, b)
    ort = pytest.importorskip("onnxruntime")
    from elmo_cli.graph_export import char_batch
    from vocab.chars import read_chars

    r = _invoke(app, "export", "--model", EFML / "words", "--format", "onnx", "-o", tmp_path / "m.onnx")
    assert r.exit_code == 0, r.stdout
    sentences = [line.split() for line in SENTENCES.read_text("utf-8").splitlines()]
    ids = char_batch(read_chars(tmp_path / "exported" / "chars.json"), sentences)  # (B, T, 51): words last
    assert ids.shape[-1] == 51
    layers = ort.InferenceSession(str(tmp_path / "m.onnx")).run(["layers"], {"char_ids": ids})[0]
    # This model's values reach 6 (clipped cells, residual). onnxruntime's fp32 products sum in another order than
    # torch's: measured 5.2e-6 x that scale on 2 cores of an Intel Xeon (AVX-512), under 5e-6 x it (the bound
    # before) on AMD EPYCs.
    scale = max(float(np.abs(w).max()) for w in direct)
    for b, want in enumerate(direct):
        assert np.abs(layers[b, :, : want.shape[1]] - want).max() < 1e-5 * scale


def test_token_cache_and_dump_with_it(tmp_path):
    words = ["the", "cat", "москва", "北京", "zebras"]
    (tmp_path / "words.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    r = _invoke(app, "dump-token-embeddings", "--model", EFML / "words", "--vocab", tmp_path / "words.txt",
                "-o", tmp_path / "cache.hdf5")
    assert r.exit_code == 0, r.stdout
    with h5py.File(tmp_path / "cache.hdf5", "r") as f:
        cache = f["embedding"][...]
    layer0 = expected("words")[0][0]  # "the cat sat on the mat .": the token layer, both halves equal
    np.testing.assert_allclose(cache[0], layer0[0, :8], atol=1e-5)
    np.testing.assert_allclose(cache[1], layer0[1, :8], atol=1e-5)
    got = _dump(EFML / "words", tmp_path / "cached.hdf5", "--layers", "all", "--token-cache", tmp_path / "cache.hdf5")
    close_to_efml(got, expected("words"))


def test_fine_tune_a_published_model_on_new_text(tmp_path):
    """shard with the model's dictionaries, train --init-from: the dictionaries and vectors carry over."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nмосква большой город .\nthe dog and the fox .\n" * 30, "utf-8")
    for args in (("build-vocab", corpus, "-o", tmp_path / "vocab.txt"),
                 ("shard", corpus, "--vocab", tmp_path / "vocab.txt", "--chars", EFML / "words", "-o",
                  tmp_path / "shards"),
                 ("train", "--data", tmp_path / "shards", "--output", tmp_path / "run", "--init-from",
                  EFML / "words", "--max-steps", 2, "--batch-size", 4, "--seed", 1)):
        r = _invoke(app, *args)
        assert r.exit_code == 0, (args[0], r.stdout)
    source = efml_chars(EFML / "words")[0].to_json()
    assert json.loads((tmp_path / "run" / "chars.json").read_text()) == source
    with h5py.File(tmp_path / "run" / "weights.hdf5", "r") as f:
        tuned = f["word_embed"][...]
    state = torch.load(EFML / "words" / "token_embedder.pkl", weights_only=True)
    original = state["word_emb_layer.embedding.weight"].numpy()
    assert tuned.shape == original.shape
    wdic = read_dictionary(EFML / "words" / "word.dic", ())
    seen = {wdic.get(w, wdic["<oov>"]) for w in corpus.read_text("utf-8").split()} | {wdic["<bos>"], wdic["<eos>"]}
    unseen = sorted(set(range(len(original))) - seen)
    assert unseen and np.array_equal(tuned[unseen], original[unseen])  # words the text lacks keep EFML's vectors
    assert np.abs(tuned[sorted(seen)] - original[sorted(seen)]).max() > 0  # the text's own words were tuned


def test_tagger_on_an_efml_model(tmp_path):
    conllu = "".join(
        f"# text = {s}\n" + "".join(f"{i}\t{w}\t_\t{t}\t_\t_\t_\t_\t_\t_\n"
                                    for i, (w, t) in enumerate(zip(s.split(), tags.split()), 1)) + "\n"
        for s, tags in [("the cat sat", "DET NOUN VERB"), ("москва большой город", "PROPN ADJ NOUN"),
                        ("the dog ran", "DET NOUN VERB")] * 4)
    (tmp_path / "train.conllu").write_text(conllu, encoding="utf-8")
    (tmp_path / "input.txt").write_text("the cat ran\nмосква город\n", encoding="utf-8")
    r = _invoke(task_app, "train", "--kind", "tagging", "--train", tmp_path / "train.conllu", "--dev",
                tmp_path / "train.conllu", "--model", EFML / "words", "--epochs", 2, "-o", tmp_path / "task")
    assert r.exit_code == 0, r.stdout
    r = _invoke(task_app, "predict", "--task", tmp_path / "task", tmp_path / "input.txt", tmp_path / "out.txt")
    assert r.exit_code == 0, r.stdout
    assert len((tmp_path / "out.txt").read_text("utf-8").split("\n\n")[0].splitlines()) == 3


# ---- bad input: one line naming the file, exit 1, nothing written ---------------------------------------------------
def _broken(tmp_path: Path, change) -> Path:
    model = tmp_path / "model"
    shutil.copytree(EFML / "words", model)
    change(model)
    return model


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {Path(os.environ.get('TMPDIR', '/tmp')) / 'efml-evil-ran'}",))


def _evil_pickle(model: Path) -> None:
    torch.save({"projection.weight": Evil()}, model / "token_embedder.pkl")


def _config(model: Path, **changes) -> None:
    path = model / "words.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        section, name = key.split("__")
        config[section][name] = value
    path.write_text(json.dumps(config))


BAD = {
    "missing char.dic": (lambda m: (m / "char.dic").unlink(), ["char.dic: not found"]),
    "missing word.dic": (lambda m: (m / "word.dic").unlink(), ["word.dic: not found"]),
    "config nowhere": (lambda m: (m / "words.json").unlink(), ["resolves nowhere", "words.json"]),
    "pickled code": (_evil_pickle, ["token_embedder.pkl", "refused"]),
    "shapes": (lambda m: _config(m, token_embedder__n_highway=3), ["weights do not match", "highways._layers.2"]),
    "lstm encoder": (lambda m: _config(m, encoder__name="lstm"), ["'elmo' encoder"]),
    "bad line": (lambda m: (m / "char.dic").write_text("a\t0\nb\tx\n", "utf-8"), ["char.dic:2:"]),
    "no <bos>": (lambda m: (m / "char.dic").write_text(
        "".join(f"{c}\t{i}\n" for i, c in enumerate(["<oov>", "<pad>", "<bow>", "<eow>", "<eos>", "a"])), "utf-8"),
        ["char.dic", "no <bos>"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_directory_is_one_line(case, tmp_path):
    change, needles = BAD[case]
    evidence = Path(os.environ.get("TMPDIR", "/tmp")) / "efml-evil-ran"
    evidence.unlink(missing_ok=True)
    model = _broken(tmp_path, change)
    out = tmp_path / "out.hdf5"
    r = _invoke(app, "dump-embeddings", "--model", model, SENTENCES, "-o", out)
    assert r.exit_code == 1
    err = r.stderr.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not out.exists() and not list(tmp_path.glob("*.hdf5*"))
    assert not evidence.exists()  # the pickled call never ran

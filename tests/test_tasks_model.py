"""elmo_cli.tasks with models: the layer cache, ElmoFeatures, a tiny task that learns, and the `task` commands.

The biLM is a tiny random one (1 layer, 2P = 8) written with `save_model_dir`; the tasks are a toy grammar whose tags
and classes a BiLSTM learns in a few epochs. Everything runs on one thread in seconds.
"""
import json
import random

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from elmo_cli.bilm_format import save_model_dir
from elmo_cli.config import CharCNNConfig, LSTMConfig, ModelConfig
from elmo_cli.embed import Embedder
from elmo_cli.model import BiLM
from elmo_cli.tasks import ElmoFeatures, LayerCache
from elmo_cli.tasks.cli import task_app
from elmo_cli.tasks.train import TrainSettings, train_task
from vocab.errors import ElmoError
from vocab.tokenize import TextEncoder
from vocab.vocabulary import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

GRAMMAR = {"DET": ["the", "a"], "ADJ": ["red", "old", "small"], "NOUN": ["cat", "dog", "bird", "house", "ball"],
           "VERB": ["sees", "likes", "finds"], "PUNCT": ["."]}
CONFIG = ModelConfig(char_cnn=CharCNNConfig(filters=((1, 4), (2, 4)), n_highway=1, embedding_dim=4),
                     lstm=LSTMConfig(dim=8, projection_dim=4, n_layers=1, cell_clip=3.0, proj_clip=3.0))
runner = CliRunner()


def toy_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """``DET [ADJ] NOUN VERB DET NOUN .`` with its tags (majority tag NOUN, under 1/3 of tokens)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tags = ["DET"] + (["ADJ"] if rng.random() < 0.5 else []) + ["NOUN", "VERB", "DET", "NOUN", "PUNCT"]
        out.append(([rng.choice(GRAMMAR[t]) for t in tags], tags))
    return out


def write_tagging(path, sentences):
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(*s)) + "\n" for s in sentences))
    return path


def write_classification(path, sentences):
    path.write_text("".join(f"{s[0][s[1].index('VERB')]}\t{' '.join(s[0])}\n" for s in sentences))  # label = verb
    return path


@pytest.fixture(scope="module")
def bilm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bilm")
    torch.manual_seed(0)
    words = sorted({w for ws in GRAMMAR.values() for w in ws})
    save_model_dir(BiLM(CONFIG, vocab_size=len(words) + 3), path)
    TextEncoder(Vocabulary(["<S>", "</S>", "<UNK>"] + words)).save_to(path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return {"train": write_tagging(d / "train.conll", toy_sentences(48, 0)),
            "dev": write_tagging(d / "dev.conll", toy_sentences(16, 1)),
            "train_tsv": write_classification(d / "train.tsv", toy_sentences(48, 0)),
            "dev_tsv": write_classification(d / "dev.tsv", toy_sentences(16, 1)), "dir": d}


def invoke(*args):
    result = runner.invoke(task_app, [str(a) for a in args], env={"COLUMNS": "250"})  # tables unwrapped
    err = result.stderr if result.stderr_bytes is not None else ""
    return result.exit_code, result.output if err in result.output else result.output + err  # mixed or apart


# ---- layer cache and ElmoFeatures -----------------------------------------------------------------------------------
SENTS = [["the", "cat", "sees", "a", "dog", "."], ["a", "bird"], ["the", "cat", "sees", "a", "dog", "."], ["zebra"]]


def test_cache_returns_what_the_biLM_returns(bilm_dir, tmp_path):
    emb = Embedder(bilm_dir)
    distinct = [SENTS[0], SENTS[1], SENTS[3]]
    direct = dict(zip(map(tuple, distinct), emb.embed_sentences(distinct)))  # the same batches as the cache's
    alone = [emb.embed_sentences([s])[0] for s in SENTS]  # other batches: equal up to float rounding
    for cache in (LayerCache(emb), LayerCache(emb, max_bytes=0, spill_dir=tmp_path)):  # memory, then all spilled
        assert cache.fill(SENTS) == 3  # distinct sentences: the biLM runs once per sentence
        assert cache.fill(SENTS) == 0
        for s, a in zip(SENTS, alone):
            got = cache.get(s)
            assert got.dtype == np.float32 and got.shape == (2, len(s), 8)
            np.testing.assert_array_equal(got, direct[tuple(s)])
            np.testing.assert_allclose(got, a, atol=1e-6)
        cache.close()
    assert not list(tmp_path.glob("elmo-task-cache-*"))  # the spill file is removed
    half = LayerCache(emb, dtype="float16")
    np.testing.assert_allclose(half.get(SENTS[0]), alone[0], rtol=2e-3, atol=2e-3)


def test_cache_reads_a_dump_embeddings_file(bilm_dir, tmp_path):
    emb = Embedder(bilm_dir)
    layers = emb.embed_sentences(SENTS[:2])
    path = tmp_path / "dump.hdf5"
    with h5py.File(path, "w") as f:  # dump-embeddings --layers all: key = 0-based line, sentence_to_index
        for k, a in enumerate(layers):
            f.create_dataset(str(k), data=a)
        index = {" ".join(s): str(k) for k, s in enumerate(SENTS[:2])}
        f.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype())[0] = json.dumps(index)
    cache = LayerCache(None, precomputed=path)
    np.testing.assert_array_equal(cache.get(SENTS[1]), layers[1])
    assert cache.layer_shape == (2, 8)
    with pytest.raises(ElmoError, match="not in the --embeddings file"):
        cache.get(["zebra"])
    cache.close()


def test_elmo_features_shapes_mask_and_frozen_biLM(bilm_dir):
    emb = Embedder(bilm_dir)
    elmo = ElmoFeatures(emb, LayerCache(emb)).eval()
    out, mask = elmo(SENTS[:2])
    assert out.shape == (2, 6, 8) and mask.tolist() == [[True] * 6, [True] * 2 + [False] * 4]
    assert torch.all(out[1, 2:] == 0)
    expected = torch.from_numpy(emb.embed_sentences([SENTS[1]])[0]).mean(0)  # initial mix = plain average, gamma 1
    torch.testing.assert_close(out[1, :2], expected, atol=1e-6, rtol=1e-5)
    out.sum().backward()
    assert elmo.mix.weights.grad is not None and elmo.mix.gamma.grad is not None
    assert all(p.grad is None for p in emb.model.parameters())
    assert [n for n, _ in elmo.named_parameters()] == ["mix.weights", "mix.gamma"]  # the biLM is not a submodule
    top = ElmoFeatures(emb, layers="top").eval()
    torch.testing.assert_close(top(SENTS[1:2])[0][0], torch.from_numpy(emb.embed_sentences([SENTS[1]])[0][-1]))
    assert top.mix_summary()["weights"] == [0.0, 1.0]


# ---- a tiny task learns ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, elmo", [("tagging", "none"), ("tagging", "mix"), ("classification", "mix")])
def test_tiny_task_learns(bilm_dir, data, tmp_path, kind, elmo):
    train, dev = (data["train"], data["dev"]) if kind == "tagging" else (data["train_tsv"], data["dev_tsv"])
    s = TrainSettings(kind=kind, train_path=train, dev_path=dev, output=tmp_path / "task",
                      model_dir=None if elmo == "none" else bilm_dir, elmo=elmo, epochs=6, batch_size=8, lr=0.02,
                      word_dim=16, hidden_dim=16)
    r = train_task(s)
    history = r.metrics["history"]
    assert history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]
    majority = 2 / 7 if kind == "tagging" else 0.5  # NOUN is at most 2 of 6-7 tokens; 3 balanced-ish verbs
    assert r.metrics["dev"]["accuracy"] > majority + 0.2
    saved = json.loads((tmp_path / "task" / "metrics.json").read_text())
    assert saved["best_epoch"] == r.metrics["best_epoch"]
    mix = json.loads((tmp_path / "task" / "mix.json").read_text())
    assert (mix == {}) == (elmo == "none")
    if elmo != "none":
        assert len(mix["input"]["weights"]) == 2 and abs(sum(mix["input"]["weights"]) - 1) < 1e-3


# ---- the commands ---------------------------------------------------------------------------------------------------
def test_train_evaluate_predict(data, tmp_path):
    task = tmp_path / "task"
    code, out = invoke("train", "--kind", "tagging", "--train", data["train"], "--dev", data["dev"], "--output", task,
                       "--no-elmo", "--epochs", "3", "--lr", "0.02", "--hidden-dim", "16")
    assert code == 0, out
    assert "epoch 3:" in out and f"wrote {task}" in " ".join(out.split())
    assert sorted(p.name for p in task.iterdir()) == ["config.json", "labels.txt", "metrics.json", "mix.json",
                                                      "weights.pt"]
    code, out = invoke("evaluate", "--task", task, data["dev"], "--json")
    assert code == 0, out
    m = json.loads(out.strip().splitlines()[-1])
    assert m["accuracy"] > 0.5 and m["unknown_labels"] == {} and m["scheme"] is None
    text = tmp_path / "in.txt"
    text.write_text("the cat sees a dog .\n\na red ball .\n")
    code, out = invoke("predict", "--task", task, text, tmp_path / "out.conll")
    assert code == 0, out
    blocks = (tmp_path / "out.conll").read_text().split("\n\n")
    assert [len(b.splitlines()) for b in blocks[:2]] == [6, 4] and blocks[0].startswith("the\t")


def test_evaluate_reports_unknown_labels_and_splits(data, tmp_path):
    task = tmp_path / "task"
    code, out = invoke("train", "--kind", "tagging", "--train", data["train"], "--dev", data["dev"], "--output", task,
                       "--no-elmo", "--epochs", "1", "--hidden-dim", "8", "--max-length", "4")
    assert code == 0, out
    assert "split into pieces" in out
    test = tmp_path / "test.conll"
    test.write_text("the\tDET\ncat\tNOUN\nzebra\tANIMAL\n\n")
    code, out = invoke("evaluate", "--task", task, test)
    assert code == 0, out
    assert "unknown at training time, counted wrong: ANIMAL (1)" in " ".join(out.split())
    dev = tmp_path / "dev.conll"
    dev.write_text("the\tDET\nzebra\tANIMAL\n\n")
    code, out = invoke("train", "--kind", "tagging", "--train", data["train"], "--dev", dev, "--output",
                       tmp_path / "t2", "--no-elmo", "--epochs", "1", "--hidden-dim", "8")
    assert code == 0 and "label(s) ANIMAL absent from" in " ".join(out.split())


def test_compare_prints_every_arm(bilm_dir, data, tmp_path):
    code, out = invoke("train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"],
                       "--output", tmp_path / "cmp", "--model", bilm_dir, "--compare", "--elmo-output", "--epochs",
                       "2", "--hidden-dim", "8", "--json")
    assert code == 0, out
    r = json.loads(out.strip().splitlines()[-1])
    assert [a["arm"] for a in r["arms"]] == ["a", "b", "c", "d"]
    assert r["arms"][0]["mix"] == {}
    # each arm's gain is its own accuracy minus the no-ELMo arm's, both re-measured from the saved task models
    acc = {}
    for key, slug in zip("abcd", ("a-no-elmo", "b-elmo-top", "c-elmo-mix", "d-elmo-mix-output")):
        code, out = invoke("evaluate", "--task", tmp_path / "cmp" / slug, data["dev_tsv"], "--json")
        assert code == 0, out
        acc[key] = json.loads(out.strip().splitlines()[-1])["accuracy"]
    for arm in r["arms"]:
        assert arm["absolute"] == pytest.approx(acc[arm["arm"]] - acc["a"], abs=1e-9), arm["arm"]
        if acc["a"] < 1:
            assert arm["relative_error_reduction"] == pytest.approx((acc[arm["arm"]] - acc["a"]) / (1 - acc["a"]))
    assert set(r["arms"][3]["mix"]) == {"input", "output"} and r["arms"][1]["mix"]["input"]["layers"] == "top"
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["a-no-elmo", "b-elmo-top", "c-elmo-mix",
                                                                    "d-elmo-mix-output"]
    code, out = invoke("evaluate", "--task", tmp_path / "cmp" / "d-elmo-mix-output", data["dev_tsv"], "--json")
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["accuracy"] == pytest.approx(r["arms"][3]["metric"])
    (tmp_path / "in.txt").write_text("the cat likes a dog .\na bird finds the ball .\n")
    code, out = invoke("predict", "--task", tmp_path / "cmp" / "c-elmo-mix", tmp_path / "in.txt", tmp_path / "o.tsv")
    assert code == 0, out
    rows = [line.split("\t") for line in (tmp_path / "o.tsv").read_text().splitlines()]
    assert [r[1] for r in rows] == ["the cat likes a dog .", "a bird finds the ball ."]
    assert {r[0] for r in rows} <= {"sees", "likes", "finds"}
    code, out = invoke("train", "--kind", "tagging", "--train", data["train"], "--dev", data["dev"], "--output",
                       tmp_path / "cmp2", "--model", bilm_dir, "--compare", "--test", data["dev"], "--epochs", "1",
                       "--hidden-dim", "8")
    assert code == 0, out
    table = [line for line in out.splitlines() if "│" in line]
    for name in ("(a) no ELMo", "(b) ELMo top layer", "(c) ELMo mix"):
        assert any(name in line for line in table), out
    assert "rel. error reduction" in out and ".00 1 γ=" in out


@pytest.mark.parametrize("case", ["one_column", "no_weights", "neither", "empty"])
def test_bad_input_exits_1_with_one_line(bilm_dir, data, tmp_path, case):
    train, extra = data["train"], ["--no-elmo"]
    if case == "one_column":
        train = tmp_path / "bad.conll"
        train.write_text("the DET\ncat NOUN\n\na\n")
    elif case == "no_weights":
        broken = tmp_path / "bilm"
        broken.mkdir()
        (broken / "options.json").write_text((bilm_dir / "options.json").read_text())
        extra = ["--model", broken]
    elif case == "neither":
        extra = []
    else:
        train = tmp_path / "empty.conll"
        train.write_text("\n\n")
    code, out = invoke("train", "--kind", "tagging", "--train", train, "--dev", data["dev"], "--output",
                       tmp_path / "task", *extra, "--epochs", "1")
    assert code == 1
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    expected = {"one_column": "bad.conll:4: expected at least 2 columns", "no_weights": "no weights.hdf5",
                "neither": "give exactly one of --model", "empty": "empty.conll: no sentences"}[case]
    assert expected in lines[0]
    assert not (tmp_path / "task").exists()  # nothing half-written


def test_elmo_features_take_a_layer_selection(bilm_dir):
    from elmo_cli.embed import Embedder
    from elmo_cli.layers import LayerSelection
    from elmo_cli.tasks import ElmoFeatures

    emb = Embedder(bilm_dir)
    sents = [["the", "cat", "sees", "a", "dog", "."], ["a", "bird"]]
    layers, mask = ElmoFeatures(emb, dropout=0.0).biLM_layers(sents)
    for spec, used in (("all", [0, 1]), ("top", [1]), ("0", [0]), (LayerSelection.parse("1"), [1])):
        feats = ElmoFeatures(emb, layers=spec, dropout=0.0)
        out, m = feats(sents)
        assert out.shape == (2, 6, emb.dim) and torch.equal(m, mask)
        want = layers[used].mean(0) * mask.unsqueeze(-1)  # ScalarMix starts as a plain average, gamma 1
        torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
        weights = feats.mix_summary()["weights"]
        assert [k for k, w in enumerate(weights) if w > 0] == used
    with pytest.raises(ElmoError, match="learns its own mix"):
        ElmoFeatures(emb, layers="average")
    with pytest.raises(ElmoError, match="layers 0..1"):
        ElmoFeatures(emb, layers="2")


def test_train_layers_flag_takes_layer_indices(bilm_dir, data, tmp_path):
    task = tmp_path / "t"
    code, out = invoke("train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"],
                       "--output", task, "--model", bilm_dir, "--layers", "1", "--epochs", "1", "--hidden-dim", "8")
    assert code == 0, out
    mix = json.loads((task / "mix.json").read_text())["input"]
    assert mix["layers"] == "1" and mix["weights"] == [0.0, 1.0]  # one mixed layer: the token layer gets nothing
    assert json.loads((task / "config.json").read_text())["elmo_layers"] == "1"
    code, out = invoke("evaluate", "--task", task, data["dev_tsv"], "--json")  # reloads with the same layers
    assert code == 0, out
    code, out = invoke("train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"],
                       "--output", tmp_path / "u", "--model", bilm_dir, "--layers", "average")
    assert code == 1 and "--layers 'average'" in out and "learns its own mix" in out


# ---- stopping, text errors, the CRF head -----------------------------------------------------------------------------
def test_training_stops_when_dev_stops_improving(data, tmp_path):
    s = TrainSettings(kind="tagging", train_path=data["train"], dev_path=data["dev"], output=tmp_path / "t",
                      elmo="none", epochs=40, patience=2, batch_size=8, lr=0.05, hidden_dim=16, device="cpu")
    m = train_task(s).metrics
    assert m["stopped"] == "patience" and m["epochs_run"] == m["best_epoch"] + 2 < 40
    devs = [h["dev"]["accuracy"] for h in m["history"]]
    assert max(devs[m["best_epoch"]:]) <= devs[m["best_epoch"] - 1] == max(devs)
    saved = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert saved["stopped"] == "patience" and saved["epochs_run"] == len(saved["history"])
    m = train_task(TrainSettings(**{**s.__dict__, "patience": 0, "epochs": 3, "output": None})).metrics
    assert m["stopped"] == "epochs" and m["epochs_run"] == 3


def test_invalid_utf8_in_task_data(data, tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_bytes(data["train"].read_bytes() + b"caf\xe9\tNOUN\n\n")
    line = len(data["train"].read_bytes().splitlines()) + 1
    code, out = invoke("train", "--kind", "tagging", "--train", bad, "--dev", data["dev"], "--output",
                       tmp_path / "t", "--no-elmo", "--epochs", "1", "--hidden-dim", "8")
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1 and f"bad.conll:{line}: invalid UTF-8" in lines[0]
    assert "--errors replace" in lines[0] and not (tmp_path / "t").exists()
    code, out = invoke("train", "--kind", "tagging", "--train", bad, "--dev", data["dev"], "--output",
                       tmp_path / "t", "--no-elmo", "--epochs", "1", "--hidden-dim", "8", "--errors", "replace")
    assert code == 0, out
    code, out = invoke("evaluate", "--task", tmp_path / "t", bad, "--errors", "replace", "--json")
    assert code == 0, out


def _spans(sentences):
    """The toy grammar's noun phrases as BIO spans: ``DET [ADJ] NOUN`` -> B-NP I-NP I-NP, the rest O."""
    out = []
    for words, tags in sentences:
        labels, inside = [], False
        for t in tags:
            if t == "DET":
                labels.append("B-NP")
                inside = True
            elif t in ("ADJ", "NOUN") and inside:
                labels.append("I-NP")
            else:
                labels.append("O")
                inside = False
        out.append((words, labels))
    return out


def test_crf_tagger_learns_spans_and_decodes_only_allowed_moves(tmp_path):
    from elmo_cli.tasks.crf import count_violations
    from elmo_cli.tasks.store import read_config

    train = write_tagging(tmp_path / "train.conll", _spans(toy_sentences(60, 1)))
    dev = write_tagging(tmp_path / "dev.conll", _spans(toy_sentences(20, 2)))
    code, out = invoke("train", "--kind", "tagging", "--train", train, "--dev", dev, "--output", tmp_path / "crf",
                       "--no-elmo", "--crf", "--epochs", "8", "--lr", "0.02", "--hidden-dim", "16", "--json")
    assert code == 0, out
    m = json.loads(out.strip().splitlines()[-1])
    assert m["dev"]["span"]["f1"] > 0.9
    config = read_config(tmp_path / "crf")
    assert config.crf and config.span_scheme == "BIO"
    (tmp_path / "in.txt").write_text("the old red dog finds a ball .\nsees the\n")
    code, out = invoke("predict", "--task", tmp_path / "crf", tmp_path / "in.txt", tmp_path / "out.conll")
    assert code == 0, out
    guessed = [[line.split("\t")[1] for line in block.splitlines()]
               for block in (tmp_path / "out.conll").read_text().strip().split("\n\n")]
    assert [len(g) for g in guessed] == [8, 2] and count_violations(guessed, "BIO") == 0


def test_crf_refuses_classification(data, tmp_path):
    code, out = invoke("train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"],
                       "--output", tmp_path / "t", "--no-elmo", "--crf")
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1 and "--crf" in lines[0] and "--kind tagging" in lines[0]


def test_char_cnn_word_features(data, tmp_path):
    """The char-CNN gives each word a feature from its bytes alone: a word never seen in training (<UNK> to the
    embedding) still gets its own vector, equal wherever it occurs, and padding gets zeros."""
    from elmo_cli.tasks.model import CharCNN, encode_batch

    torch.manual_seed(0)
    cnn = CharCNN()
    out = cnn(torch.from_numpy(encode_batch([["the", "zebra", "the"], ["zebra"]], {}, char_cnn=True)["word_chars"]))
    assert out.shape == (2, 3, 50)
    torch.testing.assert_close(out[0, 1], out[1, 0])
    torch.testing.assert_close(out[0, 0], out[0, 2])
    assert not torch.equal(out[0, 0], out[0, 1]) and torch.equal(out[1, 1:], torch.zeros(2, 50))
    code, out = invoke("train", "--kind", "tagging", "--train", data["train"], "--dev", data["dev"], "--output",
                       tmp_path / "t", "--no-elmo", "--char-cnn", "--epochs", "2", "--hidden-dim", "8")
    assert code == 0, out
    state = torch.load(tmp_path / "t" / "weights.pt", weights_only=True)
    assert state["char_cnn.conv.weight"].shape == (50, 30, 3)
    code, out = invoke("evaluate", "--task", tmp_path / "t", data["dev"], "--json")
    assert code == 0, out


def test_fine_tuning_trains_the_biLM_and_prediction_uses_the_tuned_one(bilm_dir, data, tmp_path):
    from elmo_cli.bilm_format import load_bilm
    from elmo_cli.tasks.features import tuned_layers

    emb = Embedder(bilm_dir, device="cpu")
    sents = [["the", "cat", "sees", "a", "dog", "."], ["a", "bird"], []]
    frozen, mask = ElmoFeatures(emb, dropout=0.0).biLM_layers(sents)
    got, got_mask = tuned_layers(emb.model, emb.loaded.text.chars, sents)  # the same weights: the same layers
    assert torch.equal(got_mask, mask)
    torch.testing.assert_close(got, frozen, atol=1e-5, rtol=0)
    args = ["train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"], "--model",
            bilm_dir, "--fine-tune-bilm", "--bilm-lr", "0.01", "--hidden-dim", "8", "--device", "cpu", "--json"]
    code, out = invoke(*args, "--output", tmp_path / "ft", "--epochs", "2", "--patience", "0")
    assert code == 0, out
    m = json.loads(out.strip().splitlines()[-1])
    state = torch.load(tmp_path / "ft" / "weights.pt", weights_only=True)
    original = load_bilm(bilm_dir / "options.json", bilm_dir / "weights.hdf5").state_dict()
    assert set(original) <= {k[len("bilm."):] for k in state if k.startswith("bilm.")}
    moved = max(float((state["bilm." + k] - v).abs().max()) for k, v in original.items() if "softmax" not in k)
    assert moved > 1e-4
    code, out = invoke("evaluate", "--task", tmp_path / "ft", data["dev_tsv"], "--json")
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["accuracy"] == pytest.approx(m["dev"]["accuracy"])
    # frozen for the first epoch: one epoch leaves the biLM as it was
    code, out = invoke(*args, "--output", tmp_path / "late", "--epochs", "1", "--unfreeze-after", "1")
    assert code == 0, out
    state = torch.load(tmp_path / "late" / "weights.pt", weights_only=True)
    assert all(torch.equal(state["bilm." + k], v) for k, v in original.items())


@pytest.mark.parametrize("extra, message", [(["--no-elmo"], "--fine-tune-bilm needs ELMo"),
                                            (["--embeddings", "x.hdf5"], "precomputed --embeddings"),
                                            (["--unfreeze-after", "2", "--no-elmo"], "--fine-tune-bilm needs ELMo")])
def test_fine_tuning_refuses_what_cannot_train(data, tmp_path, extra, message):
    code, out = invoke("train", "--kind", "tagging", "--train", data["train"], "--dev", data["dev"], "--output",
                       tmp_path / "t", "--fine-tune-bilm", *extra)
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 1 and len(lines) == 1 and message in lines[0], out
    assert not (tmp_path / "t").exists()


def test_compare_with_char_cnn_reports_gains_over_the_strongest_baseline(bilm_dir, data, tmp_path):
    code, out = invoke("train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"],
                       "--output", tmp_path / "cmp", "--model", bilm_dir, "--compare", "--char-cnn", "--epochs", "2",
                       "--hidden-dim", "8", "--json")
    assert code == 0, out
    r = json.loads(out.strip().splitlines()[-1])
    assert [a["arm"] for a in r["arms"]] == ["a", "a+", "b", "c"]
    assert [a["name"] for a in r["arms"]] == ["no ELMo", "no ELMo, char-CNN", "ELMo top layer, char-CNN",
                                              "ELMo mix, char-CNN"]
    acc = {}
    for key, slug in (("a", "a-no-elmo"), ("a+", "a+-no-elmo-char-cnn"), ("b", "b-elmo-top"), ("c", "c-elmo-mix")):
        config = json.loads((tmp_path / "cmp" / slug / "config.json").read_text())
        assert config["char_cnn"] == (key != "a"), key
        code, out = invoke("evaluate", "--task", tmp_path / "cmp" / slug, data["dev_tsv"], "--json")
        acc[key] = json.loads(out.strip().splitlines()[-1])["accuracy"]
    best = max(acc["a"], acc["a+"])
    for arm in r["arms"]:
        assert arm["vs_best_baseline"] == pytest.approx(acc[arm["arm"]] - best, abs=1e-9), arm["arm"]
        assert arm["absolute"] == pytest.approx(acc[arm["arm"]] - acc["a"], abs=1e-9), arm["arm"]
    code, out = invoke("train", "--kind", "classification", "--train", data["train_tsv"], "--dev", data["dev_tsv"],
                       "--output", tmp_path / "cmp2", "--model", bilm_dir, "--compare", "--char-cnn", "--epochs",
                       "1", "--hidden-dim", "8")
    assert code == 0, out
    assert "(a+) no ELMo, char-CNN" in out and "Δ vs best baseline" in out and "every arm: word embedding" in out

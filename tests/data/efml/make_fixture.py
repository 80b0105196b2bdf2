"""Make the ELMoForManyLangs (EFML) reference fixture in tests/data/efml/ with EFML's own code.

What it makes (next to this script, or under ``--out DIR``)::

    words/              token embedder cnn with words + characters, encoder elmo (.pkl in torch's LEGACY format)
    chars_only/         token embedder cnn with characters only (word_dim 0, no word.dic), .pkl in torch's zip format
    sentences.txt       the hard sentences, one a line, tokens joined by one space
    words_expected.hdf5, chars_only_expected.hdf5
                        what EFML's ``Embedder(model_dir, batch_size=64).sents2elmo(sentences, output_layer=-2)``
                        returns: dataset "i" (0-based line of sentences.txt), float32
                        (n_layers + 1, n_tokens, 2 * projection_dim); file attributes record the versions and command.

Each model directory is written the way EFML's training (``elmoformanylangs/biLM.py``, ``train()``) writes one:

- ``char.dic`` / ``word.dic``: ``<entry>\\t<id>`` lines in id order, built with biLM.py's own ``read_corpus`` and
  ``get_truncated_vocab`` on the built-in text `CORPUS` (min_count 2) and biLM.py's lexicon loops. word.dic starts
  with ``<oov> <bos> <eos> <pad>`` (ids 0-3), then the vocabulary by falling count. char.dic holds every character of
  the training tokens *including the literal "<bos>"/"<eos>" tokens read_corpus adds* (so '<' 'b' 'o' 's' '>' come
  first), then ``<bos> <eos> <oov> <pad> <bow> <eow>``. biLM.py tokenises with ``str.split()``, which splits on
  U+3000, so no EFML-trained char.dic can hold U+3000 from its text; this script inserts U+3000 as an ordinary
  character just before the specials so that the reader's quirk (a line that strips to one field is U+3000) is
  exercised. biLM.py always writes word.dic (its word lexicon also feeds the softmax); chars_only here has none, so
  that a reader is tested to need word.dic only when word_dim > 0, as EFML's ``Embedder`` does.
- ``config.json``: biLM.py's training arguments (``json.dump(vars(opt))``); its ``config_path`` is an absolute path
  that does not exist (/home/efml/configs/<name>.json), so ``Embedder`` falls back to ``<model dir>/<name>.json``,
  which is written there (EFML's code says some published models are laid out so).
- ``token_embedder.pkl`` / ``encoder.pkl``: ``torch.save(module.state_dict())`` as ``Model.save_model`` does.

The models are built with EFML's own classes and initialisation (``EmbeddingLayer``, ``frontend.Model``), then every
parameter gets seeded Gaussian noise (`NOISE`) so that biases are non-zero, padding rows are non-trivial and the
LSTM cell and projection clipping (3) is reached; the script prints how often each clip fires and fails if one
never does.

EFML's ``ElmobiLm`` is stateful: it carries the LSTM states from one batch into the next, and ``sents2elmo`` runs
the batches in a random order, so only the first batch starts from zero states. The sentences (< 64) therefore go
through one fresh ``Embedder`` in ONE call, one batch, and every sentence starts from zero states.

Run from the repository root (elmo-cli itself never imports EFML; only this script does)::

    .venv/bin/python -m pip install --target /tmp/efml-site --no-deps \\
        elmoformanylangs==0.0.4.post2 overrides==3.1.0
    PYTHONPATH=/tmp/efml-site .venv/bin/python tests/data/efml/make_fixture.py

EFML's other requirements (torch, h5py, numpy) come from elmo-cli's venv. ``overrides`` 3.1.0 works with EFML's
bare ``@overrides`` on ``Highway.forward`` (newer releases are reported to break it).

The run is deterministic (seeded, one thread): running it twice gives byte-identical hdf5, .dic, .json and
zip-format .pkl files, and legacy .pkl files (words/) that hold identical tensors but differ in bytes, because
torch's legacy format names each storage by its memory address (torch 0.4, which wrote the published models, had
only that format).

The expected outputs are EFML's own float32 results for one batch of all the sentences. EFML run on one sentence at
a time differs from them by up to about 2e-5 (other matrix shapes); tests/test_efml.py allows 1e-5 of the largest
value (6e-5 here).

Runtime patches: none are needed with torch 2.13 (CPU). ``frontend.Model.load_model``'s ``torch.load`` runs with
torch's default ``weights_only=True``, which loads these state dicts in both formats. The clipping count wraps
``torch.clamp`` only during a second, separate ``Embedder`` run whose output is checked to equal the first.
"""
from __future__ import annotations

import argparse
import codecs
import collections
import importlib.metadata
import json
import logging
import os
import sys
import tempfile

import h5py
import numpy as np
import torch

import elmoformanylangs
from elmoformanylangs import biLM, frontend
from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

HERE = os.path.dirname(os.path.abspath(__file__))
COMMAND = "PYTHONPATH=/tmp/efml-site .venv/bin/python tests/data/efml/make_fixture.py"
MIN_COUNT = 2          # biLM.py's --min_count (default 5; 2 suits a small text)
MAX_SENT_LEN = 20      # biLM.py's --max_sent_len default
SEED = 1               # biLM.py's --seed default: torch.manual_seed before the model is built
IDEOGRAPHIC_SPACE = "\u3000"

# One long token, written twice in the corpus: read_corpus cuts it to 48 characters, so word.dic holds LONG[:48] and
# a longer token with the same first 48 characters is found in word.dic.
LONG = "electroencephalographicallyunderstandablehypothesesx"  # 52 characters
assert len(LONG) == 52
CORPUS = f"""the cat sat on the mat .
the dog sat on the log .
a cat and a dog are friends , and the cat likes the dog .
the quick brown fox jumps over the lazy dog .
my friends say the fox is quick .
{LONG} is a long word .
a {LONG} word again !
москва большой город .
я люблю этот город , москва .
北京 是 中国 的 首都 。
我 爱 北京 。
"""

TOKEN_60 = LONG[:48] + "reconsidered"          # 60 characters; its first 48 are in word.dic
TOKEN_49 = "pseudopseudohypoparathyroidismfloccinaucinihilipi"  # 49 characters, not in word.dic
TOKEN_48 = LONG[:48]                               # exactly 48: not cut, in word.dic
assert (len(TOKEN_60), len(TOKEN_49), len(TOKEN_48)) == (60, 49, 48)

SENTENCES = [
    "the cat sat on the mat .".split(" "),
    "the dog and the fox are friends .".split(" "),
    "zebras quietly juggle seven xylophones".split(" "),
    ["The", "Cat", "SAT", "2018", "3.14", "!", "?"],
    ["hello", "😀", "αβγ", "नमस्ते", "مرحبا", "🇺🇦", "👩\u200d💻", "𠀀"],
    ["cafe\u0301", "café", "naïve", "—", "«", "»"],
    ["a", TOKEN_60, "and", TOKEN_49, "and", TOKEN_48, "."],
    ["москва", "большой", "город", "."],
    ["я", "люблю", "Санкт-Петербург", "и", "москву", "!"],
    ["北京", "是", "中国", "的", "首都", "。"],
    ["我", "爱", "上海", "和", "北京", "。"],
    ["cat"],
    ["the", "<bos>", "cat", "<S>", "sat", "</S>", "on", "<eos>", "."],
    ["<oov>", "<pad>", "<bow>", "<eow>", "<unk>", "<UNK>"],
    ["dog", "dog", "dog", "dog", "the", "the", "the", "dog", "dog"],
    ["北京", "москва", "cat", "😀", TOKEN_60, "北京", "москва", "cat", "😀", TOKEN_60],
    ("the quick brown fox jumps over the lazy dog and the cat sat on the mat while my friends say "
     "москва большой город and 北京 是 中国 的 首都 .").split(" "),
    ["!"],
]

MODELS = {
    "words": {
        "legacy_pickle": True,
        "config": {
            "encoder": {"name": "elmo", "projection_dim": 8, "cell_clip": 3, "proj_clip": 3, "dim": 16,
                        "n_layers": 2},
            "token_embedder": {"name": "cnn", "activation": "relu", "filters": [[1, 4], [2, 4], [3, 8]],
                               "n_highway": 2, "word_dim": 8, "char_dim": 6, "max_characters_per_token": 50},
            "classifier": {"name": "sampled_softmax", "n_samples": 16},
            "dropout": 0.1,
        },
    },
    "chars_only": {
        "legacy_pickle": False,
        "config": {
            "encoder": {"name": "elmo", "projection_dim": 6, "cell_clip": 3, "proj_clip": 3, "dim": 12,
                        "n_layers": 2},
            "token_embedder": {"name": "cnn", "activation": "tanh", "filters": [[1, 3], [2, 5]],
                               "n_highway": 1, "word_dim": 0, "char_dim": 5, "max_characters_per_token": 50},
            "classifier": {"name": "sampled_softmax", "n_samples": 16},
            "dropout": 0.1,
        },
    },
}

# Standard deviation of the Gaussian noise added to each parameter, by the end of its state-dict key. Chosen so that
# the cell and projection clips fire on a few percent of values and the outputs stay varied.
NOISE = {"input_linearity.weight": 0.5, "state_linearity.weight": 0.5, "state_linearity.bias": 0.7,
         "state_projection.weight": 1.0}
NOISE_DEFAULT = 0.3


def efml_training_data(max_chars: int) -> list[list[str]]:
    """The built-in text as biLM.py's ``read_corpus`` reads it (with <bos>/<eos>, long tokens cut, 20-token chunks)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.txt")
        with open(path, "w", encoding="utf-8") as out:
            out.write(CORPUS)
        return biLM.read_corpus(path, max_chars, MAX_SENT_LEN)


def efml_lexicons(train_data: list[list[str]]) -> tuple[dict, dict]:
    """biLM.py ``train()``'s word and character lexicons (its loops, in its order), plus U+3000 (see docstring)."""
    word_lexicon = {}
    vocab = biLM.get_truncated_vocab(train_data, MIN_COUNT)
    for special_word in ['<oov>', '<bos>', '<eos>', '<pad>']:
        if special_word not in word_lexicon:
            word_lexicon[special_word] = len(word_lexicon)
    for word, _ in vocab:
        if word not in word_lexicon:
            word_lexicon[word] = len(word_lexicon)

    char_lexicon = {}
    for sentence in train_data:
        for word in sentence:
            for ch in word:
                if ch not in char_lexicon:
                    char_lexicon[ch] = len(char_lexicon)
    assert IDEOGRAPHIC_SPACE not in char_lexicon
    char_lexicon[IDEOGRAPHIC_SPACE] = len(char_lexicon)
    for special_char in ['<bos>', '<eos>', '<oov>', '<pad>', '<bow>', '<eow>']:
        if special_char not in char_lexicon:
            char_lexicon[special_char] = len(char_lexicon)
    return word_lexicon, char_lexicon


def training_args(name: str, eval_steps: int) -> dict:
    """What biLM.py dumps as config.json: ``vars(opt)`` of its argument parser, as on its makers' machine."""
    return {"seed": SEED, "gpu": -1, "train_path": f"/home/efml/data/{name}.train.txt", "valid_path": None,
            "test_path": None, "config_path": f"/home/efml/configs/{name}.json", "word_embedding": None,
            "optimizer": "adam", "lr": 0.001, "lr_decay": 0, "model": f"/home/efml/models/{name}",
            "batch_size": 32, "max_epoch": 1, "clip_grad": 5, "max_sent_len": MAX_SENT_LEN, "min_count": MIN_COUNT,
            "max_vocab_size": 150000, "save_classify_layer": False, "valid_size": 0, "eval_steps": eval_steps}


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Add seeded Gaussian noise to every parameter of `module` (state-dict order)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, tensor in module.state_dict(keep_vars=True).items():
            sigma = next((s for end, s in NOISE.items() if key.endswith(end)), NOISE_DEFAULT)
            tensor.add_(torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype) * sigma)


def write_model(out_dir: str, name: str, spec: dict) -> dict:
    """Build, perturb and save one model directory as biLM.py would; return its lexicons."""
    config = spec["config"]
    model_dir = os.path.join(out_dir, name)
    os.makedirs(model_dir, exist_ok=True)
    embedder = config["token_embedder"]
    train_data = efml_training_data(embedder["max_characters_per_token"])
    word_lexicon, char_lexicon = efml_lexicons(train_data)

    torch.manual_seed(SEED)
    word_emb_layer = (EmbeddingLayer(embedder["word_dim"], word_lexicon, fix_emb=False, embs=None)
                      if embedder["word_dim"] > 0 else None)
    char_emb_layer = EmbeddingLayer(embedder["char_dim"], char_lexicon, fix_emb=False)
    model = frontend.Model(config, word_emb_layer, char_emb_layer, use_cuda=False)
    perturb(model.token_embedder, SEED + 100)
    perturb(model.encoder, SEED + 200)

    # biLM.py train(): char.dic, word.dic, config.json, then Model.save_model's two state dicts.
    with codecs.open(os.path.join(model_dir, "char.dic"), "w", encoding="utf-8") as fpo:
        for ch, i in char_emb_layer.word2id.items():
            print("{0}\t{1}".format(ch, i), file=fpo)
    if embedder["word_dim"] > 0:
        with codecs.open(os.path.join(model_dir, "word.dic"), "w", encoding="utf-8") as fpo:
            for w, i in word_lexicon.items():
                print("{0}\t{1}".format(w, i), file=fpo)
    args = training_args(name, eval_steps=(len(train_data) - 1) // 32 + 1)
    assert not os.path.exists(args["config_path"]), "the config path must not exist here: it tests EFML's fallback"
    with codecs.open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as fpo:
        json.dump(args, fpo)
    with open(os.path.join(model_dir, os.path.basename(args["config_path"])), "w", encoding="utf-8") as fpo:
        json.dump(config, fpo)
        fpo.write("\n")
    kwargs = {"_use_new_zipfile_serialization": False} if spec["legacy_pickle"] else {}
    torch.save(model.token_embedder.state_dict(), os.path.join(model_dir, "token_embedder.pkl"), **kwargs)
    torch.save(model.encoder.state_dict(), os.path.join(model_dir, "encoder.pkl"), **kwargs)
    return {"word": word_lexicon if embedder["word_dim"] > 0 else None, "char": char_lexicon}


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def run_efml(model_dir: str, sentences: list[list[str]]) -> tuple[list[np.ndarray], list[str]]:
    """A fresh EFML Embedder, one sents2elmo call (one batch); its outputs and the warnings it logged."""
    handler = _Warnings()
    logger = logging.getLogger("elmoformanylangs")
    logger.addHandler(handler)
    try:
        embedder = elmoformanylangs.Embedder(model_dir, batch_size=64)
        assert embedder.model.encoder._states is None
        out = embedder.sents2elmo(sentences, output_layer=-2)
    finally:
        logger.removeHandler(handler)
    return out, handler.messages


def count_clipping(model_dir: str, sentences: list[list[str]], config: dict, expected: list[np.ndarray]) -> dict:
    """Run EFML again with ``torch.clamp`` wrapped to count values beyond the clip; check the output is unchanged."""
    cell, proj = config["encoder"]["dim"], config["encoder"]["projection_dim"]
    counts = collections.Counter()
    clamp = torch.clamp

    def counting_clamp(x, lo, hi):
        kind = {cell: "cell", proj: "proj"}[x.shape[-1]]
        counts[kind + "_values"] += x.numel()
        counts[kind + "_clipped"] += int(((x < lo) | (x > hi)).sum())
        return clamp(x, lo, hi)

    torch.clamp = counting_clamp
    try:
        again, _ = run_efml(model_dir, sentences)
    finally:
        torch.clamp = clamp
    assert all(np.array_equal(a, b) for a, b in zip(again, expected)), "EFML gave different output on a second run"
    return dict(counts)


def show_char_row(lexicons: dict, config: dict) -> None:
    """Print what frontend.create_one_batch puts in a character row (EFML swaps <bow>/<eow>: see the report)."""
    char2id = lexicons["char"]
    batch_w, batch_c, lens, _ = frontend.create_one_batch([["<bos>", "cat", "<eos>"]], lexicons["word"], char2id,
                                                          config)
    ids = {k: char2id[k] for k in ("<bow>", "<eow>", "<bos>", "<eos>", "<pad>", "<oov>")}
    print(f"  char ids of the specials: {ids}")
    for j, token in enumerate(["<bos>", "cat", "<eos>"]):
        print(f"  create_one_batch row of {token!r}: {batch_c[0, j, :8].tolist()} ... (pad {ids['<pad>']})")
    row = batch_c[0, 1].tolist()
    assert row[0] == ids["<eow>"] and row[4] == ids["<bow>"], "position 0 holds <eow>'s id, the end <bow>'s"
    assert row[1:4] == [char2id[c] for c in "cat"] and set(row[5:]) == {ids["<pad>"]}
    assert batch_c[0, 0, :3].tolist() == [ids["<eow>"], ids["<bos>"], ids["<bow>"]]
    if batch_w is not None:
        print(f"  word ids: {batch_w[0].tolist()}")


def write_expected(path: str, outputs: list[np.ndarray], sentences: list[list[str]], config: dict) -> None:
    n_layers, proj = config["encoder"]["n_layers"], config["encoder"]["projection_dim"]
    with h5py.File(path, "w", libver="earliest", track_order=False) as h5:
        h5.attrs["elmoformanylangs_version"] = importlib.metadata.version("elmoformanylangs")
        h5.attrs["torch_version"] = str(torch.__version__)
        h5.attrs["command"] = COMMAND
        h5.attrs["call"] = "elmoformanylangs.Embedder(model_dir, batch_size=64).sents2elmo(sentences, output_layer=-2)"
        for i, (array, sentence) in enumerate(zip(outputs, sentences)):
            assert array.dtype == np.float32 and array.shape == (n_layers + 1, len(sentence), 2 * proj), array.shape
            assert np.isfinite(array).all()
            h5.create_dataset(str(i), data=array, track_times=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=HERE, help="folder to write into (default: this script's folder)")
    out_dir = parser.parse_args().out
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)  # EFML logs its model's repr at INFO
    torch.use_deterministic_algorithms(True)

    assert len(SENTENCES) < 30 and all(sentence and all(t and not any(c.isspace() for c in t) for t in sentence)
                                       for sentence in SENTENCES)
    with open(os.path.join(out_dir, "sentences.txt"), "w", encoding="utf-8", newline="\n") as out:
        for sentence in SENTENCES:
            out.write(" ".join(sentence) + "\n")
    with open(os.path.join(out_dir, "sentences.txt"), encoding="utf-8", newline="\n") as fin:
        sentences = [line.rstrip("\n").split(" ") for line in fin]
    assert sentences == SENTENCES

    print(f"elmoformanylangs {importlib.metadata.version('elmoformanylangs')}, torch {torch.__version__}")
    for name, spec in MODELS.items():
        model_dir = os.path.join(out_dir, name)
        lexicons = write_model(out_dir, name, spec)
        print(f"{name}: {len(lexicons['char'])} characters, "
              f"{len(lexicons['word']) if lexicons['word'] else 'no'} words")
        show_char_row(lexicons, spec["config"])
        for pkl in ("token_embedder.pkl", "encoder.pkl"):
            state = torch.load(os.path.join(model_dir, pkl), map_location="cpu", weights_only=True)
            assert isinstance(state, collections.OrderedDict) and all(isinstance(v, torch.Tensor)
                                                                      for v in state.values())
        outputs, warnings = run_efml(model_dir, sentences)
        assert any(f"{name}/{name}.json" in w for w in warnings), f"EFML did not fall back to the basename: {warnings}"
        counts = count_clipping(model_dir, sentences, spec["config"], outputs)
        print(f"  clipping: {counts['cell_clipped']} of {counts['cell_values']} cell values, "
              f"{counts['proj_clipped']} of {counts['proj_values']} projection values")
        assert counts["cell_clipped"] > 0 and counts["proj_clipped"] > 0, "raise NOISE: a clip never fires"
        write_expected(os.path.join(out_dir, f"{name}_expected.hdf5"), outputs, sentences, spec["config"])
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    sys.exit(main())

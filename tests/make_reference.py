"""The generator of allennlp's reference files in tests/data: a small random bilm-tf model, what allennlp 2.10.1
computes for it, and allennlp's character ids of tricky tokens. The tests hold elmo-cli to these files.

    python tests/make_reference.py model DIR [--seed N]   # DIR/options.json, DIR/weights.hdf5 (numpy and h5py only)
    python tests/make_reference.py expected DIR           # DIR/expected_all.hdf5 for DIR/sentences.txt (allennlp)
    python tests/make_reference.py char-ids FILE          # rewrite FILE's ids for the tokens it lists (allennlp)

The committed files (tests/data/reference/, tests/data/char_ids.json) were made before this script was in the
repository, by a script that was never committed; this one was written afterwards to the description in
tests/data/reference/README.md and the committed files themselves:

- `model` writes the committed model's layout (options.json's shape, bilm-tf's weight names and shapes) with random
  weights at the committed file's scales (each tensor's standard deviation as read from it, the cell and
  projection clips set to 3 and reached on the reference sentences). The committed model's seed was not recorded,
  so a new model is a different model of the same kind, not the same bytes; keep the committed one.
- `expected` runs allennlp's own biLM (`allennlp.modules.elmo._ElmoBiLm`) on DIR's model and sentences as
  allennlp's removed `elmo --all` command did (`line.strip().split()`, `batch_to_ids`, the `<S>`/`</S>` positions
  removed), with its LSTM state reset before every batch so every sentence starts from zero state, and writes that
  command's layout. On the committed model it should give the committed vectors up to float rounding; that has not
  been run since the script was written (allennlp is not installed where the tests run).
- `char-ids` recomputes `allennlp_ids` (allennlp's `ELMoCharacterMapper.convert_word_to_char_ids`), `raw_ids`
  (those minus 1: docs/formats.md, "Character ids") and `utf8_bytes` of every token FILE lists.

allennlp is archived and pins torch < 1.13, so it is not a dependency of elmo-cli: install it into a separate
environment without its pins, as the docstring of benchmarks/bench_allennlp.py shows, and run `expected` and
`char-ids` there. tests/test_make_reference.py checks without allennlp what can be checked: that the committed files
have exactly the layout `model` and `expected` write, and that the clips fire on both models.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import h5py
import numpy as np

REFERENCE = Path(__file__).parent / "data" / "reference"
# tests/data/reference/README.md: char CNN filters [[1,16],[2,16],[3,32],[4,64]], 2 highway layers, relu, LSTM dim
# 256, projection 64, 2 layers, cell and projection clip 3, skip connections.
OPTIONS = {"lstm": {"use_skip_connections": True, "projection_dim": 64, "cell_clip": 3, "proj_clip": 3, "dim": 256,
                    "n_layers": 2},
           "char_cnn": {"activation": "relu", "filters": [[1, 16], [2, 16], [3, 32], [4, 64]], "n_highway": 2,
                        "embedding": {"dim": 16}, "n_characters": 262, "max_characters_per_token": 50}}
BATCH = 64  # allennlp's ElmoEmbedder default: the 16 reference sentences are one batch
LAYOUT = "allennlp elmo --all"
ORACLE = "allennlp 2.10.1 _ElmoBiLm, LSTM state reset before every batch"


def weight_shapes(options: dict = OPTIONS) -> dict[str, tuple[int, ...]]:
    """bilm-tf's weights.hdf5: every dataset's name and shape for `options` (docs/formats.md, "weights.hdf5")."""
    cnn, lstm = options["char_cnn"], options["lstm"]
    E, H, P = cnn["embedding"]["dim"], lstm["dim"], lstm["projection_dim"]
    F = sum(n for _, n in cnn["filters"])
    shapes = {"char_embed": (cnn["n_characters"] - 1, E)}  # bilm-tf stores 261 rows; the padding row is added on load
    for k, (width, n) in enumerate(cnn["filters"]):
        shapes[f"CNN/W_cnn_{k}"], shapes[f"CNN/b_cnn_{k}"] = (1, width, E, n), (n,)
    for k in range(cnn["n_highway"]):
        for name in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{name}"], shapes[f"CNN_high_{k}/b_{name}"] = (F, F), (F,)
    shapes["CNN_proj/W_proj"], shapes["CNN_proj/b_proj"] = (F, P), (P,)
    for direction in range(2):
        for layer in range(lstm["n_layers"]):
            cell = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            shapes[f"{cell}/W_0"], shapes[f"{cell}/B"], shapes[f"{cell}/W_P_0"] = (2 * P, 4 * H), (4 * H,), (H, P)
    return shapes


def random_weights(seed: int, options: dict = OPTIONS) -> dict[str, np.ndarray]:
    """Random weights at the committed model's scales: N(0, 1/sqrt(fan in)) for the char CNN, highway and
    projection, highway carry biases near -1 (mostly carry), LSTM inputs N(0, 0.065), gate biases N(0, 0.5) with the
    forget gate's (the third of i, j, f, o) raised by 0.5, and the LSTM projection N(0, 3.5/sqrt(H)), large enough
    that the projection clip is reached."""
    rng = np.random.default_rng(seed)
    H = options["lstm"]["dim"]
    out = {}
    for name, shape in weight_shapes(options).items():
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
        if name == "char_embed":
            w = rng.normal(0.0, 1.0, shape)
        elif name.endswith("/W_0"):
            w = rng.normal(0.0, 0.065, shape)
        elif name.endswith("/W_P_0"):
            w = rng.normal(0.0, 3.5 / np.sqrt(H), shape)
        elif name.endswith("/B"):
            w = rng.normal(0.0, 0.5, shape)
            w[2 * H : 3 * H] += 0.5
        elif name.endswith("/b_carry"):
            w = rng.normal(-1.0, 0.5, shape)
        elif "/b_" in name:
            w = rng.normal(0.0, 0.15, shape)
        else:
            w = rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape)
        out[name] = w.astype(np.float32)
    return out


def write_model(directory: Path, seed: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "options.json").write_text(json.dumps(OPTIONS))
    with h5py.File(directory / "weights.hdf5", "w") as f:
        for name, w in random_weights(seed).items():
            f.create_dataset(name, data=w)


def read_sentences(directory: Path) -> list[list[str]]:
    """The sentences as allennlp's `elmo` command read them: ``line.strip().split()``."""
    return [line.strip().split() for line in (directory / "sentences.txt").read_text("utf-8").splitlines()]


def expected_layout(sentences: list[list[str]], options: dict = OPTIONS) -> tuple[dict, dict[str, str]]:
    """What `expected` writes for `sentences`: ``{dataset: (shape, dtype)}`` and the ``sentence_to_index`` mapping
    (a repeated line keeps its last index, as allennlp's command did)."""
    L, P = options["lstm"]["n_layers"], options["lstm"]["projection_dim"]
    datasets = {str(i): ((L + 1, len(s), 2 * P), np.dtype(np.float32)) for i, s in enumerate(sentences)}
    datasets["sentence_to_index"] = ((1,), np.dtype(object))
    return datasets, {" ".join(s): str(i) for i, s in enumerate(sentences)}


def allennlp_layers(directory: Path, sentences: list[list[str]]) -> list[np.ndarray]:
    """allennlp's `(L+1, n, 2P)` float32 layers of each sentence, stateless (needs allennlp)."""
    import torch
    from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids

    bilm = _ElmoBiLm(str(directory / "options.json"), str(directory / "weights.hdf5"))
    out = []
    with torch.no_grad():
        for start in range(0, len(sentences), BATCH):
            batch = sentences[start : start + BATCH]
            bilm._elmo_lstm.reset_states()  # allennlp carries LSTM state across batches: every batch from zero
            acts = bilm(batch_to_ids(batch))["activations"]  # L+1 of (B, T+2, 2P), <S> and </S> included
            layers = torch.stack([a[:, 1:-1] for a in acts], dim=1)  # (B, L+1, T, 2P)
            out.extend(layers[b, :, : len(s)].numpy().astype(np.float32) for b, s in enumerate(batch))
    return out


def write_expected(directory: Path) -> None:
    sentences = read_sentences(directory)
    layers = allennlp_layers(directory, sentences)
    datasets, index = expected_layout(sentences)
    with h5py.File(directory / "expected_all.hdf5", "w") as f:
        f.attrs["layout"], f.attrs["oracle"] = LAYOUT, ORACLE
        for i, x in enumerate(layers):
            assert (x.shape, x.dtype) == datasets[str(i)], (i, x.shape)
            f.create_dataset(str(i), data=x)
        f.create_dataset("sentence_to_index", data=[json.dumps(index)], dtype=h5py.string_dtype())


def write_char_ids(path: Path) -> None:
    from allennlp.data.token_indexers.elmo_indexer import ELMoCharacterMapper

    data = json.loads(path.read_text("utf-8"))
    for entry in data["tokens"]:
        ids = [int(i) for i in ELMoCharacterMapper.convert_word_to_char_ids(entry["token"])]
        entry.update(utf8_bytes=len(entry["token"].encode("utf-8")), allennlp_ids=ids, raw_ids=[i - 1 for i in ids])
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("model", "expected", "char-ids"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    {"model": lambda: write_model(args.path, args.seed), "expected": lambda: write_expected(args.path),
     "char-ids": lambda: write_char_ids(args.path)}[args.what]()


if __name__ == "__main__":
    main(sys.argv[1:])

"""tests/make_reference.py, the generator of allennlp's reference files, against the committed files: what can be
checked without allennlp (the layout each command writes, the character ids' arithmetic, the clips the model is
meant to reach)."""
import json

import h5py
import numpy as np
import pytest
import torch

import make_reference as mr
from make_reference import REFERENCE


def _datasets(path):
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: out.__setitem__(name, (obj.shape, obj.dtype))
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def test_the_committed_model_has_the_layout_the_generator_writes(tmp_path):
    mr.write_model(tmp_path, seed=1)
    assert json.loads((REFERENCE / "options.json").read_text()) == mr.OPTIONS
    written = _datasets(tmp_path / "weights.hdf5")
    assert written == _datasets(REFERENCE / "weights.hdf5")
    assert written == {name: (shape, np.dtype(np.float32)) for name, shape in mr.weight_shapes().items()}


def test_the_committed_vectors_have_the_layout_the_generator_writes():
    sentences = mr.read_sentences(REFERENCE)
    datasets, index = mr.expected_layout(sentences)
    assert _datasets(REFERENCE / "expected_all.hdf5") == datasets
    with h5py.File(REFERENCE / "expected_all.hdf5") as f:
        assert json.loads(f["sentence_to_index"][0]) == index
        assert (f.attrs["layout"], f.attrs["oracle"]) == (mr.LAYOUT, mr.ORACLE)
    assert len(sentences) == 16 and max(len(s) for s in sentences) == 120  # the README's sentences


def test_the_character_ids_are_allennlps_minus_one_of_each_tokens_bytes():
    for path in (REFERENCE.parent / "char_ids.json", REFERENCE / "char_ids.json"):
        tokens = json.loads(path.read_text("utf-8"))["tokens"]
        assert len(tokens) == 25
        for t in tokens:
            assert t["utf8_bytes"] == len(t["token"].encode("utf-8"))
            assert t["raw_ids"] == [i - 1 for i in t["allennlp_ids"]] and len(t["allennlp_ids"]) == 50
            if t["token"] not in ("<S>", "</S>"):  # allennlp's own ids for those; a word: 258, bytes, 259, 260...
                body = list(t["token"].encode("utf-8"))[:48]
                assert t["raw_ids"][: len(body) + 2] == [258, *body, 259]
                assert set(t["raw_ids"][len(body) + 2 :]) <= {260}


def _clip_fractions(directory):
    """Of every LSTM step on the reference sentences, the fraction of cell values and of projected outputs beyond
    their clip before it is applied (the training LSTM's loop, the cell math written out here)."""
    from elmo_cli.inputs import char_ids_batch
    from elmo_cli.loading import load_model
    from elmo_cli.model import lstm

    seen = {"cell": [0, 0], "projection": [0, 0]}
    real = lstm.lstm_cell

    def counting(z, c, w_proj, cell_clip, proj_clip, fast=False, mm=torch.matmul):
        i, j, f, o = z.unbind(-3)
        cell = torch.sigmoid(i) * torch.tanh(j) if c is None else torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
        h = mm(torch.sigmoid(o) * torch.tanh(cell.clamp(-cell_clip, cell_clip)), w_proj)
        for key, x, clip in (("cell", cell, cell_clip), ("projection", h, proj_clip)):
            seen[key][0] += int((x.abs() > clip).sum())
            seen[key][1] += x.numel()
        return real(z, c, w_proj, cell_clip, proj_clip, fast, mm)

    loaded = load_model(directory, device="cpu")
    sentences = [s for s in mr.read_sentences(REFERENCE) if s]
    chars, lengths = char_ids_batch(loaded.text.chars, sentences)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lstm, "lstm_cell", counting)
        with torch.no_grad():
            loaded.model.embed(chars, lengths)
    return {key: hits / max(n, 1) for key, (hits, n) in seen.items()}


@pytest.mark.parametrize("which", ["committed", "generated"])
def test_the_models_reach_their_cell_and_projection_clips(which, tmp_path):
    """The reference model exists to exercise clipping: on its sentences both clips fire, on the committed model
    and on one the generator makes."""
    directory = REFERENCE
    if which == "generated":
        mr.write_model(tmp_path, seed=0)
        (tmp_path / "sentences.txt").write_text((REFERENCE / "sentences.txt").read_text("utf-8"), encoding="utf-8")
        directory = tmp_path
    fractions = _clip_fractions(directory)
    assert 0.001 < fractions["cell"] < 0.5 and 0.001 < fractions["projection"] < 0.5, fractions

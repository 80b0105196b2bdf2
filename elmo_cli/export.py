"""`elmo-cli export`: a clean, prediction-ready model directory from a run directory (or bilm-tf files).

The output holds exactly what prediction and other tools need, re-written (not copied) after a full load, so a
file that does not match its options is caught here rather than by the user of the export:

    options.json     prediction form (n_characters 262 in byte mode), no training keys
    weights.hdf5     bilm-tf layout (docs/formats.md, weights.hdf5), read by allennlp's ``Elmo(options_file, weight_file)``
    softmax.hdf5     ``W (V, P)``, ``b (V,)`` when the model has a softmax
    vocab.txt, chars.json, spm.model     when the source directory has them; an ELMoForManyLangs model's
                                         dictionaries become chars.json (`vocab.chars.EfmlChars`)

A model that embeds words (ELMoForManyLangs') adds ``word_embed`` to weights.hdf5 and ``word_embedding`` to
options.json: every elmo-cli command reads it, allennlp's ``Elmo`` cannot (it has no word embedding).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from elmo_cli.bilm_format import save_model_dir
from elmo_cli.loading import load_model
from vocab.text import check_new_output, temporary_path
from vocab.tokenize import CHARS_FILE, SPM_FILE, VOCAB_FILE


def export_model(output: Path, model_dir: Path | None = None, options: Path | None = None,
                 weights: Path | None = None, force: bool = False) -> list[str]:
    """Write the prediction directory `output` (built under a temporary name, renamed when complete).

    # Returns
    the names of the files written.
    """
    output = Path(output)
    check_new_output(output, force, directory=True)
    loaded = load_model(model_dir, options, weights, "cpu")
    model = loaded.model
    tmp = temporary_path(output)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_model_dir(model, tmp)
        if loaded.text.chars.mode == "efml":  # an ELMoForManyLangs directory: its dictionaries as chars.json
            loaded.text.save_to(tmp)
        elif loaded.directory is not None:  # a model directory (also when given as its options.json)
            for name in (VOCAB_FILE, CHARS_FILE, SPM_FILE):
                if (loaded.directory / name).is_file():
                    shutil.copyfile(loaded.directory / name, tmp / name)
        if output.exists():  # --force
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            os.replace(output, old)
            os.replace(tmp, output)
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        else:
            os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(p.name for p in output.iterdir())

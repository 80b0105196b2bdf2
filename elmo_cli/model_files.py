"""Which files a model argument names: every command's ``--model``, ``--options``, ``--weights`` (and the Python
API's) resolved to a biLM's `ModelFiles` — a model directory, an options.json file with its weights beside it
(``x_options.json`` + ``x_weights.hdf5``, as the published ELMo models are named) or given, the two bilm-tf files,
an ELMoForManyLangs model directory (`vocab.efml`), or URLs of the bilm-tf files (downloaded once into the cache, `elmo_cli.fetch`). Each mistake is one `ElmoError` naming the path
and the flag. The files' contents are read by `elmo_cli.bilm_format`.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from elmo_cli.fetch import fetch, is_url
from vocab.efml import CONFIG_FILE, ENCODER, is_efml_dir
from vocab.errors import ElmoError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


@dataclass(frozen=True)
class ModelFiles:
    """Where a biLM's files are. `directory` holds vocab.txt, chars.json and spm.model when the model came as a
    directory (a run or an `export`); a bare bilm-tf pair (the published files) has none. An ELMoForManyLangs
    directory (`efml`) has its config.json as `options` and its encoder.pkl as `weights` (`elmo_cli.efml`)."""

    options: Path
    weights: Path
    softmax: Path | None = None
    directory: Path | None = None
    efml: bool = False

    def __str__(self) -> str:
        return str(self.directory) if self.directory is not None else str(self.options)


def weights_beside(options: Path) -> Path:
    """The weights file named like a published options file: ``x_options.json`` -> ``x_weights.hdf5``,
    ``options.json`` -> ``weights.hdf5`` (the last ``options`` in the name becomes ``weights``)."""
    stem = options.name[: -len(options.suffix)] if options.suffix else options.name
    i = stem.rfind("options")
    if i < 0:
        raise ElmoError(f"{options}: cannot tell its weights file (no 'options' in the name to replace by "
                        f"'weights'); pass --weights F")
    return options.with_name(stem[:i] + "weights" + stem[i + len("options"):] + ".hdf5")


def _check_kind(path: Path, flag: str, want_hdf5: bool) -> None:
    """A missing file, or an HDF5 file given as options (or the reverse), named in one line."""
    if not path.exists():
        raise ElmoError(f"{path}: {'weights' if want_hdf5 else 'options'} file not found ({flag})")
    if path.is_dir():
        raise ElmoError(f"{path}: {flag} takes a file, not a directory")
    with open(path, "rb") as f:
        head = f.read(len(HDF5_SIGNATURE))
    if head == HDF5_SIGNATURE and not want_hdf5:
        raise ElmoError(f"{path}: an HDF5 file, not an options JSON file (given as {flag}: are the options and "
                        f"weights files swapped?)")
    if head != HDF5_SIGNATURE and want_hdf5:
        if head.lstrip().startswith(b"{"):
            raise ElmoError(f"{path}: a JSON file, not HDF5 weights (given as {flag}: are the options and weights "
                            f"files swapped?)")
        raise ElmoError(f"{path}: not an HDF5 weights file ({'empty' if not head else 'truncated or another format'})")


def weights_url_beside(url: str) -> str:
    """The weights URL named like a published options URL (`weights_beside` on the URL's file name)."""
    parts = urllib.parse.urlsplit(url)
    folder, _, name = parts.path.rpartition("/")
    try:
        weights = weights_beside(Path(name or "_")).name
    except ElmoError:
        raise ElmoError(f"{url}: cannot tell its weights URL (no 'options' in the file name to replace by "
                        f"'weights'); pass --weights URL") from None
    return urllib.parse.urlunsplit(parts._replace(path=f"{folder}/{weights}", query="", fragment=""))


def _fetched(model, options, weights) -> tuple:
    """The model arguments with each http(s) URL replaced by its downloaded (or cached) file, `elmo_cli.fetch`;
    ``--model URL`` brings the weights URL beside it. Combinations that are mistakes pass unchanged."""
    both_models = model is not None and options is not None
    half_pair = options is not None and weights is None or model is None and options is None
    if both_models or half_pair:
        return model, options, weights
    if is_url(model) and weights is None:
        weights = weights_url_beside(model)
    return tuple(fetch(a) if is_url(a) else a for a in (model, options, weights))


def resolve_model_files(model: Path | str | None, options: Path | str | None,
                        weights: Path | str | None) -> ModelFiles:
    """The files of a biLM given as a model directory, an options.json path (weights beside it, or `weights`),
    or the two bilm-tf files; each of them may be an http(s) URL (downloaded once into the cache). Each mistake is
    one ElmoError naming the path and the flag."""
    if any(is_url(a) for a in (model, options, weights)):
        model, options, weights = _fetched(model, options, weights)
    if model is not None:
        model = Path(model)
        if options is not None:
            raise ElmoError("give either --model or --options, not both (--model takes a directory or an "
                            "options.json file)")
        if model.is_dir():
            if weights is not None:
                raise ElmoError(f"--weights goes with an options.json file, not a model directory ({model})")
            if is_efml_dir(model):
                return ModelFiles(model / CONFIG_FILE, model / ENCODER, None, model, efml=True)
            for name in ("options.json", "weights.hdf5"):
                if not (model / name).is_file():
                    raise ElmoError(f"{model}: not a model directory (no {name}); a trained run directory or an "
                                    f"`elmo-cli export` output has options.json and weights.hdf5, an "
                                    f"ELMoForManyLangs model config.json, char.dic and its .pkl files")
            sm = model / "softmax.hdf5"
            return ModelFiles(model / "options.json", model / "weights.hdf5", sm if sm.is_file() else None, model)
        if not model.exists():
            raise ElmoError(f"{model}: not found (--model takes a model directory or an options.json file)")
        if model.name == CONFIG_FILE and weights is None and is_efml_dir(model.parent):
            return resolve_model_files(model.parent, None, None)  # lv.model/config.json means lv.model/
        if model.name == "options.json" and weights is None and (model.parent / "weights.hdf5").is_file():
            return resolve_model_files(model.parent, None, None)  # run/options.json means the directory run/
        options = model
        _check_kind(options, "--model", want_hdf5=False)
        if weights is None:
            weights = weights_beside(model)
            if not weights.exists():
                raise ElmoError(f"{options}: its weights file {weights.name} is not beside it; pass --weights F")
        flag = "--model"
    else:
        if options is None and weights is None:
            raise ElmoError("a model is needed: --model DIR or --model OPTIONS.json, or --options F --weights F")
        if weights is None:
            raise ElmoError(f"--options {options} needs --weights F (the weights.hdf5 of the same model)")
        if options is None:
            raise ElmoError(f"--weights {weights} needs the options.json of the same model: --options F or "
                            f"--model F")
        flag = "--options"
    options, weights = Path(options), Path(weights)
    _check_kind(options, flag, want_hdf5=False)
    _check_kind(weights, "--weights", want_hdf5=True)
    return ModelFiles(options, weights)


def model_files(model: Path | str | ModelFiles | None = None, options: Path | str | None = None,
                weights: Path | str | None = None) -> ModelFiles:
    """`ModelFiles` from what a command was given (see the module docstring); a `ModelFiles` passes through."""
    if isinstance(model, ModelFiles):
        return model
    return resolve_model_files(model, options, weights)

"""An ELMoForManyLangs model directory's text files: which config it uses, and its character and word dictionaries.

ELMoForManyLangs (HIT-SCIR's ``elmoformanylangs``, the 44 published CoNLL 2018 models) unzips into::

    config.json          its training arguments; ``config_path`` names the model config
    <model config>.json  encoder (``elmo``: projection_dim, dim, n_layers, cell_clip, proj_clip) and token_embedder
                         (``cnn``: filters, n_highway, activation, char_dim, word_dim, max_characters_per_token)
    char.dic             ``character<TAB>id`` per line, with the entries <oov> <pad> <bow> <eow> <bos> <eos>
    word.dic             ``word<TAB>id`` per line, with <oov> <bos> <eos> <pad> (read when word_dim > 0)
    token_embedder.pkl   the token embedder's state dict (read by `elmo_cli.efml`)
    encoder.pkl          the biLSTM's state dict

The model config is found where EFML's ``Embedder`` finds it: ``config_path`` inside the directory, then its file
name inside the directory (published models name an absolute path on their makers' machine), then EFML's own copies
of the two configs it ships (`PACKAGED_CONFIGS`). A dictionary line is read as EFML reads it: stripped, split at
tabs, and a line left with one field is the character U+3000 (its whitespace was stripped away); lines end where
``str.splitlines`` ends them, as in EFML's ``codecs`` reader. This module
reads text only; `elmo_cli.efml` reads the weights.
"""
from __future__ import annotations

from pathlib import Path

from vocab.chars import MAX_CHARS, EfmlChars
from vocab.errors import ElmoError
from vocab.text import read_json

CONFIG_FILE = "config.json"
CHAR_DIC, WORD_DIC = "char.dic", "word.dic"
TOKEN_EMBEDDER, ENCODER = "token_embedder.pkl", "encoder.pkl"
CHAR_SPECIALS = ("<oov>", "<pad>", "<bow>", "<eow>", "<bos>", "<eos>")
WORD_SPECIALS = ("<oov>", "<pad>")

# The model config EFML's package ships under both names (elmoformanylangs 0.0.4, configs/): every published model
# was trained with it. The values are EFML's; elmo-cli looks here only when the model directory lacks the file.
_PUBLISHED = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu",
                       "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                       "n_highway": 2, "word_dim": 100, "char_dim": 50, "max_characters_per_token": 50},
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
PACKAGED_CONFIGS = {"cnn_50_100_512_4096_sample.json": _PUBLISHED, "cnn_0_100_512_4096_sample.json": _PUBLISHED}


def is_efml_dir(directory: Path) -> bool:
    """Whether `directory` looks like an ELMoForManyLangs model (config.json and a .pkl, no options.json)."""
    directory = Path(directory)
    return ((directory / CONFIG_FILE).is_file() and not (directory / "options.json").exists()
            and ((directory / ENCODER).exists() or (directory / TOKEN_EMBEDDER).exists()))


def model_config(directory: Path) -> tuple[dict, str]:
    """The model config of an EFML directory and where it was found (a path, or EFML's packaged copy)."""
    directory = Path(directory)
    args = read_json(directory / CONFIG_FILE, "ELMoForManyLangs config.json")
    if not isinstance(args, dict) or not isinstance(args.get("config_path"), str):
        raise ElmoError(f"{directory / CONFIG_FILE}: no 'config_path' naming the model config (an "
                        f"ELMoForManyLangs config.json has one)")
    named = args["config_path"]
    tried = [directory / named, directory / Path(named).name]
    for path in tried:
        if path.is_file():
            return read_json(path, "ELMoForManyLangs model config"), str(path)
    if Path(named).name in PACKAGED_CONFIGS:
        return PACKAGED_CONFIGS[Path(named).name], f"ELMoForManyLangs' packaged {Path(named).name}"
    raise ElmoError(f"{directory / CONFIG_FILE}: config_path {named!r} resolves nowhere (looked for "
                    f"{tried[0]}, {tried[1]}, and ELMoForManyLangs' packaged {', '.join(PACKAGED_CONFIGS)})")


def read_dictionary(path: Path, specials: tuple[str, ...]) -> dict[str, int]:
    """A ``char.dic``/``word.dic`` as EFML reads it (a later line for the same entry wins); blank lines skipped."""
    path = Path(path)
    if not path.is_file():
        raise ElmoError(f"{path}: not found (an ELMoForManyLangs model directory has {path.name})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ElmoError(f"{path}: not UTF-8 ({e})") from None
    entries: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):  # EFML's codecs reader splits lines as str.splitlines
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        try:
            entry, i = fields[0], int(fields[1]) if len(fields) == 2 else None
        except ValueError:
            i = None
        if i is None:
            raise ElmoError(f"{path}:{lineno}: expected 'entry<TAB>id', got {line.rstrip()!r}")
        entries[entry] = i
    missing = [s for s in specials if s not in entries]
    if missing:
        raise ElmoError(f"{path}: no {' '.join(missing)} entr{'y' if len(missing) == 1 else 'ies'} (ELMoForManyLangs "
                        f"needs {' '.join(specials)})")
    return entries


def _by_id(entries: dict[str, int], rows: int, path: Path) -> list[str]:
    """Entries listed by id, ``""`` where no entry has that id; ids must index the ``rows`` rows of the weights."""
    bad = [(e, i) for e, i in entries.items() if not 0 <= i < rows]
    if bad:
        raise ElmoError(f"{path}: id {bad[0][1]} of {bad[0][0]!r} is outside the {rows} rows of its embedding")
    listed = [""] * rows
    for entry, i in entries.items():
        listed[i] = entry
    return listed


def efml_chars(directory: Path, max_chars: int = MAX_CHARS, char_rows: int | None = None,
               word_rows: int | None = None, with_words: bool = True) -> tuple[EfmlChars, list[int]]:
    """The token encoder of an EFML directory, and for each of its raw character ids the ``char.dic`` id whose
    embedding row it takes (``<eow>``'s for `bow_char`, ``<bow>``'s for `eow_char`: EFML's own assignment).

    # Parameters
    char_rows, word_rows : rows of the character and word embeddings (ids must index them); None: one past the
        largest id. with_words : read ``word.dic`` (the model embeds words: word_dim > 0).
    """
    directory = Path(directory)
    cdic = read_dictionary(directory / CHAR_DIC, CHAR_SPECIALS)
    by_id = _by_id(cdic, char_rows if char_rows is not None else max(cdic.values()) + 1, directory / CHAR_DIC)
    characters = [c for c in by_id if len(c) == 1]  # multi-character entries are the specials (or unreachable)
    rows = [cdic[c] for c in characters] + [cdic[s] for s in ("<oov>", "<bos>", "<eos>", "<eow>", "<bow>", "<pad>")]
    words = None
    if with_words:
        wdic = read_dictionary(directory / WORD_DIC, WORD_SPECIALS)
        words = _by_id(wdic, word_rows if word_rows is not None else max(wdic.values()) + 1, directory / WORD_DIC)
    return EfmlChars(characters, max_chars, words), rows


def token_settings(config: dict, directory: Path) -> tuple[int, int]:
    """``(max_characters_per_token, word_dim)`` of an EFML model config's token embedder."""
    try:
        embedder = config["token_embedder"]
        return int(embedder["max_characters_per_token"]), int(embedder.get("word_dim", 0) or 0)
    except (KeyError, TypeError, ValueError) as e:
        raise ElmoError(f"{directory}: ELMoForManyLangs model config without a usable token_embedder ({e})") from None


def read_efml_chars(directory: Path) -> EfmlChars:
    """The token encoder of an EFML directory, for shards made to fine-tune it (`vocab.shards`)."""
    max_chars, word_dim = token_settings(model_config(directory)[0], directory)
    return efml_chars(directory, max_chars, with_words=word_dim > 0)[0]

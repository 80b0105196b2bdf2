"""Model configuration: the `lstm` and `char_cnn` sections of bilm-tf's options.json (docs/formats.md, options.json), as dataclasses.

`ModelConfig.from_options(json.load(f))` accepts both bilm-tf forms (`n_characters` 261 or 262) and training-only
keys, and `to_options()` writes the prediction form (262) that allennlp reads. The named shapes are in `elmo_cli.presets`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocab.errors import ElmoError
from vocab.text import read_json

# Keys bilm-tf writes at the top level of options.json that describe training, not the network.
TRAINING_OPTION_KEYS = {
    "bidirectional", "dropout", "all_clip_norm_val", "n_epochs", "n_train_tokens", "batch_size", "unroll_steps",
    "n_negative_samples_batch", "n_tokens_vocab", "share_embedding_softmax", "sample_softmax", "char_cnn_only",
}

PUBLISHED_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))


@dataclass(frozen=True)
class CharCNNConfig:
    """The token encoder: char embedding -> CNN filters -> max-pool -> activation -> highway -> projection."""

    filters: tuple[tuple[int, int], ...] = PUBLISHED_FILTERS  # (width, count) per filter bank
    n_highway: int = 2
    activation: str = "relu"  # relu | tanh, applied after max-pooling; highway layers are always relu
    embedding_dim: int = 16
    n_characters: int = 262  # rows of the char table in prediction form: raw ids + 1 (0 = "no token")
    max_characters_per_token: int = 50
    # A word embedding beside the characters (ELMoForManyLangs' models, `vocab.chars.EfmlChars`): its rows in
    # prediction form (words + 1) and width D; the projection then reads [word embedding ; highway output].
    n_words: int = 0
    word_dim: int = 0

    @property
    def n_filters(self) -> int:
        """F, the width of the concatenated filter outputs."""
        return sum(n for _, n in self.filters)

    @property
    def max_width(self) -> int:
        return max(w for w, _ in self.filters)

    @property
    def row_width(self) -> int:
        """Ids per token row: the characters, then the word id when the model embeds words."""
        return self.max_characters_per_token + (self.word_dim > 0)


@dataclass(frozen=True)
class LSTMConfig:
    dim: int = 4096  # H, the cell size
    projection_dim: int = 512  # P, also the token-embedding width
    n_layers: int = 2
    cell_clip: float | None = 3.0  # None = no clipping (bilm-tf: falsy)
    proj_clip: float | None = 3.0
    use_skip_connections: bool = True


@dataclass(frozen=True)
class ModelConfig:
    char_cnn: CharCNNConfig = field(default_factory=CharCNNConfig)
    lstm: LSTMConfig = field(default_factory=LSTMConfig)

    @property
    def output_dim(self) -> int:
        """2P, the width of every output layer."""
        return 2 * self.lstm.projection_dim

    # ---- options.json -----------------------------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: dict[str, Any], source: str = "options.json") -> "ModelConfig":
        """Parse a bilm-tf options dict; raises ElmoError naming `source` on a missing or malformed key."""
        try:
            lstm, cnn = options["lstm"], options["char_cnn"]
            n_chars = int(cnn["n_characters"])
            if n_chars == 261:  # training-time form: the loader adds the padding row
                n_chars = 262
            cell_clip = lstm.get("cell_clip") or None
            proj_clip = lstm.get("proj_clip") or None
            filters = tuple((int(w), int(n)) for w, n in cnn["filters"])
            words = cnn.get("word_embedding") or {}
            cfg = cls(
                char_cnn=CharCNNConfig(
                    filters=filters,
                    n_highway=int(cnn.get("n_highway", 0) or 0),
                    activation=str(cnn.get("activation", "relu")),
                    embedding_dim=int(cnn["embedding"]["dim"]),
                    n_characters=n_chars,
                    max_characters_per_token=int(cnn.get("max_characters_per_token", 50)),
                    n_words=int(words.get("n_words", 0)),
                    word_dim=int(words.get("dim", 0)),
                ),
                lstm=LSTMConfig(
                    dim=int(lstm["dim"]),
                    projection_dim=int(lstm.get("projection_dim", lstm["dim"])),
                    n_layers=int(lstm["n_layers"]),
                    cell_clip=float(cell_clip) if cell_clip else None,
                    proj_clip=float(proj_clip) if proj_clip else None,
                    use_skip_connections=bool(lstm.get("use_skip_connections", False)),
                ),
            )
        except KeyError as e:
            raise ElmoError(f"{source}: missing key {e} (expected bilm-tf options with 'lstm' and 'char_cnn')")
        except (TypeError, ValueError) as e:
            raise ElmoError(f"{source}: malformed options ({e})")
        cfg.validate(source)
        return cfg

    def validate(self, source: str = "config") -> None:
        c, l = self.char_cnn, self.lstm
        if c.activation not in ("relu", "tanh"):
            raise ElmoError(f"{source}: char_cnn.activation must be 'relu' or 'tanh', got {c.activation!r}")
        if not c.filters or any(w < 1 or n < 1 for w, n in c.filters):
            raise ElmoError(f"{source}: char_cnn.filters must be a non-empty list of [width, count] with both >= 1")
        if c.max_width > c.max_characters_per_token:
            raise ElmoError(f"{source}: a filter is wider ({c.max_width}) than max_characters_per_token "
                            f"({c.max_characters_per_token})")
        if l.n_layers < 1 or l.dim < 1 or l.projection_dim < 1:
            raise ElmoError(f"{source}: lstm.dim, lstm.projection_dim and lstm.n_layers must be >= 1")
        if c.n_characters < 6:
            raise ElmoError(f"{source}: char_cnn.n_characters must be at least 6, got {c.n_characters}")
        if (c.word_dim > 0) != (c.n_words > 1) or c.word_dim < 0:
            raise ElmoError(f"{source}: char_cnn.word_embedding needs both dim >= 1 and n_words >= 2, got dim "
                            f"{c.word_dim} and n_words {c.n_words}")

    def to_options(self) -> dict[str, Any]:
        """The prediction-form options.json dict (n_characters 262 in byte mode), as allennlp reads it."""
        c, l = self.char_cnn, self.lstm
        words = {"word_embedding": {"dim": c.word_dim, "n_words": c.n_words}} if c.word_dim else {}
        return {
            "lstm": {
                "use_skip_connections": l.use_skip_connections,
                "projection_dim": l.projection_dim,
                "cell_clip": l.cell_clip if l.cell_clip is not None else 0,
                "proj_clip": l.proj_clip if l.proj_clip is not None else 0,
                "dim": l.dim,
                "n_layers": l.n_layers,
            },
            "char_cnn": {
                "activation": c.activation,
                "filters": [[w, n] for w, n in c.filters],
                "n_highway": c.n_highway,
                "embedding": {"dim": c.embedding_dim},
                "n_characters": c.n_characters,
                "max_characters_per_token": c.max_characters_per_token,
                **words,
            },
        }


def load_options(path: Path) -> ModelConfig:
    options = read_json(path, "options file")
    if not isinstance(options, dict):
        raise ElmoError(f"{path}: options must be a JSON object")
    return ModelConfig.from_options(options, source=str(path))

"""The biLM as torch modules.

Shape letters used in every docstring and reshape comment:
    B batch rows, T timesteps, W characters per token (50), N tokens (flattened), U distinct tokens,
    E char-embedding dim, F total CNN filters, P projection dim, H LSTM cell dim, L LSTM layers, V vocabulary size.

Character ids at this boundary are in *prediction form*: the raw ids of docs/formats.md, Character ids plus 1, with 0 meaning "no token"
(batch padding). `vocab` produces raw ids; `to_model_chars` shifts them.
"""
from elmo_cli.model.bilm import BiLM, to_model_chars
from elmo_cli.model.encoder import TokenEncoder
from elmo_cli.model.lstm import LSTMStack, ProjectedLSTMLayer
from elmo_cli.model.scalar_mix import ScalarMix
from elmo_cli.model.softmax import SharedSoftmax, log_uniform_sample

__all__ = [
    "BiLM", "TokenEncoder", "LSTMStack", "ProjectedLSTMLayer", "ScalarMix", "SharedSoftmax", "log_uniform_sample",
    "to_model_chars",
]

"""Task models on ELMo (the paper's §4-5 use of a frozen biLM): tagging and sentence classification.

    from elmo_cli.tasks import ElmoFeatures, LayerCache
    from elmo_cli import Embedder

    emb = Embedder("model/")
    elmo = ElmoFeatures(emb, cache=LayerCache(emb))        # a torch.nn.Module: learned ScalarMix + dropout
    vectors, mask = elmo([["The", "cat", "sat"], ["Hi"]])   # (B, T, 2P) float32, bool (B, T)

Modules: kinds (the task kinds: `TaskKind`, its registry `register_kind` / `get_kind`), formats (CoNLL, CoNLL-U,
TSV readers and writers), metrics (accuracy, macro-F1, conlleval span F1),
features (the layer cache and ElmoFeatures), model (TaskModel), train, compare (the ablation table), apply
(evaluate and predict with a task directory), store (the task directory), vectors (GloVe / word2vec), cli
(`task_app`, the `elmo-cli task` commands). Names are imported lazily: ``import elmo_cli.tasks`` loads no torch.
"""
from __future__ import annotations

__all__ = ["ElmoFeatures", "LayerCache", "TaskModel", "TaskConfig", "TrainSettings", "train_task", "compare",
           "evaluate_file", "predict_file", "TaskKind", "register_kind", "get_kind"]

_LAZY = {"ElmoFeatures": "elmo_cli.tasks.features", "LayerCache": "elmo_cli.tasks.features",
         "TaskModel": "elmo_cli.tasks.model", "TaskConfig": "elmo_cli.tasks.model",
         "TrainSettings": "elmo_cli.tasks.train", "train_task": "elmo_cli.tasks.train",
         "compare": "elmo_cli.tasks.compare", "evaluate_file": "elmo_cli.tasks.apply",
         "predict_file": "elmo_cli.tasks.apply", "TaskKind": "elmo_cli.tasks.kinds",
         "register_kind": "elmo_cli.tasks.kinds", "get_kind": "elmo_cli.tasks.kinds"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'elmo_cli.tasks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

"""Shared helpers for the training tests: a small learnable corpus, its shards, and a tiny model config."""
from __future__ import annotations

import random
from pathlib import Path

from elmo_cli.presets import build_config
from elmo_cli.train_config import RunConfig
from vocab.shards import write_shards
from vocab.vocabulary import build_vocab

SUBJECTS = ["the cat", "a dog", "my old friend", "the bird", "her sister", "our neighbour"]
VERBS = ["sees", "likes", "follows", "hears", "finds"]
OBJECTS = ["the garden", "a small house", "the river", "his letter", "the red ball", "a quiet room"]
TAILS = [".", "today .", "again .", "in the morning ."]


def corpus_lines(n: int, seed: int = 0) -> list[str]:
    """Sentences of a tiny grammar (about 40 word types): easy to learn, so the loss must fall."""
    rng = random.Random(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}"
            for _ in range(n)]


def make_shards(root: Path, n_train: int = 300, n_valid: int = 40) -> tuple[Path, Path, Path]:
    """Vocabulary + train shards + validation shards under ``root``; returns (vocab, train_dir, valid_dir)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.txt").write_text("\n".join(corpus_lines(n_train, 0)) + "\n", encoding="utf-8")
    (root / "valid.txt").write_text("\n".join(corpus_lines(n_valid, 1)) + "\n", encoding="utf-8")
    vocab = root / "vocab.txt"
    build_vocab([root / "train.txt"], vocab)
    write_shards([root / "train.txt"], vocab, root / "train", tokens_per_shard=1000, seed=0)
    write_shards([root / "valid.txt"], vocab, root / "valid", seed=0)
    return vocab, root / "train", root / "valid"


TINY_MODEL = {"lstm": {"dim": 32, "projection_dim": 16, "n_layers": 2, "cell_clip": 3, "proj_clip": 3},
              "char_cnn": {"filters": [[1, 8], [2, 8]], "n_highway": 1, "embedding": {"dim": 4}}}


def tiny_config(**training) -> RunConfig:
    base = {"batch_size": 4, "unroll_steps": 8, "n_negative_samples": 16, "log_every": 5, "checkpoint_every": 10,
            "checkpoint_minutes": 0, "threads": 1, "device": "cpu"}
    base.update(training)
    return build_config({**TINY_MODEL, "training": base}, "tiny")


def two_process_steps(rank: int, world: int, init_file: str, train_dir: str, out: str, steps: int) -> None:
    """One gloo process of a torchrun-like job of `world` (`torch.multiprocessing.spawn`'s target): `steps` training
    steps of the tiny model with dropout and clipping on, then its losses, parameters and Adagrad sums saved to
    ``out/rank{rank}.pt``; the group is then left as `train` leaves it."""
    import torch
    import torch.distributed as dist
    from elmo_cli.distributed import leave_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    _steps_saved(rank, world, train_dir, out, steps)
    leave_process_group()


def _steps_saved(rank: int, world: int, train_dir: str, out: str, steps: int) -> None:
    import torch
    from elmo_cli.distributed import Dist
    from elmo_cli.train import _Trainer
    from vocab.shards import ShardDataset

    dataset = ShardDataset(Path(train_dir))
    trainer = _Trainer.bare(tiny_config(dropout=0.3, clip_norm=1.0), dataset, Dist(rank, world, rank))
    trainer.state.total_steps = steps
    losses = [trainer.step()[:3] for _ in range(steps)]
    model = trainer.state.model
    sums = {name: trainer.state.optimizer.state[p]["sum"] for name, p in model.named_parameters()}
    torch.save({"losses": losses, "params": dict(model.named_parameters()), "sums": sums,
                "ddp": type(trainer.state.wrapped).__name__}, Path(out) / f"rank{rank}.pt")

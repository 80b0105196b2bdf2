"""The operations one training step dispatches, by part: what the CUDA-graph step (`elmo_cli.graphed`) replaces.

Counts every aten operation (a `TorchDispatchMode`; on a GPU nearly every one is a kernel launch, views aside) of
one step of the biLM loss, forward and backward, with 20-step windows, 2 layers per direction and sentence resets
(every preset's loop), and of `BiLM.lm_stacks` alone, the part a step replays from graphs. The count does not
depend on the model's width, so a small model on the CPU gives it; fp32 and bf16 autocast (whose casts add
operations) both. Writes benchmarks/results/launches-DATE.json.

    python -m benchmarks.bench_launches
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.results import Recording
from elmo_cli.model.bilm import BiLM
from elmo_cli.presets import build_config
from elmo_cli.train import BiLMLoss

SHAPE = {"lstm": {"dim": 32, "projection_dim": 16, "n_layers": 2, "cell_clip": 3, "proj_clip": 3},
         "char_cnn": {"filters": [[1, 8], [2, 8]], "n_highway": 1, "embedding": {"dim": 4}},
         "training": {"unroll_steps": 20}}
ROWS, VOCAB, NEGATIVES = 4, 100, 16


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def count(autocast: bool) -> dict:
    """Operations of the whole step and of the stacks, forward and backward."""
    cfg = build_config(SHAPE, "tiny")
    torch.manual_seed(0)
    model = BiLM(cfg.model, vocab_size=VOCAB, dropout=0.1).train()
    T, W = cfg.training.unroll_steps, cfg.model.char_cnn.max_characters_per_token
    chars = torch.randint(1, 50, (2, ROWS, T, W))
    targets = torch.randint(0, VOCAB, (ROWS, T))
    states = tuple([layer.zero_state(ROWS) for layer in stack.layers] for stack in model.stacks)
    starts = torch.zeros(ROWS, T, dtype=torch.bool)
    negatives = torch.arange(NEGATIVES)
    out = {}
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)) if autocast else \
        (lambda: torch.autocast("cpu", enabled=False))
    x = model.encoder.forward_distinct(torch.cat([chars[0], chars[1]])).detach().requires_grad_()
    with _Count() as c:
        with ctx():
            f, b, _ = model.lm_stacks(x[:ROWS], x[ROWS:], states, starts)
            forward = c.n
        (f.float().sum() + b.float().sum()).backward()
    out["stacks"] = {"forward": forward, "backward": c.n - forward}
    with _Count() as c:
        with ctx():
            fl, bl, _ = BiLMLoss(model)(chars[0], chars[1], targets, targets, states, (negatives, negatives),
                                        (30, 30), starts)
            forward = c.n
        ((fl + bl) / 2).backward()
    out["step"] = {"forward": forward, "backward": c.n - forward}
    out["step"]["total"] = total = out["step"]["forward"] + out["step"]["backward"]
    out["stacks"]["total"] = stacks = out["stacks"]["forward"] + out["stacks"]["backward"]
    out["stacks_share"] = round(stacks / total, 3)
    return out


def main() -> None:
    torch.set_num_threads(1)
    with Recording("launches", "python -m benchmarks.bench_launches", threads=1) as rec:
        for dtype, autocast in (("fp32", False), ("bf16", True)):
            r = rec.figures[dtype] = count(autocast)
            print(f"{dtype}: a training step dispatches {r['step']['total']:,} operations ({r['step']['forward']:,} "
                  f"forward, {r['step']['backward']:,} backward); the LSTM stacks {r['stacks']['total']:,} of them "
                  f"({r['stacks_share']:.1%}), what a CUDA-graph step replays in two launches", flush=True)


if __name__ == "__main__":
    main()

"""The paper's ablation: the same data and seed trained without ELMo and with it in three ways.

    a  no ELMo                     word embeddings -> BiLSTM
    b  ELMo, top layer             [x_k; gamma * h_top]
    c  ELMo, learned mix           [x_k; gamma * sum_j s_j h_j]            (the L+1 layers)
    d  ELMo, input and output      c, plus [h_k; ELMo'_k] at the BiLSTM output (with --elmo-output)

With ``--char-cnn`` an arm (a+) adds the char-CNN to (a), the stronger baseline the paper compared against, and
the ELMo arms have it too. Every arm is evaluated on the test file (or dev). Each row gives the metric, its
absolute difference from (a) in points, its difference from the strongest arm without ELMo and the relative error
reduction ``(err_base - err) / err_base`` against it, and the mix weights (softmax-normalised) and gamma the arm
learned. The biLM runs once: one `LayerCache` serves every arm (none when it is fine-tuned).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from elmo_cli.tasks import formats
from elmo_cli.tasks.metrics import primary, primary_name
from elmo_cli.tasks.predict import evaluate_examples
from elmo_cli.tasks.store import save_task
from elmo_cli.tasks.train import (TrainSettings, build_model, check_settings, fit, load_embedder, make_cache,
                                  read_data, tokenizer_of)
from vocab.errors import ElmoError

ARMS = (
    ("a", "no-elmo", "no ELMo", "none", False),
    ("b", "elmo-top", "ELMo top layer", "top", False),
    ("c", "elmo-mix", "ELMo mix", "mix", False),
    ("d", "elmo-mix-output", "ELMo mix in + out", "mix", True),
)


def arms_of(elmo_output: bool, char_cnn: bool) -> list[tuple[str, str, str, str, bool, bool]]:
    """The arms to train: (key, directory slug, title, ELMo arm, ELMo at the output, char-CNN). With `char_cnn` the
    no-ELMo baseline comes twice, without and with the char-CNN (the stronger baseline), and every ELMo arm has it."""
    arms = [(key, slug, title, elmo, output, char_cnn and key != "a")
            for key, slug, title, elmo, output in ARMS[: 4 if elmo_output else 3]]
    if char_cnn:
        arms.insert(1, ("a+", "no-elmo-char-cnn", "no ELMo", "none", False, True))
    return [(key, slug, title + (", char-CNN" if chars else ""), elmo, output, chars)
            for key, slug, title, elmo, output, chars in arms]


def error_reduction(baseline: float, value: float) -> float | None:
    """``(err_a - err) / err_a`` with ``err = 1 - metric``: ``error_reduction(0.90, 0.92) -> 0.2``."""
    err_a = 1.0 - baseline
    return (err_a - (1.0 - value)) / err_a if err_a > 0 else None


def compare(s: TrainSettings, test_path: Path | None = None, elmo_output: bool = False,
            on_arm: Callable[[str], None] | None = None, on_epoch: Callable[[dict], None] | None = None) -> dict:
    """Train and evaluate every arm; writes each to ``s.output/<key>-<name>/``. Returns the table as a dict."""
    if s.model_dir is None and s.embeddings is None:
        raise ElmoError("--compare needs the biLM: give --model ELMO_DIR (or --embeddings F.hdf5)")
    check_settings(s)
    embedder = load_embedder(s.model_dir, s.device)
    tokenize, tokenizer = tokenizer_of(embedder)
    data = read_data(s, tokenize)
    eval_path = test_path or s.dev_path
    test = formats.read_examples(eval_path, s.kind, s.fmt, s.label_column, tokenize, s.errors)
    cache = make_cache(s, embedder)
    rows = []
    try:
        for key, slug, title, elmo, output, chars in arms_of(elmo_output, s.char_cnn):
            if on_arm is not None:
                on_arm(f"({key}) {title}")
            arm = replace(s, elmo=elmo, elmo_output=output, char_cnn=chars,
                          output=Path(s.output) / f"{key}-{slug}" if s.output is not None else None)
            uses = elmo != "none" or output
            model, _ = build_model(arm, data, embedder if uses else None, cache if uses else None, tokenizer)
            metrics = fit(model, arm, data, on_epoch)
            metrics["test"] = evaluate_examples(model, test)
            if arm.output is not None:
                save_task(arm.output, model, metrics)
            rows.append({"arm": key, "name": title, "metric": primary(metrics["test"]), "test": metrics["test"],
                         "best_epoch": metrics["best_epoch"], "epochs_run": metrics["epochs_run"],
                         "stopped": metrics["stopped"], "dev_metric": primary(metrics["dev"]),
                         "mix": model.mix_summary(), "seconds": sum(h["seconds"] for h in metrics["history"]),
                         "cache_fill_seconds": metrics["cache_fill_seconds"]})
    finally:
        if cache is not None:
            cache.close()
    base = rows[0]["metric"]
    best = max(row["metric"] for row in rows if row["arm"].startswith("a"))  # the strongest arm without ELMo
    for row in rows:
        row["absolute"] = row["metric"] - base
        row["relative_error_reduction"] = error_reduction(base, row["metric"])
        row["vs_best_baseline"] = row["metric"] - best
        row["relative_error_reduction_vs_best"] = error_reduction(best, row["metric"])
    setup = ("word embedding, BiLSTM, " + ("CRF" if s.crf else "softmax") + " head"
             + ("; the biLM fine-tuned" if s.fine_tune_bilm else "")
             + f"; --patience {s.patience}, at most {s.epochs} epochs")
    return {"metric": primary_name(rows[0]["test"]), "evaluated_on": str(eval_path), "seed": s.seed,
            "setup": setup, "arms": rows, "warnings": data.warnings}

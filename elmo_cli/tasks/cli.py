"""`elmo-cli task ...`: a Typer sub-app (`task_app`) that trains, evaluates and applies task models on ELMo.

Only parsing and printing live here; the work is in `train`, `compare` and `apply`. Each command body runs in
`_user_errors()`: an `ElmoError` becomes ``error: <message>`` on stderr and exit code 1.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from elmo_cli.console import (app_settings, batch_size_option, command, console, device_option, err_console,
                              errors_option, model_option, options_option, output_option, pick_output, threads_option,
                              user_errors as _user_errors, weights_option)
from elmo_cli.console import cache_dir_option, offline_option
from vocab.errors import ElmoError

task_app = typer.Typer(**app_settings("Taggers (CoNLL, CoNLL-U) and sentence classifiers (TSV) on ELMo."))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def _epoch_line(row: dict) -> None:
    dev = row["dev"]
    metric = f"span F1 {_pct(dev['span']['f1'])}" if dev.get("span") else f"accuracy {_pct(dev['accuracy'])}"
    err_console.print(f"  epoch {row['epoch']}: loss {row['train_loss']:.4f}, dev {metric}, "
                      f"macro-F1 {_pct(dev['macro_f1'])} ({row['seconds']:.1f} s, biLM {row['bilm_seconds']:.1f} s)",
                      highlight=False)


def _warn(lines: list[str]) -> None:
    for line in lines:
        err_console.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)


def _weights(m: dict) -> str:
    """``{"weights": [0.46, 0.32, 0.22], "gamma": 0.5} -> ".46 .32 .22 γ=0.50"`` (the table's compact form)."""
    return " ".join(f"{w:.2f}".lstrip("0") if w < 1 else "1" for w in m["weights"]) + f" γ={m['gamma']:.2f}"


def _mix_text(mix: dict) -> str:
    return "; ".join(f"{where} {_weights(m)}" for where, m in mix.items()) or "-"


def _compare_table(result: dict) -> Table:
    table = Table(title=f"{result['metric']} on {result['evaluated_on']} (seed {result['seed']}; every arm: "
                        f"{result['setup']})")
    for col in ("arm", result["metric"], "Δ vs (a)", "Δ vs best baseline", "rel. error reduction",
                "input mix (softmax), γ", "output mix, γ", "best / run"):
        table.add_column(col, justify="left" if "mix" in col or col == "arm" else "right")
    for row in result["arms"]:
        rel, mix = row["relative_error_reduction_vs_best"], row["mix"]
        table.add_row(f"({row['arm']}) {row['name']}", _pct(row["metric"]), f"{100 * row['absolute']:+.2f}",
                      f"{100 * row['vs_best_baseline']:+.2f}", "-" if rel is None else f"{100 * rel:+.1f}%",
                      _weights(mix["input"]) if "input" in mix else "-",
                      _weights(mix["output"]) if "output" in mix else "-", f"{row['best_epoch']}/{row['epochs_run']}")
    return table


def _accuracy_name(m: dict) -> str:
    """What the metrics' kind calls ``accuracy`` ("token accuracy" for tagging, "accuracy" for classification)."""
    from elmo_cli.tasks.kinds import get_kind

    return get_kind(m["kind"]).accuracy_name if "kind" in m else "token accuracy"


def _metrics_table(m: dict, title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(_accuracy_name(m), _pct(m["accuracy"]))
    table.add_row("macro-F1", _pct(m["macro_f1"]))
    if m.get("span"):
        sp = m["span"]
        table.add_row(f"span precision ({m['scheme']})", _pct(sp["precision"]))
        table.add_row("span recall", _pct(sp["recall"]))
        table.add_row("span F1 (conlleval)", _pct(sp["f1"]))
    table.add_row("items", f"{m['n']:,}")
    return table


def _settings(**kw):
    from elmo_cli.tasks.train import TrainSettings
    from elmo_cli.train_config import parse_duration

    kw["max_time"] = parse_duration(kw["max_time"])
    return TrainSettings(**kw)


@command(task_app, "train", "Train a tagger or classifier on ELMo.")
def cli_train(
    kind: str = typer.Option(..., "--kind", help="tagging | classification"),
    train: Path = typer.Option(..., "--train", help="Training file: CoNLL / CoNLL-U (tagging) or TSV label<TAB>text."),
    dev: Path = typer.Option(..., "--dev", help="Dev file (same format): picks the best epoch."),
    output: Path = output_option("Task directory to write (with --compare: one per arm)."),
    model: Optional[Path] = model_option(),
    options: Optional[Path] = options_option(),
    weights: Optional[Path] = weights_option(),
    cache_dir: Optional[Path] = cache_dir_option(), offline: bool = offline_option(),  # URLs: elmo_cli.fetch
    no_elmo: bool = typer.Option(False, "--no-elmo", help="Train without ELMo (word embeddings only)."),
    epochs: int = typer.Option(50, "--epochs", help="At most this many epochs (training usually stops earlier: "
                                                    "--patience)."),
    patience: int = typer.Option(5, "--patience", help="Stop when dev has not improved for this many epochs (0: "
                                                      "train all --epochs); the best dev epoch is kept."),
    max_time: Optional[str] = typer.Option(None, "--max-time", help="Stop after the epoch that passes this: 90s, 30m."),
    batch_size: int = batch_size_option("Sentences per training step"),
    seed: int = typer.Option(0, "--seed", help="Seed of initialisation and batch order."),
    lr: float = typer.Option(1e-3, "--lr", help="Adam learning rate."),
    word_vectors: Optional[Path] = typer.Option(None, "--word-vectors", help="GloVe / word2vec text file."),
    min_count: int = typer.Option(1, "--min-count", help="Training words seen fewer times share <UNK>."),
    hidden_dim: int = typer.Option(128, "--hidden-dim", help="BiLSTM size per direction."),
    word_dim: int = typer.Option(100, "--word-dim", help="Word embedding size (--word-vectors sets it)."),
    label_column: str = typer.Option("upos", "--label-column", help="CoNLL-U column: upos, xpos, deprel, ..."),
    format: str = typer.Option("auto", "--format", help="auto | conll | conllu | tsv"),
    max_length: int = typer.Option(200, "--max-length", help="Longer sentences are split into pieces."),
    layers: str = typer.Option("all", "--layers", help="ELMo at the input: all (learned mix of every layer), top, "
                                                        "or layer indices to mix such as 1,2 (0 = token layer)."),
    elmo_output: bool = typer.Option(False, "--elmo-output", help="Also ELMo at the BiLSTM output [h_k; ELMo_k]."),
    layer_norm: bool = typer.Option(False, "--layer-norm", help="ScalarMix layer normalisation."),
    embeddings: Optional[Path] = typer.Option(None, "--embeddings", help="dump-embeddings --layers all file."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Run the biLM on every batch (for timing)."),
    cache_dtype: str = typer.Option("float32", "--cache-dtype", help="float32 | float16 (layer cache in memory)."),
    cache_max_mb: int = typer.Option(2048, "--cache-max-mb", help="Memory for cached layers; the rest spills to HDF5."),
    compare: bool = typer.Option(False, "--compare", help="Train (a) no ELMo [(a+) with --char-cnn] (b) top layer (c) "
                                                          "mix [(d) output], and print their gains."),
    test: Optional[Path] = typer.Option(None, "--test", help="With --compare: evaluate every arm here (else --dev)."),
    char_cnn: bool = typer.Option(False, "--char-cnn", help="Word features from the word's characters too (a small "
                                                            "char-CNN beside the word embedding; with --compare in "
                                                            "every arm, so the no-ELMo arm is the paper's kind of "
                                                            "baseline)."),
    fine_tune_bilm: bool = typer.Option(False, "--fine-tune-bilm", help="Train the biLM's weights with the task "
                                                                        "(at --bilm-lr; no layer cache, so slower); "
                                                                        "the task directory keeps the tuned biLM."),
    bilm_lr: float = typer.Option(1e-4, "--bilm-lr", help="With --fine-tune-bilm: the biLM's Adam learning rate."),
    unfreeze_after: int = typer.Option(0, "--unfreeze-after", help="With --fine-tune-bilm: epochs with the biLM "
                                                                   "frozen before it trains."),
    crf: bool = typer.Option(False, "--crf", help="Tagging: a linear-chain CRF head with Viterbi decoding; span "
                                                  "labels (BIO, IOB1, BIOES, detected) never decode to a move "
                                                  "their scheme forbids."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    device: str = device_option(),
    threads: Optional[int] = threads_option(),
    errors: str = errors_option("the data files"),
) -> None:
    """Train a tagger or sentence classifier on the frozen biLM's learned layer mix; keep the best dev epoch.

    Example: `elmo-cli task train --kind tagging --train train.conllu --dev dev.conllu --model run/ --output upos/ --compare --test test.conllu`
    """
    with _user_errors():
        from elmo_cli.loading import set_threads
        from elmo_cli.model_files import model_files
        from elmo_cli.tasks.train import elmo_arm

        bilm = model is not None or options is not None or weights is not None
        elmo, elmo_layers = elmo_arm(layers, bilm, embeddings is not None, no_elmo)
        set_threads(threads)
        bilm_files = model_files(model, options, weights) if bilm else None
        s = _settings(kind=kind, train_path=train, dev_path=dev, output=output, model_dir=bilm_files,
                      embeddings=embeddings, elmo=elmo, elmo_layers=elmo_layers,
                      elmo_output=elmo_output and not no_elmo, layer_norm=layer_norm, epochs=epochs, patience=patience,
                      max_time=max_time, batch_size=batch_size, lr=lr, seed=seed, word_vectors=word_vectors,
                      min_count=min_count, hidden_dim=hidden_dim, word_dim=word_dim, label_column=label_column, fmt=format,
                      max_length=max_length, cache=not no_cache, cache_dtype=cache_dtype, cache_max_mb=cache_max_mb,
                      device=device, errors=errors, crf=crf, char_cnn=char_cnn, fine_tune_bilm=fine_tune_bilm,
                      bilm_lr=bilm_lr, unfreeze_after=unfreeze_after)
        on_epoch = None if json_out else _epoch_line
        if compare:
            from elmo_cli.tasks.compare import compare as run_compare

            on_arm = None if json_out else (lambda name: err_console.print(f"training {name}", highlight=False))
            _print_compare(run_compare(s, test, elmo_output, on_arm, on_epoch), json_out)
            return
        from elmo_cli.tasks.train import train_task

        _print_trained(train_task(s, on_epoch), json_out, output, patience)


def _print_compare(result: dict, json_out: bool) -> None:
    _warn(result["warnings"])
    if json_out:
        print(json.dumps(result))
        return
    # the table needs about 130 columns; a pipe or file gets them instead of rich's default 80
    wide = console if console.is_terminal else Console(width=140)
    wide.print(_compare_table(result))


def _print_trained(result, json_out: bool, output: Path, patience: int) -> None:
    _warn(result.warnings)
    if json_out:
        print(json.dumps(result.metrics))
        return
    m = result.metrics
    why = {"patience": f"stopped after {m['epochs_run']} epochs, no better dev for --patience {patience}",
           "max_time": f"stopped at --max-time after {m['epochs_run']} epochs",
           "epochs": f"ran all {m['epochs_run']} epochs (--epochs)"}[m["stopped"]]
    console.print(f"wrote {output}: {why}; best epoch {m['best_epoch']}, dev {m['metric']} "
                  f"{_pct(m['dev']['span']['f1'] if m['dev'].get('span') else m['dev']['accuracy'])}; "
                  f"ELMo {_mix_text(result.model.mix_summary())}", highlight=False)


@command(task_app, "evaluate", "Metrics of a task model on a labelled file.")
def cli_evaluate(
    test: Path = typer.Argument(..., help="Labelled file in the training format."),
    task: Path = typer.Option(..., "--task", help="Task directory (task train --output)."),
    format: str = typer.Option("auto", "--format", help="auto | conll | conllu | tsv"),
    embeddings: Optional[Path] = typer.Option(None, "--embeddings", help="dump-embeddings --layers all file."),
    batch_size: int = batch_size_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
    device: str = device_option(),
    threads: Optional[int] = threads_option(),
    errors: str = errors_option("TEST"),
) -> None:
    """Tagging: token accuracy, macro-F1, conlleval span F1 (BIO/IOB1/BIOES); classification: accuracy, macro-F1.

    Example: `elmo-cli task evaluate --task upos/ test.conllu --json`
    """
    with _user_errors():
        from elmo_cli.loading import set_threads
        from elmo_cli.tasks.apply import evaluate_file

        set_threads(threads)
        m = evaluate_file(task, test, format, embeddings, batch_size, device, errors)
        if m["unknown_labels"]:
            _warn([f"{test}: label(s) unknown at training time, counted wrong: "
                   + ", ".join(f"{k} ({v})" for k, v in m["unknown_labels"].items())])
        if m["split_sentences"]:
            _warn([f"{test}: {m['split_sentences']} sentence(s) longer than the task's max length were split"])
        if json_out:
            print(json.dumps(m))
        else:
            console.print(_metrics_table(m, str(test)))


@command(task_app, "predict", "Label sentences with a task model.")
def cli_predict(
    input: Path = typer.Argument(..., help="One sentence per line, or a CoNLL / CoNLL-U file (labels ignored)."),
    output_arg: Optional[Path] = typer.Argument(None, metavar="OUTPUT", help="CoNLL (token TAB label) for tagging, "
                                                "TSV (label TAB text) otherwise (or give --output)."),
    output_opt: Optional[Path] = output_option("The file to write (instead of the OUTPUT argument).",
                                               required=False),
    task: Path = typer.Option(None, "--task", help="Task directory (task train --output); or give --onnx."),
    format: str = typer.Option("auto", "--format", help="auto | text | conll | conllu | tsv"),
    embeddings: Optional[Path] = typer.Option(None, "--embeddings", help="dump-embeddings --layers all file."),
    batch_size: int = batch_size_option(),
    device: str = device_option(),
    threads: Optional[int] = threads_option(),
    errors: str = errors_option("INPUT"),
    onnx: Optional[Path] = typer.Option(None, "--onnx", help="A task export --format onnx directory: run it with "
                                                             "onnxruntime instead of --task (which it replaces)."),
) -> None:
    """Label every sentence of INPUT and write OUTPUT atomically.

    Example: `elmo-cli task predict --task upos/ sentences.txt tagged.conll`
    """
    with _user_errors():
        from elmo_cli.loading import set_threads
        from elmo_cli.tasks.apply import predict_file

        output = pick_output(output_arg, output_opt)
        if (task is None) == (onnx is None):
            raise ElmoError("give exactly one of --task DIR and --onnx DIR")
        set_threads(threads)
        if onnx is not None:
            from elmo_cli.tasks.graph_export import predict_file_onnx

            r = predict_file_onnx(onnx, input, output, format, batch_size, threads, errors)
        else:
            r = predict_file(task, input, output, format, embeddings, batch_size, device, errors)
        if r["split_sentences"]:
            _warn([f"{input}: {r['split_sentences']} sentence(s) longer than the task's max length were split "
                   f"(their pieces' labels are joined)"])
        console.print(f"wrote {output}: {r['sentences']:,} sentences, {r['tokens']:,} tokens", highlight=False)


@command(task_app, "export", "Write a task model as one ONNX graph for onnxruntime.")
def cli_export(
    task: Path = typer.Option(..., "--task", help="Task directory (task train --output)."),
    output: Path = output_option("Directory to create: model.onnx, words.txt, labels.txt, task.json, chars.json."),
    format: str = typer.Option("onnx", "--format", help="onnx (the only format for task models)."),
    force: bool = typer.Option(False, "--force", help="Replace OUTPUT if it is an earlier export."),
) -> None:
    """The whole tagger or classifier (biLM, fine-tuned or not, ELMo mixes, word embeddings, character CNN, BiLSTM,
    head, CRF) as one ONNX graph: the biLM's character ids, word ids (rows of words.txt) and, with --char-cnn, the
    task's own character ids in; label ids (with --crf the Viterbi path, decoded in the graph) and log-probabilities
    out. Refused when onnxruntime's labels differ from PyTorch's on a few check sentences; see docs/serving.md.

    Example: `elmo-cli task export --task upos/ --format onnx --output upos-onnx/`
    """
    with _user_errors():
        from elmo_cli.tasks.graph_export import export_task

        names = export_task(task, output, format, force)
        console.print(f"exported {output}: {', '.join(names)}", highlight=False)

"""The `elmo-cli` command line: parses arguments, calls one library function per command, prints.

Nothing else in the package prints or exits. Each command body runs inside `_user_errors()`, which turns an
`ElmoError` into ``error: <message>`` on stderr and exit code 1; any other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from elmo_cli.layers import MODES_HELP
from elmo_cli.presets import PRESETS_HELP, presets_table
from elmo_cli.console import (app_settings, batch_size_option, cache_dir_option, command, console, device_option,
                              err_console, errors_option, model_option, offline_option, options_option,
                              output_option, pick_output, threads_option, user_errors as _user_errors,
                              weights_option)
from elmo_cli.fetch import path_or_url
from vocab.errors import ElmoError

app = typer.Typer(**app_settings("Train and use ELMo-style contextual word representations on your own corpus."))


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"elmo-cli {version('elmo-cli')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Train and use ELMo-style contextual word representations on your own corpus."""


# ---- build-vocab, shard ------------------------------------------------------------


def _vocab_table(stats) -> "Table":
    from rich.table import Table

    table = Table(title=f"vocabulary {stats.output}", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    rows = [
        ("lines (sentences)", f"{stats.lines:,}"),
        ("blank lines skipped", f"{stats.blank_lines:,}"),
        ("running tokens", f"{stats.tokens:,}"),
        ("types", f"{stats.types:,}"),
        ("kept types", f"{stats.kept_types:,}"),
        ("vocabulary size (with <S> </S> <UNK>)", f"{stats.vocab_size:,}"),
        ("running tokens covered", f"{stats.coverage:.2%}"),
        ("OOV rate", f"{stats.oov_rate:.2%}"),
        ("tokens truncated at 48 bytes", f"{stats.truncated_tokens:,} ({stats.truncated_types:,} types)"),
        (f"softmax size at projection dim {stats.projection_dim}", f"{stats.softmax_mb:,.1f} MB"),
    ]
    if stats.spm_model_path is not None:
        rows.append(("SentencePiece model", str(stats.spm_model_path)))
    rows.append(("counts", str(stats.counts_path)))
    for name, value in rows:
        table.add_row(name, value)
    return table


@command(app, "build-vocab", "Count a corpus into a vocabulary (or SentencePiece).")
def cli_build_vocab(
    corpus: List[str] = typer.Argument(..., help="Text files, globs, .gz files or - for standard input."),
    output: Path = output_option("Vocabulary file to write (bilm-tf format)."),
    min_count: int = typer.Option(1, help="Drop tokens seen fewer times."),
    max_size: Optional[int] = typer.Option(None, help="At most this many vocabulary lines, specials included."),
    projection_dim: int = typer.Option(512, help="Projection dim for the reported softmax size V*(P+1)*4 bytes."),
    errors: str = errors_option("CORPUS"),
    sentencepiece: bool = typer.Option(False, "--sentencepiece", help="Train a SentencePiece model on raw text."),
    vocab_size: Optional[int] = typer.Option(None, help="SentencePiece vocabulary size (with --sentencepiece)."),
    model_type: str = typer.Option("unigram", help="SentencePiece model: unigram or bpe."),
    character_coverage: float = typer.Option(0.9995, help="SentencePiece: share of characters the pieces must "
                                             "cover (lower it for scripts with many rare characters)."),
    seed: int = typer.Option(0, help="SentencePiece sampling seed."),
) -> None:
    """Count whitespace tokens (one sentence per line) and write VOCAB (specials first, then by descending count,
    ties by UTF-8 bytes) plus VOCAB.counts.tsv. With --sentencepiece, train a model on raw text instead and write it
    beside the vocabulary as STEM.spm.model (vocab.txt -> vocab.spm.model); shard then tokenizes with it.

    Example: `elmo-cli build-vocab corpus/*.txt.gz --output vocab.txt --min-count 2`
    """
    from vocab.vocabulary import build_vocab, train_sentencepiece

    with _user_errors():
        if sentencepiece:
            if vocab_size is None:
                raise ElmoError("--sentencepiece needs --vocab-size N")
            with console.status("training SentencePiece"):
                stats = train_sentencepiece(
                    corpus, output, vocab_size=vocab_size, model_type=model_type, seed=seed,
                    character_coverage=character_coverage, projection_dim=projection_dim, errors=errors,
                )
        else:
            if vocab_size is not None:
                raise ElmoError("--vocab-size only applies with --sentencepiece; use --max-size for word vocabularies")
            with console.status("counting tokens") as status:
                stats = build_vocab(
                    corpus, output, min_count=min_count, max_size=max_size, projection_dim=projection_dim,
                    errors=errors, on_line=lambda n: status.update(f"counting tokens: {n:,} lines"),
                )
        console.print(_vocab_table(stats))
        console.print(f"wrote {stats.output} ({stats.vocab_size:,} tokens)")


@command(app, "shard", "Encode a corpus into character-id shards for train.")
def cli_shard(
    corpus: List[str] = typer.Argument(..., help="Text files, globs, .gz files or - for standard input."),
    vocab: Path = typer.Option(..., "--vocab", help="Vocabulary file (its <stem>.spm.model is used if present)."),
    output: Path = output_option("Shard directory to create."),
    tokens_per_shard: int = typer.Option(1_000_000, help="About this many tokens per shard (bounds memory)."),
    seed: int = typer.Option(0, help="Shuffle seed; same input and seed give byte-identical shards."),
    workers: int = typer.Option(1, help="Encoding processes; the output does not depend on it."),
    chars: str = typer.Option("bytes", help="Character ids: bytes (bilm-tf compatible), codepoint (a table of "
                              "the corpus's code points), or a shard or model directory whose table to reuse "
                              "(held-out shards of a codepoint model; an ELMoForManyLangs model directory, to fine-tune "
                              "it with train --init-from)."),
    max_chars_vocab: int = typer.Option(2000, help="Code points kept with --chars codepoint (others share one id)."),
    errors: str = errors_option("CORPUS"),
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty output directory."),
) -> None:
    """Encode a corpus into shuffled, memory-mappable shards with a manifest.json the trainer reads.

    Example: `elmo-cli shard corpus/*.txt.gz --vocab vocab.txt --output shards/`
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from vocab.shards import write_shards

    with _user_errors():
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                      transient=True) as progress:
            task = progress.add_task("counting", total=None)

            def on_progress(stage: str, done: int, total: int) -> None:
                progress.update(task, description=stage, completed=done, total=total or None)

            summary = write_shards(
                corpus, vocab, output, tokens_per_shard=tokens_per_shard, seed=seed, workers=workers, chars=chars,
                max_chars_vocab=max_chars_vocab, errors=errors, force=force, on_progress=on_progress,
            )
        console.print(
            f"wrote {summary.shards} shard(s) to {summary.directory}: {summary.sentences:,} sentences, "
            f"{summary.tokens:,} tokens, OOV {summary.oov_rate:.2%}, {summary.blank_lines:,} blank lines skipped, "
            f"{summary.bytes_per_token:.2f} bytes/token ({summary.manifest['chars']} chars)"
        )


# ---- train -----------------------------------------------------------------------------------
def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _validation_line(step: int, v: dict, baseline: dict | None) -> str:
    line = (f"step {step:,}: validation perplexity (full softmax) forward {v['forward_perplexity']:.2f}, "
            f"backward {v['backward_perplexity']:.2f}, average {v['average_perplexity']:.2f}")
    if baseline:
        ratio = v["average_perplexity"] / baseline["average_perplexity"]
        line += f"; {baseline['name'].upper()} {baseline['average_perplexity']:.2f} (biLM/KN {ratio:.3f})"
    return line


class _TrainReport:
    """Progress of `train` on stderr: a rich bar on a terminal; plain lines every 30 s under nohup, slurm or
    torchrun (stderr not a terminal), so a log file shows the run as it goes."""

    def __init__(self, show: bool):
        import math

        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.show, self.plain, self.last_plain = show, not err_console.is_terminal, None
        self.progress = Progress(
            TextColumn("epoch {task.fields[epoch]:.2f}"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
            TextColumn("{task.fields[rate]:,.0f} tok/s"), TextColumn("ETA {task.fields[eta]}"),
            TextColumn("loss {task.fields[loss]:.3f} (sampled)"), TimeElapsedColumn(),
            console=err_console, disable=not show or self.plain, transient=False)
        self.task = self.progress.add_task("train", total=None, epoch=0.0, rate=0.0, eta="?", loss=math.nan)

    def __call__(self, info) -> None:
        import time

        if not self.show:
            return
        if info.validation:
            err_console.print(_validation_line(info.step, info.validation, info.baseline), highlight=False)
        if self.plain:
            now = time.monotonic()
            if self.last_plain is None or now - self.last_plain >= 30 or info.step == info.total_steps:
                self.last_plain = now
                err_console.print(f"step {info.step:,}/{info.total_steps:,}  epoch {info.epoch:.2f}  loss "
                                  f"{info.loss:.2f}  lr {info.lr:.3g}  {info.tokens_per_s:,.0f} tok/s  ETA "
                                  f"{_clock(info.eta)}", highlight=False)
            return
        if not self.progress.live.is_started:  # started on the first step, so setup errors print alone
            self.progress.start()
        self.progress.update(self.task, completed=info.step, total=info.total_steps, epoch=info.epoch,
                             rate=info.tokens_per_s, eta=_clock(info.eta), loss=info.loss)

    def stop(self) -> None:
        self.progress.stop()


def _probe_against_run(choice, result) -> str:
    """`auto`'s passes and rate expected against what the run made: how far its estimate (the probe's rate, on a
    CPU at the share a run sustains) was from this host's pace, and where the run read its own first minute (rule
    11), how far that read was."""
    share = choice.sustained
    off = share * choice.tokens_per_s / result.mean_tokens_per_s - 1
    side = "over" if off > 0 else "under"
    at = f"{share:g} of its probe's" if share != 1 else "its probe's"
    line = (f"auto expected {choice.expected_epochs:.1f} passes at {at} {choice.tokens_per_s:,.0f} tokens/s; "
            f"the run made {result.epochs:.1f} at {result.mean_tokens_per_s:,.0f} tokens/s (the estimate "
            f"{abs(off):.0%} {side} the run)")
    if result.read:  # rule 11: the run's first minute, read at the same share
        read = result.read
        off = read["sustained"] * read["tokens_per_s"] / result.mean_tokens_per_s - 1
        line += (f"; read after its first minute, {read['expected_epochs']:.1f} at {read['tokens_per_s']:,.0f} "
                 f"(the estimate {abs(off):.0%} {'over' if off > 0 else 'under'} the run)")
    return line


def _print_train_result(result, choice=None) -> None:
    """The end of `train`: notes, how it stopped, the last loss, validation, for a fresh `auto` run its probe
    against the run, and where the ratio to KN5 places it."""
    import math

    for note in result.notes:
        console.print(note)
    how = {"finished": "finished", "max_steps": "already at --max-steps", "max_time": "stopped at --max-time",
           "signal": "interrupted; resume with --resume",
           "patience": "stopped: no better validation in --patience validations"}[result.stopped]
    console.print(f"{how}: step {result.step}/{result.total_steps}, train loss {result.train_loss:.3f} "
                  f"(sampled softmax, perplexity {math.exp(min(result.train_loss, 50)):.1f}), "
                  f"{result.tokens_per_s:,.0f} tokens/s; model in {result.run_dir}", highlight=False)
    if result.validation:
        console.print(_validation_line(result.step, result.validation, result.baseline), highlight=False)
    if choice is not None and result.resumed_from == 0 and result.world_size == 1 and result.mean_tokens_per_s:
        console.print(_probe_against_run(choice, result), highlight=False)
    if result.best and result.best["step"] != result.step:
        console.print(f"the model files are those of step {result.best['step']:,}, the best validation "
                      f"(average perplexity {result.best['average_perplexity']:.2f})", highlight=False)
    if result.best and result.baseline and result.baseline["name"] == "kn5":
        from elmo_cli.baselines import place_ratio

        ratio = result.best["average_perplexity"] / result.baseline["average_perplexity"]
        console.print(place_ratio(ratio, result.train_tokens, result.run_seconds / 60), highlight=False)


@command(app, "train", "Train a biLM on shards (its help lists the presets).", more=presets_table())
def cli_train(
    data: Path = typer.Option(..., "--data", help="Shard directory (elmo-cli shard)."),
    output: Path = output_option("Run directory: model files, config.json, metrics.jsonl, checkpoints/."),
    config: Optional[Path] = typer.Option(None, "--config", help="JSON config: options.json keys plus a "
                                                                 "'training' section, over the preset."),
    preset: Optional[str] = typer.Option(None, "--preset", help=PRESETS_HELP),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Rows per process (default: the "
                                                                        "preset's)."),
    unroll_steps: Optional[int] = typer.Option(None, "--unroll-steps", help="Tokens per row and step, the "
                                                                            "truncated-BPTT window (default 20)."),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adagrad (bilm-tf) | adam | adamw "
                                                                      "(default: the preset's)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (default: the preset's)."),
    lr_schedule: Optional[str] = typer.Option(None, "--lr-schedule", help="constant | linear | cosine, over the "
                                                                          "run's steps or its --max-time "
                                                                          "(default: the preset's)."),
    warmup: Optional[float] = typer.Option(None, "--warmup", help="Fraction of the run with a linear warmup "
                                                                  "(default: the preset's, 0 for bilm-tf's)."),
    epochs: Optional[float] = typer.Option(None, "--epochs", help="Run length in passes over the shards' "
                                                                  "tokens (default: the preset's)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Run length in steps (instead of "
                                                                      "--epochs)."),
    max_time: Optional[str] = typer.Option(None, "--max-time", help="Train this long in all (resumed parts "
                                                                    "included), then stop with a checkpoint: 90s, "
                                                                    "30m, 2h (default: laptop 1h, others none)."),
    n_negative_samples: Optional[int] = typer.Option(None, "--n-negative-samples", help="Sampled-softmax "
                                                     "negatives per step (default: the preset's; at least the "
                                                     "vocabulary size means the full softmax)."),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Dropout on the LSTM inputs and outputs "
                                                                    "(default: the preset's)."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="Weight decay: decoupled with "
                                                                              "--optimizer adamw, L2 with adam "
                                                                              "(default: 0; --preset auto: 0.2 with "
                                                                              "adamw near the pass cap).",
                                                min=0.0),
    average: Optional[float] = typer.Option(None, "--average", help="Validate and write a moving average of the "
                                                                    "weights over this last fraction of the run, "
                                                                    "e.g. 0.05 (0 = the trained weights; default: "
                                                                    "the preset's).", min=0.0, max=0.99),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of initialisation, data order and sampling "
                                                            "(default 0); same seed and threads: same model."),
    device: Optional[str] = typer.Option(None, "--device", help="auto (CUDA when torch sees a GPU, else the "
                                                                "CPU) | cpu | cuda | cuda:N (default auto)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp32 | bf16 (autocast) (default fp32)."),
    no_cuda_graphs: bool = typer.Option(False, "--no-cuda-graphs", help="On a GPU, run every step eagerly rather "
                                                                        "than replay its LSTMs from CUDA graphs "
                                                                        "(the default with one process)."),
    no_fuse_lstm: bool = typer.Option(False, "--no-fuse-lstm", help="On a GPU, run each LSTM step's elementwise "
                                                                    "work as separate kernels rather than one "
                                                                    "compiled kernel (the default)."),
    compile_loops: bool = typer.Option(False, "--compile", help="On a CPU, compile the LSTM loops of the training "
                                                                "step (torch.compile: a C++ compiler, about 2 "
                                                                "minutes once; --preset auto measures it from 20 "
                                                                "minutes)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Never compile the LSTM loops, even where "
                                                                "--preset auto finds it faster."),
    threads: Optional[int] = threads_option(),
    validation: Optional[Path] = typer.Option(None, "--validation", help="Held-out shards (same vocabulary): "
                                                                         "full-softmax perplexity as training goes, "
                                                                         "beside a Kneser-Ney reference."),
    validation_every: Optional[int] = typer.Option(None, "--validation-every", help="Steps between validations "
                                                                                    "(default: 20 in a run, and at "
                                                                                    "least every 5-15 minutes)."),
    patience: Optional[int] = typer.Option(None, "--patience", help="Stop after this many validations without "
                                                                    "improvement (default: never)."),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip the Kneser-Ney reference."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Steps between checkpoints "
                                                                                    "(default: the preset's, and "
                                                                                    "every 30 minutes)."),
    resume: bool = typer.Option(False, "--resume", help="Continue exactly from the newest checkpoint in --output "
                                                        "(the command that started the run may be repeated as it "
                                                        "was; only its length may change)."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", parser=path_or_url, metavar="PATH|URL",
                                             help="Start from a trained biLM (fine-tuning): a model directory (an "
                                                  "ELMoForManyLangs one too), or "
                                                  "an options.json file with its weights beside it or given by "
                                                  "--weights; or its http(s) URL (downloaded once into the "
                                                  "cache)."),
    options: Optional[Path] = typer.Option(None, "--options", parser=path_or_url, metavar="PATH|URL",
                                           help="bilm-tf options.json (a file or an http(s) URL) to start from, "
                                                "with --weights (the same as --init-from)."),
    weights: Optional[Path] = weights_option("--init-from"),
    cache_dir: Optional[Path] = cache_dir_option(),
    offline: bool = offline_option(),
    reset_softmax: bool = typer.Option(False, "--reset-softmax", help="With --init-from: re-initialise the "
                                                                      "softmax."),
) -> None:
    """Train a biLM on shards; under torchrun, DistributedDataParallel over the processes.

    Example: `elmo-cli train --data shards/ --validation heldout/ --output run/ --preset tiny`
    """
    with _user_errors():
        from elmo_cli import train as training
        from elmo_cli.distributed import is_main_process
        from elmo_cli.model_files import model_files
        from elmo_cli.train_config import parse_duration

        if compile_loops and no_compile:
            raise ElmoError("--compile and --no-compile: give one")
        fine_tuning = init_from is not None or options is not None or weights is not None
        flags = dict(
            batch_size=batch_size, unroll_steps=unroll_steps, optimizer=optimizer, lr=lr, lr_schedule=lr_schedule,
            warmup=warmup, epochs=epochs, max_steps=max_steps, max_time=parse_duration(max_time),
            n_negative_samples=n_negative_samples, dropout=dropout, weight_decay=weight_decay, average=average,
            seed=seed, device=device, dtype=dtype, cuda_graphs=False if no_cuda_graphs else None, fuse_lstm=False if no_fuse_lstm else None, compile=True if compile_loops else (False if no_compile else None), threads=threads,
            checkpoint_every=checkpoint_every,
            validation_every=validation_every, patience=patience, baseline=False if no_baseline else None)
        cfg, choice = training.resolve_config(output, data, preset=preset, config_file=config, flags=flags,
                                              validation_dir=validation, resume=resume, fine_tuning=fine_tuning)
        start_from = model_files(init_from, options, weights) if fine_tuning else None
        rank0 = is_main_process()
        if choice is not None and rank0:
            console.print(choice.reason, highlight=False)
        report = _TrainReport(rank0)
        try:
            result = training.train(cfg, data, output, validation_dir=validation, resume=resume,
                                    init_from=start_from, reset_softmax=reset_softmax, on_step=report,
                                    chosen=choice.record() if choice is not None else None)
        finally:
            report.stop()
        if rank0:
            _print_train_result(result, choice)


# ---- evaluate ------------------------------------------------------------------------------
def _evaluate_table(title: str, result, baselines: dict[str, dict], exclude_unk: bool) -> "Table":
    from rich.table import Table

    unk = ", <UNK> targets excluded" if exclude_unk else ""
    table = Table(title=title, title_justify="left")
    table.add_column("")
    table.add_column("biLM", justify="right")
    for name in baselines:
        table.add_column(name.upper() if name.startswith("kn") else name, justify="right")
    rows = [("forward perplexity", "forward_perplexity"), ("backward perplexity", "backward_perplexity"),
            ("[bold]average perplexity (forward + backward) / 2[/]", "average_perplexity")]
    for label, key in rows:
        table.add_row(label, f"{getattr(result, key):.2f}", *(f"{b[key]:.2f}" for b in baselines.values()))
    for name, b in baselines.items():
        if name.startswith("kn"):
            table.add_row(f"biLM / {name.upper()} (average)", f"{result.average_perplexity / b['average_perplexity']:.3f}",
                          *("" for _ in baselines))
    table.add_row("exp(mean loss of both directions)", f"{result.mean_loss_perplexity:.2f}", *("" for _ in baselines))
    table.add_row("sentences scored", f"{result.sentences:,}", *("" for _ in baselines))
    table.add_row("blank lines skipped", f"{result.blank_lines:,}", *("" for _ in baselines))
    table.add_row("words", f"{result.words:,}", *("" for _ in baselines))
    table.add_row(f"tokens scored per direction (words + </S> or <S>{unk})", f"{result.tokens:,}",
                  *(f"{b['tokens']:,}" for b in baselines.values()))
    table.add_row("OOV rate (words that are <UNK>)", f"{result.oov_rate:.2%}", *("" for _ in baselines))
    table.add_row("tokens scored per second", f"{result.tokens_per_second:,.0f}", *("" for _ in baselines))
    return table


@command(app, "evaluate", "Perplexity of a biLM, beside Kneser-Ney.")
def cli_evaluate(
    data: List[str] = typer.Argument(..., help="Text files (globs, - for stdin, .gz) tokenized with the model's "
                                               "own vocabulary or SentencePiece model, or shard directories."),
    model: Optional[Path] = model_option(),
    options: Optional[Path] = options_option(),
    weights: Optional[Path] = weights_option(),
    cache_dir: Optional[Path] = cache_dir_option(),
    offline: bool = offline_option(),
    batch_size: int = batch_size_option("Sentences per batch (results do not depend on it unless --stateful)"),
    per_sentence: Optional[Path] = typer.Option(None, "--per-sentence", dir_okay=False,
                                                help="Write one JSON line per input line: index, source, words, "
                                                     "tokens, forward_logprob, backward_logprob."),
    json_output: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
    exclude_unk: bool = typer.Option(False, "--exclude-unk", help="Do not score <UNK> targets (dropped from "
                                                                  "both the log-probabilities and the token count)."),
    stateful: bool = typer.Option(False, "--stateful", help="bilm-tf's behaviour: carry LSTM state from one "
                                                            "batch to the next (scores then depend on batch size "
                                                            "and order)."),
    baseline: Optional[List[str]] = typer.Option(None, "--baseline", help="Also score an n-gram reference of "
                                                                          "--baseline-train on the same targets: "
                                                                          "kn (interpolated modified Kneser-Ney) "
                                                                          "or unigram (add-one); repeatable."),
    baseline_train: Optional[List[str]] = typer.Option(None, "--baseline-train", metavar="TRAIN",
                                                       help="The text files or shard directories the references "
                                                            "are counted from (repeatable)."),
    kn_order: int = typer.Option(5, "--kn-order", help="Order of the Kneser-Ney reference (1-9)."),
    device: str = device_option(),
    threads: Optional[int] = threads_option(),
    errors: str = errors_option("DATA"),
) -> None:
    """Perplexity of a biLM with the full softmax in both directions (forward, backward and their average),
    beside Kneser-Ney and unigram references on the same targets.

    Example: `elmo-cli evaluate --model run/ heldout.txt --baseline kn --baseline-train train.txt`
    """
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from elmo_cli.baselines import check_baseline_args, score_baselines
    from elmo_cli.evaluate import evaluate
    from elmo_cli.loading import load_model, set_threads

    with _user_errors():
        kinds, train = list(baseline or []), list(baseline_train or [])
        check_baseline_args(kinds, train, kn_order)
        set_threads(threads)
        loaded = load_model(model, options, weights, device)
        with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True, disable=not err_console.is_terminal) as bar:
            task = bar.add_task("scoring", total=None)
            result = evaluate(loaded, data, batch_size=batch_size, exclude_unk=exclude_unk, stateful=stateful,
                              per_sentence_path=per_sentence, errors=errors,
                              on_progress=lambda done, total: bar.update(task, completed=done, total=total))
        refs = score_baselines(kinds, train, kn_order, data, loaded.text, exclude_unk, errors)
    mode = ("stateful: LSTM state carried between batches as bilm-tf did; scores depend on batch size and order"
            if stateful else "stateless: every sentence starts from zero state")
    if json_output:
        out = result.to_dict()
        out["mode"] = "stateful" if stateful else "stateless"
        out["baselines"] = refs
        typer.echo(json.dumps(out))
        return
    console.print(_evaluate_table(f"evaluate {loaded.source}", result, refs, exclude_unk))
    console.print(f"full softmax over {result.vocab_size:,} words, no dropout; {mode}", highlight=False)
    if "kn5" in refs and not exclude_unk and not stateful:
        from elmo_cli.baselines import place_ratio
        from elmo_cli.plot import run_minutes

        ratio = result.average_perplexity / refs["kn5"]["average_perplexity"]
        console.print(place_ratio(ratio, refs["kn5"]["train_words"], run_minutes(loaded.directory)),
                      highlight=False)
    if per_sentence is not None:
        console.print(f"per-sentence scores: {per_sentence}", highlight=False)


# ---- export, dump-embeddings, dump-token-embeddings ----------------------------------------
@command(app, "export", "Write a model directory that allennlp's Elmo loads.")
def cli_export(
    model: Optional[Path] = model_option(),
    output: Path = output_option("Directory to create."),
    options: Optional[Path] = options_option(),
    weights: Optional[Path] = weights_option(),
    cache_dir: Optional[Path] = cache_dir_option(),
    offline: bool = offline_option(),
    force: bool = typer.Option(False, "--force", help="Replace OUTPUT if it exists."),
    format: str = typer.Option("dir", "--format", help="dir (a model directory) | onnx (OUTPUT is model.onnx, run "
                                                      "by onnxruntime) | torch-export (OUTPUT is model.pt2, a "
                                                      "torch.export program); see docs/serving.md."),
) -> None:
    """Write a clean prediction directory: options.json (n_characters 262), weights.hdf5, softmax.hdf5, vocab.txt,
    chars.json, spm.model (each when present), loadable by allennlp's Elmo and by every elmo-cli command.
    With --format onnx or torch-export, the biLM as one graph file instead: character ids in, every layer out.

    Example: `elmo-cli export --model run/ --output model/`
    """
    with _user_errors():
        from elmo_cli.export import export_model

        if format != "dir":
            from elmo_cli.graph_export import export_bilm

            path = export_bilm(output, format, model, options, weights, force)
            console.print(f"exported {path} ({format}, {path.stat().st_size / 1e6:.1f} MB)", highlight=False)
            return
        names = export_model(output, model, options, weights, force)
        console.print(f"exported {output}: {', '.join(names)}", highlight=False)


@command(app, "dump-embeddings", "Contextual vectors of each line into HDF5 (allennlp).")
def cli_dump_embeddings(
    input: Path = typer.Argument(..., help="Text file, one sentence per line (tokens split on whitespace, or "
                                           "by the model's spm.model)."),
    output_arg: Optional[Path] = typer.Argument(None, metavar="OUTPUT", help="HDF5 file to write: one dataset per "
                                                "line, key = 0-based index (or give --output)."),
    output_opt: Optional[Path] = output_option("The HDF5 file to write (instead of the OUTPUT argument).",
                                               required=False),
    model: Optional[Path] = model_option(),
    options: Optional[Path] = options_option(),
    weights: Optional[Path] = weights_option(),
    cache_dir: Optional[Path] = cache_dir_option(),
    offline: bool = offline_option(),
    layers: str = typer.Option("all", "--layers", help=MODES_HELP),
    mix: Optional[str] = typer.Option(None, "--mix", help="W0,W1,W2: dump gamma * sum_k W_k * layer_k (n, 2P); "
                                                         "replaces --layers."),
    gamma: float = typer.Option(1.0, "--gamma", help="Scale of --mix."),
    batch_size: int = batch_size_option(),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | float16 (the stored vectors)."),
    compression: str = typer.Option("none", "--compression", help="none | gzip | lzf."),
    stateful: bool = typer.Option(False, "--stateful", help="Carry LSTM state between batches, per batch row, as "
                                                            "allennlp and bilm-tf did (output then depends on order "
                                                            "and batch size; one process, not under torchrun)."),
    device: str = device_option(),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted dump from OUTPUT.partial."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
    no_sentence_index: bool = typer.Option(False, "--no-sentence-index", help="Leave out sentence_to_index."),
    token_cache: Optional[Path] = typer.Option(None, "--token-cache", help="A dump-token-embeddings file: its "
                                                                           "tokens skip the character CNN."),
    errors: str = errors_option("INPUT"),
    threads: Optional[int] = threads_option(),
    compute_dtype: str = typer.Option("fp32", "--compute-dtype", help="fp32 (exact) | bf16: the LSTMs' matrix "
                                                                      "products in bfloat16 (approximate; CPUs "
                                                                      "with AVX512-BF16/AMX, GPUs)."),
    use_sentence_keys: bool = typer.Option(False, "--use-sentence-keys", help="Key each dataset by its sentence "
                                           "(the stripped line) instead of its line index, as allennlp's elmo "
                                           "--use-sentence-keys; no sentence_to_index then. A repeated sentence is "
                                           "stored once (allennlp refused repeats): stateless vectors of identical "
                                           "sentences are identical (with --stateful they are not, and a repeat is "
                                           "refused). Blank lines, '/' and a lone '.' cannot be HDF5 names: "
                                           "refused."),
) -> None:
    """Embed every line of INPUT into OUTPUT.hdf5 (allennlp `elmo` / bilm-tf layout), stateless by default.

    Works under `torchrun --nproc-per-node N elmo-cli dump-embeddings ...`: each rank embeds its share of the lines
    and rank 0 writes the one output file.

    Example: `elmo-cli dump-embeddings sentences.txt vectors.hdf5 --model run/ --layers all`
    """
    with _user_errors():
        from elmo_cli.distributed import is_main_process
        from elmo_cli.dump import dump_embeddings
        from elmo_cli.layers import LayerSelection
        from elmo_cli.loading import load_model

        output = pick_output(output_arg, output_opt)
        select = LayerSelection.parse(layers, mix, gamma)
        loaded = load_model(model, options, weights, device)
        bar = _DumpBar(show=is_main_process())
        try:
            result = dump_embeddings(
                loaded, input, output, layers=select, batch_size=batch_size, dtype=dtype,
                compression=compression, stateful=stateful, resume=resume, force=force,
                sentence_index=not no_sentence_index, token_cache=token_cache, errors=errors, threads=threads,
                compute_dtype=compute_dtype, sentence_keys=use_sentence_keys, on_progress=bar.update,
                on_warning=lambda m: err_console.print(f"[yellow]warning:[/] {m}", highlight=False))
        finally:
            bar.stop()
        if bar.show:
            dt = bar.seconds()
            resumed = f" (resumed after line {result.resumed_from})" if result.resumed_from else ""
            console.print(f"wrote {result.output}: {result.lines} lines, {result.tokens} tokens embedded in "
                          f"{dt:.1f} s ({result.tokens / max(dt, 1e-9):,.0f} tokens/s){resumed}", highlight=False)


class _DumpBar:
    """dump-embeddings' progress on stderr (rank 0 only): lines done of all, sentences and tokens per second. It
    appears once embedding starts, not before a refused start."""

    def __init__(self, show: bool):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.show, self.start, self.first_lines = show, time.perf_counter(), None
        columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} lines"),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
        self.bar = Progress(*columns, console=err_console, disable=not show, transient=False)
        self.task = self.bar.add_task("embedding", total=None, rate="")

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def update(self, p) -> None:
        if self.first_lines is None:
            self.first_lines = p.lines
            self.bar.start()
        dt = max(self.seconds(), 1e-9)
        rate = f"{(p.lines - self.first_lines) / dt:,.0f} sent/s {p.tokens / dt:,.0f} tok/s"
        self.bar.update(self.task, completed=p.lines, total=p.total, rate=rate)

    def stop(self) -> None:
        self.bar.stop()


@command(app, "dump-token-embeddings", "Token-layer vectors of a word list (token cache).")
def cli_dump_token_embeddings(
    vocab: Path = typer.Option(..., "--vocab", help="Vocabulary file, one token per line."),
    output: Path = output_option("HDF5 file: embedding (V, P), as bilm-tf's."),
    model: Optional[Path] = model_option(),
    options: Optional[Path] = options_option(),
    weights: Optional[Path] = weights_option(),
    cache_dir: Optional[Path] = cache_dir_option(),
    offline: bool = offline_option(),
    device: str = device_option(),
    threads: Optional[int] = threads_option(),
    force: bool = typer.Option(False, "--force", help="Overwrite OUTPUT if it exists."),
) -> None:
    """Token-encoder output of every vocabulary line (bilm-tf's token cache); use it with dump-embeddings
    --token-cache to skip the character CNN for those tokens.

    Example: `elmo-cli dump-token-embeddings --model run/ --vocab words.txt --output tokens.hdf5`
    """
    with _user_errors():
        from elmo_cli.dump import dump_token_embeddings
        from elmo_cli.loading import load_model, set_threads

        set_threads(threads)
        loaded = load_model(model, options, weights, device)
        path, n = dump_token_embeddings(loaded, vocab, output, force)
        console.print(f"wrote {path}: {n} tokens x {loaded.model.config.lstm.projection_dim}", highlight=False)


# ---- plot (training curves) --------------------------------------------------------------------------------------
@command(app, "plot", "Draw training curves of runs (PNG).")
def cli_plot(
    runs: List[Path] = typer.Argument(..., help="Run directories (with metrics.jsonl), drawn side by side."),
    output: Optional[Path] = output_option("PNG to write (default: RUN/curves.png of the first run).",
                                           required=False),
) -> None:
    """Draw training curves: sampled training loss, held-out perplexity against steps and minutes with the
    Kneser-Ney reference, and tokens per second.

    Example: `elmo-cli plot run-a/ run-b/ --output compare.png`
    """
    with _user_errors():
        from elmo_cli.plot import CURVES_FILE, plot_runs, read_metrics

        metrics = [read_metrics(r) for r in runs]
        path = plot_runs(metrics, output or Path(runs[0]) / CURVES_FILE)
        console.print(f"wrote {path}", highlight=False)


# ---- task models (the `task` sub-app) --------------------------------------------------------------------------
from elmo_cli.tasks.cli import task_app  # noqa: E402

app.add_typer(task_app, name="task", short_help="Taggers and sentence classifiers on ELMo.")


if __name__ == "__main__":
    app()

"""The `elmo-cli` command line: parses arguments, calls one library function per command, prints.

Nothing else in the package prints or exits. Each command body runs inside `_user_errors()`, which turns an
`ElmoError` into ``error: <message>`` on stderr and exit code 1; any other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console

from vocab.errors import ElmoError

app = typer.Typer(
    help="Train and use ELMo-style contextual word representations on your own corpus.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Print an ElmoError as one line on stderr and exit 1."""
    try:
        yield
    except ElmoError as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(code=130)


# ---- build-vocab, shard (issue: corpus preparation) ------------------------------------------------------------


# ---- train (issue: the biLM) -----------------------------------------------------------------------------------


# ---- evaluate (issue: perplexity) ------------------------------------------------------------------------------
@app.command("evaluate")
def cli_evaluate(
    data: List[str] = typer.Argument(..., help="Text files (globs, - for stdin, .gz) tokenized with the model's "
                                               "own vocabulary or SentencePiece model, or shard directories."),
    model: Path = typer.Option(..., "--model", help="Model directory with softmax.hdf5 and vocab.txt "
                                                    "(a training run directory)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Sentences per batch (results do not depend on it "
                                                            "unless --stateful)."),
    per_sentence: Optional[Path] = typer.Option(None, "--per-sentence", dir_okay=False,
                                                help="Write one JSON line per input line: index, source, words, "
                                                     "tokens, forward_logprob, backward_logprob."),
    json_output: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
    exclude_unk: bool = typer.Option(False, "--exclude-unk", help="Do not score <UNK> targets (dropped from "
                                                                  "both the log-probabilities and the token count)."),
    stateful: bool = typer.Option(False, "--stateful", help="bilm-tf's behaviour: carry LSTM state from one "
                                                            "batch to the next (scores then depend on batch size "
                                                            "and order)."),
    unigram_baseline: Optional[List[str]] = typer.Option(None, "--unigram-baseline", metavar="TRAIN",
                                                         help="Also report an add-one smoothed unigram's perplexity "
                                                              "estimated from this training text or shard "
                                                              "directory (repeatable)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1 or auto."),
    errors: str = typer.Option("strict", "--errors", help="Invalid UTF-8 in DATA: strict (stop) or replace."),
) -> None:
    """Perplexity of a biLM with the full softmax in both directions (forward, backward and their average)."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from elmo_cli.evaluate import evaluate, unigram_model, unigram_perplexity
    from elmo_cli.loading import load_model

    with _user_errors():
        loaded = load_model(model, device=device)
        with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            task = bar.add_task("scoring", total=None)
            result = evaluate(loaded, data, batch_size=batch_size, exclude_unk=exclude_unk, stateful=stateful,
                              per_sentence_path=per_sentence, errors=errors,
                              on_progress=lambda done, total: bar.update(task, completed=done, total=total))
        unigram = None
        if unigram_baseline:
            unigram = unigram_perplexity(unigram_model(unigram_baseline, loaded.text, errors), data, loaded.text,
                                         exclude_unk, errors)
    mode = ("stateful: LSTM state carried between batches as bilm-tf did; scores depend on batch size and order"
            if stateful else "stateless: every sentence starts from zero state")
    if json_output:
        out = result.to_dict()
        out["mode"] = "stateful" if stateful else "stateless"
        if unigram is not None:
            out["unigram_perplexity"] = unigram.perplexity
            out["unigram_train_tokens"] = unigram.train_tokens
        typer.echo(json.dumps(out))
        return
    unk = ", <UNK> targets excluded" if exclude_unk else ""
    table = Table(title=f"evaluate {model}", show_header=False, title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("sentences scored", f"{result.sentences:,}")
    table.add_row("blank lines skipped", f"{result.blank_lines:,}")
    table.add_row("words", f"{result.words:,}")
    table.add_row(f"tokens scored per direction (words + </S> or <S>{unk})", f"{result.tokens:,}")
    table.add_row("OOV rate (words that are <UNK>)", f"{result.oov_rate:.2%}")
    table.add_row("forward perplexity", f"{result.forward_perplexity:.2f}")
    table.add_row("backward perplexity", f"{result.backward_perplexity:.2f}")
    table.add_row("[bold]average perplexity (forward + backward) / 2[/]", f"[bold]{result.average_perplexity:.2f}[/]")
    table.add_row("exp(mean loss of both directions)", f"{result.mean_loss_perplexity:.2f}")
    if unigram is not None:
        table.add_row("unigram baseline perplexity (add-one, same targets)", f"{unigram.perplexity:.2f}")
    table.add_row("tokens scored per second", f"{result.tokens_per_second:,.0f}")
    console.print(table)
    console.print(f"full softmax over {result.vocab_size:,} words, no dropout; {mode}", highlight=False)
    if per_sentence is not None:
        console.print(f"per-sentence scores: {per_sentence}", highlight=False)


# ---- export, dump-embeddings, dump-token-embeddings (issue: embeddings) ----------------------------------------


if __name__ == "__main__":
    app()

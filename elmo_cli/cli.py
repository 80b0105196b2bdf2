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


# ---- export, dump-embeddings, dump-token-embeddings (issue: embeddings) ----------------------------------------


if __name__ == "__main__":
    app()

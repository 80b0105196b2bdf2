"""The two consoles every command prints to, `user_errors`: how an `ElmoError` reaches the user, and `command`:
how a command's help is laid out.

Each command body (in `elmo_cli.cli` and the `task` sub-app) runs inside ``with user_errors():``, which turns an
`ElmoError` into ``error: <message>`` on stderr and exit code 1; any other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Iterator

import typer
from rich.console import Console

from vocab.errors import ElmoError


def _console(stderr: bool = False) -> Console:
    """A rich console; one that writes to a file or pipe (nohup, slurm, a CI log) never wraps a printed line."""
    c = Console(stderr=stderr)
    c.soft_wrap = not c.is_terminal
    return c


console = _console()
err_console = _console(stderr=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Print an ElmoError as one line on stderr and exit 1; Ctrl-C exits 130."""
    try:
        yield
    except ElmoError as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(code=130)


def command(app, name: str):
    """``@app.command(name)`` with the docstring's closing ``Example:`` paragraph moved to the epilog, so a
    command's ``--help`` ends with its example line (after the options)."""
    def register(fn):
        doc = inspect.cleandoc(fn.__doc__ or "")
        head, sep, example = doc.rpartition("\n\nExample:")
        if not sep:
            return app.command(name)(fn)
        return app.command(name, help=head, epilog="Example:" + example)(fn)

    return register

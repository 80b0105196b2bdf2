"""The two consoles every command prints to, `user_errors`: how an `ElmoError` reaches the user, `command`:
how a command's help is laid out, and the options every command shares (`model_option`, `device_option`, ...),
`download_progress`: the bar drawn while a model is downloaded by URL (`elmo_cli.fetch`).

Each command body (in `elmo_cli.cli` and the `task` sub-app) runs inside ``with user_errors():``, which turns an
`ElmoError` into ``error: <message>`` on stderr and exit code 1; any other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

from elmo_cli import fetch
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
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(code=130)


def _type_name(param) -> str:
    """click's classic type names (PATH, INTEGER, ...) for a parameter, never a Python type such as list[str]."""
    if getattr(param, "metavar", None):
        return param.metavar
    name = type(param.type).__name__.lower() if getattr(param, "type", None) is not None else ""
    for key, label in (("path", "PATH"), ("int", "INTEGER"), ("float", "FLOAT"), ("bool", ""), ("choice", "CHOICE")):
        if key in name:
            return label
    try:  # typer without click types: read its own label (<int>, <list[path]>, ...)
        label = param.display_type(None).strip("<>")
    except Exception:
        return "TEXT"
    for key, out in (("path", "PATH"), ("int", "INTEGER"), ("float", "FLOAT"), ("bool", "")):
        if key in label:
            return out
    return "TEXT"


def _plain(param) -> None:
    """Show `param` as a user reads it: switches as switches, value types as PATH/INTEGER/TEXT, arguments by
    their upper-case name in the usage line (``DATA...``, ``[OUTPUT]``)."""
    if getattr(param, "_elmo_plain", False):
        return
    param._elmo_plain = True
    flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
    if getattr(param, "param_type_name", "") == "argument":
        name = (param.metavar or param.name).upper() + ("..." if param.nargs != 1 else "")
        usage = name if param.required else f"[{name}]"
        param.display_type_rich = lambda ctx=None: None
        param.get_usage_pieces = lambda ctx=None: [usage]
        param.metavar = name
        return
    label = "" if flag else _type_name(param)
    param.display_type_rich = lambda ctx=None: label or None
    if not flag:
        param.metavar = label


class HelpCommand(TyperCommand):
    """A Typer command whose --help shows no Python types and loses no text (see `_plain`)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for p in params:
            _plain(p)
        return params


def command(app, name: str, short: str, more: str = ""):
    """``@app.command(name)`` with plain help (`HelpCommand`) and the docstring's closing ``Example:`` paragraph
    moved to the epilog, so a command's ``--help`` ends with its example line (after the options); `short` is its
    line in the command list, `more` a paragraph added to the help (a table)."""
    def register(fn):
        doc = inspect.cleandoc(fn.__doc__ or "")
        head, sep, example = doc.rpartition("\n\nExample:")
        if not sep:
            head, example = doc, ""
        if more:
            head += "\n\n" + more
        epilog = "\b\nExample: " + example.replace("`", "").strip() if sep else None  # \b: one unwrapped line
        return app.command(name, help=head, short_help=short, epilog=epilog, cls=HelpCommand)(fn)

    return register


def app_settings(help: str) -> dict:
    """The settings every Typer app of elmo-cli uses: help text shown as written (no markup: ``<UNK>`` and
    ``label<TAB>text`` survive), no shell-completion options, errors without Typer's pretty tracebacks."""
    return dict(help=help, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                rich_markup_mode=None, context_settings={"max_content_width": 120})


# ---- options shared by the commands (one wording, one default everywhere) ---------------------------------------
DEFAULT_BATCH_SIZE = 64


def model_option():
    return typer.Option(None, "--model", "-m", parser=fetch.path_or_url, metavar="PATH|URL",
                        help="The biLM: a model directory (a training run, an `export`, or an ELMoForManyLangs model "
                             "as unzipped), or an options.json file "
                             "with its weights file beside it (x_options.json + x_weights.hdf5, as the published "
                             "ELMo files are named) or given by --weights; or the http(s) URL of such an "
                             "options.json (downloaded once into the cache, with the weights URL beside it).")


def options_option():
    return typer.Option(None, "--options", parser=fetch.path_or_url, metavar="PATH|URL",
                        help="bilm-tf options.json (a file or an http(s) URL), with --weights (the same as --model "
                             "OPTIONS.json --weights F).")


def weights_option(model_flag: str = "--model"):
    return typer.Option(None, "--weights", parser=fetch.path_or_url, metavar="PATH|URL",
                        help=f"bilm-tf weights.hdf5 (a file or an http(s) URL): with --options, or with "
                             f"{model_flag} OPTIONS.json when the weights file is not named like it.")


def _use_cache_dir(value: Optional[Path]) -> Optional[Path]:
    fetch.settings.cache_dir = Path(value) if value is not None else None
    fetch.settings.progress = download_progress
    return value


def _use_offline(value: bool) -> bool:
    fetch.settings.offline = value
    return value


def cache_dir_option():
    return typer.Option(None, "--cache-dir", callback=_use_cache_dir,
                        help="Where models given by URL are downloaded (default: $XDG_CACHE_HOME/elmo-cli, else "
                             "~/.cache/elmo-cli).")


def offline_option():
    return typer.Option(False, "--offline", callback=_use_offline,
                        help="Models given by URL come from the download cache only; one not cached is an error.")


@contextlib.contextmanager
def download_progress(url: str, total: Optional[int], start: int) -> Iterator[Callable[[int], None]]:
    """A download's bar on stderr (`elmo_cli.fetch.Progress`); off a terminal, one line when it starts."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    if not err_console.is_terminal:
        err_console.print(f"downloading {url}" + (f" from byte {start}" if start else ""), highlight=False,
                          soft_wrap=True)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=err_console, disable=not err_console.is_terminal) as bar:
        task = bar.add_task(escape(fetch.url_name(url)), total=total, completed=start)
        yield lambda n: bar.advance(task, n)


def device_option():
    return typer.Option("auto", "--device", help="auto (CUDA when torch sees a GPU, else the CPU) | cpu | cuda | "
                                                 "cuda:N.")


def threads_option():
    return typer.Option(None, "--threads", help="CPU threads for torch (default: torch's choice, one per core).")


def batch_size_option(what: str = "Sentences per batch"):
    return typer.Option(DEFAULT_BATCH_SIZE, "--batch-size", help=f"{what}.")


def errors_option(what: str = "the input"):
    return typer.Option("strict", "--errors", help=f"Invalid UTF-8 in {what}: strict (stop with the file and "
                                                   f"line) or replace (U+FFFD).")


def output_option(help: str, required: bool = True):
    return typer.Option(... if required else None, "--output", "-o", help=help)


def pick_output(positional, option, what: str = "OUTPUT"):
    """The output of a command that takes it as its last argument (allennlp's habit) or as --output/-o."""
    if positional is not None and option is not None and positional != option:
        raise ElmoError(f"{what} given twice ({positional} and --output {option}): give one")
    out = positional if positional is not None else option
    if out is None:
        raise ElmoError(f"missing {what}: give it as the last argument or as --output/-o")
    return out

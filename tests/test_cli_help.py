"""Every command's --help reads right, and every flag an error message suggests exists where it is suggested."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from elmo_cli.cli import app

ROOT = Path(__file__).resolve().parent.parent
GROUP = typer.main.get_command(app)


def _commands(group=GROUP, prefix: str = "") -> dict:
    """Every leaf command by its full name ("task train"); Typer's click (vendored or not) is used by duck typing."""
    out = {}
    for name, cmd in group.commands.items():
        full = f"{prefix}{name}"
        if hasattr(cmd, "commands"):
            out.update(_commands(cmd, full + " "))
        else:
            out[full] = cmd
    return out


COMMANDS = _commands()


def _help(name: str) -> str:
    r = CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    return r.output


def _is_option(param) -> bool:
    return getattr(param, "param_type_name", "") == "option"


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_every_command_is_walked():
    assert {"build-vocab", "shard", "train", "evaluate", "export", "dump-embeddings", "dump-token-embeddings",
            "plot", "task train", "task evaluate", "task predict"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_loses_nothing_and_shows_no_python_types(name):
    out = _help(name)
    flat = _squash(out)
    usage = out.strip().splitlines()[0]
    assert usage.startswith(f"Usage: ") and f" {name} " in usage
    assert not re.search(r"[<{}>]|list\[|\bstr\b", usage), usage
    for bad in ("<bool>", "<str>", "<int>", "<float>", "<path>", "list[", "<list"):
        assert bad not in out, (name, bad)
    for param in COMMANDS[name].params:
        if param.name == "help":
            continue
        assert param.help and param.help.strip(), f"{name}: {param.opts[0]} has no help text"
        # the help text appears verbatim (wrapping aside): nothing eaten as markup, <UNK> and <TAB> included
        assert _squash(param.help) in flat, (name, param.help)
        if _is_option(param) and not param.is_flag and param.default not in (None, ()):
            assert f"[default:{_squash(str(param.default))}]" in flat, (name, param.opts)
        if _is_option(param) and param.is_flag:  # a switch takes no value
            assert re.search(rf"{re.escape(param.opts[-1])}\s{{2,}}\S", out), (name, param.opts)


def test_literals_survive_rendering():
    assert "<UNK>" in _help("evaluate")
    assert "label<TAB>text" in _help("task train")


def test_train_help_has_the_preset_table():
    out = _help("train")
    header = next(line for line in out.splitlines() if line.strip().startswith("preset"))
    assert all(col in header for col in ("LSTM/proj", "optimizer", "lr", "batch"))
    for name in ("tiny", "laptop", "small", "medium", "original"):
        assert re.search(rf"^\s+{name}\s+\d+/\d+\s", out, re.M), name


def test_shared_options_are_alike_everywhere():
    """One convention: --device auto, --batch-size 64, --threads, -o/--output on every command that has them."""
    for name, cmd in COMMANDS.items():
        opts = {o: p for p in cmd.params for o in p.opts}
        if "--device" in opts and name != "train":  # train's comes from its preset/config (auto)
            assert opts["--device"].default == "auto", name
        if "--batch-size" in opts and name != "train":
            assert opts["--batch-size"].default == 64, name
        if "--output" in opts:
            assert "-o" in opts["--output"].opts, name
        if "--device" in opts:
            assert "--threads" in opts, name
    for name in ("dump-embeddings", "dump-token-embeddings", "evaluate", "export", "task train"):
        opts = {o for p in COMMANDS[name].params for o in p.opts}
        assert {"--model", "--options", "--weights"} <= opts, name
    for name in ("build-vocab", "shard", "evaluate", "dump-embeddings", "task train", "task evaluate",
                 "task predict"):
        assert "--errors" in {o for p in COMMANDS[name].params for o in p.opts}, name


# ---- the flags and commands that error messages suggest --------------------------------------------------------
_ALL = set(COMMANDS)
_MODEL_CMDS = {"dump-embeddings", "dump-token-embeddings", "evaluate", "export", "task train", "train"}
# which commands reach each library module (an error raised there can reach the user of any of them)
_MODULE_COMMANDS = {
    "elmo_cli/tasks/": {"task train", "task evaluate", "task predict"},
    "elmo_cli/dump.py": {"dump-embeddings", "dump-token-embeddings"},
    "elmo_cli/h5dump.py": {"dump-embeddings"},
    "elmo_cli/embed.py": {"dump-embeddings", "dump-token-embeddings", "task train", "task evaluate",
                          "task predict"},
    "elmo_cli/layers.py": {"dump-embeddings", "task train"},
    "elmo_cli/evaluate.py": {"evaluate", "train"},
    "elmo_cli/baselines.py": {"evaluate", "train"},
    "elmo_cli/train": {"train"},
    "elmo_cli/checkpoint.py": {"train"},
    "elmo_cli/data.py": {"train"},
    "elmo_cli/presets.py": {"train"},
    "elmo_cli/plot.py": {"plot", "train"},
    "elmo_cli/loading.py": _MODEL_CMDS,
    "elmo_cli/bilm_format.py": _MODEL_CMDS,
    "elmo_cli/fetch.py": _MODEL_CMDS,
    "elmo_cli/model_files.py": _MODEL_CMDS,
    "elmo_cli/export.py": {"export"},
}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_SUGGESTED_COMMAND = re.compile(r"elmo-cli (?!checkpoint|command)((?:task )?[a-z][a-z-]*)([^`;]*)")


def _error_texts(path: Path):
    """(enclosing function, text) of every `raise ElmoError(...)`; f-string parts joined by a NUL, so a flag
    never runs into the value formatted after it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                getattr(node.exc.func, "id", "") == "ElmoError" and node.exc.args:
            parts = [n.value for n in ast.walk(node.exc.args[0])
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            func = parent.get(node)
            while func is not None and not isinstance(func, ast.FunctionDef):
                func = parent.get(func)
            yield (func.name if func is not None else None), "\0".join(parts)


def _callbacks() -> dict[str, str]:
    return {cmd.callback.__name__ + "@" + cmd.callback.__module__: name for name, cmd in COMMANDS.items()}


def _suggestions():
    callbacks = _callbacks()
    for path in sorted((ROOT / "elmo_cli").rglob("*.py")) + sorted((ROOT / "vocab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        module = rel[:-3].replace("/", ".")
        for func, text in _error_texts(path):
            if func is not None and f"{func}@{module}" in callbacks:
                where = {callbacks[f"{func}@{module}"]}
            else:
                where = next((cmds for prefix, cmds in _MODULE_COMMANDS.items() if rel.startswith(prefix)), _ALL)
            yield rel, func, text, where


def _flags_of(name: str) -> set[str]:
    return {o for p in COMMANDS[name].params for o in p.opts if o.startswith("--")} | {"--help"}


def test_error_messages_suggest_flags_and_commands_that_exist():
    seen, problems = 0, []
    for rel, func, text, where in _suggestions():
        for m in _SUGGESTED_COMMAND.finditer(text):
            name, rest = m.group(1), m.group(2)
            if name not in COMMANDS:
                problems.append(f"{rel}:{func}: suggests `elmo-cli {name}`, no such command")
                continue
            for flag in _FLAG.findall(rest):
                seen += 1
                if flag not in _flags_of(name):
                    problems.append(f"{rel}:{func}: suggests `elmo-cli {name} {flag}`, no such option")
        for flag in _FLAG.findall(_SUGGESTED_COMMAND.sub("", text)):
            seen += 1
            if not any(flag in _flags_of(c) for c in where):
                problems.append(f"{rel}:{func}: mentions {flag}, which none of {sorted(where)} has")
    assert seen > 50  # the walk found the messages
    assert not problems, "\n".join(problems)

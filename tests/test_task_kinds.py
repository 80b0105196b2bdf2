"""Task kinds as objects: a kind defined here, outside the package, trains, evaluates, predicts and exports.

The toy kind tags each token "Cap" or "low" (is it capitalised?); it reads its own format ("lines": one sentence per
line, the labels read off the tokens) and writes its own (the capitalised tokens starred). It subclasses only the
interface `TaskKind`, so every method the package asks a kind for is one of its own.
"""
import json
import random

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from elmo_cli.tasks.formats import Example, whitespace
from elmo_cli.tasks.cli import task_app
from elmo_cli.tasks.kinds import TaskKind, get_kind, register_kind
from elmo_cli.tasks.metrics import classification_metrics
from vocab.errors import ElmoError
from vocab.text import read_lines

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
WORDS = ["the", "a", "cat", "dog", "bird", "sees", "likes", "red", "old", "house"]


class CapsKind(TaskKind):
    """Per token: "Cap" when the token starts with an upper-case letter, else "low"."""

    name, formats, per_token, accuracy_name = "test-caps", ("lines",), True, "token accuracy"

    def detect_format(self, path, errors="strict"):
        return "lines"

    def read(self, path, fmt, label_column="upos", tokenize=whitespace, errors="strict", unlabelled=False):
        if fmt != "lines":
            return super().read(path, fmt, label_column, tokenize, errors, unlabelled)
        return [Example(tokenize(text), None if unlabelled else
                        ["Cap" if t[:1].isupper() else "low" for t in tokenize(text)], f"{path}:{lineno}")
                for _, lineno, text in read_lines([path], errors) if text.strip()]

    def labels_of(self, labels):
        return list(labels)

    def targets(self, batch, label_index, T):
        target = torch.full((len(batch), T), -100, dtype=torch.long)  # (B, T)
        for b, ex in enumerate(batch):
            target[b, : len(ex.labels)] = torch.tensor([label_index[lab] for lab in ex.labels])
        return target

    def pool(self, h, mask):
        return h  # (B, T, D): scores per token

    def loss(self, logits, targets, mask, crf=None):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def piece(self, row, n):
        return row[:n]

    def join(self, labels, parts):
        return [labels[i] for part in parts for i in (part if part.ndim == 1 else part.argmax(-1)).tolist()]

    def write(self, examples, guess):
        return "".join(" ".join(t + "*" * (g == "Cap") for t, g in zip(ex.tokens, labs)) + "\n"
                       for ex, labs in zip(examples, guess))

    def metrics(self, gold, guess):
        out = classification_metrics([x for s in gold for x in s], [x for s in guess for x in s])
        out["sentences_right"] = sum(g == p for g, p in zip(gold, guess)) / len(gold)
        return out


def _lines(path, n, seed):
    rng = random.Random(seed)
    sentences = [[w.capitalize() if rng.random() < 0.4 else w for w in rng.choices(WORDS, k=rng.randint(2, 7))]
                 for _ in range(n)]
    path.write_text("".join(" ".join(s) + "\n" for s in sentences))
    return path


def _run(*args):
    r = runner.invoke(task_app, [str(a) for a in args], env={"COLUMNS": "250"})
    return r, r.stdout + (r.stderr if r.stderr_bytes is not None else "")


def test_a_kind_defined_outside_the_package_trains_evaluates_predicts_and_exports(tmp_path):
    pytest.importorskip("onnxruntime", reason='the serve extra: pip install -e ".[serve]"')
    register_kind(CapsKind)
    assert isinstance(get_kind("test-caps"), CapsKind)
    train, dev, test = (_lines(tmp_path / f"{n}.txt", k, seed) for n, k, seed in (("train", 60, 0), ("dev", 16, 1),
                                                                                  ("test", 12, 2)))
    task = tmp_path / "task"
    r, out = _run("train", "--kind", "test-caps", "--train", train, "--dev", dev, "--output", task, "--no-elmo",
                  "--epochs", "6", "--lr", "0.05", "--hidden-dim", "8", "--word-dim", "8", "--batch-size", "8")
    assert r.exit_code == 0, out
    assert json.loads((task / "config.json").read_text())["kind"] == "test-caps"
    r, out = _run("evaluate", "--task", task, test, "--json")
    assert r.exit_code == 0, out
    m = json.loads(out.strip().splitlines()[-1])
    assert m["kind"] == "test-caps" and m["n"] > 12 and m["accuracy"] > 0.8 and 0 <= m["sentences_right"] <= 1
    r, out = _run("evaluate", "--task", task, test)
    assert r.exit_code == 0 and "token accuracy" in out, out
    r, out = _run("predict", "--task", task, test, tmp_path / "torch.out")
    assert r.exit_code == 0, out
    r, out = _run("export", "--task", task, "--format", "onnx", "--output", tmp_path / "onnx")
    assert r.exit_code == 0, out
    assert json.loads((tmp_path / "onnx" / "task.json").read_text())["kind"] == "test-caps"
    r, out = _run("predict", "--onnx", tmp_path / "onnx", test, tmp_path / "onnx.out")
    assert r.exit_code == 0, out
    want, got = (tmp_path / "torch.out").read_text(), (tmp_path / "onnx.out").read_text()
    assert got == want
    lines = test.read_text().splitlines()
    assert [w.rstrip("*") for w in want.split()] == test.read_text().split() and len(want.splitlines()) == len(lines)
    starred = np.mean([w.endswith("*") == w[0].isupper() for w in want.split()])
    assert starred > 0.8  # the writer marks what the model calls capitalised


def test_the_builtin_kinds_are_registered_under_their_config_names():
    assert get_kind("tagging").per_token and not get_kind("classification").per_token
    with pytest.raises(ElmoError, match="--kind 'nope': use one of tagging, classification"):
        get_kind("nope")


def test_registering_a_kind_without_required_methods_is_one_line_naming_them():
    class Half:
        name, formats, per_token = "half", ("tsv",), False

        def detect_format(self, path, errors="strict"):
            return "tsv"

        def read(self, *args, **kw):
            return []

    with pytest.raises(ElmoError) as e:
        register_kind(Half)
    message = str(e.value)
    assert "\n" not in message and "'Half'" in message
    for method in ("labels_of", "targets", "pool", "loss", "piece", "join", "write", "metrics"):
        assert method in message
    assert "detect_format" not in message

    class Partial(TaskKind):  # an abstract method left out of a TaskKind subclass is named too
        name, formats, per_token = "partial", ("tsv",), False
        detect_format = labels_of = targets = pool = loss = piece = join = write = (lambda self, *a: None)

    with pytest.raises(ElmoError, match=r"lacks method\(s\) metrics$"):
        register_kind(Partial)
    with pytest.raises(ElmoError, match="--kind 'half'"):
        get_kind("half")

"""The figures of the docs against the results files they name.

A figure table in README.md, docs/*.md or an examples/ README is preceded by a line naming its results file (or files)::

    Results: `benchmarks/results/repeat-2026-11-26.json` (`python -m benchmarks.bench_repeat`)

Every number in that table's body, but for its first column (the row's name), must be one of the files' numbers as
printed: the same value at the precision the table shows (``2,828`` is 2828 rounded to a unit, ``1.112`` to a
thousandth). Three kinds of file:

- ``benchmarks/results/NAME-DATE.json``, written by `benchmarks.results.Recording`: the command, commit, date,
  machine and load beside ``figures``, whose numbers are the table's;
- ``benchmarks/results/NAME.jsonl``, one record per line (one run each, as `benchmarks.bench_quality` writes them):
  every line has its date, its commit (``commit`` or ``code``) and its machine (``cpu``, ``machine`` or
  ``device``); every number of every line counts;
- ``examples/**.txt``, a command's saved output (``make demo``'s, ``make demo-task``'s): a header of ``#`` lines
  with the command, machine and date, then the output; every number in it counts.

Numbers inside a record's strings count too (the ``auto:`` line's ``1,860 tokens/s``, a shape ``1024/256``).
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("**/README.md"))]
RESULTS_LINE = re.compile(r"^Results: `(benchmarks/results|examples)/")
RESULTS_FILE = re.compile(r"`((?:benchmarks/results|examples)/[^`]+\.(?:json|jsonl|txt))`")
DATE = re.compile(r"20\d\d-\d\d-\d\d")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?(?![\w])")


def tagged_tables(path: Path) -> list[tuple[tuple[str, ...], int, list[str]]]:
    """(results files, line number, table body rows) for every table that follows a ``Results:`` line."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]  # tables in list items too
    out, i = [], 0
    while i < len(lines):
        m = RESULTS_LINE.match(lines[i])
        start_line = i
        i += 1
        if not m:
            continue
        while i < len(lines) and not lines[i].startswith("|"):
            i += 1
        start, rows = i, []
        while i < len(lines) and lines[i].startswith("|"):
            rows.append(lines[i])
            i += 1
        files = tuple(RESULTS_FILE.findall(lines[start_line]))
        out.append((files, start + 1, rows[2:]))  # header and separator rows are not figures
    return out


def leaves(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    if isinstance(value, str):
        return numbers_in(value)
    return []


def numbers_in(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUMBER.findall(text)]


def figures_of(name: str) -> list[float]:
    """The numbers a table may quote from one results file; asserts the file says what ran, where and when."""
    path = ROOT / name
    assert path.is_file(), f"{name} does not exist"
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        record = json.loads(text)
        for key in ("command", "commit", "date", "machine", "load_before", "load_after", "figures"):
            assert key in record, f"{name}: no {key!r}"
        return leaves(record["figures"])
    if path.suffix == ".jsonl":
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert records, f"{name}: no records"
        for k, record in enumerate(records, 1):
            for keys in (("date",), ("commit", "code"), ("cpu", "machine", "device")):
                assert any(key in record for key in keys), f"{name}:{k}: none of {keys}"
        return leaves(records)
    header = "\n".join(line for line in text.splitlines()[:20] if line.startswith("#"))
    assert DATE.search(header) and re.search(r"AMD|Intel|NVIDIA|Apple", header), \
        f"{name}: its '#' header names no date and machine"
    return numbers_in(text)


def printed_as(text: str, values: list[float]) -> bool:
    """Whether some value, rounded to the decimals `text` shows, is `text` (``4.8e-6``: 4.77e-6 at two figures)."""
    mantissa, _, exponent = text.replace(",", "").partition("e")
    scale = 10.0 ** int(exponent or 0)
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    shown = float(mantissa)
    return any(abs(round(v / scale, decimals) - shown) < 0.5 * 10 ** -decimals for v in values)


TABLES = [(doc, *t) for doc in DOCS for t in tagged_tables(doc)]


def test_some_tables_name_their_results():
    assert TABLES, "no figure table names its results file"


@pytest.mark.parametrize("doc, results, line, rows", TABLES,
                         ids=[f"{d.name}:{line}" for d, _, line, _ in TABLES])
def test_every_figure_is_in_its_results_file(doc, results, line, rows):
    assert results, f"{doc.name}:{line}: the Results line names no file"
    values = [x for name in results for x in figures_of(name)]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]  # the first cell names the row
        for cell in cells:
            for number in NUMBER.findall(cell):
                assert printed_as(number, values), f"{doc.name}:{line}: {number} ({row.strip()}) is not in {results}"


BOUND = re.compile(r"(?:≤|<=|at most) ?\**(0\.\d+)\** in (60 minutes|2 hours)")


def test_each_quality_target_is_stated_once_as_the_benchmark_holds_it():
    """`auto`'s and `laptop`'s targets live in benchmarks/bench_quality.py; each doc statement of one is theirs,
    in the doc of that recipe, once."""
    from benchmarks.bench_quality import TARGETS

    stated = [(doc.name, float(m[1]), 60.0 if m[2] == "60 minutes" else 120.0)
              for doc in DOCS for m in BOUND.finditer(" ".join(doc.read_text(encoding="utf-8").split()))]
    home = {"auto": "auto.md", "laptop": "benchmarks.md"}
    expected = sorted((home[preset], ratio, minutes) for preset, by in TARGETS.items() for minutes, ratio in by.items())
    assert sorted(stated) == expected


@pytest.mark.parametrize("record, target", [
    ({"preset": "auto", "minutes": 60.0, "train_tokens": 825_573, "corpus": "kjv"}, 0.70),
    ({"preset": "auto", "minutes": 120, "train_tokens": 1_606_127, "corpus": "austen+kjv"}, 0.62),
    ({"preset": "auto", "minutes": 60.0, "train_tokens": 205_391, "corpus": "austen-0.2M"}, None),  # not ~1M tokens
    ({"preset": "auto", "minutes": 15.0, "train_tokens": 825_573, "corpus": "kjv"}, None),
    ({"preset": "laptop", "minutes": 120.0, "train_tokens": 780_554, "corpus": "austen"}, 0.80),
    ({"preset": "laptop", "minutes": 60.0, "train_tokens": 825_573, "corpus": "kjv"}, None),  # set on austen only
])
def test_the_benchmark_holds_each_run_to_its_recipes_target(record, target):
    from benchmarks.bench_quality import target_for

    assert target_for(record) == target


SELF_TALK = re.compile(r"\b(?:lent|loans?|lease[ds]?|borrowed)\b|§|\bthe issue\b|\bissue's\b|\bthe brief\b|\.\./shared|"
                       r"/tmp/|/work/|/home/", re.IGNORECASE)


@pytest.mark.parametrize("doc", DOCS + sorted((ROOT / "tests" / "data").glob("**/README.md")), ids=lambda d: d.name)
def test_the_docs_describe_machines_by_what_they_are_and_cite_only_the_repository(doc):
    """No words about how a machine was obtained, no sections of documents a reader does not have, no paths
    outside the checkout."""
    hits = [f"{doc.name}:{k}: {line.strip()}" for k, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
            if SELF_TALK.search(line)]
    assert not hits, "\n".join(hits)


def test_autos_example_placement_line_is_what_place_ratio_prints():
    from elmo_cli.baselines import place_ratio

    text = (ROOT / "docs" / "auto.md").read_text(encoding="utf-8")
    example = re.search(r"^(0\.\d{3})x KN5: .*$", text, re.MULTILINE)
    assert example, "docs/auto.md shows no placement line"
    tokens = 205_391  # the austen-0.2M run the example is taken from (its auto: line above it)
    assert place_ratio(float(example[1]), tokens) == example[0]

"""The figures of the docs against the results files they name.

A figure table in README.md or docs/*.md is preceded by a line naming its results file (or files)::

    Results: `benchmarks/results/repeat-2026-11-26.json` (`python -m benchmarks.bench_repeat`)

Every number in that table's body, but for its first column (the row's name), must be one of the files' numbers as
printed: the same value at the precision the
table shows (``2,828`` is 2828 rounded to a unit, ``1.112`` to a thousandth). The command, machine, date and load are
in the file, so a reader can trace each figure to the run that measured it.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RESULTS_LINE = re.compile(r"^Results: `benchmarks/results/")
RESULTS_FILE = re.compile(r"`(benchmarks/results/[^`]+\.json)`")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?![\w])")


def tagged_tables(path: Path) -> list[tuple[tuple[str, ...], int, list[str]]]:
    """(results files, line number, table body rows) for every table that follows a ``Results:`` line."""
    lines = path.read_text(encoding="utf-8").splitlines()
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
    return []


def printed_as(text: str, values: list[float]) -> bool:
    """Whether some value, rounded to the decimals `text` shows, is `text`."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    shown = float(text.replace(",", ""))
    return any(abs(round(v, decimals) - shown) < 0.5 * 10 ** -decimals for v in values)


TABLES = [(doc, *t) for doc in DOCS for t in tagged_tables(doc)]


def test_some_tables_name_their_results():
    assert TABLES, "no figure table names its results file"


@pytest.mark.parametrize("doc, results, line, rows", TABLES,
                         ids=[f"{d.name}:{line}" for d, _, line, _ in TABLES])
def test_every_figure_is_in_its_results_file(doc, results, line, rows):
    values = []
    for name in results:
        path = ROOT / name
        assert path.is_file(), f"{doc.name}:{line}: {name} does not exist"
        record = json.loads(path.read_text())
        for key in ("command", "commit", "date", "machine", "load_before", "load_after", "figures"):
            assert key in record, f"{name}: no {key!r}"
        values += leaves(record["figures"])
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]  # the first cell names the row
        for cell in cells:
            for number in NUMBER.findall(cell):
                assert printed_as(number, values), f"{doc.name}:{line}: {number} ({row.strip()}) is not in {results}"

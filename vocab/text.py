"""Reading corpus text line by line, and writing files atomically.

`read_lines` is the one place that turns user files into text: it expands globs, reads ``-`` (standard input)
and ``.gz`` files, strips a UTF-8 BOM and CRLF line ends, and rejects what would silently corrupt a corpus
(invalid UTF-8, NUL bytes) with ``file:line`` in the message. It streams: memory never grows with file size.

    read_lines(["a.txt"]) -> ("a.txt", 1, "first line"), ("a.txt", 2, ""), ...
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import sys
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from vocab.errors import ElmoError

STDIN = "-"
STDIN_NAME = "<stdin>"
ERRORS = ("strict", "replace")
_BOM = b"\xef\xbb\xbf"


def expand_paths(paths: list[str | Path] | str | Path) -> list[str]:
    """Expand shell globs (sorted), keep ``-``; raise ElmoError for a missing file or a glob matching nothing.

    ``expand_paths(["data/*.txt", "-"]) -> ["data/a.txt", "data/b.txt", "-"]``
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = str(p)
        if p == STDIN or os.path.exists(p):
            if os.path.isdir(p):
                raise ElmoError(f"{p}: is a directory, expected a text file")
            out.append(p)
        elif glob.has_magic(p):
            matches = sorted(m for m in glob.glob(p) if os.path.isfile(m))
            if not matches:
                raise ElmoError(f"{p}: no file matches this pattern")
            out.extend(matches)
        else:
            raise ElmoError(f"{p}: no such file")
    if not out:
        raise ElmoError("no corpus files given")
    return out


def _open(path: str) -> BinaryIO:
    if path == STDIN:
        return sys.stdin.buffer
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")
        return open(path, "rb")
    except OSError as e:
        raise ElmoError(f"{path}: cannot open ({e.strerror or e})") from None


def _decode(raw: bytes, display: str, lineno: int, errors: str) -> str:
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise ElmoError(f"{display}:{lineno}: NUL byte at byte offset {nul}; is this a binary file?")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if errors == "replace":
            return raw.decode("utf-8", "replace")
        raise ElmoError(
            f"{display}:{lineno}: invalid UTF-8 at byte offset {e.start}; pass --errors replace to substitute U+FFFD"
        ) from None


def read_lines(paths: list[str | Path] | str | Path, errors: str = "strict") -> Iterator[tuple[str, int, str]]:
    """Yield ``(display_path, line_number, text)`` for every line of every file, blank lines included.

    # Parameters
    paths : `list[str | Path] | str | Path`
        Files, shell globs, ``-`` for standard input; ``.gz`` files are decompressed.
    errors : `str`, optional, (default = `"strict"`)
        ``"strict"`` raises ElmoError on invalid UTF-8 (file, line, byte offset); ``"replace"`` substitutes U+FFFD.

    # Returns
    Tuples of the display path (``<stdin>`` for ``-``), the 1-based line number and the line without its
    ``\\n`` / ``\\r\\n``, with a UTF-8 BOM removed from the first line. NUL bytes raise ElmoError.
    """
    if errors not in ERRORS:
        raise ElmoError(f"unknown --errors value {errors!r}; expected one of {', '.join(ERRORS)}")
    for path in expand_paths(paths):
        display = STDIN_NAME if path == STDIN else path
        f = _open(path)
        lineno = 0
        try:
            for raw in f:
                lineno += 1
                if raw.endswith(b"\n"):
                    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
                elif raw.endswith(b"\r"):
                    raw = raw[:-1]
                if lineno == 1 and raw.startswith(_BOM):
                    raw = raw[3:]
                yield display, lineno, _decode(raw, display, lineno, errors)
        except (OSError, EOFError, zlib.error) as e:
            raise ElmoError(f"{display}:{lineno + 1}: cannot read ({e})") from None
        finally:
            if path != STDIN:
                f.close()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    with atomic_writer(path) as f:
        f.write(data)


class atomic_writer:
    """``with atomic_writer(path) as f: f.write(b"...")``: temp name beside ``path``, fsync, rename, fsync the dir.

    On an exception the temp file is removed and ``path`` is untouched.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.tmp = temporary_path(self.path)

    def __enter__(self) -> BinaryIO:
        try:
            self.f = open(self.tmp, "wb")
        except OSError as e:
            raise ElmoError(f"{self.path}: cannot write ({e.strerror or e})") from None
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.f.close()
            self.tmp.unlink(missing_ok=True)
            return
        self.f.close()
        publish(self.tmp, self.path)


def check_new_output(output: str | Path, force: bool, directory: bool = False) -> None:
    """The check every command makes before writing its output: ElmoError if ``output`` exists (without
    ``force``), is a directory where a file is written, or has no parent directory."""
    output = Path(output)
    if output.exists() and not force:
        raise ElmoError(f"{output}: already exists; pass --force to overwrite it")
    if output.is_dir() and not directory:
        raise ElmoError(f"{output}: is a directory")
    if not output.parent.is_dir():
        raise ElmoError(f"{output.parent}: output directory does not exist")


def temporary_path(final: str | Path) -> Path:
    """Where an output is built before `publish` or `publish_dir` gives it its name, the one naming every writer
    uses: hidden beside it, with this process's id, the suffix repeated for writers that want one (torch.export):
    ``out/model.pt2 -> out/.model.pt2.tmp-4242.pt2``. (A dump's resumable ``OUTPUT.partial`` is the exception: its
    name must survive the process, see `elmo_cli.h5dump`.)"""
    final = Path(final)
    return final.with_name(f".{final.name}.tmp-{os.getpid()}{final.suffix}")


def publish(tmp: str | Path, path: str | Path) -> None:
    """Make a finished temporary file durable and give it its final name: fsync it, rename it over ``path``
    (atomic on one filesystem), fsync the directory. Every atomic write in the project ends here."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def publish_dir(tmp: str | Path, directory: str | Path) -> None:
    """Give a finished temporary directory its final name, replacing what was there (moved aside first, removed
    after), and fsync the parent: a reader sees the old directory or the new one, never a mix."""
    import shutil

    tmp, directory = Path(tmp), Path(directory)
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    fsync_dir(directory.parent)
    shutil.rmtree(old, ignore_errors=True)


def fsync_dir(directory: str | Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: str | Path, what: str = "JSON file") -> object:
    """Parse a small JSON file; a missing file or invalid JSON is an ElmoError naming the file and `what` it is."""
    path = Path(path)
    if not path.is_file():
        raise ElmoError(f"{path}: {what} not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ElmoError(f"{path}: corrupt {what}, not valid JSON ({e})") from None

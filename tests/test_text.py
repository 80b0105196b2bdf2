import gzip
import io
import sys

import pytest

from vocab.errors import ElmoError
from vocab.text import atomic_write_bytes, atomic_writer, expand_paths, read_lines


def lines(*args, **kw):
    return list(read_lines(*args, **kw))


def test_bom_crlf_and_blank_lines(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"\xef\xbb\xbfone two\r\n\r\nthree\r\nfour")
    assert lines(p) == [(str(p), 1, "one two"), (str(p), 2, ""), (str(p), 3, "three"), (str(p), 4, "four")]


def test_gz_glob_and_order(tmp_path):
    (tmp_path / "b.txt").write_text("b1\n")
    with gzip.open(tmp_path / "a.txt.gz", "wb") as f:
        f.write("a1\na2\n".encode())
    got = [(p.rsplit("/", 1)[-1], n, t) for p, n, t in read_lines(str(tmp_path / "*"))]
    assert got == [("a.txt.gz", 1, "a1"), ("a.txt.gz", 2, "a2"), ("b.txt", 1, "b1")]


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("x y\nz\n".encode())))
    assert lines("-") == [("<stdin>", 1, "x y"), ("<stdin>", 2, "z")]


def test_missing_file_and_empty_glob(tmp_path):
    with pytest.raises(ElmoError, match="nope.txt: no such file"):
        lines(tmp_path / "nope.txt")
    with pytest.raises(ElmoError, match="no file matches"):
        lines(str(tmp_path / "*.xyz"))
    with pytest.raises(ElmoError, match="is a directory"):
        expand_paths([tmp_path])


def test_invalid_utf8_names_file_line_offset(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"fine\nab\xffcd\n")
    with pytest.raises(ElmoError, match=r"bad.txt:2: invalid UTF-8 at byte offset 2; pass --errors replace"):
        lines(p)
    assert lines(p, errors="replace")[1][2] == "ab\ufffdcd"
    with pytest.raises(ElmoError, match="--errors"):
        lines(p, errors="ignore")


def test_nul_byte(tmp_path):
    p = tmp_path / "nul.txt"
    p.write_bytes(b"ok\nok\nx\x00y\n")
    with pytest.raises(ElmoError, match=r"nul.txt:3: NUL byte at byte offset 1"):
        lines(p)


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "c.txt.gz"
    p.write_bytes(b"not gzip at all\n")
    with pytest.raises(ElmoError, match="c.txt.gz:1: cannot read"):
        lines(p)


def test_atomic_write(tmp_path):
    p = tmp_path / "out.txt"
    atomic_write_bytes(p, b"old")
    with pytest.raises(RuntimeError):
        with atomic_writer(p) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert p.read_bytes() == b"old"
    assert [x.name for x in tmp_path.iterdir()] == ["out.txt"]

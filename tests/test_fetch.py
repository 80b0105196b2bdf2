"""Models by URL (elmo_cli.fetch): downloaded once into the cache, resumed after a cut, checked, and refused in one
line when the server says no; against a local http.server serving the reference model under published names."""
from __future__ import annotations

import hashlib
import http.server
import shutil
import socket
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from allennlp_reference import REFERENCE
from elmo_cli import fetch
from elmo_cli.model_files import resolve_model_files, weights_url_beside
from elmo_cli.cli import app
from vocab.errors import ElmoError

pytestmark = pytest.mark.usefixtures("one_thread")


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET of the files in `server.root`, honouring ``Range: bytes=N-`` unless told not to; records each request."""

    def do_GET(self):
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range")))
        time.sleep(srv.delay)
        path = srv.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        data, start = path.read_bytes(), 0
        wanted = self.headers.get("Range")
        if wanted and srv.honour_range:
            start = int(wanted.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start + srv.range_shift}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if path.name in srv.cut_once:  # half the body, then the connection closes
            srv.cut_once.discard(path.name)
            body = body[: len(body) // 2]
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    shutil.copy(REFERENCE / "options.json", root / "x_options.json")
    shutil.copy(REFERENCE / "weights.hdf5", root / "x_weights.hdf5")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads, srv.block_on_close = True, False
    srv.root, srv.requests, srv.cut_once, srv.honour_range, srv.delay = root, [], set(), True, 0.0
    srv.range_shift = 0
    srv.handle_error = lambda request, address: None  # a client that hangs up early (after a 404, a cut) is normal:
    # socketserver's traceback would land on the stderr the CLI tests read
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/"
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def cache(tmp_path):
    """A fresh cache per test, and the module's settings put back after it."""
    fetch.configure(cache_dir=tmp_path / "cache", timeout=5)
    yield tmp_path / "cache"
    fetch.configure()


def test_downloaded_once_then_served_from_the_cache(server, cache):
    url = server.url + "x_options.json"
    first = fetch.fetch(url)
    assert first.read_bytes() == (server.root / "x_options.json").read_bytes()
    assert first.parent == cache and first.name.endswith("-x_options.json")
    assert fetch.fetch(url) == first
    assert len(server.requests) == 1
    other = fetch.cached_path(server.url + "other/x_options.json")
    assert other != first and other.name.endswith("-x_options.json")  # same file name, another URL
    assert sorted(p.name for p in cache.iterdir()) == [first.name, first.name + ".lock"]  # no partial file left


def test_the_default_cache_is_under_xdg_cache_home(monkeypatch, tmp_path):
    fetch.configure()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert fetch.cached_path("http://h/a/x_options.json").parent == tmp_path / "xdg" / "elmo-cli"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fetch.cache_dir() == tmp_path / "home" / ".cache" / "elmo-cli"


def test_processes_started_together_download_once(server):
    server.delay = 0.3
    url = server.url + "x_weights.hdf5"
    got = []
    threads = [threading.Thread(target=lambda: got.append(fetch.fetch(url))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 and len(set(got)) == 1 and len(server.requests) == 1


def test_model_url_brings_the_weights_beside_it(server):
    files = resolve_model_files(server.url + "x_options.json", None, None)
    assert files.weights.read_bytes() == (server.root / "x_weights.hdf5").read_bytes()
    assert sorted(p for p, _ in server.requests) == ["/x_options.json", "/x_weights.hdf5"]
    again = resolve_model_files(None, server.url + "x_options.json", server.url + "x_weights.hdf5")
    assert (again.options, again.weights) == (files.options, files.weights) and len(server.requests) == 2


def test_weights_url_beside_the_published_options():
    base = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/"
    assert weights_url_beside(base + "elmo_2x4096_512_2048cnn_2xhighway_options.json") == \
        base + "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5"
    with pytest.raises(ElmoError, match=r"^http://h/model\.json: cannot tell its weights URL"):
        weights_url_beside("http://h/model.json")


@pytest.mark.parametrize("honour_range", [True, False])
def test_a_cut_download_resumes(server, honour_range):
    server.cut_once.add("x_weights.hdf5")
    server.honour_range = honour_range
    url = server.url + "x_weights.hdf5"
    with pytest.raises(ElmoError, match=r"download cut at \d+ of \d+ bytes.*run again to resume") as e:
        fetch.fetch(url)
    assert url in str(e.value) and "\n" not in str(e.value)
    final = fetch.cached_path(url)
    whole = (server.root / "x_weights.hdf5").read_bytes()
    assert not final.exists() and fetch.partial_path(final).stat().st_size == len(whole) // 2
    assert fetch.fetch(url).read_bytes() == whole
    assert server.requests[1] == ("/x_weights.hdf5", f"bytes={len(whole) // 2}-")
    assert not fetch.partial_path(final).exists()


def test_a_resume_at_the_wrong_byte_starts_again(server):
    server.cut_once.add("x_weights.hdf5")
    server.range_shift = 1
    url = server.url + "x_weights.hdf5"
    with pytest.raises(ElmoError, match="download cut"):
        fetch.fetch(url)
    with pytest.raises(ElmoError, match=r"resumed the download at another byte than \d+ .*removed, run again$"):
        fetch.fetch(url)
    assert not fetch.partial_path(fetch.cached_path(url)).exists()
    assert fetch.fetch(url).read_bytes() == (server.root / "x_weights.hdf5").read_bytes()


def test_404_names_the_url_and_status(server):
    url = server.url + "missing_options.json"
    with pytest.raises(ElmoError, match=r"^http://127\.0\.0\.1:\d+/missing_options\.json: HTTP 404 Not Found$"):
        fetch.fetch(url)
    assert not fetch.cached_path(url).exists() and not fetch.partial_path(fetch.cached_path(url)).exists()


def test_timeout_and_refused_connection_name_the_url(server, cache):
    server.delay = 1.0
    fetch.configure(cache_dir=cache, timeout=0.2)
    url = server.url + "x_options.json"
    with pytest.raises(ElmoError, match=r"^http://127\.0\.0\.1:\d+/x_options\.json: cannot download \(.*timed out"):
        fetch.fetch(url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ElmoError, match=rf"^http://127\.0\.0\.1:{port}/x_options\.json: cannot download \(.*refused"):
        fetch.fetch(f"http://127.0.0.1:{port}/x_options.json")


@pytest.mark.parametrize("known, expected", [
    (fetch.KnownFile(sha256="0" * 64), r"sha256 mismatch: expected 0{64}, got [0-9a-f]{64}"),
    (fetch.KnownFile(size=12), r"size mismatch: expected 12 bytes, got \d+"),
])
def test_checksum_or_size_mismatch_removes_the_download(server, monkeypatch, known, expected):
    url = server.url + "x_weights.hdf5"
    monkeypatch.setitem(fetch.KNOWN_FILES, url, known)
    with pytest.raises(ElmoError, match=expected):
        fetch.fetch(url)
    final = fetch.cached_path(url)
    assert not final.exists() and not fetch.partial_path(final).exists()
    whole = (server.root / "x_weights.hdf5").read_bytes()
    monkeypatch.setitem(fetch.KNOWN_FILES, url, fetch.KnownFile(len(whole), hashlib.sha256(whole).hexdigest()))
    assert fetch.fetch(url).read_bytes() == whole  # the right numbers pass


def test_offline_uses_the_cache_only(server, cache):
    url = server.url + "x_options.json"
    fetch.configure(cache_dir=cache, offline=True)
    with pytest.raises(ElmoError, match=r"^http://127\.0\.0\.1:\d+/x_options\.json: not in the cache .*--offline"):
        fetch.fetch(url)
    assert server.requests == []
    fetch.configure(cache_dir=cache)
    path = fetch.fetch(url)
    fetch.configure(cache_dir=cache, offline=True)
    assert fetch.fetch(url) == path and len(server.requests) == 1


def _invoke(args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result, result.output + (result.stderr if result.stderr_bytes is not None else "")


def test_dump_embeddings_by_url_writes_the_same_file(server, tmp_path):
    by_path, by_url = tmp_path / "path.hdf5", tmp_path / "url.hdf5"
    sentences = REFERENCE / "sentences.txt"
    result, text = _invoke(["dump-embeddings", sentences, by_path, "--model", server.root / "x_options.json"])
    assert result.exit_code == 0, text
    args = ["dump-embeddings", sentences, by_url, "--model", server.url + "x_options.json",
            "--cache-dir", tmp_path / "cli-cache"]
    result, text = _invoke(args)
    assert result.exit_code == 0, text
    assert "downloading " + server.url + "x_weights.hdf5" in text
    assert by_url.read_bytes() == by_path.read_bytes()
    assert len([p for p in (tmp_path / "cli-cache").iterdir() if p.suffix != ".lock"]) == 2
    by_url.unlink()
    result, text = _invoke([*args, "--offline"])
    assert result.exit_code == 0, text
    assert len(server.requests) == 2 and by_url.read_bytes() == by_path.read_bytes()


def test_cli_errors_are_one_line(server, tmp_path):
    out = tmp_path / "out.hdf5"
    url = server.url + "nothing_options.json"
    for extra, expected in (([], f"error: {url}: HTTP 404 Not Found"),
                            (["--offline"], f"error: {url}: not in the cache")):
        result, text = _invoke(["dump-embeddings", REFERENCE / "sentences.txt", out, "--model", url,
                                "--cache-dir", tmp_path / "c", *extra])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith(expected), text
        assert not out.exists()


def test_embedder_takes_urls(server):
    from elmo_cli.embed import Embedder

    sentence = [["The", "cat", "sat", "."]]
    local = Embedder(options_file=server.root / "x_options.json", weight_file=server.root / "x_weights.hdf5",
                     device="cpu").embed_sentences(sentence)[0]
    by_url = Embedder(server.url + "x_options.json", device="cpu").embed_sentences(sentence)[0]
    both = Embedder(options_file=server.url + "x_options.json", weight_file=server.url + "x_weights.hdf5",
                    device="cpu").embed_sentences(sentence)[0]
    assert np.array_equal(local, by_url) and np.array_equal(local, both)
    assert len(server.requests) == 2


def test_export_and_task_train_take_urls(server, tmp_path):
    url = server.url + "x_options.json"
    result, text = _invoke(["export", "--model", url, "--output", tmp_path / "export", "--cache-dir", tmp_path / "c"])
    assert result.exit_code == 0, text
    assert (tmp_path / "export" / "weights.hdf5").is_file() and len(server.requests) == 2
    missing = server.url + "y_options.json"
    result, text = _invoke(["task", "train", "--kind", "tagging", "--train", tmp_path / "t.conllu", "--dev",
                            tmp_path / "d.conllu", "--output", tmp_path / "task", "--model", missing, "--offline",
                            "--cache-dir", tmp_path / "c"])
    assert result.exit_code == 1 and f"error: {missing}: not in the cache" in text
    assert len(server.requests) == 2

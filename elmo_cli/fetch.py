"""Model files by URL: `fetch` downloads an http(s) URL once into the cache and returns the local file.

allennlp's users gave the published ELMo models by URL (``Elmo(options_file="https://...", ...)``); every command
that takes ``--model/--options/--weights`` and the `Embedder` accept one (`model_files.resolve_model_files` calls
`fetch` on each URL it is given).

Cache layout: ``$XDG_CACHE_HOME/elmo-cli`` (default ``~/.cache/elmo-cli``, or ``--cache-dir``) holds one file per
URL, ``<first 16 hex digits of sha256(URL)>-<the URL's file name>``, so two URLs never share a file. A download
goes into ``<that name>.partial``; an interrupted one is resumed from there (an HTTP Range request; a server that
ignores it sends the whole file again). When complete, the size and sha256 of a file in `KNOWN_FILES` are checked
(a mismatch removes the partial file) and the file is renamed to its final name (`vocab.text.publish`). While a
process downloads a URL it holds ``<name>.lock`` (flock), so processes started together download it once.

Settings (`configure`): the cache directory, ``offline`` (the cache only, no network), the timeout, and a progress
callback: library code never prints, the CLI passes one that draws a bar (`elmo_cli.console`).
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator

from vocab.errors import ElmoError
from vocab.text import publish

CHUNK = 1 << 20  # bytes read and written per step
DEFAULT_TIMEOUT = 60.0  # seconds without an answer (connect, or between two reads) before giving up

# progress(url, total bytes or None, bytes already there) -> a context manager yielding advance(n_bytes)
Progress = Callable[[str, "int | None", int], ContextManager[Callable[[int], None]]]


@dataclass(frozen=True)
class KnownFile:
    """What a published file must be; None where not known (then it is not checked)."""

    size: int | None = None
    sha256: str | None = None


_S3 = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/"
_PUBLISHED = ("2x1024_128_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway", "2x4096_512_2048cnn_2xhighway",
              "2x4096_512_2048cnn_2xhighway_5.5B")
# allennlp's published English models (docs/migration.md#the-published-models-by-url). Their sizes and checksums are not
# recorded here: no source we can cite gives them, so these files are downloaded unchecked.
KNOWN_FILES: dict[str, KnownFile] = {
    f"{_S3}{shape}/elmo_{shape}_{kind}": KnownFile()
    for shape in _PUBLISHED for kind in ("options.json", "weights.hdf5")
}


@dataclass
class Settings:
    cache_dir: Path | None = None  # None: $XDG_CACHE_HOME/elmo-cli or ~/.cache/elmo-cli
    offline: bool = False
    timeout: float = DEFAULT_TIMEOUT
    progress: Progress | None = None


settings = Settings()


def configure(cache_dir: str | Path | None = None, offline: bool = False, timeout: float = DEFAULT_TIMEOUT,
              progress: Progress | None = None) -> None:
    """Set how URLs are fetched from now on in this process (each command of the CLI sets them from its flags)."""
    global settings
    settings = Settings(Path(cache_dir) if cache_dir is not None else None, offline, timeout, progress)


def is_url(value) -> bool:
    return isinstance(value, str) and re.match(r"https?://", value, re.I) is not None


def path_or_url(value: str | None):
    """A model argument as given on the command line: an http(s) URL stays a string, anything else is a Path
    (a Path would turn ``https://`` into ``https:/``)."""
    if value is None or isinstance(value, Path) or is_url(value):
        return value
    return Path(value)


def cache_dir() -> Path:
    if settings.cache_dir is not None:
        return settings.cache_dir
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elmo-cli"


def url_name(url: str) -> str:
    """The URL's file name (the last segment of its path), or ``download`` when its path ends in ``/``."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    return re.sub(r"[^\w.+-]", "_", name) or "download"


def cached_path(url: str) -> Path:
    """Where `url` is kept in the cache: a hash of the whole URL, then its file name."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    return cache_dir() / f"{digest}-{url_name(url)}"


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


def fetch(url: str) -> Path:
    """The local copy of `url`: from the cache, or downloaded (resuming a partial download), checked, cached."""
    final = cached_path(url)
    if final.is_file():
        return final
    if settings.offline:
        raise ElmoError(f"{url}: not in the cache ({cache_dir()}) and --offline forbids downloading it")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ElmoError(f"{final.parent}: cannot create the download cache ({e.strerror or e})") from None
    with _lock(final):  # one download of a URL at a time (torchrun's processes all resolve the model)
        if final.is_file():  # another process has just finished it
            return final
        partial = partial_path(final)
        _download(url, partial)
        _verify(url, partial, KNOWN_FILES.get(url, KnownFile()))
        publish(partial, final)
    return final


@contextlib.contextmanager
def _lock(final: Path) -> Iterator[None]:
    """Hold ``<final>.lock`` exclusively (waiting for another process's download of the same URL to end)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(final.with_name(final.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _open(url: str, start: int):
    """The server's answer to a GET of `url` from byte `start` (a Range request when start > 0)."""
    headers = {"User-Agent": "elmo-cli"}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=settings.timeout)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and start:  # the partial file is not a prefix the server knows: start again
            return None
        raise ElmoError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise ElmoError(f"{url}: cannot download ({reason})") from None


def _download(url: str, partial: Path) -> None:
    """Fill `partial` with the whole of `url`, continuing what it holds when the server honours Range."""
    start = partial.stat().st_size if partial.is_file() else 0
    response = _open(url, start)
    if response is None:
        partial.unlink()
        start, response = 0, _open(url, 0)
    with response:
        resumed = start > 0 and response.status == 206
        if resumed and not response.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
            partial.unlink()
            raise ElmoError(f"{url}: the server resumed the download at another byte than {start} (Content-Range "
                            f"{response.headers.get('Content-Range')!r}); the partial download was removed, run again")
        start = start if resumed else 0
        length = response.headers.get("Content-Length")
        total = start + int(length) if length and length.isdigit() else None
        got = start
        with open(partial, "ab" if resumed else "wb") as out, _progress(url, total, start) as advance:
            try:
                while block := response.read(CHUNK):
                    out.write(block)
                    got += len(block)
                    advance(len(block))
            except (OSError, http.client.HTTPException) as e:
                raise ElmoError(f"{url}: download cut at {got} of {_size(total)} bytes ({e}); run again to "
                                f"resume") from None
    if total is not None and got != total:
        raise ElmoError(f"{url}: download cut at {got} of {total} bytes (the server closed the connection); run "
                        f"again to resume")


def _size(total: int | None) -> str:
    return "?" if total is None else str(total)


@contextlib.contextmanager
def _progress(url: str, total: int | None, start: int) -> Iterator[Callable[[int], None]]:
    if settings.progress is None:
        yield lambda n: None
        return
    with settings.progress(url, total, start) as advance:
        yield advance


def _verify(url: str, partial: Path, known: KnownFile) -> None:
    """The size and sha256 of a known file; a mismatch removes the download (it cannot be resumed)."""
    size = partial.stat().st_size
    if known.size is not None and size != known.size:
        partial.unlink()
        raise ElmoError(f"{url}: size mismatch: expected {known.size} bytes, got {size}; the download was removed")
    if known.sha256:
        digest = hashlib.sha256()
        with open(partial, "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
        if digest.hexdigest() != known.sha256.lower():
            partial.unlink()
            raise ElmoError(f"{url}: sha256 mismatch: expected {known.sha256}, got {digest.hexdigest()}; the "
                            f"download was removed")

"""The corpora of the quality benchmark, each cut once into a training and a held-out text with a fixed rule.

| name | text | held out | vocabulary |
|---|---|---|---|
| `austen-0.2M` | examples/austen_train.txt (the first novels' opening, 205k tokens) | examples/austen_heldout.txt (the start of *Emma*) | words seen twice |
| `austen` | the six novels (examples/austen_novels_tok.txt.gz, 780k training tokens) | every 10th chapter | words seen twice |
| `kjv` | the King James Bible from Debian's bible-kjv-text (public domain), verses split into words and punctuation (826k) | every 10th chapter | words seen twice |
| `austen+kjv` | both training texts (1.6M tokens, two registers) | both held-out texts | words seen twice |
| `zh` | 300 Tang and 100 Song poems (examples/zh_poems.txt) | every 10th line | SentencePiece, 3,000 pieces; code-point characters |

`prepare(name, out)` writes ``out/train.txt``, ``out/heldout.txt``, the vocabulary and both shard directories
(once; reused while ``out/split.json`` is there) and returns the split's counts. The KJV text is read with the
`bible` program of Debian's bible-kjv package (``apt-get install bible-kjv``): ``bible -f gen1:1-rev22:21``.
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUSTEN_NOVELS_GZ = ROOT / "examples" / "austen_novels_tok.txt.gz"  # the six novels, shipped (examples/README.md)
HOLD_OUT_EVERY = 10
CHAPTER = re.compile(r"^(CHAPTER|Chapter) [0-9IVXLC]+$")
CAPITALS = re.compile(r"^[A-Z][A-Z ]*$")  # a title, THE END, FINIS, VOLUME I: ends the chapter it follows
KJV_REFERENCE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
WORDS = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|\d+|[^\w\s]")
CORPORA = ("austen-0.2M", "austen", "kjv", "austen+kjv", "zh")


def austen_novels() -> Path:
    """The six Austen novels as plain text (one tokenized sentence per line): examples/austen_novels_tok.txt.gz,
    unpacked once into bench-out/corpora/."""
    path = ROOT / "bench-out" / "corpora" / "austen_novels_tok.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(gzip.decompress(AUSTEN_NOVELS_GZ.read_bytes()))
        tmp.replace(path)
    return path


def _austen(train: list[str], heldout: list[str]) -> None:
    chapter, in_chapter = 0, False
    for line in austen_novels().read_text(encoding="utf-8").splitlines():
        if CHAPTER.match(line):
            chapter, in_chapter = chapter + 1, True
        elif CAPITALS.match(line):
            in_chapter = False
        (heldout if in_chapter and chapter % HOLD_OUT_EVERY == 0 else train).append(line)


class MissingCorpus(Exception):
    """A corpus whose text is not on this machine; the message says the command that fetches it."""


KJV_FETCH = "apt-get install bible-kjv"


def _kjv(train: list[str], heldout: list[str]) -> None:
    if shutil.which("bible") is None:
        raise MissingCorpus(f"the KJV is not on this machine (Debian's bible-kjv package; fetch it with "
                            f"`{KJV_FETCH}`)")
    text = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    split_verses(text, train, heldout)


def split_verses(text: str, train: list[str], heldout: list[str]) -> None:
    """``Ge1:1 In the beginning ...`` lines: each verse's words and punctuation; every 10th chapter held out."""
    chapter, last = 0, None
    for line in text.splitlines():
        m = KJV_REFERENCE.match(line)
        if m is None:
            continue
        if (m.group(1), m.group(2)) != last:
            chapter, last = chapter + 1, (m.group(1), m.group(2))
        (heldout if chapter % HOLD_OUT_EVERY == 0 else train).append(" ".join(WORDS.findall(m.group(4))))


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]


def split(name: str) -> tuple[list[str], list[str]]:
    train: list[str] = []
    heldout: list[str] = []
    if name == "austen-0.2M":
        train, heldout = _lines(ROOT / "examples" / "austen_train.txt"), _lines(ROOT / "examples" / "austen_heldout.txt")
    elif name == "austen":
        _austen(train, heldout)
    elif name == "kjv":
        _kjv(train, heldout)
    elif name == "austen+kjv":
        _austen(train, heldout)
        _kjv(train, heldout)
    elif name == "zh":
        lines = _lines(ROOT / "examples" / "zh_poems.txt")
        for i, line in enumerate(lines, 1):
            (heldout if i % HOLD_OUT_EVERY == 0 else train).append(line)
    else:
        sys.exit(f"bench_quality: unknown corpus {name!r}; one of {', '.join(CORPORA)}")
    return train, heldout


def elmo_cli(*args: str) -> None:
    cmd = [sys.executable, "-c", "from elmo_cli.cli import app; app()", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def prepare(name: str, out: Path) -> dict:
    """Split, vocabulary, shards of corpus `name` under `out` (kept for reruns); returns the split's counts."""
    if (out / "split.json").is_file():
        return json.loads((out / "split.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = split(name)
    for part, lines in (("train", train), ("heldout", heldout)):
        (out / f"{part}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = str(out / "vocab.txt")
    if name == "zh":
        elmo_cli("build-vocab", str(out / "train.txt"), "--output", vocab, "--sentencepiece", "--vocab-size", "3000")
        elmo_cli("shard", str(out / "train.txt"), "--vocab", vocab, "--output", str(out / "train"), "--chars",
                 "codepoint", "--force")
        elmo_cli("shard", str(out / "heldout.txt"), "--vocab", vocab, "--output", str(out / "heldout"), "--chars",
                 str(out / "train"), "--force")
    else:
        elmo_cli("build-vocab", str(out / "train.txt"), "--output", vocab, "--min-count", "2")
        for part in ("train", "heldout"):
            elmo_cli("shard", str(out / f"{part}.txt"), "--vocab", vocab, "--output", str(out / part), "--force")
    manifests = {part: json.loads((out / part / "manifest.json").read_text()) for part in ("train", "heldout")}
    info = {"corpus": name, "train_lines": len(train), "heldout_lines": len(heldout),
            "train_tokens": manifests["train"]["total_tokens"], "heldout_tokens": manifests["heldout"]["total_tokens"],
            "vocab_size": manifests["train"]["vocab_size"]}
    (out / "split.json").write_text(json.dumps(info, indent=1) + "\n")
    return info

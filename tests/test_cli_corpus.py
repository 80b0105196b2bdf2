import gzip
import json

import pytest
from typer.testing import CliRunner

from elmo_cli.cli import app
from vocab.shards import ShardDataset

runner = CliRunner()


def invoke(*args, input=None):
    result = runner.invoke(app, [str(a) for a in args], input=input)
    text = result.output + (getattr(result, "stderr", "") if result.stderr_bytes is not None else "")
    return result.exit_code, " ".join(text.split())


CORPUS = "the cat sat on the mat .\n\nthe dog sat .\na cat and a dog .\n"


def test_build_vocab_then_shard(tmp_path):
    (tmp_path / "a.txt").write_text(CORPUS)
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("the end .\n")
    code, out = invoke("build-vocab", tmp_path / "*.txt", tmp_path / "b.txt.gz", "--output", tmp_path / "vocab.txt",
                       "--projection-dim", "128")
    assert code == 0, out
    assert "OOV rate" in out and "kept types" in out and "softmax size at projection dim 128" in out
    tokens = (tmp_path / "vocab.txt").read_text().split()
    assert tokens[:5] == ["<S>", "</S>", "<UNK>", ".", "the"]  # 4 each: tie by bytes
    code, out = invoke("shard", tmp_path / "a.txt", tmp_path / "b.txt.gz", "--vocab", tmp_path / "vocab.txt",
                       "--output", tmp_path / "shards", "--seed", "1")
    assert code == 0, out
    assert "4 sentences" in out and "20 tokens" in out and "1 blank lines skipped" in out and "bytes/token" in out
    ds = ShardDataset(tmp_path / "shards")
    assert ds.total_tokens == 20 and ds.manifest["blank_lines"] == 1


def test_stdin_and_crlf_bom(tmp_path):
    code, out = invoke("build-vocab", "-", "--output", tmp_path / "vocab.txt", input="\ufeffb a\r\nb\r\n")
    assert code == 0, out
    assert (tmp_path / "vocab.txt").read_text().split() == ["<S>", "</S>", "<UNK>", "b", "a"]
    code, out = invoke("shard", "-", "--vocab", tmp_path / "vocab.txt", "--output", tmp_path / "s",
                       input="\ufeffb a\r\nb\r\n")
    assert code == 0, out
    ds = ShardDataset(tmp_path / "s")
    assert (ds.num_sentences, ds.total_tokens) == (2, 3)
    assert ds.manifest["sources"] == ["stdin.txt"]


def test_sentencepiece_and_codepoint(tmp_path):
    raw = tmp_path / "poems.txt"
    raw.write_text("\n".join(["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。"] * 30) + "\n", encoding="utf-8")
    code, out = invoke("build-vocab", raw, "--output", tmp_path / "vocab.txt", "--sentencepiece",
                       "--vocab-size", "25", "--model-type", "bpe")
    assert code == 0, out
    assert (tmp_path / "vocab.spm.model").exists() and "SentencePiece model" in out
    code, out = invoke("shard", raw, "--vocab", tmp_path / "vocab.txt", "--output", tmp_path / "s",
                       "--chars", "codepoint", "--max-chars-vocab", "10")
    assert code == 0, out
    ds = ShardDataset(tmp_path / "s")
    assert ds.manifest["chars"] == "codepoint" and ds.manifest["tokenizer"] == "sentencepiece"
    assert (tmp_path / "s" / "spm.model").exists() and len(ds.chars.characters) == 10
    code, out = invoke("build-vocab", raw, "--output", tmp_path / "v2.txt", "--sentencepiece")
    assert code == 1 and "--vocab-size" in out


def write(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("bad.txt", b"ok\nalso ok\nx\xc3(\n", "bad.txt:3: invalid UTF-8 at byte offset 1"),
        ("nul.txt", b"ok\n\x00\n", "nul.txt:2: NUL byte at byte offset 0"),
        ("empty.txt", b"\n\n", "empty.txt: corpus is empty (2 blank lines"),
    ],
)
def test_bad_corpus(tmp_path, name, data, message):
    corpus = write(tmp_path / name, data)
    write(tmp_path / "vocab.txt", b"<S>\n</S>\n<UNK>\nok\n")
    code, out = invoke("build-vocab", corpus, "--output", tmp_path / "new_vocab.txt")
    assert code == 1 and message in out and out.startswith("error:")
    assert not (tmp_path / "new_vocab.txt").exists()
    code, out = invoke("shard", corpus, "--vocab", tmp_path / "vocab.txt", "--output", tmp_path / "s")
    assert code == 1 and message in out
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_invalid_utf8_replace(tmp_path):
    corpus = write(tmp_path / "bad.txt", b"caf\xe9 ok\n")
    code, out = invoke("build-vocab", corpus, "--output", tmp_path / "v.txt", "--errors", "replace")
    assert code == 0, out
    assert "caf\ufffd" in (tmp_path / "v.txt").read_text()


def test_missing_file(tmp_path):
    code, out = invoke("build-vocab", tmp_path / "missing.txt", "--output", tmp_path / "v.txt")
    assert code == 1 and "missing.txt: no such file" in out


@pytest.mark.parametrize(
    "vocab, message",
    [
        (b"<S>\n</S>\nthe\n", "vocab.txt:1: missing special token(s) <UNK>"),
        (b"<S>\n</S>\n<UNK>\nthe\nthe\n", "vocab.txt:5: duplicate token 'the' (first on line 4)"),
    ],
)
def test_bad_vocabulary(tmp_path, vocab, message):
    corpus = write(tmp_path / "c.txt", b"the cat\n")
    write(tmp_path / "vocab.txt", vocab)
    code, out = invoke("shard", corpus, "--vocab", tmp_path / "vocab.txt", "--output", tmp_path / "s")
    assert code == 1 and message in out
    assert not (tmp_path / "s").exists()


def test_non_empty_output_needs_force(tmp_path):
    corpus = write(tmp_path / "c.txt", b"the cat\n")
    write(tmp_path / "vocab.txt", b"<S>\n</S>\n<UNK>\nthe\n")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "old.txt").write_text("x")
    code, out = invoke("shard", corpus, "--vocab", tmp_path / "vocab.txt", "--output", tmp_path / "s")
    assert code == 1 and "output directory is not empty; pass --force" in out
    code, out = invoke("shard", corpus, "--vocab", tmp_path / "vocab.txt", "--output", tmp_path / "s", "--force")
    assert code == 0, out
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["oov_tokens"] == 1

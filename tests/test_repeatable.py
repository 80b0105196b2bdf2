"""Same input, same bytes: the commands that compute vectors or scores, run again in fresh processes.

Each run gets its own ``PYTHONHASHSEED`` and an environment variable of its own length (which moves where the
allocator puts things), as a user's runs would. oneMKL must run every product in strict CNR mode with a fixed
thread count (`elmo_cli.machine`): that is checked from its own ``MKL_VERBOSE`` log, so the test can fail on a CPU
whose default path happens to repeat anyway (this one's), not only on one where it does not.
"""
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import pytest
import torch

from elmo_cli.machine import FAST_SWITCH, REPRODUCIBLE_BLAS
from elmo_cli.tasks.train import TrainSettings, train_task
from test_evaluate import LINES, make_model_dir
from test_tasks_model import bilm_dir, data, toy_sentences  # noqa: F401  (module fixtures)

REFERENCE = Path(__file__).parent / "data" / "reference"
SENTENCES = REFERENCE / "sentences.txt"


def fresh_env(seed: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in REPRODUCIBLE_BLAS and k != FAST_SWITCH}
    env.update(PYTHONHASHSEED=str(seed), ELMO_TEST_PADDING="x" * random.Random(seed).randrange(1, 6000), **extra)
    return env


def run_cli(args: list, seed: int, **extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from elmo_cli.cli import app; app()", *map(str, args)]
    proc = subprocess.run(cmd, env=fresh_env(seed, **extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def dataset_digests(path: Path) -> dict[str, str]:
    """sha256 of each dataset's name, shape, dtype and bytes (the file's own bytes hold times)."""
    out = {}
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in sorted(names):
            a = f[name][...]
            h = hashlib.sha256(f"{name}{a.shape}{a.dtype}".encode())
            h.update(repr(a.tolist()).encode() if a.dtype == object else a.tobytes())  # strings: values, not pointers
            out[name] = h.hexdigest()
    return out


def digest_hdf5(path: Path) -> str:
    """One sha256 over `dataset_digests`, in name order."""
    return hashlib.sha256("".join(dataset_digests(path).values()).encode()).hexdigest()


@pytest.fixture(scope="module")
def tanh_model(tmp_path_factory) -> Path:
    """The allennlp reference model with a tanh character CNN (the activation of the report this test answers)."""
    d = tmp_path_factory.mktemp("tanh")
    options = json.loads((REFERENCE / "options.json").read_text())
    options["char_cnn"]["activation"] = "tanh"
    (d / "options.json").write_text(json.dumps(options))
    shutil.copy(REFERENCE / "weights.hdf5", d / "weights.hdf5")
    return d


def runs_in_parallel(job, n: int) -> list:
    """`job(seed)` for n seeds, two processes at a time (each with torch's default threads: a loaded machine)."""
    seeds = random.Random(42).sample(range(1, 2**31), n)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(job, seeds))


def test_dump_embeddings_is_bit_identical_in_20_fresh_processes(tanh_model, tmp_path):
    def dump(seed: int) -> str:
        out = tmp_path / f"{seed}.hdf5"
        run_cli(["dump-embeddings", SENTENCES, out, "--model", tanh_model / "options.json", "--layers", "all",
                 "--batch-size", "1"], seed)
        return seed, dataset_digests(out)

    runs = runs_in_parallel(dump, 20)
    digests = [json.dumps(d, sort_keys=True) for _, d in runs]
    differing = sorted({name for _, d in runs for name in d if d[name] != runs[0][1][name]})
    seeds = [seed for seed, d in runs if d != runs[0][1]]
    assert len(set(digests)) == 1, f"{len(set(digests))} different outputs in 20 runs: datasets {differing[:10]} " \
                                   f"differ from the first run's in the runs of PYTHONHASHSEED {seeds}"


def test_relu_dump_token_embeddings_and_batched_dump_repeat(reference_dir, tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("\n".join(sorted(set(SENTENCES.read_text("utf-8").split()))) + "\n", encoding="utf-8")

    def both(seed: int) -> tuple[str, str]:
        dump, cache = tmp_path / f"d{seed}.hdf5", tmp_path / f"c{seed}.hdf5"
        run_cli(["dump-embeddings", SENTENCES, dump, "--model", reference_dir / "options.json", "--layers", "all",
                 "--batch-size", "8"], seed)
        run_cli(["dump-token-embeddings", "--vocab", words, "-o", cache, "--model", reference_dir / "options.json"],
                seed)
        return digest_hdf5(dump), digest_hdf5(cache)

    results = runs_in_parallel(both, 4)
    assert len(set(results)) == 1


def test_evaluate_prints_the_same_scores_in_fresh_processes(tmp_path):
    model = make_model_dir(tmp_path / "model")
    text = tmp_path / "test.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    def evaluate(seed: int) -> tuple[str, dict]:
        lines = tmp_path / f"{seed}.jsonl"
        out = run_cli(["evaluate", "--model", model, text, "--json", "--per-sentence", lines, "--batch-size", "2"],
                      seed).stdout
        totals = {k: v for k, v in json.loads(out).items() if "second" not in k}  # all but the timing
        return lines.read_text(), totals

    results = runs_in_parallel(evaluate, 4)
    assert all(r == results[0] for r in results), results


def test_task_predict_writes_the_same_bytes_in_fresh_processes(bilm_dir, data, tmp_path):  # noqa: F811
    train_task(TrainSettings(kind="tagging", train_path=data["train"], dev_path=data["dev"],
                             output=tmp_path / "task", model_dir=bilm_dir, elmo="input", epochs=2, batch_size=8,
                             lr=0.02, word_dim=8, hidden_dim=8))
    text = tmp_path / "in.txt"
    text.write_text("\n".join(" ".join(s[0]) for s in toy_sentences(30, 7)) + "\n")

    def predict(seed: int) -> bytes:
        out = tmp_path / f"{seed}.conll"
        run_cli(["task", "predict", "--task", tmp_path / "task", text, out], seed)
        return out.read_bytes()

    assert len(set(runs_in_parallel(predict, 4))) == 1


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without oneMKL: no CNR mode to check")
@pytest.mark.parametrize("command", ["dump-embeddings", "dump-token-embeddings", "evaluate"])
def test_every_onemkl_call_runs_in_strict_cnr_mode_with_fixed_threads(command, tmp_path):
    model = make_model_dir(tmp_path / "model")
    text = tmp_path / "test.txt"
    text.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    args = {"dump-embeddings": ["dump-embeddings", text, tmp_path / "o.hdf5", "--model", model],
            "dump-token-embeddings": ["dump-token-embeddings", "--vocab", model / "vocab.txt", "-o", tmp_path / "o.hdf5",
                                      "--model", model],
            "evaluate": ["evaluate", "--model", model, text]}[command]
    log = run_cli(args, 1, MKL_VERBOSE="1")
    calls = [line for line in (log.stdout + log.stderr).splitlines() if re.match(r"MKL_VERBOSE [A-Z_]+\(", line)]
    assert calls, "oneMKL logged no call"
    wrong = [c for c in calls if "CNR:AUTO,STRICT" not in c or "Dyn:0" not in c]
    assert not wrong, f"{len(wrong)} of {len(calls)} oneMKL calls outside strict CNR: {wrong[0]}"


def test_the_user_keeps_the_last_word():
    from elmo_cli.machine import use_reproducible_blas

    assert use_reproducible_blas({}) == REPRODUCIBLE_BLAS
    assert use_reproducible_blas({"MKL_CBWR": "AVX2"}) == {"MKL_DYNAMIC": "FALSE"}
    assert use_reproducible_blas({FAST_SWITCH: "fast"}) == {}

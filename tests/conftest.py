from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"
REFERENCE = DATA / "reference"


@pytest.fixture
def reference_dir() -> Path:
    """The allennlp reference model and embeddings (copied from shared/spec/reference)."""
    return REFERENCE


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one thread avoids OpenMP stalls when the other core is busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on a CUDA GPU (tests/test_cuda.py; skipped where torch sees none)")


@pytest.fixture(scope="session", autouse=True)
def cpu_by_default():
    """The suite's bounds (allennlp's reference within 5e-6, a token cache and a resume equal to 1e-6) were measured
    on the CPU: on a machine with a GPU the suite sees none, so `--device auto` is the CPU there as here. The GPU
    paths have their own tests and bounds in tests/test_cuda.py, which puts torch's test back."""
    patch = pytest.MonkeyPatch()
    patch.setattr(torch.cuda, "is_available", lambda: False)
    yield
    patch.undo()

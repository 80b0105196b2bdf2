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

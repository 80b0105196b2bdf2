from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
REFERENCE = DATA / "reference"


@pytest.fixture
def reference_dir() -> Path:
    """The allennlp reference model and embeddings (copied from shared/spec/reference)."""
    return REFERENCE

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


@pytest.fixture(scope="session")
def tokenizer():
    """A small byte-level BPE with the project's chat template (trained in about a second)."""
    from opencomposer.model.tokenizer import train_tokenizer

    sources = sorted(Path(__file__).parents[2].joinpath("src", "opencomposer", "agent").rglob("*.py"))
    return train_tokenizer([p.read_text() for p in sources], vocab_size=700)

"""Shared fixtures: the project's tiny model is built once per test session (a few seconds)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 model with the project's own tokenizer, as a normal HF folder."""
    from tools.make_tiny_model import make_tiny_model

    out = tmp_path_factory.mktemp("tiny-model") / "model"
    make_tiny_model(out, preset="tiny", seed=0)
    return out

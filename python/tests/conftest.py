"""Fixtures of the khub binding's tests: the source tree, a tiny model."""
import os
import subprocess
import sys

import pytest

SRC = os.environ.get("KHUB_SRC") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def src():
    return SRC


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Llama folder with a byte-level BPE tokenizer
    (tools/make-tiny-model.py)."""
    d = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([sys.executable, os.path.join(SRC, "tools", "make-tiny-model.py"), str(d)],
                   check=True)
    return str(d)


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct Hugging Face folder, when the model
    cache has it (tools/fetch-model.sh --hf); else the test is skipped."""
    base = os.environ.get("KHUB_MODEL_DIR") or os.path.expanduser("~/.cache/khub/models")
    d = os.path.join(base, "SmolLM2-135M-Instruct-hf")
    if not os.path.isfile(os.path.join(d, "config.json")):
        pytest.skip("%s not found (tools/fetch-model.sh --hf)" % d)
    return d

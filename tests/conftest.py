import os

# Triton kernels run on CPU tensors through the interpreter; this must be set
# before any kernel is defined (KVBENCH_TEST_DEVICE=cuda: compiled kernels, see test_kernels.py).
os.environ.setdefault("TRITON_INTERPRET", "1" if os.environ.get("KVBENCH_TEST_DEVICE", "cpu") == "cpu" else "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2 in fp32 on CPU (converted once per machine, then cached)."""
    from kvbench.engine.weights import load_model

    return load_model(None, device="cpu", dtype=torch.float32)


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure), so random checks vary across runs.

    KVBENCH_TEST_SEED=<n> replays a failure with the seed it printed."""
    fixed = os.environ.get("KVBENCH_TEST_SEED")
    s = int(fixed) if fixed else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    return s

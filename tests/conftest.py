import os

# Triton kernels run on CPU tensors through the interpreter; this must be set
# before any kernel is defined (KVBENCH_TEST_DEVICE=cuda: compiled kernels, see test_kernels.py).
os.environ.setdefault("TRITON_INTERPRET", "1" if os.environ.get("KVBENCH_TEST_DEVICE", "cpu") == "cpu" else "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A fresh seed per session for seeds drawn at collection (test ids, as in test_gemv.py); set here,
# in the pytest-xdist controller, so that every worker inherits it and collects the same ids.
os.environ.setdefault("KVBENCH_TEST_RUN_SEED", str(int.from_bytes(os.urandom(4), "little")))
# Under pytest-xdist (`make test` runs 2 workers) the workers share the cores: each worker's torch
# and OpenBLAS (numpy, in the Triton interpreter) pools sized to the whole machine would spin against
# the other's. Set before torch or numpy is imported; subprocesses the tests start inherit it.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _XDIST_WORKERS:
    _cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, _cpus // _XDIST_WORKERS)))

import pytest  # noqa: E402 (after the environment above)
import torch  # noqa: E402

if _XDIST_WORKERS:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2 in fp32 on CPU (converted once per machine, then cached)."""
    from kvbench.engine.weights import load_model

    # pytest-xdist workers share the cache: the first converts the GGUF, the others wait for it
    # (`gguf_to_hf_folder` holds a file lock while it converts)
    return load_model(None, device="cpu", dtype=torch.float32)


@pytest.fixture
def on_test_device():
    """Every tensor a test makes lands on the test device (KVBENCH_TEST_DEVICE, default cpu); the
    default device goes back after the test, so it never leaks into the files collected beside it.
    Modules of kernel tests take it with `pytestmark = pytest.mark.usefixtures("on_test_device")`."""
    torch.set_default_device(os.environ.get("KVBENCH_TEST_DEVICE", "cpu"))
    yield
    torch.set_default_device(None)


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure), so random checks vary across runs.

    KVBENCH_TEST_SEED=<n> replays a failure with the seed it printed."""
    fixed = os.environ.get("KVBENCH_TEST_SEED")
    s = int(fixed) if fixed else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    return s


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After a failure, the session's collection seed (test_gemv.py's seeds, part of its test ids):
    exported, it collects the same ids again."""
    if exitstatus:
        terminalreporter.write_line(f"KVBENCH_TEST_RUN_SEED={os.environ['KVBENCH_TEST_RUN_SEED']}")

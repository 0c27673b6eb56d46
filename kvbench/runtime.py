"""What the jobs share: device/dtype choice, memory readings, bandwidth,
progress display and per-cell isolation (an OOM or a bug becomes a row)."""

from __future__ import annotations

import contextlib
import gc
import re
import time
from pathlib import Path

import torch

from kvbench.errors import KvbenchError

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise KvbenchError(f"--device: '{name}' is not a device (cpu, cuda, cuda:1, auto)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise KvbenchError("--device cuda asked for, but no CUDA GPU is visible")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise KvbenchError(f"--device {name}: only {torch.cuda.device_count()} CUDA GPU(s) are visible")
        # Triton launches, CUDA graphs and the memory counters all follow the current
        # device, so a worker on cuda:1 must make it current, not only allocate there.
        # Plain "cuda" means the current device (set_device refuses a device without an index).
        if dev.index is not None:
            torch.cuda.set_device(dev)
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    # bf16 on both: it is what GPUs serve in, and on CPU it prefills ~1.5x faster than fp32.
    return torch.bfloat16 if name == "auto" else _DTYPES[name]


def pick_kernel(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if device.type == "cuda" else "reference"
    if name == "triton" and device.type != "cuda":
        raise KvbenchError("--kernel triton needs a CUDA GPU (on CPU the reference path runs)")
    return name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------------ memory
def _proc_status_kb(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def reset_peak(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with contextlib.suppress(OSError):  # "5" resets the process' peak RSS (VmHWM) on Linux
            Path("/proc/self/clear_refs").write_text("5")


def peak_bytes(device: torch.device) -> tuple[float, str]:
    """(bytes, what was measured)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    kb = _proc_status_kb("VmHWM")
    return (float(kb) * 1024 if kb else float("nan")), "cpu_peak_rss"


def available_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # blocks the caching allocator holds but no tensor uses are available as well
        return float(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        return float(m.group(1)) * 1024
    except (OSError, AttributeError):
        return float("inf")


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, nbytes: int | None = None) -> float:
    """Copy bandwidth (bytes read + written per second) of a large device copy."""
    if nbytes is None:
        nbytes = 2 << 30 if device.type == "cuda" else 256 << 20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    synchronize(device)
    reps = 10 if device.type == "cuda" else 3
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    release(device)
    return 2 * nbytes / best


# ----------------------------------------------------------------- cell isolation
def is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    # CUDA's allocator says "out of memory"; the CPU's (DefaultCPUAllocator) "can't allocate memory"
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300]


# ---------------------------------------------------------------------- progress
class Progress:
    """Rich progress bars (cells with ETA, plus the current cell's steps); silent when quiet."""

    def __init__(self, total_cells: int, quiet: bool = False, console=None) -> None:
        self.quiet = quiet
        self._p = None
        if not quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._p = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console or Console(stderr=True),
                transient=False,
            )
            self._cells = self._p.add_task("cells", total=total_cells)
            self._step = self._p.add_task("", total=1, visible=False)

    def __enter__(self):
        if self._p:
            self._p.__enter__()
        return self

    def __exit__(self, *exc):
        if self._p:  # the last cell's step bar would stay on screen (and in logs) short of its end
            self._p.update(self._step, visible=False)
            self._p.__exit__(*exc)

    def set_total(self, total: int) -> None:
        if self._p:
            self._p.update(self._cells, total=total)

    def cell_done(self) -> None:
        if self._p:
            self._p.advance(self._cells)

    def step(self, description: str, total: int) -> None:
        if self._p:
            self._p.reset(self._step, total=max(1, total), description=description, visible=True)

    def advance_to(self, completed: int) -> None:
        if self._p:
            self._p.update(self._step, completed=completed)

    def log(self, message: str) -> None:
        if self._p:
            self._p.console.print(message)

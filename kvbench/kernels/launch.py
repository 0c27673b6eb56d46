"""Programmatic dependent launch (PDL) for the decode step's Triton kernels.

On Hopper and later GPUs a kernel launched with PDL may start while the kernel
before it in the stream is still running: its programs get scheduled as soon as
every program of the previous kernel has said so (`griddepcontrol.launch_dependents`),
and each waits (`griddepcontrol.wait`) until that kernel has finished and its
writes are visible. The launch latency and a kernel's start-up then overlap the
previous kernel's tail instead of following it. In a CUDA graph the dependency
is captured as a programmatic edge.

The kernels here wait first thing, before they touch memory, and release their
dependents right after. The exception is the decode reduction: it releases the
output GEMV first thing (whose weights do not depend on it; the GEMV still waits
for its output), and stores the fresh token into slot L before it waits (the
split kernel it follows reads only slots [0, L), and the tensors it stores from
were written two launches back; see `decode_attention`).

PDL is off unless asked for (`programmatic_launch()`, which the GPU decode step
uses), and never used in the Triton interpreter or before sm_90. `KVBENCH_PDL=0`
turns it off everywhere (for comparisons).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os

import torch
import triton
import triton.language as tl

_ASKED = contextvars.ContextVar("kvbench_pdl", default=False)
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextlib.contextmanager
def programmatic_launch(enabled: bool = True):
    """Launch the decode kernels inside this block with PDL (where the GPU has it)."""
    token = _ASKED.set(enabled)
    try:
        yield
    finally:
        _ASKED.reset(token)


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched with PDL (CUDA, sm_90 or later, compiled)."""
    if device.type != "cuda" or _INTERPRETED or os.environ.get("KVBENCH_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_active(t: torch.Tensor) -> bool:
    """Whether a launch on `t`'s device, here and now, uses PDL."""
    return _ASKED.get() and pdl_supported(t.device)


def pdl_kwargs(t: torch.Tensor) -> dict:
    """The launch arguments of a kernel with a `PDL` constexpr: the flag and Triton's `launch_pdl`."""
    on = pdl_active(t)
    return {"PDL": on, "launch_pdl": on}


@triton.jit
def wait_prior():
    """Wait until the previous kernel in the stream has finished and its writes are visible."""
    tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def release_dependents():
    """Let the next kernel in the stream (if launched with PDL) start its programs."""
    tl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def pdl_enter(PDL: tl.constexpr, RELEASE: tl.constexpr = True):
    """A PDL kernel's first step: wait for the previous kernel, then (RELEASE) let the next one start.

    Without RELEASE the next kernel starts when this one's programs have all exited: the
    kernels before the split kernel (RoPE, the query rotation) do so, because a split grid
    launched onto SMs still busy with them was spread unevenly (int8 and delegated, whose
    programs fit 3 to an SM: up to 11% slower end to end at batch 16, 32K, on the H200)."""
    if PDL:
        wait_prior()
        if RELEASE:
            release_dependents()

"""Row schemas, provenance, and durable result files.

Every finished cell is appended as one complete line (write, flush, fsync), so
an interrupted sweep never leaves a partial row; files are created at the first
row, so a run refused before any work leaves nothing behind. JSON lines are
written beside the CSV for other tools.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
import platform
import subprocess
from functools import cache
from pathlib import Path

import kvbench
from kvbench.errors import KvbenchError

PROVENANCE_COLUMNS = [
    "device",
    "driver",
    "torch_version",
    "triton_version",
    "transformers_version",
    "kvbench_version",
    "git_commit",
    "model",
    "model_hash",
]

# The fused Triton path and the PyTorch reference round differently (the reference attends over K/V
# dequantized to bf16; the kernels accumulate codes and scales in fp32), and a deep model amplifies
# that, most at long context and in the coarsest modes (the H200 audit at 32K: fp16's two paths 0.0016
# nats apart, turbo3-asym's 0.012-0.017 with logits up to 3.4 apart). A wrong head, position or scale
# moves whole distributions. So the paths agree when their next-token distributions stay within this
# KL; where the argmax flips sit (`quality.path_agreement`'s verdict) is reported beside it.
KERNEL_KL_AGREE = 0.05
# Decimals decode-bench keeps for its ratios, floor fractions, times in ms and memory in GB, so the report's
# own rounding is the only one a printed number goes through.
DIGITS = 6
# ... or, against the float32 yardstick, the Triton path is at most this many times as far from it as the
# reference path is
KERNEL_FP32_FACTOR = 2.0


def kernel_paths_agree(kl: float, kl_ref_fp32: float | None = None, kl_kernel_fp32: float | None = None) -> bool:
    """The audit's `kernel_agrees`: the Triton and reference paths' KL(reference || Triton) is at
    most KERNEL_KL_AGREE nats; or, where the audit also ran the mode in float32 (the yardstick:
    the reference path with the model and cache in float32), the Triton path is no more than
    KERNEL_FP32_FACTOR times as far from it as the reference path is (KL(fp32 || Triton) <=
    max(KERNEL_KL_AGREE, KERNEL_FP32_FACTOR * KL(fp32 || reference))).

    Both paths round in bf16, each its own way, and a coarse mode at long context amplifies that:
    raw turbo4 at 32K on the default model put the two bf16 paths 0.078 nats apart while the
    reference path alone sat 0.125 from float32 and the Triton path 0.074 (H200,
    results/2026-12-04b-h200/path-gap). A wrong kernel moves far from float32 (whole
    distributions: a shuffled vocabulary ~7 nats)."""
    if kl <= KERNEL_KL_AGREE:
        return True
    if _number(kl_ref_fp32) and _number(kl_kernel_fp32):
        return kl_kernel_fp32 <= max(KERNEL_KL_AGREE, KERNEL_FP32_FACTOR * kl_ref_fp32)
    return False


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x  # not None, not NaN


AUDIT_COLUMNS = [
    "date",
    "device",
    "model",
    "kv_cache_mode",
    "effective_mode",
    "context_tokens",
    "gen_tokens",
    "status",
    "verdict",
    "identical_to_fp16",
    "first_divergence",
    "near_tie",
    "token_match",
    "top1_agreement",
    "kl_div",
    "ppl",
    "ppl_delta",
    "degenerate",
    "degenerate_reason",
    "kv_bytes",
    "kv_bytes_per_token",
    "kernel",
    "kernel_agrees",
    "kl_ref_fp32",
    "kl_kernel_fp32",
    "output_text",
    "notes",
    "check",
    "max_kv_size",
    "keep",
    "cached_tokens",
    "niah_depth",
    "niah_hit",
    "batch",
    "dtype",
    "prefill_chunk",
    "boundary_v",
    "sparse_v",
    "synthetic",
    "elapsed_s",
    *[c for c in PROVENANCE_COLUMNS if c not in ("device", "model")],
    "cell",
]

BENCH_COLUMNS = [
    "date",
    "device",
    "model",
    "context_tokens",
    "gen_tokens",
    "kv_cache_mode",
    "prefill_ms",
    "prefill_tok_s",
    "decode_ms",
    "decode_tok_s",
    "peak_mem_gb",
    "prefill_chunk",
    "notes",
    "batch",
    "effective_mode",
    "decode_ratio_vs_fp16",
    "kv_bytes",
    "kv_bytes_per_token",
    "roofline_frac",
    "repeats",
    "decode_tok_s_min",
    "decode_tok_s_max",
    "kernel",
    "cuda_graphs",
    "status",
    "peak_mem_kind",
    "peak_delta_gb",
    "weight_bytes",
    "bandwidth_gbs",
    "floor_ms",
    "step_ms",
    "prefill_source",
    "max_kv_size",
    "keep",
    "warmup",
    "dtype",
    "boundary_v",
    "sparse_v",
    "synthetic",
    *[c for c in PROVENANCE_COLUMNS if c not in ("device", "model")],
    "cell",
]

STATUSES = ("ok", "diverged", "degenerate", "fallback", "oom", "error", "skipped")


def join_notes(*parts: str) -> str:
    """A row's `notes`: the non-empty parts, "; "-separated."""
    return "; ".join(p for p in parts if p)


def plural(n, word: str) -> str:
    """ "1 repeat", "3 repeats"; n may be a text such as "1/3" (plural unless it is "1")."""
    return f"{n} {word}" + ("" if str(n) == "1" else "s")


def command_line() -> str:
    """This process's kvbench command, quoted so that it can be pasted back into a shell as it ran."""
    import shlex
    import sys

    return shlex.join(["kvbench", *sys.argv[1:]])


def today() -> str:
    return _dt.date.today().isoformat()


def now() -> str:
    return _dt.datetime.now().isoformat(timespec="seconds")


@cache
def git_commit() -> str:
    """The checkout's commit (+"-dirty"); KVBENCH_GIT_COMMIT names it where the tree
    travels without its .git (e.g. a copy on a remote GPU machine)."""
    if os.environ.get("KVBENCH_GIT_COMMIT"):
        return os.environ["KVBENCH_GIT_COMMIT"]
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        commit = out.stdout.strip()
        if not commit:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu} ({os.cpu_count()} cores)"


@cache
def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def provenance(device, model_id: str, model_hash: str) -> dict:
    import torch
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    return {
        "device": device_name(device),
        "driver": _driver() if torch.device(device).type == "cuda" else "",
        "torch_version": torch.__version__,
        "triton_version": triton_version,
        "transformers_version": transformers.__version__,
        "kvbench_version": kvbench.__version__,
        "git_commit": git_commit(),
        "model": model_id,
        "model_hash": model_hash,
    }


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:  # NaN
            return ""
        return f"{value:.10g}"  # every digit a row was rounded to (3302.453 tok/s), not float noise
    return str(value)


class ResultsWriter:
    """Appends rows durably to `<dir>/<stem>.csv` (and `.jsonl`)."""

    def __init__(self, directory: Path, stem: str, columns: list[str], formats=("csv", "json")) -> None:
        self.directory = Path(directory)
        self.stem = stem
        self.columns = columns
        self.formats = tuple(formats)

    @property
    def csv_path(self) -> Path:
        return self.directory / f"{self.stem}.csv"

    @property
    def json_path(self) -> Path:
        return self.directory / f"{self.stem}.jsonl"

    def _append(self, path: Path, text: str, header: str | None) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            new = not path.exists() or path.stat().st_size == 0
            # One write of whole lines, then fsync: a crash leaves the file at a line boundary.
            payload = (header if (new and header) else "") + text
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, payload.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:  # a full disk, a folder that went away: one line, not a traceback
            raise KvbenchError(f"cannot write {path}: {exc.strerror or exc}") from None

    def write(self, row: dict) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"unknown columns {sorted(unknown)}")
        # JSON first: a run stopped between the two writes leaves the JSONL a row ahead of the CSV (which
        # `--resume` counts done cells from), and repair_tail trims it back.
        if "json" in self.formats:
            self._append(self.json_path, json.dumps({c: row.get(c) for c in self.columns}, default=str) + "\n", None)
        if "csv" in self.formats:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow([_fmt(row.get(c)) for c in self.columns])
            head = io.StringIO()
            csv.writer(head, lineterminator="\n").writerow(self.columns)
            self.check_header()
            self._append(self.csv_path, buf.getvalue(), head.getvalue())

    def repair_tail(self) -> list[str]:
        """Cut a last line that lacks its newline off the results files, before a sweep appends.

        This writer ends every write with a whole line, so such a line is damage from outside
        (a copy cut short, a full disk): appending after it would glue the next row onto it.
        Its cell is not counted as done, so `--resume` measures it again. Returns one
        warning per file repaired."""
        notes = []
        for path in (self.csv_path, self.json_path):
            try:
                with open(path, "rb+") as f:
                    size = f.seek(0, os.SEEK_END)
                    if size:
                        f.seek(-1, os.SEEK_END)
                    if size == 0 or f.read(1) == b"\n":
                        continue  # the usual case: one byte read, not the whole file
                    f.seek(0)
                    keep = f.read().rfind(b"\n") + 1
                    f.truncate(keep)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise KvbenchError(f"cannot repair {path}: {exc.strerror or exc}") from None
            what = "its header" if keep == 0 else "the last line"
            notes.append(f"{path}: {what} was cut short ({size - keep} bytes without a newline); dropped it")
        if "json" in self.formats:
            notes += self._align_json()
        elif self.json_path.exists() and self.csv_path.exists():  # a --format without json, resuming
            notes.append(
                f"{self.json_path}: not written by this run (--format {','.join(self.formats)}): "
                f"it falls behind {self.csv_path.name}, which is the record"
            )
        return notes

    def _align_json(self) -> list[str]:
        """The JSONL holds one line per CSV row. Lines past the CSV's last row (a run stopped between the
        two writes, or a CSV line dropped above) are rows whose cells `--resume` measures again: trimmed,
        so the JSONL does not hold them twice. A JSONL behind its CSV (damage from outside) is only reported."""
        if not self.csv_path.exists():
            return []
        try:
            rows = self._csv_rows()
            if not self.json_path.exists():
                if not rows:
                    return []
                return [
                    f"{self.json_path}: will hold this run's rows only; {self.csv_path.name}'s "
                    f"{plural(rows, 'earlier row')} (written without --format json) {'is' if rows == 1 else 'are'} not in it"
                ]
            with open(self.json_path, "rb+") as f:
                lines = f.read().splitlines(keepends=True)
                if len(lines) < rows:
                    behind = plural(rows - len(lines), "row")
                    return [
                        f"{self.json_path}: {behind} behind {self.csv_path.name} (left as it is; the CSV is the record)"
                    ]
                if len(lines) == rows:
                    return []
                f.seek(0)
                f.truncate(sum(len(x) for x in lines[:rows]))
        except (UnicodeDecodeError, csv.Error):
            return []  # check_header says what is wrong with the CSV
        except OSError as exc:
            raise KvbenchError(f"cannot repair {self.json_path}: {exc.strerror or exc}") from None
        extra = len(lines) - rows
        return [
            f"{self.json_path}: {plural(extra, 'row')} past {self.csv_path.name}'s last row; dropped (measured again)"
        ]

    def _csv_rows(self) -> int:
        with open(self.csv_path, newline="", encoding="utf-8") as f:
            return max(0, sum(1 for _ in csv.reader(f)) - 1)

    def check_header(self) -> None:
        """An existing CSV must have this job's columns (checked before a sweep starts, and per row)."""
        p = self.csv_path
        if p.exists() and p.stat().st_size:
            try:
                with open(p, newline="") as f:
                    header = next(csv.reader(f), [])
            except (UnicodeDecodeError, csv.Error) as exc:
                raise KvbenchError(f"{p} is not a readable CSV ({exc}); choose another --out") from None
            if header != self.columns:
                raise KvbenchError(
                    f"{p} has different columns (another kvbench version, or not a {self.stem} file); "
                    "choose another --out"
                )


def check_out_dir(directory: Path) -> None:
    """Refuse, before any work and without creating anything, an --out folder that cannot be written."""
    p = Path(directory)
    if p.exists() and not p.is_dir():
        raise KvbenchError(f"--out {p} is a file, not a folder")
    parent = p
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise KvbenchError(f"--out {p}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise KvbenchError(f"--out {p}: cannot write in {parent} (permission denied)")


def default_out_dir(device) -> Path:
    import torch

    dev = torch.device(device)
    tag = "cpu"
    if dev.type == "cuda":
        tag = torch.cuda.get_device_name(dev).split()[-1].lower()
    return Path("results") / f"{today()}-{tag}"


_MD_COLUMNS = {
    "audit": ["context_tokens", "check", "kv_cache_mode", "effective_mode", "status", "verdict",
              "first_divergence", "top1_agreement", "kl_div", "ppl_delta", "kv_bytes_per_token"],
    "decode-bench": ["context_tokens", "batch", "kv_cache_mode", "status", "decode_tok_s",
                     "decode_ratio_vs_fp16", "peak_mem_gb", "kv_bytes_per_token", "roofline_frac"],
}  # fmt: skip


def write_markdown(rows: list[dict], path: Path, job: str) -> None:
    """A compact markdown table of a job's rows (`--format md`); the full report is `kvbench report`."""
    cols = _MD_COLUMNS[job]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)).replace("|", "\\|") for c in cols) + " |")
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)

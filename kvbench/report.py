"""CSVs -> report.md + PNG plots.

The report reads only the CSV files of one or more result folders (`audit.csv`,
`bench.csv`, `runs.csv`; any other `*.csv` is linked), so it can be re-rendered
anywhere from copied results. Several folders (e.g. the outputs of several
cluster jobs) are merged by concatenating their rows. Rows are grouped by
(device, model): ratios and quality only make sense within one such setup.

Everything written is a function of the CSVs except the one "rendered on" line.
"""

from __future__ import annotations

import csv
import datetime as _dt
import functools
import io
import math
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import KvbenchError
from kvbench.results import (
    AUDIT_COLUMNS,
    BENCH_COLUMNS,
    KERNEL_FP32_FACTOR,
    KERNEL_KL_AGREE,
    STATUSES,
    kernel_paths_agree,
    plural,
)

MODE_ORDER = ("fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4", "turbo4-delegated")

RUNS_COLUMNS = ["date", "job", "command", "device", "model", "kvbench_version", "git_commit", "wall_s"]

AUDIT_NUMERIC = [
    "context_tokens",
    "gen_tokens",
    "first_divergence",
    "token_match",
    "top1_agreement",
    "kl_div",
    "kl_ref_fp32",
    "kl_kernel_fp32",
    "ppl",
    "ppl_delta",
    "kv_bytes",
    "kv_bytes_per_token",
    "max_kv_size",
    "keep",
    "cached_tokens",
    "niah_depth",
    "batch",
    "prefill_chunk",
    "boundary_v",
    "sparse_v",
    "elapsed_s",
]
AUDIT_BOOL = ["identical_to_fp16", "near_tie", "degenerate", "kernel_agrees", "synthetic"]

BENCH_NUMERIC = [
    "context_tokens",
    "gen_tokens",
    "prefill_ms",
    "prefill_tok_s",
    "decode_ms",
    "decode_tok_s",
    "peak_mem_gb",
    "prefill_chunk",
    "batch",
    "decode_ratio_vs_fp16",
    "kv_bytes",
    "kv_bytes_per_token",
    "roofline_frac",
    "repeats",
    "decode_tok_s_min",
    "decode_tok_s_max",
    "peak_delta_gb",
    "weight_bytes",
    "bandwidth_gbs",
    "floor_ms",
    "step_ms",
    "max_kv_size",
    "keep",
    "warmup",
    "boundary_v",
    "sparse_v",
]
BENCH_BOOL = ["cuda_graphs", "synthetic"]
RUNS_NUMERIC = ["wall_s"]

STATUS_MEANINGS = {
    "ok": "the cell ran and passed: an audit row's output matched fp16 (identical, or different only at a "
    "near-tie), a benchmark row was measured.",
    "diverged": "the greedy output left fp16's at a token where fp16 had a clear winner (`first_divergence` "
    "says which): the mode changes what the model says.",
    "degenerate": "the output collapsed (repetition loops, a stuck token, garbage): the failure that defects "
    "such as a scale floor or dropped attention sinks produce.",
    "fallback": "the requested mode is not allowed for this model and ran as another mode (`effective_mode`); "
    "its numbers describe the mode that actually ran.",
    "oom": "the cell ran out of device memory: the mode does not fit at this context and batch.",
    "error": "the cell raised an error; the `notes` column carries the message.",
    "skipped": "the cell was not run (not applicable here, e.g. an unsupported head size or a context beyond "
    "the model's limit).",
}

VERDICT_MEANINGS = (
    "**identical**: same greedy tokens as fp16. "
    "**near-tie at token N**: the first different token came where fp16's own top two candidates were "
    "within the audit's tie margin (a tie-break, not a quality loss). "
    "**diverged at token N**: the first different token came where fp16 had a clear winner. "
    "**degenerate**: the output collapsed into repetition. "
    "**top-1**: how often the mode's most likely next token equals fp16's; "
    "**KL**: KL divergence of the mode's next-token distribution from fp16's (as computed by the audit)."
)

# Verdict kinds that keep fp16-quality output.
GOOD_KINDS = ("reference", "identical", "near-tie", "ok")
BAD_KINDS = ("diverged", "degenerate")
FAIL_STATUSES = ("oom", "error", "skipped")
RAN_STATUSES = ("ok", "diverged", "degenerate", "fallback")


# ---------------------------------------------------------------------------
# Formatting


def _isnum(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def _s(x) -> str:
    """A cell as clean text ('' for missing)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x).strip()


def cell(x) -> str:
    return _s(x).replace("\r", " ").replace("\n", " ").replace("|", "\\|")


def md_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" * len(headers)
    sep = ["---:" if a == "r" else ":---:" if a == "c" else "---" for a in align]
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def ctx_label(n) -> str:
    if not _isnum(n):
        return "?"
    n = int(n)
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    if n >= 1024 and n % 512 == 0:
        return f"{n / 1024:.1f}K"
    return str(n)


def fmt_tok(x) -> str:
    return f"{x:.1f}" if _isnum(x) else "—"


def fmt_ratio(x) -> str:
    return f"{x:.2f}x" if _isnum(x) else "—"


def fmt_gb(x) -> str:
    return f"{x:.2f}" if _isnum(x) else "—"


def fmt_signed_gb(x) -> str:
    return f"{x:+.2f}" if _isnum(x) else "—"


def fmt_kl(x) -> str:
    if not _isnum(x):
        return "—"
    return "0" if x == 0 else f"{x:.3g}"


def fmt_pct(x, digits: int = 1) -> str:
    """A fraction as a percentage: 0.5 -> "50.0%", 1.029 -> "102.9%".

    Every column formatted here (roofline_frac, top1_agreement, token_match) is a
    fraction by definition; a value above 1 is a real value above 100% (e.g. a
    pure-read kernel beating the copy-bandwidth floor), never one already in percent.
    """
    if not _isnum(x):
        return "—"
    # Decimal rounding half up of the value as written in the CSV: 1.0285 -> "102.9%", not "102.8%".
    v = (Decimal(repr(float(x))) * 100).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{abs(v) if v == 0 else v}%"


def fmt_bytes(x) -> str:
    if not _isnum(x):
        return "—"
    if abs(x) < 1024:
        return f"{x:.0f} B"
    if abs(x) < 1024**2:
        return f"{x / 1024:.1f} KiB"
    if abs(x) < 1024**3:
        return f"{x / 1024**2:.1f} MiB"
    return f"{x / 1024**3:.2f} GiB"


def fmt_weight_bytes(x) -> str:
    """Bytes in decimal units (as bandwidth is), small ones not rounded to nothing: 16.06 GB, 1.44 MB, 512 KB."""
    if not _isnum(x):
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= 0.1 * scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def fmt_int(x) -> str:
    return f"{int(x)}" if _isnum(x) else "—"


def fmt_ppl(x) -> str:
    return f"{x:.3f}" if _isnum(x) else "—"


def fmt_ppl_delta(x) -> str:
    """`ppl_delta` (relative change vs fp16, ppl / ppl_fp16 - 1) as a signed percentage.

    Two significant digits below 1%, three above: 0.000806 -> "+0.081%", -3.3e-05 -> "-0.0033%",
    0.0123 -> "+1.23%", 0.5544 -> "+55.4%".
    """
    if not _isnum(x):
        return "—"
    v = x * 100
    if v == 0:
        return "0%"
    a = abs(v)
    if a >= 100:
        return f"{v:+.0f}%"
    if a >= 10:
        return f"{v:+.1f}%"
    if a >= 1:
        return f"{v:+.2f}%"
    digits = 1 - math.floor(math.log10(a))
    return f"{v:+.{digits}f}%"


def fmt_depth(x) -> str:
    if not _isnum(x):
        return "?"
    return f"{x * 100:.0f}%" if 0 <= x <= 1 else f"{x:g}"


def join_list(items: list[str]) -> str:
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# A mode run past its model-family allowlist (`--no-fallback`) is labelled "<mode> (no fallback)",
# so that it stays apart from the same request's fallback rows.
NO_FALLBACK = " (no fallback)"


# A row run with sparse V (`--sparse-v-threshold`) is labelled "<mode> (sparse V 1e-06)", apart from dense rows.
SPARSE_V = " (sparse V "


def sparse_label(tau: float) -> str:
    return f"{SPARSE_V}{tau:g})"


def base_mode(label: str) -> str:
    """The mode name of a row label: "turbo4 (no fallback) (sparse V 1e-06)" -> "turbo4"."""
    label = _s(label)
    if SPARSE_V in label:
        label = label[: label.index(SPARSE_V)]
    return label[: -len(NO_FALLBACK)] if label.endswith(NO_FALLBACK) else label


def fell_back(label: str, effective: str) -> bool:
    """Did a row labelled `label` run as another mode? Only if `effective_mode` differs from its mode name."""
    eff = _s(effective)
    return bool(eff) and eff != base_mode(label)


def cli_flag(label: str) -> str:
    label = _s(label)
    flag = f"--modes {base_mode(label)}" + (" --no-fallback" if NO_FALLBACK in label else "")
    if SPARSE_V in label:
        flag += " --sparse-v-threshold " + label[label.index(SPARSE_V) + len(SPARSE_V) : -1]
    return flag


# ---------------------------------------------------------------------------
# Peers: transformers' own caches (`hf:*` rows, kvbench.peers)

PEER_PREFIX = "hf:"
# Bits per stored K/V element of kvbench's modes (turbo4 run as turbo4-asym is still 4).
MODE_BITS = {"fp16": 16, "int8": 8, "turbo4-asym": 4, "turbo3-asym": 3, "turbo4": 4, "turbo4-delegated": 4}


def is_peer(label: str) -> bool:
    return _s(label).lower().startswith(PEER_PREFIX)


@functools.cache
def peer_widths() -> dict[str, int | None]:
    """{peer: bits per stored K/V element}, in `kvbench.peers.PEERS` order.

    Imported only when a report has peer rows (kvbench.peers imports torch); empty if it
    cannot be imported, when `_peer_bits` reads the width from the name.
    """
    try:
        from kvbench.peers import PEERS
    except Exception:
        return {}
    out: dict[str, int | None] = {}
    for name, spec in PEERS.items():
        if spec.nbits is not None:
            out[name] = spec.nbits
        elif spec.backend == "fp8":
            out[name] = 8
        elif spec.cache in ("dynamic", "static"):
            out[name] = 16  # the compute dtype (bf16/fp16)
        else:
            out[name] = None
    return out


def _peer_bits(name: str) -> int | None:
    widths = peer_widths()
    if name in widths:
        return widths[name]
    m = re.search(r"(?:int|fp)(\d+)$", name)
    if m:
        return int(m[1])
    return 16 if name in ("hf:dynamic", "hf:static") else None


def mode_bits(label: str) -> int | None:
    """Bits per stored K/V element of a row label (a kvbench mode or a peer); None if unknown."""
    base = base_mode(label)
    return _peer_bits(base) if is_peer(base) else MODE_BITS.get(base)


def mode_key(mode: str):
    """kvbench's modes in MODE_ORDER, then other kvbench modes, then peers in PEERS order."""
    base = base_mode(mode)
    if base in MODE_ORDER:
        return (MODE_ORDER.index(base), "" if base == mode else mode)
    if is_peer(base):
        order = list(peer_widths())
        i = order.index(base) if base in order else len(order)
        return (len(MODE_ORDER) + 1 + i, "" if base in order else mode)
    return (len(MODE_ORDER), mode)


def order_modes(modes) -> list[str]:
    return sorted({m for m in modes if m}, key=mode_key)


# ---------------------------------------------------------------------------
# Notes: a row's `notes` is several "; "-joined notes


# The allowlist note of a fallback row (kvbench.kv.registry.resolve_for_model); it holds a "; " itself.
_FALLBACK_NOTE = re.compile(
    r"(?P<mode>\S+) is only allowed for model families (?P<allow>[^;]+?); "
    r"'(?P<family>[^']*)' runs as (?P<eff>\S+) \(pass --no-fallback to run \S+ anyway\)"
)
_YARN_NOTE = re.compile(r"^yarn x(?P<factor>[\d.]+)\b", re.IGNORECASE)
# Notes that describe how every cell of a check ran; the status matrix leaves them out
# (the per-check tables and the benchmark method line say them once).
_GENERIC_NOTES = re.compile(
    r"^(teacher-forced on |reused \d+ cached tokens|compared with a fresh prefill|\d+ window\(s\) of |"
    r"context filled with random K/V|decode positions |capacity search|max \|logit difference\|)",
    re.IGNORECASE,
)
NOTES_CELL_MAX = 200


def note_parts(text) -> list[str]:
    """The single notes of a `notes` cell: split at "; " outside parentheses, the fallback note shortened."""
    text = _FALLBACK_NOTE.sub(
        lambda m: f"runs as {m['eff']} on {m['family']} (allowlist: {m['allow'].strip()})", _s(text)
    )
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == ";" and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        depth = max(depth, 0)
        cur.append(ch)
    parts.append("".join(cur))
    out = []
    for part in (p.strip() for p in parts):
        if part and part not in out:
            out.append(part)
    # A part that another one repeats word for word says nothing more ("synthetic model" beside "random K/V
    # (no prefill; synthetic model)"): drop it, and the later of two that differ only in case or spacing.
    low = [" ".join(p.lower().split()) for p in out]

    def repeated(i: int) -> bool:
        within = re.compile(rf"(?<!\w){re.escape(low[i])}(?!\w)")
        return any(j != i and within.search(low[j]) and (low[i] != low[j] or j < i) for j in range(len(out)))

    return [p for i, p in enumerate(out) if not repeated(i)]


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."


def hoist_notes(records: list[dict]) -> tuple[str, list[str]]:
    """Take repeated notes out of a table's rows.

    Returns (a sentence for above the table, each row's remaining notes). Notes on every
    row go into the sentence once; so do notes that follow the row's context (on every
    row of a context with several rows, and on no row of another context only by
    context), listed per context. What is left differs from row to row.
    """
    parts = [note_parts(r.get("notes")) for r in records]
    if len(records) < 2:
        return "", ["; ".join(p) for p in parts]
    ctxs = [r.get("context_tokens") for r in records]
    keys = [ctx_label(c) if _isnum(c) else "" for c in ctxs]
    order: list[str] = []
    for ps in parts:
        order += [p for p in ps if p not in order]
    common = [p for p in order if all(p in ps for ps in parts)]
    rows_of: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        rows_of.setdefault(k, []).append(i)
    per_ctx: dict[str, list[str]] = {}
    for p in order:
        if p in common:
            continue
        has = [p in ps for ps in parts]
        with_it = [k for k, idx in rows_of.items() if any(has[i] for i in idx)]
        follows_ctx = all(all(has[i] for i in rows_of[k]) for k in with_it)
        if with_it and "" not in with_it and follows_ctx and any(len(rows_of[k]) > 1 for k in with_it):
            for k in with_it:
                per_ctx.setdefault(k, []).append(p)
    moved = set(common) | {p for ps in per_ctx.values() for p in ps}
    sentences = []
    if common:
        sentences.append("Notes on every row: " + "; ".join(common) + ".")
    if per_ctx:
        ctx_order = sorted(per_ctx, key=lambda k: min(c for c, kk in zip(ctxs, keys, strict=True) if kk == k))
        sentences.append("By context: " + "; ".join(f"{k}: {', '.join(per_ctx[k])}" for k in ctx_order) + ".")
    return " ".join(sentences), ["; ".join(p for p in ps if p not in moved) for ps in parts]


def mode_notes(records: list[dict]) -> list[str]:
    """The distinct notes of one mode's rows for the status matrix, without the generic ones;
    YaRN notes summarised once ("YaRN at 8K (x2) and 32K (x8)")."""
    out: list[str] = []
    yarn: dict[float, str] = {}
    for r in records:
        for part in note_parts(r.get("notes")):
            m = _YARN_NOTE.match(part)
            if m:
                ctx = r.get("context_tokens")
                yarn[ctx if _isnum(ctx) else -1.0] = m["factor"]
            elif not _GENERIC_NOTES.match(part) and part not in out:
                out.append(part)
    # The fallback and --no-fallback notes first: they say which mode the numbers describe.
    out.sort(key=lambda t: 0 if t.startswith("runs as ") or "(--no-fallback)" in t else 1)
    known = [f"{ctx_label(c)} (x{f})" for c, f in sorted(yarn.items()) if c >= 0]
    if known:
        out.append("YaRN at " + join_list(known))
    elif yarn:
        out.append("YaRN x" + "/".join(sorted(set(yarn.values()))))
    return out


def notes_cell(notes: list[str], limit: int = NOTES_CELL_MAX) -> str:
    """Notes joined into one table cell of at most `limit` characters."""
    notes = [_clip(n, 120) for n in notes if n]
    text = "; ".join(notes)
    return _clip(text, limit)


# ---------------------------------------------------------------------------
# Loading


@dataclass
class Results:
    dirs: list[Path]
    audit: pd.DataFrame
    bench: pd.DataFrame
    runs: pd.DataFrame
    csv_files: list[Path]


def _warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


def _read_csv(path: Path) -> pd.DataFrame:
    """One results CSV. A file that is not CSV text is a one-line error; a line with too many fields is
    skipped, and a last line cut short (a copy taken mid-write) is dropped, each with a one-line warning."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise KvbenchError(f"{path} is not a CSV text file (byte {exc.start} is not UTF-8)") from None
    cut = False
    if text and not text.endswith("\n"):  # kvbench ends every row with a newline
        records = list(csv.reader(io.StringIO(text)))
        cut = len(records) > 1 and len(records[-1]) < len(records[0])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", pd.errors.ParserWarning)
            df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[], on_bad_lines="warn")
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except pd.errors.ParserError as exc:
        raise KvbenchError(f"{path} is not a readable CSV: {' '.join(str(exc).split())}") from None
    for w in caught:
        for line in str(w.message).splitlines():
            if line.strip():
                _warn(f"{path}: {line.strip().replace('Skipping', 'skipped')}")
    if cut:
        _warn(f"{path}: the last line is cut short (copied while being written?); skipped")
        df = df.iloc[:-1]
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _to_bool(series: pd.Series) -> pd.Series:
    table = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    return series.map(lambda v: table.get(_s(v).lower())).astype(object)


def _to_hit(series: pd.Series) -> pd.Series:
    def one(v):
        t = _s(v).lower()
        if t in ("true", "yes", "hit"):
            return 1.0
        if t in ("false", "no", "miss"):
            return 0.0
        try:
            return float(t)
        except ValueError:
            return np.nan

    return series.map(one).astype(float)


def _prepare(frames: list[pd.DataFrame], columns: list[str], numeric: list[str], boolean: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    all_cols = [*columns, "_source", "_order"]
    if not frames:
        df = pd.DataFrame({c: pd.Series(dtype=object) for c in all_cols})
    else:
        df = pd.concat(frames, ignore_index=True, sort=False)
    for c in all_cols:
        if c not in df.columns:
            df[c] = ""
    str_cols = [c for c in df.columns if c not in numeric and c not in boolean and c != "_order"]
    for c in str_cols:
        df[c] = df[c].map(_s).astype(object)
    for c in numeric:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c].map(_s).replace("", np.nan), errors="coerce").astype(float)
    for c in boolean:
        if c in df.columns:
            df[c] = _to_bool(df[c])
    for c in ("kv_cache_mode", "effective_mode", "status", "check", "verdict"):
        if c in df.columns:
            df[c] = df[c].str.strip()
    if "status" in df.columns:
        df["status"] = df["status"].str.lower()
    if "check" in df.columns:
        df["check"] = df["check"].str.lower().replace("", "greedy")
    if "niah_hit" in df.columns:
        df["niah_hit"] = _to_hit(df["niah_hit"])
    return df


NUMERIC = {"audit": AUDIT_NUMERIC, "bench": BENCH_NUMERIC, "runs": RUNS_NUMERIC}
# Without these a row cannot be placed in any table.
KEY_COLUMNS = {"audit": ["kv_cache_mode"], "bench": ["kv_cache_mode"], "runs": ["command"]}


def _usable(df: pd.DataFrame, path: Path) -> bool:
    """A results CSV whose header lacks the key columns is not kvbench's: skipped with a one-line warning
    rather than read as rows that belong to no mode."""
    if df.empty:
        return True
    missing = [c for c in KEY_COLUMNS[path.stem] if c not in df.columns]
    if missing:
        header = ", ".join(list(df.columns)[:6]) + (", ..." if len(df.columns) > 6 else "")
        _warn(f"{path}: no {', '.join(missing)} column (header: {header}); not a kvbench {path.name}, skipped")
        return False
    return True


def _warn_unparsed(df: pd.DataFrame, path: Path, numeric: list[str]) -> None:
    """A value in a numeric column that is not a number is read as missing; say so (column, count, the
    first such value and its line) rather than drop it in silence."""
    for c in numeric:
        if c not in df.columns:
            continue
        text = df[c].map(_s)
        bad = text.ne("") & pd.to_numeric(text.replace("", np.nan), errors="coerce").isna()
        if bad.any():
            first = bad.to_numpy().nonzero()[0][0]
            n = int(bad.sum())
            _warn(
                f"{path}: {plural(n, 'value')} of {c} {'is' if n == 1 else 'are'} not a number (first"
                f" {text.iloc[first]!r}, data row {first + 1}); read as missing"
            )


def load_results(results_dirs: list[Path]) -> Results:
    dirs = [Path(d) for d in results_dirs]
    frames: dict[str, list[pd.DataFrame]] = {"audit": [], "bench": [], "runs": []}
    csv_files: list[Path] = []
    order = 0
    for d in dirs:
        if not d.is_dir():
            raise KvbenchError(f"results folder {d} does not exist")
        for path in sorted(d.glob("*.csv")):
            csv_files.append(path)
            if path.stem in frames:
                df = _read_csv(path)
                if not _usable(df, path):
                    continue
                _warn_unparsed(df, path, NUMERIC[path.stem])
                df["_source"] = str(d)
                df["_order"] = range(order, order + len(df))
                order += len(df)
                frames[path.stem].append(df)
    bench = _prepare(frames["bench"], BENCH_COLUMNS, BENCH_NUMERIC, BENCH_BOOL)
    # The seed engine's CSV has no batch column: its rows are batch 1.
    bench["batch"] = bench["batch"].fillna(1.0)
    audit = _prepare(frames["audit"], AUDIT_COLUMNS, AUDIT_NUMERIC, AUDIT_BOOL)
    for df in (audit, bench):  # a mode run past its allowlist is its own row, beside its fallback
        if len(df):
            forced = df["notes"].astype(str).str.contains("(--no-fallback)", regex=False)
            forced &= df["kv_cache_mode"] == df["effective_mode"]
            df.loc[forced, "kv_cache_mode"] = df.loc[forced, "kv_cache_mode"] + NO_FALLBACK
            sparse = df["sparse_v"] > 0
            df.loc[sparse, "kv_cache_mode"] = df.loc[sparse, "kv_cache_mode"] + df.loc[sparse, "sparse_v"].map(
                sparse_label
            )
    return Results(
        dirs=dirs,
        audit=audit,
        bench=bench,
        runs=_prepare(frames["runs"], RUNS_COLUMNS, RUNS_NUMERIC, []),
        csv_files=csv_files,
    )


def _latest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per key: the latest (by date, then file order); several cluster jobs may repeat a cell."""
    if df.empty:
        return df
    df = df.sort_values(["date", "_order"], kind="stable")
    return df.drop_duplicates(subset=keys, keep="last")


# what tells one audit cell from another (besides the mode and the check): the rows of a cell in one
# results file are its trials
AUDIT_CELL = ("max_kv_size", "keep", "niah_depth", "kernel", "dtype", "batch", "boundary_v", "sparse_v")
AUDIT_KEYS = ["check", "kv_cache_mode", "context_tokens", *AUDIT_CELL]
# Checks with one row per (mode, context[, cap]): more rows there are re-runs, and the report shows the last.
ONE_ROW_CHECKS = ("greedy", "ppl", "max_kv", "prefix_reuse")
ONE_ROW_KEYS = ["check", "kv_cache_mode", "context_tokens", "max_kv_size", "keep"]
# what tells one benchmark cell from another
BENCH_CELL = [
    "context_tokens",
    "batch",
    "kv_cache_mode",
    "kernel",
    "cuda_graphs",
    "max_kv_size",
    "dtype",
    "boundary_v",
    "prefill_chunk",
]
# A capacity row's cell: its search runs without CUDA graphs, and only a timed row (`--capacity-speed`) says
# whether its decode used them, so a timed and an untimed search of one batch are the same cell (the later kept)
CAPACITY_CELL = [c for c in BENCH_CELL if c != "cuda_graphs"]
# How a row was made rather than what it measured: duplicates of a cell that differ here were run differently.
SETTINGS_COLUMNS = (
    "gen_tokens",
    "warmup",
    "repeats",
    "prefill_source",
    "prefill_chunk",
    "effective_mode",
    *AUDIT_CELL,
    "model_hash",
    "kvbench_version",
    "git_commit",
    "torch_version",
    "triton_version",
    "transformers_version",
)


def _latest_cells(audit: pd.DataFrame) -> pd.DataFrame:
    """The audit with each cell's rows from the latest results file that has the cell: an audit run
    again (merged folders) replaces the earlier run's rows instead of adding to them."""
    ordered = audit.sort_values(["date", "_order"], kind="stable")
    last = ordered.groupby(AUDIT_KEYS, dropna=False, sort=False)["_source"].transform("last")
    return ordered[ordered["_source"] == last].sort_values("_order", kind="stable")


def _latest_audit(audit: pd.DataFrame) -> pd.DataFrame:
    """_latest_cells, and of a one-row check's cell (the greedy output, ppl, ...) only the latest row."""
    cells = _latest_cells(audit)
    one = cells["check"].isin(ONE_ROW_CHECKS)
    return pd.concat([cells[~one], _latest(cells[one], ONE_ROW_KEYS)]).sort_values("_order", kind="stable")


def _dropped(rows: pd.DataFrame, kept: pd.DataFrame, cells: list[tuple[pd.DataFrame, list[str]]]) -> tuple:
    """(how many of `rows` the dedupe to `kept` dropped, the settings columns in which the rows of one cell
    differ), a cell being the rows of each (frame, keys) of `cells` with equal keys."""
    n = len(rows) - len(kept)
    if n <= 0:
        return 0, []
    differ: set[str] = set()
    for frame, keys in cells:
        cols = [c for c in SETTINGS_COLUMNS if c in frame.columns and c not in keys]
        if len(frame) and cols:
            counts = frame.groupby(keys, dropna=False)[cols].nunique(dropna=False)
            differ |= {c for c in cols if (counts[c] > 1).any()}
    return n, [c for c in SETTINGS_COLUMNS if c in differ]


# ---------------------------------------------------------------------------
# Quality of one audit row


@dataclass
class Quality:
    kind: str  # reference, identical, near-tie, diverged, degenerate, ok, oom, error, skipped, or a raw verdict
    text: str  # "diverged at token 17"
    short: str  # for compact cells
    top1: float = float("nan")
    kl: float = float("nan")
    context: float = float("nan")
    first_divergence: float = float("nan")
    match: float = float("nan")  # share of the greedy tokens equal to fp16's, position by position


def _norm_verdict(v: str) -> str:
    return _s(v).lower().replace("_", "-").replace(" ", "-")


def assess(row: dict) -> Quality:
    status = _s(row.get("status")).lower()
    verdict = _norm_verdict(row.get("verdict"))
    fd = row.get("first_divergence")
    at = f" at token {int(fd)}" if _isnum(fd) else ""
    mode = _s(row.get("kv_cache_mode"))
    reason = _s(row.get("degenerate_reason"))
    extra = {
        "top1": row.get("top1_agreement"),
        "kl": row.get("kl_div"),
        "context": row.get("context_tokens"),
        "match": row.get("token_match"),
    }
    extra = {k: (float(v) if _isnum(v) else float("nan")) for k, v in extra.items()}
    extra["first_divergence"] = float(fd) if _isnum(fd) else float("nan")
    if status in FAIL_STATUSES:
        return Quality(status, status, status, **extra)
    if row.get("degenerate") is True or verdict.startswith("degenerat") or status == "degenerate":
        return Quality("degenerate", "degenerate" + (f" ({reason})" if reason else ""), "degenerate", **extra)
    if mode == "fp16" and _s(row.get("effective_mode")) in ("", "fp16"):
        return Quality("reference", "reference", "reference", **extra)
    if verdict in ("reference", "baseline"):
        return Quality("reference", "reference", "reference", **extra)
    if verdict == "identical":
        return Quality("identical", "identical", "identical", **extra)
    if "near" in verdict or "tie" in verdict:
        return Quality("near-tie", "near-tie" + at, "near-tie" + (f"@{int(fd)}" if _isnum(fd) else ""), **extra)
    if verdict.startswith("diverg"):
        return Quality("diverged", "diverged" + at, "diverged" + (f"@{int(fd)}" if _isnum(fd) else ""), **extra)
    if verdict:
        return Quality(verdict, verdict + at, verdict, **extra)
    if row.get("identical_to_fp16") is True:
        return Quality("identical", "identical", "identical", **extra)
    if row.get("near_tie") is True:
        return Quality("near-tie", "near-tie" + at, "near-tie" + (f"@{int(fd)}" if _isnum(fd) else ""), **extra)
    if row.get("identical_to_fp16") is False or _isnum(fd):
        return Quality("diverged", "diverged" + at, "diverged" + (f"@{int(fd)}" if _isnum(fd) else ""), **extra)
    if status == "diverged":
        return Quality("diverged", "diverged", "diverged", **extra)
    if status in ("ok", "fallback"):
        return Quality("ok", "ok", "ok", **extra)
    return Quality("unknown", status or "—", status or "—", **extra)


def _without_degeneracy(row: dict) -> dict:
    """An audit row with its degeneracy verdict taken out, judged by its tokens vs fp16's alone."""
    status = "ok" if _s(row.get("status")).lower() == "degenerate" else row.get("status")
    verdict = "" if _norm_verdict(row.get("verdict")).startswith("degenerat") else row.get("verdict")
    return {**row, "degenerate": None, "status": status, "verdict": verdict}


def quality_metrics(q: Quality) -> str:
    parts = []
    if _isnum(q.top1):
        parts.append(f"top-1 {fmt_pct(q.top1)}")
    if _isnum(q.kl):
        parts.append(f"KL {fmt_kl(q.kl)}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------
# Groups: one (device, model) setup


@dataclass
class Group:
    device: str
    model: str
    audit: pd.DataFrame
    bench_all: pd.DataFrame
    bench: pd.DataFrame = field(init=False)  # non-capacity rows, latest per cell, with ratio / delta columns
    capacity: pd.DataFrame = field(init=False)
    bench_main: pd.DataFrame = field(init=False)  # non-capacity rows, latest per cell
    duplicates: list = field(init=False)  # (which rows, how many dropped, settings columns they differ in)
    greedy: pd.DataFrame = field(init=False)  # latest greedy row per (mode, context)
    quality: dict = field(init=False)  # (mode, context) -> Quality
    modes: list[str] = field(init=False)
    ref_batch: float | None = field(init=False)
    ref_degenerate: dict = field(init=False)  # context -> why fp16's own greedy output is degenerate there
    index: int = 0
    multi: bool = False
    setup: str = ""  # what sets this group apart from another of the same device and model ("float16, KV cap 64")

    def __post_init__(self) -> None:
        b = self.bench_all
        is_cap = b["notes"].str.contains("capacity", case=False, regex=False) if len(b) else pd.Series(dtype=bool)
        self.capacity = _latest(b[is_cap], CAPACITY_CELL) if len(b) else b
        self.bench_main = _latest(b[~is_cap], BENCH_CELL) if len(b) else b
        self.bench = _enrich_bench(self.bench_main)
        self.duplicates = []
        if len(b):
            for what, rows, kept, cell in (
                ("benchmark", b[~is_cap], self.bench_main, BENCH_CELL),
                ("capacity", b[is_cap], self.capacity, CAPACITY_CELL),
            ):
                self.duplicates.append((what, *_dropped(rows, kept, [(rows, cell)])))
        a = self.audit
        if len(a):
            self.audit = _latest_audit(a)
            one = a[a["check"].isin(ONE_ROW_CHECKS)]
            self.duplicates.append(("audit", *_dropped(a, self.audit, [(a, AUDIT_KEYS), (one, ONE_ROW_KEYS)])))
            a = self.audit
        self.greedy = _latest(a[a["check"] == "greedy"], ["kv_cache_mode", "context_tokens"]) if len(a) else a
        self.quality = {}
        recs = self.greedy.to_dict("records")
        for r in recs:
            self.quality[(r["kv_cache_mode"], r["context_tokens"])] = assess(r)
        # Where fp16's own output is degenerate (a random-weight model loops), a mode's degeneracy says nothing
        # about the mode: fp16 stays the reference, and the others are judged by their tokens vs fp16's alone.
        self.ref_degenerate = {}  # context -> fp16's degenerate reason
        for r in recs:
            q = self.quality[(r["kv_cache_mode"], r["context_tokens"])]
            if r["kv_cache_mode"] == "fp16" and r["effective_mode"] in ("", "fp16") and q.kind == "degenerate":
                self.ref_degenerate[r["context_tokens"]] = _s(r.get("degenerate_reason"))
                self.quality[("fp16", r["context_tokens"])] = Quality(
                    "reference", "reference (degenerate)", "reference (degenerate)", q.top1, q.kl, q.context
                )
        for r in recs:
            key = (r["kv_cache_mode"], r["context_tokens"])
            if key[0] != "fp16" and key[1] in self.ref_degenerate and self.quality[key].kind == "degenerate":
                self.quality[key] = assess(_without_degeneracy(r))
        self.modes = order_modes(list(a["kv_cache_mode"]) + list(b["kv_cache_mode"]))
        batches = sorted({x for x in self.bench["batch"] if _isnum(x)})
        self.ref_batch = 1.0 if 1.0 in batches else (batches[0] if batches else None)

    @property
    def label(self) -> str:
        label = f"{self.device or 'unknown device'} · {self.model or 'unknown model'}"
        return f"{label} · {self.setup}" if self.setup else label

    @property
    def suffix(self) -> str:
        return f"_{self.index + 1}" if self.multi else ""

    def heading(self, level: int = 3) -> str:
        return f"{'#' * level} {self.label}\n"

    def rows_for(self, mode: str) -> pd.DataFrame:
        """Audit and (non-capacity) benchmark rows of one mode; `_kind` says which."""
        a = self.audit[self.audit["kv_cache_mode"] == mode].assign(_kind="audit")
        b = self.bench_main[self.bench_main["kv_cache_mode"] == mode].assign(_kind="bench")
        if a.empty and b.empty:  # a mode seen only in a capacity search
            b = self.capacity[self.capacity["kv_cache_mode"] == mode].assign(_kind="bench")
        return pd.concat([a, b], ignore_index=True, sort=False)

    def contexts(self, df: pd.DataFrame) -> list[float]:
        return sorted({x for x in df["context_tokens"] if _isnum(x)})

    def mode_quality(self, mode: str) -> list[Quality]:
        qs = [q for (m, _c), q in self.quality.items() if m == mode]
        return sorted(qs, key=lambda q: q.context if _isnum(q.context) else -1)

    def quality_ok(self, mode: str, ctx) -> tuple[bool | None, str]:
        """Does `mode` keep fp16 quality at `ctx`? (None: not audited). Second item: a caveat."""
        if mode == "fp16":
            return True, ""
        q = self.quality.get((mode, ctx))
        if q is not None:
            return q.kind in GOOD_KINDS, ""
        qs = self.mode_quality(mode)
        if not qs:
            return None, ""
        ok = all(q.kind in GOOD_KINDS for q in qs)
        return ok, f"audited at {', '.join(ctx_label(q.context) for q in qs)} only"

    def bench_ok(self, batch=None) -> pd.DataFrame:
        b = self.bench
        if b.empty:
            return b
        b = b[b["status"].isin(["ok", "fallback", ""]) & b["decode_tok_s"].notna()]
        if batch is not None:
            b = b[b["batch"] == batch]
        return b

    def kv_per_token(self, mode: str, ctx) -> float:
        for df in (self.bench, self.audit):
            if df.empty:
                continue
            rows = df[(df["kv_cache_mode"] == mode) & df["kv_bytes_per_token"].notna()]
            exact = rows[rows["context_tokens"] == ctx]
            rows = exact if len(exact) else rows.sort_values("context_tokens")
            if len(rows):
                return float(rows["kv_bytes_per_token"].iloc[-1])
        return float("nan")


# A decode tok/s is noisy (a ratio on it is rough) when its repeats spread wider than this, (max - min) / median.
NOISY_SPREAD = 0.10


def timing_noise(r: dict) -> str:
    """Why a benchmark row's decode tok/s is noisy: "1 repeat" (no spread to judge it by) or "min–max spread 23.1%"
    of its repeats (`decode_tok_s_min`/`_max` around the median); "" if neither, or the row has no such columns."""
    reps, lo, hi, med = (r.get(c) for c in ("repeats", "decode_tok_s_min", "decode_tok_s_max", "decode_tok_s"))
    if _isnum(reps) and reps < 2:
        return plural(int(reps), "repeat")
    if _isnum(lo) and _isnum(hi) and _isnum(med) and med > 0 and (hi - lo) / med > NOISY_SPREAD:
        return f"min–max spread {fmt_pct((hi - lo) / med)}"
    return ""


def _enrich_bench(b: pd.DataFrame) -> pd.DataFrame:
    """Ratio and peak delta vs fp16; the CSV's own columns win (measured side by side within one run).
    `_noise` / `_fp16_noise`: timing_noise of the row and of the fp16 row its ratio is against."""
    b = b.copy()
    for c in ("_ratio", "_fp16_peak", "_peak_delta", "_peak_delta_pct"):
        b[c] = np.nan
    b["_ratio_computed"] = False
    b["_fp16_status"] = ""  # why there is no fp16 reference (e.g. oom), where fp16 failed
    b["_noise"] = ""
    b["_fp16_noise"] = ""
    if b.empty:
        return b
    fp16_failed = {
        (r["context_tokens"], r["batch"]): r["status"]
        for r in b[(b["kv_cache_mode"] == "fp16") & b["status"].isin(FAIL_STATUSES)].to_dict("records")
    }
    ok = b[b["status"].isin(["ok", ""]) & b["decode_tok_s"].notna()]
    fp16 = ok[(ok["kv_cache_mode"] == "fp16")]
    best = {}
    for r in fp16.to_dict("records"):
        key = (r["context_tokens"], r["batch"])
        if key not in best or r["decode_tok_s"] > best[key]["decode_tok_s"]:
            best[key] = r
    for i, r in b.iterrows():
        ref = best.get((r["context_tokens"], r["batch"]))
        if ref is None:
            b.at[i, "_fp16_status"] = fp16_failed.get((r["context_tokens"], r["batch"]), "")
        ratio = r["decode_ratio_vs_fp16"]
        if not _isnum(ratio) and ref is not None and _isnum(r["decode_tok_s"]) and ref["decode_tok_s"] > 0:
            ratio = r["decode_tok_s"] / ref["decode_tok_s"]
            b.at[i, "_ratio_computed"] = True
        b.at[i, "_ratio"] = ratio
        b.at[i, "_noise"] = timing_noise(r) if _isnum(r["decode_tok_s"]) else ""
        b.at[i, "_fp16_noise"] = timing_noise(ref) if ref is not None else ""
        ref_peak = ref["peak_mem_gb"] if ref is not None else np.nan
        delta = r["peak_delta_gb"]
        if not _isnum(delta) and _isnum(ref_peak) and _isnum(r["peak_mem_gb"]):
            delta = r["peak_mem_gb"] - ref_peak
        b.at[i, "_fp16_peak"] = ref_peak
        b.at[i, "_peak_delta"] = delta
        if _isnum(delta) and _isnum(ref_peak) and ref_peak > 0:
            b.at[i, "_peak_delta_pct"] = 100.0 * delta / ref_peak
    return b


def _cap_of(df: pd.DataFrame) -> pd.Series:
    """A benchmark row's live-KV cap as its label, "KV cap 64 (keep 4)" ("" for none): capped and uncapped
    decodes are not one cell."""
    cap = pd.to_numeric(df["max_kv_size"], errors="coerce")
    keep = pd.to_numeric(df["keep"], errors="coerce")
    return pd.Series(
        [
            f"KV cap {int(c)}" + (f" (keep {int(k)})" if _isnum(k) else "") if _isnum(c) else ""
            for c, k in zip(cap, keep, strict=True)
        ],
        index=df.index,
        dtype=object,
    )


def build_groups(data: Results) -> list[Group]:
    """One group per device and model, and per setup that changes what a number means: the dtype (a merged
    float16 and float32 run), and a benchmark's live-KV cap (`--max-kv-size`). The audit (whose cap rows are
    its own checks) goes with the uncapped benchmark of its dtype."""
    keys = set()
    for df in (data.audit, data.bench):
        keys |= set(zip(df["device"], df["model"], strict=True))
    groups = []
    for device, model in sorted(keys):
        a = data.audit[(data.audit["device"] == device) & (data.audit["model"] == model)]
        b = data.bench[(data.bench["device"] == device) & (data.bench["model"] == model)]
        a_dtype = a["dtype"].map(_s) if len(a) else pd.Series(dtype=object)
        b_dtype = b["dtype"].map(_s) if len(b) else pd.Series(dtype=object)
        b_cap = _cap_of(b) if len(b) else pd.Series(dtype=object)
        setups = sorted({(d, c) for d, c in zip(b_dtype, b_cap, strict=True)} | {(d, "") for d in a_dtype})
        show_dtype = len({d for d, _ in setups}) > 1
        for dtype, cap in setups:
            sub_a = a[a_dtype == dtype] if not cap and len(a) else a.iloc[0:0]
            sub_b = b[(b_dtype == dtype) & (b_cap == cap)] if len(b) else b
            if len(sub_a) or len(sub_b):
                setup = ", ".join(p for p in (dtype if show_dtype else "", cap) if p)
                groups.append(Group(device=device, model=model, audit=sub_a, bench_all=sub_b, setup=setup))
    for i, g in enumerate(groups):
        g.index, g.multi = i, len(groups) > 1
    return groups


# ---------------------------------------------------------------------------
# Sections


def _unique(values) -> list[str]:
    return sorted({_s(v) for v in values if _s(v)})


def _date_span(dates: list[str]) -> str:
    if not dates:
        return "unknown"
    if len(dates) <= 3:
        return ", ".join(dates)
    return f"{dates[0]} to {dates[-1]} ({len(dates)} days)"


def section_header(data: Results, groups: list[Group], out_dir: Path) -> str:
    rows = pd.concat([data.audit, data.bench], ignore_index=True, sort=False)
    dates = _unique([d[:10] for d in list(rows["date"]) + list(data.runs["date"])])
    lines = ["# kvbench report", ""]
    lines.append(f"- **Date{'s' if len(dates) > 1 else ''}**: {_date_span(dates)}")
    devices = []
    for dev in _unique(list(rows["device"]) + list(data.runs["device"])):
        drivers = _unique(rows.loc[rows["device"] == dev, "driver"])
        devices.append(dev + (f" (driver {', '.join(drivers)})" if drivers else ""))
    lines.append(f"- **Device{'s' if len(devices) > 1 else ''}**: {'; '.join(devices) or 'unknown'}")
    models = []
    for model in _unique(list(rows["model"]) + list(data.runs["model"])):
        sub = rows[rows["model"] == model]
        hashes = _unique(sub["model_hash"])
        synthetic = any(v is True for v in sub["synthetic"])
        models.append(
            f"`{model}`"
            + (f" (weights hash `{'`, `'.join(hashes)}`)" if hashes else "")
            + (" — synthetic (random) weights" if synthetic else "")
        )
    lines.append(f"- **Model{'s' if len(models) > 1 else ''}**: {'; '.join(models) or 'unknown'}")

    # the builds that measured the rows (a resumed run that added nothing is only in runs.csv), per job where
    # the audit and the benchmark came from different ones
    def builds_of(df: pd.DataFrame) -> list[str]:
        return _unique(
            (f"{v or '?'} (git commit not recorded)" if c.lower() == "unknown" else f"{v or '?'} (git {_short_sha(c)})")
            if c
            else (v or "?")
            for v, c in zip(df["kvbench_version"], df["git_commit"], strict=True)
        )

    per_job = [(name, builds_of(df)) for name, df in (("audit", data.audit), ("benchmark", data.bench)) if len(df)]
    if len(per_job) == 2 and per_job[0][1] != per_job[1][1]:
        text = "; ".join(f"{name} {', '.join(b)}" for name, b in per_job)
    else:
        text = "; ".join(builds_of(rows if len(rows) else data.runs))
    lines.append(f"- **kvbench**: {text or 'unknown'}")
    soft = []
    for col, name in (
        ("torch_version", "torch"),
        ("triton_version", "triton"),
        ("transformers_version", "transformers"),
    ):
        vals = _unique(rows[col])
        soft.append(f"{name} {', '.join(vals) if vals else '—'}")
    lines.append(f"- **Software**: {' · '.join(soft)}")
    rels = [_rel(d, out_dir) for d in data.dirs]
    rels = [f"{d.resolve().name}/ (this folder)" if r == "." else r for d, r in zip(data.dirs, rels, strict=True)]
    lines.append(f"- **Results folder{'s' if len(rels) > 1 else ''}**: {', '.join(f'`{r}`' for r in rels)}")
    lines.append(f"- Rendered on {_dt.date.today().isoformat()} from the CSVs only.")
    runs = data.runs
    if len(runs):
        lines += ["", "Commands that wrote these results (from `runs.csv`):", "", "```"]
        for r in runs.sort_values(["date", "_order"], kind="stable").to_dict("records"):
            meta = [x for x in (r["date"], f"job {r['job']}" if r["job"] else "", r["device"]) if x]
            if _isnum(r["wall_s"]):
                meta.append(f"{r['wall_s']:.1f} s")
            lines.append("# " + " · ".join(meta))
            lines.append(r["command"] or "(command not recorded)")
        lines.append("```")
    return "\n".join(lines)


def _short_sha(commit: str) -> str:
    """A commit as git's short form (7 hex digits), a "-dirty" suffix kept; anything else as it is."""
    m = re.fullmatch(r"([0-9a-f]{7,40})(-dirty)?", commit.strip().lower())
    return m.group(1)[:7] + (m.group(2) or "") if m else commit


def section_summary(groups: list[Group]) -> str:
    out = ["## Summary", ""]
    if len({g.model for g in groups}) > 1:
        out += [
            f"These results come from {len(groups)} setups (device · model"
            + (" · dtype or KV cap" if any(g.setup for g in groups) else "")
            + "), each summarised on its own: an audit speaks for the model it ran on, a benchmark for its own "
            "model, and one setup's verdicts say nothing about another's speed.",
            "",
        ]
    elif any(g.setup for g in groups) and len(groups) > 1:
        out += [
            f"These results come from {len(groups)} setups of one model, each summarised on its own with its own "
            "fp16 reference: a ratio compares modes run alike (the same dtype, the same KV cap).",
            "",
        ]
    for g in groups:
        sentences = _summary_sentences(g)
        prefix = f"**{g.label}**: " if g.multi or g.setup else ""  # a KV cap is named even alone
        out.append(prefix + " ".join(sentences))
        out.append("")
        note = _duplicates_note(g)
        if note:
            out += [note, ""]
    return "\n".join(out).rstrip()


def _duplicates_note(g: Group) -> str:
    """A warning where the same cell has several rows (a sweep run again, appended or merged) of which the
    report shows only the latest; "" where none."""
    dropped = [(what, n, differ) for what, n, differ in g.duplicates if n]
    if not dropped:
        return ""
    many = sum(n for _, n, _ in dropped) > 1
    counts = join_list([f"{n} {what}" for what, n, _ in dropped]) + (" rows" if many else " row")
    text = (
        f"**Note**: {counts} dropped as duplicate{'s' if many else ''}: {'each repeats' if many else 'it repeats'} "
        "a cell that has a later row (the same cell run again), and the tables show the latest row of each cell."
    )
    differ = [c for _, _, d in dropped for c in d]
    if differ:
        cols = join_list([f"`{c}`" for c in dict.fromkeys(differ)])
        text += f" The rows of a cell differ in {cols}: the dropped ones were run with other settings."
    else:
        text += " The duplicates were run with the same settings."
    return text


def _ctx_list(ctxs) -> str:
    return join_list([ctx_label(c) for c in sorted(ctxs)])


def _mode_list(modes: list[str], all_modes: list[str]) -> str:
    if len(modes) == len(all_modes) and len(modes) > 2:
        return f"all {len(modes)} modes"
    return join_list(modes)


def _summary_sentences(g: Group) -> list[str]:
    s = []
    ran, failed, fallbacks = [], [], {}
    for m in g.modes:
        rows = g.rows_for(m)
        statuses = set(rows["status"])
        if statuses & set(RAN_STATUSES) or "" in statuses:
            ran.append(m)
        else:
            failed.append(m)
        eff = _unique(e for e in rows["effective_mode"] if fell_back(m, e))
        if eff:
            fallbacks[m] = eff
    parts = []
    if len(g.audit):
        audited = order_modes(g.audit["kv_cache_mode"])
        parts.append(
            f"audited {_mode_list(audited, g.modes)} at {_ctx_list(g.contexts(g.audit))} ({len(g.audit)} rows)"
        )
    if len(g.bench_main):
        benched = order_modes(g.bench_main["kv_cache_mode"])
        batches = sorted({int(x) for x in g.bench_main["batch"] if _isnum(x)})
        parts.append(
            f"benchmarked {_mode_list(benched, g.modes)} at {_ctx_list(g.contexts(g.bench_main))}"
            + (f" with batch {join_list([str(b) for b in batches])}" if batches else "")
            + f" ({len(g.bench_main)} rows"
            + (f", plus {len(g.capacity)} capacity-search rows)" if len(g.capacity) else ")")
        )
    elif len(g.capacity):
        parts.append(f"ran a capacity search ({len(g.capacity)} rows)")
    first = " and ".join(parts) if parts else "no rows"
    first = first[0].upper() + first[1:]
    tail = []
    if failed:
        tail.append(f"{join_list(failed)} produced no result")
    if fallbacks:
        tail.append(join_list([f"{m} ran as {'/'.join(e)} (fallback)" for m, e in fallbacks.items()]))
    s.append(first + ("; " + "; ".join(tail) if tail else "") + ".")

    # Quality: the worst verdict per quantized mode.
    if g.quality:
        cats: dict[str, list[str]] = {}
        for m in g.modes:
            qs = [q for q in g.mode_quality(m) if q.kind != "reference"]
            if m == "fp16" or not qs:
                continue
            kinds = [q.kind for q in qs]
            if all(k == "identical" for k in kinds):
                cats.setdefault("identical", []).append(m)
            elif "degenerate" in kinds:
                bad = [ctx_label(q.context) for q in qs if q.kind == "degenerate"]
                cats.setdefault("bad", []).append(f"{m} degenerated at {join_list(bad)}")
            elif "diverged" in kinds:
                d = [q for q in qs if q.kind == "diverged"]
                where = join_list(
                    [
                        ctx_label(q.context)
                        + (f" (token {int(q.first_divergence)})" if _isnum(q.first_divergence) else "")
                        for q in d
                    ]
                )
                cats.setdefault("bad", []).append(f"{m} diverged at {where}")
            elif all(k in GOOD_KINDS for k in kinds):
                near = [ctx_label(q.context) for q in qs if q.kind == "near-tie"]
                if near:
                    cats.setdefault("near", []).append(f"{m} (at {join_list(near)})")
                else:
                    cats.setdefault("passed", []).append(m)
            else:
                other = [f"{q.text} at {ctx_label(q.context)}" for q in qs if q.kind not in GOOD_KINDS]
                cats.setdefault("fail", []).append(f"{m} did not complete ({join_list(other)})")
        bits = []
        if cats.get("identical"):
            n = len(cats["identical"])
            bits.append(
                f"{join_list(cats['identical'])} {'was' if n == 1 else 'were'} identical at every audited context"
            )
        if cats.get("near"):
            bits.append(f"{join_list(cats['near'])} differed only at near-ties")
        if cats.get("passed"):
            bits.append(f"{join_list(cats['passed'])} passed (status ok; the CSV gives no verdict detail)")
        bits += cats.get("bad", []) + cats.get("fail", [])
        if bits:
            text = "; ".join(bits)
            s.append(f"Against fp16: {text}.")
        if g.ref_degenerate:
            s.append(
                f"The fp16 output itself is degenerate at {_ctx_list(g.ref_degenerate)} (as with random weights): "
                "degeneracy is not judged there, only agreement with fp16's tokens."
            )
    elif len(g.audit) == 0:
        s.append("No audit rows: output quality was not checked.")

    # Speed and KV bytes at the longest measured context.
    bok = g.bench_ok(g.ref_batch)
    if len(bok):
        ctx = max(bok["context_tokens"].dropna())
        at = bok[bok["context_tokens"] == ctx]
        fp = at[at["kv_cache_mode"] == "fp16"]
        fp16_tok = fp["decode_tok_s"].max() if len(fp) else float("nan")
        speed = []
        for m in g.modes:
            if m == "fp16":
                continue
            r = at[at["kv_cache_mode"] == m]
            if len(r):
                best = r.sort_values("decode_tok_s").iloc[-1]
                # no fp16 row there (it ran out of memory where a smaller cache fits): tok/s, not a ratio
                speed.append(
                    f"{m} {fmt_ratio(best['_ratio'])}" if _isnum(fp16_tok) else f"{m} {fmt_tok(best['decode_tok_s'])}"
                )
        fails = g.bench[
            (g.bench["context_tokens"] == ctx)
            & (g.bench["batch"] == g.ref_batch)
            & g.bench["status"].isin(FAIL_STATUSES)
        ]
        speed += [f"{r['kv_cache_mode']} {r['status']}" for r in fails.to_dict("records")]
        head = f"At {ctx_label(ctx)} (batch {fmt_int(g.ref_batch)}), the longest measured context"
        if _isnum(fp16_tok):
            head += f", fp16 decoded {fmt_tok(fp16_tok)} tok/s"
        if speed and _isnum(fp16_tok):
            sent = head + f"; relative to it: {', '.join(speed)}"
        elif speed:
            sent = head + f"; no fp16 result there to compare with, so decode tok/s: {', '.join(speed)}"
        else:
            sent = head
        fp_bytes = g.kv_per_token("fp16", ctx)
        saving = []
        for m in g.modes:
            kb = g.kv_per_token(m, ctx)
            if m != "fp16" and _isnum(kb) and _isnum(fp_bytes) and kb > 0:
                if kb < fp_bytes:
                    vs = f"{fp_bytes / kb:.2f}x less"
                else:  # a 16-bit peer (hf:static preallocates its whole buffer)
                    vs = "same as fp16" if kb == fp_bytes else f"{kb / fp_bytes:.2f}x more"
                saving.append(f"{m} {fmt_bytes(kb)} ({vs})")
        if saving:
            sent += f". KV bytes per token at {ctx_label(ctx)}: fp16 {fmt_bytes(fp_bytes)}, {', '.join(saving)}"
            okall = g.bench_ok()
            varies = [
                m
                for m in g.modes
                if len({x for x in okall[okall["kv_cache_mode"] == m]["kv_bytes_per_token"] if _isnum(x)}) > 1
            ]
            if varies:  # e.g. delegated: a fixed-size fp16 hot window spread over fewer tokens
                sent += (
                    f"; {join_list(varies)} store{'s' if len(varies) == 1 else ''} more per token at shorter "
                    "contexts (a part of fixed size, such as a hot window)"
                )
        s.append(sent + ".")
    elif len(g.bench_all) == 0:
        s.append("No benchmark rows: decode speed and memory were not measured.")
    else:
        s.append("No benchmark cell completed (see the benchmark table for statuses).")
    peer_line = _peer_comparison(g)
    if peer_line:
        s.append(peer_line)
    return s


def _row_where(r: dict) -> str:
    where = ctx_label(r.get("context_tokens"))
    if _isnum(r.get("batch")) and r.get("_kind") == "bench":
        where += f" b={int(r['batch'])}"
    return where


def section_audit(groups: list[Group]) -> str:
    out = ["## Audit status matrix", ""]
    for g in groups:
        if g.multi:
            out.append(g.heading())
        out.append(_status_matrix(g))
        out.append("")
        long = _long_context_matrix(g)
        if long:
            out += [f"{'#' * (4 if g.multi else 3)} Long-context checks", "", long, ""]
    return "\n".join(out).rstrip()


def _status_matrix(g: Group) -> str:
    rows = []
    bench_ctxs = g.contexts(g.bench)
    for m in g.modes:
        recs = g.rows_for(m).to_dict("records")
        # Runs
        statuses = [r["status"] for r in recs]
        ran = any(st in RAN_STATUSES or st == "" for st in statuses)
        problems: dict[str, list[str]] = {}
        for r in recs:
            if r["status"] in FAIL_STATUSES:
                where = _row_where(r)
                problems.setdefault(r["status"], [])
                if where not in problems[r["status"]]:
                    problems[r["status"]].append(where)
        runs = "yes" if ran else "no"
        if problems:
            runs += "; " + "; ".join(f"{st} at {', '.join(w)}" for st, w in problems.items())
        # Quality
        if m == "fp16":
            quality = "reference"
            if g.ref_degenerate:
                quality += f" (its own output is degenerate at {_ctx_list(g.ref_degenerate)})"
        else:
            qs = g.mode_quality(m)
            bits = []
            for q in qs:
                metrics = quality_metrics(q)
                bits.append(f"{ctx_label(q.context)}: {q.text}" + (f" ({metrics})" if metrics else ""))
            ppl = g.audit[(g.audit["kv_cache_mode"] == m) & (g.audit["check"] == "ppl")]
            ppl = _latest(ppl, ["context_tokens"]).sort_values("context_tokens")
            for r in ppl.to_dict("records"):
                if _isnum(r["ppl_delta"]):
                    bits.append(f"ppl Δ {fmt_ppl_delta(r['ppl_delta'])} at {ctx_label(r['context_tokens'])}")
            quality = "; ".join(bits) if bits else "not audited"
        # Decode vs fp16 (reference batch)
        decode = []
        bb = g.bench[(g.bench["kv_cache_mode"] == m) & (g.bench["batch"] == g.ref_batch)] if len(g.bench) else g.bench
        for ctx in bench_ctxs:
            r = bb[bb["context_tokens"] == ctx] if len(bb) else bb
            if not len(r):
                continue
            r = r.sort_values("decode_tok_s", na_position="first").iloc[-1]
            if r["status"] in FAIL_STATUSES or not _isnum(r["decode_tok_s"]):
                decode.append(f"{ctx_label(ctx)} {r['status'] or 'no data'}")
            elif m == "fp16":
                decode.append(f"{ctx_label(ctx)} {fmt_tok(r['decode_tok_s'])} tok/s")
            else:
                decode.append(f"{ctx_label(ctx)} {fmt_ratio(r['_ratio'])}")
        decode_text = ", ".join(decode) if decode else "not benchmarked"
        if decode and m == "fp16":
            decode_text = "baseline: " + decode_text
        # Peak memory at the largest context this mode completed
        peak = "—"
        okb = g.bench_ok(g.ref_batch)
        okm = okb[(okb["kv_cache_mode"] == m) & okb["peak_mem_gb"].notna()] if len(okb) else okb
        if len(okm):
            r = okm.sort_values(["context_tokens", "decode_tok_s"]).iloc[-1]
            peak = f"{fmt_gb(r['peak_mem_gb'])} GB at {ctx_label(r['context_tokens'])}"
            if m != "fp16" and _isnum(r["_peak_delta_pct"]):
                peak += f" ({r['_peak_delta_pct']:+.1f}% vs fp16)"
            if bench_ctxs and r["context_tokens"] < bench_ctxs[-1]:
                peak += f"; no result at {ctx_label(bench_ctxs[-1])}"
        # Notes: those of the mode's greedy rows (its benchmark rows where it has none), and the
        # messages of rows that raised an error, without what other sections already say.
        note_recs = [r for r in recs if r["_kind"] == "audit" and r["check"] == "greedy"]
        if not note_recs:
            note_recs = [r for r in recs if r["_kind"] == "bench"]
        note_recs += [r for r in recs if r["status"] == "error" and r not in note_recs]
        notes = mode_notes(note_recs)
        eff = _unique(r["effective_mode"] for r in recs if fell_back(m, r["effective_mode"]))
        if eff and not any(n.startswith("runs as ") for n in notes):
            notes.insert(0, f"ran as {'/'.join(eff)} (fallback)")
        # (not where a note from the CSV says it already, e.g. the loader's "synthetic: random weights")
        if any(r.get("synthetic") is True for r in recs) and not any("synthetic" in n.lower() for n in notes):
            notes.append("synthetic model")
        rows.append([f"`{m}`", f"`{cli_flag(m)}`", runs, quality, decode_text, peak, notes_cell(notes)])
    # The speed and memory columns are the reference batch's: named in the header where it is not the only one
    # (the benchmark table has every batch).
    batches = {x for x in g.bench["batch"] if _isnum(x)} if len(g.bench) else set()
    at = f", batch {fmt_int(g.ref_batch)}" if g.ref_batch is not None and (len(batches) > 1 or g.ref_batch != 1) else ""
    head = ["Mode", "CLI flag", "Runs", "Output quality vs fp16", f"Decode vs fp16{at}", f"Peak memory{at}", "Notes"]
    if not len(g.bench):  # an audit alone: no speed or memory columns of "not benchmarked" on every row
        head, rows = head[:4] + head[6:], [r[:4] + r[6:] for r in rows]
    return md_table(head, rows)


# The audit's long-context checks, summarised per mode beside the status matrix.
LONG_CHECKS = ("max_kv", "prefix_reuse", "niah")
# A degenerate row's reason, as one word or two: "repeated 4-grams 85% (loop: ...)" -> "loop".
_DEGENERATE_TAGS = (("repeated", "loop"), ("echo", "echo"), ("distinct", "low variety"))


def _degenerate_tag(reason) -> str:
    text = _s(reason)
    for key, tag in _DEGENERATE_TAGS:
        if key in text.lower():
            return tag
    return _clip(text, 24)


def _short_verdict(rec: dict) -> str:
    """A row's verdict for a compact cell: "identical", "near-tie@12", "**degenerate (loop)**", "oom"."""
    q = assess(rec)
    if q.kind == "degenerate":
        tag = _degenerate_tag(rec.get("degenerate_reason"))
        return "**degenerate" + (f" ({tag})" if tag else "") + "**"
    if q.kind in ("ok", "unknown") and rec.get("degenerate") is False:
        return "ok"
    return q.short


def _per_context(items: list[tuple[float, str]]) -> str:
    """ "2K, 8K identical · 32K diverged@3": contexts in order, neighbours with the same text merged."""
    runs: list[tuple[list[str], str]] = []
    for ctx, text in sorted(items, key=lambda t: t[0] if _isnum(t[0]) else -1):
        if runs and runs[-1][1] == text:
            runs[-1][0].append(ctx_label(ctx))
        else:
            runs.append(([ctx_label(ctx)], text))
    return " · ".join(f"{', '.join(ctxs)} {text}" for ctxs, text in runs)


def _long_max_kv(rows: pd.DataFrame, n, k) -> str:
    sel = rows["max_kv_size"].isna() if not _isnum(n) else rows["max_kv_size"] == n
    sel &= rows["keep"].isna() if not _isnum(k) else rows["keep"] == k
    items = []
    for rec in rows[sel].to_dict("records"):
        # fp16 under a cap is compared with fp16's full cache, so it is no reference here.
        rec = {**rec, "kv_cache_mode": "" if rec["kv_cache_mode"] == "fp16" else rec["kv_cache_mode"]}
        items.append((rec["context_tokens"], _short_verdict(rec)))
    return _per_context(items)


def _long_prefix(rows: pd.DataFrame) -> str:
    items, cached = [], []
    for r in rows.sort_values("context_tokens").to_dict("records"):
        v, fd = _norm_verdict(r["verdict"]), r["first_divergence"]
        if r["status"] in FAIL_STATUSES:
            text = r["status"]
        elif r["identical_to_fp16"] is True or v == "identical":
            text = "identical"
        elif r["identical_to_fp16"] is False or v.startswith("diverg"):
            text = "diverged" + (f"@{int(fd)}" if _isnum(fd) else "")
        else:
            text = v or r["status"] or "—"
        items.append((r["context_tokens"], text))
        if _isnum(r["cached_tokens"]):
            cached.append(fmt_int(r["cached_tokens"]))
    return _per_context(items) + (f" ({'/'.join(cached)} cached)" if cached else "")


def _long_niah(rows: pd.DataFrame) -> str:
    # Every row is a trial, as in the needle section's table.
    items = []
    for ctx in sorted({x for x in rows["context_tokens"] if _isnum(x)}):
        sub = rows[rows["context_tokens"] == ctx]
        hits = sub["niah_hit"].dropna()
        failed = _unique(st for st in sub.loc[sub["niah_hit"].isna(), "status"] if st in FAIL_STATUSES)
        if len(hits):
            text = f"{int((hits > 0).sum())}/{len(hits)}" + (f" (+{'/'.join(failed)})" if failed else "")
        else:
            text = "/".join(failed) or "—"
        items.append((ctx, text))
    return _per_context(items)


def _long_context_matrix(g: Group) -> str:
    """One row per audited mode: the bounded-cache, prefix-reuse and NIAH checks per context ('' if none ran)."""
    a = g.audit
    if a.empty or not a["check"].isin(LONG_CHECKS).any():
        return ""
    max_kv = _latest(a[a["check"] == "max_kv"], ["kv_cache_mode", "context_tokens", "max_kv_size", "keep"])
    prefix = _latest(a[a["check"] == "prefix_reuse"], ["kv_cache_mode", "context_tokens"])
    niah = a[a["check"] == "niah"]
    caps = sorted(
        {tuple(t) for t in max_kv[["max_kv_size", "keep"]].itertuples(index=False, name=None)},
        key=lambda t: (t[0] if _isnum(t[0]) else -1, -(t[1] if _isnum(t[1]) else -1)),
    )
    headers = ["Mode", *[f"--max-kv-size {fmt_int(n)}, keep {fmt_int(k)}" for n, k in caps]]
    headers += ["Prefix reuse"] if len(prefix) else []
    headers += ["NIAH hits"] if len(niah) else []
    audited = set(a["kv_cache_mode"])
    table = []
    for m in g.modes:
        if m not in audited:
            continue
        cells = [_long_max_kv(max_kv[max_kv["kv_cache_mode"] == m], n, k) for n, k in caps]
        if len(prefix):
            cells.append(_long_prefix(prefix[prefix["kv_cache_mode"] == m]))
        if len(niah):
            cells.append(_long_niah(niah[niah["kv_cache_mode"] == m]))
        table.append([f"`{m}`", *[c or "—" for c in cells]])
    checks = [  # only the checks that ran
        *(["output with a bounded cache vs fp16 (`keep` sink tokens kept)"] if caps else []),
        *(["generation from a reused prefix vs a fresh prefill"] if len(prefix) else []),
        *(["needles found / trials"] if len(niah) else []),
    ]
    detail = "The sections below have the detail." if len(checks) > 1 else "The section below has the detail."
    intro = f"Per context: {join_list(checks)}. {detail}"
    return intro + "\n\n" + md_table(headers, table)


def section_quality_matrix(groups: list[Group]) -> str:
    out = ["## Quality per context", ""]
    any_rows = False
    for g in groups:
        if g.greedy.empty:
            continue
        any_rows = True
        if g.multi:
            out.append(g.heading())
        ctxs = g.contexts(g.greedy)
        rows = []
        for m in g.modes:
            if not any((m, c) in g.quality for c in ctxs):
                continue
            cells = []
            for c in ctxs:
                q = g.quality.get((m, c))
                if q is None:
                    cells.append("")
                    continue
                metrics = []
                if _isnum(q.match) and q.kind not in ("reference", "identical"):
                    metrics.append(f"tokens {fmt_pct(q.match)}")
                if _isnum(q.top1):
                    metrics.append(f"top-1 {fmt_pct(q.top1)}")
                if _isnum(q.kl):
                    metrics.append(f"KL {fmt_kl(q.kl)}")
                cells.append(" · ".join([q.short, *metrics]))
            rows.append([f"`{m}`", *cells])
        gen = _unique(fmt_int(x) for x in g.greedy["gen_tokens"] if _isnum(x))
        n = f"the {'/'.join(gen)} greedy tokens" if gen else "the greedy tokens"
        out.append(
            f"Cell: verdict · tokens: share of {n} equal to fp16's, position by position (after a first "
            "difference the two texts drift apart, so it falls fast; not shown where identical) · top-1 "
            "agreement, teacher-forced on fp16's tokens · KL divergence vs fp16 (greedy check)."
        )
        out.append("")
        out.append(md_table(["Mode", *[ctx_label(c) for c in ctxs]], rows))
        out.append("")
    if not any_rows:
        out.append("No greedy audit rows.")
    return "\n".join(out).rstrip()


def section_checks(groups: list[Group]) -> str:
    """One section per non-greedy check type present."""
    checks = []
    for g in groups:
        checks += [c for c in g.audit["check"] if c and c != "greedy" and c not in checks]
    order = ["ppl", "max_kv", "prefix_reuse", "niah", "kernel"]
    checks = sorted(set(checks), key=lambda c: (order.index(c) if c in order else len(order), c))
    out = []
    for check in checks:
        title = {
            "ppl": "Perplexity",
            "max_kv": "Sliding window (--max-kv-size)",
            "prefix_reuse": "Prefix reuse",
            "niah": "Needle in a haystack",
            "kernel": "Kernel checks",
        }.get(check, f"Check: {check}")
        out += [f"## {title}", ""]
        for g in groups:
            rows = g.audit[g.audit["check"] == check]
            if rows.empty:
                continue
            if g.multi:
                out.append(g.heading())
            fn = {"ppl": _check_ppl, "max_kv": _check_max_kv, "prefix_reuse": _check_prefix, "niah": _check_niah}
            out.append(fn.get(check, _check_generic)(g, rows))
            out.append("")
    return "\n".join(out).rstrip()


def _check_ppl(g: Group, rows: pd.DataFrame) -> str:
    rows = _latest(rows, ["kv_cache_mode", "context_tokens"])
    ctxs = g.contexts(rows)
    table = []
    for m in order_modes(rows["kv_cache_mode"]):
        cells = []
        for c in ctxs:
            r = rows[(rows["kv_cache_mode"] == m) & (rows["context_tokens"] == c)]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[-1]
            if r["status"] in FAIL_STATUSES:
                cells.append(r["status"])
            elif m == "fp16" or not _isnum(r["ppl_delta"]):
                cells.append(fmt_ppl(r["ppl"]))
            else:
                cells.append(f"{fmt_ppl(r['ppl'])} (Δ {fmt_ppl_delta(r['ppl_delta'])})")
        table.append([f"`{m}`", *cells])
    intro = (
        "Perplexity on the bundled text; Δ is the relative change vs fp16 at the same context "
        "(ppl / ppl_fp16 − 1, as written by the audit), in percent."
    )
    windows = _unique(m.group(1) for n in rows["notes"] for m in [re.search(r"(\d+) window", _s(n))] if m)
    if windows == ["1"]:  # kvbench.quality writes "N window(s) of T tokens"
        intro += (
            " One text window per context (`--ppl-windows 1`): read a Δ of a few tenths of a percent as "
            "unresolved rather than as a difference (no spread across windows to judge it by); more windows "
            "narrow it."
        )
    elif windows:
        intro += f" Over {'/'.join(windows)} text windows per context."
    intro += "\n\n"
    return intro + md_table(["Mode", *[ctx_label(c) for c in ctxs]], table, "l" + "r" * len(ctxs))


def _check_max_kv(g: Group, rows: pd.DataFrame) -> str:
    keys = ["context_tokens", "max_kv_size", "keep"]
    rows = _latest(rows, ["kv_cache_mode", *keys])
    combos = sorted(
        {tuple(k) for k in rows[keys].itertuples(index=False, name=None)},
        key=lambda t: tuple(x if _isnum(x) else -1 for x in t),
    )
    headers = [
        f"{ctx_label(c)}, max {fmt_int(n)}, keep {fmt_int(k)}"
        if len({t[0] for t in combos}) > 1
        else f"max {fmt_int(n)}, keep {fmt_int(k)}"
        for c, n, k in combos
    ]
    table = []
    for m in order_modes(rows["kv_cache_mode"]):
        cells = []
        for c, n, k in combos:
            sel = rows["kv_cache_mode"] == m
            for col, v in zip(keys, (c, n, k), strict=True):
                sel &= rows[col].isna() if not _isnum(v) else rows[col] == v
            r = rows[sel]
            if r.empty:
                cells.append("")
                continue
            rec = r.iloc[-1].to_dict()
            q = assess({**rec, "kv_cache_mode": "" if m == "fp16" else m})
            text = q.text
            if q.kind in ("ok", "unknown") and rec.get("degenerate") is False:
                text = "not degenerate"
            cells.append(text)
        table.append([f"`{m}`", *cells])
    return "Output with a bounded cache (front trim keeping `keep` sink tokens), vs fp16.\n\n" + md_table(
        ["Mode", *headers], table
    )


def _check_prefix(g: Group, rows: pd.DataFrame) -> str:
    rows = _latest(rows, ["kv_cache_mode", "context_tokens"])
    rows = rows.assign(_mk=rows["kv_cache_mode"].map(mode_key)).sort_values(["_mk", "context_tokens"])
    recs = rows.to_dict("records")
    shared, notes = hoist_notes(recs)
    table = []
    for r, note in zip(recs, notes, strict=True):
        v = _norm_verdict(r["verdict"])
        if r["identical_to_fp16"] is True or v == "identical":
            same = "yes"
        elif r["identical_to_fp16"] is False or v:
            same = "no" + (f" ({r['verdict']})" if v and v != "identical" else "")
        else:
            same = "—"
        table.append(
            [
                f"`{r['kv_cache_mode']}`",
                ctx_label(r["context_tokens"]),
                same,
                fmt_int(r["cached_tokens"]),
                r["status"],
                note,
            ]
        )
    intro = "Generation from a reused cached prefix compared with a fresh prefill."
    return _intro(intro, shared) + _table_notes_last(
        ["Mode", "Context", "Identical?", "Cached tokens", "Status", "Notes"], table, "llcrll"
    )


def _niah_grid(rows: pd.DataFrame):
    ctxs = sorted({x for x in rows["context_tokens"] if _isnum(x)})
    depths = sorted({x for x in rows["niah_depth"] if _isnum(x)})
    grids = {}
    for m in order_modes(rows["kv_cache_mode"]):
        sub = rows[rows["kv_cache_mode"] == m]
        hits = np.full((len(depths), len(ctxs)), np.nan)
        counts = np.zeros((len(depths), len(ctxs)), dtype=int)
        for i, d in enumerate(depths):
            for j, c in enumerate(ctxs):
                cellrows = sub[(sub["niah_depth"] == d) & (sub["context_tokens"] == c)]["niah_hit"].dropna()
                if len(cellrows):
                    hits[i, j] = float((cellrows > 0).sum())
                    counts[i, j] = len(cellrows)
        grids[m] = (hits, counts)
    return ctxs, depths, grids


def _check_niah(g: Group, rows: pd.DataFrame) -> str:
    ctxs, depths, grids = _niah_grid(rows)
    table = []
    for m, (hits, counts) in grids.items():
        for i, d in enumerate(depths):
            cells = [f"{int(hits[i, j])}/{counts[i, j]}" if counts[i, j] else "" for j in range(len(ctxs))]
            table.append([f"`{m}`", fmt_depth(d), *cells])
    total = {m: (np.nansum(h), c.sum()) for m, (h, c) in grids.items()}
    summary = ", ".join(f"{m} {int(h)}/{int(n)}" for m, (h, n) in total.items() if n)
    if not summary:  # every trial failed or was skipped: no table of empty cells
        notes = list(dict.fromkeys(p for t in rows["notes"] for p in note_parts(t)))
        why = "/".join(_unique(rows["status"])) + (f": {_clip('; '.join(notes), 200)}" if notes else "")
        return f"No needle trial completed ({why or 'no status'})."
    intro = f"Needle retrieved (hits / trials) by needle depth and context. Overall: {summary}."
    if "fp16" in grids:  # where fp16 itself finds nothing, every mode matching it says nothing about the cache
        hits, counts = grids["fp16"]
        blind = [ctx_label(c) for j, c in enumerate(ctxs) if counts[:, j].sum() and np.nansum(hits[:, j]) == 0]
        if blind:
            intro += (
                f" fp16 itself found no needle at {join_list(blind)}: the model cannot do the task there, so the "
                "check cannot tell the modes apart at that context."
            )
    return intro + "\n\n" + md_table(["Mode", "Depth", *[ctx_label(c) for c in ctxs]], table, "ll" + "r" * len(ctxs))


def _check_generic(g: Group, rows: pd.DataFrame) -> str:
    rows = rows.assign(_mk=rows["kv_cache_mode"].map(mode_key)).sort_values(["_mk", "context_tokens"], kind="stable")
    if set(rows["check"]) == {"kernel"}:
        return _check_kernel(rows)
    recs = rows.to_dict("records")
    shared, notes = hoist_notes(recs)
    table = []
    for r, note in zip(recs, notes, strict=True):
        agrees = {True: "yes", False: "no"}.get(r.get("kernel_agrees"), "—")
        table.append(
            [
                f"`{r['kv_cache_mode']}`",
                ctx_label(r["context_tokens"]),
                r["status"],
                r["verdict"],
                r["kernel"],
                agrees,
                note,
            ]
        )
    return _intro("", shared) + _table_notes_last(
        ["Mode", "Context", "Status", "Verdict", "Kernel", "Agrees with reference", "Notes"], table
    )


def _check_kernel(rows: pd.DataFrame) -> str:
    recs = rows.to_dict("records")
    shared, notes = hoist_notes(recs)
    table, older = [], []
    flipped = False  # a row that agrees by KL although an argmax flipped at a clearer decision
    yard = any(_isnum(r.get("kl_kernel_fp32")) for r in recs)  # files written before the yardstick have none
    for r, note in zip(recs, notes, strict=True):
        kl, top1, flag = r.get("kl_div"), r.get("top1_agreement"), r.get("kernel_agrees")
        if r["status"] in ("error", "oom", "skipped") or not _isnum(kl):
            agrees = r["status"]
        else:  # the audit's own call where the file has it (files without it: their KLs by the same rule)
            by_kl = kernel_paths_agree(kl, r.get("kl_ref_fp32"), r.get("kl_kernel_fp32"))
            flag = bool(flag) if isinstance(flag, (bool, np.bool_)) else by_kl
            agrees = "yes" if flag else "**no**"
            if flag != by_kl:
                older.append(f"`{r['kv_cache_mode']}` at {ctx_label(r['context_tokens'])}")
        verdict = _s(r.get("verdict"))
        if agrees == "yes" and verdict == "diverged":  # close distributions, yet a clear decision flipped
            agrees = "yes*"
            flipped = True
        table.append(
            [
                f"`{r['kv_cache_mode']}`",
                ctx_label(r["context_tokens"]),
                fmt_pct(top1) if _isnum(top1) else "—",
                f"{kl:.3g}" if _isnum(kl) else "—",
                *([_fp32_pair(r)] if yard else []),
                agrees,
                "**diverged**" if verdict == "diverged" else verdict or "—",
                note,
            ]
        )
    intro = (
        "Each mode decoded through the fused Triton path and through the PyTorch reference path, "
        f"teacher-forced on fp16's tokens. They agree when the KL between them is at most {KERNEL_KL_AGREE} "
        "nats: both round in the compute dtype, each its own way (kernels, projections, fused ops, the order "
        "of sums), and the model amplifies that most at long context and in the coarsest modes; fp16 mode's "
        "own gap is the noise floor."
    )
    if yard:
        intro += (
            " Where the audit also ran the mode in float32 (the reference path, model and cache in float32: "
            "the yardstick), they also agree when the Triton path is at most "
            f'{KERNEL_FP32_FACTOR:g}x as far from it as the reference path is (the "KL from float32" column, '
            "reference / Triton)."
        )
    intro += (
        " Argmax flips: none (identical), only where the reference's top two logits were within "
        "the near-tie margin (near-tie), or also at a clearer decision (diverged)."
    )
    if flipped:
        intro += (
            " yes*: the paths agree by KL, yet an argmax flipped where the reference's top two logits were "
            "further apart than the near-tie margin: their distributions are close, but a greedy decode "
            "through the two would part there."
        )
    if older:
        intro += (
            f" The audit's own call, written by an earlier rule (any flip at a clearer decision disagreed), "
            f"is shown where it differs from the KL's: {join_list(older)}."
        )
    return _intro(intro, shared) + _table_notes_last(
        [
            "Mode",
            "Context",
            "Top-1 agreement (Triton vs reference)",
            "KL (nats)",
            *(["KL from float32 (reference / Triton)"] if yard else []),
            "Agree (by KL)",
            "Argmax flips",
            "Notes",
        ],
        table,
    )


def _fp32_pair(r: dict) -> str:
    a, b = r.get("kl_ref_fp32"), r.get("kl_kernel_fp32")
    return f"{a:.3g} / {b:.3g}" if _isnum(a) and _isnum(b) else "—"


def _intro(text: str, shared: str) -> str:
    """A table's introduction followed by the notes taken out of its rows, then a blank line."""
    text = " ".join(t for t in (text, shared) if t)
    return text + "\n\n" if text else ""


def _table_notes_last(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """md_table, without the last ("Notes") column where no row has one left."""
    if rows and not any(_s(r[-1]) for r in rows):
        headers, rows, align = headers[:-1], [r[:-1] for r in rows], align[:-1] if align else None
    return md_table(headers, rows, align)


def section_statuses(groups: list[Group]) -> str:
    counts: dict[str, int] = {}  # of the rows the report shows (duplicates dropped)
    where: dict[str, dict[str, int]] = {}  # status -> the check (or benchmark part) its rows come from -> count
    fp16_own: dict[str, int] = {}  # failed verdicts on fp16's own rows (a check that fp16 fails too)
    for g in groups:
        for kind, df in (("audit", g.audit), ("benchmark", g.bench_main), ("capacity search", g.capacity)):
            for r in df.to_dict("records"):
                st = r["status"]
                if not st:
                    continue
                counts[st] = counts.get(st, 0) + 1
                part = (r.get("check") or "greedy") if kind == "audit" else kind
                where.setdefault(st, {})[part] = where.setdefault(st, {}).get(part, 0) + 1
                if st in ("degenerate", "diverged") and r["kv_cache_mode"] == "fp16":
                    fp16_own[st] = fp16_own.get(st, 0) + 1
    out = ["## What the statuses mean", ""]
    present = [s for s in STATUSES if s in counts] + sorted(s for s in counts if s not in STATUSES)
    for st in present:
        meaning = STATUS_MEANINGS.get(st, "not a standard kvbench status; see the rows' notes.")
        n = counts[st]
        parts = where.get(st, {})
        src = ""
        if st in ("degenerate", "diverged", "error") and set(parts) != {"greedy"}:  # which checks failed
            src = ": " + ", ".join(f"{k} {parts[k]}" for k in sorted(parts, key=lambda k: -parts[k]))
        if fp16_own.get(st):
            src += f"; {fp16_own[st]} on fp16 itself, which fails that check too"
        out.append(f"- `{st}` ({n} row{'s' if n != 1 else ''}{src}): {meaning}")
    if not present:
        out.append("- No row carries a status.")
    absent = [s for s in STATUSES if s not in counts]
    if absent:
        out.append(f"- Not present here: {', '.join(f'`{s}`' for s in absent)}.")
    out += ["", "Quality verdicts: " + VERDICT_MEANINGS]
    return "\n".join(out)


PEAK_KINDS = {
    "cuda": "the CUDA allocator's high-water mark (`torch.cuda.max_memory_allocated`, reset at the start of each cell)",
    "rss": "the process' maximum resident set size on the CPU (includes Python, weights and everything else)",
}


def _peak_kind_text(kinds: list[str]) -> str:
    out = []
    for k in kinds:
        low = k.lower()
        if "cuda" in low or "alloc" in low:
            out.append(f"`{k}`: {PEAK_KINDS['cuda']}")
        elif "rss" in low or "cpu" in low:
            out.append(f"`{k}`: {PEAK_KINDS['rss']}")
        else:
            out.append(f"`{k}`")
    return "; ".join(out)


def section_bench(groups: list[Group]) -> str:
    out = ["## Benchmark", ""]
    if all(g.bench_all.empty for g in groups):
        out.append("No benchmark rows (no `bench.csv`).")
        return "\n".join(out)
    for g in groups:
        if g.bench_all.empty:
            continue
        if g.multi:
            out.append(g.heading())
        b = g.bench
        if b.empty:
            out.append("Only capacity-search rows; see Capacity below.")
            out.append("")
            continue
        out.append(_bench_method_line(g))
        out.append("")
        show_kernel = any(b["kernel"] != "") or any(v is True for v in b["cuda_graphs"])
        b = b.assign(_mk=b["kv_cache_mode"].map(mode_key)).sort_values(
            ["context_tokens", "batch", "_mk", "kernel"], kind="stable"
        )
        rows = []
        computed = noisy = False
        recs = b.to_dict("records")
        shared, row_notes = hoist_notes(recs)
        if shared:
            out += [shared, ""]
        timed = [r for r in recs if r["status"] not in FAIL_STATUSES and _isnum(r["decode_tok_s"])]
        one_repeat = plural(1, "repeat")
        if timed and all(r["_noise"] == one_repeat for r in timed):
            # said once rather than as a † and a note on every row
            out += [
                "Every cell ran a single repeat: no spread to judge a timing by; re-run with `--repeats 3` or more.",
                "",
            ]
            for r in recs:
                r["_noise"] = r["_fp16_noise"] = ""
        for r, row_note in zip(recs, row_notes, strict=True):
            mode = f"`{r['kv_cache_mode']}`"
            if fell_back(r["kv_cache_mode"], r["effective_mode"]):
                mode += f" (as {r['effective_mode']})"
            base = [ctx_label(r["context_tokens"]), fmt_int(r["batch"]), mode]
            kern = []
            if show_kernel:
                k = r["kernel"] or "—"
                if r["cuda_graphs"] is True:
                    k += ", graphs"
                kern = [k]
            if r["status"] in FAIL_STATUSES or not _isnum(r["decode_tok_s"]):
                status = f"**{r['status'] or 'no data'}**"
                rows.append([*base, *kern, status, "—", "—", "—", "—", "—", row_note])
                continue
            tok = fmt_tok(r["decode_tok_s"])
            if _isnum(r["decode_tok_s_min"]) and _isnum(r["decode_tok_s_max"]):
                tok += f" ({fmt_tok(r['decode_tok_s_min'])}–{fmt_tok(r['decode_tok_s_max'])})"
            ratio = fmt_ratio(r["_ratio"])
            if not _isnum(r["_ratio"]) and r["_fp16_status"]:
                ratio = f"— (fp16 {r['_fp16_status']})"
            if r["_ratio_computed"]:
                ratio += "*"
                computed = True
            if r["_noise"]:
                tok += " †"
                noisy = True
            if _isnum(r["_ratio"]) and (r["_noise"] or r["_fp16_noise"]):
                ratio += " †"  # the mode's or fp16's timing is noisy
                noisy = True
            if r["kv_cache_mode"] == "fp16" and r["effective_mode"] not in ("", "fp16"):
                delta = "—"
            elif r["kv_cache_mode"] == "fp16":
                delta = "baseline"
            else:
                delta = fmt_signed_gb(r["_peak_delta"])
                if _isnum(r["_peak_delta_pct"]):
                    delta += f" ({r['_peak_delta_pct']:+.1f}%)"
            notes = row_note
            if r["status"] not in ("ok", ""):
                notes = f"{r['status']}" + (f": {notes}" if notes else "")
            if r["_noise"]:
                notes = f"noisy timing: {r['_noise']}" + (f"; {notes}" if notes else "")
            rows.append(
                [
                    *base,
                    *kern,
                    tok,
                    ratio,
                    fmt_gb(r["peak_mem_gb"]),
                    delta,
                    fmt_pct(r["roofline_frac"]),
                    fmt_bytes(r["kv_bytes_per_token"]),
                    notes,
                ]
            )
        headers = [
            "Context",
            "Batch",
            "Mode",
            *(["Kernel"] if show_kernel else []),
            "Decode tok/s, summed over the batch (median, min–max)",
            "Ratio vs fp16",
            "Peak GB",
            "Peak Δ vs fp16 (GB, %)",
            "Roofline fraction",
            "KV bytes/token",
            "Notes",
        ]
        align = "rrl" + ("l" if show_kernel else "") + "rrrrrrl"
        out.append(_table_notes_last(headers, rows, align))
        if computed:
            out += ["", "\\* ratio computed by the report from the medians (the row had no `decode_ratio_vs_fp16`)."]
        if noisy:
            out += [
                "",
                f"† noisy timing: the cell ran a single repeat, or its repeats' min–max spread exceeds "
                f"{NOISY_SPREAD:.0%} of the median (the Notes say which); a ratio marked † rests on such a cell "
                "(the mode's or fp16's) and is rough: re-run with more `--repeats`.",
            ]
        out.append("")
    caps = [g for g in groups if not g.capacity.empty]
    if caps:
        out += ["## Capacity", ""]
        for g in caps:
            if g.multi:
                out.append(g.heading())
            out.append(_capacity_table(g))
            out.append("")
    return "\n".join(out).rstrip()


def _bench_method_line(g: Group) -> str:
    b = g.bench
    bits = []
    reps = sorted({int(x) for x in b["repeats"] if _isnum(x)})
    gen = sorted({int(x) for x in b["gen_tokens"] if _isnum(x)})
    warm = sorted({int(x) for x in b["warmup"] if _isnum(x)})
    # kvbench.bench (and kvbench.peers): each repeat times `gen` steps of the whole batch, batch * gen / seconds
    desc = (
        "Decode tok/s is summed over the batch (batch × timed tokens / seconds: every sequence's tokens count), "
        "the median over " + (plural("/".join(map(str, reps)), "repeat") if reps else "the repeats")
    )
    if gen:
        desc += f" of {plural('/'.join(map(str, gen)), 'timed token')}"
    if warm:
        desc += f" after {plural('/'.join(map(str, warm)), 'warm-up token')}"
    bits.append(desc + "; ratios are against fp16 at the same context and batch.")
    if (b["kernel"] == "triton").any():
        bits.append(
            "fp16 here is kvbench's own Triton attention (a weaker fp16 would flatter every ratio): "
            "`scripts/bench_kernels.py` times it against torch SDPA on the same shapes, on a GPU."
        )
    kinds = _unique(b["peak_mem_kind"])
    if kinds:
        bits.append(f"Peak memory is {_peak_kind_text(kinds)}.")
    bw = sorted({round(x) for x in b["bandwidth_gbs"] if _isnum(x)})
    wb = sorted({x for x in b["weight_bytes"] if _isnum(x)})
    if bw or wb:
        s = "Roofline fraction = floor time / measured step time, floor = (weights + batch × KV bytes) / bandwidth"
        if bw:
            s += f"; measured bandwidth {'/'.join(f'{x:,} GB/s' for x in bw)}"
        if wb:
            s += f"; weights {'/'.join(fmt_weight_bytes(x) for x in wb)}"
        bits.append(s + ".")
        over = b[b["roofline_frac"] > 1.0]
        if len(over):
            # kvbench.bench measures the bandwidth with a device-to-device copy (a read and a write per byte)
            bits.append(
                f"{plural(len(over), 'row')} read{'s' if len(over) == 1 else ''} above 100% (up to "
                f"{fmt_pct(over['roofline_frac'].max())}): the bandwidth is a copy's, which writes every byte it "
                "reads, and a decode step that mostly reads can stream faster than that; the fraction compares "
                "modes within a run, it is not a physical bound."
            )
    return " ".join(bits)


def _estimated(df: pd.DataFrame) -> pd.Series:
    """Capacity rows that were computed, not run: off CUDA the search sizes the buffers against the budget
    instead of allocating them (kvbench.bench: the note says "estimated from buffer sizes, not allocated",
    its fitting rows' peak_mem_kind is "cpu_estimate")."""
    if df.empty:
        return pd.Series(dtype=bool, index=df.index)
    return df["notes"].str.contains("not allocated", case=False, regex=False) | (df["peak_mem_kind"] == "cpu_estimate")


def _capacity_speed(c: pd.DataFrame) -> dict:
    """(mode, context) -> the timed row at the largest timed batch of a capacity search (`--capacity-speed`)."""
    ok = c[c["status"].isin(["ok", ""]) & c["batch"].notna() & c["decode_tok_s"].map(_isnum)]
    return {k: sub.sort_values("batch").iloc[-1] for k, sub in ok.groupby(["kv_cache_mode", "context_tokens"])}


def _capacity_table(g: Group) -> str:
    c = g.capacity
    rows = []
    c = c.assign(_mk=c["kv_cache_mode"].map(mode_key), _est=_estimated(c))
    speed = _capacity_speed(c)
    timed_any = bool(speed)
    for (_mk, mode, ctx), sub in c.groupby(["_mk", "kv_cache_mode", "context_tokens"], sort=True, dropna=False):
        ok = sub[sub["status"].isin(["ok", ""]) & sub["batch"].notna()]
        best = ok.sort_values("batch").iloc[-1] if len(ok) else None
        fail = sub[sub["status"].isin(FAIL_STATUSES) & sub["batch"].notna()]
        if best is not None:
            fail = fail[fail["batch"] > best["batch"]]
        first_fail = fail.sort_values("batch").iloc[0] if len(fail) else None
        if sub["_est"].any():  # nothing ran: a batch "fits" or is over the budget by arithmetic
            est = " (estimated, not allocated)"
            max_batch = fmt_int(best["batch"]) + est if best is not None else "none fits (estimated)"
            failing = f"{fmt_int(first_fail['batch'])} (over budget, estimated)" if first_fail is not None else "—"
        else:
            max_batch = fmt_int(best["batch"]) if best is not None else "none"
            failing = f"{fmt_int(first_fail['batch'])} ({first_fail['status']})" if first_fail is not None else "—"
        peak = fmt_gb(best["peak_mem_gb"]) if best is not None else "—"
        row = [f"`{mode}`", ctx_label(ctx), max_batch, peak, failing]
        if timed_any:
            t, base = speed.get((mode, ctx)), speed.get(("fp16", ctx))
            tok = "—" if t is None else fmt_tok(t["decode_tok_s"])
            if t is not None and best is not None and t["batch"] != best["batch"]:
                tok += f" (batch {fmt_int(t['batch'])})"
            vs = "—"
            if t is not None and base is not None:
                vs = "1.00x" if mode == "fp16" else fmt_ratio(t["decode_tok_s"] / base["decode_tok_s"])
            row += [tok, vs]
        rows.append(row)
    intro = []
    if not c["_est"].all():
        intro.append("Largest batch that ran (status ok) in the capacity search.")
    if timed_any:
        intro.append(
            "**Decode tok/s at max** is the decode at that batch, timed as a benchmark cell is (the cache filled "
            "with random K/V, warm-up, repeats; `--capacity-speed`), summed over the batch: what one GPU serves "
            "at that context when each mode holds as many sequences as fit. A batch that fit the search's two "
            "untimed steps but not a timed run (a filled cache, CUDA graphs, or a peak past `--memory-budget-gb`) "
            "is timed at the next smaller batch that runs (up to three tried), named in brackets; where none ran, "
            "the row's notes in the CSV say why. Peak GB is the search's, as in untimed rows. **vs fp16 at its "
            "max** divides it by fp16's at fp16's own largest batch: the throughput a smaller cache buys, batch "
            "size included."
        )
    budgets = _unique(m.group(1) for n in c["notes"] for m in [re.search(r"fits in ([\d.]+ GB)", _s(n))] if m)
    if budgets:
        intro.append(
            f"The search's budget was {' / '.join(budgets)}: the memory free once the weights were loaded (or `--memory-budget-gb`, if "
            "smaller). "
            "Peak GB counts everything the process held, weights included, so it reads above the budget."
        )
    if c["_est"].any():
        intro.append(
            "Rows marked estimated come from a search off the GPU, which allocates nothing (a CPU allocation does "
            "not fail; the OS kills the process instead): their batches are KV buffer sizes checked against the "
            "memory budget, their peak GB those sizes plus the weights, not a measured peak."
        )
    return (
        " ".join(intro)
        + "\n\n"
        + md_table(
            ["Mode", "Context", "Max batch", "Peak GB at max", "First failing batch"]
            + (["Decode tok/s at max", "vs fp16 at its max"] if timed_any else []),
            rows,
            "llrrr" + ("rr" if timed_any else ""),
        )
    )


# ---------------------------------------------------------------------------
# Peers: transformers' own caches beside kvbench's modes

PEERS_INTRO = (
    "Peers are Hugging Face transformers' own KV caches (`hf:*` rows, run with `--modes hf:...`). Each runs "
    "transformers' own decode loop (greedy: the model's forward with the cache object) on a transformers model "
    "holding the same weights as kvbench's engine, on the same prompt. Their output is judged against kvbench's "
    "`fp16` like any mode (greedy check) and their decode speed is measured like any mode, so a speed ratio "
    "compares whole decode loops (model code, attention and cache together), not cache kernels alone. "
    "Rows pair each kvbench mode with the peers storing K/V at the same bit width, at each context and batch the "
    "peers ran. **Best peer**: the fastest peer of that width that ran (status ok) in the benchmark at that "
    "context and batch. **kvbench / peer**: the kvbench mode's decode tok/s over the best peer's (above 1: "
    "kvbench is faster). Quality cells: verdict · top-1 agreement · KL vs fp16."
)
PEER_NOTE_MAX = 80


def _peer_modes(g: Group) -> list[str]:
    return [m for m in g.modes if is_peer(m)]


def _shared_notes(g: Group) -> set[str]:
    """Notes on kvbench fp16's completed rows: what every cell of the setup carries (RoPE, model notes)."""
    notes: set[str] = set()
    for df in (g.audit, g.bench_main):
        if len(df):
            ran = (df["kv_cache_mode"] == "fp16") & df["status"].isin([*RAN_STATUSES, ""])
            for text in df.loc[ran, "notes"]:
                notes.update(note_parts(text))
    return notes


def _own_note(row: dict, shared: set[str]) -> str:
    """A row's own notes (an error message), without the setup's shared and generic ones."""
    parts = note_parts(row.get("notes"))
    return "; ".join(p for p in parts if p not in shared and not _GENERIC_NOTES.match(p) and not _YARN_NOTE.match(p))


def _missing(row: dict, shared: set[str]) -> str:
    """ "— (status: note)" for a row without a number."""
    note = _own_note(row, shared)
    status = row.get("status") or "no data"
    return f"— ({status}: {_clip(note, PEER_NOTE_MAX)})" if note else f"— ({status})"


def _peer_bench(g: Group, mode: str, ctx, batch) -> tuple[float, dict | None]:
    """(decode tok/s, the row) of `mode`'s fastest completed benchmark row at (ctx, batch); the
    failed row (tok/s NaN) where none completed; (NaN, None) where there is no row."""
    b = g.bench
    if batch is None or b.empty:
        return float("nan"), None
    rows = b[(b["kv_cache_mode"] == mode) & (b["context_tokens"] == ctx) & (b["batch"] == batch)]
    if rows.empty:
        return float("nan"), None
    ok = rows[rows["status"].isin(["ok", "fallback", ""]) & rows["decode_tok_s"].notna()]
    if len(ok):
        r = ok.sort_values("decode_tok_s", kind="stable").iloc[-1].to_dict()
        return float(r["decode_tok_s"]), r
    return float("nan"), rows.iloc[-1].to_dict()


def _peer_tok_cell(g: Group, mode: str, ctx, batch, shared: set[str]) -> tuple[float, str]:
    tok, row = _peer_bench(g, mode, ctx, batch)
    if _isnum(tok):
        return tok, fmt_tok(tok)
    return tok, _missing(row, shared) if row is not None else "— (not benchmarked)"


def _greedy_row(g: Group, mode: str, ctx) -> dict | None:
    rows = g.greedy[(g.greedy["kv_cache_mode"] == mode) & (g.greedy["context_tokens"] == ctx)] if len(g.greedy) else []
    return rows.iloc[-1].to_dict() if len(rows) else None


def _quality_cell(g: Group, mode: str, ctx, shared: set[str]) -> str:
    q = g.quality.get((mode, ctx))
    if q is None:
        return "— (not audited)"
    if q.kind in FAIL_STATUSES:
        row = _greedy_row(g, mode, ctx)
        return _missing(row, shared) if row is not None else f"— ({q.kind})"
    if q.kind == "reference":
        return "reference"
    bits = [q.short]
    if _isnum(q.top1):
        bits.append(fmt_pct(q.top1))
    if _isnum(q.kl):
        bits.append(f"KL {fmt_kl(q.kl)}")
    return " · ".join(bits)


def _peer_failure(g: Group, peer: str, ctx, batch) -> str:
    """The status of `peer`'s failed cell at (ctx, batch) (its audit at ctx where it has no
    benchmark row there); "" if it did not fail."""
    tok, row = _peer_bench(g, peer, ctx, batch)
    if row is not None:
        return "" if _isnum(tok) else (row["status"] or "no data")
    q = g.quality.get((peer, ctx))
    return f"{q.kind} in the audit" if q is not None and q.kind in FAIL_STATUSES else ""


def _pick_peer(g: Group, peers: list[str], ctx, batch) -> tuple[str | None, str]:
    """The best peer of `peers` at (ctx, batch) and the cell text naming it (or saying why none)."""
    ran = [(tok, p) for p in peers for tok in [_peer_bench(g, p, ctx, batch)[0]] if _isnum(tok)]
    failed = [f"`{p}` {f}" for p in peers for f in [_peer_failure(g, p, ctx, batch)] if f]
    if ran:
        best = max(ran, key=lambda t: t[0])[1]
        why = ([f"fastest of {len(ran)}"] if len(ran) > 1 else []) + failed
        return best, f"`{best}`" + (f" ({'; '.join(why)})" if why else "")
    # No peer of this width ran in the benchmark here: the one whose output is closest to fp16's.
    audited = [
        (p, q) for p in peers for q in [g.quality.get((p, ctx))] if q is not None and q.kind not in FAIL_STATUSES
    ]
    if audited:
        best = min(
            audited,
            key=lambda t: (
                t[1].kind not in GOOD_KINDS,
                -t[1].top1 if _isnum(t[1].top1) else 0.0,
                t[1].kl if _isnum(t[1].kl) else math.inf,
            ),
        )[0]
        why = "not benchmarked here" + ("; closest output to fp16" if len(audited) > 1 else "")
        return best, f"`{best}` ({'; '.join([why, *failed])})"
    if failed:
        return None, f"— ({'; '.join(failed)})"
    return None, "— (not run here)"


def _peer_keys(g: Group, peers: list[str]) -> list[tuple]:
    """(context, batch) of the table's rows: where peers were benchmarked, and the contexts where
    they were only audited (at the reference batch where kvbench has benchmark rows there, else batch None)."""
    keys = set()
    b = g.bench
    if len(b):
        for r in b[b["kv_cache_mode"].isin(peers)].to_dict("records"):
            if _isnum(r["context_tokens"]) and _isnum(r["batch"]):
                keys.add((r["context_tokens"], r["batch"]))
    benched = {c for c, _ in keys}
    audited = g.greedy[g.greedy["kv_cache_mode"].isin(peers)]["context_tokens"] if len(g.greedy) else []
    for ctx in sorted({c for c in audited if _isnum(c) and c not in benched}):
        at_ref = len(b) and bool(((b["context_tokens"] == ctx) & (b["batch"] == g.ref_batch)).any())
        keys.add((ctx, g.ref_batch if at_ref else None))
    return sorted(keys, key=lambda k: (k[0], k[1] if k[1] is not None else -1.0))


def _peer_table(g: Group) -> str:
    peers = _peer_modes(g)
    shared = _shared_notes(g)
    all_keys = _peer_keys(g, peers)
    widths = sorted({w for m in g.modes for w in [mode_bits(m)] if w is not None}, reverse=True)
    rows = []
    for w in widths:
        kv_modes = [m for m in g.modes if not is_peer(m) and mode_bits(m) == w] or [None]
        peers_w = [p for p in peers if mode_bits(p) == w]
        # Rows where this width's peers ran (where any peer ran, for a width without one).
        keys = _peer_keys(g, peers_w) if peers_w else all_keys
        if not peers_w:
            known = [p for p, bits in peer_widths().items() if bits == w]
            no_peer = (
                f"— (no {w}-bit peer in these results; {join_list([f'`{p}`' for p in known])} not run)"
                if known
                else f"— (transformers has no {w}-bit cache)"
            )
        for m in kv_modes:
            if m is None:
                label = f"— (no {w}-bit kvbench mode)"
            else:
                eff = _unique(e for e in g.rows_for(m)["effective_mode"] if fell_back(m, e))
                label = f"`{m}`" + (f" (as {'/'.join(eff)})" if eff else "")
            for ctx, batch in keys or [(float("nan"), None)]:
                if m is None:
                    kv_tok, kv_tok_text, kv_q = float("nan"), "—", "—"
                else:
                    kv_tok, kv_tok_text = _peer_tok_cell(g, m, ctx, batch, shared)
                    kv_q = _quality_cell(g, m, ctx, shared)
                if peers_w:
                    best, peer_cell = _pick_peer(g, peers_w, ctx, batch)
                else:
                    best, peer_cell = None, no_peer
                peer_tok, peer_tok_text = (
                    (float("nan"), "—") if best is None else _peer_tok_cell(g, best, ctx, batch, shared)
                )
                peer_q = "—" if best is None else _quality_cell(g, best, ctx, shared)
                ratio = kv_tok / peer_tok if _isnum(kv_tok) and _isnum(peer_tok) and peer_tok > 0 else float("nan")
                rows.append(
                    [
                        str(w),
                        ctx_label(ctx) if _isnum(ctx) else "—",
                        fmt_int(batch) if batch is not None else "—",
                        label,
                        kv_tok_text,
                        kv_q,
                        peer_cell,
                        peer_tok_text,
                        peer_q,
                        fmt_ratio(ratio),
                    ]
                )
    headers = [
        "Bits",
        "Context",
        "Batch",
        "kvbench mode",
        "kvbench tok/s",
        "kvbench quality",
        "Best peer",
        "Peer tok/s",
        "Peer quality",
        "kvbench / peer",
    ]
    return md_table(headers, rows, "rrrlrllrlr")


def _failed_peer_lines(g: Group) -> list[str]:
    """One line per peer and (status, message) of its cells that did not run."""
    shared = _shared_notes(g)
    lines = []
    for p in _peer_modes(g):
        recs = [(0, r) for r in g.greedy[g.greedy["kv_cache_mode"] == p].to_dict("records")] if len(g.greedy) else []
        if len(g.bench):
            recs += [(1, r) for r in g.bench[g.bench["kv_cache_mode"] == p].to_dict("records")]
        recs.sort(key=lambda t: (t[0], *(x if _isnum(x) else -1.0 for x in (t[1]["context_tokens"], t[1]["batch"]))))
        failures: dict[tuple[str, str], list[str]] = {}
        for kind, r in recs:
            if r["status"] not in FAIL_STATUSES:
                continue
            where = (
                f"audit {ctx_label(r['context_tokens'])}"
                if kind == 0
                else f"benchmark {_row_where({**r, '_kind': 'bench'})}"
            )
            failures.setdefault((r["status"], _own_note(r, shared)), []).append(where)
        for (status, note), where in failures.items():
            lines.append(
                f"- `{p}`: {status} ({', '.join(where)}): {_clip(note, 300) if note else 'no message recorded'}"
            )
    return lines


def section_peers(groups: list[Group]) -> str:
    """Kvbench's modes beside transformers' own caches at the same bit width (only with peer rows)."""
    with_peers = [g for g in groups if _peer_modes(g)]
    if not with_peers:
        return ""
    out = ["## Peers: transformers' own caches", "", PEERS_INTRO, ""]
    for g in with_peers:
        if g.multi:
            out.append(g.heading())
        line = _peer_comparison(g)
        if line:
            out += [line, ""]
        out += [_peer_table(g), ""]
        failed = _failed_peer_lines(g)
        if failed:
            out += ["Peers that could not run (cells with status error, oom or skipped):", "", *failed, ""]
    return "\n".join(out).rstrip()


def _peer_comparison(g: Group) -> str:
    """One sentence: the fastest kvbench mode keeping fp16 quality beside the fastest peer of its
    bit width, at the longest context (reference batch first) where both completed; "" if none."""
    bok = g.bench_ok()
    if bok.empty:
        return ""
    batches = sorted({x for x in bok["batch"] if _isnum(x)}, key=lambda x: (x != g.ref_batch, x))
    for batch in batches:
        at_b = bok[bok["batch"] == batch]
        for ctx in sorted({x for x in at_b["context_tokens"] if _isnum(x)}, reverse=True):
            at = at_b[at_b["context_tokens"] == ctx]
            best_tok: dict[str, float] = {}
            for r in at.to_dict("records"):
                m = r["kv_cache_mode"]
                if fell_back(m, r["effective_mode"]) or mode_bits(m) is None:
                    continue
                best_tok[m] = max(best_tok.get(m, -math.inf), r["decode_tok_s"])
            kv = [(tok, m) for m, tok in best_tok.items() if not is_peer(m) and g.quality_ok(m, ctx)[0] is not False]
            for tok, m in sorted(kv, key=lambda t: (-t[0], mode_key(t[1]))):
                peers = [(t, p) for p, t in best_tok.items() if is_peer(p) and mode_bits(p) == mode_bits(m)]
                if not peers:
                    continue
                ptok, p = max(peers, key=lambda t: t[0])
                ratio = tok / ptok if ptok > 0 else float("nan")
                if not _isnum(ratio):
                    continue
                speed = f"{fmt_ratio(ratio)} faster than" if ratio >= 1 else f"at {fmt_ratio(ratio)} the speed of"
                text = (
                    f"Against transformers' own caches: `{m}` decodes {speed} `{p}`, the fastest "
                    f"{mode_bits(m)}-bit peer, at {ctx_label(ctx)} (batch {fmt_int(batch)})"
                )
                return text + _pair_quality(g, m, p, ctx) + "."
    return ""


def _pair_quality(g: Group, m: str, p: str, ctx) -> str:
    qm, qp = g.quality.get((m, ctx)), g.quality.get((p, ctx))
    same = ("reference", "identical")
    if qm is not None and qp is not None and qm.kind in same and qp.kind in same:
        return ", with identical output" if m == "fp16" else ", both with output identical to fp16's"
    bits = []
    for mode, q in ((m, qm), (p, qp)):
        if q is None:
            bits.append(f"`{mode}` not audited at {ctx_label(ctx)}")
        else:
            metrics = quality_metrics(q) if q.kind != "reference" else ""
            bits.append(f"`{mode}` {q.text}" + (f" ({metrics})" if metrics else ""))
    return "; output vs fp16: " + ", ".join(bits)


# ---------------------------------------------------------------------------
# Plots


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")  # file output only; never a window
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _legend_right(fig, handles: list, labels: list[str], title: str, top: float) -> None:
    """A figure legend at the right edge, the axes laid out in what is left of the width (measured from the
    drawn legend, so a long label never covers a bar or a line)."""
    legend = fig.legend(handles, labels, loc="center right", title=title, fontsize=9)
    width = legend.get_window_extent(fig.canvas.get_renderer()).width / fig.bbox.width
    fig.tight_layout(rect=(0, 0, max(0.5, 1 - width - 0.01), top))


def _mode_colors(modes: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap, peer_cmap = colormaps["tab10"], colormaps["Dark2"]
    colors = {}
    ordered = order_modes(modes)
    peers = [m for m in ordered if is_peer(m)]
    # kvbench's modes keep one color each across plots (their place in MODE_ORDER); a label
    # such as "turbo4 (no fallback)" takes its mode's color when that mode is not plotted
    # too, and any other label the next color no plotted mode holds
    used = {MODE_ORDER.index(m) for m in modes if m in MODE_ORDER}
    for m in ordered:
        if is_peer(m):  # transformers' caches: a palette of their own
            colors[m] = peer_cmap(peers.index(m) % 8)
        elif m in MODE_ORDER:
            colors[m] = cmap(MODE_ORDER.index(m))
        elif base_mode(m) in MODE_ORDER and MODE_ORDER.index(base_mode(m)) not in used:
            used.add(MODE_ORDER.index(base_mode(m)))
            colors[m] = cmap(MODE_ORDER.index(base_mode(m)))
        else:  # the first color left, or a repeat once all ten are taken
            i = next((i for i in range(10) if i not in used), len(colors) % 10)
            used.add(i)
            colors[m] = cmap(i)
    return colors


def _save(fig, path: Path) -> None:
    try:
        fig.savefig(path, format="png", metadata={"Software": None})
    except OSError as exc:  # a folder that cannot be written: one line, as for report.md itself
        raise KvbenchError(f"cannot write {path}: {exc.strerror or exc}") from None


def _ctx_axis(ax, ctxs: list[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ctxs)
    ax.set_xticklabels([ctx_label(c) for c in ctxs])
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    if len(ctxs) == 1:
        ax.set_xlim(ctxs[0] / 2, ctxs[0] * 2)
    ax.set_xlabel("context (tokens)")
    ax.grid(True, alpha=0.3)


def _line_plot(g: Group, value: str, ylabel: str, title: str, path: Path, errors: bool) -> bool:
    b = g.bench_ok()
    b = b[b[value].notna() & b["context_tokens"].notna()] if len(b) else b
    if b.empty:
        return False
    batches = sorted({x for x in b["batch"] if _isnum(x)}) or [float("nan")]
    ncols = min(len(batches), 3)
    nrows = math.ceil(len(batches) / ncols)
    fig = _figure(5.2 * ncols + 1.6, 3.8 * nrows + 0.6)
    colors = _mode_colors(g.modes)
    failed = g.bench[g.bench["status"].isin(FAIL_STATUSES) & g.bench["context_tokens"].notna()]
    failed = failed[failed["batch"].isin(batches)] if _isnum(batches[0]) else failed
    ctxs = sorted(set(b["context_tokens"]) | set(failed["context_tokens"]))
    if len(ctxs) == 1:  # one context: a bar per mode says more than a column of dots "vs context"
        return _bar_plot(g, b, failed, batches, value, ylabel, title.replace(" vs context", ""), path, errors)
    handles = {}
    for k, batch in enumerate(batches):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        sub = b[b["batch"] == batch] if _isnum(batch) else b
        for m in order_modes(sub["kv_cache_mode"]):
            sm = sub[sub["kv_cache_mode"] == m]
            kernels = sorted(set(sm["kernel"]))
            for kern in kernels:
                s = sm[sm["kernel"] == kern].sort_values("context_tokens")
                s = s.drop_duplicates("context_tokens", keep="last")
                label = m + (f" [{kern}]" if len(kernels) > 1 and kern else "")
                style = "-" if kernels.index(kern) == 0 else "--"
                x, y = s["context_tokens"].to_numpy(), s[value].to_numpy()
                if errors and s["decode_tok_s_min"].notna().any():
                    lo = (y - s["decode_tok_s_min"].fillna(pd.Series(y, index=s.index))).to_numpy()
                    hi = (s["decode_tok_s_max"].fillna(pd.Series(y, index=s.index)) - y).to_numpy()
                    h = ax.errorbar(
                        x,
                        y,
                        yerr=[np.clip(lo, 0, None), np.clip(hi, 0, None)],
                        marker="s" if is_peer(m) else "o",
                        linestyle=style,
                        color=colors[m],
                        capsize=3,
                        label=label,
                    )
                else:
                    marker = "s" if is_peer(m) else "o"
                    (h,) = ax.plot(x, y, marker=marker, linestyle=style, color=colors[m], label=label)
                handles.setdefault(label, h)
        fails = failed[failed["batch"] == batch] if _isnum(batch) else failed
        for r in fails.to_dict("records"):
            # A cell that did not run: an x on the axis floor, labelled with its status.
            m = r["kv_cache_mode"]
            ax.plot(
                r["context_tokens"],
                0,
                marker="x",
                markersize=9,
                mew=2,
                color=colors.get(m, "gray"),
                linestyle="none",
                clip_on=False,
            )
            ax.annotate(
                f"{m} {r['status']}",
                (r["context_tokens"], 0),
                xytext=(0, 8),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=colors.get(m, "gray"),
            )
            if "did not run" not in handles:
                from matplotlib.lines import Line2D

                handles["did not run"] = Line2D([], [], marker="x", mew=2, color="gray", linestyle="none")
        _ctx_axis(ax, ctxs)
        ax.set_ylabel(ylabel)
        ax.set_title(f"batch {int(batch)}" if _isnum(batch) else "all batches")
        ax.set_ylim(bottom=0)
    top = _suptitle(fig, f"{title} — {g.label}")
    _legend_right(fig, list(handles.values()), list(handles.keys()), "KV mode", top=top)
    _save(fig, path)
    return True


def _suptitle(fig, text: str) -> float:
    """The figure's title, broken at its " — " where one line would not fit the width; returns the top of the
    area left for the axes."""
    fits = fig.get_figwidth() * fig.dpi / 9.5  # characters of an 11-point title across the figure (about)
    if len(text) > fits and " — " in text:
        fig.suptitle(text.replace(" — ", "\n", 1), fontsize=11)
        return 0.90
    fig.suptitle(text, fontsize=11)
    return 0.95


def _bar_plot(g: Group, b, failed, batches, value: str, ylabel: str, title: str, path: Path, errors: bool) -> bool:
    """`_line_plot` at a single context: one bar per mode (and kernel) per batch, min–max whiskers, an x for a
    cell that did not run."""
    ctx = ctx_label((list(b["context_tokens"]) or list(failed["context_tokens"]))[0])
    colors = _mode_colors(g.modes)
    ncols = min(len(batches), 3)
    nrows = math.ceil(len(batches) / ncols)
    labels_all = order_modes(set(b["kv_cache_mode"]) | set(failed["kv_cache_mode"]))
    fig = _figure(max(5.0, 0.75 * len(labels_all) + 2.2) * ncols, 4.2 * nrows + 0.6)
    for k, batch in enumerate(batches):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        sub = b[b["batch"] == batch] if _isnum(batch) else b
        fails = failed[failed["batch"] == batch] if _isnum(batch) else failed
        for i, m in enumerate(labels_all):
            s = sub[sub["kv_cache_mode"] == m].drop_duplicates("kernel", keep="last")
            if s.empty:
                if m in set(fails["kv_cache_mode"]):
                    st = fails[fails["kv_cache_mode"] == m]["status"].iloc[-1]
                    ax.plot(i, 0, marker="x", markersize=9, mew=2, color=colors.get(m, "gray"), clip_on=False)
                    ax.annotate(st, (i, 0), xytext=(0, 8), textcoords="offset points", ha="center", fontsize=7)
                continue
            r = s.iloc[-1]
            y = r[value]
            yerr = None
            if errors and _isnum(r["decode_tok_s_min"]) and _isnum(r["decode_tok_s_max"]):
                yerr = [[max(0.0, y - r["decode_tok_s_min"])], [max(0.0, r["decode_tok_s_max"] - y)]]
            ax.bar(i, y, 0.7, color=colors[m], yerr=yerr, capsize=3)
            above = y + (yerr[1][0] if yerr else 0.0)  # the label over the whisker, not across it
            ax.annotate(f"{y:.3g}", (i, above), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
        ax.set_xticks(range(len(labels_all)))
        ax.set_xticklabels(labels_all, rotation=30, ha="right")
        ax.set_ylabel(ylabel)
        ax.set_title(f"batch {int(batch)}" if _isnum(batch) else "all batches")
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    top = _suptitle(fig, f"{title} at {ctx} — {g.label}")
    fig.tight_layout(rect=(0, 0, 1, top))
    _save(fig, path)
    return True


def _quality_plot(g: Group, path: Path) -> bool:
    items = {k: q for k, q in g.quality.items() if k[0] != "fp16" and (_isnum(q.top1) or _isnum(q.kl))}
    if not items:
        return False
    from matplotlib import colormaps

    modes = order_modes(m for m, _c in items)
    ctxs = sorted({c for _m, c in items if _isnum(c)})
    cmap = colormaps["viridis"]
    ctx_colors = {c: cmap(0.15 + 0.7 * i / max(1, len(ctxs) - 1)) for i, c in enumerate(ctxs)}
    width = 0.8 / max(1, len(ctxs))
    fig = _figure(max(7.0, 1.25 * len(modes) + 3), 7.2)
    ax1, ax2 = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    kl_pos = [q.kl for q in items.values() if _isnum(q.kl) and q.kl > 0]
    log_kl = bool(kl_pos) and max(kl_pos) / min(kl_pos) > 100
    legend_extra: dict = {}
    for j, c in enumerate(ctxs):
        xs, top, kl = [], [], []
        for i, m in enumerate(modes):
            q = items.get((m, c))
            xs.append(i + (j - (len(ctxs) - 1) / 2) * width)
            top.append(q.top1 * 100 if q and _isnum(q.top1) else np.nan)
            kl.append(q.kl if q and _isnum(q.kl) else np.nan)
        # a diverged or degenerate cell's bars hatched: a high top-1 beside a failed verdict is still a failure
        hatch = ["//" if (q := items.get((m, c))) and q.kind in BAD_KINDS else "" for m in modes]
        kl_bars = [np.nan if (log_kl and v <= 0) else v for v in kl]
        for ax, vals in ((ax1, top), (ax2, kl_bars)):
            bars = ax.bar(xs, vals, width, color=ctx_colors[c], label=ctx_label(c), edgecolor="white")
            for patch, h in zip(bars, hatch, strict=True):  # per patch: any matplotlib takes it so
                patch.set_hatch(h)
        if any(hatch) and "bad" not in legend_extra:
            from matplotlib.patches import Patch

            legend_extra["bad"] = Patch(
                facecolor="lightgray", edgecolor="white", hatch="//", label="diverged or degenerate"
            )
        for x, v in zip(xs, top, strict=True):
            if _isnum(v):
                label = f"{v:.0f}" if v >= 99.95 else f"{v:.1f}"
                ax1.annotate(
                    label, (x, v), ha="center", va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points"
                )
        for x, v in zip(xs, kl, strict=True):
            if _isnum(v):
                # Zero KL has no bar on a log axis: write the value at the foot of the axis instead.
                at = (x, 0.01) if v <= 0 or log_kl else (x, v)
                coords = ("data", "axes fraction") if v <= 0 or log_kl else "data"
                ax2.annotate(
                    fmt_kl(v),
                    at,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xycoords=coords,
                    xytext=(0, 1),
                    textcoords="offset points",
                )
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes)
        ax.set_xlim(-0.6, len(modes) - 0.4)
        ax.grid(True, axis="y", alpha=0.3)
    ax1.set_ylim(0, 112)  # room for the label over a 100% bar
    ax1.set_ylabel("top-1 agreement (%)")
    ax1.set_title("Top-1 agreement with fp16 (higher is better)")
    if log_kl:
        ax2.set_yscale("log")
    else:
        ax2.set_ylim(bottom=0)
    ax2.set_ylabel("KL divergence (nats)")
    ax2.set_xlabel("KV mode")
    ax2.set_title("KL divergence from fp16 (lower is better)")
    fig.suptitle(f"Output quality vs fp16 — {g.label}", fontsize=11)
    handles, labels = ax1.get_legend_handles_labels()
    handles += list(legend_extra.values())
    labels += [h.get_label() for h in legend_extra.values()]
    _legend_right(fig, handles, labels, "context", top=0.96)
    _save(fig, path)
    return True


def _niah_plot(g: Group, path: Path) -> bool:
    rows = g.audit[(g.audit["check"] == "niah") & g.audit["niah_hit"].notna()]
    if rows.empty:
        return False
    ctxs, depths, grids = _niah_grid(rows)
    if not ctxs or not depths:
        return False
    n = len(grids)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = _figure(3.6 * ncols + 1.2, 0.5 * len(depths) * nrows + 1.6 * nrows + 0.6)
    im = None
    axes = []
    for k, (m, (hits, counts)) in enumerate(grids.items()):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        axes.append(ax)
        rate = np.where(counts > 0, hits / np.maximum(counts, 1), np.nan)
        im = ax.imshow(rate, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for i in range(len(depths)):
            for j in range(len(ctxs)):
                if counts[i, j]:
                    ax.text(j, i, f"{int(hits[i, j])}/{counts[i, j]}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(ctxs)))
        ax.set_xticklabels([ctx_label(c) for c in ctxs])
        ax.set_yticks(range(len(depths)))
        ax.set_yticklabels([fmt_depth(d) for d in depths])
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(m)
    fig.suptitle(f"Needle in a haystack: hit rate — {g.label}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.9, 0.93))
    cax = fig.add_axes((0.91, 0.15, 0.02, 0.7))
    fig.colorbar(im, cax=cax, label="hit rate")
    _save(fig, path)
    return True


def make_plots(g: Group, out_dir: Path, prefix: str = "report") -> list[tuple[str, str]]:
    """(title, file name) of each plot written for the group; file names start with `prefix`."""
    made = []
    name = f"{prefix}_decode_tok_s{g.suffix}.png"
    if _line_plot(
        g,
        "decode_tok_s",
        "decode tok/s, summed over batch\n(median, min–max)",
        "Decode speed vs context",
        out_dir / name,
        errors=True,
    ):
        made.append(("Decode tok/s vs context per mode", name))
    name = f"{prefix}_peak_mem{g.suffix}.png"
    kinds = _unique(g.bench["peak_mem_kind"]) if len(g.bench) else []
    ylabel = "peak memory (GB)" + (f" [{', '.join(kinds)}]" if kinds else "")
    if _line_plot(g, "peak_mem_gb", ylabel, "Peak memory vs context", out_dir / name, errors=False):
        made.append(("Peak memory vs context per mode", name))
    name = f"{prefix}_quality{g.suffix}.png"
    if _quality_plot(g, out_dir / name):
        made.append(("Top-1 agreement and KL vs fp16 per mode and context", name))
    name = f"{prefix}_niah{g.suffix}.png"
    if _niah_plot(g, out_dir / name):
        made.append(("Needle-in-a-haystack hit rate by depth and context", name))
    return made


def section_plots(groups: list[Group], plots: dict[int, list[tuple[str, str]]]) -> str:
    out = ["## Plots", ""]
    if not any(plots.values()):
        out.append("No plottable rows.")
    for g in groups:
        if not plots.get(g.index):
            continue
        if g.multi:
            out.append(g.heading())
        for title, name in plots[g.index]:
            out += [f"### {title}" if not g.multi else f"**{title}**", "", f"![{title}]({name})", ""]
    return "\n".join(out).rstrip()


# ---------------------------------------------------------------------------
# Recommendation


def section_recommendation(groups: list[Group]) -> str:
    out = ["## Recommendation", ""]
    for g in groups:
        out.append(f"### {g.label}" if g.multi else f"For **{g.label}**:")
        out.append("")
        out += [f"- {line}" for line in _recommend(g)]
        out.append("")
    return "\n".join(out).rstrip()


def _describe_bad(g: Group, m: str) -> str:
    qs = [q for q in g.mode_quality(m) if q.kind in BAD_KINDS]
    bits = []
    for q in qs:
        metrics = quality_metrics(q)
        bits.append(f"{q.text} at {ctx_label(q.context)}" + (f" ({metrics})" if metrics else ""))
    return f"`{m}`: " + "; ".join(bits)


def _ref_degenerate_text(g: Group) -> str:
    """The reference's own output is degenerate (as a random-weight model's greedy text often is)."""
    where = "; ".join(ctx_label(c) + (f": {_clip(r, 60)}" if r else "") for c, r in sorted(g.ref_degenerate.items()))
    return (
        f"The reference output itself is degenerate (`fp16` at {where}), as with random weights, so degeneracy "
        "verdicts are not meaningful for this model there: the modes are judged by their tokens against fp16's only."
    )


def _noisy_cells(best: dict, runner_up: dict | None) -> list[str]:
    """The noisy timings a fastest-mode choice rests on: the winner's, fp16's (its ratio's reference) and the
    runner-up's (the ordering); "`int8` 1 repeat" each."""
    out = []
    for mode, noise in (
        (best["kv_cache_mode"], best["_noise"]),
        ("fp16", best["_fp16_noise"]),
        *([(runner_up["kv_cache_mode"], runner_up["_noise"])] if runner_up is not None else []),
    ):
        if noise and f"`{mode}` {noise}" not in out:
            out.append(f"`{mode}` {noise}")
    return out


def _recommend(g: Group) -> list[str]:
    lines = []
    audited = bool(g.quality)
    bok = g.bench_ok()
    if not audited:
        lines.append("No audit rows: output quality is unknown; run `kvbench audit` before trusting a quantized mode.")
    if g.ref_degenerate:
        lines.append(_ref_degenerate_text(g))
    # Fastest quality-keeping mode per batch and context.
    pick = None
    for batch in sorted({x for x in bok["batch"] if _isnum(x)}) if len(bok) else []:
        items = []
        for ctx in sorted({x for x in bok[bok["batch"] == batch]["context_tokens"] if _isnum(x)}):
            at = bok[(bok["batch"] == batch) & (bok["context_tokens"] == ctx)]
            cands = []
            for r in at.to_dict("records"):
                ok, caveat = g.quality_ok(r["kv_cache_mode"], ctx)
                if ok or (not audited):
                    cands.append((r["decode_tok_s"], r, caveat))
            if not cands:
                continue
            cands.sort(key=lambda t: (t[0], -mode_key(t[1]["kv_cache_mode"])[0]))
            tok, best, caveat = cands[-1]
            m = best["kv_cache_mode"]
            text = f"{ctx_label(ctx)}: `{m}` {fmt_tok(tok)} tok/s"
            if m != "fp16" and _isnum(best["_ratio"]):
                text += f" ({fmt_ratio(best['_ratio'])} fp16)"
            elif m != "fp16" and best["_fp16_status"]:
                text += f" (fp16: {best['_fp16_status']})"
            if caveat:
                text += f" [{caveat}]"
            if m == "fp16":
                quant = [t for t in cands if mode_bits(t[1]["kv_cache_mode"]) != 16]
                if quant:
                    qt = quant[-1][1]
                    text += f" (best quantized: `{qt['kv_cache_mode']}` at {fmt_ratio(qt['_ratio'])})"
            noisy = _noisy_cells(best, cands[-2][1] if len(cands) > 1 else None)
            if noisy:
                text += " [noisy timing]"
            items.append(text)
            if batch == g.ref_batch:
                pick = (ctx, best, noisy)
        if items:
            what = "Fastest mode" + (" with fp16-quality output" if audited else " (quality not audited)")
            lines.append(f"{what}, batch {int(batch)}: " + "; ".join(items) + ".")
    if len(bok) == 0:
        lines.append("No completed benchmark rows: speed and memory recommendations need `kvbench decode-bench`.")

    # Memory: the smallest KV footprint that keeps quality.
    ctx_max = max(bok["context_tokens"].dropna()) if len(bok) else None
    all_ctx = g.contexts(g.bench) + g.contexts(g.audit)
    ref_ctx = ctx_max if ctx_max is not None else (max(all_ctx) if all_ctx else None)
    fp_bytes = g.kv_per_token("fp16", ref_ctx)
    mem = []
    for m in g.modes:
        if m == "fp16":
            continue
        ok, caveat = g.quality_ok(m, ref_ctx)
        kb = g.kv_per_token(m, ref_ctx)
        if ok and _isnum(kb) and not (_isnum(fp_bytes) and kb >= fp_bytes):  # e.g. hf:dynamic, hf:static
            mem.append((kb, m, caveat))
    if mem:
        kb, m, caveat = sorted(mem, key=lambda t: (t[0], mode_key(t[1])))[0]
        text = f"Best memory saving that keeps fp16 quality: `{m}` holds {fmt_bytes(kb)} of KV per token"
        if _isnum(fp_bytes) and kb > 0:
            text += f" vs {fmt_bytes(fp_bytes)} for fp16 ({fp_bytes / kb:.2f}x less)"
        at = bok[(bok["kv_cache_mode"] == m) & (bok["context_tokens"] == ctx_max) & (bok["batch"] == g.ref_batch)]
        # (not a process' peak RSS: Python and the weights swamp the KV there, so it cannot tell modes apart)
        if len(at) and _isnum(at["peak_mem_gb"].iloc[-1]) and at["peak_mem_kind"].iloc[-1] != "cpu_peak_rss":
            r = at.iloc[-1]
            text += f"; peak at {ctx_label(ctx_max)}, batch {fmt_int(g.ref_batch)}: {fmt_gb(r['peak_mem_gb'])} GB"
            if _isnum(r["_fp16_peak"]):
                text += f" vs {fmt_gb(r['_fp16_peak'])} GB for fp16"
                if _isnum(r["_peak_delta_pct"]):
                    text += f" ({r['_peak_delta_pct']:+.1f}%)"
        if caveat:
            text += f" [{caveat}]"
        lines.append(text + ".")
    # Capacity
    if not g.capacity.empty:
        c = g.capacity[g.capacity["status"].isin(["ok", ""]) & g.capacity["batch"].notna()]
        if len(c):
            cmax = max(c["context_tokens"].dropna()) if c["context_tokens"].notna().any() else None
            sub = c[c["context_tokens"] == cmax] if cmax is not None else c
            best = sub.groupby("kv_cache_mode")["batch"].max()
            est = sub.assign(_est=_estimated(sub)).groupby("kv_cache_mode")["_est"].any()
            every = bool(est.all())  # all estimated: said once, else per mode
            bits = [
                f"`{m}` batch {int(best[m])}" + (" (estimated, not allocated)" if est[m] and not every else "")
                for m in order_modes(best.index)
            ]
            head = f"Capacity at {ctx_label(cmax)}" + (" (estimated from buffer sizes, not allocated)" if every else "")
            text = f"{head}: " + ", ".join(bits) + "."
            speed = {m: r for (m, ctx), r in _capacity_speed(sub).items()}
            base = speed.get("fp16")
            if base is not None and len(speed) > 1:  # tok/s per GPU at capacity, each mode at its own batch
                more = sorted(
                    ((r["decode_tok_s"] / base["decode_tok_s"], m) for m, r in speed.items() if m != "fp16"),
                    key=lambda t: (-t[0], mode_key(t[1])),
                )
                text += (
                    " At the largest batch each mode ran timed, one GPU decodes"
                    f" {fmt_tok(base['decode_tok_s'])} tok/s with `fp16`"
                    f" (batch {fmt_int(base['batch'])}); "
                    + ", ".join(f"`{m}` {fmt_ratio(x)} that (batch {fmt_int(speed[m]['batch'])})" for x, m in more)
                    + "."
                )
            lines.append(text)
    # Avoid
    # (never fp16: it is the reference every verdict is measured against)
    bad = [m for m in g.modes if m != "fp16" and any(q.kind in BAD_KINDS for q in g.mode_quality(m))]
    avoid = [_describe_bad(g, m) for m in bad]
    if avoid:
        lines.append("Avoid on this setup: " + "; ".join(avoid) + ".")
    fails = []
    for m in g.modes:
        recs = g.rows_for(m)
        recs = recs[recs["status"].isin(["oom", "error"])]
        if len(recs):
            where = []
            for r in recs.to_dict("records"):
                w = f"{r['status']} at {_row_where(r)}"
                if w not in where:
                    where.append(w)
            fails.append(f"`{m}` ({', '.join(where)})")
    if fails:
        lines.append("Did not complete: " + "; ".join(fails) + ".")
    fb = []
    for m in g.modes:
        eff = _unique(e for e in g.rows_for(m)["effective_mode"] if fell_back(m, e))
        if eff:
            fb.append(f"`{m}` ran as `{'/'.join(eff)}`")
    if fb:
        lines.append("Fallback: " + "; ".join(fb) + " on this model; its rows measure the mode that actually ran.")
    peer_line = _peer_comparison(g)
    if peer_line:
        lines.append(peer_line[:-1] + " (see Peers).")
    if pick is not None:
        ctx, best, noisy = pick
        m = best["kv_cache_mode"]
        if m == "fp16":
            saving = [t for t in mem] if mem else []
            text = (
                f"Pick: `fp16` is the fastest fp16-quality choice at {ctx_label(ctx)} (batch {fmt_int(g.ref_batch)})"
                if audited
                else f"Pick: `fp16` is the fastest at {ctx_label(ctx)} (batch {fmt_int(g.ref_batch)})"
            )
            if saving:
                kb, sm, _ = sorted(saving, key=lambda t: (t[0], mode_key(t[1])))[0]
                text += f"; use `{sm}` when KV memory is the limit"
            text += "."
        else:
            text = f"Pick: `{m}` at {ctx_label(ctx)} (batch {fmt_int(g.ref_batch)}): "
            if _isnum(best["_ratio"]):
                text += f"{fmt_ratio(best['_ratio'])} fp16 decode"
            else:  # fp16 did not run there (oom where this mode fits): what it did, and this mode's own speed
                text += f"{fmt_tok(best['decode_tok_s'])} tok/s where fp16 " + (
                    f"ended {best['_fp16_status']}" if best["_fp16_status"] else "has no measurement"
                )
            other = bok[(bok["kv_cache_mode"] == m) & (bok["context_tokens"] == ctx) & (bok["batch"] != g.ref_batch)]
            other = [r for r in other.sort_values("batch").to_dict("records") if _isnum(r["_ratio"])]
            if other:
                text += (
                    " (" + ", ".join(f"{fmt_ratio(r['_ratio'])} at batch {fmt_int(r['batch'])}" for r in other) + ")"
                )
            text += " with fp16-quality output." if audited else "; quality not audited."
        if noisy:
            text += (
                f" The timing it rests on is noisy ({'; '.join(noisy)}): treat the speed comparison as rough "
                "and re-run with more `--repeats`."
            )
        lines.append(text)
    if not lines:
        lines.append("Not enough data for a recommendation.")
    return lines


# ---------------------------------------------------------------------------
# Raw data links and entry point


def _rel(path: Path, start: Path) -> str:
    """`path` relative to `start`, or absolute where the two share no folder but the root (a report in the
    repo of results under /tmp: a link that climbs to / and down again says less than the path itself)."""
    path, start = Path(path).resolve(), Path(start).resolve()
    try:
        if Path(os.path.commonpath([path, start])) == Path(path.anchor):
            return path.as_posix()
        return Path(os.path.relpath(path, start)).as_posix()
    except ValueError:  # another drive on Windows
        return path.as_posix()


def section_links(data: Results, out_dir: Path) -> str:
    out = ["## Raw data", ""]
    counts = {}
    for name, df in (("audit", data.audit), ("bench", data.bench), ("runs", data.runs)):
        for src, n in df["_source"].value_counts().items():
            counts[(src, name)] = n
    for p in data.csv_files:
        rel = _rel(p, out_dir)
        n = counts.get((str(p.parent), p.stem))
        kind = {"audit": "audit row", "bench": "benchmark row", "runs": "command run"}.get(p.stem)
        desc = f" ({plural(n, kind)})" if kind and n is not None else (" (not read by the report)" if not kind else "")
        out.append(f"- [{rel}]({rel}){desc}")
    if not data.csv_files:
        out.append("- none")
    return "\n".join(out)


def render_report(results_dirs: list[Path], out_dir: Path | None = None) -> Path:
    """Read the CSVs of `results_dirs`, write `report.md` and its PNGs into `out_dir` (default: the first folder)."""
    if isinstance(results_dirs, (str, os.PathLike)):
        results_dirs = [results_dirs]
    dirs = [Path(d) for d in results_dirs]
    if not dirs:
        raise KvbenchError("no results folder given")
    data = load_results(dirs)
    if data.audit.empty and data.bench.empty:
        raise KvbenchError(f"no audit.csv or bench.csv rows in {', '.join(str(d) for d in dirs)}")
    out = Path(out_dir) if out_dir is not None else dirs[0]
    name = "report.md"
    if out.suffix == ".md":  # --out path/to/name.md: that file, the plots beside it
        out, name = out.parent, out.name
    # Plots are named after their report (a.md -> a_quality.png), so reports sharing a folder keep their own.
    prefix = "report" if name == "report.md" else Path(name).stem
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "a file is in the way" if isinstance(exc, FileExistsError | NotADirectoryError) else exc.strerror
        raise KvbenchError(f"cannot write the report to {out}: {why or exc}") from None
    groups = build_groups(data)
    plots = {g.index: make_plots(g, out, prefix) for g in groups}
    sections = [
        section_header(data, groups, out),
        section_summary(groups),
        section_audit(groups),
        section_quality_matrix(groups),
        section_checks(groups),
        section_statuses(groups),
        section_bench(groups),
        section_peers(groups),
        section_plots(groups, plots),
        section_recommendation(groups),
        section_links(data, out),
    ]
    text = "\n\n".join(s.strip() for s in sections if s.strip()) + "\n"
    path = out / name
    tmp = path.with_name(path.name + ".tmp")  # a Ctrl-C or a full disk never leaves half a report
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise KvbenchError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path

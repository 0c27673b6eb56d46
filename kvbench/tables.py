"""The rich summary table printed at the end of a job."""

from __future__ import annotations

from rich import box
from rich.table import Table

WIDE_AUDIT = 120  # console columns from which the audit table shows each row's output text
WIDE_BENCH = 100  # ... and the benchmark table its KV bytes per token
WRAPS = ("check", "verdict", "output")
MIN = {"check": 7, "verdict": 10, "PPL \u0394": 6}


def _f(value, spec: str) -> str:
    if value is None or value == "":
        return "-"
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def _ctx(n) -> str:
    n = int(n)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _check(r: dict) -> str:
    check = r.get("check") or ""
    if check == "max_kv" and r.get("max_kv_size") not in (None, ""):
        return f"cap {r['max_kv_size']} keep {r.get('keep')}"
    if check == "niah" and r.get("niah_depth") not in (None, ""):
        return f"niah {float(r['niah_depth']):g}"
    return check.replace("_", " ")


def _audit_table(rows: list[dict], width: int) -> Table:
    """One line per audit row. The output text needs room: on a narrow console (a pipe reads as 80
    columns) it is left to audit.csv, and columns no row fills are dropped, so that the rest stay
    readable instead of being squeezed to ellipses."""
    wide = width >= WIDE_AUDIT
    cells = []
    for r in rows:
        verdict = r.get("verdict") or ""
        if r.get("check") == "niah" and r.get("niah_hit") not in (None, ""):
            verdict = "found" if str(r["niah_hit"]).lower() == "true" else "missed"
        if verdict in ("diverged", "near-tie") and r.get("first_divergence") not in (None, ""):
            verdict += f"@{r['first_divergence']}"  # no space: rich would wrap there
        mode, eff = r["kv_cache_mode"], r.get("effective_mode") or ""
        cells.append(
            {
                "ctx": _ctx(r["context_tokens"]),
                "check": _check(r),
                "mode": mode if eff in ("", mode) or not wide else f"{mode} -> {eff}",
                "status": _style(r.get("status")),
                "verdict": verdict,
                "top-1": _f(r.get("top1_agreement"), ".1%"),
                "KL": _f(r.get("kl_div"), ".3g"),
                "PPL \u0394": _f(r.get("ppl_delta"), "+.2%"),
                "output": (r.get("output_text") or r.get("notes") or "")[:120].replace("\n", " "),
            }
        )
    cols = [
        c
        for c in cells[0]
        if (c != "output" or wide)
        and (c != "check" or len({x["check"] for x in cells}) > 1)
        and any(x[c] not in ("", "-") for x in cells)
    ]
    t = Table(
        title="audit vs fp16",
        title_justify="left",
        caption=None
        if wide
        else f"Output text and fallback targets are in audit.csv (shown here on consoles of {WIDE_AUDIT}+ columns).",
        caption_justify="left",
        box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD,
        pad_edge=wide,
        collapse_padding=not wide,
    )
    for c in cols:  # only the check, the verdict and the output wrap (at their spaces)
        t.add_column(
            c, overflow="fold", max_width=48 if c == "output" else None, no_wrap=c not in WRAPS, min_width=MIN.get(c)
        )
    for x in cells:
        t.add_row(*(x[c] for c in cols))
    return t


def _bench_table(rows: list[dict], width: int) -> Table:
    """One line per benchmark row; on a narrow console (under WIDE_BENCH columns) the KV bytes per
    token are left to bench.csv so that the rest stays whole."""
    wide = width >= WIDE_BENCH
    cols = ["ctx", "batch", "mode", "status", "tok/s", "vs fp16", "peak GB", "KV B/token", "roofline"]
    if not wide:
        cols.remove("KV B/token")
    t = Table(
        title="decode-bench",
        title_justify="left",
        caption=None
        if wide
        else f"KV bytes per token are in bench.csv (shown here on consoles of {WIDE_BENCH}+ columns).",
        caption_justify="left",
        box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD,
        pad_edge=wide,
        collapse_padding=not wide,
    )
    for c in cols:
        t.add_column(c, no_wrap=True, justify="left" if c in ("ctx", "mode", "status") else "right")
    for r in rows:
        ratio = r.get("decode_ratio_vs_fp16")
        status = r.get("status")
        eff = r.get("effective_mode")
        mode = r["kv_cache_mode"]
        if eff and eff != mode:  # measured as another mode: the CSV's status stays ok, its effective_mode says so
            mode = f"{mode} -> {eff}" if wide else f"{mode}*"
        cell = {
            "ctx": _ctx(r["context_tokens"]),
            "batch": str(r["batch"]),
            "mode": mode,
            "status": _style(status),
            "tok/s": _f(r.get("decode_tok_s"), ".1f"),
            "vs fp16": _f(ratio, ".3f") + ("x" if ratio not in (None, "") else ""),
            "peak GB": _f(r.get("peak_mem_gb"), ".2f"),
            "KV B/token": _f(r.get("kv_bytes_per_token"), ".0f"),
            "roofline": _f(r.get("roofline_frac"), ".0%"),
        }
        t.add_row(*(cell[c] for c in cols))
    return t


def print_rows(job: str, rows: list[dict], console) -> None:
    if not rows:
        return
    capacity = [] if job == "audit" else [r for r in rows if "capacity search" in (r.get("notes") or "")]
    searched = {id(r) for r in capacity}
    rows = [r for r in rows if id(r) not in searched]
    if rows:
        console.print(_audit_table(rows, console.width) if job == "audit" else _bench_table(rows, console.width))
    for line in capacity_lines(capacity):  # not table rows: a search's failing batch is not a failed cell
        console.print(line, markup=False, highlight=False)
    ran_as = sorted({(r["kv_cache_mode"], r["effective_mode"]) for r in rows if r.get("effective_mode") not in
                     (None, "", r["kv_cache_mode"])})  # fmt: skip
    if job != "audit" and ran_as and console.width < WIDE_BENCH:
        said = ", ".join(f"{m} ran as {e}" for m, e in ran_as)
        console.print(f"* fallback on this model: {said} (bench.csv: effective_mode)", markup=False, highlight=False)
    for line in failure_lines(rows):
        console.print(line, markup=False, highlight=False)


FAILED = ("error", "oom")


def capacity_lines(rows: list[dict]) -> list[str]:
    """The capacity search per mode and context: the largest batch that fit, the first that did not, and the
    decode speed at the largest batch that was timed (`--capacity-speed`), beside fp16's at its own."""
    found: dict[tuple, dict] = {}
    for r in rows:
        at = found.setdefault((int(r["context_tokens"]), r["kv_cache_mode"]), {})
        if r.get("status") != "ok":
            at["fails"] = r
            continue
        for kind, keep in (("fits", True), ("timed", r.get("decode_tok_s") not in (None, ""))):
            if keep and (kind not in at or int(r["batch"]) > int(at[kind]["batch"])):
                at[kind] = r
    out = []
    for (ctx, mode), at in found.items():
        fits, fails, timed = at.get("fits"), at.get("fails"), at.get("timed")
        text = f"capacity at {_ctx(ctx)}: {mode} "
        text += f"fits batch {fits['batch']}" if fits else "fits no batch"
        text += f", not {fails['batch']}" if fails else ""
        if timed:
            tok = float(timed["decode_tok_s"])
            text += f"; decodes {tok:.1f} tok/s" + (f" at batch {timed['batch']}" if timed is not fits else "")
            base = found.get((ctx, "fp16"), {}).get("timed")
            if base and mode != "fp16":
                text += f" ({tok / float(base['decode_tok_s']):.2f}x fp16 at its batch {base['batch']})"
        elif fits:  # timing was asked for and failed: say why here, not only in the CSV
            said = [n for n in (fits.get("notes") or "").split("; ") if n.startswith("decode not timed")]
            text += f"; {said[-1]}" if said else ""
        out.append(text)
    return out


def failure_lines(rows: list[dict]) -> list[str]:
    """Why each failed cell failed, one line each (the table shows only its status): the last part of its
    notes, where the cell appends the exception's one-line message."""
    out = []
    for r in rows:
        if r.get("status") not in FAILED:
            continue
        parts = [p.strip() for p in (r.get("notes") or "").split("; ") if p.strip()]
        where = " ".join(x for x in (_ctx(r["context_tokens"]), _check(r) if r.get("check") else "") if x)
        batch = f" x{r['batch']}" if r.get("batch") not in (None, "") and "check" not in r else ""
        out.append(f"{r['status']}: {where}{batch} {r['kv_cache_mode']}: {parts[-1] if parts else 'no message'}")
    return out


def _style(status: str | None) -> str:
    color = {"ok": "green", "fallback": "yellow", "diverged": "yellow"}.get(status or "", "red")
    return f"[{color}]{status}[/{color}]"

"""The rich summary table printed at the end of a job."""

from __future__ import annotations

from rich.table import Table


def _f(value, spec: str) -> str:
    if value is None or value == "":
        return "-"
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def print_rows(job: str, rows: list[dict], console) -> None:
    if not rows:
        return
    if job == "audit":
        t = Table(title="audit vs fp16", title_justify="left")
        for col in ("context", "check", "mode", "effective", "status", "verdict", "top-1", "KL", "PPL delta", "output"):
            t.add_column(
                col, overflow="fold" if col == "output" else "ellipsis", max_width=48 if col == "output" else None
            )
        for r in rows:
            verdict = r.get("verdict") or ""
            if verdict in ("diverged", "near-tie") and r.get("first_divergence") is not None:
                verdict += f" @{r['first_divergence']}"
            t.add_row(
                str(r["context_tokens"]),
                r.get("check") or "",
                r["kv_cache_mode"],
                r.get("effective_mode") or "",
                _style(r.get("status")),
                verdict,
                _f(r.get("top1_agreement"), ".1%"),
                _f(r.get("kl_div"), ".3g"),
                _f(r.get("ppl_delta"), "+.2%"),
                (r.get("output_text") or r.get("notes") or "")[:120].replace("\n", " "),
            )
    else:
        t = Table(title="decode-bench", title_justify="left")
        for col in (
            "context",
            "batch",
            "mode",
            "status",
            "decode tok/s",
            "vs fp16",
            "peak GB",
            "KV B/token",
            "roofline",
        ):
            t.add_column(col)
        for r in rows:
            t.add_row(
                str(r["context_tokens"]),
                str(r["batch"]),
                r["kv_cache_mode"],
                _style(r.get("status")),
                _f(r.get("decode_tok_s"), ".1f"),
                _f(r.get("decode_ratio_vs_fp16"), ".2f") + ("x" if r.get("decode_ratio_vs_fp16") else ""),
                _f(r.get("peak_mem_gb"), ".2f"),
                _f(r.get("kv_bytes_per_token"), ".0f"),
                _f(r.get("roofline_frac"), ".0%"),
            )
    console.print(t)


def _style(status: str | None) -> str:
    color = {"ok": "green", "fallback": "yellow", "diverged": "yellow"}.get(status or "", "red")
    return f"[{color}]{status}[/{color}]"

"""report.py: CSVs written with the real schemas -> report.md + PNGs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbench import report
from kvbench.errors import KvbenchError
from kvbench.report import fmt_pct, fmt_ppl_delta, render_report
from kvbench.results import AUDIT_COLUMNS, BENCH_COLUMNS, ResultsWriter

RUNS_COLUMNS = ["date", "job", "command", "device", "model", "kvbench_version", "git_commit", "wall_s"]

PROV = {
    "date": "2025-11-30",
    "device": "NVIDIA H200",
    "driver": "570.86",
    "model": "HuggingFaceTB/SmolLM2-135M",
    "model_hash": "abc123def456",
    "torch_version": "2.9.0",
    "triton_version": "3.5.0",
    "transformers_version": "4.57.1",
    "kvbench_version": "0.1.0",
    "git_commit": "deadbeef1234",
}

SECTIONS = [
    "# kvbench report",
    "## Summary",
    "## Audit status matrix",
    "## What the statuses mean",
    "## Benchmark",
    "## Plots",
    "## Recommendation",
    "## Raw data",
]


FALLBACK_NOTE = (
    "turbo4 is only allowed for model families qwen3_5, qwen3_5_moe, qwen3_next; "
    "'llama' runs as turbo4-asym (pass --no-fallback to run turbo4 anyway)"
)
FALLBACK_SHORT = "runs as turbo4-asym on llama (allowlist: qwen3_5, qwen3_5_moe, qwen3_next)"


def _greedy(mode, ctx, status="ok", verdict="identical", **kw):
    row = {
        **PROV,
        "kv_cache_mode": mode,
        "effective_mode": mode,
        "context_tokens": ctx,
        "gen_tokens": 64,
        "status": status,
        "verdict": verdict,
        "identical_to_fp16": verdict in ("identical", "reference"),
        "check": "greedy",
        "batch": 1,
        "synthetic": False,
    }
    row.update(kw)
    return row


def audit_rows():
    rows = [
        _greedy("fp16", 2048, verdict="reference", top1_agreement=1.0, kl_div=0.0),
        _greedy("fp16", 8192, verdict="reference", top1_agreement=1.0, kl_div=0.0),
        _greedy("int8", 2048, top1_agreement=1.0, kl_div=0.0, kv_bytes_per_token=66560),
        _greedy("int8", 8192, top1_agreement=1.0, kl_div=0.0),
        _greedy("turbo4-asym", 2048, top1_agreement=0.99, kl_div=0.0042),
        _greedy(
            "turbo4-asym",
            8192,
            verdict="near-tie",
            near_tie=True,
            first_divergence=40,
            top1_agreement=0.97,
            kl_div=0.012345,
        ),
        _greedy(
            "turbo3-asym",
            2048,
            status="diverged",
            verdict="diverged",
            first_divergence=17,
            token_match=0.3125,
            top1_agreement=0.94,
            kl_div=0.0456,
        ),
        _greedy(
            "turbo3-asym",
            8192,
            status="diverged",
            verdict="diverged",
            first_divergence=9,
            top1_agreement=0.93,
            kl_div=0.0789,
        ),
        _greedy(
            "turbo4",
            2048,
            status="fallback",
            effective_mode="turbo4-asym",
            top1_agreement=0.99,
            kl_div=0.0042,
            notes=FALLBACK_NOTE,
        ),
        _greedy(
            "turbo4",
            8192,
            status="error",
            verdict="",
            effective_mode="turbo4-asym",
            notes="RuntimeError: illegal | memory access",
        ),
        _greedy("turbo4-delegated", 2048, top1_agreement=1.0, kl_div=0.0),
        _greedy(
            "turbo4-delegated",
            8192,
            status="degenerate",
            verdict="degenerate",
            degenerate=True,
            degenerate_reason="repetition",
            top1_agreement=0.41,
            kl_div=2.5,
        ),
    ]
    for mode, ppl, delta in (("fp16", 12.3456, None), ("int8", 12.35, 0.0044), ("turbo3-asym", 12.9, 0.5544)):
        rows.append(_greedy(mode, 2048, verdict="", check="ppl", ppl=ppl, ppl_delta=delta, identical_to_fp16=None))
    for mode in ("int8", "turbo4-asym"):
        for ctx in (2048, 8192):
            for depth in (0.25, 0.75):
                for trial in range(2):
                    hit = not (mode == "turbo4-asym" and ctx == 8192 and depth == 0.75 and trial == 0)
                    rows.append(
                        _greedy(
                            mode, ctx, verdict="", check="niah", niah_depth=depth, niah_hit=hit, identical_to_fp16=None
                        )
                    )
    rows.append(_greedy("fp16", 2048, check="max_kv", max_kv_size=512, keep=4, degenerate=False))
    rows.append(
        _greedy(
            "int8",
            2048,
            check="max_kv",
            max_kv_size=512,
            keep=0,
            status="degenerate",
            verdict="degenerate",
            degenerate=True,
        )
    )
    rows.append(_greedy("int8", 2048, check="prefix_reuse", cached_tokens=1024))
    rows.append(_greedy("int8", 2048, check="kernel", kernel="triton", kernel_agrees=True, verdict=""))
    return rows


def _bench(mode, ctx, batch, tok=None, ratio=None, peak=None, status="ok", **kw):
    row = {
        **PROV,
        "kv_cache_mode": mode,
        "effective_mode": mode,
        "context_tokens": ctx,
        "gen_tokens": 128,
        "batch": batch,
        "decode_tok_s": tok,
        "decode_tok_s_min": tok * 0.99 if tok else None,
        "decode_tok_s_max": tok * 1.01 if tok else None,
        "decode_ratio_vs_fp16": ratio,
        "peak_mem_gb": peak,
        "status": status,
        "repeats": 3,
        "warmup": 16,
        "peak_mem_kind": "cuda_max_allocated",
        "kv_bytes_per_token": {"fp16": 131072, "int8": 66560, "turbo4-asym": 82432}.get(mode),
        "roofline_frac": 0.5 if tok else None,
        "kernel": "triton",
        "cuda_graphs": True,
        "bandwidth_gbs": 4300.0,
        "synthetic": False,
    }
    row.update(kw)
    return row


def bench_rows():
    return [
        _bench("fp16", 2048, 1, 263.4, 1.0, 16.5, decode_tok_s_min=260.1, decode_tok_s_max=265.0),
        _bench("int8", 2048, 1, 250.0, 0.949, 16.4),
        _bench("turbo4-asym", 2048, 1, 240.0, 0.911, 16.3),
        _bench("fp16", 32768, 1, 211.0, 1.0, 20.37),
        _bench("int8", 32768, 1, 236.2, 1.1194, 18.18),
        _bench("turbo4-asym", 32768, 1, 200.0, 0.948, 19.0),
        _bench("fp16", 2048, 16, 3000.0, 1.0, 30.0),
        _bench("int8", 2048, 16, 3100.0, 1.0333, 25.0),
        _bench("fp16", 32768, 16, status="oom", notes="CUDA out of memory"),
        _bench("int8", 32768, 16, 1200.0, None, 90.0),
        _bench("fp16", 32768, 8, 1500.0, 1.0, 80.0, notes="capacity search"),
        _bench("fp16", 32768, 16, status="oom", notes="capacity search: CUDA out of memory"),
        _bench("int8", 32768, 32, 2100.0, None, 120.0, notes="capacity search"),
        _bench("int8", 32768, 64, status="oom", notes="capacity search"),
    ]


def runs_rows():
    return [
        {
            **{k: PROV[k] for k in ("date", "device", "model", "kvbench_version", "git_commit")},
            "job": "4711",
            "command": "kvbench audit --modes all --contexts 2048,8192",
            "wall_s": 312.4,
        },
        {
            **{k: PROV[k] for k in ("date", "device", "model", "kvbench_version", "git_commit")},
            "job": "4712",
            "command": "kvbench decode-bench --modes fp16,int8,turbo4-asym --contexts 2048,32768 --batch 1,16",
            "wall_s": 900.0,
        },
    ]


def write(folder: Path, audit=None, bench=None, runs=None) -> Path:
    for stem, cols, rows in (
        ("audit", AUDIT_COLUMNS, audit),
        ("bench", BENCH_COLUMNS, bench),
        ("runs", RUNS_COLUMNS, runs),
    ):
        if rows:
            w = ResultsWriter(folder, stem, cols, formats=("csv",))
            for r in rows:
                w.write(r)
    return folder


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    folder = write(tmp_path_factory.mktemp("full"), audit_rows(), bench_rows(), runs_rows())
    (folder / "extra_sweep.csv").write_text("a,b\n1,2\n")
    path = render_report([folder])
    return folder, path, path.read_text()


def _matrix_rows(text: str) -> list[str]:
    block = text.split("## Audit status matrix", 1)[1].split("\n## ", 1)[0].split("Long-context checks", 1)[0]
    return [ln for ln in block.splitlines() if ln.startswith("| `")]


def test_report_sections_and_header(full):
    folder, path, text = full
    assert path == folder / "report.md"
    for heading in SECTIONS:
        assert heading in text, heading
    for heading in (
        "## Quality per context",
        "## Perplexity",
        "## Needle in a haystack",
        "## Capacity",
        "## Sliding window",
        "## Prefix reuse",
        "## Kernel checks",
    ):
        assert heading in text, heading
    assert "NVIDIA H200 (driver 570.86)" in text
    assert "`HuggingFaceTB/SmolLM2-135M` (weights hash `abc123def456`)" in text
    assert "0.1.0 (git deadbee)" in text  # short form, as git prints it
    assert "torch 2.9.0 · triton 3.5.0 · transformers 4.57.1" in text
    assert "kvbench decode-bench --modes fp16,int8,turbo4-asym --contexts 2048,32768 --batch 1,16" in text
    assert "# 2025-11-30 · job 4711 · NVIDIA H200 · 312.4 s" in text


def test_status_matrix(full):
    _, _, text = full
    rows = _matrix_rows(text)
    modes = [r.split("|")[1].strip() for r in rows]
    assert modes == ["`fp16`", "`int8`", "`turbo4-asym`", "`turbo3-asym`", "`turbo4`", "`turbo4-delegated`"]
    by_mode = {r.split("|")[1].strip().strip("`"): r for r in rows}
    assert "`--modes int8`" in by_mode["int8"]
    assert "2K: identical (top-1 100.0%, KL 0)" in by_mode["int8"]
    # ppl_delta is the relative change vs fp16, shown as a signed percentage.
    assert "ppl Δ +0.44% at 2K" in by_mode["int8"]
    assert "ppl Δ +55.4% at 2K" in by_mode["turbo3-asym"]
    assert "2K 0.95x, 32K 1.12x" in by_mode["int8"]
    assert "18.18 GB at 32K (-10.8% vs fp16)" in by_mode["int8"]
    assert "8K: near-tie at token 40 (top-1 97.0%, KL 0.0123)" in by_mode["turbo4-asym"]
    assert "2K: diverged at token 17" in by_mode["turbo3-asym"]
    assert "8K: degenerate (repetition)" in by_mode["turbo4-delegated"]
    assert FALLBACK_SHORT in by_mode["turbo4"] and "pass --no-fallback" not in by_mode["turbo4"]
    assert "error at 8K" in by_mode["turbo4"]
    # A pipe inside a note is escaped, so the row keeps its 7 cells.
    assert "illegal \\| memory access" in by_mode["turbo4"]
    assert len(re.split(r"(?<!\\)\|", by_mode["turbo4"])) == 9
    assert "baseline: 2K 263.4 tok/s, 32K 211.0 tok/s" in by_mode["fp16"]


def test_quality_and_checks(full):
    _, _, text = full
    quality = text.split("## Quality per context", 1)[1].split("\n## ", 1)[0]
    assert "| Mode | 2K | 8K |" in quality
    assert "diverged@17 · tokens 31.3% · top-1 94.0% · KL 0.0456" in quality
    assert "identical · top-1 100.0% · KL 0 |" in quality  # no token share where the tokens are identical
    assert "share of the 64 greedy tokens equal to fp16's" in quality
    assert "12.350 (Δ +0.44%)" in text and "12.900 (Δ +55.4%)" in text
    assert "Δ is the relative change vs fp16" in text and "difference to fp16" not in text
    assert "| `turbo4-asym` | 75% | 2/2 | 1/2 |" in text
    assert "max 512, keep 0" in text


def _long_context_rows():
    """max_kv with keep 4 and keep 0, prefix reuse and NIAH at 2K and 8K, for three modes."""
    rows = []
    for mode in ("fp16", "int8", "turbo4-asym"):
        rows.append(_greedy(mode, 2048, verdict="reference" if mode == "fp16" else "identical"))
        for ctx in (2048, 8192):
            near = {"check": "max_kv", "max_kv_size": 256, "keep": 4, "degenerate": False}
            if mode == "int8" and ctx == 8192:
                rows.append(_greedy(mode, ctx, verdict="near-tie", near_tie=True, first_divergence=12, **near))
            else:
                rows.append(_greedy(mode, ctx, **near))
            rows.append(
                _greedy(
                    mode,
                    ctx,
                    check="max_kv",
                    max_kv_size=256,
                    keep=0,
                    status="degenerate",
                    verdict="degenerate",
                    degenerate=True,
                    degenerate_reason="repeated 4-grams 85% (loop: 'and and and ...')",
                )
            )
            diverged = mode == "turbo4-asym" and ctx == 8192
            rows.append(
                _greedy(
                    mode,
                    ctx,
                    check="prefix_reuse",
                    status="diverged" if diverged else "ok",
                    verdict="diverged" if diverged else "identical",
                    first_divergence=5 if diverged else None,
                    identical_to_fp16=None,
                    cached_tokens=ctx - 24,
                    notes=f"reused {ctx - 24} cached tokens; compared with a fresh prefill of the same {ctx} tokens",
                )
            )
            for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
                hit = not (ctx == 8192 and depth == 0.0)
                rows.append(
                    _greedy(mode, ctx, verdict="", check="niah", niah_depth=depth, niah_hit=hit, identical_to_fp16=None)
                )
    return rows


def test_long_context_matrix(tmp_path):
    text = render_report([write(tmp_path, audit=_long_context_rows())]).read_text()
    block = _section(text, "## Audit status matrix").split("### Long-context checks", 1)[1]
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    assert lines[0] == ("| Mode | --max-kv-size 256, keep 4 | --max-kv-size 256, keep 0 | Prefix reuse | NIAH hits |")
    rows = {ln.split("|")[1].strip().strip("`"): [c.strip() for c in ln.split("|")[2:-1]] for ln in lines[2:]}
    assert list(rows) == ["fp16", "int8", "turbo4-asym"]  # one row per mode
    assert rows["fp16"] == [
        "2K, 8K identical",
        "2K, 8K **degenerate (loop)**",
        "2K, 8K identical (2024/8168 cached)",
        "2K 5/5 · 8K 4/5",
    ]
    assert rows["int8"][0] == "2K identical · 8K near-tie@12"
    assert rows["turbo4-asym"][2] == "2K identical · 8K diverged@5 (2024/8168 cached)"
    # The matrix comes right after the status matrix; the per-check sections stay below as the detail.
    assert text.index("### Long-context checks") < text.index("## Quality per context")
    for heading in ("## Sliding window (--max-kv-size)", "## Prefix reuse", "## Needle in a haystack"):
        assert heading in text, heading


def test_an_audit_run_again_replaces_its_cells(tmp_path):
    """Folders merged where an audit ran twice: each cell counts once, the later run's (its needles
    are not 10 trials of 5 depths, its kernel check is one row). One file's trials of a cell all count
    (`test_quality_and_checks`: two a depth)."""
    kernel = [r for r in audit_rows() if r["check"] == "kernel"]
    assert kernel, "the fixture has a kernel check"
    first = write(tmp_path / "first", audit=[*_long_context_rows(), *kernel])
    again = [r for r in _long_context_rows() if r["kv_cache_mode"] == "fp16" and r["check"] in ("greedy", "niah")]
    for r in again:
        if r["check"] == "niah":
            r["niah_hit"] = True  # the later run found every needle
    again.append({**kernel[0], "top1_agreement": 0.5, "kl_div": 0.01})
    text = render_report([first, write(tmp_path / "again", audit=again)], out_dir=tmp_path / "merged").read_text()
    block = _section(text, "## Audit status matrix").split("### Long-context checks", 1)[1]
    rows = {ln.split("|")[1].strip().strip("`"): ln for ln in block.splitlines() if ln.startswith("| `")}
    assert rows["fp16"].rstrip(" |").endswith("| 2K, 8K 5/5")
    assert rows["int8"].rstrip(" |").endswith("| 2K 5/5 · 8K 4/5")
    check = text.split("Kernel checks", 1)[1]
    assert [ln.split("|")[3].strip() for ln in check.splitlines() if ln.startswith("| `int8` | 2K |")] == ["50.0%"]


def test_no_long_context_matrix_without_its_checks(tmp_path):
    text = render_report([write(tmp_path, audit=[_greedy("fp16", 2048, verdict="reference")])]).read_text()
    assert "Long-context checks" not in text


def test_statuses_explained(full):
    _, _, text = full
    block = text.split("## What the statuses mean", 1)[1].split("\n## ", 1)[0]
    for status in ("ok", "diverged", "degenerate", "fallback", "oom", "error"):
        assert f"- `{status}` (" in block, status
    assert "Not present here: `skipped`" in block


def test_benchmark_table(full):
    _, _, text = full
    bench = text.split("## Benchmark", 1)[1].split("\n## ", 1)[0]
    assert "263.4 (260.1–265.0)" in bench
    assert (
        "| 32K | 1 | `int8` | triton, graphs | 236.2 (233.8–238.6) | 1.12x | 18.18 | -2.19 (-10.8%) | 50.0% | 65.0 KiB |"
        in bench
    )
    assert "| 32K | 16 | `fp16` | triton, graphs | **oom** |" in bench and "CUDA out of memory" in bench
    assert "CUDA allocator" in bench
    # Rows are sorted by context, then batch, then mode order.
    data = [ln for ln in bench.splitlines() if re.match(r"\| \d+K \|", ln)]
    keys = [(ln.split("|")[1].strip(), int(ln.split("|")[2])) for ln in data]
    assert keys == sorted(keys, key=lambda k: (int(k[0][:-1]), k[1]))
    capacity = text.split("## Capacity", 1)[1].split("\n## ", 1)[0]
    assert "| `fp16` | 32K | 8 | 80.00 | 16 (oom) |" in capacity
    assert "| `int8` | 32K | 32 | 120.00 | 64 (oom) |" in capacity


def test_summary_and_recommendation_from_data(full):
    _, _, text = full
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "Against fp16: int8 was identical at every audited context" in summary
    assert "turbo3-asym diverged at 2K (token 17) and 8K (token 9)" in summary
    assert "turbo4-delegated degenerated at 8K" in summary
    assert "fp16 decoded 211.0 tok/s" in summary and "int8 1.12x" in summary
    assert "int8 65.0 KiB (1.97x less)" in summary
    rec = text.split("## Recommendation", 1)[1].split("\n## ", 1)[0]
    assert "32K: `int8` 236.2 tok/s (1.12x fp16)" in rec
    assert "Avoid on this setup:" in rec and "`turbo3-asym`" in rec
    assert "Pick: `int8` at 32K (batch 1): 1.12x fp16 decode" in rec
    assert "Capacity at 32K: `fp16` batch 8, `int8` batch 32." in rec


def test_plots_and_links(full):
    folder, _, text = full
    for name in ("report_decode_tok_s.png", "report_peak_mem.png", "report_quality.png", "report_niah.png"):
        png = folder / name
        assert png.exists() and png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in text
    raw = text.split("## Raw data", 1)[1]
    assert "- [audit.csv](audit.csv)" in raw
    assert "- [bench.csv](bench.csv)" in raw
    assert "- [runs.csv](runs.csv)" in raw
    assert "- [extra_sweep.csv](extra_sweep.csv) (not read by the report)" in raw


def test_deterministic(full):
    folder, _, text = full
    again = render_report([folder]).read_text()
    strip = lambda t: re.sub(r"Rendered on .*", "", t)  # noqa: E731
    assert strip(again) == strip(text)


def test_only_audit(tmp_path):
    folder = write(tmp_path / "a", audit=audit_rows())
    text = render_report([folder]).read_text()
    for heading in SECTIONS:
        assert heading in text
    assert "No benchmark rows" in text
    assert len(_matrix_rows(text)) == 6
    assert (folder / "report_quality.png").exists()
    assert not (folder / "report_decode_tok_s.png").exists()


def test_only_bench(tmp_path):
    folder = write(tmp_path / "b", bench=bench_rows())
    text = render_report([folder]).read_text()
    for heading in SECTIONS:
        assert heading in text
    assert "No audit rows" in text
    assert len(_matrix_rows(text)) == 3
    assert "not audited" in text
    assert (folder / "report_decode_tok_s.png").exists()


def test_merge_two_folders(tmp_path):
    job1 = write(tmp_path / "job1", audit=audit_rows())
    extra = _bench("turbo4-asym", 2048, 16, 2900.0, 0.967, 26.0, notes="from job two")
    job2 = write(tmp_path / "job2", bench=[*bench_rows(), extra], runs=runs_rows())
    out = tmp_path / "merged"
    path = render_report([job1, job2], out_dir=out)
    assert path == out / "report.md"
    text = path.read_text()
    assert "diverged at token 17" in text  # from job1's audit
    assert "from job two" in text and "0.97x" in text  # from job2's bench
    assert "- [../job1/audit.csv](../job1/audit.csv)" in text
    assert "- [../job2/bench.csv](../job2/bench.csv) (15 benchmark rows)" in text
    assert (out / "report_decode_tok_s.png").exists()


def test_two_devices_get_their_own_sections(tmp_path):
    h200 = write(tmp_path / "h200", audit=audit_rows(), bench=bench_rows())
    gb10 = [{**r, "device": "NVIDIA GB10", "decode_tok_s": (r["decode_tok_s"] or 0) / 4 or None} for r in bench_rows()]
    other = write(tmp_path / "gb10", bench=gb10)
    text = render_report([h200, other]).read_text()
    assert "### NVIDIA GB10 · HuggingFaceTB/SmolLM2-135M" in text
    assert "### NVIDIA H200 · HuggingFaceTB/SmolLM2-135M" in text
    assert "**NVIDIA GB10 · HuggingFaceTB/SmolLM2-135M**:" in text  # summary per setup
    assert "59.0" in text  # 236.2 / 4 from the GB10 rows
    for name in ("report_decode_tok_s_1.png", "report_decode_tok_s_2.png", "report_quality_2.png"):
        assert (h200 / name).exists() and f"]({name})" in text


def test_header_only_bench(tmp_path):
    folder = write(tmp_path / "h", audit=audit_rows()[:4])
    (folder / "bench.csv").write_text(",".join(BENCH_COLUMNS) + "\n")
    text = render_report([folder]).read_text()
    assert "No benchmark rows" in text and "## Recommendation" in text


def test_sparse_csv_with_missing_columns(tmp_path):
    folder = tmp_path / "sparse"
    folder.mkdir()
    (folder / "audit.csv").write_text(
        "kv_cache_mode,context_tokens,status,top1_agreement\nfp16,1024,ok,\nint8,1024,ok,0.98\nweird,,error,\n"
    )
    (folder / "bench.csv").write_text("kv_cache_mode,context_tokens,decode_tok_s\nfp16,1024,15.2\nint8,1024,\n")
    text = render_report([folder]).read_text()
    assert "`weird`" in text and "15.2" in text
    assert "0.98" not in text or "98.0%" in text


def test_fraction_formatters():
    # Fractions above 1 are real (a pure-read kernel can beat the copy-bandwidth floor), not percentages.
    assert fmt_pct(1.0285) == "102.9%"
    assert fmt_pct(1.0) == "100.0%" and fmt_pct(0.969) == "96.9%" and fmt_pct(0.0) == "0.0%"
    assert fmt_pct(float("nan")) == "—"
    # ppl_delta = ppl / ppl_fp16 - 1, as a signed percentage with 2-3 significant digits.
    assert fmt_ppl_delta(0.000806) == "+0.081%"
    assert fmt_ppl_delta(-3.3e-05) == "-0.0033%"
    assert fmt_ppl_delta(0.0123) == "+1.23%"
    assert fmt_ppl_delta(0.5544) == "+55.4%"
    assert fmt_ppl_delta(None) == "—"


def _h200_like(folder: Path) -> str:
    """Rows shaped like the H200 results: YaRN and generic notes, a fallback and a --no-fallback turbo4."""
    prov = {**PROV, "model": "SmolLM2", "git_commit": "unknown"}
    forced = "turbo4 forced on llama (--no-fallback)"
    audit = []
    for ctx, yarn in (
        (2048, ""),
        (8192, "yarn x2 (8256 positions > 8192 trained)"),
        (32768, "yarn x8 (32832 positions > 8192 trained)"),
    ):

        def notes(*extra, yarn=yarn):
            return "; ".join(n for n in (yarn, *extra) if n)

        for mode, eff, status, note in (
            ("fp16", "fp16", "ok", ""),
            ("turbo4", "turbo4-asym", "fallback", FALLBACK_NOTE),
            ("turbo4", "turbo4", "diverged", forced),
        ):
            verdict = "reference" if mode == "fp16" else "near-tie" if eff != "turbo4" else "diverged"
            base = {**prov, "effective_mode": eff, "status": status}
            audit.append(
                _greedy(mode, ctx, verdict=verdict, first_divergence=7, top1_agreement=0.9, notes=notes(note), **base)
            )
            if eff == "turbo4":
                continue  # the raw turbo4 job ran only the greedy check
            tf = f"teacher-forced on fp16's 64 tokens; max |logit difference| {0.625 if mode == 'fp16' else 1.38}"
            audit.append(
                _greedy(
                    mode,
                    ctx,
                    verdict="",
                    check="kernel",
                    kl_div=0.001,
                    top1_agreement=0.97,
                    notes=notes(note, tf),
                    **base,
                )
            )
            reuse = f"reused {ctx - 24} cached tokens; compared with a fresh prefill of the same {ctx} tokens"
            audit.append(
                _greedy(mode, ctx, check="prefix_reuse", cached_tokens=ctx - 24, notes=notes(note, reuse), **base)
            )
            if ctx < 32768:
                ppl = 28.886 if mode == "fp16" else 28.8948
                audit.append(
                    _greedy(
                        mode,
                        ctx,
                        verdict="",
                        check="ppl",
                        ppl=ppl,
                        ppl_delta=None if mode == "fp16" else 0.000806,
                        notes=notes(note, f"1 window(s) of {ctx} tokens, chunk 1024"),
                        **base,
                    )
                )
    bench = []
    for ctx in (2048, 32768):
        fill = f"context filled with random K/V (no prefill; synthetic model); decode positions {ctx + 8}..{ctx + 200}"
        for batch in (1, 16):
            bench.append(_bench("fp16", ctx, batch, 200.0, 1.0, 20.0, notes=fill, roofline_frac=1.0285, **prov))
            bench.append(
                _bench(
                    "turbo4", ctx, batch, 190.0, 0.95, 19.0, notes=f"{forced}; {fill}", effective_mode="turbo4", **prov
                )
            )
            bench.append(
                _bench(
                    "turbo4",
                    ctx,
                    batch,
                    195.0,
                    0.97,
                    19.5,
                    status="fallback",
                    effective_mode="turbo4-asym",
                    notes=f"{FALLBACK_NOTE}; {fill}",
                    **prov,
                )
            )
    write(folder, audit=audit, bench=bench)
    return render_report([folder]).read_text()


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_roofline_above_one(tmp_path):
    text = _h200_like(tmp_path)
    bench = _section(text, "## Benchmark")
    assert "| 102.9% |" in bench
    assert "| 1.0% |" not in bench
    # said once: the copy's bandwidth is not a bound for a step that mostly reads
    assert "4 rows read above 100% (up to 102.9%): the bandwidth is a copy's" in bench
    # one text window per context: a small Δ is unresolved
    assert "One text window per context (`--ppl-windows 1`)" in text


def test_batches_named_in_the_matrix_pick_and_capacity(full, tmp_path):
    """The status matrix's speed and memory columns say which batch they are; the pick gives the other batches'
    ratio of the picked mode; the capacity section states its budget; the KV bytes are said to be the longest
    context's; a process' peak RSS is not offered as a memory saving."""
    _folder, _path, text = full
    assert "| Decode vs fp16, batch 1 | Peak memory, batch 1 |" in text
    two = [
        _bench("fp16", 32768, 1, 200.0, 1.0, 20.0),
        _bench("int8", 32768, 1, 216.0, 1.08, 18.0),
        _bench("fp16", 32768, 16, 800.0, 1.0, 85.0),
        _bench("int8", 32768, 16, 1208.0, 1.51, 51.0),
    ]
    rec = _section(render_report([write(tmp_path / "two", bench=two)]).read_text(), "## Recommendation")
    pick = [ln for ln in rec.splitlines() if "Pick:" in ln]
    assert pick and "Pick: `int8` at 32K (batch 1): 1.08x fp16 decode (1.51x at batch 16); quality" in pick[0], pick
    cap = [
        _bench("fp16", 2048, 1, 200.0, 1.0, 10.0),
        _bench("int8", 2048, 1, 220.0, 1.1, 9.0),
        _bench(
            "fp16",
            32768,
            30,
            None,
            None,
            145.0,
            notes="capacity search at 32768 tokens: largest batch that fits in 133.2 GB beside the weights (allocated and decoded)",
        ),
    ]
    capacity = _section(render_report([write(tmp_path / "cap", bench=cap)]).read_text(), "## Capacity")
    assert "The search's budget was 133.2 GB: the memory free once the weights were loaded" in capacity
    summary = _section(text, "## Summary")
    assert "KV bytes per token at 32K:" in summary
    cpu = {"peak_mem_kind": "cpu_peak_rss", "device": "CPU"}
    rows = [_bench("fp16", 2048, 1, 20.0, 1.0, 0.97, **cpu), _bench("int8", 2048, 1, 21.0, 1.05, 0.971, **cpu)]
    audit = [_greedy("fp16", 2048, verdict="reference", device="CPU"), _greedy("int8", 2048, device="CPU")]
    rec = _section(render_report([write(tmp_path / "cpu", audit=audit, bench=rows)]).read_text(), "## Recommendation")
    saving = [ln for ln in rec.splitlines() if "Best memory saving" in ln]
    assert saving and "peak" not in saving[0], saving


def test_one_context_plots_bars_and_a_long_title_wraps(tmp_path):
    """A run at a single context draws a bar per mode (not a column of dots 'vs context'); a title wider than
    the figure goes on two lines."""
    from matplotlib.figure import Figure

    shown = {}
    real = report._save

    def save(fig: Figure, path):
        shown[path.name] = (fig._suptitle.get_text(), [len(ax.patches) for ax in fig.axes])
        real(fig, path)

    rows = [
        _bench(m, 2048, 1, tok, tok / 200.0, 10.0)
        for m, tok in (("fp16", 200.0), ("int8", 210.0), ("turbo4-asym", 190.0))
    ]
    rows = [
        {**r, "model": "a-model-with-a-rather-long-name-to-fill-the-title (Q4_1 GGUF, some package 0.1.2)"}
        for r in rows
    ]
    import unittest.mock

    with unittest.mock.patch.object(report, "_save", save):
        render_report([write(tmp_path, bench=rows)])
    title, bars = shown["report_decode_tok_s.png"]
    assert title.startswith("Decode speed at 2K\n") and bars == [3], (title, bars)


def test_no_fallback_rows_are_not_fallbacks(tmp_path):
    text = _h200_like(tmp_path)
    rows = _matrix_rows(text)
    by_mode = {r.split("|")[1].strip().strip("`"): r for r in rows}
    raw = by_mode["turbo4 (no fallback)"]
    assert "`--modes turbo4 --no-fallback`" in raw
    assert "(fallback)" not in raw and "ran as" not in raw
    assert "`--modes turbo4`" in by_mode["turbo4"]
    assert "(no fallback) ran as" not in text
    assert "ran as turbo4 (fallback)" not in text
    assert "(as turbo4)" not in text  # benchmark table suffix
    assert "(as turbo4-asym)" in text  # the real fallback keeps it
    rec = _section(text, "## Recommendation")
    fallback_lines = [ln for ln in rec.splitlines() if "Fallback:" in ln]
    assert fallback_lines and all("no fallback" not in ln for ln in fallback_lines)
    assert "`turbo4` ran as `turbo4-asym`" in rec
    summary = _section(text, "## Summary")
    assert "turbo4 ran as turbo4-asym (fallback)" in summary


def test_status_matrix_notes_are_short(tmp_path):
    text = _h200_like(tmp_path)
    rows = _matrix_rows(text)
    by_mode = {r.split("|")[1].strip().strip("`"): r for r in rows}
    notes = {m: re.split(r"(?<!\\)\|", r)[-2].strip() for m, r in by_mode.items()}
    assert notes["turbo4"] == f"{FALLBACK_SHORT}; YaRN at 8K (x2) and 32K (x8)"
    assert notes["turbo4 (no fallback)"] == "turbo4 forced on llama (--no-fallback); YaRN at 8K (x2) and 32K (x8)"
    assert notes["fp16"] == "YaRN at 8K (x2) and 32K (x8)"
    assert "ppl Δ +0.081% at 2K; ppl Δ +0.081% at 8K" in by_mode["turbo4"]
    for r in rows:
        cell = re.split(r"(?<!\\)\|", r)[-2].strip()
        assert len(cell) <= 200, cell
        for generic in (
            "more notes",
            "teacher-forced",
            "reused",
            "window(s)",
            "random K/V",
            "decode positions",
            "yarn x",
        ):
            assert generic not in cell, (generic, cell)


def test_repeated_notes_hoisted_above_tables(tmp_path):
    text = _h200_like(tmp_path)
    kernel = _section(text, "## Kernel checks")
    assert kernel.count("teacher-forced on fp16's 64 tokens") == 1
    assert "Notes on every row: teacher-forced on fp16's 64 tokens." in kernel
    assert "8K: yarn x2 (8256 positions > 8192 trained)" in kernel
    kernel_rows = [ln for ln in kernel.splitlines() if ln.startswith("| `")]
    assert all("yarn" not in ln and "teacher-forced" not in ln for ln in kernel_rows)
    assert sum("max \\|logit difference\\| 1.38" in ln for ln in kernel_rows) == 3  # differs per row: kept
    assert any(FALLBACK_SHORT in ln for ln in kernel_rows)
    prefix = _section(text, "## Prefix reuse")
    assert prefix.count("reused 2024 cached tokens") == 1
    assert all("reused" not in ln for ln in prefix.splitlines() if ln.startswith("| `"))
    bench = _section(text, "## Benchmark")
    assert bench.count("context filled with random K/V") == 1
    assert "Notes on every row: context filled with random K/V (no prefill; synthetic model)." in bench
    assert bench.count("decode positions 2056..2248") == 1
    bench_rows = [ln for ln in bench.splitlines() if re.match(r"\| \d+K \|", ln)]
    assert all("decode positions" not in ln for ln in bench_rows)
    assert sum("turbo4 forced on llama (--no-fallback)" in ln for ln in bench_rows) == 4


def test_git_commit_unknown(tmp_path):
    text = _h200_like(tmp_path)
    assert "0.1.0 (git commit not recorded)" in text
    assert "git unknown" not in text


def test_no_data_raises(tmp_path):
    with pytest.raises(KvbenchError):
        render_report([tmp_path])
    with pytest.raises(KvbenchError):
        render_report([tmp_path / "missing"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x01garbage\xff\xfe,,,\n", "not a CSV text file"),
        (b'kv_cache_mode,context_tokens,status\nfp16,2048,ok\nint8,"unterminated\n', "not a readable CSV"),
    ],
    ids=["binary", "open-quote"],
)
def test_garbled_csv_is_one_error(tmp_path, content, message):
    """A results file that is not CSV text (binary junk, an unterminated quote) is a KvbenchError naming the
    file (one line from the CLI), not a UnicodeDecodeError or a pandas ParserError."""
    (tmp_path / "bench.csv").write_bytes(content)
    with pytest.raises(KvbenchError, match=message) as exc:
        render_report([tmp_path])
    assert "bench.csv" in str(exc.value) and "\n" not in str(exc.value)


def test_cut_last_line_and_bad_lines_are_skipped_with_a_warning(tmp_path, capsys):
    """A CSV copied while being written ends mid-row: that row is dropped, not shown as a mode with no
    data; a row with too many fields is skipped. Each says so in one line on stderr."""
    folder = write(tmp_path / "cut", bench=[_bench("fp16", 2048, 1, 236.2, 1.0, 16.1), _bench("int8", 2048, 1, 200.0)])
    with open(folder / "bench.csv", "a") as f:
        f.write("2025-11-30,NVIDIA H200,HuggingFaceTB/SmolLM2-135M,2048,64,turbo3-asym,1.5")  # no newline: cut
    text = render_report([folder]).read_text()
    assert "turbo3-asym" not in text and "`int8`" in text
    err = capsys.readouterr().err
    assert "bench.csv: the last line is cut short" in err and "Traceback" not in err
    folder = write(tmp_path / "extra", bench=[_bench("fp16", 2048, 1, 236.2, 1.0, 16.1)])
    with open(folder / "bench.csv", "a") as f:
        f.write(",".join(["x"] * (len(BENCH_COLUMNS) + 2)) + "\n")
    render_report([folder])
    err = capsys.readouterr().err.strip()
    assert err.startswith("warning: ") and "skipped line 3" in err and len(err.splitlines()) == 1, err


def test_foreign_header_and_unparsed_numbers_are_warned(tmp_path, capsys):
    """A bench.csv whose header is not kvbench's is skipped with a warning naming its header (not rendered as
    rows of no mode); a value that is not a number in a numeric column is read as missing, and said."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    (folder / "bench.csv").write_text("a,b,c\n1,2,3\n")
    with pytest.raises(KvbenchError, match="no audit.csv or bench.csv rows"):
        render_report([folder])
    err = capsys.readouterr().err.strip()
    assert "bench.csv: no kv_cache_mode column (header: a, b, c); not a kvbench bench.csv, skipped" in err, err
    folder = write(
        tmp_path / "typo",
        bench=[
            _bench("fp16", 2048, 1, 236.2, 1.0, 16.1),
            _bench("int8", 2048, 1, 240.0, 1.02, 15.0, decode_tok_s="24O.0"),
        ],
    )
    render_report([folder])
    err = capsys.readouterr().err.strip()
    assert "bench.csv: 1 value of decode_tok_s is not a number (first '24O.0', data row 2); read as missing" in err
    assert len(err.splitlines()) == 1, err


def test_report_out_blocked_by_a_file_is_one_error(tmp_path):
    folder = write(tmp_path / "r", audit=[_greedy("fp16", 2048, verdict="reference")])
    (tmp_path / "afile").write_text("not a folder")
    for out in (tmp_path / "afile", tmp_path / "afile" / "report.md"):
        with pytest.raises(KvbenchError, match="a file is in the way"):
            render_report([folder], out)
    assert not list(folder.glob("*.tmp"))


# ---------------------------------------------------------------------------
# Peers: transformers' own caches (kvbench.peers), rows with kv_cache_mode "hf:*"

QUANTO_NOTE = "hf:quanto-int4 needs optimum-quanto>=0.2.5: pip install 'kvbench[peers]'"
PEER_ORDER = ["hf:dynamic", "hf:static", "hf:quanto-int4", "hf:quanto-int2", "hf:hqq-int4", "hf:hqq-int8", "hf:fp8"]


def _peer_greedy(mode, ctx, **kw):
    return _greedy(mode, ctx, kernel="transformers", notes=f"transformers {mode} settings", **kw)


def _peer_bench(mode, ctx, batch, tok=None, ratio=None, peak=None, **kw):
    row = _bench(mode, ctx, batch, tok, ratio, peak, **kw)
    row.update(kernel="transformers", cuda_graphs=False, kv_bytes_per_token=kw.get("kv_bytes_per_token"))
    row.setdefault("notes", f"transformers {mode} settings")
    return row


def peer_audit_rows():
    return [
        _peer_greedy("hf:dynamic", 2048, top1_agreement=1.0, kl_div=0.0),
        _peer_greedy("hf:static", 2048, top1_agreement=1.0, kl_div=0.0),
        _peer_greedy("hf:hqq-int8", 2048, verdict="near-tie", near_tie=True, first_divergence=30,
                     top1_agreement=0.98, kl_div=0.003),
        _peer_greedy("hf:fp8", 2048, status="diverged", verdict="diverged", first_divergence=12,
                     top1_agreement=0.9, kl_div=0.05),
        {**_peer_greedy("hf:quanto-int4", 2048, status="error", verdict=""), "notes": QUANTO_NOTE},
        _peer_greedy("hf:hqq-int4", 2048, status="diverged", verdict="diverged", first_divergence=5,
                     top1_agreement=0.85, kl_div=0.12),
        _peer_greedy("hf:quanto-int2", 2048, status="degenerate", verdict="degenerate", degenerate=True,
                     top1_agreement=0.3, kl_div=3.1),
    ]  # fmt: skip


def peer_bench_rows():
    return [
        _peer_bench("hf:dynamic", 2048, 1, 95.0, 0.3607, 17.0, kv_bytes_per_token=131072),
        _peer_bench("hf:static", 2048, 1, 131.7, 0.5, 17.5, kv_bytes_per_token=140000),
        _peer_bench("hf:hqq-int8", 2048, 1, 125.0, 0.4746, 16.9),
        _peer_bench("hf:fp8", 2048, 1, 100.0, 0.3797, 16.9),
        {**_peer_bench("hf:quanto-int4", 2048, 1, status="error"), "notes": QUANTO_NOTE},
        _peer_bench("hf:hqq-int4", 2048, 1, 80.0, 0.3037, 16.8),
        _peer_bench("hf:quanto-int2", 2048, 1, 60.0, 0.2278, 16.7),
        _peer_bench("hf:dynamic", 32768, 1, status="oom", notes="CUDA out of memory"),
    ]


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    folder = write(tmp_path_factory.mktemp("peers"), audit_rows() + peer_audit_rows(), bench_rows() + peer_bench_rows())
    return render_report([folder]).read_text()


def _peer_table_rows(section: str) -> list[list[str]]:
    rows = [ln for ln in section.splitlines() if re.match(r"\| \d+ \|", ln)]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in rows]


def test_no_peers_section_without_peers(full):
    _folder, _path, text = full
    assert "## Peers" not in text
    assert "transformers' own caches" not in text


def test_peers_section_rows_per_width(peers):
    assert "## Peers: transformers' own caches" in peers
    # after the benchmark, before the plots
    assert peers.index("## Benchmark") < peers.index("## Peers") < peers.index("## Plots")
    section = _section(peers, "## Peers: transformers' own caches")
    assert "transformers' own decode loop" in section and "same weights" in section and "same prompt" in section
    rows = _peer_table_rows(section)
    by = {(r[0], r[1], r[2], r[3]): r for r in rows}
    # widths in order 16, 8, 4, 3, 2
    widths = [r[0] for r in rows]
    assert widths == sorted(widths, key=lambda w: -int(w))
    assert {r[0] for r in rows} == {"16", "8", "4", "3", "2"}
    # 16-bit: fp16 vs the fastest of hf:dynamic / hf:static; at 32K hf:dynamic ran out of memory
    r = by[("16", "2K", "1", "`fp16`")]
    assert r[4] == "263.4" and r[5] == "reference"
    assert r[6] == "`hf:static` (fastest of 2)"
    assert r[7] == "131.7" and r[8] == "identical · 100.0% · KL 0"
    assert r[9] == "2.00x"
    r = by[("16", "32K", "1", "`fp16`")]
    assert r[4] == "211.0" and r[5] == "— (not audited)"
    assert r[6] == "— (`hf:dynamic` oom)" and r[7] == "—" and r[9] == "—"
    # 8-bit: int8 vs hf:hqq-int8 (faster than hf:fp8)
    r = by[("8", "2K", "1", "`int8`")]
    assert r[6] == "`hf:hqq-int8` (fastest of 2)"
    assert r[8] == "near-tie@30 · 98.0% · KL 0.003"
    assert r[9] == "2.00x"  # 250.0 / 125.0
    assert ("8", "32K", "1", "`int8`") not in by  # no 8-bit peer ran at 32K
    # 4-bit: every 4-bit kvbench mode beside hf:hqq-int4 (hf:quanto-int4 errored)
    four = [r for r in rows if r[0] == "4"]
    assert [r[3] for r in four] == ["`turbo4-asym`", "`turbo4` (as turbo4-asym)", "`turbo4-delegated`"]
    r = four[0]
    assert r[4] == "240.0" and r[6] == "`hf:hqq-int4` (`hf:quanto-int4` error)"
    assert r[8] == "diverged@5 · 85.0% · KL 0.12" and r[9] == "3.00x"
    assert four[2][4] == "— (not benchmarked)" and four[2][9] == "—"
    # 3-bit: no transformers cache; 2-bit: no kvbench mode
    r = by[("3", "2K", "1", "`turbo3-asym`")]
    assert r[6] == "— (transformers has no 3-bit cache)" and r[9] == "—"
    r = by[("2", "2K", "1", "— (no 2-bit kvbench mode)")]
    assert r[6] == "`hf:quanto-int2`" and r[7] == "60.0" and r[8].startswith("degenerate") and r[9] == "—"


def test_peers_that_did_not_run_are_listed(peers):
    section = _section(peers, "## Peers: transformers' own caches")
    listed = section.split("Peers that could not run", 1)[1]
    assert f"- `hf:quanto-int4`: error (audit 2K, benchmark 2K b=1): {QUANTO_NOTE}" in listed
    assert "- `hf:dynamic`: oom (benchmark 32K b=1): CUDA out of memory" in listed
    assert "hf:hqq-int4`:" not in listed


def test_peers_in_matrix_benchmark_and_summary(peers):
    rows = _matrix_rows(peers)
    modes = [r.split("|")[1].strip().strip("`") for r in rows]
    assert modes == ["fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4", "turbo4-delegated", *PEER_ORDER]
    by_mode = dict(zip(modes, rows, strict=True))
    assert "`--modes hf:quanto-int4`" in by_mode["hf:quanto-int4"]
    assert "error at 2K" in by_mode["hf:quanto-int4"]
    assert "2K: identical (top-1 100.0%, KL 0)" in by_mode["hf:static"]
    bench = _section(peers, "## Benchmark")
    assert "| 2K | 1 | `hf:static` | transformers | 131.7 (130.4–133.0) | 0.50x |" in bench
    assert "| 32K | 1 | `hf:dynamic` | transformers | **oom** |" in bench
    summary = _section(peers, "## Summary")
    line = (
        "Against transformers' own caches: `fp16` decodes 2.00x faster than `hf:static`, the fastest 16-bit peer, "
        "at 2K (batch 1), with identical output."
    )
    assert line in summary
    assert "hf:dynamic 128.0 KiB (same as fp16), hf:static 136.7 KiB (1.07x more)" in summary
    rec = _section(peers, "## Recommendation")
    assert "`fp16` decodes 2.00x faster than `hf:static`" in rec
    assert "best quantized: `hf:" not in rec


def test_peer_summary_quantized_mode(tmp_path):
    audit = [
        _greedy("fp16", 2048, verdict="reference", top1_agreement=1.0, kl_div=0.0),
        _greedy("int8", 2048, top1_agreement=1.0, kl_div=0.0),
        _peer_greedy("hf:hqq-int8", 2048, top1_agreement=1.0, kl_div=0.0),
        _peer_greedy("hf:fp8", 2048, verdict="near-tie", near_tie=True, first_divergence=7, top1_agreement=0.97),
    ]
    bench = [
        _bench("fp16", 2048, 1, 200.0, 1.0, 10.0),
        _bench("int8", 2048, 1, 225.0, 1.125, 9.0),
        _peer_bench("hf:hqq-int8", 2048, 1, 125.0, 0.625, 9.5),
        _peer_bench("hf:fp8", 2048, 1, 150.0, 0.75, 9.5),
    ]
    text = render_report([write(tmp_path, audit, bench)]).read_text()
    summary = _section(text, "## Summary")
    assert (
        "Against transformers' own caches: `int8` decodes 1.50x faster than `hf:fp8`, the fastest 8-bit peer, "
        "at 2K (batch 1); output vs fp16: `int8` identical (top-1 100.0%, KL 0), `hf:fp8` near-tie at token 7 "
        "(top-1 97.0%)."
    ) in summary
    section = _section(text, "## Peers: transformers' own caches")
    rows = _peer_table_rows(section)
    assert [(r[0], r[3], r[6], r[9]) for r in rows] == [
        ("16", "`fp16`", "— (no 16-bit peer in these results; `hf:dynamic` and `hf:static` not run)", "—"),
        ("8", "`int8`", "`hf:fp8` (fastest of 2)", "1.50x"),
    ]
    assert "Peers that could not run" not in section


def test_header_names_the_builds_that_measured_the_rows(tmp_path):
    """A later resumed run that added no row is in runs.csv but did not measure anything."""
    later = {**runs_rows()[0], "git_commit": "cafe00000000", "command": "kvbench audit --resume"}
    text = render_report([write(tmp_path, audit_rows(), None, [*runs_rows(), later])]).read_text()
    header = text.split("## ", 1)[0]
    assert f"(git {PROV['git_commit'][:7]})" in header
    assert "cafe000" not in header
    assert "kvbench audit --resume" in text  # still listed among the commands


def test_out_may_name_the_report_file(tmp_path):
    folder = write(tmp_path / "r", audit=[_greedy("fp16", 2048, verdict="reference")])
    path = render_report([folder], tmp_path / "elsewhere" / "h200.md")
    assert path == tmp_path / "elsewhere" / "h200.md" and path.is_file()
    assert not (tmp_path / "elsewhere" / "h200.md" / "report.md").exists()
    assert render_report([folder], tmp_path / "dir") == tmp_path / "dir" / "report.md"


@pytest.mark.parametrize(
    "modes",
    [
        ["fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4 (no fallback)", "turbo4-delegated"],
        ["fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4", "turbo4 (no fallback)", "turbo4-delegated", "fp8"],
    ],
    ids=["no-fallback-alone", "beside-its-mode"],
)
def test_plot_colors_distinct(modes):
    """Every plotted mode gets a color of its own; kvbench's modes keep theirs across plots,
    and a "(no fallback)" label takes its mode's color when that mode is not plotted."""
    colors = report._mode_colors(modes)
    assert len(set(colors.values())) == len(modes)
    alone = report._mode_colors(["fp16", "turbo4"])
    assert colors["fp16"] == alone["fp16"]
    if "turbo4" not in modes:
        assert colors["turbo4 (no fallback)"] == alone["turbo4"]


def test_kernel_check_agreement_and_flips(tmp_path):
    """The kernel table's "Agree" is the audit's `kernel_agrees` where the file has it, else the same
    KL rule (`kernel_paths_agree`); where the argmax flips sat is its own column, so a clear flip
    that the KL accepts stays visible."""
    rows = [
        _greedy("fp16", 32768, verdict="reference", top1_agreement=1.0, kl_div=0.0),
        _greedy("int8", 32768, check="kernel", kernel="triton vs reference", kernel_agrees=True, verdict="near-tie",
                kl_div=0.003, top1_agreement=0.92),
        _greedy("turbo4-asym", 32768, check="kernel", kernel="triton vs reference", kernel_agrees=True,
                verdict="diverged", kl_div=0.0165, top1_agreement=0.94),
        _greedy("turbo3-asym", 32768, check="kernel", kernel="triton vs reference", kernel_agrees=False,
                verdict="diverged", kl_div=0.0165, top1_agreement=0.94),
        _greedy("turbo4-delegated", 32768, check="kernel", kernel="triton vs reference", verdict="identical",
                kl_div=0.2, top1_agreement=1.0),
    ]  # fmt: skip
    kernel = _section(render_report([write(tmp_path, audit=rows)]).read_text(), "## Kernel checks")
    cells = {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[5:7]]
        for ln in kernel.splitlines()
        if ln.startswith("| `")
    }
    assert cells == {
        "`int8`": ["yes", "near-tie"],
        "`turbo4-asym`": ["yes*", "**diverged**"],  # agrees by KL, a clear flip beside it: marked, explained
        "`turbo3-asym`": ["**no**", "**diverged**"],
        "`turbo4-delegated`": ["**no**", "identical"],  # no flag in the file: KL 0.2 > the bound
    }
    assert "yes*: the paths agree by KL, yet an argmax flipped" in kernel
    assert "differs from the KL's: `turbo3-asym` at 32K." in kernel  # the file's call, older than the KL rule


def test_kernel_check_with_the_fp32_yardstick(tmp_path):
    """Rows with the float32 yardstick show how far each path sits from it, and the "Agree" cell follows
    the same rule as the audit (`kernel_paths_agree` with the yardstick): a KL between the paths above the
    bound agrees when the Triton path is no farther from float32 than twice the reference's distance."""
    rows = [
        _greedy("fp16", 32768, verdict="reference", top1_agreement=1.0, kl_div=0.0),
        _greedy("turbo4", 32768, check="kernel", kernel="triton vs reference", kernel_agrees=True,
                verdict="near-tie", kl_div=0.078, kl_ref_fp32=0.125, kl_kernel_fp32=0.074, top1_agreement=0.83),
        _greedy("int8", 32768, check="kernel", kernel="triton vs reference", verdict="diverged",
                kl_div=0.09, kl_ref_fp32=0.006, kl_kernel_fp32=0.08, top1_agreement=0.8),
        _greedy("turbo4-asym", 32768, check="kernel", kernel="triton vs reference", kernel_agrees=True,
                verdict="identical", kl_div=0.007, top1_agreement=1.0),
    ]  # fmt: skip
    kernel = _section(render_report([write(tmp_path, audit=rows)]).read_text(), "## Kernel checks")
    assert "KL from float32 (reference / Triton)" in kernel and "the yardstick" in kernel
    cells = {
        ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[4:7]]
        for ln in kernel.splitlines()
        if ln.startswith("| `")
    }
    assert cells == {
        "`turbo4`": ["0.078", "0.125 / 0.074", "yes"],
        "`int8`": ["0.09", "0.006 / 0.08", "**no**"],  # no flag in the file: the rule with its yardstick
        "`turbo4-asym`": ["0.007", "—", "yes"],
    }
    assert "differs from the KL's" not in kernel  # the file's calls are the rule's


# ---------------------------------------------------------------------------
# Review fixes: plot names, duplicates, timing noise, estimated capacity, wording, a degenerate reference


def test_reports_sharing_a_folder_keep_their_own_plots(tmp_path):
    """`--out x/a.md` then `--out x/b.md`: each report links plots named after it, so b does not overwrite a's."""
    a = write(tmp_path / "a", audit=audit_rows(), bench=bench_rows())
    b = write(tmp_path / "b", bench=[_bench("fp16", 4096, 1, 100.0, 1.0, 10.0)])
    out = tmp_path / "x"
    text_a = render_report([a], out / "a.md").read_text()
    text_b = render_report([b], out / "b.md").read_text()
    for name in ("a_decode_tok_s.png", "a_peak_mem.png", "a_quality.png", "a_niah.png"):
        assert (out / name).is_file() and f"]({name})" in text_a, name
    assert "](b_decode_tok_s.png)" in text_b and (out / "b_decode_tok_s.png").is_file()
    assert "report_" not in text_a + text_b and not list(out.glob("report_*.png"))
    # report.md keeps today's names
    text = render_report([b], out / "report.md").read_text()
    assert "](report_decode_tok_s.png)" in text and (out / "report_decode_tok_s.png").is_file()


def test_duplicate_cells_are_dropped_with_a_note(tmp_path):
    """The same cell appended three times (one re-run with other settings): the latest row is shown, the
    summary counts what is shown, and a note says how many rows were dropped and which settings differ."""
    bench = [
        _bench("fp16", 2048, 1, 200.0, 1.0, 10.0, gen_tokens=64),
        _bench("int8", 2048, 1, 210.0, 1.05, 9.0),
        _bench("fp16", 2048, 1, 201.0, 1.0, 10.0, gen_tokens=64),
        _bench("fp16", 2048, 1, 190.0, 1.0, 10.0, gen_tokens=128),
    ]
    text = render_report([write(tmp_path / "gen", bench=bench)]).read_text()
    summary = _section(text, "## Summary")
    assert "(2 rows)" in summary
    assert "**Note**: 2 benchmark rows dropped as duplicates" in summary
    assert "The rows of a cell differ in `gen_tokens`" in summary
    table = _section(text, "## Benchmark")
    assert "| 2K | 1 | `fp16` | triton, graphs | 190.0 " in table and "200.0" not in table and "201.0" not in table
    # Duplicates with equal settings (and an audit cell run twice in one file) say so.
    audit = [_greedy("fp16", 2048, verdict="reference"), _greedy("int8", 2048), _greedy("int8", 2048)]
    text = render_report([write(tmp_path / "same", audit=audit, bench=bench[:3])]).read_text()
    note = [ln for ln in _section(text, "## Summary").splitlines() if ln.startswith("**Note**")]
    assert note == [
        "**Note**: 1 benchmark and 1 audit rows dropped as duplicates: each repeats a cell that has a later row "
        "(the same cell run again), and the tables show the latest row of each cell. The duplicates were run "
        "with the same settings."
    ]
    # No duplicates, no note.
    assert "**Note**" not in render_report([write(tmp_path / "none", bench=bench[:2])]).read_text()


def test_noisy_timing_is_flagged_and_the_pick_says_so(tmp_path):
    """A single repeat or a min–max spread above 10% of the median marks the cell (and ratios on it), and
    the Pick names the noisy cells it rests on; tok/s is said to be summed over the batch."""
    bench = [
        _bench("fp16", 2048, 1, 200.0, 1.0, 10.0),
        _bench("int8", 2048, 1, 260.0, 1.3, 9.0, decode_tok_s_min=230.0, decode_tok_s_max=290.0),  # 23% spread
        _bench("turbo4-asym", 2048, 1, 210.0, 1.05, 9.5, repeats=1),
    ]
    text = render_report([write(tmp_path / "noisy", bench=bench)]).read_text()
    table = _section(text, "## Benchmark")
    assert "Decode tok/s, summed over the batch (median, min–max)" in table
    assert "summed over the batch (batch × timed tokens / seconds" in table
    assert "| 260.0 (230.0–290.0) † | 1.30x † |" in table and "noisy timing: min–max spread 23.1%" in table
    assert "noisy timing: 1 repeat" in table
    assert "| 200.0 (198.0–202.0) | 1.00x |" in table  # fp16 itself is steady
    assert "† noisy timing: the cell ran a single repeat, or its repeats' min–max spread exceeds 10%" in table
    rec = _section(text, "## Recommendation")
    assert "Pick: `int8` at 2K (batch 1): 1.30x fp16 decode" in rec
    assert "The timing it rests on is noisy (`int8` min–max spread 23.1%; `turbo4-asym` 1 repeat)" in rec
    # Steady timings: no flag anywhere.
    full = render_report([write(tmp_path / "steady", bench=bench_rows())]).read_text()
    assert "noisy" not in full and "†" not in full
    # Every cell a single repeat: said once above the table, not as a † and a note on every row.
    single = [{**r, "repeats": 1} for r in bench_rows()]
    table = _section(render_report([write(tmp_path / "single", bench=single)]).read_text(), "## Benchmark")
    assert table.count("Every cell ran a single repeat") == 1
    assert "†" not in table and "noisy timing" not in table


def test_estimated_capacity_is_labelled_as_an_estimate(tmp_path):
    """Off CUDA the capacity search sizes buffers instead of allocating them (kvbench.bench): the report says
    estimated, not "ran" or "oom"."""
    note = "capacity search at 32768 tokens: largest batch that fits in 100.0 GB (estimated from buffer sizes, not allocated)"
    cpu = {"device": "CPU", "peak_mem_kind": "cpu_estimate"}
    bench = [
        _bench("fp16", 2048, 1, 20.0, 1.0, 1.0, **{**cpu, "peak_mem_kind": "cpu_peak_rss"}),
        _bench("fp16", 32768, 8, None, None, 60.0, notes=note, **cpu),
        _bench("fp16", 32768, 9, status="oom", notes=note, **{**cpu, "peak_mem_kind": ""}),
    ]
    text = render_report([write(tmp_path, bench=bench)]).read_text()
    capacity = _section(text, "## Capacity")
    assert "Largest batch that ran" not in capacity and "(oom)" not in capacity
    assert "| `fp16` | 32K | 8 (estimated, not allocated) | 60.00 | 9 (over budget, estimated) |" in capacity
    assert "allocates nothing" in capacity
    rec = _section(text, "## Recommendation")
    assert "Capacity at 32K (estimated from buffer sizes, not allocated): `fp16` batch 8." in rec
    # Allocated (CUDA) searches keep their wording.
    full = render_report([write(tmp_path / "gpu", bench=bench_rows())]).read_text()
    assert "Largest batch that ran (status ok)" in full and "estimated" not in full


def test_small_units_plurals_and_notes(tmp_path):
    """A tiny model's weights in MB, not "0.00 GB"; "1 repeat", "1 command run"; the loader's synthetic note
    not repeated as "synthetic model"; overlapping note parts shown once."""
    tiny = {"model": "dummy:tiny", "synthetic": True, "notes": "synthetic: random weights"}
    audit = [_greedy("fp16", 256, verdict="reference", **tiny), _greedy("int8", 256, **tiny)]
    bench = [
        _bench("fp16", 256, 1, 20.0, 1.0, 0.5, repeats=1, warmup=1, weight_bytes=1444096, model="dummy:tiny"),
        _bench("int8", 256, 1, 21.0, 1.05, 0.5, repeats=1, warmup=1, weight_bytes=1444096, model="dummy:tiny"),
    ]
    folder = write(tmp_path, audit, bench, runs_rows()[:1])
    text = render_report([folder]).read_text()
    method = _section(text, "## Benchmark")
    assert "weights 1.44 MB" in method and "0.00 GB" not in method
    assert "the median over 1 repeat of 128 timed tokens after 1 warm-up token;" in method
    assert "(1 command run)" in _section(text, "## Raw data")
    matrix = "\n".join(_matrix_rows(text))
    assert "synthetic: random weights" in matrix and "synthetic model" not in matrix
    assert report.note_parts("synthetic model; random K/V (no prefill; synthetic model); Yarn x2; yarn  X2") == [
        "random K/V (no prefill; synthetic model)",
        "Yarn x2",
    ]
    assert report.note_parts("RuntimeError: boom; error") == ["RuntimeError: boom", "error"]  # words, not letters
    assert report.fmt_weight_bytes(16.06e9) == "16.06 GB" and report.fmt_weight_bytes(512e3) == "0.51 MB"
    assert report.fmt_weight_bytes(51e3) == "51.00 KB"


def test_long_context_intro_names_only_the_checks_that_ran(tmp_path):
    rows = [r for r in _long_context_rows() if r["check"] in ("greedy", "niah")]
    block = _section(render_report([write(tmp_path, audit=rows)]).read_text(), "## Audit status matrix")
    intro = block.split("### Long-context checks", 1)[1].strip().splitlines()[0]
    assert intro == "Per context: needles found / trials. The section below has the detail."
    text = render_report([write(tmp_path / "all", audit=_long_context_rows())]).read_text()
    assert (
        "Per context: output with a bounded cache vs fp16 (`keep` sink tokens kept), generation from a reused "
        "prefix vs a fresh prefill and needles found / trials. The sections below have the detail."
    ) in text


def test_a_degenerate_reference_is_not_a_mode_to_avoid(tmp_path):
    """A random-weight model's greedy text loops, fp16's too: the report never says to avoid fp16, says the
    reference is degenerate, and judges the modes there by their tokens (the audit flags them degenerate too)."""
    loop = "repeated 4-grams 85% (loop: '466 375 466 ...')"
    audit = [
        _greedy("fp16", 256, verdict="degenerate", degenerate=True, degenerate_reason=loop),
        _greedy("int8", 256, degenerate=True, degenerate_reason=f"{loop}; so is fp16's output"),
        _greedy(
            "turbo3-asym",
            256,
            status="diverged",
            verdict="diverged",
            first_divergence=3,
            identical_to_fp16=False,
            degenerate=True,
            degenerate_reason=f"{loop}; so is fp16's output",
        ),
        _greedy("fp16", 2048, verdict="reference"),
        _greedy("turbo4-asym", 2048, status="degenerate", verdict="degenerate", degenerate=True),
    ]
    text = render_report([write(tmp_path, audit=audit)]).read_text()
    rec = _section(text, "## Recommendation")
    avoid = [ln for ln in rec.splitlines() if "Avoid" in ln]
    # turbo4-asym: fp16 is fine at 2K, a real degeneracy; int8 matched fp16's tokens
    assert avoid == [
        "- Avoid on this setup: `turbo4-asym`: degenerate at 2K; `turbo3-asym`: diverged at token 3 at 256."
    ]
    assert f"The reference output itself is degenerate (`fp16` at 256: {loop})" in rec
    assert "degeneracy verdicts are not meaningful for this model there" in rec
    by_mode = {r.split("|")[1].strip().strip("`"): r for r in _matrix_rows(text)}
    assert "reference (its own output is degenerate at 256)" in by_mode["fp16"]
    assert "256: identical" in by_mode["int8"]
    summary = _section(text, "## Summary")
    assert "int8 was identical at every audited context" in summary
    assert "The fp16 output itself is degenerate at 256" in summary


def test_quality_plot_hatches_failed_cells_and_the_method_names_the_sdpa_check(tmp_path):
    """A degenerate cell's bars are hatched (its top-1 alone would read as good); a benchmark on the Triton path
    says where its fp16 is timed against torch SDPA."""
    import unittest.mock

    hatched = {}
    real = report._save

    def save(fig, path):
        hatched[path.name] = sorted({p.get_hatch() or "" for ax in fig.axes for p in ax.patches})
        real(fig, path)

    audit = [
        _greedy("fp16", 2048, verdict="reference", top1_agreement=1.0, kl_div=0.0),
        _greedy("int8", 2048, top1_agreement=0.95, kl_div=0.002),
        _greedy(
            "turbo3-asym",
            2048,
            status="degenerate",
            verdict="degenerate",
            degenerate=True,
            top1_agreement=0.92,
            kl_div=0.03,
        ),
    ]
    bench = [_bench("fp16", 2048, 1, 200.0, 1.0, 10.0), _bench("int8", 2048, 1, 210.0, 1.05, 9.0)]
    with unittest.mock.patch.object(report, "_save", save):
        text = render_report([write(tmp_path, audit=audit, bench=bench)]).read_text()
    assert hatched["report_quality.png"] == ["", "//"], hatched
    assert "`scripts/bench_kernels.py` times it against torch SDPA" in _section(text, "## Benchmark")


def test_links_are_relative_within_a_tree_and_absolute_across_the_root(tmp_path):
    """A raw-data link climbs only as far as the two paths' common folder; results and report that share
    nothing but the root link by absolute path."""
    from kvbench.report import _rel

    assert _rel(tmp_path / "a/bench.csv", tmp_path / "b") == "../a/bench.csv"
    assert _rel(tmp_path / "a/bench.csv", tmp_path / "a") == "bench.csv"
    far = Path("/proc/self")  # under the root, beside tmp_path's tree
    assert _rel(far / "status", tmp_path / "b") == (far / "status").resolve().as_posix()


def test_fp16_failing_at_the_longest_context_still_reads(tmp_path):
    """The headline GPU case: fp16 runs out of memory at the longest context and int8 fits. The summary gives
    the modes' tok/s there and says fp16 has none; the pick says fp16 ended oom (no '—' ratio, no cut sentence)."""
    rows = [
        _bench("fp16", 2048, 1, 263.4, 1.0, 16.5),
        _bench("int8", 2048, 1, 250.0, 0.949, 16.4),
        _bench("fp16", 32768, 1, status="oom", notes="CUDA out of memory"),
        _bench("int8", 32768, 1, 236.2, None, 18.18),
    ]
    text = render_report([write(tmp_path, bench=rows)]).read_text()
    assert (
        "At 32K (batch 1), the longest measured context; no fp16 result there to compare with, so decode tok/s: int8 236.2"
        in text
    )
    assert "fp16 oom" in text.split("the longest measured context", 1)[1].split("\n", 1)[0]
    pick = next(ln for ln in text.splitlines() if "Pick: `int8`" in ln)
    assert "at 32K (batch 1): 236.2 tok/s where fp16 ended oom" in pick and "—" not in pick


def test_runs_of_another_dtype_or_kv_cap_are_apart(tmp_path):
    """Merged runs at float16 and float32, or with and without --max-kv-size, are separate groups (each with
    its own fp16 reference), named by what sets them apart; they once shared one table and summary, which
    quoted fp16 tok/s from one run and a ratio from the other. A capped run alone still names its cap."""
    f16 = [_bench("fp16", 256, 1, 600.0, 1.0, dtype="float16"), _bench("int8", 256, 1, 420.0, 0.7, dtype="float16")]
    f32 = [_bench("fp16", 256, 1, 650.0, 1.0, dtype="float32"), _bench("int8", 256, 1, 440.0, 0.68, dtype="float32")]
    text = render_report([write(tmp_path / "a", bench=f16), write(tmp_path / "b", bench=f32)]).read_text()
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "dummy" not in summary and "**NVIDIA H200 · HuggingFaceTB/SmolLM2-135M · float16**:" in summary
    assert "fp16 decoded 600.0 tok/s; relative to it: int8 0.70x" in summary
    assert "fp16 decoded 650.0 tok/s; relative to it: int8 0.68x" in summary
    capped = [_bench(m, 256, 1, t, r, dtype="float16", max_kv_size=64, keep=4) for m, t, r in f16_rows()]
    text = render_report([write(tmp_path / "c", bench=capped)]).read_text()
    assert "**NVIDIA H200 · HuggingFaceTB/SmolLM2-135M · KV cap 64 (keep 4)**:" in text.split("## Summary", 1)[1]
    text = render_report([write(tmp_path / "a2", bench=f16), write(tmp_path / "c2", bench=capped)]).read_text()
    bench = text.split("## Benchmark", 1)[1].split("\n## ", 1)[0]
    assert "### NVIDIA H200 · HuggingFaceTB/SmolLM2-135M\n" in bench
    assert "### NVIDIA H200 · HuggingFaceTB/SmolLM2-135M · KV cap 64 (keep 4)\n" in bench


def f16_rows():
    return [("fp16", 610.0, 1.0), ("int8", 300.0, 0.49)]


def test_niah_says_where_fp16_itself_finds_nothing(tmp_path):
    """At a context where fp16 retrieves no needle the check cannot tell modes apart: the section says so
    for that context only."""
    rows = [_greedy("fp16", 2048, verdict="reference"), _greedy("fp16", 32768, verdict="reference")]
    for mode in ("fp16", "int8"):
        for ctx in (2048, 32768):
            for depth in (0.0, 0.5):
                hit = ctx == 2048
                rows.append(
                    _greedy(mode, ctx, verdict="", check="niah", niah_depth=depth, niah_hit=hit, identical_to_fp16=None)
                )
    niah = _section(render_report([write(tmp_path, audit=rows)]).read_text(), "## Needle in a haystack")
    assert "fp16 itself found no needle at 32K: the model cannot do the task there" in niah
    assert "at 2K" not in niah


def test_an_audit_alone_has_no_speed_columns(tmp_path):
    """An audit without a benchmark: the status matrix drops its decode and memory columns (every row said
    "not benchmarked" and "—")."""
    rows = [_greedy("fp16", 2048, verdict="reference"), _greedy("int8", 2048)]
    matrix = _section(render_report([write(tmp_path / "a", audit=rows)]).read_text(), "## Audit status matrix")
    assert "| Mode | CLI flag | Runs | Output quality vs fp16 | Notes |" in matrix and "not benchmarked" not in matrix
    both = render_report([write(tmp_path / "b", audit=rows, bench=bench_rows())]).read_text()
    assert "Decode vs fp16" in _section(both, "## Audit status matrix")

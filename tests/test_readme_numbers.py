"""The numbers in the README's "Results on an H200" are the committed runs': the headline table, fp16's speed and
floor fractions, throughput at capacity, peak memory and raw turbo4's floor arithmetic are read again from the
bench.csv of the results folder the section links, and the audit's summary from the audit.csv of the folder its
paragraph links; each must round to what the README prints, so editing either side alone fails here.
docs/h200-results.md's longer copy of the headline (the table, fp16's speed and floor fractions beside the previous
reading's, throughput at capacity beside an earlier capacity run, peak memory) is read from the same runs. The two-GPU
and peers paragraphs are read from their own folders (the peers' speed spans also from docs/h200-results.md), and
"Results on a 2-core CPU" (its table, the long-context checks, the later `make audit` runs and the peers) from
theirs. The across-runs spread ("Repeatable") is read from the six benchmarks it names, found under results/ by
their commits."""

import functools
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
H200_DOCS = ROOT / "docs" / "h200-results.md"
CONTEXTS = {"2K": 2048, "8K": 8192, "32K": 32768}
MODES = ["fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4", "turbo4-delegated"]
SHORT_NAMES = {"raw turbo4": "turbo4", "delegated": "turbo4-delegated"}  # as the README's prose names modes


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def h200_section() -> str:
    return readme_section("Results on an H200")


def linked_folder(text: str) -> Path:
    """The results folder of the first `[report](results/<folder>/report.md)` link in `text`."""
    found = re.search(r"\[report\]\((results/[^)/]+)/report\.md\)", text)
    assert found, f"no results/<folder>/report.md link in {text[:60]!r}..."
    return ROOT / found.group(1)


def bench_csv(path: Path) -> pd.DataFrame:
    """A bench.csv with its ratio and floor fraction recomputed from the measured columns (tok/s against the
    same run's fp16 at the same context and batch; floor over step time): CSVs written before 29bf116 hold them
    to 4 digits, and rounding those again to a printed 3 can differ from the measurement in the last digit."""
    run = pd.read_csv(path, dtype={"git_commit": str})
    twin = path.with_suffix(".jsonl")  # tok/s to the 3 decimals measured (CSVs before 29bf116 cut 6 digits)
    if twin.is_file():
        rows = pd.read_json(twin, lines=True)
        key = ["kv_cache_mode", "context_tokens", "batch", "notes"]
        assert rows[key].fillna("").equals(run[key].fillna("")), f"{twin} and its CSV hold other rows"
        gap = (rows.decode_tok_s - run.decode_tok_s).abs()
        assert rows.decode_tok_s.isna().equals(run.decode_tok_s.isna()) and (gap.fillna(0) < 0.05).all(), twin
        run["decode_tok_s"] = rows.decode_tok_s
    timed = ~run.notes.str.contains("capacity search", na=False)
    fp16 = run[timed & (run.kv_cache_mode == "fp16")].set_index(["context_tokens", "batch"]).decode_tok_s
    at = pd.MultiIndex.from_frame(run[["context_tokens", "batch"]])
    base = fp16.reindex(at).to_numpy()
    ratio = run.decode_tok_s / base
    run["decode_ratio_vs_fp16"] = ratio.where(timed & run.decode_ratio_vs_fp16.notna())
    run["roofline_frac"] = (run.floor_ms / run.step_ms).where(run.roofline_frac.notna())
    return run


def cited_run() -> pd.DataFrame:
    csv = linked_folder(h200_section()) / "bench" / "bench.csv"
    assert csv.is_file(), f"{csv} is missing"
    return bench_csv(csv)


def first_table(section: str) -> tuple[list[str], list[list[str]]]:
    """The header and body rows of the first `| mode | ...` table in `section`."""
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = next(i for i, ln in enumerate(lines) if ln.startswith("| mode |"))
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[header:]]
    body = []
    for row in cells[2:]:
        if len(row) != len(cells[0]):
            break
        body.append(row)
    return cells[0], body


def same(value: float, shown: str) -> bool:
    """`shown` (like 1.0045x, 95.0% or 237.9) is `value` rounded to the digits it prints."""
    digits = len(shown.rstrip("x%").partition(".")[2])
    return f"{value:.{digits}f}" == shown.rstrip("x%")


def docs_headline() -> str:
    """docs/h200-results.md's copy of the headline: the table, fp16's speed, throughput at capacity, peak memory."""
    text = H200_DOCS.read_text()
    return text[text.index("Decode speed vs fp16 on") : text.index("Against the issue's targets")]


@pytest.mark.parametrize("where", ["README", "docs"])
def test_the_table_is_the_cited_run(where):
    run = cited_run()
    header, body = first_table(h200_section() if where == "README" else docs_headline())
    assert [row[0].split()[0] for row in body] == MODES
    checked = 0
    for row in body:
        mode = row[0].split()[0]
        rows = run[run.kv_cache_mode == mode]
        for name, shown in zip(header[1:], row[1:]):
            if name.startswith("largest batch"):
                capacity = rows[rows.notes.str.contains("capacity search", na=False) & (rows.status == "ok")]
                assert int(shown) == capacity.batch.max(), (mode, name, shown)
            else:
                ctx, batch = re.fullmatch(r"(\d+K), B=(\d+)", name).groups()
                cell = rows[(rows.context_tokens == CONTEXTS[ctx]) & (rows.batch == int(batch))]
                assert len(cell) == 1 and cell.status.iloc[0] == "ok", (mode, name)
                assert same(cell.decode_ratio_vs_fp16.iloc[0], shown), (
                    mode,
                    name,
                    shown,
                    cell.decode_ratio_vs_fp16.iloc[0],
                )
            checked += 1
    assert checked == 6 * 7


def test_fp16s_speed_and_floor_fraction_are_the_cited_runs():
    found = re.search(
        r"At batch 1 it decoded ([\d.]+) / ([\d.]+) / ([\d.]+) tok/s at 2K / 8K / 32K:\s+"
        r"([\d.]+%) / ([\d.]+%) / ([\d.]+%) of the floor",
        h200_section(),
    )
    assert found, "the fp16 line of the H200 section changed shape"
    run = cited_run()
    fp16 = run[(run.kv_cache_mode == "fp16") & (run.batch == 1)].set_index("context_tokens")
    for i, ctx in enumerate((2048, 8192, 32768)):
        assert same(fp16.decode_tok_s[ctx], found.group(1 + i)), (ctx, found.group(1 + i))
        assert same(100 * fp16.roofline_frac[ctx], found.group(4 + i)), (ctx, found.group(4 + i))


@pytest.mark.parametrize("shown, off", [("1.018x", False), ("1.017x", True), ("1.0178x", False), ("1.02x", False)])
def test_same_rounds_to_the_printed_digits(shown, off):
    assert same(1.0178, shown) is not off


def bullet(start: str) -> str:
    """The README bullet that begins with `start`, joined onto one line."""
    section = h200_section()
    i = section.index(start)
    ends = [e for e in (section.find("\n- ", i), section.find("\n\n", i)) if e > 0]
    return " ".join(section[i : min(ends, default=len(section))].split())


def capacity_ratios(run: pd.DataFrame) -> pd.DataFrame:
    """Each mode's timed capacity row: its batch and its decode speed against fp16's at its own capacity."""
    timed = run[run.notes.str.contains("capacity search", na=False) & run.decode_tok_s.notna()]
    timed = timed.set_index("kv_cache_mode")
    return timed.assign(ratio=timed.decode_tok_s / timed.decode_tok_s["fp16"])


def capacity_is(capacity: pd.DataFrame, base: re.Match | None, quoted: list[tuple[str, str, str]]) -> None:
    """fp16's tok/s and batch at capacity (`base`), and each (mode as the prose names it, ratio, batch) quoted."""
    assert base and same(capacity.decode_tok_s["fp16"], base.group(1)) and int(base.group(2)) == capacity.batch["fp16"]
    assert len(quoted) == 5, quoted
    for name, ratio, batch in quoted:
        mode = SHORT_NAMES.get(name, name)
        assert same(capacity.ratio[mode], ratio) and int(batch) == capacity.batch[mode], (mode, ratio, batch)


def test_throughput_at_capacity_is_the_cited_runs():
    text = bullet("- **Throughput at capacity**")
    base = re.search(r"fp16 ([\d.]+) tok/s at batch (\d+)", text)
    quoted = re.findall(
        r"(int8|turbo3-asym|raw turbo4|turbo4-asym|delegated) ([\d.]+x)(?: that)? \((?:batch )?(\d+)\)", text
    )
    capacity_is(capacity_ratios(cited_run()), base, quoted)


def test_peak_memory_falls_as_the_cited_run_measured():
    text = bullet("- **Peak memory at 32K falls by the KV saving**")
    run = cited_run()
    b16 = run[(run.context_tokens == 32768) & (run.batch == 16)].set_index("kv_cache_mode")
    quoted = re.findall(r"(int8|turbo3-asym|turbo4) -([\d.]+) GB for ([\d.]+) GB", text)
    assert len(quoted) == 3, quoted
    for mode, peak, kv in quoted:
        assert same(b16.peak_mem_gb["fp16"] - b16.peak_mem_gb[mode], peak), (mode, peak)
        assert same((b16.kv_bytes["fp16"] - b16.kv_bytes[mode]) / 1e9, kv), (mode, kv)


def test_the_docs_headline_is_the_cited_runs():
    """docs/h200-results.md's longer copy of the headline: fp16's speed, floor fractions and copy bandwidth (and
    the previous reading's, at `861e963`), throughput at capacity (and `33358e8`'s capacity run), peak memory."""
    text = " ".join(docs_headline().split())
    run = cited_run()
    cited = re.search(r"measured side by side in one run \(at `(\w+)`", text)
    assert cited and run.git_commit.str.startswith(cited.group(1)).all(), cited
    at32 = run[run.context_tokens == 32768]

    fp16 = re.search(
        r"fp16 itself decoded ([\d.]+) / ([\d.]+) / ([\d.]+) tok/s at 2K / 8K / 32K\. That is ([\d.]+%) / ([\d.]+%) / "
        r"([\d.]+%) of the floor .*? \(([\d.]+) TB/s; .* fp16 at 32K, batch 16 reads ([\d.]+%)\)\. .* at `(\w+)` the same "
        r"fp16 speeds \(within ([\d.]+)%\) read ([\d.]+%) / ([\d.]+%) / ([\d.]+%) against ([\d.]+) TB/s",
        text,
    )
    assert fp16, "the fp16 paragraph of docs/h200-results.md changed shape"
    now = run[(run.kv_cache_mode == "fp16") & (run.batch == 1)].set_index("context_tokens")
    [before] = [t for _, t in h200_benchmarks() if t.git_commit.str.startswith(fp16.group(9)).all()]
    before = before[(before.kv_cache_mode == "fp16") & (before.batch == 1)].set_index("context_tokens")
    for i, ctx in enumerate((2048, 8192, 32768)):
        assert same(now.decode_tok_s[ctx], fp16.group(1 + i)), (ctx, fp16.group(1 + i))
        assert same(100 * now.roofline_frac[ctx], fp16.group(4 + i)), (ctx, fp16.group(4 + i))
        assert same(100 * before.roofline_frac[ctx], fp16.group(11 + i)), (ctx, fp16.group(11 + i))
        assert abs(now.decode_tok_s[ctx] / before.decode_tok_s[ctx] - 1) <= float(fp16.group(10)) / 100, ctx
    assert same(run.bandwidth_gbs.iloc[0] / 1000, fp16.group(7)) and same(
        before.bandwidth_gbs.iloc[0] / 1000, fp16.group(14)
    )
    b16 = at32[(at32.kv_cache_mode == "fp16") & (at32.batch == 16)]
    assert same(100 * b16.roofline_frac.iloc[0], fp16.group(8))

    base = re.search(r"decodes ([\d.]+) tok/s with fp16 \(batch (\d+)\)", text)
    quoted = re.findall(
        r"([\d.]+x)(?: that)? with (int8|turbo3-asym|raw turbo4|turbo4-asym|delegated) \((?:batch )?(\d+)", text
    )
    quoted = [(name, ratio, batch) for ratio, name, batch in quoted]
    capacity_is(capacity_ratios(run), base, quoted)
    earlier = re.search(r"`(results/[\w/-]+)/` \(at `(\w+)`\) read ((?:[\d.]+x(?: / )?)+)", text)
    assert earlier, "the earlier capacity run's sentence changed shape"
    old = bench_csv(ROOT / earlier.group(1) / "bench.csv")
    assert old.git_commit.str.startswith(earlier.group(2)).all()
    order = [SHORT_NAMES.get(name, name) for name, _, _ in quoted]
    old_ratios = capacity_ratios(old).ratio
    for mode, ratio in zip(order, earlier.group(3).split(" / "), strict=True):
        assert same(old_ratios[mode], ratio), (mode, ratio)

    peak = re.search(r"falls by the KV saving, within ([\d.]+)-([\d.]+)% in every mode", text)
    timed = at32[~at32.notes.str.contains("capacity search", na=False)]
    off = []
    for batch in (1, 16):
        rows = timed[timed.batch == batch].set_index("kv_cache_mode")
        fell = rows.peak_mem_gb["fp16"] - rows.peak_mem_gb
        saved = (rows.kv_bytes["fp16"] - rows.kv_bytes) / 1e9
        off += list((100 * (fell / saved - 1)).drop("fp16").abs())
        shown = re.search(rf"batch {batch}: (.*?)(?:;|\.(?: |$))", text).group(1)
        quoted = re.findall(r"(int8|turbo3-asym|turbo4) -([\d.]+) GB for ([\d.]+) GB", shown)
        assert len(quoted) == {1: 1, 16: 3}[batch], (batch, shown)
        for mode, gb, kv in quoted:
            assert same(fell[mode], gb) and same(saved[mode], kv), (batch, mode, gb, kv)
    assert peak and same(min(off), peak.group(1)) and same(max(off), peak.group(2)), (min(off), max(off))


def test_raw_turbo4s_floor_arithmetic_is_the_cited_runs():
    text = bullet("- **raw turbo4:")
    run = cited_run()
    at32 = run[(run.context_tokens == 32768) & run.batch.isin([1, 16])]
    fp16 = at32[at32.kv_cache_mode == "fp16"].set_index("batch")
    raw = at32[at32.kv_cache_mode == "turbo4"].set_index("batch")
    reach = re.search(r"it reaches (\d+%) of the floor .* at batch 1 and (\d+%) at batch 16", text)
    allow = re.search(
        r"the bytes allow ([\d.]+x) and ([\d.]+x), so 1\.12x needs (\d+%) .* and 2\.0x needs (\d+%)", text
    )
    fp16s = re.search(r"as close as fp16 itself comes \((\d+%) and (\d+%) in the same run\)", text)
    assert reach and allow and fp16s, "the raw turbo4 line of the H200 section changed shape"
    for i, (batch, target) in enumerate(((1, 1.12), (16, 2.0))):
        assert same(100 * raw.roofline_frac[batch], reach.group(1 + i)), (batch, reach.group(1 + i))
        assert same(fp16.floor_ms[batch] / raw.floor_ms[batch], allow.group(1 + i)), (batch, allow.group(1 + i))
        needed_step = fp16.step_ms[batch] / target
        assert same(100 * raw.floor_ms[batch] / needed_step, allow.group(3 + i)), (batch, allow.group(3 + i))
        assert same(100 * fp16.roofline_frac[batch], fp16s.group(1 + i)), (batch, fp16s.group(1 + i))


def cited_audit() -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The audit the section summarises (its own report link), raw turbo4's beside it, and the summary's text."""
    section = h200_section()
    start = section.index("**The audit on the GPU**")
    text = " ".join(section[start : section.index("**Two GPUs**")].split())
    root = linked_folder(text)
    return pd.read_csv(root / "audit" / "audit.csv"), pd.read_csv(root / "audit-raw-turbo4" / "audit.csv"), text


def test_the_audit_summary_is_the_cited_runs():
    audit, raw, text = cited_audit()
    greedy = audit[audit.check == "greedy"].set_index(["kv_cache_mode", "context_tokens"])
    verdict = greedy.verdict.to_dict()
    kl = greedy.kl_div.to_dict()

    # int8: identical at 8K, near-ties at 2K and 32K with the KL quoted; perplexity within the quoted range
    found = re.search(r"int8 is identical to fp16 at 8K and a near-tie at 2K and 32K \(KL ([\d.]+) / ([\d.]+)\)", text)
    assert found and verdict["int8", 8192] == "identical"
    assert verdict["int8", 2048] == verdict["int8", 32768] == "near-tie"
    assert same(kl["int8", 2048], found.group(1)) and same(kl["int8", 32768], found.group(2))
    ppl = re.search(r"perplexity \+([\d.]+%) to \+([\d.]+%)", text)
    deltas = 100 * audit[(audit.check == "ppl") & (audit.kv_cache_mode == "int8")].ppl_delta
    assert ppl and same(deltas.min(), ppl.group(1)) and same(deltas.max(), ppl.group(2))

    # turbo4-asym and delegated: near-ties everywhere, KL within the quoted range
    span = re.search(r"turbo4-asym and delegated agree .* near-ties at every context \(KL ([\d.]+)-([\d.]+)\)", text)
    both = [(m, c) for m in ("turbo4-asym", "turbo4-delegated") for c in (2048, 8192, 32768)]
    assert span and all(verdict[k] == "near-tie" for k in both)
    assert same(min(kl[k] for k in both), span.group(1)) and same(max(kl[k] for k in both), span.group(2))

    # turbo3-asym loops at 32K; raw turbo4 is a near-tie everywhere with the KL quoted
    t3 = re.search(r"at 32K its greedy text loops and is flagged \*degenerate\* \(KL ([\d.]+)\)", text)
    assert t3 and verdict["turbo3-asym", 32768] == "degenerate" and same(kl["turbo3-asym", 32768], t3.group(1))
    assert verdict["turbo3-asym", 2048] == verdict["turbo3-asym", 8192] == "near-tie"
    r4 = re.search(r"Raw turbo4 is a near-tie at every context \(KL ([\d.]+) / ([\d.]+) / ([\d.]+)\)", text)
    raw4 = raw[(raw.check == "greedy") & (raw.kv_cache_mode == "turbo4")].set_index("context_tokens")
    assert r4 and (raw4.verdict == "near-tie").all()
    for i, ctx in enumerate((2048, 8192, 32768)):
        assert same(raw4.kl_div[ctx], r4.group(1 + i)), (ctx, r4.group(1 + i))

    # the kernel checks, prefix reuse and the needle
    kernel = audit[audit.check == "kernel"]
    count = re.search(r"agree with the reference path in all (\d+) checks", text)
    assert count and int(count.group(1)) == len(kernel) and kernel.kernel_agrees.all()
    assert (audit[audit.check == "prefix_reuse"].verdict == "identical").all() and "Prefix reuse is identical" in text
    hits = re.search(r"found (\d)/5 at 2K, (\d)/5 at 8K, (\d)/5 at 32K in every mode", text)
    niah = audit[audit.check == "niah"].groupby(["context_tokens", "kv_cache_mode"]).niah_hit.sum()
    assert hits
    for i, ctx in enumerate((2048, 8192, 32768)):
        assert set(niah[ctx]) == {int(hits.group(1 + i))}, (ctx, niah[ctx].to_dict())

    # the 256-token cap: with 4 sinks only delegated (diverges) and turbo3-asym (degenerate) at 32K miss;
    # with none every mode degenerates but delegated at 32K
    cap = audit[audit.check == "max_kv"].set_index(["keep", "kv_cache_mode", "context_tokens"])
    misses = cap[(cap.index.get_level_values(0) == 4) & ~cap.verdict.isin(["identical", "near-tie"])]
    assert set(misses.index) == {(4, "turbo4-delegated", 32768), (4, "turbo3-asym", 32768)}
    diverge = re.search(r"delegated diverges at token (\d+)", text)
    assert diverge and cap.first_divergence[4, "turbo4-delegated", 32768] == int(diverge.group(1))
    assert cap.verdict[4, "turbo3-asym", 32768] == "degenerate" and "turbo3-asym echoes the question" in text
    clean = cap[(cap.index.get_level_values(0) == 0) & (cap.verdict != "degenerate")]
    assert set(clean.index) == {(0, "turbo4-delegated", 32768)} and "but delegated at 32K" in text


def test_the_cpu_table_is_the_cited_audit():
    """The first table of "Results on a 2-core CPU": each cell re-read from the audit.csv its report link names."""
    section = readme_section("Results on a 2-core CPU")
    audit = pd.read_csv(linked_folder(section) / "audit.csv")
    greedy = audit[audit.check == "greedy"].set_index(["kv_cache_mode", "context_tokens"])
    _, rows = first_table(section)
    assert [r[0].split()[0] for r in rows] == MODES
    for mode, *cells, per_token in ((r[0].split()[0], *r[1:]) for r in rows):
        stored = sorted({round(v) for v in greedy.kv_bytes_per_token[mode]})
        assert per_token.replace(",", "") == "-".join(str(v) for v in stored), (mode, per_token)
        for ctx, cell in zip((2048, 8192), cells):
            row = greedy.loc[(mode, ctx)]
            if cell == "reference":
                assert mode == "fp16" and row.verdict == "identical"
                continue
            if cell == "as turbo4-asym":
                assert (
                    row[["verdict", "first_divergence", "kl_div"]]
                    == greedy.loc[("turbo4-asym", ctx)][["verdict", "first_divergence", "kl_div"]]
                ).all()
                continue
            found = re.fullmatch(r"(identical|near-tie @(\d+)) / ([\d.]+%) / ([\d.]+)", cell)
            assert found, (mode, ctx, cell)
            assert row.verdict == found.group(1).split()[0], (mode, ctx, cell)
            if found.group(2):
                assert row.first_divergence == int(found.group(2)), (mode, ctx, cell)
            assert same(100 * row.top1_agreement, found.group(3)) and same(row.kl_div, found.group(4)), (
                mode,
                ctx,
                cell,
            )


def paragraph(text: str, start: str, end: str) -> str:
    """The part of `text` from `start` up to `end` (or its end), joined onto one line."""
    i = text.index(start)
    j = text.find(end, i)
    return " ".join(text[i : j if j > 0 else len(text)].split())


def test_the_two_gpu_paragraph_is_the_cited_runs():
    """One H200 against two: both runs' wall times (their runs.csv), the same capacity results, and how far the
    decode speeds of the same cells lie apart, in batch 16 at 2K and everywhere else."""
    text = paragraph(h200_section(), "**Two GPUs**", "**Transformers' own")
    found = re.search(
        r"took ([\d.]+) s on one H200 and ([\d.]+) s with `--devices 0,1` \(([\d.]+)x; the same capacity results, "
        r"and decode speeds within ([\d.]+)% in every cell but batch 16 at 2K, where two GPUs read up to ([\d.]+)% faster",
        text,
    )
    assert found, "the two-GPU paragraph changed shape"
    root = linked_folder(text)
    one, two = (
        pd.read_csv(root / run / "runs.csv").set_index("job").wall_s["decode-bench"]
        for run in ("full-1gpu", "full-2gpu")
    )
    assert same(one, found.group(1)) and same(two, found.group(2)) and same(one / two, found.group(3))
    cells = pd.read_csv(root / "full-1gpu" / "bench.csv").merge(
        pd.read_csv(root / "full-2gpu" / "bench.csv"),
        on=["kv_cache_mode", "context_tokens", "batch", "cell"],
        suffixes=("_1", "_2"),
        validate="1:1",
    )
    assert len(cells) == 48 and (cells.status_1 == cells.status_2).all()
    timed = cells[cells.decode_tok_s_1.notna()]
    faster = 100 * (timed.decode_tok_s_2 / timed.decode_tok_s_1 - 1)
    wide = (timed.context_tokens == 2048) & (timed.batch == 16)
    assert len(timed[wide]) == 6 and (faster[wide] > 0).all()
    bound = float(found.group(4))  # "within" a bound printed to its last digit: the largest gap lies in its last step
    assert bound - 0.1 < faster[~wide].abs().max() <= bound and same(faster[wide].max(), found.group(5))


def peer_ratios(bench: pd.DataFrame) -> pd.Series:
    """Each kvbench mode's decode speed over the fastest `hf:*` cache of its bit width, per context (turbo3-asym has
    no 3-bit peer, and `hf:quanto-int2` no 2-bit kvbench mode)."""
    peers = {
        "fp16": ["hf:dynamic", "hf:static"],
        "int8": ["hf:hqq-int8"],
        "turbo4-asym": ["hf:quanto-int4", "hf:hqq-int4"],
    }
    speed = bench[bench.status == "ok"].set_index(["kv_cache_mode", "context_tokens"]).decode_tok_s
    return pd.Series(
        {
            (mode, ctx): speed[mode, ctx] / max(speed[p, ctx] for p in rivals)
            for mode, rivals in peers.items()
            for ctx in speed[mode].index
        }
    )


def kl_span(audit: pd.DataFrame, mode: str) -> tuple[float, float]:
    kl = audit[(audit.check == "greedy") & (audit.kv_cache_mode == mode)].kl_div
    return kl.min(), kl.max()


def test_the_peers_paragraph_is_the_cited_runs():
    """kvbench against transformers' caches on the H200 (the README's sentence and docs/h200-results.md's)."""
    text = paragraph(h200_section(), "**Transformers' own", "[docs/h200-results.md]")
    root = linked_folder(text)
    speed = re.search(r"(\d+)-(\d+)x faster than the fastest peer of the same bit width on the default model", text)
    assert speed, "the peers sentence changed shape"
    ratios = peer_ratios(pd.read_csv(root / "smollm2" / "bench.csv"))
    assert len(ratios) == 9 and same(ratios.min(), speed.group(1)) and same(ratios.max(), speed.group(2))
    audit = pd.read_csv(root / "smollm2" / "audit.csv")
    kls = re.findall(r"(turbo4-asym|`hf:hqq-int4`|`hf:quanto-int4`)'s (?:KL )?\(([\d.]+)-([\d.]+)\)", text)
    assert len(kls) == 3, kls
    for mode, low, high in kls:
        lo, hi = kl_span(audit, mode.strip("`"))
        assert same(lo, low) and same(hi, high), (mode, low, high, lo, hi)

    docs = paragraph(H200_DOCS.read_text(), "Transformers' own caches beside kvbench's modes", "\n\n")
    big = re.search(r"(\d+)-(\d+)x faster .* on dummy Llama-3.1-8B (\d+)-(\d+)x", docs)
    assert big and (big.group(1), big.group(2)) == speed.groups()
    ratios = peer_ratios(pd.read_csv(root / "llama-8b" / "bench.csv"))
    assert len(ratios) == 9 and same(ratios.min(), big.group(3)) and same(ratios.max(), big.group(4))
    broken = re.search(r"`hf:quanto-int2` breaks down \(KL ([\d.]+)-([\d.]+)\)", docs)
    lo, hi = kl_span(audit, "hf:quanto-int2")
    assert broken and same(lo, broken.group(1)) and same(hi, broken.group(2)), (lo, hi)


def test_the_cpu_peers_paragraph_is_the_cited_run():
    section = readme_section("Results on a 2-core CPU")
    text = paragraph(section, "Peers on the same CPU", "\n\n")
    root = linked_folder(text)
    speed = pd.read_csv(root / "bench.csv").set_index("kv_cache_mode").decode_tok_s
    greedy = pd.read_csv(root / "audit.csv").query("check == 'greedy'").set_index("kv_cache_mode")
    quoted = re.findall(r"(fp16|int8|turbo4-asym|`hf:[\w-]+`)(?: \(KL ([\d.]+)[^)]*\))? ([\d.]+)(?: tok/s)?", text)
    assert sorted(q[0].strip("`") for q in quoted) == sorted(
        ["fp16", "hf:static", "hf:dynamic", "int8", "hf:hqq-int8", "turbo4-asym", "hf:hqq-int4", "hf:quanto-int4"]
    )
    for mode, kl, tok_s in quoted:
        mode = mode.strip("`")
        assert same(speed[mode], tok_s), (mode, tok_s, speed[mode])
        if kl:
            assert same(greedy.kl_div[mode], kl), (mode, kl)
    for mode, kl in re.findall(r"`(hf:[\w-]+)` [\d.]+ \(KL\s+([\d.]+)\)", text):
        assert same(greedy.kl_div[mode], kl), (mode, kl)
    for mode in ("int8", "turbo4-asym"):
        assert greedy.verdict[mode] == "identical"
    assert text.count("identical output") == 2
    gone = re.search(r"`hf:quanto-int2` diverges at token (\d+)", text)
    assert gone and greedy.verdict["hf:quanto-int2"] == "diverged"
    assert greedy.first_divergence["hf:quanto-int2"] == int(gone.group(1))


@functools.cache
def h200_benchmarks() -> tuple[tuple[Path, pd.DataFrame], ...]:
    """Every committed H200 benchmark of batch 1 and 16 (`--batch 1,16`): its bench.csv and its timed rows (the
    capacity search's left out). Read once: three tests look through them."""
    found = []
    for csv in sorted((ROOT / "results").rglob("bench.csv")):
        plain = pd.read_csv(csv, usecols=["notes", "batch", "device"])
        timed = plain[~plain.notes.str.contains("capacity search", na=False)]
        if set(timed.batch) == {1, 16} and timed.device.eq("NVIDIA H200").all():
            run = bench_csv(csv)  # the JSONL's tok/s, only for the runs kept
            found.append((csv, run[~run.notes.str.contains("capacity search", na=False)]))
    return tuple(found)


def readings(commits: list[str], column: str = "decode_ratio_vs_fp16") -> pd.DataFrame:
    """The batch-1 and batch-16 ratios (or another `column`) of every committed H200 benchmark (`--batch 1,16`) at
    one of `commits`, one column per commit; each commit must have exactly one such run under results/."""
    found = {}
    for csv, timed in h200_benchmarks():
        for commit in commits:
            if timed.git_commit.str.startswith(commit).all():
                assert commit not in found, (commit, csv)
                found[commit] = timed.set_index(["kv_cache_mode", "context_tokens", "batch"])[column]
    assert sorted(found) == sorted(commits), sorted(found)
    return pd.DataFrame({c: found[c] for c in commits})


def test_the_repeatable_readings_are_the_committed_runs():
    """The across-runs spread (README's "Repeatable" bullet, the paragraph of docs/h200-results.md it summarises):
    the six benchmarks of these kernels, found under results/ by their commits, and how far each ratio moved."""
    docs = paragraph(H200_DOCS.read_text(), "This is the sixth reading of these kernels", "\n\n")
    commits = re.findall(r"`([0-9a-f]{7})`", docs[: docs.index(").")])
    assert len(commits) == 6, commits
    ratios = 100 * readings(commits)
    spread = ratios.max(axis=1) - ratios.min(axis=1)
    b1 = spread.xs(1, level="batch")
    first_four = ratios[commits[:4]].xs(16, level="batch")
    b16 = first_four.max(axis=1) - first_four.min(axis=1)

    text = bullet("- **Repeatable.**")
    claim = re.search(r"the (\w+) reading of these kernels \(`(\w+)` onward\)", text)
    assert claim and claim.groups() == ("sixth", commits[0])
    for where in (text, docs):
        b1_shown = re.search(r"every ratio stayed within ([\d.]+) points across the six", where)
        b16_shown = re.search(r"up to ([\d.]+) points", where)
        assert b1_shown and same(b1.max(), b1_shown.group(1)), (b1.max(), where[:40])
        assert b16_shown and same(b16.max(), b16_shown.group(1)), (b16.max(), where[:40])
    widest = re.search(r"\(the widest: int8 at 32K, ([\d.]+)-([\d.]+)x\)", docs)
    int8 = ratios.loc["int8", 32768, 1] / 100
    assert widest and b1.idxmax() == ("int8", 32768)
    assert same(int8.min(), widest.group(1)) and same(int8.max(), widest.group(2))
    last = re.search(
        r"decoded all (\d+) of those rows within ([\d.]+)% of the fifth's tok/s \(every ratio within ([\d.]+) of it\)",
        docs,
    )
    speed = readings(commits[-2:], "decode_tok_s")
    moved = 100 * (speed[commits[-1]] / speed[commits[-2]] - 1).abs()
    assert last and int(last.group(1)) == len(moved), (last, len(moved))
    assert same(moved.max(), last.group(2)) and same(
        (ratios[commits[-1]] - ratios[commits[-2]]).abs().max() / 100, last.group(3)
    )
    thin = re.findall(r"(turbo4-asym|turbo3-asym|delegated) ([\d.]+)-([\d.]+)x", docs)
    assert len(thin) == 3, thin
    for name, low, high in thin:
        at8k = ratios.loc[SHORT_NAMES.get(name, name), 8192, 1] / 100
        assert same(at8k.min(), low) and same(at8k.max(), high), (name, low, high)


def minutes(folder: Path, job: str) -> float:
    return pd.read_csv(folder / "runs.csv").set_index("job").wall_s[job] / 60


def test_the_cpu_checks_and_later_audits_are_the_cited_runs():
    """The rest of "Results on a 2-core CPU": the long-context checks, and the two later `make audit` runs (their
    audit and decode-bench minutes, the verdicts they name, int8's bytes and first differences, and the turbo
    rows repeated to the last digit)."""
    section = readme_section("Results on a 2-core CPU")
    checks_text = paragraph(section, "The long-context checks", "\n\n")
    root = linked_folder(checks_text)
    checks = pd.read_csv(root / "audit.csv")
    took = re.search(r"(\d+) min on the CPU", checks_text)
    assert took and same(minutes(root, "audit"), took.group(1))
    cap = checks[checks.check == "max_kv"]
    assert len(cap) == 24 and (cap[cap.keep == 0].verdict == "degenerate").all()
    assert (cap[cap.keep == 4].verdict != "degenerate").all() and "every mode stays coherent" in checks_text
    assert set(checks[checks.check == "prefix_reuse"].verdict) == {"identical"}
    hits = re.search(r"the needle is found (\d)/5 at 2K and (\d)/5 at 8K in every mode", checks_text)
    niah = checks[checks.check == "niah"].groupby(["context_tokens", "kv_cache_mode"]).niah_hit.sum()
    assert hits and set(niah[2048]) == {int(hits.group(1))} and set(niah[8192]) == {int(hits.group(2))}

    runs = {}
    for start in ("`make audit` again on 2026-12-02", "`make audit` once more"):
        text = paragraph(section, start, "\n\n")
        root = linked_folder(text)
        spent = re.search(r"\(audit ([\d.]+) min, decode-bench ([\d.]+) min\)", text)
        assert spent and same(minutes(root, "audit"), spent.group(1)), (root, spent)
        assert same(minutes(root, "decode-bench"), spent.group(2)), (root, spent)
        audit = pd.read_csv(root / "audit.csv")
        runs[start] = text, audit[audit.check == "greedy"].set_index(["kv_cache_mode", "context_tokens"])

    text, first = runs["`make audit` again on 2026-12-02"]
    off = first.drop("fp16", level="kv_cache_mode")
    off = off[off.verdict != "near-tie"]
    assert list(off.index) == [("turbo3-asym", 8192)] and off.verdict.iloc[0] == "diverged"
    t3 = re.search(r"its first different token \((\d+)\) .* `diverged` \(KL ([\d.]+),", text)
    assert t3 and off.first_divergence.iloc[0] == int(t3.group(1)) and same(off.kl_div.iloc[0], t3.group(2))

    text, second = runs["`make audit` once more"]
    turbo = [m for m in MODES if m.startswith("turbo")]
    fields = ["verdict", "first_divergence", "kl_div", "top1_agreement", "kv_bytes_per_token"]
    assert second.loc[turbo, fields].equals(first.loc[turbo, fields]) and "to the last digit" in text
    per_token = re.search(r"int8 stores ([\d,]+) bytes a token instead of ([\d,]+)", text)
    assert per_token
    for shown, run in zip(per_token.groups(), (second, first)):
        assert set(run.kv_bytes_per_token["int8"]) == {int(shown.replace(",", ""))}, shown
    at2k = re.search(r"near-tie at 2K \(first difference at token (\d+) instead of (\d+), KL ([\d.]+)\)", text)
    at8k = re.search(r"and 8K \(token (\d+), KL ([\d.]+) instead of ([\d.]+)\)", text)
    assert at2k and at8k
    new, old = second.loc["int8"], first.loc["int8"]
    assert (new.verdict == "near-tie").all()
    assert [new.first_divergence[2048], old.first_divergence[2048]] == [int(at2k.group(1)), int(at2k.group(2))]
    assert same(new.kl_div[2048], at2k.group(3)) and new.first_divergence[8192] == int(at8k.group(1))
    assert same(new.kl_div[8192], at8k.group(2)) and same(old.kl_div[8192], at8k.group(3))


def passed(log: Path) -> int:
    """The tests a pytest log's last line (`668 passed, 50 skipped in ...`) counts as passed; none may have failed."""
    last = log.read_text().strip().splitlines()[-1]
    tally = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    assert not {"failed", "error", "errors"} & set(tally), (log, last)
    return tally.get("passed", 0)


def test_the_gpu_test_runs_are_the_cited_logs():
    """The audit summary's last bullet: the H200's GPU test files all passed (both logs of its folder), and the
    H100 count quoted for a later commit is that folder's log, run at that commit (its README says so)."""
    text = bullet("- Every GPU test file passed on compiled kernels")
    h200 = re.search(r"\(`(results/[^`]+)/` at `(\w+)`\)", text)
    h100 = re.search(r"at `(\w+)` (\d+) passed there, .* \(`(results/[^`]+)/`", text)
    assert h200 and h100, "the GPU tests bullet changed shape"
    folder = ROOT / h200.group(1)
    assert h200.group(2) in (folder / "README.md").read_text().splitlines()[0]
    logs = sorted(folder.glob("gpu-*tests*.txt"))
    assert len(logs) == 2
    assert all(passed(log) > 0 for log in logs)
    folder = ROOT / h100.group(3)
    assert h100.group(1) in (folder / "README.md").read_text().splitlines()[0]
    assert passed(folder / "gpu-kernel-tests.txt") == int(h100.group(2))

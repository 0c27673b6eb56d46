"""The README's "Results on an H200" numbers are the committed run's: every ratio, capacity, tok/s and floor
fraction it quotes is read again from the bench.csv of the results folder it links, and must round to what the
README prints. Editing either side alone fails here."""

import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = {"2K": 2048, "8K": 8192, "32K": 32768}


def h200_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Results on an H200")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def cited_run() -> pd.DataFrame:
    folder = re.search(r"\[report\]\((results/[^)/]+)/report\.md\)", h200_section())
    assert folder, "the H200 section links no results/<folder>/report.md"
    csv = ROOT / folder.group(1) / "bench" / "bench.csv"
    assert csv.is_file(), f"{csv} is missing"
    return pd.read_csv(csv)


def headline_table() -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in h200_section().splitlines() if ln.startswith("|")]
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


def test_the_table_is_the_cited_run():
    run = cited_run()
    header, body = headline_table()
    assert [row[0].split()[0] for row in body] == [
        "fp16",
        "int8",
        "turbo4-asym",
        "turbo3-asym",
        "turbo4",
        "turbo4-delegated",
    ]
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

"""Long-context behaviour on the embedded default model: a KV cap with and
without attention sinks (the seed engine's second defect), and prompt-cache reuse.

The prompt is the one the issue reproduced with transformers: numbered planet
facts ending in a question, longer than the cap."""

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli import app

QUESTION = "Which planet is the closest to the Sun, and what is special about the planet Saturn?"
PLANETS = Path(__file__).parent / "data" / "planets.txt"


@pytest.mark.slow
def test_kv_cap_keeps_sinks_and_catches_the_dropped_sink_collapse(tmp_path, default_model):
    args = [
        "audit", "--modes", "fp16,int8", "--prompt-file", str(PLANETS), "--question", QUESTION,
        "--kv-cap-check", "128", "--prefix-reuse", "--gen-tokens", "40", "--dtype", "bfloat16",
        "--out", str(tmp_path), "--quiet",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    with open(tmp_path / "audit.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    capped = {(r["kv_cache_mode"], r["keep"]): r for r in rows if r["check"] == "max_kv"}
    for mode in ("fp16", "int8"):
        with_sinks, without = capped[(mode, "4")], capped[(mode, "0")]
        assert int(with_sinks["context_tokens"]) > 128 * 7  # the prompt is far longer than the cap
        assert with_sinks["degenerate"] == "false", with_sinks["output_text"]
        assert without["degenerate"] == "true" and without["status"] == "degenerate", without["output_text"]
    reuse = [r for r in rows if r["check"] == "prefix_reuse"]
    assert len(reuse) == 2
    for r in reuse:
        assert r["verdict"] == "identical", r
        # the whole prompt but its question (and the chat turn around it) came from the donor
        assert 0 < int(r["context_tokens"]) - int(r["cached_tokens"]) < 40


def test_ppl_says_when_delegated_read_no_quantized_token(tmp_path):
    # at 512 tokens in chunks of 256, every earlier token is still in turbo4-delegated's fp16 hot window when a
    # chunk attends to it, so its perplexity is fp16's by construction: the row must say so (a user review)
    rows = {}
    for chunk in (256, 64):
        out = tmp_path / f"c{chunk}"
        args = ["audit", "--modes", "turbo4-delegated", "--contexts", "512", "--gen-tokens", "2", "--ppl"]
        result = CliRunner().invoke(app, [*args, "--ppl-chunk", str(chunk), "--out", str(out), "--quiet"])
        assert result.exit_code == 0, result.output
        with open(out / "audit.csv", newline="") as f:
            rows[chunk] = {r["kv_cache_mode"]: r for r in csv.DictReader(f) if r["check"] == "ppl"}
    assert "no quantized V was read" in rows[256]["turbo4-delegated"]["notes"]
    assert float(rows[256]["turbo4-delegated"]["ppl"]) == float(rows[256]["fp16"]["ppl"])
    assert "no quantized V was read" not in rows[64]["turbo4-delegated"]["notes"]
    assert "no quantized V was read" not in rows[64]["fp16"]["notes"]

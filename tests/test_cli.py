"""The three commands end to end on a tiny dummy model, and bad input."""

import csv
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli import app, main
from kvbench.results import AUDIT_COLUMNS, BENCH_COLUMNS

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def run(args, expect=0):
    result = runner.invoke(app, args, catch_exceptions=True)
    if expect is not None:
        assert result.exit_code == expect, result.output + repr(result.exception)
    return result


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_audit_bench_report_end_to_end(tmp_path):
    out = tmp_path / "run"
    common = ["--model", "dummy:tiny", "--out", str(out), "--quiet", "--modes", "fp16,int8", "--contexts", "40,70"]
    run(
        [
            "audit",
            *common,
            "--gen",  # decode-bench's spelling, accepted by the audit too
            "6",
            "--prefill-chunk",
            "32",
            "--ppl",
            "--ppl-windows",
            "1",
            "--ppl-chunk",
            "16",
        ]
    )
    rows = read(out / "audit.csv")
    assert list(rows[0]) == AUDIT_COLUMNS
    greedy = [r for r in rows if r["check"] == "greedy"]
    assert {(r["kv_cache_mode"], r["context_tokens"]) for r in greedy} == {
        (m, c) for m in ("fp16", "int8") for c in ("40", "70")
    }
    assert all(r["status"] in ("ok", "diverged", "degenerate") for r in greedy)
    assert all(r["synthetic"] == "true" for r in rows)
    assert {r["gen_tokens"] for r in greedy} == {"6"}
    ppl = [r for r in rows if r["check"] == "ppl"]
    assert ppl and all(r["status"] == "skipped" for r in ppl)  # no tokenizer for dummy models
    run(["decode-bench", *common, "--batch", "1,2", "--gen-tokens", "3", "--warmup", "1", "--repeats", "2"])
    bench = read(out / "bench.csv")
    assert list(bench[0]) == BENCH_COLUMNS
    assert len(bench) == 2 * 2 * 2 and {r["gen_tokens"] for r in bench} == {"3"}
    for r in bench:
        assert r["status"] == "ok", r["notes"]
        assert float(r["decode_tok_s"]) > 0 and float(r["kv_bytes"]) > 0
        assert float(r["decode_tok_s_min"]) <= float(r["decode_tok_s"]) <= float(r["decode_tok_s_max"])
        assert r["peak_mem_kind"] == "cpu_peak_rss"
        if r["kv_cache_mode"] == "fp16":
            assert float(r["decode_ratio_vs_fp16"]) == 1.0
        assert "random K/V (no prefill; random weights)" in r["notes"] and r["synthetic"] == "true"
    int8 = [r for r in bench if r["kv_cache_mode"] == "int8"]
    fp16 = [r for r in bench if r["kv_cache_mode"] == "fp16"]
    assert float(int8[0]["kv_bytes_per_token"]) < 0.6 * float(fp16[0]["kv_bytes_per_token"])
    # the derived columns keep six decimals, so a report or a reader rounds them once (a 4-digit ratio such as
    # 0.9850, rounded again to 0.98x, misprinted a measured 0.98501)
    for r, base in zip(int8, fp16, strict=True):
        assert (r["context_tokens"], r["batch"]) == (base["context_tokens"], base["batch"])
        ratio = float(r["decode_tok_s"]) / float(base["decode_tok_s"])
        assert abs(float(r["decode_ratio_vs_fp16"]) - ratio) <= 5e-7, (r["decode_ratio_vs_fp16"], ratio)
    for r in bench:
        if r["roofline_frac"]:
            frac = float(r["floor_ms"]) / float(r["step_ms"])
            assert abs(float(r["roofline_frac"]) - frac) <= 2e-6 * max(1.0, frac), (r["roofline_frac"], frac)
    assert (out / "runs.csv").exists() and (out / "audit.jsonl").exists()
    result = run(["report", str(out)])
    assert (out / "report.md").exists()
    assert "report.md" in result.output
    one = (out / "report.md").read_text()
    # one folder named three ways is read once (its rows were counted three times)
    result = run(["report", str(out), f"{out}/", str(out / ".." / out.name), "--out", str(out / "dup.md")])
    assert "2 paths named a folder given before it; each folder is read once" in result.output
    strip = lambda t: t.replace("dup", "report").splitlines()  # noqa: E731
    assert strip((out / "dup.md").read_text()) == strip(one)


def test_sparse_v_rows_and_report(tmp_path):
    """--sparse-v-threshold: every mode but fp16 (the dense reference) runs and is recorded with it,
    and the report keeps those rows apart, with the flag that reproduces them."""
    out = tmp_path / "run"
    common = ["--model", "dummy:tiny", "--out", str(out), "--quiet", "--modes", "fp16,int8,turbo4-asym"]
    run(["audit", *common, "--contexts", "40", "--gen-tokens", "4", "--sparse-v-threshold", "1e-3"])
    run(["decode-bench", *common, "--contexts", "40", "--gen", "2", "--warmup", "1", "--repeats", "1",
         "--sparse-v-threshold", "1e-3"])  # fmt: skip
    for stem in ("audit", "bench"):
        rows = read(out / f"{stem}.csv")
        assert {r["kv_cache_mode"]: float(r["sparse_v"]) for r in rows} == {
            "fp16": 0.0,
            "int8": 1e-3,
            "turbo4-asym": 1e-3,
        }, stem
        assert all(r["status"] in ("ok", "diverged", "degenerate") for r in rows), stem
    run(["report", str(out)])
    text = (out / "report.md").read_text()
    assert "`int8 (sparse V 0.001)`" in text and "--modes int8 --sparse-v-threshold 0.001" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["audit", "--modes", "int9"], "unknown KV mode 'int9'"),
        (["audit", "--model", "/nonexistent/model"], "model not found"),
        (["audit", "--model", "dummy:nope"], "unknown dummy preset"),
        (["audit", "--contexts", "abc"], "not a whole number"),
        (["audit", "--contexts", "1.5"], "'1.5' is not a whole number"),
        (["audit", "--contexts", "1.5e3"], "not a whole number"),
        (["decode-bench", "--model", "dummy:tiny", "--batch", "2.5"], "--batch: '2.5' is not a whole number"),
        (["audit", "--contexts", "0"], "must be positive"),
        (["audit", "--contexts", "-5"], "must be positive"),
        (["audit", "--model", "dummy:tiny", "--contexts", "100000000"], "exceeds|needs"),
        (["decode-bench", "--model", "dummy:tiny", "--batch", "0"], "must be positive"),
        (["audit", "--model", "dummy:tiny", "--dtype", "int3"], "--dtype: 'int3'"),
        (["audit", "--config", "/nonexistent.toml"], "config file not found"),
        (
            ["decode-bench", "--model", "dummy:tiny", "--sparse-v-threshold", "1"],
            r"--sparse-v-threshold: must be in \[0, 1\)",
        ),
        (["audit", "--model", "dummy:tiny", "--sparse-v-threshold", "-0.1"], "--sparse-v-threshold: "),
        (["report", "/nonexistent/dir"], "results folder not found"),
        (["report", "/nonexistent/dir", "--out", ""], "--out: is empty"),  # Path("") was ./report.md
        (  # click kept the last --config in silence: the first file's settings were dropped
            ["audit", "--config", str(REPO / "configs/ci-tiny.toml"), "--config", str(REPO / "configs/default.toml")],
            "^error: --config given 2 times",
        ),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--modes", ""], "--modes: needs at least one mode"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--modes", ","], "needs at least one mode"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--yarn", "bogus"], "--yarn: 'bogus'"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--yarn", "0"], "factor >= 1"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--format", ""], "--format: must include csv"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--near-tie-margin", "-1"], "--near-tie-margin: "),
        (
            ["decode-bench", "--model", "dummy:tiny", "--contexts", "64", "--capacity", "--memory-budget-gb", "-1"],
            "--memory-budget-gb: ",
        ),
        (  # without --capacity it bounds nothing: it was ignored in silence
            ["decode-bench", "--model", "dummy:tiny", "--contexts", "64", "--memory-budget-gb", "2"],
            "--memory-budget-gb: only bounds the --capacity search",
        ),
        (
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--device", "cpu", "--devices", "cpu,cpu"],
            "--devices: .*not both",
        ),
        (["audit", "--model", "", "--contexts", "64"], "--model: is empty"),
        (
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--gen-tokens", "100000"],
            "gen-tokens 100000 is more than the 4096 positions",
        ),
        (
            ["decode-bench", "--model", "dummy:tiny", "--contexts", "64", "--gen", "2000", "--repeats", "3"],
            "= 6016 decoded tokens is more than the 4096 positions",
        ),
        # --compare-kernels runs the Triton path: without a GPU it is refused, as --kernel triton is
        (
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--device", "cpu", "--compare-kernels"],
            "--compare-kernels needs a CUDA GPU",
        ),
        (
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--devices", "cpu,cpu", "--compare-kernels"],
            "--compare-kernels needs a CUDA GPU",
        ),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--gen-tokens", "1"], "^error: --gen-tokens: "),
        (  # a file that is not Python source: Python has no loader for it
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--plugin", str(REPO / "pyproject.toml")],
            "--plugin: .* is not a Python source file",
        ),
        (  # every context's prompts are built before any cell: 512's work is not lost to 64's error
            ["audit", "--contexts", "512,64", "--niah", "--modes", "int8", "--gen-tokens", "4"],
            "^error: --niah: context 64 is too short for a needle-in-a-haystack prompt",
        ),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--out", ""], "--out: is empty"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--devices", ""], "--devices: is empty"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--prompt-file", ""], "--prompt-file: is empty"),
        (["decode-bench", "--model", "dummy:tiny", "--contexts", "64", "--keep", "8"], "--keep: only shapes a live-KV"),
        (["decode-bench", "--model", "dummy:tiny", "--contexts", "64", "--plugin", " "], "--plugin: is empty"),
        # options that only shape a check are refused without it (they were ignored in silence)
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--niah-depths", "0.5"], "--niah-depths: only shapes"),
        (["audit", "--model", "dummy:tiny", "--contexts", "64", "--ppl-chunk", "32"], "--ppl-chunk: only shapes"),
        (
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--niah", "--niah-depths", ""],
            "--niah-depths: is empty",
        ),
        (  # a dummy model's prompt is random ids: the question went nowhere, in silence
            ["audit", "--model", "dummy:tiny", "--contexts", "64", "--modes", "int8", "--question", "Who is Emma?"],
            "^error: --question needs a model with a tokenizer",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path, capsys, monkeypatch, request):
    import sys

    if "--model" not in args and args[0] != "report":
        # the embedded model converted first: on a fresh machine the case that loads it first would also print
        # the one-time conversion notice (stderr, before its error), whichever test xdist hands it
        request.getfixturevalue("default_model")
    out = tmp_path / "out"
    full = [*args, "--out", str(out)] if args[0] != "report" and "--out" not in args else args
    monkeypatch.setattr(sys, "argv", ["kvbench", *full])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "Traceback" not in err
    assert re.search(message, err), err
    assert not out.exists(), "no partial results on bad input"


def test_help_teaches_every_option():
    for cmd in ("audit", "decode-bench", "report"):
        result = run([cmd, "--help"])
        assert "Usage" in result.output
        assert "Examples" in result.output and f"kvbench {cmd} " in result.output, cmd
    # the defaults written into the help texts show (rich markup once took "[default: 128]" for a style tag)
    wide = runner.invoke(app, ["decode-bench", "--help"], env={"COLUMNS": "300"}).output
    for default in ("[default: 128]", "[default: 3]", "[default: 16]", "[default: all]", "[default: csv,json]"):
        assert default in wide, default
    text = run(["decode-bench", "--help"]).output
    for opt in ("--batch", "--warmup", "--gen", "--repeats", "--contexts", "--modes", "--model"):
        assert opt in text
    for cmd in ("audit", "decode-bench"):  # the GPU path's switches, for comparisons
        text = run([cmd, "--help"]).output
        for opt in ("--no-cuda-graphs", "--no-pdl", "--no-gemv-kernel"):
            assert opt in text, (cmd, opt)
    from kvbench.prompts import DEFAULT_QUESTION

    audit = " ".join(runner.invoke(app, ["audit", "-h"], env={"COLUMNS": "300"}).output.split())
    assert f"[default: '{DEFAULT_QUESTION}']" in audit  # -h as --help; the question a prompt ends in, by default


def test_help_prose_wraps_to_the_terminal_and_examples_fit_80_columns():
    # typer's rich help keeps single line breaks: prose wrapped in the source broke twice in a narrow terminal
    wide = runner.invoke(app, ["decode-bench", "--help"], env={"COLUMNS": "300"}).output
    assert "over --repeats windows of --gen tokens. Ratios vs fp16" in wide
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "300"}).output
    assert re.search(r"^ kvbench audit +which modes run", top, re.M), top
    for cmd in ("audit", "decode-bench", "report", "plan"):
        narrow = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "80"}).output.splitlines()
        examples = [line for line in narrow if line.startswith("   kvbench ")]
        assert examples, cmd
        for i, line in enumerate(narrow):  # an example that wraps leaves its tail on a line of its own
            if line.startswith("   kvbench "):
                nxt = narrow[i + 1] if i + 1 < len(narrow) else ""
                assert nxt.strip() == "" or nxt.startswith("   kvbench ") or nxt.startswith("╭"), (cmd, line, nxt)


def test_top_level_help_lists_every_command_within_80_columns():
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "80"}).output
    for cmd in ("audit", "decode-bench", "report", "plan", "modes"):
        assert re.search(rf"^ kvbench {cmd} +\S", top, re.M), (cmd, top)
    assert max(len(line) for line in top.splitlines()) <= 80, top


def test_version():
    import kvbench

    assert run(["--version"]).output.strip() == f"kvbench {kvbench.__version__}"


def test_bare_command_prints_help_and_no_error(capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "argv", ["kvbench"])  # it once added "error: ; see 'kvbench --help'" and exit 2
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and "Usage" in out + err and "error" not in err, err


def test_modes_lists_registry():
    result = run(["modes"])
    assert "fp16" in result.output and "int8" in result.output
    assert "hf:quanto-int4" in result.output and "hf:all" in result.output  # the peers --modes also takes


def test_modes_lists_a_plugins_modes(tmp_path):
    """`kvbench modes --plugin F` shows F's modes, marked as the plugin's; a missing file is one line."""
    from kvbench.kv import registry

    own = tmp_path / "listed.py"
    own.write_text(
        "from kvbench.kv.registry import register\nfrom kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass Mine(Int8Cache):\n    name = 'listed-int8'\n    aliases = ()\n"
        "    summary = 'int8 with a twist'\n"
    )
    try:
        result = run(["modes", "--plugin", str(own)])
        line = next(ln for ln in result.output.splitlines() if ln.startswith("listed-int8"))
        assert "int8 with a twist" in line and "[plugin listed.py]" in line
        assert "[plugin" not in next(ln for ln in result.output.splitlines() if ln.startswith("int8 "))
    finally:
        registry.MODES.pop("listed-int8", None)
        registry._ALIASES.pop("listed-int8", None)
    missing = runner.invoke(app, ["modes", "--plugin", str(tmp_path / "none.py")])
    assert missing.exit_code != 0 and "plugin file not found" in missing.output


def test_a_plugin_runs_once_per_command_and_its_modes_are_named(tmp_path):
    """The CLI checks the options (loading the plugin), then opens the run: the file ran twice and the run
    said it "registered no new modes". Now it runs once, and the run names what it registered."""
    from kvbench.kv import registry

    own = tmp_path / "once.py"
    own.write_text(
        "print('PLUGIN-RAN')\nfrom kvbench.kv.registry import register\nfrom kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass Mine(Int8Cache):\n    name = 'once-int8'\n    aliases = ()\n"
    )
    try:
        result = run(["audit", "--model", "dummy:tiny", "--contexts", "48", "--gen-tokens", "2", "--modes",
                      "once-int8", "--plugin", str(own), "--out", str(tmp_path / "o")])  # fmt: skip
        assert result.output.count("PLUGIN-RAN") == 1, result.output
        assert f"plugin{own}:registeredonce-int8" in "".join(result.output.split())  # however rich wraps it
        own.write_text(own.read_text().replace("PLUGIN-RAN", "PLUGIN-EDITED"))  # a changed file runs again
        assert registry.load_plugin(own) == ["once-int8"]
        assert registry.get("once-int8").__module__.startswith("kvbench_plugin_once_")
    finally:
        registry.MODES.pop("once-int8", None)
        registry._ALIASES.pop("once-int8", None)


@pytest.mark.parametrize(
    "args",
    [
        ["audit", "--bogus"],
        ["audit", "--gen-tok", "3"],
        ["decode-bench", "--gen", "abc"],
        ["decode-bench", "--memory-budget-gb", "lots"],
        ["nonsense"],
        ["plan"],
    ],
)
def test_usage_errors_are_one_line(args, capsys, monkeypatch):
    """Unknown options, non-numbers, unknown commands, missing arguments: click's errors (raised by the
    click that typer vendors) are one line on stderr and exit code 2, not a traceback."""
    import sys

    monkeypatch.setattr(sys, "argv", ["kvbench", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert "--help" in err


def test_out_that_is_a_file_fails_before_any_work(tmp_path, capsys, monkeypatch):
    """--out naming a file (or a folder under a file) is refused before the model loads, in one line."""
    import sys

    import kvbench.session

    afile = tmp_path / "afile"
    afile.write_text("keep me")

    def no_model(*a, **k):
        raise AssertionError("the model loaded before --out was checked")

    monkeypatch.setattr(kvbench.session, "load_model", no_model)
    for out in (afile, afile / "sub"):
        monkeypatch.setattr(
            sys, "argv", ["kvbench", "audit", "--model", "dummy:tiny", "--contexts", "64", "--out", str(out)]
        )
        with pytest.raises(SystemExit) as exc:
            main()
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --out") and "is a file, not a folder" in err and "\n" not in err, err
    assert afile.read_text() == "keep me"


def test_resume_into_a_file_of_other_columns_is_one_line(tmp_path, capsys, monkeypatch):
    """--resume where bench.csv has other columns (another kvbench version, an audit file) fails before any
    cell runs, naming the file; the file is left as it was."""
    import sys

    out = tmp_path / "run"
    out.mkdir()
    (out / "bench.csv").write_text(",".join(AUDIT_COLUMNS) + "\n")
    before = (out / "bench.csv").read_text()
    argv = ["kvbench", "decode-bench", "--model", "dummy:tiny", "--modes", "fp16", "--contexts", "64",
            "--gen", "2", "--warmup", "1", "--repeats", "1", "--quiet", "--out", str(out), "--resume"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "has different columns" in err and "Traceback" not in err, err
    assert (out / "bench.csv").read_text() == before and not (out / "bench.jsonl").exists()


def test_plan_file_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """plan --file under a file is one line (it was a NotADirectoryError traceback); a missing folder is made."""
    import sys
    from pathlib import Path

    config = str(Path(__file__).resolve().parent.parent / "configs" / "ci-tiny.toml")
    (tmp_path / "afile").write_text("")
    argv = ["kvbench", "plan", "decode-bench", "--config", config, "--out", str(tmp_path / "sweep")]
    monkeypatch.setattr(sys, "argv", [*argv, "--file", str(tmp_path / "afile" / "jobs.txt")])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --file: cannot write") and "\n" not in err, err
    monkeypatch.setattr(sys, "argv", [*argv, "--file", str(tmp_path / "new" / "jobs.txt")])
    main()
    assert (tmp_path / "new" / "jobs.txt").read_text().startswith("kvbench decode-bench")


def test_interrupt_before_the_sweep_says_so(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the model loads: exit 130 with a line saying so (typer turned it into a silent 130),
    and no results folder."""
    import sys

    import kvbench.session

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvbench.session, "load_model", interrupted)
    out = tmp_path / "out"
    monkeypatch.setattr(
        sys, "argv", ["kvbench", "audit", "--model", "dummy:tiny", "--contexts", "64", "--out", str(out)]
    )
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == "interrupted"
    assert not out.exists()


@pytest.mark.parametrize("kind", ["gguf-head", "gguf-half", "safetensors"])
def test_corrupt_model_file_is_one_line(kind, tmp_path, capsys, monkeypatch):
    """A truncated GGUF (cut in its header or in its tensors) or a bogus safetensors file is a
    one-line error naming the file, not a traceback from deep inside gguf or safetensors."""
    import sys

    from kvbench.engine.weights import default_gguf_path

    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    src = default_gguf_path().read_bytes()
    if kind.startswith("gguf"):
        bad = tmp_path / "cut.gguf"
        bad.write_bytes(src[: 4096 if kind == "gguf-head" else len(src) // 2])
    else:
        bad = tmp_path / "folder"
        bad.mkdir()
        (bad / "config.json").write_text('{"model_type": "llama"}')
        (bad / "model.safetensors").write_bytes(src[:100000])
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["kvbench", "audit", "--model", str(bad), "--contexts", "300", "--out", str(out)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    full = capsys.readouterr().err.strip()
    err = full.splitlines()[-1]  # after the conversion's progress line, if any
    assert err.startswith("error: ") and "Traceback" not in full, full
    assert "not a readable" in err and bad.name in err, err
    assert not out.exists()


@pytest.mark.parametrize(("name", "index"), [("cuda", 0), ("cuda:1", 1)])
def test_device_cuda_with_and_without_index(name, index, monkeypatch):
    """`--device cuda` is the current GPU: torch.cuda.set_device refuses an index-less device,
    so only an explicit index is made current (a GPU simulated: this machine has none)."""
    import torch

    from kvbench.runtime import pick_device

    current = [0]

    def set_device(dev):
        if torch.device(dev).index is None:
            raise ValueError("Expected a torch.device with a specified index")
        current[0] = torch.device(dev).index

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    assert pick_device(name) == torch.device("cuda", index)


def test_audit_summary_table_fits_a_narrow_console():
    """The end-of-run audit table: on 80 columns (a pipe) every mode, status and verdict stays whole,
    the output text is left to audit.csv and said so; from WIDE_AUDIT columns the output and the mode a
    fallback ran as are shown. Caps and needle rows say which cap and depth, and whether it was found."""
    from rich.console import Console

    from kvbench.tables import WIDE_AUDIT, print_rows

    def row(mode, check="greedy", **kw):
        base = {"context_tokens": 32768, "kv_cache_mode": mode, "effective_mode": mode, "check": check,
                "status": "ok", "verdict": "near-tie", "first_divergence": 53, "top1_agreement": 0.969,
                "kl_div": 0.0058, "output_text": "The passage above is a continuation of the story " * 3}  # fmt: skip
        return {**base, **kw}

    rows = [
        row("turbo4-delegated"),
        row("turbo4", status="fallback", effective_mode="turbo4-asym"),
        row("turbo3-asym", "max_kv", max_kv_size=256, keep=4, status="degenerate", verdict="degenerate"),
        row("int8", "niah", niah_depth=0.25, niah_hit=False, verdict=None),
        row("fp16", "ppl", ppl_delta=-0.0034, verdict=None),
    ]
    narrow, wide = Console(width=80, record=True), Console(width=WIDE_AUDIT + 40, record=True)
    print_rows("audit", rows, narrow)
    print_rows("audit", rows, wide)
    text, big = narrow.export_text(), wide.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    for cell in ("turbo4-delegated", "turbo3-asym", "degenerate", "fallback", "near-tie", "32K", "-0.34%"):
        assert cell in text, cell
    assert "continuation" not in text and "Output text" in text and "in audit.csv" in text
    assert "cap 256" in text and "keep 4" in text and "niah 0.25" in text and "missed" in text
    assert "turbo4 -> turbo4-asym" in big and "continuation" in big and "in audit.csv" not in big


def test_bench_summary_table_fits_a_narrow_console():
    """The end-of-run benchmark table on 80 columns keeps every mode and number whole (KV bytes per token
    left to bench.csv, said so), and shows ratios to 3 decimals: the margins that matter are 0.3%."""
    from rich.console import Console

    from kvbench.tables import WIDE_BENCH, print_rows

    rows = [
        {"context_tokens": 32768, "batch": 16, "kv_cache_mode": m, "status": "ok", "decode_tok_s": tok,
         "decode_ratio_vs_fp16": ratio, "peak_mem_gb": 63.81, "kv_bytes_per_token": 88844, "roofline_frac": 0.86}
        for m, tok, ratio in (("fp16", 814.9, 1.0), ("turbo4-delegated", 1234.6, 1.0039))
    ]  # fmt: skip
    rows.append({"context_tokens": 32768, "batch": 31, "kv_cache_mode": "fp16", "status": "oom"})
    # a capacity search's pair (the largest batch that fit, the first that did not) is a line, not two table rows
    search = {"context_tokens": 32768, "kv_cache_mode": "fp16", "notes": "capacity search at 32768 tokens: ..."}
    rows += [{**search, "batch": 30, "status": "ok"}, {**search, "batch": 31, "status": "oom"}]
    # a fallback keeps the CSV's status (ok) and names the mode that ran, as bench.csv's effective_mode does
    rows.append({**rows[0], "kv_cache_mode": "turbo4", "effective_mode": "turbo4-asym", "decode_ratio_vs_fp16": 1.1})
    narrow, wide = Console(width=80, record=True), Console(width=WIDE_BENCH, record=True)
    print_rows("bench", rows, narrow)
    print_rows("bench", rows, wide)
    text, big = narrow.export_text(), wide.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    for cell in ("turbo4-delegated", "1234.6", "1.004x", "63.81", "86%", "oom", "32K", "in bench.csv"):
        assert cell in text, cell
    assert "capacity at 32K: fp16 fits batch 30, not 31" in text and text.count("oom: 32K x31") == 1
    assert re.search(r"turbo4\*\s+ok", text) and "* fallback on this model: turbo4 ran as turbo4-asym" in text
    assert re.search(r"turbo4 -> turbo4-asym\W+ok", big) and "* fallback" not in big
    assert "88844" not in text and "88844" in big and "in bench.csv" not in big


def test_counts_take_k_and_whole_decimals():
    from kvbench.config import parse_int_list

    assert parse_int_list("2048, 8k,32K,1.5k,0.5K,3.", "contexts") == [2048, 8192, 32768, 1536, 512, 3]
    assert parse_int_list(None, "contexts") is None


def report_dirs(monkeypatch, capsys, argv, code=0):
    """Run `kvbench report ...` with render_report replaced: the folders it was given, and stderr."""
    import sys

    import kvbench.report

    seen = []
    monkeypatch.setattr(kvbench.report, "render_report", lambda dirs, out: seen.extend(dirs) or "report.md")
    monkeypatch.setattr(sys, "argv", ["kvbench", "report", *map(str, argv)])
    if code:
        with pytest.raises(SystemExit) as exc:
            main()
        assert exc.value.code == code
    else:
        main()
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    return seen, err


def results_folder(path, stem="bench"):
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{stem}.csv").write_text("x\n")
    return path


def test_report_of_a_file_says_it_is_not_a_folder(tmp_path, monkeypatch, capsys):
    run_dir = results_folder(tmp_path / "run", "audit")
    _, err = report_dirs(monkeypatch, capsys, [run_dir / "audit.csv"], code=2)
    assert (
        err
        == f"error: {run_dir / 'audit.csv'} is a file, not a results folder; give its folder: kvbench report {run_dir}"
    )
    (tmp_path / "notes.txt").write_text("")
    _, err = report_dirs(monkeypatch, capsys, [tmp_path / "notes.txt"], code=2)
    assert err.startswith("error: ") and "is a file, not a results folder" in err and "give its folder" not in err


def test_plan_then_report_skips_the_job_files(tmp_path, monkeypatch, capsys):
    """plan --file inside --out puts jobs.txt and jobs.slurm.sh beside the job folders: its hint globs folders
    only (`OUT/*/`), and `report OUT/*` skips the files with one warning line (a lone file stays an error)."""
    import glob
    import sys
    from pathlib import Path

    config = str(Path(__file__).resolve().parent.parent / "configs" / "ci-tiny.toml")
    out = tmp_path / "sweep"
    argv = ["kvbench", "plan", "decode-bench", "--config", config, "--out", str(out), "--file", str(out / "jobs.txt")]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    hint = capsys.readouterr().err.strip().splitlines()[-1]
    assert hint.endswith(f"then: kvbench report {out}/*/ --out {out}"), hint  # not into the first job's folder
    folders = [results_folder(out / "ctx48-b1"), results_folder(out / "ctx96-b1")]
    assert sorted(glob.glob(f"{out}/*/")) == [f"{d}/" for d in folders]  # what the shell makes of the hint
    dirs, err = report_dirs(monkeypatch, capsys, sorted(out.glob("*")))
    assert dirs == folders
    assert err.startswith("warning: skipping 2 path(s) that are files: ") and "jobs.slurm.sh" in err, err
    assert "\n" not in err
    _, err = report_dirs(monkeypatch, capsys, [out / "jobs.txt", out / "jobs.slurm.sh"], code=2)
    assert err == "error: none of the 2 paths is a results folder (all are files)", err
    _, err = report_dirs(monkeypatch, capsys, [*folders, out / "missing"], code=2)
    assert err == f"error: results folder not found: {out / 'missing'}", err
    _, err = report_dirs(monkeypatch, capsys, [out], code=2)  # the sweep's parent folder
    assert err == f"error: no CSV files in {out}; its subfolders have some: kvbench report {out}/*/", err


def test_report_without_arguments_takes_the_folder_with_the_newest_csv(tmp_path, monkeypatch, capsys):
    """Not the newest folder: a sweep's parent folder (its CSVs are in subfolders) or an empty one is newer."""
    import os

    monkeypatch.chdir(tmp_path)
    _, err = report_dirs(monkeypatch, capsys, [], code=2)
    assert err == "error: no results folder given and no CSV files under results/", err
    old = results_folder(tmp_path / "results" / "old")
    new = results_folder(tmp_path / "results" / "sweep" / "ctx2048")
    (tmp_path / "results" / "empty").mkdir()
    os.utime(old / "bench.csv", (1e9, 1e9))
    os.utime(new / "bench.csv", (2e9, 2e9))
    os.utime(tmp_path / "results" / "sweep", (3e9, 3e9))
    os.utime(tmp_path / "results" / "empty", (4e9, 4e9))
    dirs, _ = report_dirs(monkeypatch, capsys, [])
    assert [d.resolve() for d in dirs] == [new.resolve()]
    os.utime(old / "bench.csv", (5e9, 5e9))
    dirs, _ = report_dirs(monkeypatch, capsys, [])
    assert [d.resolve() for d in dirs] == [old.resolve()]


def test_random_fill_honours_max_kv_size(tmp_path):
    # --fill random (the dummy models' default) once ignored the cap: its rows claimed a cap they did not measure
    common = ["--model", "dummy:tiny", "--modes", "fp16,int8", "--contexts", "200", "--quiet"]
    common += ["--gen", "2", "--repeats", "1", "--warmup", "1", "--max-kv-size", "48"]
    by_fill = {}
    for fill in ("random", "prefill"):
        run(["decode-bench", *common, "--fill", fill, "--out", str(tmp_path / fill)])
        by_fill[fill] = {r["kv_cache_mode"]: r for r in read(tmp_path / fill / "bench.csv")}
    uncapped = tmp_path / "uncapped"
    run(["decode-bench", *common[:-2], "--fill", "random", "--out", str(uncapped)])
    full = {r["kv_cache_mode"]: r for r in read(uncapped / "bench.csv")}
    for mode in ("fp16", "int8"):
        assert by_fill["random"][mode]["kv_bytes"] == by_fill["prefill"][mode]["kv_bytes"], mode
        assert int(by_fill["random"][mode]["kv_bytes"]) * 3 < int(full[mode]["kv_bytes"]), mode


def test_boundary_that_covers_every_layer_is_said(tmp_path):
    # dummy:tiny has 6 layers: --boundary-v 3 keeps all of them at fp16, so turbo4-asym would quietly be fp16
    out = tmp_path / "b"
    args = ["audit", "--model", "dummy:tiny", "--modes", "turbo4-asym", "--contexts", "40", "--gen-tokens", "4"]
    run([*args, "--boundary-v", "3", "--out", str(out), "--quiet"])
    row = next(r for r in read(out / "audit.csv") if r["kv_cache_mode"] == "turbo4-asym")
    assert "keeps all 6 layers at fp16, nothing is quantized" in row["notes"], row["notes"]
    run([*args, "--out", str(tmp_path / "d"), "--quiet"])  # the default 2 leaves layers 2-3 quantized
    row = next(r for r in read(tmp_path / "d" / "audit.csv") if r["kv_cache_mode"] == "turbo4-asym")
    assert "nothing is quantized" not in row["notes"] and row["kl_div"] not in ("0", "0.0"), row


def test_a_mode_is_not_called_degenerate_for_matching_a_degenerate_fp16(tmp_path):
    # random weights loop, so fp16's own greedy text trips the detector; int8 (identical tokens) once got
    # status "degenerate" for it, and the report then advised against every mode
    out = tmp_path / "g"
    run(["audit", "--model", "dummy:tiny", "--modes", "fp16,int8", "--contexts", "256", "--gen-tokens", "16",
         "--out", str(out), "--quiet"])  # fmt: skip
    rows = {r["kv_cache_mode"]: r for r in read(out / "audit.csv")}
    assert rows["fp16"]["degenerate"] == "true", rows["fp16"]  # the premise: this model's fp16 output loops
    assert rows["int8"]["degenerate"] == "true" and "so is fp16's output" in rows["int8"]["degenerate_reason"]
    assert rows["int8"]["status"] != "degenerate" and rows["int8"]["verdict"] != "degenerate", rows["int8"]


def test_decoding_past_the_trained_positions_is_noted():
    from kvbench.engine.weights import load_model, past_trained

    lm = load_model("dummy:tiny", device="cpu")
    trained = lm.args.max_position_embeddings
    assert past_trained(lm, trained - 4, trained + 4) and "past the" in past_trained(lm, trained - 4, trained + 4)
    assert past_trained(lm, trained - 8, trained) == ""
    assert past_trained(lm, trained - 4, trained + 4, yarn="2") == ""  # a forced YaRN factor covers it


def test_failed_cells_say_why_below_the_table():
    from kvbench.tables import failure_lines

    rows = [
        {"context_tokens": 2048, "check": "greedy", "kv_cache_mode": "int8", "status": "ok", "notes": ""},
        {"context_tokens": 8192, "check": "greedy", "kv_cache_mode": "mine", "status": "error",
         "notes": "yarn x2 (context 8192 > 4096 trained); RuntimeError: shapes do not match"},
        {"context_tokens": 32768, "batch": 16, "kv_cache_mode": "fp16", "status": "oom", "notes": "CUDA out of memory"},
    ]  # fmt: skip
    assert failure_lines(rows) == [
        "error: 8K greedy mine: RuntimeError: shapes do not match",
        "oom: 32K x16 fp16: CUDA out of memory",
    ]


def test_progress_leaves_no_unfinished_step_bar_in_a_log():
    # in a log (no terminal) the final render once showed the last cell's step bar at e.g. 7/8
    import io

    from rich.console import Console

    from kvbench.runtime import Progress

    buf = io.StringIO()
    with Progress(1, console=Console(file=buf, force_terminal=False, width=100)) as p:
        p.step("40 greedy int8: decode", 8)
        p.advance_to(7)
        p.cell_done()
    text = buf.getvalue()
    assert "1/1" in text and "7/8" not in text, text


def test_flags_from_a_config_file_can_be_turned_off(tmp_path):
    """Every on/off option has its opposite (--no-ppl, --fallback, --cuda-graphs, ...), so a config file's
    `ppl = true` or `no_fallback = true` can be overridden for one run, as the help promises."""
    from kvbench import config as config_mod
    from kvbench.cli import _common

    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[common]\nmodel = "dummy:tiny"\nno_fallback = true\n[audit]\nppl = true\nniah = true\n')
    cfg = config_mod.build_config("audit", str(cfg_file), {})
    assert cfg.ppl and cfg.niah and cfg.no_fallback
    out = tmp_path / "run"
    run(["audit", "--config", str(cfg_file), "--contexts", "40", "--modes", "int8", "--gen-tokens", "4", "--no-ppl",
         "--no-niah", "--fallback", "--quiet", "--out", str(out)])  # fmt: skip
    rows = read(out / "audit.csv")
    assert {r["check"] for r in rows} == {"greedy"}, {r["check"] for r in rows}
    assert _common(no_cuda_graphs=False)["cuda_graphs"] is True and "pdl" not in _common(no_pdl=None)
    assert _common(no_pdl=True)["pdl"] is False


def test_empty_out_for_plan_and_unwritable_plots_are_one_line(tmp_path, capsys, monkeypatch):
    import sys

    for argv, message in (
        (["plan", "audit", "--config", str(REPO / "configs/ci-tiny.toml"), "--out", ""], "plan: --out is empty"),
        (["report", str(REPO / "results/2026-12-04g-h200/bench"), "--out", "/proc/kvbench-test/r.md"], "cannot write"),
    ):
        monkeypatch.setattr(sys, "argv", ["kvbench", *argv])
        with pytest.raises(SystemExit) as exc:
            main()
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and message in err and "\n" not in err, err


def test_cpu_allocation_failure_is_oom():
    """The CPU allocator's failure is an out-of-memory row (status oom), as CUDA's is."""
    from kvbench.runtime import is_oom

    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 96000000000 bytes"))  # fmt: skip
    assert not is_oom(RuntimeError("shape mismatch"))


def test_checks_that_would_test_nothing_say_so(tmp_path):
    """A KV cap the cache never reaches is a skipped row saying why; a perplexity window of one chunk (it reads
    no cached entry) says so in its note."""
    out = tmp_path / "run"
    run(["audit", "--contexts", "200", "--modes", "int8", "--gen-tokens", "4", "--kv-cap-check", "1000", "--ppl",
         "--ppl-windows", "1", "--quiet", "--out", str(out)])  # fmt: skip
    rows = read(out / "audit.csv")
    caps = [r for r in rows if r["check"] == "max_kv"]
    assert caps and all(r["status"] == "skipped" and "the cache never fills" in r["notes"] for r in caps)
    ppl = {r["kv_cache_mode"]: r for r in rows if r["check"] == "ppl"}
    assert ppl["int8"]["ppl"] == ppl["fp16"]["ppl"] and "the window is one chunk" in ppl["int8"]["notes"]


def test_a_plugin_may_not_take_a_builtin_name(tmp_path):
    """A plugin class named like a built-in mode (or `all`) is refused, and the registry is left as it was;
    a plugin with its own name loads, and loading the same file again is fine."""
    from kvbench.errors import KvbenchError
    from kvbench.kv import registry

    clash = tmp_path / "clash.py"
    clash.write_text(
        "from kvbench.kv.registry import register\nfrom kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass Mine(Int8Cache):\n    name = 'int8'\n    aliases = ()\n"
    )
    registry.mode_names()  # the built-in modes registered
    real = registry.MODES["int8"]
    with pytest.raises(KvbenchError, match=r"registers a mode name that is taken \(int8\)"):
        registry.load_plugin(clash)
    assert registry.MODES["int8"] is real
    own = tmp_path / "own.py"
    own.write_text(clash.read_text().replace("name = 'int8'", "name = 'my-int8'"))
    assert registry.load_plugin(own) == ["my-int8"]
    registry.load_plugin(own)  # again, as a second command in the same process does
    # a file of the same name in another folder is another plugin: its modes join, it may not take own's name
    (tmp_path / "b").mkdir()
    other = tmp_path / "b" / "own.py"
    try:
        other.write_text(own.read_text().replace("my-int8", "their-int8"))
        assert registry.load_plugin(other) == ["their-int8"] and registry.load_plugin(own) == ["my-int8"]
        other.write_text(own.read_text())
        with pytest.raises(KvbenchError, match=r"registers a mode name that is taken \(my-int8\)"):
            registry.load_plugin(other)
        assert registry.MODES["my-int8"].__module__ != registry.MODES["their-int8"].__module__
    finally:
        for name in ("my-int8", "their-int8"):
            registry.MODES.pop(name, None)
            registry._ALIASES.pop(name, None)


def test_a_run_whose_every_cell_failed_exits_nonzero(tmp_path, monkeypatch):
    """Rows are written (a recorded row per cell), and the exit status says nothing worked."""
    from kvbench.bench import BenchJob

    def measure(self, mode, ctx, batch, notes):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(BenchJob, "_measure", measure)
    out = tmp_path / "run"
    result = run(["decode-bench", "--model", "dummy:tiny", "--contexts", "48", "--modes", "fp16,int8", "--gen", "2",
                  "--repeats", "1", "--warmup", "1", "--quiet", "--out", str(out)], expect=1)  # fmt: skip
    assert "every cell of this run failed (status error;" in result.output
    rows = read(out / "bench.csv")
    assert rows and all(r["status"] == "error" for r in rows)

    import torch

    def oom(self, mode, ctx, batch, notes):  # out of memory in every cell: nothing measured either
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(BenchJob, "_measure", oom)
    result = run(["decode-bench", "--model", "dummy:tiny", "--contexts", "48", "--modes", "fp16,int8", "--gen", "2",
                  "--repeats", "1", "--warmup", "1", "--quiet", "--out", str(tmp_path / "oom")], expect=1)  # fmt: skip
    assert "every cell of this run failed (status oom;" in result.output
    assert {r["status"] for r in read(tmp_path / "oom" / "bench.csv")} == {"oom"}


@pytest.mark.usefixtures("default_model")  # converted first: a fresh machine's one-time notice is not in `err`
def test_prompt_file_errors_name_the_file_and_the_fix(tmp_path, capsys, monkeypatch):
    """An empty prompt file, or one too short for --contexts, is one line naming the file (and the context
    that would fit); without --contexts the run says it takes the file's own length (not the CPU default),
    sharded over --devices too."""
    import sys

    empty, short = tmp_path / "empty.txt", tmp_path / "short.txt"
    empty.write_text("")
    short.write_text("Emma Woodhouse, handsome, clever, and rich.")

    def fails(*args):
        out = tmp_path / "out"
        monkeypatch.setattr(sys, "argv", ["kvbench", "audit", "--modes", "int8", "--gen-tokens", "2", *args,
                                          "--out", str(out)])  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main()
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and "\n" not in err and not out.exists(), err
        return err

    assert fails("--prompt-file", str(empty)) == f"error: --prompt-file: {empty} holds no text"
    err = fails("--prompt-file", str(short), "--contexts", "300")
    assert err.startswith(f"error: --prompt-file {short}: the prompt file has ") and "a context of at most" in err
    at_most = int(re.search(r"at most (\d+)", err).group(1))
    result = run(["audit", "--modes", "int8", "--gen-tokens", "2", "--prompt-file", str(short), "--ppl",
                  "--out", str(tmp_path / "ok")])  # fmt: skip
    assert "the prompt file's own length" in result.output and "CPU default contexts" not in result.output
    rows = list(csv.DictReader((tmp_path / "ok" / "audit.csv").read_text().splitlines()))
    assert {int(r["context_tokens"]) for r in rows} == {at_most}  # the file's own length is the longest that fits
    ppl = [r for r in rows if r["check"] == "ppl"]  # the file's text is shorter than the context: no window
    assert ppl and all(r["status"] == "skipped" and "fewer than one" in r["notes"] for r in ppl)
    # sharded, the one context (the file's length, which only the tokenizer knows) runs on the first device
    result = run(["audit", "--modes", "int8", "--gen-tokens", "2", "--prompt-file", str(short), "--devices", "cpu,cpu",
                  "--out", str(tmp_path / "sharded")])  # fmt: skip
    assert "the audit runs on cpu alone" in result.output and "sharding" not in result.output
    rows = list(csv.DictReader((tmp_path / "sharded" / "audit.csv").read_text().splitlines()))
    assert {int(r["context_tokens"]) for r in rows} == {at_most} and {r["status"] for r in rows} == {"ok"}


def test_ppl_reads_the_prompt_file(tmp_path):
    """With --prompt-file, --ppl measures the user's text, not the bundled novel: a text that repeats one
    sentence is all but certain to a language model (perplexity near 1; the novel's is in the tens)."""
    text = tmp_path / "mine.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "run"
    run(["audit", "--modes", "int8", "--contexts", "256", "--gen-tokens", "2", "--prompt-file", str(text), "--ppl",
         "--ppl-windows", "2", "--ppl-chunk", "64", "--quiet", "--out", str(out)])  # fmt: skip
    ppl = {r["kv_cache_mode"]: r for r in read(out / "audit.csv") if r["check"] == "ppl"}
    assert set(ppl) == {"fp16", "int8"} and all(r["status"] == "ok" for r in ppl.values())
    assert float(ppl["fp16"]["ppl"]) < 1.5 and "2 window(s) of mine.txt of 256 tokens" in ppl["fp16"]["notes"]


def test_the_recorded_command_is_quoted_for_a_shell(monkeypatch):
    """runs.csv's command (and the report's Commands section) pastes back into a shell: a path with a space
    stays one argument."""
    import shlex
    import sys

    from kvbench.results import command_line

    monkeypatch.setattr(sys, "argv", ["kvbench", "audit", "--prompt-file", "my notes.txt", "--modes", "int8"])
    assert command_line() == "kvbench audit --prompt-file 'my notes.txt' --modes int8"
    assert shlex.split(command_line())[3] == "my notes.txt"

"""Sweeps that survive: resume after an exception or a signal, OOM cells as rows,
config validation, sharding over CPU workers."""

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kvbench.cli import app

runner = CliRunner()
TINY = ["--model", "dummy:tiny", "--quiet", "--modes", "fp16,int8,turbo4-asym"]


def run(args, code=0):
    result = runner.invoke(app, args)
    assert result.exit_code == code, (result.output, result.exception)
    return result


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cells(path):
    rows = read(path)
    keys = [r["cell"] for r in rows]
    assert len(keys) == len(set(keys)), "duplicated cells"
    return {r["cell"]: r["status"] for r in rows}


AUDIT = [*TINY, "--contexts", "40,56", "--gen-tokens", "4", "--kv-cap-check", "24", "--prefix-reuse"]
BENCH = [*TINY, "--contexts", "48,64", "--batch", "1,2", "--gen", "2", "--warmup", "1", "--repeats", "1"]


def test_audit_resume_after_an_exception(tmp_path, monkeypatch):
    full, part = tmp_path / "full", tmp_path / "part"
    run(["audit", *AUDIT, "--out", str(full)])
    from kvbench.audit import AuditJob

    real, calls = AuditJob._compare, {"n": 0}

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # as if Ctrl-C arrived mid-sweep
        return real(self, *a, **k)

    monkeypatch.setattr(AuditJob, "_compare", flaky)
    result = run(["audit", *AUDIT, "--out", str(part)], code=130)
    assert "--resume" in result.output
    saved = cells(part / "audit.csv")
    assert 0 < len(saved) < len(cells(full / "audit.csv"))
    monkeypatch.setattr(AuditJob, "_compare", real)
    run(["audit", *AUDIT, "--out", str(part)], code=2)  # no silent duplication without --resume
    run(["audit", *AUDIT, "--out", str(part), "--resume"])
    assert cells(part / "audit.csv").keys() == cells(full / "audit.csv").keys()
    # a second resume finds nothing left to do
    before = (part / "audit.csv").read_text()
    run(["audit", *AUDIT, "--out", str(part), "--resume"])
    assert (part / "audit.csv").read_text() == before


def test_bench_resume_after_a_signal(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run(["decode-bench", *BENCH, "--out", str(full)])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "kvbench", "decode-bench", *BENCH, "--out", str(part)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    csv_path = part / "bench.csv"
    deadline = time.time() + 120
    while time.time() < deadline and (not csv_path.exists() or len(read(csv_path)) < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # what a cluster scheduler sends
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out  # 128 + SIGTERM (Ctrl-C is 130)
    assert "Traceback" not in out
    saved = cells(csv_path)  # parseable, whole lines only
    assert 2 <= len(saved) < len(cells(full / "bench.csv"))
    run(["decode-bench", *BENCH, "--out", str(part), "--resume"])
    assert cells(csv_path).keys() == cells(full / "bench.csv").keys()


def test_resume_after_a_cut_last_line(tmp_path):
    """A results file cut mid-line from outside: --resume drops the partial line (saying so)
    and measures that cell again, rather than gluing the next row onto it."""
    full, part = tmp_path / "full", tmp_path / "part"
    run(["decode-bench", *BENCH, "--out", str(full)])
    part.mkdir()
    for name in ("bench.csv", "bench.jsonl"):
        lines = (full / name).read_text().splitlines(keepends=True)
        n = 4 + name.endswith("csv")  # the header and 4 rows whole, then half of the 5th row (no newline)
        (part / name).write_text("".join(lines[:n]) + lines[n][: len(lines[n]) // 2])
    assert len(cells(part / "bench.csv")) == 4 + 1  # the cut line parses as a row with a partial cell key
    result = run(["decode-bench", *BENCH, "--out", str(part), "--resume"])
    assert "bench.csv: the last line was cut short" in result.output
    assert "bench.jsonl: the last line was cut short" in result.output
    assert all(None not in r for r in read(part / "bench.csv")), "a row glued onto the cut line"
    got = cells(part / "bench.csv")
    assert got.keys() == cells(full / "bench.csv").keys() and set(got.values()) == {"ok"}
    import json

    rows = [json.loads(x) for x in (part / "bench.jsonl").read_text().splitlines()]
    assert sorted(r["cell"] for r in rows) == sorted(got)
    # a cut header: the file starts again
    (part / "bench.csv").write_text("date,dev")
    (part / "bench.jsonl").write_text("")
    result = run(["decode-bench", *BENCH, "--out", str(part), "--resume"])
    assert "its header was cut short" in result.output
    assert cells(part / "bench.csv").keys() == got.keys()


def test_resume_trims_jsonl_rows_past_the_csv(tmp_path):
    """A run stopped between a row's JSON and CSV writes leaves the JSONL a row ahead: --resume measures that
    cell again and trims the JSONL first, so it holds every cell once, in step with the CSV."""
    import json

    full, part = tmp_path / "full", tmp_path / "part"
    run(["decode-bench", *BENCH, "--out", str(full)])
    part.mkdir()
    csv_lines = (full / "bench.csv").read_text().splitlines(keepends=True)
    json_lines = (full / "bench.jsonl").read_text().splitlines(keepends=True)
    (part / "bench.csv").write_text("".join(csv_lines[:4]))  # the header and 3 rows
    (part / "bench.jsonl").write_text("".join(json_lines[:5]))  # 5 rows: 2 past the CSV
    result = run(["decode-bench", *BENCH, "--out", str(part), "--resume"])
    assert "bench.jsonl: 2 rows past bench.csv's last row; dropped" in result.output
    rows = [json.loads(x) for x in (part / "bench.jsonl").read_text().splitlines()]
    got = cells(part / "bench.csv")
    assert [r["cell"] for r in rows] == [r["cell"] for r in read(part / "bench.csv")]
    assert got.keys() == cells(full / "bench.csv").keys() and len(rows) == len(got)
    # A JSONL behind its CSV is only reported.
    (part / "bench.jsonl").write_text("".join(json_lines[:2]))
    result = run(["decode-bench", *BENCH, "--out", str(part), "--resume"])
    assert f"bench.jsonl: {len(got) - 2} rows behind bench.csv (left as it is" in result.output


def test_resume_with_another_format_says_what_the_jsonl_holds(tmp_path):
    """A run resumed with json among its formats after one without (or the other way round) says the JSONL
    does not hold every row, rather than leaving it short in silence."""
    from kvbench.results import AUDIT_COLUMNS, ResultsWriter

    row = {"kv_cache_mode": "fp16", "status": "ok"}
    ResultsWriter(tmp_path, "audit", AUDIT_COLUMNS, formats=("csv",)).write(row)
    with_json = ResultsWriter(tmp_path, "audit", AUDIT_COLUMNS)
    assert with_json.repair_tail() == [
        f"{tmp_path / 'audit.jsonl'}: will hold this run's rows only; audit.csv's 1 earlier row "
        "(written without --format json) is not in it"
    ]
    with_json.write(row)
    assert with_json.repair_tail() == [
        f"{tmp_path / 'audit.jsonl'}: 1 row behind audit.csv (left as it is; the CSV is the record)"
    ]
    without = ResultsWriter(tmp_path, "audit", AUDIT_COLUMNS, formats=("csv", "md"))
    assert without.repair_tail() == [
        f"{tmp_path / 'audit.jsonl'}: not written by this run (--format csv,md): it falls behind audit.csv, "
        "which is the record"
    ]


def test_oom_in_one_cell_is_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    from kvbench.bench import BenchJob

    real = BenchJob._measure

    def measure(self, mode, ctx, batch, notes):
        if mode == "int8" and ctx == 48 and batch == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(self, mode, ctx, batch, notes)

    monkeypatch.setattr(BenchJob, "_measure", measure)
    run(["decode-bench", *BENCH, "--out", str(tmp_path)])
    rows = read(tmp_path / "bench.csv")
    assert len(rows) == 12
    bad = [r for r in rows if r["status"] != "ok"]
    assert len(bad) == 1 and bad[0]["status"] == "oom" and "out of memory" in bad[0]["notes"]
    after = rows.index(bad[0]) + 1
    assert rows[after]["status"] == "ok"  # the next cell still ran


def test_resume_refuses_another_model(tmp_path):
    run(["decode-bench", *BENCH, "--out", str(tmp_path)])
    other = [a if a != "dummy:tiny" else "dummy:smollm2-135m" for a in BENCH]
    result = run(["decode-bench", *other, "--out", str(tmp_path), "--resume"], code=2)
    assert "model hash" in result.output and "--force" in result.output


@pytest.mark.parametrize(
    "text, message",
    [
        ("[audit]\ngen_tokenz = 3\n", r"c\.toml: unknown key 'gen_tokenz' in \[audit\]"),
        ('[audit]\ngen_tokens = "many"\n', r"c\.toml \[audit\]: key 'gen_tokens' must be int"),
        ('[common]\nmodes = ["int9"]\n', r"c\.toml: modes: unknown KV mode 'int9'"),
        ("[benchmark]\nbatch = [1]\n", r"c\.toml: unknown table \[benchmark\]"),
        ("[audit\n", r"c\.toml: not valid TOML"),
    ],
)
def test_bad_config_names_file_key_and_reason(tmp_path, text, message):
    import re

    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    result = run(["audit", "--config", str(cfg), "--out", str(tmp_path / "o")], code=2)
    assert re.search(message, result.output), result.output
    assert not (tmp_path / "o").exists()


def test_config_file_and_command_line_override(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[common]\nmodel = "dummy:tiny"\nmodes = ["fp16", "int8"]\ncontexts = [40]\n[audit]\ngen_tokens = 3\n'
    )
    run(["audit", "--config", str(cfg), "--contexts", "48", "--out", str(tmp_path / "o"), "--quiet"])
    rows = read(tmp_path / "o" / "audit.csv")
    assert {r["context_tokens"] for r in rows} == {"48"} and {r["gen_tokens"] for r in rows} == {"3"}


def test_sharded_run_equals_unsharded(tmp_path, monkeypatch):
    """Sharded over two workers, the same cells; the bar counts every cell, and a resumed run's bar counts
    the skipped ones too (it ended at 7/24) after saying it resumes; a resumed run starts workers only for the
    groups with cells left."""
    from kvbench import runtime
    from kvbench import sweep as sweep_mod

    bars = []

    class Counting(runtime.Progress):
        def __init__(self, total, *a, **k):
            super().__init__(total, *a, **k)
            self.total, self.ticks = total, 0
            bars.append(self)

        def cell_done(self):
            super().cell_done()
            self.ticks += 1

    one, two = tmp_path / "one", tmp_path / "two"
    run(["decode-bench", *BENCH, "--out", str(one)])
    monkeypatch.setattr(runtime, "Progress", Counting)
    run(["decode-bench", *BENCH, "--out", str(two), "--devices", "cpu,cpu"])
    assert cells(one / "bench.csv") == cells(two / "bench.csv")
    runs = read(two / "runs.csv")
    assert "2 workers" in runs[0]["device"]
    assert bars[-1].ticks == bars[-1].total > 0
    loud = [a for a in BENCH if a != "--quiet"]
    started = []
    real = sweep_mod.run_sharded
    monkeypatch.setattr(sweep_mod, "run_sharded", lambda *a, **k: started.append(a[3]) or real(*a, **k))
    result = run(["decode-bench", *loud, "--out", str(two), "--devices", "cpu,cpu", "--resume"])
    assert f"resuming: {len(cells(one / 'bench.csv'))} finished cells" in result.output
    assert bars[-1].ticks == bars[-1].total and len(read(two / "bench.csv")) == len(read(one / "bench.csv"))
    # every group finished: no worker starts (they would load the model only to skip every cell)
    assert "every cell is already in" in result.output and started == []
    # half of them finished: the workers get only the others
    three, half = tmp_path / "three", [("48" if a == "48,64" else a) for a in loud]
    run(["decode-bench", *half, "--out", str(three), "--devices", "cpu,cpu"])
    result = run(["decode-bench", *loud, "--out", str(three), "--devices", "cpu,cpu", "--resume"])
    assert "2 of 4 groups are finished; 2 left" in result.output and started[-1] == [(64, 1), (64, 2)]
    assert bars[-1].ticks == bars[-1].total and cells(three / "bench.csv") == cells(one / "bench.csv")


def test_shipped_configs_are_valid():
    from pathlib import Path

    from kvbench.config import build_config

    root = Path(__file__).parent.parent / "configs"
    names = sorted(p.name for p in root.glob("*.toml"))
    assert {"default.toml", "h200-llama-3.1-8b.toml", "ci-tiny.toml"} <= set(names)
    for p in root.glob("*.toml"):
        for job in ("audit", "decode-bench"):
            build_config(job, str(p), {})


def test_plan_emits_one_command_per_group(tmp_path):
    out = tmp_path / "jobs"
    result = run(["plan", "decode-bench", "--config", "configs/ci-tiny.toml", "--out", str(out)])
    lines = [x for x in result.output.splitlines() if x.startswith("kvbench")]
    assert len(lines) >= 2 and all("--resume" in x for x in lines)
    # absolute paths: a scheduler starts each command in a folder of its own choosing
    config = (Path.cwd() / "configs/ci-tiny.toml").resolve()
    assert all(f"--config {config} " in x and f"--out {out.resolve()}/ctx" in x for x in lines), lines


def test_plan_says_which_contexts_it_assumed(tmp_path):
    # a config without contexts plans the GPU set (the jobs are for GPU nodes), and says so
    result = run(["plan", "audit", "--config", "configs/default.toml", "--out", str(tmp_path / "p")])
    assert "sets no contexts: planned the GPU default 2K, 8K, 32K" in result.output
    assert sum(x.startswith("kvbench audit") for x in result.output.splitlines()) == 3
    result = run(["plan", "audit", "--config", "configs/ci-tiny.toml", "--out", str(tmp_path / "q")])
    assert "sets no contexts" not in result.output
    # an audit of a prompt file without contexts runs at the file's own length (as unplanned): one job
    config = tmp_path / "mine.toml"
    config.write_text('[audit]\nprompt_file = "mine.txt"\n')
    (tmp_path / "mine.txt").write_text("Emma Woodhouse, handsome, clever, and rich.")
    result = run(["plan", "audit", "--config", str(config), "--out", str(tmp_path / "r")])
    jobs = [x for x in result.output.splitlines() if x.startswith("kvbench audit")]
    assert "one job, at the file's own length" in result.output and "GPU default" not in result.output
    assert (
        len(jobs) == 1 and "--contexts" not in jobs[0] and f"--out {(tmp_path / 'r').resolve()}/prompt-file " in jobs[0]
    )


def test_a_resume_with_every_cell_done_loads_no_model(tmp_path, monkeypatch):
    """`--resume` on a results folder that holds every cell of the command says so and stops, before the model
    loads (it would load only for every cell to be skipped); one cell missing, and the run goes on as usual."""
    from kvbench.session import Session

    loads = []
    real = Session.open.__func__
    monkeypatch.setattr(Session, "open", classmethod(lambda cls, *a, **k: loads.append(a[1]) or real(cls, *a, **k)))
    bench = [*TINY, "--contexts", "48", "--batch", "1", "--gen", "2", "--warmup", "1", "--repeats", "1"]
    audit = [*TINY, "--contexts", "40", "--gen-tokens", "2", "--kv-cap-check", "24"]
    for job, args, more in (("decode-bench", bench, ["--batch", "1,2"]), ("audit", audit, ["--contexts", "40,48"])):
        out = tmp_path / job
        loud = [a for a in args if a != "--quiet"]
        run([job, *args, "--out", str(out)])
        rows = read(out / f"{'bench' if job == 'decode-bench' else 'audit'}.csv")
        result = run([job, *loud, "--out", str(out), "--resume"])
        assert loads == [job] and "every cell is already in" in result.output  # the first run's load only
        result = run([job, *loud, *more, "--out", str(out), "--resume"])  # more cells than the folder holds
        assert loads == [job, job] and "every cell is already in" not in result.output
        assert len(read(out / f"{'bench' if job == 'decode-bench' else 'audit'}.csv")) > len(rows)
        loads.clear()


def test_a_sharded_audits_main_process_keys_cells_as_its_workers_do(tmp_path, monkeypatch):
    """The main process of a sharded run keys the cells without a model (the weights' hash, the dtype, a plugin
    file's digest, every check): keyed otherwise, a resumed audit whose cells are all there would start workers,
    or one whose cells are not would skip them."""
    from kvbench import sweep as sweep_mod
    from kvbench.kv import registry

    plugin = tmp_path / "mine.py"
    plugin.write_text(
        "from kvbench.kv.registry import register\nfrom kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass Mine(Int8Cache):\n    name = 'mine-int8'\n    aliases = ()\n"
    )
    one, two = tmp_path / "one", tmp_path / "two"
    args = [*AUDIT, "--modes", "fp16,mine-int8", "--plugin", str(plugin), "--keep", "0"]
    try:
        run(["audit", *args, "--out", str(one)])
        run(["audit", *args, "--out", str(two), "--devices", "cpu,cpu"])
        assert cells(one / "audit.csv") == cells(two / "audit.csv")
        started = []
        monkeypatch.setattr(sweep_mod, "run_sharded", lambda *a, **k: started.append(a[3]) or [])
        loud = [a for a in args if a != "--quiet"]
        result = run(["audit", *loud, "--out", str(two), "--devices", "cpu,cpu", "--resume"])
        assert "every cell is already in" in result.output and started == []
        plugin.write_text(plugin.read_text() + "    summary = 'edited'\n")  # its cells' keys change
        result = run(["audit", *loud, "--out", str(two), "--devices", "cpu,cpu", "--resume"])
        assert started == [[40, 56]], result.output
    finally:
        registry.MODES.pop("mine-int8", None)
        registry._ALIASES.pop("mine-int8", None)


def test_markdown_table_holds_every_row_after_a_resume(tmp_path):
    """`--format md` rewrites the table from the whole CSV: a resumed run that adds one context (or nothing, and
    stops before the model loads) keeps the earlier rows in it."""
    out = tmp_path / "md"
    args = [*TINY, "--batch", "1", "--gen", "2", "--warmup", "1", "--repeats", "1", "--format", "csv,md"]
    run(["decode-bench", *args, "--contexts", "48", "--out", str(out)])
    run(["decode-bench", *args, "--contexts", "48,64", "--out", str(out), "--resume"])
    (out / "bench.md").unlink()  # a resume with nothing left to do still writes the table
    run(["decode-bench", *args, "--contexts", "48,64", "--out", str(out), "--resume"])  # nothing left to do
    table = [
        ln for ln in (out / "bench.md").read_text().splitlines() if ln.startswith("| ") and "context_tokens" not in ln
    ]
    assert len(table) == len(read(out / "bench.csv")) > 0
    assert any(ln.startswith("| 48 ") for ln in table) and any(ln.startswith("| 64 ") for ln in table)


def test_a_worker_that_dies_leaves_a_row_and_a_warning(tmp_path):
    """A sharded worker killed mid-cell (here: a plugin mode that exits the process when it stores K/V) gives
    that cell an error row; the rest of its group has no row, and the run says so instead of ending quietly."""
    plugin = tmp_path / "crash.py"
    plugin.write_text(
        "import os\nfrom kvbench.kv.registry import register\nfrom kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass Crash(Int8Cache):\n    name = 'crash'\n    aliases = ()\n\n"
        "    def _store(self, start, k, v):\n        os._exit(9)\n"
    )
    out = tmp_path / "o"
    result = run(["audit", "--model", "dummy:tiny", "--quiet", "--modes", "fp16,crash,int8", "--contexts", "48",
                  "--gen-tokens", "2", "--plugin", str(plugin), "--devices", "cpu,cpu", "--out", str(out)])  # fmt: skip
    rows = read(out / "audit.csv")
    died = [r for r in rows if r["status"] == "error"]
    assert [r["kv_cache_mode"] for r in died] == ["crash"] and "died (exit code 9)" in died[0]["notes"]
    # the rows it finished before it died arrived (a Queue's feeder thread could still hold them at os._exit)
    assert [r["status"] for r in rows if r["kv_cache_mode"] == "fp16"] == ["ok"]
    assert "int8" not in {r["kv_cache_mode"] for r in rows}
    assert "warning: the worker on cpu died in group 48" in result.output
    assert "(one error row says where)" in result.output
    # --resume measures the dead worker's cell again (its row said nothing about the cell) and the rest of
    # its group; the cells that finished are not measured twice. The report keeps the later row.
    plugin.write_text(plugin.read_text().replace("os._exit(9)", "super()._store(start, k, v)"))
    run(["audit", "--model", "dummy:tiny", "--quiet", "--modes", "fp16,crash,int8", "--contexts", "48",
         "--gen-tokens", "2", "--plugin", str(plugin), "--devices", "cpu,cpu", "--out", str(out), "--resume"])  # fmt: skip
    again = read(out / "audit.csv")[len(rows) :]
    assert {r["kv_cache_mode"] for r in again} == {"crash", "int8"}, again
    assert all(r["status"] != "error" for r in again)
    assert not {r["cell"] for r in again} & {r["cell"] for r in rows if r["status"] != "error"}


def test_a_worker_that_dies_holding_its_queue_lock_blocks_no_other(tmp_path):
    """A worker killed while its results queue's feeder thread held the queue's write lock (here taken on
    purpose before os._exit) left that lock taken for good; with one queue for every worker, the others then
    blocked on their next row and the run hung. Each worker now has its own queue: group 64 finishes."""
    plugin, marker = tmp_path / "crashlock.py", tmp_path / "died"
    plugin.write_text(
        "import gc, os, time, multiprocessing.queues\nfrom kvbench.kv.registry import register\n"
        "from kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass CrashLock(Int8Cache):\n    name = 'crashlock'\n    aliases = ()\n\n"
        "    def _store(self, start, k, v):\n"
        "        if start == 0 and k.shape[2] == 48:  # context 48: die holding the lock\n"
        "            for q in gc.get_objects():  # the queues this worker writes to: its results\n"
        "                if isinstance(q, multiprocessing.queues.SimpleQueue) or (\n"
        "                    isinstance(q, multiprocessing.queues.Queue) and q._thread is not None\n"
        "                ):\n"
        "                    q._wlock.acquire()\n"
        f"            open({str(marker)!r}, 'w').close()\n"
        "            os._exit(9)\n"
        "        for _ in range(600):  # context 64 goes on only after that, whichever worker runs it\n"
        f"            if os.path.exists({str(marker)!r}):\n"
        "                break\n"
        "            time.sleep(0.1)\n"
        "        super()._store(start, k, v)\n"
    )
    out = tmp_path / "o"
    args = [sys.executable, "-m", "kvbench", "audit", "--model", "dummy:tiny", "--quiet", "--modes",
            "fp16,crashlock", "--contexts", "48,64", "--gen-tokens", "2", "--plugin", str(plugin), "--devices",
            "cpu,cpu", "--out", str(out)]  # fmt: skip
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired:
        pytest.fail("the sharded run hung after a worker died holding its queue's lock")
    rows = read(out / "audit.csv")
    assert any(r["status"] == "error" and r["context_tokens"] == "48" for r in rows), done.stderr
    assert {r["kv_cache_mode"] for r in rows if r["context_tokens"] == "64" and r["status"] == "ok"} >= {
        "fp16",
        "crashlock",
    }, rows


def test_resume_measures_again_the_cells_of_a_plugin_that_changed(tmp_path):
    """A plugin mode's cells carry its file's hash in their keys: after an edit, `--resume` measures that mode
    again and leaves the built-in modes' cells alone; unchanged, it measures nothing."""
    plugin = tmp_path / "mine.py"
    plugin.write_text(
        "from kvbench.kv.registry import register\nfrom kvbench.kv.int8 import Int8Cache\n\n"
        "@register\nclass Mine(Int8Cache):\n    name = 'mine-int8'\n    aliases = ()\n"
    )
    out = tmp_path / "o"
    args = ["decode-bench", "--model", "dummy:tiny", "--quiet", "--modes", "fp16,mine-int8,int8", "--contexts",
            "48", "--batch", "1", "--gen", "2", "--warmup", "1", "--repeats", "1", "--plugin", str(plugin),
            "--out", str(out)]  # fmt: skip
    from kvbench.kv import registry

    try:
        run(args)
        first = read(out / "bench.csv")
        run([*args, "--resume"])
        assert len(read(out / "bench.csv")) == len(first)  # nothing changed: nothing measured
        plugin.write_text(plugin.read_text() + "    summary = 'edited'\n")
        run([*args, "--resume"])
        again = read(out / "bench.csv")[len(first) :]
        assert [r["kv_cache_mode"] for r in again] == ["mine-int8"], again
    finally:
        registry.MODES.pop("mine-int8", None)
        registry._ALIASES.pop("mine-int8", None)


def test_a_prompt_files_contents_are_in_the_audits_cell_keys(tmp_path):
    """The audit's cell keys hold a hash of the prompt file's contents (not only its path): an edited file's
    cells are measured again on `--resume`."""
    from types import SimpleNamespace

    from kvbench.session import Session

    f = tmp_path / "p.txt"
    f.write_text("one text")
    fake = SimpleNamespace(cfg=SimpleNamespace(prompt_file=str(f)))
    before = Session.prompt_digest(fake)
    f.write_text("another text")
    assert len(before) == 12 and Session.prompt_digest(fake) not in ("", before)
    assert Session.prompt_digest(SimpleNamespace(cfg=SimpleNamespace(prompt_file=None))) == ""


def test_plan_asks_slurm_for_a_gpu_unless_the_sweep_runs_on_cpu(tmp_path):
    for device, gres in (("cpu", False), ("cuda", True)):
        cfg = tmp_path / f"{device}.toml"
        cfg.write_text(f'[common]\nmodel = "dummy:tiny"\ndevice = "{device}"\ncontexts = [48]\n')
        jobs = tmp_path / device / "jobs.txt"
        run(["plan", "audit", "--config", str(cfg), "--out", str(tmp_path / "o"), "--file", str(jobs)])
        assert ("--gres=gpu:1" in jobs.with_suffix(".slurm.sh").read_text()) == gres, device


@pytest.mark.parametrize("answer", [1, 2, 7, 1000, 8816, 17099, 250_000])
@pytest.mark.parametrize("off", [0.5, 0.97, 1.0, 1.03, 3.0])
def test_capacity_search_brackets_to_neighbours(answer, off):
    """decode-bench --capacity: the largest fitting batch and the first failing one are neighbours (a 12-probe
    limit once left 8812 / 8817 with 8813-8816 untried), from a good estimate or a bad one, in few probes."""
    from kvbench.bench import search_largest

    tried = []

    def fits(b):
        tried.append(b)
        return {"b": b} if b <= answer else None

    guess = max(1, int(answer * off))
    lo, best, hi = search_largest(fits, guess)
    assert (lo, hi) == (answer, answer + 1) and best == {"b": answer}
    assert len(tried) == len(set(tried)) and len(tried) <= 40, tried
    if 0.97 <= off <= 1.03 and answer > 1000:
        assert len(tried) <= 2 * max(1, (answer // 64).bit_length()) + 4, tried


def test_capacity_search_when_nothing_fits_or_the_limit_is_hit():
    from kvbench.bench import search_largest

    assert search_largest(lambda b: None, 1000) == (0, None, 1)
    lo, best, hi = search_largest(lambda b: b, 1000, max_probes=3)  # everything fits: a bound, no failure
    assert lo > 1000 and best == lo and hi is None


def test_a_second_sweep_into_a_folder_asks_unless_the_csv_has_no_rows(tmp_path):
    """A CSV with rows: a new run without --resume / --force is refused (it would duplicate cells); a CSV that
    is a header alone (a run stopped before its first row) holds nothing to duplicate: the run goes on."""
    out = tmp_path / "r"
    run(["decode-bench", *BENCH, "--out", str(out)])
    result = run(["decode-bench", *BENCH, "--out", str(out)], code=2)
    n = len(read(out / "bench.csv"))
    assert f"already holds {n} rows: pass --resume" in result.output
    header = (out / "bench.csv").read_text().splitlines(keepends=True)[0]
    (out / "bench.csv").write_text(header)
    (out / "bench.jsonl").write_text("")
    run(["decode-bench", *BENCH, "--out", str(out)])
    assert len(read(out / "bench.csv")) == n


def test_capacity_on_cpu_is_the_kv_that_fits_the_budget_beside_the_weights(tmp_path):
    """--capacity --memory-budget-gb B off the GPU: the largest batch whose KV buffers fit B (the weights are
    already loaded, outside it: they were counted twice), the next one over; the note gives B unrounded."""
    out = tmp_path / "c"
    run(["decode-bench", *TINY, "--contexts", "256", "--gen", "2", "--warmup", "0", "--repeats", "1", "--capacity",
         "--memory-budget-gb", "0.01", "--out", str(out)])  # fmt: skip
    cap = [r for r in read(out / "bench.csv") if "capacity search" in r["notes"]]
    budget = 0.01e9  # kvbench's GB is 10^9 bytes
    for mode in ("fp16", "int8"):
        ok = next(r for r in cap if r["kv_cache_mode"] == mode and r["status"] == "ok")
        over = next(r for r in cap if r["kv_cache_mode"] == mode and r["status"] == "oom")
        per_seq = float(ok["kv_bytes"]) / int(ok["batch"])
        held = per_seq * (256 + 4) / 256  # what the GPU search allocates: 4 slots past the context
        assert int(over["batch"]) == int(ok["batch"]) + 1
        assert held * int(ok["batch"]) <= budget < held * int(over["batch"]), (mode, ok["kv_bytes"], per_seq)
        assert "fits in 0.01 GB (--memory-budget-gb) beside the weights" in ok["notes"]
        assert "its decode is timed on a GPU only (--capacity-speed)" in ok["notes"]  # on by default: not done here


def test_capacity_note_gives_the_budget_that_bound_the_search(tmp_path, monkeypatch):
    """The note names the budget as the user gave it (19.85 was printed "19.9"), and a --memory-budget-gb larger
    than the free memory is not named as the bound: the free memory is, and the note says the flag was more."""
    import kvbench.bench

    free = 0.01e9
    monkeypatch.setattr(kvbench.bench, "available_bytes", lambda device: free)
    for budget, said in (("0.007251", "fits in 0.007251 GB (--memory-budget-gb) beside"),
                         ("0.0125", "fits in 0.01 GB (free; --memory-budget-gb 0.0125 is more) beside")):  # fmt: skip
        out = tmp_path / budget
        run(["decode-bench", *TINY, "--modes", "fp16", "--contexts", "256", "--gen", "2", "--warmup", "0",
             "--repeats", "1", "--capacity", "--memory-budget-gb", budget, "--out", str(out)])  # fmt: skip
        cap = [r for r in read(out / "bench.csv") if "capacity search" in r["notes"]]
        assert cap and all(said in r["notes"] for r in cap), [r["notes"] for r in cap]
        ok = next(r for r in cap if r["status"] == "ok")
        held = float(ok["kv_bytes"]) * (256 + 4) / 256  # 4 slots past the context, as in the test above
        assert held <= min(free, float(budget) * 1e9)


def test_cpu_capacity_prices_the_delegated_hot_window(tmp_path):
    """turbo4-delegated holds a fixed fp16 hot window beside its cold codes: the CPU estimate prices the buffers
    a GPU would allocate (it once priced every token cold and found a larger batch than fits). The yardstick
    is a real allocation of one sequence's caches on the CPU."""
    import torch

    from kvbench.kv import registry

    out = tmp_path / "d"
    run(["decode-bench", "--model", "dummy:tiny", "--quiet", "--modes", "turbo4-delegated", "--contexts", "256",
         "--gen", "2", "--warmup", "0", "--repeats", "1", "--capacity", "--memory-budget-gb", "0.01",
         "--out", str(out)])  # fmt: skip
    cap = {r["status"]: r for r in read(out / "bench.csv") if "capacity search" in r["notes"]
           and r["kv_cache_mode"] == "turbo4-delegated"}  # fmt: skip
    from kvbench.engine.config import PRESETS

    a = PRESETS["tiny"]
    one = registry.build_caches("turbo4-delegated", n_layers=a["num_hidden_layers"], batch=1,
                                n_kv_heads=a["num_key_value_heads"], head_dim=a["head_dim"],
                                dtype=getattr(torch, cap["ok"]["dtype"]), device="cpu", capacity=256 + 4)  # fmt: skip
    per_seq = sum(c.capacity_nbytes() for c in one)
    cold_only = 256 * sum(c.bytes_per_token() for c in one)  # the old price: every token cold, no hot window
    assert per_seq > cold_only * 1.2  # the hot window is a large part of a short context
    assert int(cap["ok"]["batch"]) == int(0.01e9 // per_seq), (cap["ok"]["batch"], per_seq)
    assert int(cap["oom"]["batch"]) == int(cap["ok"]["batch"]) + 1


def test_decode_positions_note_names_the_timed_steps(tmp_path):
    """gen x repeats timed steps after the warmup: `decode positions A..B` holds exactly that many (it once
    ended one past the last); --warmup 0 says its timed steps carry the one-time costs."""
    for warmup in (1, 0):
        out = tmp_path / f"w{warmup}"
        run(["decode-bench", *TINY, "--modes", "int8", "--contexts", "48", "--gen", "2", "--repeats", "2",
             "--warmup", str(warmup), "--out", str(out)])  # fmt: skip
        for r in read(out / "bench.csv"):
            a, b = map(int, re.search(r"decode positions (\d+)\.\.(\d+)", r["notes"]).groups())
            assert (a, b - a + 1) == (48 + warmup, 2 * 2), r["notes"]
            assert ("no warmup (--warmup 0)" in r["notes"]) == (warmup == 0)


def test_kv_bytes_are_what_the_timed_steps_held(tmp_path):
    """turbo4-delegated folds its fp16 body into the cold form at its first decode step: its KV bytes are read
    after the decode (read at the fill they equalled fp16's); a mode of fixed bytes per token is unchanged."""
    out = tmp_path / "d"
    run(["decode-bench", *TINY, "--modes", "int8,turbo4-delegated", "--contexts", "256", "--gen", "2",
         "--warmup", "1", "--repeats", "1", "--out", str(out)])  # fmt: skip
    rows = {r["kv_cache_mode"]: r for r in read(out / "bench.csv")}
    per = {m: float(r["kv_bytes_per_token"]) for m, r in rows.items()}
    assert per["int8"] < per["turbo4-delegated"] < per["fp16"], per
    for r in rows.values():  # the context's bytes: per token x the context's tokens
        assert abs(float(r["kv_bytes"]) - float(r["kv_bytes_per_token"]) * 256) < 256, r


def test_a_bench_cap_never_reached_says_so(tmp_path):
    """--max-kv-size above the positions a cell holds trims nothing: its rows say they are the uncapped decode
    (the audit's --kv-cap-check skips such a cap); a cap that is reached says nothing of the kind."""
    for cap, said in ((1000, True), (48, False)):
        out = tmp_path / str(cap)
        run(["decode-bench", *TINY, "--modes", "int8", "--contexts", "64", "--gen", "2", "--repeats", "1",
             "--warmup", "1", "--max-kv-size", str(cap), "--out", str(out)])  # fmt: skip
        for r in read(out / "bench.csv"):
            assert ("is never reached" in r["notes"]) == said, r["notes"]
            assert not said or "KV cap 1000 is never reached (67 positions)" in r["notes"]


def _capacity_run(tmp_path, monkeypatch, name, extra=()):
    """decode-bench --capacity on dummy:tiny with the GPU-only timing switched on (the CPU search is arithmetic,
    so `times_capacity` is patched; the timing itself is the ordinary CPU cell)."""
    from kvbench.bench import BenchJob

    monkeypatch.setattr(BenchJob, "times_capacity", lambda self: self.cfg.capacity_speed)
    out = tmp_path / name
    run(["decode-bench", *TINY, "--modes", "fp16,int8", "--contexts", "64", "--gen", "2", "--warmup", "1",
         "--repeats", "1", "--capacity", "--memory-budget-gb", "0.0003", *extra, "--out", str(out)])  # fmt: skip
    return out, [r for r in read(out / "bench.csv") if "capacity search" in r["notes"]]


def _stepped_down(cap: list[dict], mode: str, top: int) -> tuple[dict, dict]:
    """A mode's two capacity rows after its largest batch `top` did not run timed: (the timed row at top - 1, the
    search's untimed row at top)."""
    rows = sorted((r for r in cap if r["kv_cache_mode"] == mode and r["status"] == "ok"), key=lambda r: int(r["batch"]))
    assert [int(r["batch"]) for r in rows] == [top - 1, top], rows
    low, high = rows
    assert high["decode_tok_s"] == "" and float(low["decode_tok_s"]) > 0
    return low, high


def test_capacity_speed_times_the_largest_batch(tmp_path, monkeypatch):
    """--capacity-speed (on by default): each mode's largest batch is decoded and timed like a cell (random K/V,
    warm-up, repeats), in the search's own row; the console and the report set it beside fp16's at its batch."""
    out, cap = _capacity_run(tmp_path, monkeypatch, "on")
    ok = {r["kv_cache_mode"]: r for r in cap if r["status"] == "ok"}
    assert set(ok) == {"fp16", "int8"} and int(ok["int8"]["batch"]) > int(ok["fp16"]["batch"]) > 1, ok
    for r in ok.values():
        assert float(r["decode_tok_s"]) > 0 and r["repeats"] == "1" and r["gen_tokens"] == "2", r
        assert f"decode timed at batch {r['batch']}" in r["notes"] and "random K/V" in r["notes"], r["notes"]
        assert float(r["kv_bytes_per_token"]) > 0
        assert "fits in 0.0003 GB (--memory-budget-gb)" in r["notes"]  # (once printed as "0. GB")
    run(["report", str(out)])
    report = (out / "report.md").read_text()
    assert "| Decode tok/s at max | vs fp16 at its max |" in report
    ratio = float(ok["int8"]["decode_tok_s"]) / float(ok["fp16"]["decode_tok_s"])
    assert f"`int8` {ratio:.2f}x that (batch {ok['int8']['batch']})" in report
    # off: the search alone, as before
    _, cap = _capacity_run(tmp_path, monkeypatch, "off", ["--no-capacity-speed"])
    assert cap and all(r["decode_tok_s"] == "" and "decode timed" not in r["notes"] for r in cap), cap


def test_capacity_speed_steps_down_a_batch_that_runs_out_of_memory_timed(tmp_path, monkeypatch):
    """The search decodes two steps on an unfilled cache; a timed run fills it and captures graphs, so the largest
    batch may not run timed: the next smaller one is timed in a row of its own, and the search's row says so."""
    from kvbench.bench import BenchJob

    measure = BenchJob._measure
    tops: dict[str, int] = {}

    def tight(self, mode, ctx, batch, notes, fill=None, capped=True):
        if fill == "random" and batch >= tops.setdefault(mode, batch):  # the first batch timed is the search's
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return measure(self, mode, ctx, batch, notes, fill, capped)

    monkeypatch.setattr(BenchJob, "_measure", tight)
    _, cap = _capacity_run(tmp_path, monkeypatch, "down")
    for mode, top in tops.items():
        low, high = _stepped_down(cap, mode, top)
        assert f"decode timed at batch {top - 1}, the largest that ran timed (batch {top} fit" in high["notes"]
    from kvbench.tables import capacity_lines

    lines = "\n".join(capacity_lines(cap))
    assert f"decodes {float(low['decode_tok_s']):.1f} tok/s at batch {top - 1}" in lines, lines


def test_capacity_speed_steps_down_a_batch_whose_timed_peak_passes_the_budget(tmp_path, monkeypatch):
    """On a GPU the timed decode's measured peak is held to --memory-budget-gb as the search's is: a largest batch
    whose timed run went past the budget gives way to the next smaller one, and the row says by how much (its peak
    beside the weights, against the budget as given). The GPU peak is faked here (a CPU run's peak is the process's
    RSS, which is not held to the budget); on an H100 the branch stepped int8 from 9 to 8 and turbo4 from 13 to 12
    under --memory-budget-gb 19.85 (results/2026-12-07b-gpu/budget)."""
    from kvbench.bench import BenchJob

    measure = BenchJob._measure
    tops: dict[str, int] = {}
    big = 5.0  # GB: far past the 0.0003 GB budget beside the tiny model's weights

    def heavy(self, mode, ctx, batch, notes, fill=None, capped=True):
        out = measure(self, mode, ctx, batch, notes, fill, capped)
        if fill == "random":  # a timed run: its peak as the GPU would report it
            over = batch >= tops.setdefault(mode, batch)
            within = round(self.s.lm.weight_bytes() / 1e9, 4)  # the weights alone: inside any budget
            out.update(peak_mem_gb=big if over else within, peak_mem_kind="cuda_max_allocated")
        return out

    monkeypatch.setattr(BenchJob, "_measure", heavy)
    _, cap = _capacity_run(tmp_path, monkeypatch, "budget")
    assert set(tops) == {"fp16", "int8"}
    for mode, top in tops.items():
        low, high = _stepped_down(cap, mode, top)
        beside = big - int(high["weight_bytes"]) / 1e9
        said = f"(batch {top}: peak {big:.4g} GB, {beside:.4g} GB beside the weights, past the 0.0003 GB"
        assert said + " (--memory-budget-gb) budget)" in high["notes"], high["notes"]
        assert float(low["peak_mem_gb"]) < big and f"peak is the timed decode's {low['peak_mem_gb']} GB" in low["notes"]


def test_capacity_speed_holds_the_whole_context_and_keeps_the_searchs_peak(tmp_path, monkeypatch):
    """The timed decode at capacity holds the context the search sized (a --max-kv-size of the benchmark cells
    once capped it, unlabelled: a 32-token decode read as 64); the row's peak stays the search's, comparable
    across modes, with the timed run's peak in its notes."""
    _, cap = _capacity_run(tmp_path, monkeypatch, "capped", ["--max-kv-size", "32"])
    ok = [r for r in cap if r["status"] == "ok"]
    assert {r["kv_cache_mode"] for r in ok} == {"fp16", "int8"}
    for r in ok:
        assert float(r["decode_tok_s"]) > 0 and r["max_kv_size"] == "", r
        per_token, batch = float(r["kv_bytes_per_token"]), int(r["batch"])
        assert abs(float(r["kv_bytes"]) - per_token * batch * 64) < batch, (r["kv_bytes"], per_token, batch)
        assert r["peak_mem_kind"] == "cpu_estimate" and "timed decode's peak" in r["notes"], r


def test_capacity_speed_says_why_no_batch_ran_timed(tmp_path, monkeypatch):
    """Every batch tried runs out of memory timed: the row, the console line and the report say the decode was
    not timed and why (the console once showed only the search's batches)."""
    from kvbench.bench import BenchJob
    from kvbench.tables import capacity_lines

    measure = BenchJob._measure

    def never(self, mode, ctx, batch, notes, fill=None, capped=True):
        if fill == "random" and mode == "fp16":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return measure(self, mode, ctx, batch, notes, fill, capped)

    monkeypatch.setattr(BenchJob, "_measure", never)
    out, cap = _capacity_run(tmp_path, monkeypatch, "never")
    fp16 = next(r for r in cap if r["kv_cache_mode"] == "fp16" and r["status"] == "ok")
    top = int(fp16["batch"])
    low = max(1, top - 2)
    tried = "; ".join(f"batch {b}: out of memory" for b in range(top, low - 1, -1))
    where = f"batch {top}" if low == top else f"batches {low}-{top}"
    assert fp16["decode_tok_s"] == "" and f"decode not timed: {where} did not run timed ({tried})" in fp16["notes"]
    line = next(s for s in capacity_lines(cap) if " fp16 " in s)
    assert "decode not timed" in line, line
    int8 = next(s for s in capacity_lines(cap) if " int8 " in s)
    assert "tok/s" in int8 and "x fp16" not in int8, int8  # nothing to divide by
    run(["report", str(out)])
    table = (out / "report.md").read_text()
    assert re.search(r"\| `fp16` \| 64 \|[^\n]*\| — \| — \|", table), table


def test_report_merges_a_timed_and_an_untimed_capacity_search(tmp_path, monkeypatch):
    """The same search run untimed and timed (merged folders, or a resume that adds the timing) is one cell:
    the report keeps the later row, once, and counts the one it dropped per mode."""
    off, _ = _capacity_run(tmp_path, monkeypatch, "untimed", ["--no-capacity-speed"])
    on, cap = _capacity_run(tmp_path, monkeypatch, "timed")
    merged = tmp_path / "merged"
    run(["report", str(off), str(on), "--out", str(merged / "report.md")])
    report = (merged / "report.md").read_text()
    for mode in ("fp16", "int8"):
        lines = [s for s in report.splitlines() if s.startswith(f"| `{mode}` | 64 |")]
        capacity = [s for s in lines if "(oom)" in s or "(over budget" in s]
        assert len(capacity) == 1, lines
        timed = next(r for r in cap if r["kv_cache_mode"] == mode and r["status"] == "ok")
        assert f"| {float(timed['decode_tok_s']):.1f} |" in capacity[0], capacity
    # each mode's fitting and failing rows of the earlier run (the timed one once kept both fitting rows)
    assert "4 capacity rows dropped as duplicates" in report


def test_cpu_capacity_prices_per_token_a_cache_that_cannot_be_built_without_storage(tmp_path, monkeypatch):
    """A plugin's cache may need real storage to be built (meta tensors refuse data access): the CPU estimate
    then prices its tokens one by one, as before, instead of failing the search."""
    from kvbench.session import Session

    caches = Session.caches

    def no_meta(self, mode, **kw):
        if kw.get("device") == "meta":
            raise NotImplementedError("Cannot copy out of meta tensor; no data!")
        return caches(self, mode, **kw)

    monkeypatch.setattr(Session, "caches", no_meta)
    out = tmp_path / "p"
    run(["decode-bench", *TINY, "--modes", "int8", "--contexts", "256", "--gen", "2", "--warmup", "0", "--repeats",
         "1", "--capacity", "--memory-budget-gb", "0.01", "--out", str(out)])  # fmt: skip
    ok = next(r for r in read(out / "bench.csv") if "capacity search" in r["notes"] and r["status"] == "ok"
              and r["kv_cache_mode"] == "int8")  # fmt: skip
    per_seq = float(ok["kv_bytes_per_token"]) * 256
    assert int(ok["batch"]) == int(0.01e9 // per_seq), (ok["batch"], per_seq)


def test_the_csv_keeps_the_digits_a_row_was_rounded_to(tmp_path):
    """A CSV cell holds what its JSONL twin holds (3302.453 tok/s, not 3302.45), without float noise (0.1 + 0.2)."""
    from kvbench.results import ResultsWriter

    w = ResultsWriter(tmp_path, "t", ["speed", "kl", "noise", "gone", "flag"])
    w.write({"speed": 3302.453, "kl": 0.000674959, "noise": 0.1 + 0.2, "gone": float("nan"), "flag": True})
    with open(w.csv_path, newline="") as f:
        [row] = list(csv.DictReader(f))
    assert row == {"speed": "3302.453", "kl": "0.000674959", "noise": "0.3", "gone": "", "flag": "true"}

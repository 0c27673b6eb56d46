"""Config files and command-line values -> a validated config: spellings, duplicates, unreadable files,
and error messages that say where a bad value came from."""

import re
import sys

import pytest

from kvbench.cli import main
from kvbench.config import build_config
from kvbench.errors import KvbenchError


def one_line_error(monkeypatch, capsys, argv) -> str:
    """Run `kvbench argv`; it must fail with exit 2 and a single `error: ...` line, no traceback."""
    monkeypatch.setattr(sys, "argv", ["kvbench", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def write(path, data: bytes | str):
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


# ---------------------------------------------------------------- unreadable files
def test_config_file_not_utf8_is_one_line(tmp_path, monkeypatch, capsys):
    cfg = write(tmp_path / "c.toml", b"\xff\xfe[\x00c\x00")  # UTF-16, as some editors save
    out = tmp_path / "o"
    err = one_line_error(monkeypatch, capsys, ["audit", "--config", cfg, "--out", str(out)])
    assert cfg in err and "not UTF-8" in err and "0xff" in err, err
    assert not out.exists()


def test_config_file_that_is_a_folder_says_so(tmp_path, monkeypatch, capsys):
    err = one_line_error(monkeypatch, capsys, ["audit", "--config", str(tmp_path)])
    assert "is a directory" in err and "not found" not in err, err


@pytest.mark.parametrize("kind", ["folder", "binary", "missing"])
def test_prompt_file_unreadable_is_one_line_before_the_model_loads(kind, tmp_path, monkeypatch, capsys):
    import kvbench.session

    def no_model(*a, **k):
        raise AssertionError("the model loaded before --prompt-file was checked")

    monkeypatch.setattr(kvbench.session, "load_model", no_model)
    path = {"folder": tmp_path, "missing": tmp_path / "nope.txt"}.get(kind)
    path = path or write(tmp_path / "p.txt", b"\xff\xfe\x00t\x00e\x00x\x00t")
    out = tmp_path / "o"
    argv = ["audit", "--model", "dummy:tiny", "--contexts", "64", "--prompt-file", str(path), "--out", str(out)]
    err = one_line_error(monkeypatch, capsys, argv)
    assert err.startswith("error: --prompt-file: ") and str(path) in err, err
    assert {"folder": "is a directory", "binary": "is not UTF-8 text", "missing": "not found"}[kind] in err, err
    assert not out.exists()


# ---------------------------------------------------------- option names as keys
@pytest.mark.parametrize(
    "text, field, value",
    [
        ("kv_cap_check = [256]", "kv_caps", [256]),
        ("kv-cap-check = [256]", "kv_caps", [256]),
        ("kv_caps = [256]", "kv_caps", [256]),
        ('format = ["csv", "md"]', "formats", ["csv", "md"]),
        ('formats = ["csv", "md"]', "formats", ["csv", "md"]),
        ("no_cuda_graphs = true", "cuda_graphs", False),
        ("no-cuda-graphs = false", "cuda_graphs", True),
        ("cuda_graphs = false", "cuda_graphs", False),
        ("no_pdl = true", "pdl", False),
        ("pdl = false", "pdl", False),
        ("no_gemv_kernel = true", "gemv_kernel", False),
        ("gemv_kernel = false", "gemv_kernel", False),
    ],
)
def test_config_keys_take_the_option_names(tmp_path, text, field, value):
    """README: keys are the long option names with `_`; the field names keep working too."""
    cfg = build_config("audit", write(tmp_path / "c.toml", f"[audit]\n{text}\n"), {})
    assert getattr(cfg, field) == value


@pytest.mark.parametrize(
    "text",
    [
        "[audit]\nkv_cap_check = [256]\nkv_caps = [512]\n",
        "[common]\nno_pdl = true\npdl = true\n",
        '[common]\nformat = ["csv"]\nformats = ["csv"]\n',
        "[audit]\ngen_tokens = 3\ngen-tokens = 4\n",
    ],
)
def test_two_spellings_of_one_option_is_an_error(tmp_path, text):
    with pytest.raises(KvbenchError, match=r"c\.toml \[(common|audit)\]: '.+' and '.+' set the same option"):
        build_config("audit", write(tmp_path / "c.toml", text), {})


def test_gen_and_gen_tokens_name_one_option_in_both_tables(tmp_path):
    """Both commands take --gen and --gen-tokens; both tables take either key for the job's own field."""
    path = write(tmp_path / "c.toml", "[decode-bench]\ngen_tokens = 3\n[audit]\ngen = 5\n")
    assert build_config("decode-bench", path, {}).gen == 3
    assert build_config("audit", path, {}).gen_tokens == 5
    with pytest.raises(KvbenchError, match="'gen' and 'gen_tokens' set the same option"):
        build_config("audit", write(tmp_path / "d.toml", "[audit]\ngen = 5\ngen_tokens = 6\n"), {})


def test_alias_keeps_type_check_and_job_tables(tmp_path):
    with pytest.raises(KvbenchError, match=r"key 'no_pdl' must be bool"):
        build_config("audit", write(tmp_path / "c.toml", '[common]\nno_pdl = "yes"\n'), {})
    # an audit-only option in [decode-bench] is unknown there, whichever spelling
    with pytest.raises(KvbenchError, match=r"unknown key 'kv_cap_check' in \[decode-bench\]"):
        build_config("decode-bench", write(tmp_path / "d.toml", "[decode-bench]\nkv_cap_check = [256]\n"), {})


def test_job_table_overrides_common_whatever_the_order(tmp_path):
    text = "[audit]\ngen_tokens = 3\nno_pdl = true\n[common]\npdl = true\n"
    cfg = build_config("audit", write(tmp_path / "c.toml", text), {})
    assert cfg.gen_tokens == 3 and cfg.pdl is False


# ------------------------------------------------------------------- duplicates
def test_duplicate_list_values_run_once_from_the_command_line():
    from kvbench.cli import _common
    from kvbench.config import parse_float_list, parse_int_list

    cli = _common(modes="fp16", contexts="256,0.25k,512,256")
    cli["batch"] = parse_int_list("1,1,2,1", "batch")
    cfg = build_config("decode-bench", None, cli)
    assert cfg.contexts == [256, 512] and cfg.batch == [1, 2]
    cli = _common(modes="fp16", contexts="64")
    cli["kv_caps"] = parse_int_list("32,32", "kv-cap-check")
    cli["niah_depths"] = parse_float_list("0.5,0.50,0", "niah-depths")
    cli["niah"] = True
    cfg = build_config("audit", None, cli)
    assert cfg.kv_caps == [32] and cfg.niah_depths == [0.5, 0.0]


def test_duplicate_list_values_run_once_from_a_config_file(tmp_path):
    text = "[common]\ncontexts = [2048, 512, 2048]\n[decode-bench]\nbatch = [4, 1, 4, 1]\n"
    text += "[audit]\nkv_cap_check = [256, 256]\nniah = true\nniah_depths = [0, 0.0, 1]\n"
    path = write(tmp_path / "c.toml", text)
    bench = build_config("decode-bench", path, {})
    assert bench.contexts == [2048, 512] and bench.batch == [4, 1]
    audit = build_config("audit", path, {})
    assert audit.kv_caps == [256] and audit.niah_depths == [0.0, 1.0]


# ------------------------------------------------------------ where a value came from
@pytest.mark.parametrize(
    "args, message",
    [
        (["--gen-tokens", "1"], r"^error: --gen-tokens: must be at least 2$"),
        (["--kv-cap-check", "2"], r"^error: --kv-cap-check: cap 2 must exceed --keep \(4\)$"),
        (["--format", "json"], r"^error: --format: must include csv"),
        (["--ppl-chunk", "0"], r"^error: --ppl-chunk: must be positive$"),
        (["--niah-depths", "2"], r"^error: --niah-depths: depth 2.0 is outside \[0, 1\]$"),
    ],
)
def test_command_line_errors_name_the_option(args, message, tmp_path, monkeypatch, capsys):
    argv = ["audit", "--model", "dummy:tiny", "--contexts", "64", *args, "--out", str(tmp_path / "o")]
    err = one_line_error(monkeypatch, capsys, argv)
    assert re.search(message, err), err
    assert "command line" not in err


def test_errors_name_the_file_and_key_or_the_option(tmp_path, monkeypatch, capsys):
    """With a config file, a bad value from the file names file and key as written; a bad value from the
    command line names the option, not the file."""
    cfg = write(tmp_path / "c.toml", '[common]\nmodel = "dummy:tiny"\nformat = ["json"]\n[audit]\ngen-tokens = 1\n')
    with pytest.raises(KvbenchError, match=r"c\.toml: format: must include csv"):
        build_config("audit", cfg, {})
    with pytest.raises(KvbenchError, match=r"c\.toml: gen-tokens: must be at least 2"):
        build_config("audit", cfg, {"formats": ["csv"]})
    argv = ["audit", "--config", cfg, "--format", "csv", "--gen-tokens", "0", "--out", str(tmp_path / "o")]
    assert one_line_error(monkeypatch, capsys, argv) == "error: --gen-tokens: must be at least 2"
    cfg = write(tmp_path / "d.toml", "[decode-bench]\nrepeats = 0\n")
    with pytest.raises(KvbenchError, match=r"^.*d\.toml: repeats: must be >= 1$"):
        build_config("decode-bench", cfg, {})


def test_common_holds_either_jobs_keys_and_a_key_outside_a_table_says_so(tmp_path):
    """One sweep file for both jobs: [common] may hold a key only one of them knows (the other skips it);
    a key above the first table is named as such, not as an unknown table; a typo in [common] still fails."""
    text = '[common]\nmodel = "dummy:tiny"\nbatch = [1, 2]\nppl = true\n'
    path = write(tmp_path / "c.toml", text)
    assert build_config("audit", path, {}).ppl is True
    assert build_config("decode-bench", path, {}).batch == [1, 2]
    with pytest.raises(KvbenchError, match=r"'model' is a key outside any table; put it under \[common\]"):
        build_config("audit", write(tmp_path / "top.toml", 'model = "dummy:tiny"\n[common]\nppl = true\n'), {})
    with pytest.raises(KvbenchError, match=r"unknown key 'bacth' in \[common\] \(known: .*\bgen, gen_tokens\b"):
        build_config("audit", write(tmp_path / "typo.toml", "[common]\nbacth = [1]\n"), {})  # both spellings listed
    with pytest.raises(KvbenchError, match=r"unknown key 'batch' in \[audit\]"):  # the job's own table: its keys
        build_config("audit", write(tmp_path / "job.toml", "[audit]\nbatch = [1]\n"), {})


def test_files_a_config_names_are_read_beside_it(tmp_path, monkeypatch):
    """`plugin` and `prompt_file` in a config are relative to the config's folder (where its author put
    them), whatever folder the command runs from; absolute paths stay as written."""
    sub = tmp_path / "sweep"
    sub.mkdir()
    (sub / "text.txt").write_text("Some words. " * 50)
    path = write(sub / "c.toml", '[common]\nmodel = "dummy:tiny"\n[audit]\nprompt_file = "text.txt"\n')
    monkeypatch.chdir(tmp_path)
    assert build_config("audit", str(path), {}).prompt_file == str(sub / "text.txt")
    absolute = write(sub / "abs.toml", f'[audit]\nprompt_file = "{sub / "text.txt"}"\n')
    assert build_config("audit", str(absolute), {}).prompt_file == str(sub / "text.txt")


def test_list_keys_take_the_command_lines_spellings(tmp_path):
    """`contexts = ["2k", 8192]`, `"2k,32k"`, `modes = "fp16,int8"`: what --contexts / --modes take, a file takes."""
    text = '[common]\ncontexts = ["2k", 8192, "1.5k,32K"]\nmodes = "fp16,int8"\nplugin = "p.py"\n'
    text += '[decode-bench]\nbatch = "1,16"\n'
    (tmp_path / "p.py").write_text("")
    cfg = build_config("decode-bench", write(tmp_path / "c.toml", text), {})
    assert cfg.contexts == [2048, 8192, 1536, 32768]
    assert cfg.modes == ["fp16", "int8"] and cfg.batch == [1, 16]
    assert cfg.plugin == [str(tmp_path / "p.py")]  # one file, not split on commas
    cfg = build_config("decode-bench", write(tmp_path / "one.toml", "[common]\ncontexts = 64\nbatch = 2\n"), {})
    assert cfg.contexts == [64] and cfg.batch == [2]  # as --contexts 64 --batch 2
    cfg = build_config("audit", write(tmp_path / "a.toml", '[audit]\nniah = true\nniah_depths = "0,0.5"\n'), {})
    assert cfg.niah_depths == [0.0, 0.5]
    for bad, why in [
        ('"2q"', "'2q' is not a whole number"),
        ('["1.5"]', "'1.5' is not a whole number"),
        ('"0"', "values must be positive"),
        ("[true]", "must be list\\[int\\]"),
    ]:
        with pytest.raises(KvbenchError, match=rf"b\.toml \[common\]: key 'contexts':? {why}"):
            build_config("audit", write(tmp_path / "b.toml", f"[common]\ncontexts = {bad}\n"), {})


def test_a_config_file_is_checked_whole(tmp_path):
    """`kvbench audit --config f` refuses a bad [decode-bench] table (or a [common] key only decode-bench
    reads) before any work, saying which job reads it; a command-line-dependent check is that job's own."""
    for text, why in [
        ('[audit]\ngen = 2\n[decode-bench]\nwarmup = "x"\n', r"\[decode-bench\]: key 'warmup' must be int"),
        ('[common]\nbatch = "abc"\n', r"key 'batch': 'abc' is not a whole number"),
        ("[common]\nbatch = [0]\n", "batch sizes must be positive"),
        ('[decode-bench]\nmodes = "fp16,int9"\n', "int9"),
    ]:
        with pytest.raises(KvbenchError, match=why + r".*\(read by `kvbench decode-bench`"):
            build_config("audit", write(tmp_path / "c.toml", text), {})
    with pytest.raises(KvbenchError, match=r"gen_tokens: must be at least 2 \(read by `kvbench audit`"):
        build_config("decode-bench", write(tmp_path / "d.toml", "[audit]\ngen_tokens = 1\n"), {})
    # ppl_chunk shapes --ppl, which the audit's command line may add: decode-bench does not refuse it
    assert build_config("decode-bench", write(tmp_path / "e.toml", "[audit]\nppl_chunk = 64\n"), {}).gen == 128


def test_a_cache_that_cannot_fit_fails_before_the_weights_load(monkeypatch, capsys, tmp_path):
    """A context x batch whose KV cache cannot fit is one line from the model's shapes (a preset, a folder's
    config.json), before the weights are built (for an 8B dummy on CPU, minutes of work)."""
    from kvbench import session  # imported before the patch: importing it after would bind (and keep) the stub
    from kvbench.engine import weights

    def no_load(*a, **k):
        raise AssertionError("the weights loaded before the memory check")

    monkeypatch.setattr(session, "load_model", no_load)
    monkeypatch.setattr(weights, "load_model", no_load)
    out = tmp_path / "o"
    argv = ["kvbench", "decode-bench", "--model", "dummy:llama-3.1-8b", "--modes", "fp16", "--contexts", "32k",
            "--batch", "1000", "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and not out.exists(), err
    assert re.fullmatch(r"error: context 32768 x batch 1000 needs ~\d+\.\d GB of KV cache; only .* free on cpu", err)


def test_a_switch_turned_off_over_a_file_makes_its_option_moot(tmp_path):
    """`kvbench plan` turns --capacity off in most jobs of a file that sets capacity and its budget: those jobs
    run (the budget is moot there); a budget with no --capacity anywhere is still refused."""
    path = write(tmp_path / "c.toml", "[decode-bench]\ncapacity = true\nmemory_budget_gb = 0.05\n")
    assert build_config("decode-bench", path, {"capacity": False}).capacity is False
    plain = write(tmp_path / "d.toml", "[decode-bench]\nmemory_budget_gb = 0.05\n")
    with pytest.raises(KvbenchError, match="only bounds the --capacity search"):
        build_config("decode-bench", plain, {})
    with pytest.raises(KvbenchError, match="only bounds the --capacity search"):  # both on the command line
        build_config("decode-bench", None, {"capacity": False, "memory_budget_gb": 0.05})


def test_capacity_speed_needs_the_capacity_search_unless_turned_off(tmp_path):
    """--capacity-speed without --capacity would time nothing: refused; --no-capacity-speed asks for nothing, so
    it passes on its own (a file may set it for a job that leaves the search off)."""
    with pytest.raises(KvbenchError, match="--capacity-speed: only times the --capacity search's largest batch"):
        build_config("decode-bench", None, {"capacity_speed": True})
    assert build_config("decode-bench", None, {"capacity_speed": False}).capacity_speed is False
    path = write(tmp_path / "c.toml", "[decode-bench]\ncapacity_speed = false\n")
    assert build_config("decode-bench", path, {}).capacity_speed is False
    assert build_config("decode-bench", None, {"capacity": True}).capacity_speed is True  # the default

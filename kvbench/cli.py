"""The command line: parse options, build a config, run a job.

Every user-facing failure is one line on stderr and a non-zero exit; no traceback.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from kvbench import config as config_mod
from kvbench.errors import KvbenchError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="rich",
    help=(
        "Audit and benchmark quantized KV caches.\n\n"
        "[bold]kvbench audit[/bold]          which modes run, and is their output still right?\n"
        "[bold]kvbench decode-bench[/bold]   decode speed and memory: what each mode costs or buys\n"
        "[bold]kvbench report[/bold]         results CSVs -> report.md with tables and plots\n"
        "[bold]kvbench plan[/bold]           split a sweep into commands for a cluster scheduler\n"
        "[bold]kvbench modes[/bold]          list the KV modes and their aliases\n\n"
        "Comma lists sweep an axis (--modes fp16,int8 --contexts 2k,8k). With no --model the "
        "embedded SmolLM2-135M-Instruct runs."
    ),
)


def _version(value: bool) -> None:
    if value:
        import kvbench

        typer.echo(f"kvbench {kvbench.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Audit and benchmark quantized KV caches."""


# ----------------------------------------------------------------- shared options
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Hugging Face folder, .gguf file, or dummy:<preset> (random weights: llama-3.1-8b, qwen2.5-7b, "
        "smollm2-135m, tiny, ...). Default: the embedded SmolLM2-135M-Instruct.",
        show_default=False,
    ),
]
Modes = Annotated[
    str | None,
    typer.Option(
        "--modes",
        help="Comma list of KV modes or 'all' (fp16 always runs as the reference). \\[default: all]",
        show_default=False,
    ),
]
Contexts = Annotated[
    str | None,
    typer.Option(
        "--contexts",
        "-c",
        help="Comma list of context lengths in tokens; 'k' = 1024 (2k,8k,32k). "
        "\\[default: 2k,8k,32k on GPU; 2k,8k on CPU]",
        show_default=False,
    ),
]
Out = Annotated[
    str | None,
    typer.Option("--out", "-o", help="Results folder. \\[default: results/<date>-<device>]", show_default=False),
]
ConfigFile = Annotated[
    list[str] | None,  # a list only to refuse a second --config (click keeps the last in silence)
    typer.Option(
        "--config",
        help="TOML file describing the sweep; command-line options override it.",
        show_default=False,
        metavar="FILE",
    ),
]


def _one_config(config: list[str] | None) -> str | None:
    if config and len(config) > 1:
        raise KvbenchError(
            f"--config given {len(config)} times: one file per run (its [common] table holds shared keys)"
        )
    return config[0] if config else None


Device = Annotated[str | None, typer.Option(help="cpu, cuda, cuda:N or auto. \\[default: auto]", show_default=False)]
Dtype = Annotated[
    str | None,
    typer.Option(
        help="Compute dtype: auto (bfloat16), bfloat16, float16, float32. \\[default: auto]", show_default=False
    ),
]
Kernel = Annotated[
    str | None,
    typer.Option(
        help="Attention path: auto (Triton on GPU, reference on CPU), triton, reference. \\[default: auto]",
        show_default=False,
    ),
]
PrefillChunk = Annotated[
    int | None, typer.Option(help="Prefill chunk in tokens; 0 = one pass. \\[default: 2048]", show_default=False)
]
BoundaryV = Annotated[
    int | None,
    typer.Option(
        help="Turbo modes: keep the first and last N layers at fp16 (0 disables). \\[default: 2]",
        show_default=False,
    ),
]
SparseV = Annotated[
    float | None,
    typer.Option(
        "--sparse-v-threshold",
        help="Sparse V: decode steps of every mode but fp16 skip V for the tokens whose softmax weight is below "
        "this (K is always used; nothing is renormalised); e.g. 1e-6. 0 = off. \\[default: 0]",
        show_default=False,
    ),
]
NoFallback = Annotated[
    bool | None,
    typer.Option(
        "--no-fallback/--fallback",
        help="Run a mode even where its model-family allowlist says no (shows why it is not allowed).",
        show_default=False,
    ),
]
Plugin = Annotated[
    list[str] | None,
    typer.Option(help="Python file that registers extra KV modes (repeatable).", show_default=False, metavar="FILE"),
]
MaxKv = Annotated[
    int | None,
    typer.Option(
        help="Cap the live KV at N tokens: a rotating window that keeps --keep sink tokens.", show_default=False
    ),
]
Keep = Annotated[int | None, typer.Option(help="Sink tokens kept by --max-kv-size. \\[default: 4]", show_default=False)]
Yarn = Annotated[
    str | None,
    typer.Option(
        help="RoPE past the trained context: auto (YaRN, smallest power-of-two factor), off, or a factor >= 1. "
        "\\[default: auto]",
        show_default=False,
    ),
]
Formats = Annotated[
    str | None,
    typer.Option(
        "--format",
        help="Output files, a comma list that includes csv (--resume and report read it), plus json and/or md "
        "beside it, e.g. csv,md. \\[default: csv,json]",
        show_default=False,
    ),
]
NoGraphs = Annotated[
    bool | None,
    typer.Option(
        "--no-cuda-graphs/--cuda-graphs",
        help="GPU: decode eagerly instead of replaying a CUDA graph.",
        show_default=False,
    ),
]
NoPdl = Annotated[
    bool | None,
    typer.Option(
        "--no-pdl/--pdl",
        help="GPU: launch the decode kernels one after another, not with programmatic dependent launch (sm_90+).",
        show_default=False,
    ),
]
NoGemv = Annotated[
    bool | None,
    typer.Option(
        "--no-gemv-kernel/--gemv-kernel",
        help="GPU: run the decode step's projections through cuBLAS (torch), not kvbench's GEMV kernel.",
        show_default=False,
    ),
]
Quiet = Annotated[
    bool | None, typer.Option("--quiet/--no-quiet", "-q", help="No progress bars or tables.", show_default=False)
]
Resume = Annotated[
    bool | None,
    typer.Option("--resume/--no-resume", help="Skip cells already in the results folder.", show_default=False),
]
Devices = Annotated[
    str | None,
    typer.Option(
        help="Shard the sweep over devices, one worker process each: 0,1 / cuda:0,cuda:1 / all (cpu,cpu for CPU workers).",
        show_default=False,
    ),
]
Force = Annotated[
    bool | None,
    typer.Option(
        "--force/--no-force",
        help="Write into a folder that already holds results: without --resume, append a second sweep; with "
        "--resume, also accept results from another kvbench version or model hash.",
        show_default=False,
    ),
]


def _common(**kw) -> dict:
    out = dict(kw)
    out["modes"] = config_mod.parse_list(kw.get("modes"))
    out["contexts"] = config_mod.parse_int_list(kw.get("contexts"), "contexts")
    out["formats"] = config_mod.parse_list(kw.pop("formats", None))
    if out.get("plugin") == []:
        out["plugin"] = None
    for flag, field in (("no_cuda_graphs", "cuda_graphs"), ("no_pdl", "pdl"), ("no_gemv_kernel", "gemv_kernel")):
        v = out.pop(flag, None)  # None: not given (the config file's value or the default stands)
        if v is not None:
            out[field] = not v
    return out


def _reflow(doc: str) -> str:
    """A docstring's prose paragraphs as single lines, so the terminal (not the source's line length) wraps them.

    Typer's rich help keeps single line breaks; a paragraph wrapped at 100 columns in the source then breaks
    twice in an 80-column terminal. Paragraphs whose lines are indented (examples) stay as written."""
    import inspect

    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(
        p if all(line.startswith("  ") for line in p.splitlines()) else " ".join(p.split("\n")) for p in paragraphs
    )


def friendly(fn):
    """Bad input is one line on stderr and exit code 2, never a traceback. Also reflows the help (`_reflow`)."""
    import functools

    fn.__doc__ = _reflow(fn.__doc__ or "")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KvbenchError as exc:  # one line, whatever a library's message under it holds
            typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:  # before the sweep started (model load) or after it: say so, exit 130
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    sys.exit(code)


def _console(quiet: bool):
    from rich.console import Console

    return Console(stderr=True, quiet=quiet)


def _job_files(job: str):
    from kvbench.results import AUDIT_COLUMNS, BENCH_COLUMNS

    return ("audit", AUDIT_COLUMNS) if job == "audit" else ("bench", BENCH_COLUMNS)


def _open_sweep(writer, cfg, version: str, model_hash: str):
    from kvbench.sweep import FileSink, Sweep, check_fresh, done_cells

    check_fresh(writer.csv_path, cfg.resume, cfg.force)
    for note in writer.repair_tail():  # only reached with --resume or --force on an existing file
        typer.echo(f"warning: {note}", err=True)  # even with --quiet: it changed the user's file
    writer.check_header()
    done = done_cells(writer.csv_path, version=version, model_hash=model_hash, force=cfg.force) if cfg.resume else set()
    return Sweep(FileSink(writer), done=done)


def _open_results(job: str, cfg, out: Path, model_hash: str):
    """(writer, sweep) of a results folder, opened without a model (a sharded run's main process; a resume)."""
    import kvbench
    from kvbench import results

    results.check_out_dir(out)
    writer = results.ResultsWriter(out, *_job_files(job), formats=cfg.formats)
    return writer, _open_sweep(writer, cfg, kvbench.__version__, model_hash)


def _keys_by_group(job: str, cfg, device: str, model_hash: str) -> dict:
    """Each group of the sweep (`cfg.contexts` set) -> its cells' keys, built without a model."""
    from kvbench.session import Session
    from kvbench.sweep import Sweep, job_class

    keyer = job_class(job)(Session.keys_only(cfg, job, device, model_hash), None, Sweep(None))
    return {g: keyer.group_keys(g) for g in keyer.groups()}


def _run(job: str, cfg) -> None:
    from kvbench.runtime import Progress
    from kvbench.session import Session, at_prompt_length
    from kvbench.sweep import parse_devices

    console = _console(cfg.quiet)
    t0 = time.time()
    devices = parse_devices(cfg.devices)
    _check_compare_kernels(cfg, devices)
    if len(devices) > 1 and at_prompt_length(job, cfg):  # one group, nothing to shard
        console.print(
            f"[dim]one context (the prompt file's own length): the audit runs on {devices[0]} alone "
            "(pass --contexts to shard several over the devices)[/dim]"
        )
        devices = devices[:1]
    if len(devices) > 1:
        return _run_sharded(job, cfg, devices, console, t0)
    if devices:
        cfg.device = devices[0]
    resumed = _resume_before_the_model(job, cfg)
    if resumed and resumed[2]:
        console.print(f"every cell is already in {resumed[0].csv_path}: nothing to run")
        _write_md(job, cfg, resumed[0])  # `--format md` still gets the table of every row
        return
    session = Session.open(cfg, job, log=lambda m: console.print(m))
    if resumed:
        writer, sweep, _ = resumed
    else:
        writer = session.writer(*_job_files(job))
        sweep = _open_sweep(writer, cfg, session.base_row["kvbench_version"], session.lm.weights_hash)
    if sweep.done:
        console.print(f"resuming: {len(sweep.done)} finished cells in {writer.csv_path} are skipped")
    if job == "audit":
        from kvbench.audit import AuditJob as Job
    else:
        from kvbench.bench import BenchJob as Job
    runner = Job(session, None, sweep)
    if hasattr(runner, "preflight"):  # inputs that cannot work: one line before any bar or cell
        runner.preflight()
    for note in session.notes:  # after the checks above, so that an error is the only line
        console.print(f"[dim]{note}[/dim]")
    try:
        with Progress(0, cfg.quiet, console) as progress:
            runner.p = progress
            progress.set_total(runner.n_cells())
            rows = runner.run()
    except KeyboardInterrupt:
        session.record_run(time.time() - t0)
        _write_md(job, cfg, writer)
        saved = len(sweep.done) + len(sweep.rows)  # a resumed sweep's earlier cells are in the file too
        if saved:
            typer.echo(
                f"interrupted: {saved} finished cells are saved in {writer.csv_path}; "
                "run the same command with --resume to continue",
                err=True,
            )
        else:
            typer.echo("interrupted before the first cell finished: no results were saved", err=True)
        raise typer.Exit(130) from None
    session.record_run(time.time() - t0)
    _finish(job, cfg, rows, writer, console, t0)


def _resume_before_the_model(job: str, cfg):
    """With --resume on an existing results file: (writer, sweep, whether every cell of this command is already
    there), opened and keyed without a model, which would otherwise load only for its cells to be skipped.
    None where the run opens its results as usual (no --resume, no file yet)."""
    import copy

    from kvbench import results
    from kvbench.engine.weights import model_identity
    from kvbench.kv import registry
    from kvbench.runtime import pick_device
    from kvbench.session import at_prompt_length, default_contexts

    if not cfg.resume:
        return None
    device = pick_device(cfg.device)
    out = Path(cfg.out) if cfg.out else results.default_out_dir(device)
    if not (out / f"{_job_files(job)[0]}.csv").is_file():
        return None
    for plugin in cfg.plugin:
        registry.load_plugin(plugin)
    model_hash = model_identity(cfg.model)[1]
    writer, sweep = _open_results(job, cfg, out, model_hash)
    if at_prompt_length(job, cfg):
        return writer, sweep, False
    plan = copy.copy(cfg)
    plan.contexts = cfg.contexts or default_contexts(device.type)
    keys = [k for ks in _keys_by_group(job, plan, str(device), model_hash).values() for k in ks]
    return writer, sweep, bool(keys) and set(keys) <= sweep.done


def _check_compare_kernels(cfg, devices: list[str]) -> None:
    """--compare-kernels without a GPU fails up front, as --kernel triton does (it would only write skipped rows)."""
    if not getattr(cfg, "compare_kernels", False):
        return
    from kvbench.runtime import pick_device

    kinds = [d.split(":")[0] for d in devices] if devices else [pick_device(cfg.device).type]
    if any(k != "cuda" for k in kinds):
        raise KvbenchError("--compare-kernels needs a CUDA GPU (it runs the Triton path beside the reference path)")


def _write_md(job, cfg, writer) -> None:
    """`--format md`: the table of every row in the CSV (a resumed sweep's earlier rows too), rewritten whole."""
    if "md" not in cfg.formats or not writer.csv_path.exists():
        return
    import csv

    from kvbench.results import write_markdown

    with open(writer.csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    write_markdown(rows, writer.directory / f"{writer.stem}.md", job)


def _finish(job, cfg, rows, writer, console, t0) -> None:
    _write_md(job, cfg, writer)
    if not cfg.quiet:
        from kvbench.tables import print_rows

        print_rows(job, rows, console)
    console.print(f"wrote {writer.directory}/ ({len(rows)} rows, {time.time() - t0:.0f} s)")
    if rows and all(r.get("status") in ("error", "oom") for r in rows):  # a script or CI should see it: nothing ran
        statuses = " / ".join(sorted({r["status"] for r in rows}))
        typer.echo(
            f"error: every cell of this run failed (status {statuses}; the notes in {writer.csv_path} say why)",
            err=True,
        )
        raise typer.Exit(1)


def _run_sharded(job: str, cfg, devices: list[str], console, t0: float) -> None:
    """One worker process per device; this process only writes rows (no model here)."""
    import kvbench
    from kvbench import results
    from kvbench.engine.weights import model_identity
    from kvbench.kv import registry
    from kvbench.runtime import Progress
    from kvbench.session import RUN_COLUMNS, default_contexts
    from kvbench.sweep import run_sharded

    for plugin in cfg.plugin:
        registry.load_plugin(plugin)
    model_id, model_hash = model_identity(cfg.model)
    if cfg.contexts is None:
        cfg.contexts = default_contexts(devices[0].split(":")[0])
    # the cells' keys without a model (an unknown mode is one line here, before any folder is made): the bar's
    # total, and the groups that --resume finds finished
    keys = _keys_by_group(job, cfg, devices[0], model_hash)
    out = Path(cfg.out) if cfg.out else results.default_out_dir(devices[0])
    writer, sweep = _open_results(job, cfg, out, model_hash)
    if sweep.done:
        console.print(f"resuming: {len(sweep.done)} finished cells in {writer.csv_path} are skipped")
    todo = [g for g, k in keys.items() if not set(k) <= sweep.done]
    if not todo:
        console.print(f"every cell is already in {writer.csv_path}: no worker started")
    else:
        if len(todo) < len(keys):
            console.print(f"{len(keys) - len(todo)} of {len(keys)} groups are finished; {len(todo)} left")
        console.print(f"sharding {len(todo)} groups of cells over {len(devices)} workers: {', '.join(devices)}")
    cfg.resume = False  # workers get the finished cells from here
    try:
        with Progress(sum(map(len, keys.values())), cfg.quiet, console) as progress:
            for g in keys.keys() - set(todo):
                for _ in keys[g]:
                    progress.cell_done()
            rows = (
                run_sharded(job, cfg, devices, todo, sweep.sink, writer.columns, progress, done=sweep.done)
                if todo
                else []
            )
    except KeyboardInterrupt:
        typer.echo(f"interrupted: finished cells are saved in {writer.csv_path}; rerun with --resume", err=True)
        raise typer.Exit(130) from None
    finally:
        results.ResultsWriter(out, "runs", RUN_COLUMNS, formats=("csv",)).write(
            {
                "date": results.now(),
                "job": job,
                "command": results.command_line(),
                "device": f"{len(devices)} workers: {', '.join(devices)}",
                "model": model_id,
                "kvbench_version": kvbench.__version__,
                "git_commit": results.git_commit(),
                "wall_s": round(time.time() - t0, 1),
            }
        )
    _finish(job, cfg, rows, writer, console, t0)


# ----------------------------------------------------------------------- commands
@app.command(no_args_is_help=False)
@friendly
def audit(
    model: Model = None,
    modes: Modes = None,
    contexts: Contexts = None,
    gen_tokens: Annotated[
        int | None,
        typer.Option(
            "--gen-tokens", "--gen", help="Greedy tokens decoded per mode. \\[default: 64]", show_default=False
        ),
    ] = None,
    out: Out = None,
    config: ConfigFile = None,
    ppl: Annotated[
        bool | None,
        typer.Option(
            "--ppl/--no-ppl",
            help="Also measure perplexity over the text (the bundled novel, or --prompt-file's).",
            show_default=False,
        ),
    ] = None,
    ppl_windows: Annotated[
        int | None, typer.Option(help="Non-overlapping text windows for --ppl. \\[default: 2]", show_default=False)
    ] = None,
    ppl_chunk: Annotated[
        int | None,
        typer.Option(
            help="Chunk size for --ppl (tokens see earlier chunks through the cache). \\[default: 256]",
            show_default=False,
        ),
    ] = None,
    question: Annotated[
        str | None,
        typer.Option(
            help="Question that ends the prompt. \\[default: 'Who are the main characters in the passage above, "
            "and what happens to them?']",
            show_default=False,
        ),
    ] = None,
    prompt_file: Annotated[
        str | None, typer.Option(help="Use this text instead of the bundled novel.", show_default=False)
    ] = None,
    near_tie_margin: Annotated[
        float | None,
        typer.Option(
            help="A divergence where fp16's top-2 logits differ by less is a near-tie. \\[default: 0.5]",
            show_default=False,
        ),
    ] = None,
    kv_cap_check: Annotated[
        str | None,
        typer.Option(
            help="Comma list of KV caps N: each mode also decodes with --max-kv-size N, once keeping --keep sink "
            "tokens and once keeping none (the seed engine's bug), checked for degenerate output.",
            show_default=False,
        ),
    ] = None,
    prefix_reuse: Annotated[
        bool | None,
        typer.Option(
            "--prefix-reuse/--no-prefix-reuse",
            help="Also check prompt-cache reuse: a donated prefix, adopted, then only the suffix prefilled.",
            show_default=False,
        ),
    ] = None,
    niah: Annotated[
        bool | None,
        typer.Option(
            "--niah/--no-niah",
            help="Also run needle-in-a-haystack at --niah-depths of each context.",
            show_default=False,
        ),
    ] = None,
    niah_depths: Annotated[
        str | None, typer.Option(help="Needle depths as fractions. \\[default: 0,0.25,0.5,0.75,1]", show_default=False)
    ] = None,
    compare_kernels: Annotated[
        bool | None,
        typer.Option(
            "--compare-kernels/--no-compare-kernels",
            help="GPU: also run every mode through both the Triton and the reference path, teacher-forced, and "
            "check they agree: KL <= 0.05 nats, or the Triton path at most 2x as far as the reference from the "
            "same mode run in float32 (a float32 copy of the model is loaded for it).",
            show_default=False,
        ),
    ] = None,
    device: Device = None,
    dtype: Dtype = None,
    kernel: Kernel = None,
    prefill_chunk: PrefillChunk = None,
    boundary_v: BoundaryV = None,
    sparse_v_threshold: SparseV = None,
    no_fallback: NoFallback = None,
    plugin: Plugin = None,
    max_kv_size: MaxKv = None,
    keep: Keep = None,
    yarn: Yarn = None,
    formats: Formats = None,
    quiet: Quiet = None,
    no_cuda_graphs: NoGraphs = None,
    no_pdl: NoPdl = None,
    no_gemv_kernel: NoGemv = None,
    resume: Resume = None,
    force: Force = None,
    devices: Devices = None,
) -> None:
    """Does each mode run, and is its output still right? Greedy decode per mode vs fp16 on the same prompt.

    For each context a prompt of exactly that many tokens (bundled novel + a question) is decoded
    greedily by every mode; each is compared with fp16: identical or first divergent token, token
    match, teacher-forced top-1 agreement and KL, and a degenerate-output check. Writes audit.csv.

    [bold]Examples[/bold]

      kvbench audit --modes int8,turbo4-asym --contexts 2k,8k

      kvbench audit --model dummy:tiny --contexts 256 --gen-tokens 8   (smoke run)

      kvbench audit --modes int8 --ppl --niah --kv-cap-check 256 -o results/int8

      kvbench audit --config configs/ci-tiny.toml --resume   (resume a sweep)
    """
    cli = _common(**{k: v for k, v in locals().items() if k not in ("config", "kv_cap_check", "niah_depths")})
    cli["kv_caps"] = config_mod.parse_int_list(kv_cap_check, "kv-cap-check")
    cli["niah_depths"] = config_mod.parse_float_list(niah_depths, "niah-depths")
    _run("audit", config_mod.build_config("audit", _one_config(config), cli))


@app.command("decode-bench", no_args_is_help=False)
@friendly
def decode_bench(
    model: Model = None,
    modes: Modes = None,
    contexts: Contexts = None,
    batch: Annotated[
        str | None, typer.Option("--batch", "-b", help="Comma list of batch sizes. \\[default: 1]", show_default=False)
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(help="Untimed decode tokens first (compilation, graphs). \\[default: 16]", show_default=False),
    ] = None,
    gen: Annotated[
        int | None,
        typer.Option(
            "--gen", "--gen-tokens", help="Timed decode tokens per repeat. \\[default: 128]", show_default=False
        ),
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(help="Timed repeats; the median is reported. \\[default: 3]", show_default=False)
    ] = None,
    capacity: Annotated[
        bool | None,
        typer.Option(
            "--capacity/--no-capacity",
            help="Also search the largest batch that fits at the longest context, per mode.",
            show_default=False,
        ),
    ] = None,
    capacity_speed: Annotated[
        bool | None,
        typer.Option(
            "--capacity-speed/--no-capacity-speed",
            help="With --capacity on a GPU, also time the decode at each mode's largest batch: tok/s per GPU at "
            "capacity (the cache filled with random K/V). \\[default: on]",
            show_default=False,
        ),
    ] = None,
    memory_budget_gb: Annotated[
        float | None,
        typer.Option(help="Memory budget for --capacity. \\[default: free device memory]", show_default=False),
    ] = None,
    fill: Annotated[
        str | None,
        typer.Option(
            help="How the context is built: auto (random K/V for a model without a tokenizer, e.g. dummy:*; else prefill), prefill, random. "
            "\\[default: auto]",
            show_default=False,
        ),
    ] = None,
    out: Out = None,
    config: ConfigFile = None,
    device: Device = None,
    dtype: Dtype = None,
    kernel: Kernel = None,
    prefill_chunk: PrefillChunk = None,
    boundary_v: BoundaryV = None,
    sparse_v_threshold: SparseV = None,
    no_fallback: NoFallback = None,
    plugin: Plugin = None,
    max_kv_size: MaxKv = None,
    keep: Keep = None,
    yarn: Yarn = None,
    formats: Formats = None,
    quiet: Quiet = None,
    no_cuda_graphs: NoGraphs = None,
    no_pdl: NoPdl = None,
    no_gemv_kernel: NoGemv = None,
    resume: Resume = None,
    force: Force = None,
    devices: Devices = None,
) -> None:
    """What does each mode cost or buy? Warmed decode tok/s, peak memory and KV bytes per mode, context and batch.

    Prefill is timed separately; decode is timed after --warmup tokens over --repeats windows of --gen
    tokens. Ratios vs fp16 and the roofline fraction (against the copy bandwidth measured in the same
    run) are computed within the run. Writes bench.csv.

    [bold]Examples[/bold]

      kvbench decode-bench --modes fp16,int8 --contexts 2k,8k --batch 1,8

      kvbench decode-bench --model dummy:llama-3.1-8b --contexts 2k,32k --capacity

      kvbench decode-bench --model dummy:tiny --contexts 256 --gen 4 --repeats 1
    """
    cli = _common(**{k: v for k, v in locals().items() if k not in ("config", "batch")})
    cli["batch"] = config_mod.parse_int_list(batch, "batch")
    _run("decode-bench", config_mod.build_config("decode-bench", _one_config(config), cli))


@app.command(no_args_is_help=False)
@friendly
def report(
    results_dirs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Results folder(s) to merge; files among several paths are skipped. "
            "\\[default: the folder under results/ with the newest CSV]",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            "-o",
            help="Folder for report.md and its plots, or a .md file path (plots beside it). \\[default: the first folder]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Turn results CSVs into report.md: summary, status matrix, benchmark table, plots, recommendation.

    Reads audit.csv, bench.csv and runs.csv of each folder (nothing else); several folders merge into one report.

    [bold]Examples[/bold]

      kvbench report results/2026-12-01-cpu

      kvbench report results/sweep/*/ --out results/sweep/report.md
    """
    from kvbench.report import render_report

    if out is not None and not out.strip():  # Path("") is the working folder: a report there by accident
        raise KvbenchError("--out: is empty: give a folder or a .md file for the report (or leave --out out)")
    dirs = list(results_dirs or [])
    if not dirs:
        dirs = [_newest_results_dir(Path("results"))]
    elif len(dirs) > 1:  # `OUT/*` also matches files beside the folders (plan's jobs.txt, a report and its plots)
        files = [d for d in dirs if d.is_file()]
        dirs = [d for d in dirs if not d.is_file()]
        if not dirs:
            raise KvbenchError(f"none of the {len(files)} paths is a results folder (all are files)")
        if files:
            typer.echo(f"warning: skipping {len(files)} path(s) that are files: {', '.join(map(str, files))}", err=True)
    for d in dirs:
        if d.is_file():
            hint = f"; give its folder: kvbench report {d.parent}" if d.suffix == ".csv" else ""
            raise KvbenchError(f"{d} is a file, not a results folder{hint}")
        if not d.is_dir():
            raise KvbenchError(f"results folder not found: {d}")
        if not any(d.glob("*.csv")):
            hint = f"; its subfolders have some: kvbench report {d}/*/" if any(d.glob("*/*.csv")) else ""
            raise KvbenchError(f"no CSV files in {d}{hint}")
    seen, unique = set(), []  # `r1 r1/ ./r1`: one folder, read once
    for d in dirs:
        if d.resolve() not in seen:
            seen.add(d.resolve())
            unique.append(d)
    if len(unique) < len(dirs):
        from kvbench.results import plural

        again = plural(len(dirs) - len(unique), "path")
        typer.echo(f"warning: {again} named a folder given before it; each folder is read once", err=True)
        dirs = unique
    path = render_report(list(dirs), Path(out) if out is not None else None)
    typer.echo(f"wrote {path}")


def _newest_results_dir(root: Path) -> Path:
    """The folder under `root`, at any depth, holding the newest CSV (a sweep's parent folder holds none itself)."""
    newest: dict[Path, float] = {}
    for f in root.rglob("*.csv"):
        if f.is_file():
            newest[f.parent] = max(newest.get(f.parent, 0.0), f.stat().st_mtime)
    if not newest:
        raise KvbenchError(f"no results folder given and no CSV files under {root}/")
    return max(newest, key=newest.get)


@app.command()
@friendly
def plan(
    job: Annotated[str, typer.Argument(help="audit or decode-bench")],
    config: Annotated[str, typer.Option("--config", help="The sweep's TOML file.")],
    out: Annotated[str, typer.Option("--out", "-o", help="Parent folder of the per-job result folders.")],
    emit: Annotated[str, typer.Option(help="What to write: 'jobs' (one command per group of cells).")] = "jobs",
    file: Annotated[
        Path | None, typer.Option("--file", help="Also write the commands to this file (plus a Slurm array script).")
    ] = None,
) -> None:
    """Split a sweep into self-contained commands for a cluster scheduler (Slurm array, Ray, any job runner).

    Each line runs one group of cells (a context; for decode-bench a context and a batch size) into
    its own results folder, with absolute paths; `kvbench report OUT/*/ --out OUT` merges them afterwards.

    [bold]Examples[/bold]

      kvbench plan decode-bench --config configs/ci-tiny.toml --out sweep

      kvbench plan audit --config configs/default.toml -o sweep --file jobs.txt
    """
    import shlex

    from kvbench.session import at_prompt_length, default_contexts

    if job not in ("audit", "decode-bench"):
        raise KvbenchError(f"plan: job must be audit or decode-bench, not '{job}'")
    if emit != "jobs":
        raise KvbenchError(f"plan: --emit '{emit}' is not supported (jobs)")
    if not out.strip():  # the jobs would write to /<cell>
        raise KvbenchError("plan: --out is empty: name the parent folder of the per-job result folders")
    cfg = config_mod.build_config(job, config, {})
    # absolute paths: each command runs wherever the scheduler starts it
    config, out = str(Path(config).resolve()), str(Path(out).resolve())
    contexts = cfg.contexts or default_contexts("cuda")
    if at_prompt_length(job, cfg):
        contexts = [None]
        typer.echo(f"# {config} sets a prompt_file and no contexts: one job, at the file's own length", err=True)
    elif not cfg.contexts:  # the jobs are meant for GPU nodes (the Slurm script asks for one): their default set
        planned = ", ".join(f"{c // 1024}K" for c in contexts)
        typer.echo(f"# {config} sets no contexts: planned the GPU default {planned} (set `contexts` there)", err=True)
    cmds = []
    for ctx in contexts:
        batches = cfg.batch if job == "decode-bench" else [None]
        for b in batches:
            name = (f"ctx{ctx}" + (f"-b{b}" if b else "")) if ctx else "prompt-file"
            parts = ["kvbench", job, "--config", config, *(["--contexts", str(ctx)] if ctx else []),
                     "--out", f"{out}/{name}", "--resume"]  # fmt: skip
            if b:
                parts += ["--batch", str(b)]
            cmds.append(" ".join(shlex.quote(p) for p in parts))
    if job == "decode-bench" and cfg.capacity:  # the capacity search runs once, with the longest context
        last = f"--contexts {max(contexts)} "
        first_b = f"--batch {cfg.batch[0]}"
        cmds = [c if (last in c and c.endswith(first_b)) else c + " --no-capacity" for c in cmds]
    for c in cmds:
        typer.echo(c)
    if file:
        slurm = file.with_suffix(".slurm.sh")
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text("\n".join(cmds) + "\n")
            gpu = "" if (cfg.device or "").startswith("cpu") else "#SBATCH --gres=gpu:1\n"  # a CPU sweep asks none
            slurm.write_text(
                "#!/bin/bash\n"
                f"#SBATCH --array=1-{len(cmds)}\n{gpu}"
                f'eval "$(sed -n "${{SLURM_ARRAY_TASK_ID}}p" {shlex.quote(str(file))})"\n'
            )
        except OSError as exc:
            raise KvbenchError(f"--file: cannot write {file}: {exc.strerror or exc}") from None
        # `OUT/*/`: the trailing slash makes the shell expand folders only (--file may be inside OUT)
        report = f"kvbench report {shlex.quote(out)}/*/ --out {shlex.quote(out)}"  # the report beside the jobs
        typer.echo(f"# wrote {file} and {slurm} (sbatch {slurm}); then: {report}", err=True)


@app.command("modes")
@friendly
def list_modes(plugin: Plugin = None) -> None:
    """List the registered KV modes and their aliases, then transformers' own caches (`hf:*`, audit peers).

    With --plugin, a plugin file's modes join the list (marked "plugin"), as they would join a run.
    """
    from kvbench.kv import registry
    from kvbench.peers import PEERS

    for path in plugin or []:
        registry.load_plugin(path)
    for name in registry.mode_names():
        cls = registry.get(name)
        alias = f" (aliases: {', '.join(cls.aliases)})" if cls.aliases else ""
        from_plugin = cls.__module__.startswith(registry.PLUGIN_PREFIX)
        origin = f" [plugin {Path(inspect.getfile(cls)).name}]" if from_plugin else ""
        typer.echo(f"{name:18s} {cls.summary}{alias}{origin}")
    typer.echo("\ntransformers' own caches on the same weights, as peers (--modes hf:all runs every one):")
    for peer in PEERS.values():
        typer.echo(f"{peer.name:18s} {peer.summary}")


def _click_errors() -> tuple[tuple, tuple]:
    """click's ClickException and Abort, and the copies that typer >= 0.2x vendors (typer._click):
    a usage error (unknown option, a value that is not a number) raises the vendored ones."""
    import click

    errors, aborts = [click.exceptions.ClickException], [click.exceptions.Abort, typer.Abort]
    try:
        from typer._click import exceptions as vendored

        errors.append(vendored.ClickException)
        aborts.append(getattr(vendored, "Abort", typer.Abort))
    except ImportError:
        pass
    return tuple(errors), tuple(aborts)


def _usage_error(exc) -> str:
    """A click error as one line: its message, and for a usage error the command's --help."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and type(exc).__name__ != "ClickException":
        message = message.rstrip(".") + f"; see '{ctx.command_path} --help'"
    return message


_SIGNALLED = {"term": False}


def _sigterm(signum, frame):
    _SIGNALLED["term"] = True  # the exit status says which signal: 143 (128 + SIGTERM), not Ctrl-C's 130
    raise KeyboardInterrupt  # a scheduler's kill ends like Ctrl-C: finished cells saved, resumable


def _interrupted_rc() -> int:
    return 143 if _SIGNALLED["term"] else 130


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _sigterm)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    try:
        rc = app(prog_name="kvbench", standalone_mode=False)
        if isinstance(rc, int) and rc:  # click returns a typer.Exit's code when not standalone
            sys.exit(_interrupted_rc() if rc == 130 else rc)
    except KvbenchError as exc:
        _fail(str(exc))
    except typer.Exit as exc:
        sys.exit(_interrupted_rc() if exc.exit_code == 130 else exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(_interrupted_rc())
    except Exception as exc:  # click usage errors and the like
        errors, aborts = _click_errors()
        if isinstance(exc, errors):
            if type(exc).__name__ == "NoArgsIsHelpError":  # `kvbench` alone: the help is printed, nothing failed
                sys.exit(0)
            _fail(_usage_error(exc), exc.exit_code)
        if isinstance(exc, aborts):
            typer.echo("interrupted", err=True)
            sys.exit(_interrupted_rc())
        raise


if __name__ == "__main__":
    main()

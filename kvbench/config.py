"""Sweep descriptions: one dataclass per job, filled from a TOML file and the
command line (the command line wins), validated before any work starts."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import tomllib

from kvbench.errors import KvbenchError

DTYPES = ("auto", "bfloat16", "float16", "float32")
KERNELS = ("auto", "triton", "reference")
FILLS = ("auto", "prefill", "random")


@dataclass
class Common:
    model: str | None = None
    modes: list[str] = field(default_factory=lambda: ["all"])
    contexts: list[int] | None = None  # None: the job's device-dependent default
    out: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    kernel: str = "auto"
    prefill_chunk: int = 2048
    boundary_v: int | None = None
    no_fallback: bool = False
    plugin: list[str] = field(default_factory=list)
    max_kv_size: int | None = None
    keep: int = 4
    yarn: str = "auto"
    formats: list[str] = field(default_factory=lambda: ["csv", "json"])
    quiet: bool = False
    resume: bool = False
    force: bool = False
    devices: str | None = None
    cuda_graphs: bool = True
    pdl: bool = True
    gemv_kernel: bool = True
    sparse_v_threshold: float = 0.0


@dataclass
class AuditConfig(Common):
    gen_tokens: int = 64
    question: str | None = None
    prompt_file: str | None = None
    ppl: bool = False
    ppl_windows: int = 2
    ppl_chunk: int = 256
    near_tie_margin: float = 0.5
    niah: bool = False
    niah_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    prefix_reuse: bool = False
    kv_caps: list[int] = field(default_factory=list)  # --kv-cap-check: caps audited with keep and keep=0
    compare_kernels: bool = False


@dataclass
class BenchConfig(Common):
    batch: list[int] = field(default_factory=lambda: [1])
    warmup: int = 16
    gen: int = 128
    repeats: int = 3
    fill: str = "auto"
    capacity: bool = False
    memory_budget_gb: float | None = None


JOB_CONFIGS = {"audit": AuditConfig, "decode-bench": BenchConfig}


def _check_type(name: str, value, typ: str, where: str):
    base = typ.replace(" | None", "")
    if value is None and "None" in typ:
        return None
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "list[int]": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "list[float]": isinstance(value, list) and all(isinstance(v, int | float) for v in value),
    }.get(base)
    if ok is None or not ok:
        raise KvbenchError(f"{where}: key '{name}' must be {base}, got {type(value).__name__} {value!r}")
    return float(value) if base == "float" else value


def load_toml(path: str | Path, job: str) -> dict:
    """Read `[common]` plus the job's table (`[audit]` or `[decode-bench]`) from a file."""
    p = Path(path)
    if not p.is_file():
        raise KvbenchError(f"config file not found: {p}")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise KvbenchError(f"{p}: not valid TOML: {exc}") from exc
    cls = JOB_CONFIGS[job]
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    known_tables = {"common", *JOB_CONFIGS}
    out: dict = {}
    for table, values in data.items():
        if table not in known_tables:
            raise KvbenchError(f"{p}: unknown table [{table}] (expected {', '.join(sorted(known_tables))})")
        if not isinstance(values, dict):
            raise KvbenchError(f"{p}: '{table}' must be a table")
        if table not in ("common", job):
            continue
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in types:
                raise KvbenchError(f"{p}: unknown key '{key}' in [{table}] (known: {', '.join(sorted(types))})")
            out[name] = _check_type(key, value, types[name], f"{p} [{table}]")
    return out


def build_config(job: str, config_file: str | None, cli: dict):
    """File values, then command-line values that were given (not None) on top."""
    values = load_toml(config_file, job) if config_file else {}
    values.update({k: v for k, v in cli.items() if v is not None})
    cfg = JOB_CONFIGS[job](**values)
    validate(cfg, where=config_file or "command line")
    return cfg


def validate(cfg, where: str = "command line") -> None:
    def bad(key, why):
        raise KvbenchError(f"{where}: {key}: {why}")

    from kvbench.kv import registry

    if not cfg.modes:
        bad("modes", "needs at least one mode, or 'all' (see kvbench modes)")
    if cfg.model is not None and not cfg.model.strip():  # e.g. --model "$MODEL" with MODEL unset
        bad("model", "is empty: leave it out (or pass 'default') for the embedded SmolLM2-135M-Instruct")
    if cfg.devices and cfg.device != "auto":  # --devices picks the device(s) itself: one would silently lose
        bad("devices", f"give --device ({cfg.device}) or --devices ({cfg.devices}), not both")
    try:
        for plugin in cfg.plugin:
            registry.load_plugin(plugin)
        from kvbench.peers import split_modes

        registry.parse_modes(split_modes(cfg.modes)[0])
    except KvbenchError as exc:
        raise KvbenchError(f"{where}: modes: {exc}") from None
    if cfg.contexts is not None:
        if not cfg.contexts:
            bad("contexts", "needs at least one value")
        for c in cfg.contexts:
            if c <= 0:
                bad("contexts", f"context must be a positive number of tokens, got {c}")
    if cfg.dtype not in DTYPES:
        bad("dtype", f"'{cfg.dtype}' is not one of {', '.join(DTYPES)}")
    if cfg.kernel not in KERNELS:
        bad("kernel", f"'{cfg.kernel}' is not one of {', '.join(KERNELS)}")
    if cfg.prefill_chunk < 0:
        bad("prefill-chunk", "must be >= 0 (0 = one pass)")
    if cfg.boundary_v is not None and cfg.boundary_v < 0:
        bad("boundary-v", "must be >= 0")
    if not 0.0 <= cfg.sparse_v_threshold < 1.0:
        bad("sparse-v-threshold", f"must be in [0, 1) (0 = off), got {cfg.sparse_v_threshold}")
    if cfg.max_kv_size is not None and cfg.max_kv_size <= cfg.keep:
        bad("max-kv-size", f"must exceed --keep ({cfg.keep})")
    if cfg.keep < 0:
        bad("keep", "must be >= 0")
    for f in cfg.formats:
        if f not in ("csv", "json", "md"):
            bad("format", f"'{f}' is not one of csv, json, md")
    if "csv" not in cfg.formats:  # --resume, the interrupt message and `kvbench report` read the CSV
        bad("format", "must include csv (--resume and kvbench report read it); json and md go beside it")
    if cfg.yarn not in ("auto", "off"):
        try:
            factor = float(cfg.yarn)
        except ValueError:
            factor = None
        if factor is None or not 1.0 <= factor < float("inf"):
            bad("yarn", f"'{cfg.yarn}' is not auto, off or a factor >= 1")
    if isinstance(cfg, AuditConfig):
        if cfg.gen_tokens < 2:
            bad("gen-tokens", "must be at least 2")
        if cfg.ppl_windows < 1 or cfg.ppl_chunk < 1:
            bad("ppl-windows/ppl-chunk", "must be positive")
        if not cfg.near_tie_margin >= 0:
            bad("near-tie-margin", f"must be >= 0 (a logit gap), got {cfg.near_tie_margin}")
        if cfg.prompt_file and not Path(cfg.prompt_file).is_file():
            bad("prompt-file", f"{cfg.prompt_file} not found")
        for cap in cfg.kv_caps:
            if cap <= cfg.keep:
                bad("kv-cap-check", f"cap {cap} must exceed --keep ({cfg.keep})")
        for d in cfg.niah_depths:
            if not 0.0 <= d <= 1.0:
                bad("niah-depths", f"depth {d} is outside [0, 1]")
    if isinstance(cfg, BenchConfig):
        if not cfg.batch or any(b <= 0 for b in cfg.batch):
            bad("batch", "batch sizes must be positive")
        if cfg.gen < 1 or cfg.repeats < 1 or cfg.warmup < 0:
            bad("gen/repeats/warmup", "gen and repeats must be >= 1, warmup >= 0")
        if cfg.fill not in FILLS:
            bad("fill", f"'{cfg.fill}' is not one of {', '.join(FILLS)}")
        if cfg.memory_budget_gb is not None and not cfg.memory_budget_gb > 0:
            bad("memory-budget-gb", f"must be a positive number of GB, got {cfg.memory_budget_gb}")


_COUNT = re.compile(r"([-+]?(?:\d+(?:\.\d*)?|\.\d+))(k?)")


def parse_int_list(text: str | None, name: str) -> list[int] | None:
    """'2048,8k,32K,1.5k' -> [2048, 8192, 32768, 1536]; one-line errors for junk, and for a value that is not
    whole ('1.5', '0.1k'): it is refused, not rounded."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        s = part.strip().lower()
        if not s:
            continue
        m = _COUNT.fullmatch(s)
        exact = Fraction(m.group(1)) * (1024 if m.group(2) else 1) if m else None
        if exact is None or exact.denominator != 1:
            raise KvbenchError(f"--{name}: '{part.strip()}' is not a whole number")
        value = int(exact)
        if value <= 0:
            raise KvbenchError(f"--{name}: values must be positive, got {value}")
        out.append(value)
    if not out:
        raise KvbenchError(f"--{name}: give at least one value")
    return out


def parse_float_list(text: str | None, name: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise KvbenchError(f"--{name}: '{text}' is not a comma list of numbers") from None


def parse_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [s.strip() for s in text.split(",") if s.strip()]

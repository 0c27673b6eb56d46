"""Sweep descriptions: one dataclass per job, filled from a TOML file and the
command line (the command line wins), validated before any work starts."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

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
    capacity_speed: bool = True
    memory_budget_gb: float | None = None


JOB_CONFIGS = {"audit": AuditConfig, "decode-bench": BenchConfig}


def _as_cli_list(name: str, value, base: str, where: str):
    """A list option written as the command line takes it: `contexts = "2k,8k"`, `["2k", 8192]` or `2048`
    for `--contexts 2k,8k`; `modes = "fp16,int8"`; `plugin = "mine.py"` (one file). Other values pass as given."""
    if base == "list[str]" and isinstance(value, str):
        return [value] if name == "plugin" else parse_list(value)
    if base not in ("list[int]", "list[float]"):
        return value
    parse = parse_int_list if base == "list[int]" else parse_float_list
    if isinstance(value, str | int | float) and not isinstance(value, bool):  # `contexts = 2048` or "2k,8k"
        value = [value]
    if not isinstance(value, list) or not any(isinstance(v, str) for v in value):
        return value
    out = []
    for v in value:
        try:
            out += parse(v, name) if isinstance(v, str) else [v]
        except KvbenchError as exc:
            raise KvbenchError(f"{where}: key '{name}':{str(exc).split(':', 1)[1]}") from None
    return out


def _check_type(name: str, value, typ: str, where: str):
    base = typ.replace(" | None", "")
    if value is None and "None" in typ:
        return None
    value = _as_cli_list(name, value, base, where)
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "list[int]": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "list[float]": isinstance(value, list)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value),
    }.get(base)
    if ok is None or not ok:
        raise KvbenchError(f"{where}: key '{name}' must be {base}, got {type(value).__name__} {value!r}")
    if base == "float":
        return float(value)
    return [float(v) for v in value] if base == "list[float]" else value


# Config-file spellings of the command-line options whose field has another name: key -> (field, inverted).
# `no_cuda_graphs = true` is `cuda_graphs = false`; both spellings of one option in a table is an error.
ALIASES = {
    "kv_cap_check": ("kv_caps", False),
    "format": ("formats", False),
    "no_cuda_graphs": ("cuda_graphs", True),
    "no_pdl": ("pdl", True),
    "no_gemv_kernel": ("gemv_kernel", True),
}
# One option, two jobs' field names: the audit's `gen_tokens` and decode-bench's `gen` (each command takes both
# spellings on the command line, and each table of a config file does).
JOB_SPELLINGS = {"gen": "gen_tokens", "gen_tokens": "gen"}
# the command-line option of each field, where it is not the field's name with '-' (for error messages)
OPTIONS = {field: "--" + key.replace("_", "-") for key, (field, _) in ALIASES.items()}


def read_utf8(p: Path) -> str:
    """A file's text; a KvbenchError saying why not (a folder, missing, unreadable, not UTF-8) otherwise."""
    if p.is_dir():
        raise KvbenchError(f"{p} is a directory, not a file")
    if not p.exists():
        raise KvbenchError(f"{p} not found")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise KvbenchError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KvbenchError(f"{p} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


FILE_FIELDS = ("plugin", "prompt_file")  # paths a config file names, read relative to the file's folder


def _beside(config: Path, value):
    """A relative path (or list of them) in `config`, taken from the config's folder."""
    if isinstance(value, list):
        return [_beside(config, v) for v in value]
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        return value
    return str(config.parent / value)


def load_toml(path: str | Path, job: str, origins: dict | None = None) -> dict:
    """Read `[common]` plus the job's table (`[audit]` or `[decode-bench]`, which wins) from a file.

    `origins`, if given, gets each field's file and key as written, for validate's messages."""
    p = Path(path)
    if not p.exists():
        raise KvbenchError(f"config file not found: {p}")
    try:
        data = tomllib.loads(read_utf8(p))
    except KvbenchError as exc:
        raise KvbenchError(f"config file {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise KvbenchError(f"{p}: not valid TOML: {exc}") from exc
    cls = JOB_CONFIGS[job]
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    known_tables = {"common", *JOB_CONFIGS}
    for table, values in data.items():
        if not isinstance(values, dict):  # `model = "x"` above the first table
            raise KvbenchError(
                f"{p}: '{table}' is a key outside any table; put it under [common], [audit] or [decode-bench]"
            )
        if table not in known_tables:
            raise KvbenchError(f"{p}: unknown table [{table}] (expected {', '.join(sorted(known_tables))})")
    # [common] is shared by both jobs: a key only the other job knows (decode-bench's `batch`) is not this one's
    other = {f.name for c in JOB_CONFIGS.values() for f in dataclasses.fields(c)} - set(types)
    out: dict = {}
    for table in ("common", job):  # in this order whatever the file's: the job's table overrides [common]
        seen: dict[str, str] = {}  # field -> the key that set it in this table
        for key, value in data.get(table, {}).items():
            field_name, inverted = ALIASES.get(key.replace("-", "_"), (key.replace("-", "_"), False))
            if field_name not in types and JOB_SPELLINGS.get(field_name) in types:
                field_name = JOB_SPELLINGS[field_name]
            if field_name not in types and table == "common" and field_name in other:
                continue
            if field_name not in types:
                spellings = (k for k, f in JOB_SPELLINGS.items() if f in types and k not in types)  # `gen`
                known = sorted([*types, *(a for a, (f, _) in ALIASES.items() if f in types), *spellings])
                raise KvbenchError(f"{p}: unknown key '{key}' in [{table}] (known: {', '.join(known)})")
            if field_name in seen:
                raise KvbenchError(f"{p} [{table}]: '{seen[field_name]}' and '{key}' set the same option; keep one")
            seen[field_name] = key
            value = _check_type(key, value, "bool" if inverted else types[field_name], f"{p} [{table}]")
            if field_name in FILE_FIELDS:  # files the config names are found beside it, as it was written
                value = _beside(p, value)
            out[field_name] = not value if inverted else value
            if origins is not None:
                origins[field_name] = f"{p}: {key}"
    return out


def _once_each(values: dict, cls) -> dict:
    """`--batch 1,1`, `--contexts 256,0.25k`: each value of a number list once, in first-seen order."""
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    return {
        k: list(dict.fromkeys(v)) if types[k].startswith(("list[int]", "list[float]")) and v is not None else v
        for k, v in values.items()
    }


def build_config(job: str, config_file: str | None, cli: dict):
    """File values, then command-line values that were given (not None) on top."""
    origins: dict[str, str] = {}
    values = load_toml(config_file, job, origins) if config_file else {}
    given = {k: v for k, v in cli.items() if v is not None}
    values.update(given)
    chosen = set(origins) | set(given)  # the fields the user set, in the file or on the command line
    for k in given:
        origins.pop(k, None)
    cfg = JOB_CONFIGS[job](**_once_each(values, JOB_CONFIGS[job]))
    # `--no-capacity` over a file that sets capacity and its budget (plan's jobs do): the file's budget is moot,
    # not an error; a check's option set without its switch anywhere still is
    off = {name for name, (switch, _) in NEEDS.items() if given.get(switch) is False and name in origins}
    validate(cfg, origins, chosen - off)
    if config_file:
        check_other_jobs(job, config_file)
    return cfg


def check_other_jobs(job: str, config_file: str) -> None:
    """The file's settings for the other job, checked now: `kvbench audit --config f; kvbench decode-bench
    --config f` should not learn of a bad [decode-bench] table after the audit's hour. Checks that depend on
    the command line (`ppl_chunk` without `--ppl`) are left to that job's own run."""
    for other, cls in JOB_CONFIGS.items():
        if other == job:
            continue
        origins: dict[str, str] = {}
        try:
            validate(cls(**_once_each(load_toml(config_file, other, origins), cls)), origins)
        except KvbenchError as exc:
            raise KvbenchError(
                f"{exc} (read by `kvbench {other}`; a config file is checked whole, before any work)"
            ) from None


# An option that only shapes a check or a search (field -> its switch, what it does there): set without the switch,
# it would be ignored in silence.
NEEDS = {
    "niah_depths": ("niah", "shapes the --niah check"),
    "ppl_windows": ("ppl", "shapes the --ppl check"),
    "ppl_chunk": ("ppl", "shapes the --ppl check"),
    "memory_budget_gb": ("capacity", "bounds the --capacity search"),
    "capacity_speed": ("capacity", "times the --capacity search's largest batch"),
}


def validate(cfg, origins: dict[str, str] | None = None, chosen: set[str] | None = None) -> None:
    """Refuse bad values in one line naming where each came from: `origins` maps a field to its config
    file and key (load_toml); any other field is named as its command-line option (`--gen-tokens`)."""
    origins = origins or {}

    def bad(name, why):
        where = origins.get(name) or OPTIONS.get(name) or "--" + name.replace("_", "-")
        raise KvbenchError(f"{where}: {why}")

    from kvbench.kv import registry

    if not cfg.modes:
        bad("modes", "needs at least one mode, or 'all' (see kvbench modes)")
    if cfg.model is not None and not cfg.model.strip():  # e.g. --model "$MODEL" with MODEL unset
        bad("model", "is empty: leave it out (or pass 'default') for the embedded SmolLM2-135M-Instruct")
    if cfg.out is not None and not str(cfg.out).strip():  # --out "$DIR" with DIR unset
        bad("out", "is empty: leave it out for results/<date>-<device>, or name a folder")
    if cfg.devices is not None and not cfg.devices.strip():  # --devices "$GPUS" with GPUS unset
        bad("devices", "is empty: leave it out for one device, or give e.g. 0,1 or all")
    if cfg.devices and cfg.device != "auto":  # --devices picks the device(s) itself: one would silently lose
        bad("devices", f"give --device ({cfg.device}) or --devices ({cfg.devices}), not both")
    for plugin in cfg.plugin:
        if not str(plugin).strip():  # --plugin "$FILE" with FILE unset
            bad("plugin", "is empty: name a Python file that registers modes, or leave it out")
        try:
            registry.load_plugin(plugin)
        except KvbenchError as exc:
            bad("plugin", str(exc))
    try:
        from kvbench.peers import split_modes

        registry.parse_modes(split_modes(cfg.modes)[0])
    except KvbenchError as exc:
        bad("modes", str(exc))
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
        bad("prefill_chunk", "must be >= 0 (0 = one pass)")
    if cfg.boundary_v is not None and cfg.boundary_v < 0:
        bad("boundary_v", "must be >= 0")
    if not 0.0 <= cfg.sparse_v_threshold < 1.0:
        bad("sparse_v_threshold", f"must be in [0, 1) (0 = off), got {cfg.sparse_v_threshold}")
    if cfg.max_kv_size is not None and cfg.max_kv_size <= cfg.keep:
        bad("max_kv_size", f"must exceed --keep ({cfg.keep})")
    if cfg.keep < 0:
        bad("keep", "must be >= 0")
    for f in cfg.formats:
        if f not in ("csv", "json", "md"):
            bad("formats", f"'{f}' is not one of csv, json, md")
    if "csv" not in cfg.formats:  # --resume, the interrupt message and `kvbench report` read the CSV
        bad("formats", "must include csv (--resume and kvbench report read it); json and md go beside it")
    if cfg.yarn not in ("auto", "off"):
        try:
            factor = float(cfg.yarn)
        except ValueError:
            factor = None
        if factor is None or not 1.0 <= factor < float("inf"):
            bad("yarn", f"'{cfg.yarn}' is not auto, off or a factor >= 1")
    if isinstance(cfg, AuditConfig):
        if cfg.gen_tokens < 2:
            bad("gen_tokens", "must be at least 2")
        if cfg.ppl_windows < 1:
            bad("ppl_windows", "must be positive")
        if cfg.ppl_chunk < 1:
            bad("ppl_chunk", "must be positive")
        if not cfg.near_tie_margin >= 0:
            bad("near_tie_margin", f"must be >= 0 (a logit gap), got {cfg.near_tie_margin}")
        if cfg.prompt_file is not None and not str(cfg.prompt_file).strip():  # --prompt-file "$F", F unset
            bad("prompt_file", "is empty: leave it out for the bundled novel, or name a text file")
        if cfg.prompt_file:  # read here, so that a folder or a binary file fails before the model loads
            try:
                read_utf8(Path(cfg.prompt_file))
            except KvbenchError as exc:
                bad("prompt_file", str(exc))
        for cap in cfg.kv_caps:
            if cap <= cfg.keep:
                bad("kv_caps", f"cap {cap} must exceed --keep ({cfg.keep})")
        for d in cfg.niah_depths:
            if not 0.0 <= d <= 1.0:
                bad("niah_depths", f"depth {d} is outside [0, 1]")
    if isinstance(cfg, BenchConfig):
        if not cfg.batch or any(b <= 0 for b in cfg.batch):
            bad("batch", "batch sizes must be positive")
        if cfg.gen < 1:
            bad("gen", "must be >= 1")
        if cfg.repeats < 1:
            bad("repeats", "must be >= 1")
        if cfg.warmup < 0:
            bad("warmup", "must be >= 0")
        if cfg.fill not in FILLS:
            bad("fill", f"'{cfg.fill}' is not one of {', '.join(FILLS)}")
        if cfg.memory_budget_gb is not None and not cfg.memory_budget_gb > 0:
            bad("memory_budget_gb", f"must be a positive number of GB, got {cfg.memory_budget_gb}")

    # --keep shapes a live-KV cap: --max-kv-size, or the audit's --kv-cap-check
    # (on the command line: a config's [common] keep may be there for the audit's --kv-cap-check alone)
    if (
        "keep" in (chosen or ())
        and "keep" not in origins
        and cfg.max_kv_size is None
        and not getattr(cfg, "kv_caps", None)
    ):
        caps = "--max-kv-size" + (" or --kv-cap-check" if isinstance(cfg, AuditConfig) else "")
        bad("keep", f"only shapes a live-KV cap; add {caps} (or leave it out)")
    # last, so that a bad value is named for what is wrong with it first
    for name, (switch, what) in NEEDS.items():  # (a switch turned off, `--no-capacity-speed`, asks for nothing)
        if (
            name in (chosen or ())
            and hasattr(cfg, switch)
            and not getattr(cfg, switch)
            and getattr(cfg, name) is not False
        ):
            bad(name, f"only {what}; add --{switch} (or leave it out)")
    if "niah_depths" in (chosen or ()) and getattr(cfg, "niah", False) and not cfg.niah_depths:
        bad("niah_depths", "is empty: give at least one depth, e.g. 0.5, or leave it out for the default")


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

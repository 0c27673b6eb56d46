"""The mode registry: names and aliases -> cache classes, plus per-model resolution.

A mode is one `KVCache` subclass decorated with `@register`. Users add their own
from a Python file with `--plugin path/to/modes.py` (see README).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import KvbenchError

MODES: dict = {}  # canonical name -> class
# Built-in modes list in this order (the spec's); plugins follow in registration order.
BUILTIN_ORDER = ("fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4", "turbo4-delegated")
_ALIASES: dict[str, str] = {}  # any spelling (lower case) -> canonical name


def register(cls):
    """Class decorator: make a `KVCache` subclass available by name and aliases."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    MODES[cls.name] = cls
    for spelling in (cls.name, *cls.aliases):
        _ALIASES[spelling.lower()] = cls.name
    return cls


def _ensure_builtin() -> None:
    # Importing the modules runs their @register decorators.
    import kvbench.kv.fp16
    import kvbench.kv.int8

    try:
        import kvbench.kv.turbo_modes  # noqa: F401
    except ModuleNotFoundError as exc:  # pragma: no cover - only while turbo modes are absent
        if exc.name != "kvbench.kv.turbo_modes":
            raise


def mode_names() -> list[str]:
    _ensure_builtin()
    builtin = [m for m in BUILTIN_ORDER if m in MODES]
    return builtin + [m for m in MODES if m not in BUILTIN_ORDER]


def resolve(name: str) -> str:
    """Canonical name for `name` or an alias; a one-line error listing valid names."""
    _ensure_builtin()
    key = name.strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    names = mode_names()
    aliases = ", ".join(f"{a}={m}" for a, m in sorted(_ALIASES.items()) if a not in names)
    raise KvbenchError(f"unknown KV mode '{name}' (valid: {', '.join(names)}; aliases: {aliases})")


def get(name: str):
    return MODES[resolve(name)]


def parse_modes(spec: str | list[str] | None) -> list[str]:
    """'all' / None -> every registered mode; otherwise a comma list, resolved, deduplicated."""
    _ensure_builtin()
    if spec is None:
        return mode_names()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    items = [s.strip() for s in items if s.strip()]
    if not items or any(s.lower() == "all" for s in items):
        return mode_names()
    out: list[str] = []
    for s in items:
        m = resolve(s)
        if m not in out:
            out.append(m)
    return out


PLUGIN_PREFIX = "kvbench_plugin_"  # a plugin file's module: this, its stem, a hash of its path


_LOADED: dict[Path, tuple[bytes, list[str]]] = {}  # plugin file -> (its source, the modes it registered)


def load_plugin(path: str | Path) -> list[str]:
    """Import a user's Python file so its `@register`ed modes join the registry; returns the names of the
    modes the file defines. A file already loaded, unchanged, with its modes still registered, is not run
    again (the CLI checks the options, then opens the run: a plugin's side effects happen once)."""
    _ensure_builtin()
    p = Path(path)
    if not p.is_file():
        raise KvbenchError(f"plugin file not found: {p}")
    try:
        source = p.read_bytes()
    except OSError as exc:
        raise KvbenchError(f"plugin {p}: cannot read it: {exc.strerror or exc}") from None
    seen = _LOADED.get(p.resolve())
    if seen and seen[0] == source and all(m in MODES for m in seen[1]):
        return list(seen[1])
    before, aliases_before = dict(MODES), dict(_ALIASES)
    # one module per file: a/modes.py and b/modes.py are two plugins (a stem alone would let the second
    # silently replace the first's modes); the name is the same in every process that loads the file
    key = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:8]
    mod_name = PLUGIN_PREFIX + re.sub(r"\W", "_", p.stem) + "_" + key
    spec = importlib.util.spec_from_file_location(mod_name, p)
    if spec is None or spec.loader is None:  # Python imports source files by their .py suffix
        raise KvbenchError(f"plugin {p} is not a Python source file (its name must end in .py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a user's file: report, don't crash
        raise KvbenchError(f"plugin {p} failed to import: {type(exc).__name__}: {exc}") from exc
    # A plugin mode may not take a name that is taken (a built-in mode's, its alias, or a word --modes reads
    # itself): its rows would carry the built-in's label.
    taken = [a for a, m in _ALIASES.items() if a in aliases_before and aliases_before[a] != m]
    # (the same file loaded again, e.g. by a second command in one process, replaces only its own classes)
    taken += [m for m in MODES if m in before and MODES[m] is not before[m] and before[m].__module__ != mod_name]
    taken += [a for a in _ALIASES if a not in aliases_before and (a == "all" or a.startswith("hf:"))]
    if taken:
        MODES.clear()
        MODES.update(before)
        _ALIASES.clear()
        _ALIASES.update(aliases_before)
        names = ", ".join(sorted(set(taken)))
        raise KvbenchError(f"plugin {p} registers a mode name that is taken ({names}); give its class another `name`")
    names = [m for m, cls in MODES.items() if cls.__module__ == mod_name]
    _LOADED[p.resolve()] = (source, names)
    return names


@dataclass
class Resolution:
    """What a requested mode becomes on a given model."""

    requested: str
    effective: str
    note: str = ""


def resolve_for_model(mode: str, model_type: str, *, no_fallback: bool = False) -> Resolution:
    """Apply a mode's model-family allowlist (e.g. symmetric turbo4 -> turbo4-asym)."""
    cls = get(mode)
    allow = getattr(cls, "allowlist", None)
    if allow is None or no_fallback:
        note = f"{cls.name} forced on {model_type} (--no-fallback)" if allow is not None and no_fallback else ""
        if allow is not None and _allowed(model_type, allow):
            note = ""
        return Resolution(cls.name, cls.name, note)
    if _allowed(model_type, allow):
        return Resolution(cls.name, cls.name)
    fb = cls.fallback
    note = (
        f"{cls.name} is only allowed for model families {', '.join(allow)}; "
        f"'{model_type}' runs as {fb} (pass --no-fallback to run {cls.name} anyway)"
    )
    return Resolution(cls.name, fb, note)


def _allowed(model_type: str, allow: tuple[str, ...]) -> bool:
    mt = (model_type or "").lower()
    return any(mt == a or mt.startswith(a + "_") for a in allow)


def boundary_layers(n_layers: int, boundary_v: int) -> set[int]:
    """Layers kept at fp16 by boundary-V protection (first N and last N, N <= n_layers // 2)."""
    n = max(0, min(boundary_v, n_layers // 2))
    return set(range(n)) | set(range(n_layers - n, n_layers))


def build_caches(
    mode: str,
    *,
    n_layers: int,
    batch: int,
    n_kv_heads: int,
    head_dim: int,
    dtype,
    device,
    capacity: int = 0,
    boundary_v: int | None = None,
    kernel: str = "reference",
    mode_options: dict | None = None,
    sparse_v: float = 0.0,
) -> list:
    """One cache per layer for `mode` (already resolved for the model).

    Boundary-V (modes that declare it): the first and last `boundary_v` layers
    keep fp16 K and V. `None` means the mode's default. `sparse_v`: every layer's decode
    steps skip V where the softmax weight is below it (0: off).
    """
    cls = get(mode)
    fp16_cls = get("fp16")
    protected: set[int] = set()
    if cls.boundary_v_applies:
        n = getattr(cls, "default_boundary_v", 2) if boundary_v is None else boundary_v
        protected = boundary_layers(n_layers, n)
    common = dict(
        batch=batch,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
        capacity=capacity,
        kernel=kernel,
        sparse_v=sparse_v,
    )
    caches = []
    for i in range(n_layers):
        if i in protected:
            caches.append(fp16_cls(layer_idx=i, **common))
        else:
            caches.append(cls(layer_idx=i, **common, **(mode_options or {})))
    return caches

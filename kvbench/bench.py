"""The decode-bench job: warmed decode speed and memory per mode, context and
batch, with ratios vs fp16 measured side by side in one process.

Per cell: build the caches, build the context (a real chunked prefill, timed on
its own, or random K/V for dummy models), decode `warmup` untimed tokens, then
time `repeats` windows of `gen` tokens. On CUDA the timing uses device
synchronisation around each window and the allocator's peak; on CPU, wall clock
and the process' peak RSS (labelled).
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from kvbench import prompts
from kvbench.engine.generate import KVCap, decode_one_token, prefill
from kvbench.engine.weights import fit_context, past_trained
from kvbench.errors import KvbenchError
from kvbench.results import BENCH_COLUMNS, DIGITS, join_notes
from kvbench.runtime import (
    Progress,
    available_bytes,
    dtype_name,
    is_oom,
    measure_bandwidth,
    one_line,
    peak_bytes,
    release,
    reset_peak,
    synchronize,
)
from kvbench.session import Session
from kvbench.sweep import FileSink, Sweep, key

GB = 1e9


def _against(row: dict, base: dict) -> None:
    """A row's speed and peak memory against fp16's (`base`) at the same context and batch."""
    row["decode_ratio_vs_fp16"] = round(row["decode_tok_s"] / base["decode_tok_s"], DIGITS)
    row["peak_delta_gb"] = round(row["peak_mem_gb"] - base["peak_mem_gb"], DIGITS)


def _floor_columns(floor_s: float, step_s: float) -> dict:
    """The bandwidth floor of a step and the fraction of it a step of `step_s` seconds reaches."""
    return {"floor_ms": round(floor_s * 1e3, DIGITS), "roofline_frac": round(floor_s / step_s, DIGITS)}


class BenchJob:
    def __init__(self, session: Session, progress: Progress, sweep: Sweep | None = None) -> None:
        self.s = session
        self.cfg = session.cfg
        self.p = progress
        self.sweep = sweep or Sweep(FileSink(session.writer("bench", BENCH_COLUMNS)))
        self.bandwidth = None
        c = self.cfg
        # everything besides mode, context and batch that changes a measurement
        self.params = key(
            session.weights_hash, dtype_name(session.dtype), c.kernel, c.cuda_graphs, c.pdl, c.gemv_kernel, c.prefill_chunk,
            c.boundary_v, c.no_fallback, c.yarn, c.gen, c.warmup, c.repeats, c.fill, c.max_kv_size, c.keep,
            *([c.sparse_v_threshold] if c.sparse_v_threshold else []),  # (keys of dense runs as before it existed)
        )  # fmt: skip

    @property
    def rows(self) -> list[dict]:
        return self.sweep.rows

    def groups(self) -> list:
        """Units of sharding: (context, batch) with all its modes; the capacity search."""
        out = [(ctx, b) for ctx in self.s.contexts for b in self.cfg.batch]
        return out + ([("capacity", max(self.s.contexts))] if self.cfg.capacity else [])

    def cell_key(self, mode: str, ctx: int, batch) -> str:
        return key("bench", mode, ctx, batch, self.params, *filter(None, [self.s.mode_digest(mode)]))

    def capacity_key(self, mode: str, ctx: int) -> str:
        timed = ["timed"] if self.times_capacity() else []  # a resumed search without timing is not reused
        return key("bench-capacity", mode, ctx, self.params, *filter(None, [self.s.mode_digest(mode)]), *timed)

    def group_keys(self, group) -> list[str]:
        """The keys of a group's cells (a group whose every key is in the results has nothing to run)."""
        if group[0] == "capacity":
            return [self.capacity_key(m, group[1]) for m in self.s.modes]
        return [self.cell_key(m, *group) for m in (*self.s.modes, *self.s.peers)]

    def n_cells(self) -> int:
        return sum(len(self.group_keys(g)) for g in self.groups())

    def fill_kind(self) -> str:
        if self.cfg.fill != "auto":
            return self.cfg.fill
        return "random" if self.s.lm.tokenizer is None else "prefill"  # no tokenizer (dummy:*): no text to prefill

    def run(self) -> list[dict]:
        todo = [g for g in self.groups() if self.sweep.wants(g)]
        if not todo:
            return self.rows
        self.p.log(f"measuring {self.s.device} copy bandwidth for the roofline ...")
        self.bandwidth = measure_bandwidth(self.s.device)
        for group in todo:
            if group[0] == "capacity":
                self._capacity_group(group[1])
                continue
            ctx, batch = group
            keys = {m: self.cell_key(m, ctx, batch) for m in self.s.modes}
            if all(self.sweep.is_done(k) for k in keys.values()):
                for _ in keys:
                    self.p.cell_done()
                continue
            rope_note = join_notes(
                fit_context(self.s.lm, ctx, self.cfg.yarn),
                past_trained(self.s.lm, ctx, self.s.total_positions(ctx), self.cfg.yarn),
            )
            base = None
            for mode in self.s.modes:  # fp16 first: every later cell's ratio is known when it is written
                done = self.sweep.is_done(keys[mode])
                if done and mode != "fp16":
                    self.p.cell_done()
                    continue
                row = self._cell(mode, ctx, batch, rope_note)
                row["cell"] = keys[mode]
                if mode == "fp16" and row["status"] == "ok":
                    base = row
                if base and row["status"] == "ok":
                    _against(row, base)
                    if base is not row and self.sweep.is_done(keys["fp16"]):
                        row["notes"] += "; ratio vs fp16 re-measured in this (resumed) run"
                if not done:
                    self.sweep.emit(row)
            for peer in self.s.peers:
                cell = self.cell_key(peer, ctx, batch)
                if self.sweep.is_done(cell):
                    self.p.cell_done()
                    continue
                row = self._peer_cell(peer, ctx, batch, rope_note)
                row["cell"] = cell
                if base and row["status"] == "ok":
                    _against(row, base)
                self.sweep.emit(row)
        return self.rows

    def _peer_cell(self, peer: str, ctx: int, batch: int, rope_note: str) -> dict:
        """A transformers cache through transformers' own decode loop, same weights and prompt."""
        from kvbench.peers import fit_peer_context, peer_decode_bench

        s, cfg = self.s, self.cfg
        self.sweep.start({"kv_cache_mode": peer, "context_tokens": ctx, "batch": batch})
        row = {
            **s.base_row,
            "context_tokens": ctx,
            "gen_tokens": cfg.gen,
            "kv_cache_mode": peer,
            "effective_mode": peer,
            "batch": batch,
            "repeats": cfg.repeats,
            "warmup": cfg.warmup,
            "kernel": "transformers",
            "cuda_graphs": False,
            "bandwidth_gbs": round(self.bandwidth / GB, 1),
            "prefill_source": "prefill",
        }
        notes = [rope_note] if rope_note else []
        self.p.step(f"{ctx} x{batch} {peer}: transformers", 1)
        try:
            hf = s.hf_model()
            note = fit_peer_context(hf, s.lm, ctx, cfg.yarn)
            out = peer_decode_bench(hf, peer, self._prompt(ctx, batch), cfg.warmup, cfg.gen, cfg.repeats, s.device)
            notes += [n for n in (note, out.pop("_note", "")) if n and n != rope_note]
            row.update(out, status="ok")
            if row.get("kv_bytes"):
                floor_s = (row["weight_bytes"] + row["kv_bytes"]) / self.bandwidth
                row.update(_floor_columns(floor_s, row["step_ms"] / 1e3))
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            row["status"] = "oom" if is_oom(exc) else "error"
            notes.append(str(exc) if isinstance(exc, KvbenchError) else one_line(exc))
        finally:
            release(s.device)
        row["notes"] = "; ".join(notes)
        self.p.cell_done()
        return row

    def times_capacity(self) -> bool:
        """Whether the capacity search also times the decode at each mode's largest batch: on CUDA, where the
        search allocates and decodes (off it the batch is arithmetic, far too large to time on a CPU)."""
        return bool(self.cfg.capacity_speed) and self.s.device.type == "cuda"

    def _capacity_group(self, ctx: int) -> None:
        rope_note = fit_context(self.s.lm, ctx, self.cfg.yarn)
        for mode in self.s.modes:
            cell = self.capacity_key(mode, ctx)
            if not self.sweep.is_done(cell):
                for r in self._capacity(mode, ctx, rope_note):
                    self.sweep.emit({**r, "cell": cell})
            self.p.cell_done()

    # ------------------------------------------------------------------ capacity
    def _fits(self, mode: str, ctx: int, batch: int) -> dict | None:
        """Allocate `batch` caches of `ctx` tokens and run two decode steps; None on OOM."""
        s = self.s
        if s.device.type != "cuda":  # a CPU allocation never fails: the OS kills the process instead
            # The caches the GPU search would allocate, built without storage: their buffers at capacity price
            # fixed side buffers too (turbo4-delegated's fp16 hot window), which a per-token price leaves out.
            try:
                meta = s.caches(mode, batch=batch, capacity=ctx + 4, device="meta")
                held = sum(c.capacity_nbytes() for c in meta)
                for c in meta:
                    c.pretend_filled(ctx)
                kv = sum(c.nbytes() for c in meta)  # the live tokens' bytes, as the GPU rows report them
            except (NotImplementedError, RuntimeError):  # a plugin's cache that needs storage to be built
                probe = s.caches(mode, batch=1, capacity=1)
                held = kv = batch * ctx * sum(c.bytes_per_token() for c in probe)
            if held > self._budget:  # the budget is what is free beside the (loaded) weights
                return None
            need = held + s.lm.weight_bytes()
            return {"kv_bytes": kv, "peak_mem_gb": round(need / GB, DIGITS), "peak_mem_kind": "cpu_estimate"}
        caches = step = tok = None
        try:
            reset_peak(s.device)
            caches = s.caches(mode, batch=batch, capacity=ctx + 4)
            for c in caches:
                c.pretend_filled(ctx)  # memory, not values, is what is measured here
            step = self._stepper(s.lm.model, caches, None, s.fused(caches), graphs=False)
            tok = torch.zeros(batch, 1, dtype=torch.long, device=s.device)
            for _ in range(2):
                tok = step(tok)
            synchronize(s.device)
            peak, kind = peak_bytes(s.device)
            if self._past_budget(peak):
                return None  # it ran, but past the memory the user allowed beside the weights
            return {
                "kv_bytes": sum(c.nbytes() for c in caches),
                "peak_mem_gb": round(peak / GB, DIGITS),
                "peak_mem_kind": kind,
            }
        except Exception as exc:
            if not is_oom(exc):
                raise
            return None
        finally:
            del caches, step, tok  # the decoder holds the caches too: drop both before releasing
            release(s.device)

    def _past_budget(self, peak: float) -> bool:
        """Whether a CUDA run's peak (bytes, weights included) went past --memory-budget-gb beside the weights."""
        return bool(self.cfg.memory_budget_gb) and peak - self.s.lm.weight_bytes() > self._budget

    def _room(self) -> str:
        """The search's budget in words: --memory-budget-gb as given where it is the bound, else the free memory."""
        user, budget = self.cfg.memory_budget_gb, self._budget
        if user and user * GB <= budget:  # the user's number as given: 19.85, not "19.9"
            return f"{user:.12g} GB (--memory-budget-gb)"
        gb = budget / GB  # 133.2, 0.05: a small budget is not rounded to "0.0 GB"
        room = (f"{gb:.1f}" if gb >= 1 else f"{gb:.3g}") + " GB"  # 0.01, 0.0002: never "0." nor "0.0"
        return room + (f" (free; --memory-budget-gb {user:.12g} is more)" if user else "")

    def _capacity(self, mode: str, ctx: int, rope_note: str) -> list[dict]:
        """The largest batch that fits at `ctx` (and the first that does not)."""
        s = self.s
        res = s.resolve(mode)
        label = f"capacity {ctx} {mode}"
        self.p.step(label, 1)
        budget = available_bytes(s.device)
        if self.cfg.memory_budget_gb:
            budget = min(budget, self.cfg.memory_budget_gb * GB)
        self._budget = budget
        probe = s.caches(res.effective, batch=1, capacity=1)
        per_seq = sum(c.bytes_per_token() for c in probe) * ctx
        del probe
        guess = max(1, int(budget * 0.97 // per_seq))
        lo, best, hi = search_largest(lambda b: self._fits(res.effective, ctx, b), guess)
        base = {
            **s.base_row,
            "context_tokens": ctx,
            "kv_cache_mode": mode,
            "effective_mode": res.effective,
            "boundary_v": s.boundary_v(res.effective),
            "sparse_v": s.sparse_v(res.effective),
            "weight_bytes": s.lm.weight_bytes(),
            "kernel": s.kernel,
        }
        how = "allocated and decoded" if s.device.type == "cuda" else "estimated from buffer sizes, not allocated"
        note = f"capacity search at {ctx} tokens: largest batch that fits in {self._room()} beside the weights ({how})"
        if best and hi is not None and hi - lo > 1:  # the probe limit reached first: say it is a bound
            note += f"; search stopped with batches {lo + 1}-{hi - 1} untried"
        elif best and hi is None:
            note += f"; no batch up to {lo} failed (the search stopped there)"
        notes = join_notes(rope_note, res.note, note)
        rows = []
        if best:
            rows.append({**base, **best, "batch": lo, "status": "ok", "notes": notes,
                         "kv_bytes_per_token": round(best["kv_bytes"] / (lo * ctx), 1)})  # fmt: skip
            if self.times_capacity():
                rows += self._time_capacity(rows[0], res.effective, ctx)
            elif self.cfg.capacity_speed:  # asked for (it is on by default), and the row says why it is not there
                rows[0]["notes"] = join_notes(notes, "its decode is timed on a GPU only (--capacity-speed)")
        if hi is not None:
            rows.append({**base, "batch": hi, "status": "oom", "notes": notes})
        return rows

    def _time_capacity(self, found: dict, mode: str, ctx: int, tries: int = 3) -> list[dict]:
        """Decode speed at the largest batch the search found (`found`, its row), measured as any cell is: a
        filled cache (random K/V: a prefill of that batch would need more memory than the decode), warm-up,
        CUDA graphs, repeats; the whole context held, as the search holds it (no --max-kv-size). The search's
        two steps fill nothing and capture no graph, so a batch may run out of memory here, or past
        --memory-budget-gb: then the next smaller one is timed, up to `tries` batches, in a row of its own.
        Updates `found` in place when its own batch is timed (its peak stays the search's, comparable across
        modes; the timed peak goes in its notes); returns the extra row, if any."""
        cfg, s, top = self.cfg, self.s, found["batch"]
        timing = {"gen_tokens": cfg.gen, "repeats": cfg.repeats, "warmup": cfg.warmup,
                  "bandwidth_gbs": round(self.bandwidth / GB, 1)}  # fmt: skip
        failed: list[str] = []  # why each tried batch did not run timed, from `top` down

        def tried() -> str:
            return "; ".join(f"batch {top - i}: {reason}" for i, reason in enumerate(failed))

        for batch in range(top, max(0, top - tries), -1):
            self.p.step(f"capacity {ctx} {found['kv_cache_mode']}: decode at batch {batch}", 1)
            notes: list[str] = []
            try:
                out = self._measure(mode, ctx, batch, notes, fill="random", capped=False)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                if is_oom(exc):
                    failed.append("out of memory")
                    continue
                found["notes"] = join_notes(found["notes"], f"decode not timed at batch {batch}: {one_line(exc)}")
                return []
            finally:
                release(s.device)
            gb = out["peak_mem_gb"]
            # the search's own test (`_fits`), on a measured GPU peak (a CPU row's peak is an estimate or the RSS)
            if out.get("peak_mem_kind") == "cuda_max_allocated" and self._past_budget(gb * GB):
                beside = gb - s.lm.weight_bytes() / GB
                failed.append(f"peak {gb:.4g} GB, {beside:.4g} GB beside the weights, past the {self._room()} budget")
                continue
            if batch == top:
                kept = {k: v for k, v in out.items() if k not in ("peak_mem_gb", "peak_mem_kind")}
                said = join_notes(
                    found["notes"], f"decode timed at batch {batch} (timed decode's peak {gb} GB)", *notes
                )
                found.update(kept, **timing, notes=said)
                return []
            how = "a filled cache with CUDA graphs" if out.get("cuda_graphs") else "a filled cache"
            why = f"batch {top} fit the search's two untimed steps, not {how} ({tried()})"
            said = f"decode timed at batch {batch}, the largest that ran timed ({why})"
            found["notes"] = join_notes(found["notes"], said)
            note = join_notes(found["notes"], *notes, f"peak is the timed decode's {gb} GB")
            return [{**found, **out, **timing, "batch": batch, "notes": note}]
        low = max(1, top - tries + 1)
        where = f"batch {top}" if low == top else f"batches {low}-{top}"
        found["notes"] = join_notes(found["notes"], f"decode not timed: {where} did not run timed ({tried()})")
        return []

    # ---------------------------------------------------------------------- cell
    def _cell(self, mode: str, ctx: int, batch: int, rope_note: str) -> dict:
        res = self.s.resolve(mode)
        cfg = self.cfg
        self.sweep.start(
            {"kv_cache_mode": mode, "context_tokens": ctx, "batch": batch, "cell": self.cell_key(mode, ctx, batch)}
        )
        row = {
            **self.s.base_row,
            "context_tokens": ctx,
            "gen_tokens": cfg.gen,
            "kv_cache_mode": mode,
            "effective_mode": res.effective,
            "batch": batch,
            "repeats": cfg.repeats,
            "warmup": cfg.warmup,
            "boundary_v": self.s.boundary_v(res.effective),
            "sparse_v": self.s.sparse_v(res.effective),
            "max_kv_size": cfg.max_kv_size,
            "keep": cfg.keep if cfg.max_kv_size else None,
            "weight_bytes": self.s.lm.weight_bytes(),
            "bandwidth_gbs": round(self.bandwidth / GB, 1),
        }
        notes = [n for n in (rope_note, res.note) if n]
        positions = self.s.total_positions(ctx)
        if cfg.max_kv_size and cfg.max_kv_size >= positions:  # the audit skips such a cap
            notes.append(
                f"the KV cap {cfg.max_kv_size} is never reached ({positions} positions): "
                "nothing is trimmed, this is the uncapped decode"
            )
        try:
            row.update(self._measure(res.effective, ctx, batch, notes))
            row["status"] = "ok"
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            row["status"] = "oom" if is_oom(exc) else "error"
            notes.append(one_line(exc))
        finally:
            release(self.s.device)
        row["notes"] = "; ".join(notes)
        self.p.cell_done()
        return row

    def _measure(
        self, mode: str, ctx: int, batch: int, notes: list[str], fill: str | None = None, capped: bool = True
    ) -> dict:
        """One cell's measurement; `fill` overrides --fill (the capacity search's timing fills random K/V);
        `capped=False` holds the whole context whatever --max-kv-size says (the capacity search's timing)."""
        cfg, s = self.cfg, self.s
        model, dev = s.lm.model, s.device
        label = f"{ctx} x{batch} {mode}"
        total = s.total_positions(ctx)
        limit = cfg.max_kv_size if capped else None
        reset_peak(dev)
        caches = s.caches(mode, batch=batch, capacity=min(total, limit or total) + 1)
        cap = KVCap(limit, cfg.keep) if limit else None
        forced, fill = fill, fill or self.fill_kind()
        out: dict = {"prefill_source": fill}
        self.p.step(f"{label}: {'prefill' if fill == 'prefill' else 'random K/V fill'}", ctx)
        synchronize(dev)
        t0 = time.perf_counter()
        if fill == "prefill":
            ids = self._prompt(ctx, batch)
            logits = prefill(model, ids, caches, cfg.prefill_chunk, cap, on_chunk=self.p.advance_to)
            synchronize(dev)
            secs = time.perf_counter() - t0
            out.update(prefill_ms=round(secs * 1e3, 2), prefill_tok_s=round(batch * ctx / secs, 1))
            tok = logits.argmax(-1, keepdim=True)
        else:
            random_fill(caches, ctx, s.lm.args, dev, s.dtype, cap=cap)
            why = (
                "random weights" if s.lm.synthetic
                else "no tokenizer" if s.lm.tokenizer is None
                else "the capacity search's timing" if forced
                else "--fill random"
            )  # fmt: skip
            notes.append(f"context filled with random K/V (no prefill; {why})")
            tok = torch.randint(3, s.lm.args.vocab_size, (batch, 1), device=dev)
        filled = caches[0].live  # the context's tokens (a cap's live window); KV bytes are read after the decode

        fused = s.fused(caches)
        out["kernel"] = s.kernel if fused else "reference"
        out["cuda_graphs"] = fused and cfg.cuda_graphs
        if fused:
            from kvbench.kernels.launch import pdl_supported  # imports triton: only on the GPU path

            if not (cfg.pdl and pdl_supported(dev)):
                notes.append("kernels launched without programmatic dependent launch (--no-pdl or before sm_90)")
            from kvbench.kernels.decode_attention import CONFIG_ENV, config_overrides
            from kvbench.kernels.gemv import GEMV_ENV, gemv_enabled

            if dev.type == "cuda" and not (cfg.gemv_kernel and gemv_enabled(dev)):
                notes.append(f"projections through cuBLAS (--no-gemv-kernel or {GEMV_ENV}=cublas), not the GEMV kernel")

            over = config_overrides()
            knobs = {m: over[m] for m in {c.kernel_mode for c in caches} & over.keys()}
            if knobs:
                notes.append(f"attention launch knobs from {CONFIG_ENV}: {json.dumps(knobs, sort_keys=True)}")
        step = self._stepper(model, caches, cap, fused)
        self.p.step(f"{label}: warmup", cfg.warmup)
        for i in range(cfg.warmup):
            tok = step(tok)
            self.p.advance_to(i + 1)
        synchronize(dev)
        speeds = []
        self.p.step(f"{label}: decode x{cfg.repeats}", cfg.gen * cfg.repeats)
        for r in range(cfg.repeats):
            synchronize(dev)
            t0 = time.perf_counter()
            for _ in range(cfg.gen):
                tok = step(tok)
            synchronize(dev)
            speeds.append(batch * cfg.gen / (time.perf_counter() - t0))
            self.p.advance_to((r + 1) * cfg.gen)
        med = statistics.median(speeds)
        peak, kind = peak_bytes(dev)
        step_s = batch / med
        # KV bytes as the timed steps held them: a delegated cache folds its fp16 body into the cold form at its
        # first decode step (read at the fill, it was all fp16: "same as fp16", the audit's rows said otherwise)
        per_token = sum(c.nbytes() for c in caches) / (batch * caches[0].live)
        kv_bytes = round(per_token * batch * filled)
        out["kv_bytes"], out["kv_bytes_per_token"] = kv_bytes, round(per_token, 1)
        floor_s = (s.lm.weight_bytes() + kv_bytes) / self.bandwidth
        notes.append(f"decode positions {ctx + cfg.warmup}..{caches[0].offset - 1}")  # the timed steps' own
        if cfg.warmup == 0:
            notes.append("no warmup (--warmup 0): one-time costs (allocation, compilation) fall in the timed steps")
        out.update(
            decode_tok_s=round(med, 3),
            decode_tok_s_min=round(min(speeds), 3),
            decode_tok_s_max=round(max(speeds), 3),
            decode_ms=round(cfg.gen * step_s * 1e3, 3),
            step_ms=round(step_s * 1e3, DIGITS),
            **_floor_columns(floor_s, step_s),
            peak_mem_gb=round(peak / GB, DIGITS),
            peak_mem_kind=kind,
        )
        return out

    def _prompt(self, ctx: int, batch: int) -> torch.Tensor:
        lm = self.s.lm
        if lm.tokenizer is None:
            return prompts.synthetic_prompt(lm.args.vocab_size, ctx, batch).to(self.s.device)
        ids = prompts.build_prompt(lm.tokenizer, ctx)
        return ids.expand(batch, -1).contiguous().to(self.s.device)

    def _stepper(self, model, caches, cap, fused: bool, graphs: bool | None = None):
        """tok [B, 1] -> next tok; on the fused path the decoder feeds its own argmax."""
        if fused:
            from kvbench.engine.fast_decode import FastDecoder

            graphs = self.cfg.cuda_graphs if graphs is None else graphs
            dec = FastDecoder(
                model, caches, caches[0].batch, cuda_graphs=graphs, cap=cap, pdl=self.cfg.pdl, gemv=self.cfg.gemv_kernel
            )

            def fused_step(tok):
                dec.step(tok)
                return None

            return fused_step

        def step(tok):
            return decode_one_token(model, tok, caches, cap).argmax(-1, keepdim=True)

        return step


@torch.inference_mode()
def random_fill(
    caches: list, n_tokens: int, args, device, dtype, chunk: int = 2048, seed: int = 0, cap: KVCap | None = None
) -> None:
    """Append `n_tokens` of random K/V (roughly unit-scale, like post-RoPE keys)
    through each mode's own store path, in chunks to bound the extra memory. With `cap`
    (--max-kv-size) the cache is trimmed around each chunk as a prefill's would be."""
    g = torch.Generator(device=device).manual_seed(seed)
    b, h, d = caches[0].batch, args.n_kv_heads, args.head_dim
    if cap is not None:  # a chunk never outgrows the capped cache's buffers
        chunk = max(1, min(chunk, cap.max_size - cap.keep))
    for start in range(0, n_tokens, chunk):
        t = min(chunk, n_tokens - start)
        if cap is not None:
            cap.before(caches, t)
        for c in caches:
            k = torch.randn((b, h, t, d), generator=g, device=device, dtype=torch.float32).to(dtype)
            v = torch.randn((b, h, t, d), generator=g, device=device, dtype=torch.float32).to(dtype)
            c.append(k, v)
        if cap is not None:
            cap.after(caches)


def search_largest(fits, guess: int, max_probes: int = 64) -> tuple[int, object, int | None]:
    """The largest n >= 1 with `fits(n)` truthy (n's result) and the smallest that fails, searched from an
    estimate: steps away from `guess` that double until the answer is bracketed, then bisection down to
    neighbours. Returns (largest fitting n or 0, its result, first failing n or None when none failed within
    `max_probes`). A guess within a few percent of the answer costs ~2*log2(guess/64) probes; a wild one
    still converges (steps double)."""
    lo, best, hi = 0, None, None  # lo fits (0: nothing fit yet), hi does not
    step = max(1, guess // 64)
    b, probes = max(1, guess), 0
    while probes < max_probes:
        got = fits(b)
        probes += 1
        if got:
            lo, best = b, got
        else:
            hi = b
        if hi is not None and hi - lo <= 1:
            break
        if hi is None:  # every probe so far fits: step up
            b, step = lo + step, step * 2
        elif best is None:  # every probe so far fails: step down (not below 1)
            b, step = max(1, hi - step), step * 2
            if b == hi:  # 1 failed
                break
        else:
            b = (lo + hi) // 2
    return lo, best, hi

"""The audit job: for each context, every mode decodes greedily from the same
prompt and is compared with fp16 (greedy match, teacher-forced top-1 agreement
and KL, degeneracy). Optional checks, each its own rows (`check` column):

- `ppl`: perplexity over non-overlapping windows of the bundled text;
- `max_kv`: a live-KV cap with `--keep` sink tokens and with none (keep=0, the
  seed engine's bug), judged by the degenerate-output detector;
- `prefix_reuse`: a prefix prefilled once, adopted by a second request that
  prefills only its suffix, vs a fresh prefill of the same tokens;
- `niah`: a needle at several depths of the haystack, found or not.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kvbench import prompts, quality
from kvbench.config import read_utf8
from kvbench.engine.generate import KVCap, forward_chunk, greedy_decode, prefill, teacher_forced
from kvbench.engine.weights import fit_context, load_model, past_trained
from kvbench.errors import KvbenchError
from kvbench.results import AUDIT_COLUMNS, join_notes
from kvbench.runtime import Progress, dtype_name, is_oom, one_line, release
from kvbench.session import Session
from kvbench.sweep import FileSink, Sweep, key

NEEDLE = "The special magic number is {n}."
NEEDLE_QUESTION = "What is the special magic number mentioned in the text above? Answer with the number only."
NIAH_GEN = 24


@dataclass
class Reference:
    """fp16's greedy run at one context: what every mode is compared with."""

    tokens: torch.Tensor  # [n]
    logits: torch.Tensor  # [n, V] float32, on CPU
    text: str
    n_compare: int  # positions compared (up to and including fp16's first EOS)
    degenerate: bool = False  # fp16's own output trips the detector (random weights, a looping model)


@dataclass
class Run:
    tokens: torch.Tensor  # [n] on CPU
    logits: torch.Tensor  # [n, V] on CPU
    caches: list
    first: torch.Tensor  # the prefill's last logits [1, V]
    snapshot: list | None  # caches right after prefill (for teacher forcing)


class AuditJob:
    def __init__(self, session: Session, progress: Progress, sweep: Sweep | None = None) -> None:
        self.s = session
        self.cfg = session.cfg
        self.p = progress
        self.sweep = sweep or Sweep(FileSink(session.writer("audit", AUDIT_COLUMNS)))
        c = self.cfg
        # everything besides mode, context and check that changes an audit cell's result
        self.params = key(
            session.weights_hash, dtype_name(session.dtype), c.kernel, c.prefill_chunk, c.boundary_v,
            c.no_fallback, c.yarn, c.gen_tokens, c.near_tie_margin, c.question, c.prompt_file, c.max_kv_size, c.keep,
            *([c.sparse_v_threshold] if c.sparse_v_threshold else []),  # (keys of dense runs as before it existed)
            *filter(None, [session.prompt_digest()]),  # the prompt file's contents (keys without one as before)
        )  # fmt: skip
        self._ref_tokens = None  # fp16's greedy tokens at the current context (peers are forced on them)
        self._shared_prefill = None  # (prompt, per-layer fresh K/V, last logits) of a one-chunk prompt
        self._lm32 = None  # the model in float32: the kernel check's yardstick (`_fp32_yardstick`)
        self.question = self.cfg.question or prompts.DEFAULT_QUESTION
        self._passage = self._read_prompt_file()
        if self.cfg.contexts is None and self._passage is not None:
            # a user's prompt runs at its own length unless --contexts says otherwise
            session.contexts = [self.natural_length()]

    @property
    def rows(self) -> list[dict]:
        return self.sweep.rows

    # ----------------------------------------------------------------- planning
    def groups(self) -> list:
        """Units of sharding: one context each (fp16, the reference, runs with its modes)."""
        return list(self.s.contexts)

    def cell_key(self, mode: str, ctx: int, check: str, cap: KVCap | None = None, extra="") -> str:
        capk = f"{cap.max_size}/{cap.keep}" if cap else ""
        return key("audit", check, mode, ctx, capk, extra, self.params, *filter(None, [self.s.mode_digest(mode)]))

    def group_keys(self, ctx: int) -> list[str]:
        """The keys of a context's cells (a context whose every key is in the results has nothing to run)."""
        keys = [self.cell_key(p, ctx, "greedy", self._cap()) for p in self.s.peers]
        for mode in self.s.modes:
            keys.append(self.cell_key(mode, ctx, "greedy", self._cap()))
            for max_kv in self.cfg.kv_caps:
                for keep in dict.fromkeys((self.cfg.keep, 0)):
                    keys.append(self.cell_key(mode, ctx, "max_kv", KVCap(max_kv, keep)))
            for check, on in (("kernel", self.cfg.compare_kernels), ("prefix_reuse", self.cfg.prefix_reuse)):
                if on:
                    keys.append(self.cell_key(mode, ctx, check))
            if self.cfg.niah:
                keys += [self.cell_key(mode, ctx, "niah", extra=d) for d in self.cfg.niah_depths]
            if self.cfg.ppl:
                keys.append(self.cell_key(mode, ctx, "ppl"))
        return keys

    def n_cells(self) -> int:
        return sum(len(self.group_keys(ctx)) for ctx in self.s.contexts)

    def _read_prompt_file(self):
        if not self.cfg.prompt_file:
            return None
        try:
            text = read_utf8(Path(self.cfg.prompt_file))
        except KvbenchError as exc:
            raise KvbenchError(f"--prompt-file: {exc}") from None
        if self.s.lm.tokenizer is None:
            raise KvbenchError("--prompt-file needs a model with a tokenizer")
        ids = self.s.lm.tokenizer(text, add_special_tokens=False).input_ids
        if not ids:
            raise KvbenchError(f"--prompt-file: {self.cfg.prompt_file} holds no text")
        return ids

    def natural_length(self) -> int:
        pre, post = prompts._chat_parts(self.s.lm.tokenizer, self.question)
        return len(pre) + len(self._passage) + len(post)

    def prompt(self, context: int) -> torch.Tensor:
        lm = self.s.lm
        if lm.tokenizer is None:
            ids = prompts.synthetic_prompt(lm.args.vocab_size, context)
        else:
            try:
                ids = prompts.build_prompt(lm.tokenizer, context, question=self.question, passage_ids=self._passage)
            except KvbenchError as exc:
                if self._passage is None:
                    raise
                raise KvbenchError(f"--prompt-file {self.cfg.prompt_file}: {exc}") from None
        return ids.to(self.s.device)

    def decode_text(self, tokens: list[int]) -> str:
        tok = self.s.lm.tokenizer
        if tok is None:
            return " ".join(map(str, tokens))
        eos = tok.eos_token_id
        if eos is not None and eos in tokens:
            tokens = tokens[: tokens.index(eos)]
        return tok.decode(tokens, skip_special_tokens=True)

    # --------------------------------------------------------------------- run
    def preflight(self) -> None:
        """Build every context's prompts before any cell runs: a prompt file or a needle prompt that cannot fill
        one context is a one-line error now, not after the shorter contexts' work."""
        if self.cfg.question is not None and self.s.lm.tokenizer is None:  # the prompt is random token ids
            raise KvbenchError("--question needs a model with a tokenizer (a dummy model's prompts are random ids)")
        for ctx in self.s.contexts:
            if self.sweep.wants(ctx):
                self.prompt(ctx)
                if self.cfg.niah and self.s.lm.tokenizer is not None:
                    self.niah_prompt(ctx, 0.5, 0)

    def run(self) -> list[dict]:
        for ctx in self.s.contexts:
            if not self.sweep.wants(ctx):
                continue
            if all(self.sweep.is_done(k) for k in self.group_keys(ctx)):
                for _ in self.group_keys(ctx):
                    self.p.cell_done()
                continue
            rope_note = fit_context(self.s.lm, ctx, self.cfg.yarn)
            lm, yarn = self.s.lm, self.cfg.yarn  # where the decoded tokens run past the trained positions, say so
            decode_note = join_notes(rope_note, past_trained(lm, ctx, ctx + self.cfg.gen_tokens, yarn))
            ids = self.prompt(ctx)
            ref = self._greedy_sweep(ctx, ids, decode_note, "greedy", cap=self._cap())
            if ref is None:
                continue
            for max_kv in self.cfg.kv_caps:
                for keep in dict.fromkeys((self.cfg.keep, 0)):
                    cap = KVCap(max_kv, keep)
                    if max_kv >= ctx + self.cfg.gen_tokens:  # the cache never fills: a row would test nothing
                        why = (
                            f"--kv-cap-check {max_kv} >= context + generated tokens ({ctx + self.cfg.gen_tokens}): "
                            "the cache never fills, so nothing is trimmed; give a size below the context"
                        )
                        for mode in self.s.modes:
                            self._skip(mode, ctx, "max_kv", why, cap)
                        continue
                    self._greedy_sweep(ctx, ids, decode_note, "max_kv", cap=cap)
            if self.cfg.compare_kernels:
                self._compare_kernels(ctx, ids, ref, decode_note)
            if self.cfg.prefix_reuse:
                self._prefix_reuse(ctx, ids, decode_note)
            if self.cfg.niah:
                self._niah(ctx, join_notes(rope_note, past_trained(lm, ctx, ctx + NIAH_GEN, yarn)))
            if self.cfg.ppl:
                self._ppl(ctx, rope_note)
        return self.rows

    # ------------------------------------------------------------- row helpers
    def _base(self, mode: str, ctx: int, check: str, cap: KVCap | None = None) -> dict:
        res = self.s.resolve(mode)
        return {
            **self.s.base_row,
            "kv_cache_mode": mode,
            "effective_mode": res.effective,
            "context_tokens": ctx,
            "gen_tokens": self.cfg.gen_tokens,
            "check": check,
            "batch": 1,
            "boundary_v": self.s.boundary_v(res.effective),
            "sparse_v": self.s.sparse_v(res.effective),
            "max_kv_size": cap.max_size if cap else None,
            "keep": cap.keep if cap else None,
        }

    def _emit(self, row: dict) -> None:
        row = {k: v for k, v in row.items() if not k.startswith("_")}
        self.sweep.emit(row)
        self.p.cell_done()

    def _skip(self, mode, ctx, check, why, cap=None, extra="", **fields) -> None:
        cell = self.cell_key(mode, ctx, check, cap, extra)
        if self.sweep.is_done(cell):
            self.p.cell_done()
            return
        self._emit({**self._base(mode, ctx, check, cap), **fields, "cell": cell, "status": "skipped", "notes": why})

    def _cell(
        self, mode: str, ctx: int, check: str, rope_note: str, work, cap: KVCap | None = None, extra=""
    ) -> dict | None:
        """Run `work(effective_mode) -> dict` as one isolated cell and emit its row.

        A cell already in the results (--resume) is skipped, except fp16's, which
        is re-run without a row when other cells still need it as their reference.
        """
        cell = self.cell_key(mode, ctx, check, cap, extra)
        silent = self.sweep.is_done(cell)
        if silent and (mode != "fp16" or check not in ("greedy", "max_kv", "ppl")):
            self.p.cell_done()
            return None
        row = self._base(mode, ctx, check, cap)
        row["cell"] = cell
        self.sweep.start({k: row[k] for k in ("kv_cache_mode", "context_tokens", "check", "cell", "date")})
        res = self.s.resolve(mode)
        notes = [n for n in (rope_note, res.note, *self.s.lm.notes) if n]
        t0 = time.perf_counter()
        try:
            row.update(work(res.effective))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one cell's failure is a row, not the end of the sweep
            row["status"] = "oom" if is_oom(exc) else "error"
            notes.append(one_line(exc))
            release(self.s.device)
        row["elapsed_s"] = round(time.perf_counter() - t0, 2)
        if row.get("status") not in ("oom", "error", "skipped"):
            row["status"] = _status(row, mode, res.effective)
        if row.get("_note"):
            notes.append(row["_note"])
        row["notes"] = "; ".join(notes)
        if silent:
            self.p.cell_done()
        else:
            self._emit(row)
        return row

    def _cap(self) -> KVCap | None:
        return KVCap(self.cfg.max_kv_size, self.cfg.keep) if self.cfg.max_kv_size else None

    # ------------------------------------------------------------- one decode
    def _decode(self, mode: str, ids: torch.Tensor, gen: int, cap: KVCap | None, label: str, snapshot=False) -> Run:
        caches = self.s.caches(mode, capacity=ids.shape[1] + gen)
        self.p.step(f"{label}: prefill", ids.shape[1])
        first = self._prefill(caches, ids, cap)
        snap = [c.clone() for c in caches] if snapshot else None
        self.p.step(f"{label}: decode", gen)
        step = self.s.stepper(caches, cap)
        toks, logits = greedy_decode(self.s.lm.model, first, caches, gen, cap, self.p.advance_to, step)
        return Run(toks[0].cpu(), logits[0].cpu(), caches, first, snap)

    def _prefill(self, caches: list, ids: torch.Tensor, cap: KVCap | None) -> torch.Tensor:
        """Prefill; a prompt that fits one chunk is computed once and its fresh K/V
        written into every mode's cache (each mode's single-chunk prefill attends
        only to those full-precision K/V, so the result is the same)."""
        model, chunk = self.s.lm.model, self.cfg.prefill_chunk
        one_chunk = chunk == 0 or ids.shape[1] <= chunk
        if cap is not None or not one_chunk:
            return prefill(model, ids, caches, chunk, cap, on_chunk=self.p.advance_to)
        shared = self._shared_prefill
        if shared is None or shared[0] is not ids:
            record: list = []
            with torch.inference_mode():
                logits = forward_chunk(model, ids, self.s.caches("fp16", capacity=ids.shape[1]), record=record)
            self._shared_prefill = shared = (ids, record, logits[:, -1])
        for cache, (k, v) in zip(caches, shared[1]):
            cache.append(k, v)
        self.p.advance_to(ids.shape[1])
        return shared[2].clone()

    def _degenerate(self, toks: list[int], text: str):
        if self.s.lm.tokenizer is None:
            return quality.detect_degenerate(tokens=toks)
        return quality.detect_degenerate(text, question=self.question)

    # ------------------------------------------------------ greedy vs reference
    def _greedy_sweep(self, ctx, ids, rope_note, check, cap) -> Reference | None:
        """fp16 first (the reference), then every other mode against it."""
        ref = None
        for mode in self.s.modes:
            if mode != "fp16" and ref is None:
                self._skip(mode, ctx, check, "fp16 reference failed", cap)
                continue
            box = {}

            def work(effective, mode=mode, box=box, ref=ref):
                out = self._compare(effective, ctx, ids, ref, cap, f"{ctx} {check} {mode}")
                box["ref"] = out.pop("_ref", None)
                return out

            row = self._cell(mode, ctx, check, rope_note, work, cap)
            if mode == "fp16" and row is not None:
                ref = box.get("ref")
                self._ref_tokens = ref.tokens if ref is not None else None
        if check == "greedy":
            for peer in self.s.peers:
                if ref is None:
                    self._skip(peer, ctx, check, "fp16 reference failed", cap)
                    continue

                def peer_work(effective, peer=peer, ref=ref):
                    return self._compare(peer, ctx, ids, ref, cap, f"{ctx} {check} {peer}")

                self._cell(peer, ctx, check, rope_note, peer_work, cap)
        return ref

    def _compare(self, mode, ctx, ids, ref: Reference | None, cap, label) -> dict:
        """Decode with `mode` (a kvbench mode or a transformers peer) and judge it against fp16."""
        gen = self.cfg.gen_tokens
        if mode.startswith("hf:"):
            toks, logits, forced_fn, out = self._peer_run(mode, ctx, ids, cap, label)
        else:
            run = self._decode(mode, ids, gen, cap, label, snapshot=ref is not None)
            toks, logits = run.tokens, run.logits
            kv_bytes = sum(c.nbytes() for c in run.caches)
            out = {"kv_bytes": kv_bytes, "kv_bytes_per_token": round(kv_bytes / max(1, run.caches[0].live), 1)}

            def forced_fn(run=run):
                del run.caches  # free them before the second pass
                return teacher_forced(
                    self.s.lm.model,
                    run.first,
                    run.snapshot,
                    ref.tokens[None].to(ids.device),
                    cap,
                    self.p.advance_to,
                    self.s.stepper(run.snapshot, cap),
                )[0].cpu()

        text = self.decode_text(toks.tolist())
        deg = self._degenerate(toks.tolist(), text)
        out.update(output_text=text, degenerate=deg.degenerate, degenerate_reason=deg.reason)
        if ref is None:  # this is fp16 itself
            n_compare = _compare_len(toks.tolist(), self.s.lm.tokenizer)
            out["_ref"] = Reference(toks, logits, text, n_compare, degenerate=deg.degenerate)
            out.update(identical_to_fp16=True, token_match=1.0, top1_agreement=1.0, kl_div=0.0)
            out["verdict"] = "degenerate" if deg.degenerate else "identical"
            return out
        n = ref.n_compare
        div = quality.first_divergence(ref.tokens[:n].tolist(), toks[:n].tolist())
        forced = logits  # while tokens agree the greedy pass *is* the teacher-forced pass
        if div is not None:
            self.p.step(f"{label}: teacher-forced", gen)
            forced = forced_fn()
        near_tie = div is not None and quality.top2_margin(ref.logits[div]) < self.cfg.near_tie_margin
        out.update(
            identical_to_fp16=div is None,
            first_divergence=div,
            near_tie=near_tie,
            token_match=round(quality.token_match(ref.tokens[:n].tolist(), toks[:n].tolist()), 4),
            top1_agreement=round(quality.top1_agreement(ref.tokens[:n], forced[:n]), 4),
            kl_div=quality.kl_divergence(ref.logits[:n], forced[:n]),
        )
        # The detector's point is a mode that breaks what fp16 got right (the seed's "the function of the
        # function of ..."). Where fp16's own output trips it, a mode's is no evidence against the mode: the
        # flag stays, the verdict comes from the comparison. A capped cache's reference is capped too, and
        # there its collapse is the finding, so the max-kv check keeps the verdict.
        inherited = deg.degenerate and ref.degenerate and cap is None
        if inherited:
            out["degenerate_reason"] = f"{deg.reason}; so is fp16's output"
        if deg.degenerate and not inherited:
            out["verdict"] = "degenerate"
        elif div is None:
            out["verdict"] = "identical"
        else:
            out["verdict"] = "near-tie" if near_tie else "diverged"
        return out

    def _peer_run(self, peer, ctx, ids, cap, label):
        """A transformers cache on transformers' own model with the same weights."""
        from kvbench.peers import check_peer, fit_peer_context, peer_generate, peer_teacher_forced

        if cap is not None:
            raise KvbenchError(f"{peer}: transformers' caches have no --max-kv-size")
        spec = check_peer(peer)  # a missing backend is a one-line error row
        hf = self.s.hf_model()
        note = fit_peer_context(hf, self.s.lm, ctx, self.cfg.yarn)
        self.p.step(f"{label}: transformers generate", self.cfg.gen_tokens)
        toks, logits = peer_generate(hf, peer, ids, self.cfg.gen_tokens)
        ref_tokens = self._ref_tokens

        def forced_fn():
            return peer_teacher_forced(hf, peer, ids, ref_tokens)

        out = {"kernel": "transformers", "_note": join_notes(spec.settings(), note)}
        return toks, logits, forced_fn, out

    # ---------------------------------------------------- kernel vs reference
    def _compare_kernels(self, ctx: int, ids: torch.Tensor, ref: Reference, rope_note: str) -> None:
        """The fused Triton path and the PyTorch reference path, teacher-forced on
        fp16's greedy tokens: the audit's "fallback path" column."""
        model = self.s.lm.model
        gen = self.cfg.gen_tokens
        forced = ref.tokens[None].to(ids.device)

        def path(mode, kernel):
            caches = self.s.caches(mode, capacity=ids.shape[1] + gen, kernel=kernel)
            first = prefill(model, ids, caches, self.cfg.prefill_chunk)
            fused = kernel == "triton"
            if fused and not self.s.fused(caches):
                raise KvbenchError(f"{mode} has no fused kernel path")
            step = self.s.stepper(caches, fused=fused)
            return teacher_forced(model, first, caches, forced, step=step)[0].cpu()

        def work(mode):
            if self.s.device.type != "cuda":
                return {"status": "skipped", "_note": "the Triton path needs a CUDA GPU"}
            yard = self.s.dtype != torch.float32
            self.p.step(f"{ctx} kernel-vs-reference {mode}", 2 + yard)
            a = path(mode, "reference")
            self.p.advance_to(1)
            b = path(mode, "triton")
            self.p.advance_to(2)
            y, y_note = self._fp32_yardstick(mode, ctx, ids, forced) if yard else (None, "")
            self.p.advance_to(2 + yard)
            agree = quality.path_agreement(a, b, self.cfg.near_tie_margin, yardstick=y)
            diff = (a - b).abs().max().item()
            flips = (
                f"; {agree.flips} argmax flip(s), reference top-2 margin <= {agree.worst_margin:.3g}"
                if agree.flips
                else ""
            )
            return {
                "kernel": "triton vs reference",
                "kernel_agrees": agree.agrees,
                "top1_agreement": round((a.argmax(-1) == b.argmax(-1)).float().mean().item(), 4),
                "kl_div": agree.kl,
                "kl_ref_fp32": agree.kl_ref_fp32,
                "kl_kernel_fp32": agree.kl_kernel_fp32,
                "verdict": agree.verdict,
                "_note": "; ".join(
                    n
                    for n in (
                        f"teacher-forced on fp16's {gen} tokens; max |logit difference| {diff:.3g}{flips}",
                        y_note,
                    )
                    if n
                ),
            }

        try:
            for mode in self.s.modes:
                self._cell(mode, ctx, "kernel", rope_note, work)
        finally:
            self._lm32 = None  # the float32 copy lives for one context's checks only
            release(self.s.device)

    def _fp32_yardstick(self, mode: str, ctx: int, ids: torch.Tensor, forced: torch.Tensor):
        """The kernel check's yardstick: `mode` through the reference path with the model and the cache in
        float32, teacher-forced on the same tokens. Returns (logits [n, V] on the CPU, "") or (None, why not):
        the check then falls back to the KL between the two paths alone."""
        try:
            if self._lm32 is None:
                self._lm32 = load_model(self.cfg.model, device=self.s.device, dtype=torch.float32)
            lm = self._lm32
            fit_context(lm, ctx, self.cfg.yarn)
            caches = self.s.caches(
                mode, capacity=ids.shape[1] + forced.shape[1], kernel="reference", dtype=torch.float32
            )
            first = prefill(lm.model, ids, caches, self.cfg.prefill_chunk)
            return teacher_forced(lm.model, first, caches, forced)[0].cpu(), ""
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # the yardstick is extra evidence: without it the check still stands
            self._lm32 = None
            release(self.s.device)
            why = "out of memory" if is_oom(exc) else one_line(exc)
            return None, f"no float32 yardstick ({why}): judged by the KL between the paths alone"

    # ------------------------------------------------------------ prefix reuse
    def _prefix_reuse(self, ctx: int, ids: torch.Tensor, rope_note: str) -> None:
        """Request A prefills the prompt without its question and donates its KV;
        request B adopts it and prefills only the question. B's greedy output is
        compared with a fresh prefill of the same tokens in the same chunks."""
        n_suffix = len(prompts._chat_parts(self.s.lm.tokenizer, self.question)[1]) if self.s.lm.tokenizer else 16
        split = ids.shape[1] - n_suffix
        gen = self.cfg.gen_tokens
        model = self.s.lm.model

        def work(mode):
            label = f"{ctx} prefix-reuse {mode}"
            donor = self.s.caches(mode, capacity=ids.shape[1] + gen)
            self.p.step(f"{label}: prefill prefix", split)
            prefill(model, ids[:, :split], donor, self.cfg.prefill_chunk, on_chunk=self.p.advance_to)
            adopter = self.s.caches(mode, capacity=ids.shape[1] + gen)
            for mine, theirs in zip(adopter, donor):
                mine.copy_from(theirs)
            cached = adopter[0].live
            del donor
            first = prefill(model, ids[:, split:], adopter, self.cfg.prefill_chunk)
            reused, _ = greedy_decode(model, first, adopter, gen, step=self.s.stepper(adopter))
            del adopter
            fresh_caches = self.s.caches(mode, capacity=ids.shape[1] + gen)
            prefill(model, ids[:, :split], fresh_caches, self.cfg.prefill_chunk)
            first = prefill(model, ids[:, split:], fresh_caches, self.cfg.prefill_chunk)
            fresh, _ = greedy_decode(model, first, fresh_caches, gen, step=self.s.stepper(fresh_caches))
            a, b = fresh[0].tolist(), reused[0].tolist()
            div = quality.first_divergence(a, b)
            return {
                "cached_tokens": cached,
                "identical_to_fp16": None,
                "first_divergence": div,
                "token_match": round(quality.token_match(a, b), 4),
                "verdict": "identical" if div is None else "diverged",
                "output_text": self.decode_text(b),
                "_note": f"reused {cached} cached tokens; compared with a fresh prefill of the same {ids.shape[1]} tokens",
            }

        for mode in self.s.modes:
            self._cell(mode, ctx, "prefix_reuse", rope_note, work)

    # ---------------------------------------------------- needle in a haystack
    def niah_prompt(self, ctx: int, depth: float, number: int) -> torch.Tensor:
        tok = self.s.lm.tokenizer
        needle = tok(" " + NEEDLE.format(n=number) + " ", add_special_tokens=False).input_ids
        pre, post = prompts._chat_parts(tok, NEEDLE_QUESTION)
        room = ctx - len(pre) - len(post) - len(needle)
        if room < 16:
            need = ctx - room + 16
            raise KvbenchError(f"--niah: context {ctx} is too short for a needle-in-a-haystack prompt (needs {need}+)")
        hay = prompts.text_ids(tok)[:room]
        at = round(depth * room)
        # move the needle to a sentence boundary near the requested depth
        period = tok(".", add_special_tokens=False).input_ids[-1]
        for j in range(at, max(0, at - 64), -1):
            if j == 0 or hay[j - 1] == period:
                at = j
                break
        return torch.tensor([pre + hay[:at] + needle + hay[at:] + post], device=self.s.device)

    def _niah(self, ctx: int, rope_note: str) -> None:
        if self.s.lm.tokenizer is None:
            for depth in self.cfg.niah_depths:
                for mode in self.s.modes:
                    self._skip(mode, ctx, "niah", "no tokenizer", extra=depth, niah_depth=depth)
            return
        for i, depth in enumerate(self.cfg.niah_depths):
            number = 7000 + 137 * (i + 1) + ctx % 997  # a different needle per cell
            ids = self.niah_prompt(ctx, depth, number)

            def work(mode, ids=ids, number=number, depth=depth):
                run = self._decode(mode, ids, NIAH_GEN, None, f"{ctx} niah {depth:.0%} {mode}")
                text = self.decode_text(run.tokens.tolist())
                hit = str(number) in text
                return {"niah_depth": depth, "niah_hit": hit, "output_text": text, "gen_tokens": NIAH_GEN}

            for mode in self.s.modes:
                self._cell(mode, ctx, "niah", rope_note, work, extra=depth)

    # -------------------------------------------------------------- perplexity
    def _ppl(self, ctx: int, rope_note: str) -> None:
        lm = self.s.lm
        if lm.tokenizer is None:
            for mode in self.s.modes:
                self._skip(mode, ctx, "ppl", "no tokenizer")
            return
        # the text the audit reads: --prompt-file's when given (the user's domain), else the bundled novel
        text = self._passage if self._passage is not None else prompts.text_ids(lm.tokenizer)
        source = f"of {Path(self.cfg.prompt_file).name} " if self._passage is not None else ""
        windows = [
            torch.tensor([text[w * ctx : (w + 1) * ctx]], device=self.s.device)
            for w in range(self.cfg.ppl_windows)
            if (w + 1) * ctx <= len(text)
        ]
        if not windows:
            why = f"the prompt file holds {len(text)} tokens, fewer than one {ctx}-token perplexity window"
            for mode in self.s.modes:
                self._skip(mode, ctx, "ppl", why)
            return
        fp16 = {}

        def work(mode):
            nll, count = 0.0, 0
            cold_read = 0  # a delegated cache's quantized (cold) tokens that the chunks attended to
            for i, win in enumerate(windows):
                caches = self.s.caches(mode, capacity=ctx)
                self.p.step(f"{ctx} {mode}: perplexity window {i + 1}/{len(windows)}", ctx)
                for s in range(0, ctx, self.cfg.ppl_chunk):
                    chunk = win[:, s : s + self.cfg.ppl_chunk]
                    cold_read += sum(getattr(c, "cold_len", 0) for c in caches)
                    logits = forward_chunk(lm.model, chunk, caches, last_only=False)[0]
                    target = win[0, s + 1 : s + 1 + chunk.shape[1]]
                    lp = F.log_softmax(logits[: target.shape[0]], -1)
                    nll -= lp.gather(-1, target[:, None]).sum().item()
                    count += target.shape[0]
                    self.p.advance_to(s + chunk.shape[1])
            ppl = math.exp(nll / count)
            out = {"ppl": round(ppl, 4), "gen_tokens": 0, "verdict": None}
            out["_note"] = f"{len(windows)} window(s) {source}of {ctx} tokens, chunk {self.cfg.ppl_chunk}"
            if ctx <= self.cfg.ppl_chunk and mode != "fp16" and fp16 and ppl == fp16["ppl"]:
                out["_note"] += (
                    "; the window is one chunk, which attended to its own K/V as computed and read no cached "
                    "(quantized) entry: fp16's perplexity exactly (a --ppl-chunk below the context measures the cache)"
                )
            elif cold_read == 0 and any(hasattr(c, "cold_len") for c in caches):
                out["_note"] += (
                    "; every earlier token was still in the fp16 hot window when a chunk attended to it: no "
                    "quantized V was read (a longer context or a shorter --ppl-chunk reaches the cold body)"
                )
            if mode == "fp16":
                fp16["ppl"] = ppl
            elif fp16:
                out["ppl_delta"] = round(ppl / fp16["ppl"] - 1, 6)  # relative change vs fp16
            return out

        for mode in self.s.modes:
            self._cell(mode, ctx, "ppl", rope_note, work)


def _compare_len(tokens: list[int], tokenizer) -> int:
    """Compare up to and including fp16's first end-of-sequence token."""
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is not None and eos in tokens:
        return tokens.index(eos) + 1
    return len(tokens)


def _status(row: dict, mode: str, effective: str) -> str:
    degenerate = row.get("degenerate") and row.get("verdict") == "degenerate"
    if degenerate and (mode != "fp16" or row.get("check") == "max_kv"):
        return "degenerate"
    if effective != mode:
        return "fallback"
    if row.get("verdict") == "diverged" and row.get("check") in ("greedy", "max_kv", "prefix_reuse"):
        return "diverged"
    return "ok"

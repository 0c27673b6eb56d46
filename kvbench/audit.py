"""The audit job: for each context, every mode decodes greedily from the same
prompt and is compared with fp16 (greedy match, teacher-forced top-1 agreement
and KL, degeneracy), optionally with perplexity over the bundled text."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kvbench import prompts, quality
from kvbench.engine.generate import KVCap, forward_chunk, greedy_decode, prefill, teacher_forced
from kvbench.engine.weights import fit_context
from kvbench.errors import KvbenchError
from kvbench.results import AUDIT_COLUMNS
from kvbench.runtime import Progress, is_oom, one_line, release
from kvbench.session import Session


@dataclass
class Reference:
    """fp16's greedy run at one context: what every mode is compared with."""

    tokens: torch.Tensor  # [n]
    logits: torch.Tensor  # [n, V] float32, on CPU
    text: str
    n_compare: int  # positions compared (up to and including fp16's first EOS)


class AuditJob:
    def __init__(self, session: Session, progress: Progress) -> None:
        self.s = session
        self.cfg = session.cfg
        self.p = progress
        self.writer = session.writer("audit", AUDIT_COLUMNS)
        self.rows: list[dict] = []
        self.question = self.cfg.question or prompts.DEFAULT_QUESTION
        self._passage = self._read_prompt_file()

    # ----------------------------------------------------------------- planning
    def n_cells(self) -> int:
        n = len(self.s.contexts) * len(self.s.modes)
        if self.cfg.ppl:
            n += len(self.s.contexts) * len(self.s.modes)
        return n

    def _read_prompt_file(self):
        if not self.cfg.prompt_file:
            return None
        p = Path(self.cfg.prompt_file)
        if not p.is_file():
            raise KvbenchError(f"--prompt-file: {p} not found")
        if self.s.lm.tokenizer is None:
            raise KvbenchError("--prompt-file needs a model with a tokenizer")
        return self.s.lm.tokenizer(p.read_text(), add_special_tokens=False).input_ids

    def prompt(self, context: int) -> torch.Tensor:
        lm = self.s.lm
        if lm.tokenizer is None:
            return prompts.synthetic_prompt(lm.args.vocab_size, context)
        return prompts.build_prompt(lm.tokenizer, context, question=self.question, passage_ids=self._passage)

    def decode_text(self, tokens: list[int]) -> str:
        tok = self.s.lm.tokenizer
        if tok is None:
            return " ".join(map(str, tokens))
        eos = tok.eos_token_id
        if eos is not None and eos in tokens:
            tokens = tokens[: tokens.index(eos)]
        return tok.decode(tokens, skip_special_tokens=True)

    # --------------------------------------------------------------------- run
    def run(self) -> list[dict]:
        for ctx in self.s.contexts:
            rope_note = fit_context(self.s.lm, ctx + self.cfg.gen_tokens, self.cfg.yarn)
            ids = self.prompt(ctx).to(self.s.device)
            ref = None
            for mode in self.s.modes:
                row = self._cell(mode, ctx, ids, ref, rope_note)
                if mode == "fp16":
                    ref = row.pop("_ref", None)
                    if ref is None:  # without the reference nothing else can be judged
                        for other in self.s.modes[1:]:
                            self._emit(self._skipped(other, ctx, "fp16 reference failed at this context"))
                        break
            if self.cfg.ppl:
                self._ppl(ctx, rope_note)
        return self.rows

    def _base(self, mode: str, ctx: int, check: str = "greedy") -> dict:
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
            "max_kv_size": self.cfg.max_kv_size,
            "keep": self.cfg.keep if self.cfg.max_kv_size else None,
        }

    def _skipped(self, mode, ctx, why):
        return {**self._base(mode, ctx), "status": "skipped", "notes": why}

    def _emit(self, row: dict) -> None:
        row = {k: v for k, v in row.items() if not k.startswith("_")}
        self.writer.write(row)
        self.rows.append(row)
        self.p.cell_done()

    def _cell(self, mode: str, ctx: int, ids: torch.Tensor, ref: Reference | None, rope_note: str) -> dict:
        row = self._base(mode, ctx)
        res = self.s.resolve(mode)
        notes = [n for n in (rope_note, res.note, *self.s.lm.notes) if n]
        if res.note:
            self.p.log(f"[yellow]{res.note}[/yellow]")
        t0 = time.perf_counter()
        try:
            row.update(self._greedy(res.effective, ctx, ids, ref))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one cell's failure is a row, not the end of the sweep
            row["status"] = "oom" if is_oom(exc) else "error"
            notes.append(one_line(exc))
            release(self.s.device)
        row["elapsed_s"] = round(time.perf_counter() - t0, 2)
        if row.get("status") not in ("oom", "error"):
            row["status"] = _status(row, mode, res.effective)
        row["notes"] = "; ".join(notes + ([row.pop("_note")] if row.get("_note") else []))
        self._emit(row)
        return row

    def _cap(self) -> KVCap | None:
        return KVCap(self.cfg.max_kv_size, self.cfg.keep) if self.cfg.max_kv_size else None

    def _prefill(self, caches, ids, label: str):
        n = ids.shape[1]
        self.p.step(f"{label}: prefill", n)
        return prefill(self.s.lm.model, ids, caches, self.cfg.prefill_chunk, self._cap(), on_chunk=self.p.advance_to)

    def _greedy(self, mode: str, ctx: int, ids: torch.Tensor, ref: Reference | None) -> dict:
        model = self.s.lm.model
        gen = self.cfg.gen_tokens
        caches = self.s.caches(mode, capacity=ctx + gen)
        label = f"{ctx} {mode}"
        first = self._prefill(caches, ids, label)
        snapshot = [c.clone() for c in caches] if ref is not None else None
        self.p.step(f"{label}: decode", gen)
        toks, logits = greedy_decode(model, first, caches, gen, self._cap(), on_token=self.p.advance_to)
        toks, logits = toks[0].cpu(), logits[0].cpu()
        kv_bytes = sum(c.nbytes() for c in caches)
        live = caches[0].live
        out = {
            "kv_bytes": kv_bytes,
            "kv_bytes_per_token": round(kv_bytes / max(1, live), 1),
            "output_text": self.decode_text(toks.tolist()),
        }
        deg = self._degenerate(toks.tolist(), out["output_text"])
        out.update(degenerate=deg.degenerate, degenerate_reason=deg.reason)
        if ref is None:  # this is fp16 itself
            n = _compare_len(toks.tolist(), self.s.lm.tokenizer)
            out["_ref"] = Reference(toks, logits, out["output_text"], n)
            out.update(
                identical_to_fp16=True,
                token_match=1.0,
                top1_agreement=1.0,
                kl_div=0.0,
                verdict="degenerate" if deg.degenerate else "identical",
            )
            return out
        n = ref.n_compare
        div = quality.first_divergence(ref.tokens[:n].tolist(), toks[:n].tolist())
        if div is None:
            forced = logits  # same inputs at every position: the greedy pass was teacher-forced
        else:
            self.p.step(f"{label}: teacher-forced", gen)
            forced = teacher_forced(
                model, first, snapshot, ref.tokens[None].to(ids.device), self._cap(), self.p.advance_to
            )
            forced = forced[0].cpu()
        del snapshot, caches
        near_tie = div is not None and quality.top2_margin(ref.logits[div]) < self.cfg.near_tie_margin
        out.update(
            identical_to_fp16=div is None,
            first_divergence=div,
            near_tie=near_tie,
            token_match=round(quality.token_match(ref.tokens[:n].tolist(), toks[:n].tolist()), 4),
            top1_agreement=round(quality.top1_agreement(ref.tokens[:n], forced[:n]), 4),
            kl_div=quality.kl_divergence(ref.logits[:n], forced[:n]),
        )
        if deg.degenerate:
            out["verdict"] = "degenerate"
        elif div is None:
            out["verdict"] = "identical"
        else:
            out["verdict"] = "near-tie" if near_tie else "diverged"
        return out

    def _degenerate(self, toks: list[int], text: str):
        if self.s.lm.tokenizer is None:
            return quality.detect_degenerate(tokens=toks)
        return quality.detect_degenerate(text, question=self.question)

    # -------------------------------------------------------------- perplexity
    def _ppl(self, ctx: int, rope_note: str) -> None:
        lm = self.s.lm
        if lm.tokenizer is None:
            for mode in self.s.modes:
                self._emit({**self._base(mode, ctx, "ppl"), "status": "skipped", "notes": "no tokenizer"})
            return
        text = prompts.text_ids(lm.tokenizer)
        windows = []
        for w in range(self.cfg.ppl_windows):
            start = w * ctx
            if start + ctx > len(text):
                break
            windows.append(torch.tensor([text[start : start + ctx]], device=self.s.device))
        fp16_ppl = None
        for mode in self.s.modes:
            res = self.s.resolve(mode)
            row = self._base(mode, ctx, "ppl")
            row["gen_tokens"] = 0
            t0 = time.perf_counter()
            try:
                nll, count = 0.0, 0
                for i, win in enumerate(windows):
                    caches = self.s.caches(res.effective, capacity=ctx)
                    self.p.step(f"{ctx} {mode}: perplexity window {i + 1}/{len(windows)}", ctx)
                    for s in range(0, ctx, self.cfg.ppl_chunk):
                        chunk = win[:, s : s + self.cfg.ppl_chunk]
                        logits = forward_chunk(lm.model, chunk, caches, last_only=False)[0]
                        target = win[0, s + 1 : s + 1 + chunk.shape[1]]
                        lp = F.log_softmax(logits[: target.shape[0]], -1)
                        nll -= lp.gather(-1, target[:, None]).sum().item()
                        count += target.shape[0]
                        self.p.advance_to(s + chunk.shape[1])
                ppl = math.exp(nll / count)
                row.update(status="ok", ppl=round(ppl, 4))
                if mode == "fp16":
                    fp16_ppl = ppl
                elif fp16_ppl:
                    row["ppl_delta"] = round(ppl / fp16_ppl - 1, 5)
                row["notes"] = "; ".join(
                    n
                    for n in (
                        rope_note,
                        res.note,
                        f"{len(windows)} window(s) of {ctx} tokens, chunk {self.cfg.ppl_chunk}",
                    )
                    if n
                )
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                row.update(status="oom" if is_oom(exc) else "error", notes=one_line(exc))
                release(self.s.device)
            row["elapsed_s"] = round(time.perf_counter() - t0, 2)
            self._emit(row)


def _compare_len(tokens: list[int], tokenizer) -> int:
    """Compare up to and including fp16's first end-of-sequence token."""
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is not None and eos in tokens:
        return tokens.index(eos) + 1
    return len(tokens)


def _status(row: dict, mode: str, effective: str) -> str:
    if row.get("degenerate") and row.get("verdict") == "degenerate" and mode != "fp16":
        return "degenerate"
    if effective != mode:
        return "fallback"
    if row.get("verdict") == "diverged":
        return "diverged"
    return "ok"

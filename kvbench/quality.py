"""Quality measures: degenerate-output detection, agreement with fp16, KL."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvbench.results import kernel_paths_agree

_WORD = re.compile(r"[\w']+")

# Thresholds measured on real outputs (see tests/test_quality.py): healthy
# English text of 30-60 words repeats almost no 4-grams (< 0.15) and keeps a
# distinct-word ratio above 0.45; the collapse loops score > 0.5 and < 0.3.
MIN_WORDS = 12
MAX_REPEATED_4GRAM = 0.4
MIN_DISTINCT_RATIO = 0.3


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def repeated_ngram_ratio(items: list, n: int = 4) -> float:
    """Share of n-grams that already occurred earlier in the sequence."""
    grams = [tuple(items[i : i + n]) for i in range(len(items) - n + 1)]
    if not grams:
        return 0.0
    seen: set = set()
    repeats = 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / len(grams)


def distinct_ratio(items: list) -> float:
    return len(set(items)) / len(items) if items else 1.0


def echoes_question(text: str, question: str, n: int = 5, verbatim: int = 8, times: int = 3) -> bool:
    """True if some `n` words of the question come back `times` times, or a run of
    `verbatim` consecutive question words is copied. An answer may restate a phrase
    of its question once or twice ("the main characters in the passage are ...");
    a loop repeats it every few words, and copying a whole clause is an echo."""
    q = words(question)
    w = words(text)
    if len(q) < n or len(w) < n:
        return False
    q_grams = {tuple(q[i : i + n]) for i in range(len(q) - n + 1)}
    counts = Counter(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    if any(counts[g] >= times for g in q_grams):
        return True
    long_q = {tuple(q[i : i + verbatim]) for i in range(len(q) - verbatim + 1)}
    return any(tuple(w[i : i + verbatim]) in long_q for i in range(len(w) - verbatim + 1))


@dataclass
class Degeneracy:
    degenerate: bool
    reason: str = ""


def detect_degenerate(text: str | None = None, *, tokens: list[int] | None = None, question: str = "") -> Degeneracy:
    """Flag collapse: repeated n-grams, a low distinct-word ratio, or an echoed question.

    Works on words of `text`, or on raw token ids when there is no tokenizer.
    """
    items = words(text) if text is not None else list(tokens or [])
    if text is not None and question and echoes_question(text, question):
        return Degeneracy(True, "echoes the question")
    if len(items) < MIN_WORDS:
        return Degeneracy(False)
    rep = repeated_ngram_ratio(items, 4)
    if rep > MAX_REPEATED_4GRAM:
        loop = Counter(tuple(items[i : i + 3]) for i in range(len(items) - 2)).most_common(1)[0][0]
        return Degeneracy(True, f"repeated 4-grams {rep:.0%} (loop: '{' '.join(map(str, loop))} ...')")
    dist = distinct_ratio(items)
    if dist < MIN_DISTINCT_RATIO:
        return Degeneracy(True, f"distinct-word ratio {dist:.2f}")
    return Degeneracy(False)


def first_divergence(ref: list[int], out: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ref, out)):
        if a != b:
            return i
    return None if len(ref) == len(out) else min(len(ref), len(out))


def token_match(ref: list[int], out: list[int]) -> float:
    n = min(len(ref), len(out))
    return sum(a == b for a, b in zip(ref[:n], out[:n])) / n if n else 1.0


def top1_agreement(ref_tokens: torch.Tensor, logits: torch.Tensor) -> float:
    """Share of positions where the mode's argmax equals fp16's token. logits [n, V]."""
    return (logits.argmax(-1) == ref_tokens).float().mean().item()


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over positions of KL(p_fp16 || p_mode) in nats. Both [n, V]."""
    ref_lp = F.log_softmax(ref_logits.float(), -1)
    lp = F.log_softmax(logits.float(), -1)
    return (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean().clamp_min(0).item()


def top2_margin(logits: torch.Tensor) -> float:
    """Gap between the two largest logits at one position."""
    top = logits.float().topk(2).values
    return (top[0] - top[1]).item()


@dataclass
class PathAgreement:
    verdict: str  # identical | near-tie | diverged: where the argmax flips sit
    flips: int  # positions whose argmax differs
    worst_margin: float  # largest top-2 margin (of `a`) among them; 0.0 without flips
    kl: float  # mean KL(a || b), nats
    kl_ref_fp32: float | None = None  # KL(yardstick || a): how far `a` sits from the mode in float32
    kl_kernel_fp32: float | None = None  # KL(yardstick || b)

    @property
    def agrees(self) -> bool:
        return kernel_paths_agree(self.kl, self.kl_ref_fp32, self.kl_kernel_fp32)


def path_agreement(
    a: torch.Tensor, b: torch.Tensor, margin: float, yardstick: torch.Tensor | None = None
) -> PathAgreement:
    """Two computations of the same logits [n, V] (e.g. fused kernels vs reference). The verdict
    says where they flip the argmax: nowhere (identical), only where `a`'s top two are within
    `margin` (near-tie: rounding order can flip those) or also at a clearer decision (diverged:
    a bug does that, and so can rounding amplified over a long context). Whether they agree is
    the KL's call (`kernel_paths_agree`), with `yardstick` (the same logits computed in float32)
    where given: then how far each path sits from it counts too."""
    kl = kl_divergence(a, b)
    fp32 = (kl_divergence(yardstick, a), kl_divergence(yardstick, b)) if yardstick is not None else (None, None)
    flips = (a.argmax(-1) != b.argmax(-1)).nonzero().flatten().tolist()
    if not flips:
        return PathAgreement("identical", 0, 0.0, kl, *fp32)
    worst = max(top2_margin(a[i]) for i in flips)
    return PathAgreement("near-tie" if worst < margin else "diverged", len(flips), worst, kl, *fp32)

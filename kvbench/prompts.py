"""Prompts of an exact token length, built from the bundled public-domain novel
(Jane Austen's *Emma*, see kvbench/data/README.md) and ending in a question."""

from __future__ import annotations

import gzip
from functools import cache
from importlib import resources

import torch

from kvbench.errors import KvbenchError

DEFAULT_QUESTION = "Who are the main characters in the passage above, and what happens to them?"


@cache
def bundled_text() -> str:
    data = resources.files("kvbench").joinpath("data/emma.txt.gz").read_bytes()
    return gzip.decompress(data).decode("utf-8")


@cache
def _text_ids(tokenizer_key: int, tokenizer) -> list[int]:
    return tokenizer(bundled_text(), add_special_tokens=False).input_ids


def text_ids(tokenizer) -> list[int]:
    """The whole bundled text as token ids (memoised per tokenizer)."""
    return _text_ids(id(tokenizer), tokenizer)


def _chat_parts(tokenizer, question: str) -> tuple[list[int], list[int]]:
    """Token ids before and after the passage (chat template when the model has one)."""
    marker = "\x00PASSAGE\x00"
    user = f"{marker}\n\n{question}"
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = user + "\n\nAnswer:"
    before, after = text.split(marker)
    pre = tokenizer(before, add_special_tokens=False).input_ids
    bos = tokenizer.bos_token_id
    if bos is not None and getattr(tokenizer, "add_bos_token", False) and (not pre or pre[0] != bos):
        pre = [bos, *pre]
    return pre, tokenizer(after, add_special_tokens=False).input_ids


def build_prompt(
    tokenizer, n_tokens: int, *, question: str = DEFAULT_QUESTION, passage_ids: list[int] | None = None, start: int = 0
) -> torch.Tensor:
    """Exactly `n_tokens` ids: chat prefix + passage (bundled text from token
    `start`, or `passage_ids`) cut to fit + the question. Returns [1, n_tokens]."""
    pre, post = _chat_parts(tokenizer, question)
    room = n_tokens - len(pre) - len(post)
    if room < 1:
        raise KvbenchError(f"context {n_tokens} is too short for the prompt template ({len(pre) + len(post)} tokens)")
    body = text_ids(tokenizer) if passage_ids is None else passage_ids
    if start + room > len(body):
        if passage_ids is not None:
            raise KvbenchError(
                f"the prompt file has {len(body)} tokens of text; context {n_tokens} needs {room} (a context of at "
                f"most {len(body) + n_tokens - room} fits it, or give a longer file)"
            )
        reps = -(-(start + room) // len(body))
        body = body * reps  # the novel is ~220K tokens; longer contexts reuse it
    return torch.tensor([pre + body[start : start + room] + post], dtype=torch.long)


def synthetic_prompt(vocab_size: int, n_tokens: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """Random token ids for models without a tokenizer (dummy weights)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (batch, n_tokens), generator=g, device="cpu")

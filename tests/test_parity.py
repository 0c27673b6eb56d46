"""The fp16 engine against transformers' own model code on the same weights.

Tiny random configs of every supported family are saved as Hugging Face
folders, loaded by kvbench's loader, and compared in float32: logits within
1e-4 (absolute, logits of magnitude ~1-10) and identical greedy tokens. The
real default model is compared on a real prompt.
"""

import pytest
import torch
from tiny_hf import BASE
from transformers import AutoConfig, AutoModelForCausalLM

from kvbench.engine.generate import greedy_decode, prefill, teacher_forced
from kvbench.engine.rope import with_yarn
from kvbench.engine.weights import fit_context, load_model
from kvbench.kv import build_caches

FAMILIES = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True),
    "llama3-rope": dict(
        model_type="llama",
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "yarn-rope": dict(
        model_type="llama", rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)
    ),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2-bias": dict(model_type="qwen2", tie_word_embeddings=False),
    "qwen3-qknorm": dict(model_type="qwen3", head_dim=32),
}


def hf_model(family: str, seed: int):
    kw = {**BASE, **FAMILIES[family]}
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init, so logits have real spread
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 0.15)
    return m


def fp16_caches(model, batch):
    a = model.args
    return build_caches(
        "fp16", n_layers=a.n_layers, batch=batch, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
        dtype=torch.float32, device="cpu",
    )  # fmt: skip


def ours(model, ids, n_new, chunk=0):
    """Full-sequence logits, and greedy tokens after a (chunked) prefill."""
    with torch.inference_mode():
        logits = model(ids, torch.arange(ids.shape[1]), fp16_caches(model, ids.shape[0]))
    caches = fp16_caches(model, ids.shape[0])
    first = prefill(model, ids, caches, chunk)
    toks, _ = greedy_decode(model, first, caches, n_new)
    return logits, toks


def assert_same_greedy(model, hf, ids, n_new, chunk, atol):
    """Our decode path fed transformers' greedy tokens gives transformers' logits
    (within atol) and the same argmax wherever transformers' choice was not a tie
    (top-2 gap > 10 atol: a random model can have exact near-ties that any change
    of summation order flips)."""
    hf.generation_config.eos_token_id = None  # never stop early, and no min-length logits processor
    out = hf.generate(
        ids, max_new_tokens=n_new, do_sample=False, output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    assert out.sequences.shape[1] == ids.shape[1] + n_new
    theirs = torch.stack(out.logits, 1).float()  # [B, n, V]
    hf_tokens = out.sequences[:, ids.shape[1] :]
    caches = fp16_caches(model, ids.shape[0])
    first = prefill(model, ids, caches, chunk)
    mine = teacher_forced(model, first, caches, hf_tokens)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=atol)
    top2 = theirs.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 10 * atol
    assert clear.float().mean() > 0.8, "too many ties to judge"
    assert torch.equal(mine.argmax(-1)[clear], hf_tokens[clear])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_matches_transformers(family, tmp_path, seed):
    hf = hf_model(family, seed)
    hf.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), dtype=torch.float32)
    assert lm.model_type == hf.config.model_type
    ids = torch.randint(0, 300, (2, 23))
    with torch.no_grad():
        ref = hf(ids).logits
    logits, _ = ours(lm.model, ids, 2)
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)
    assert_same_greedy(lm.model, hf, ids, 12, chunk=5, atol=1e-4)  # chunked prefill, then decode steps


def test_yarn_context_extension_matches_transformers(tmp_path, seed):
    """fit_context's YaRN (what the default model gets past 8K) equals transformers
    running the same YaRN config."""
    hf = hf_model("llama", seed)
    hf.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), dtype=torch.float32)
    note = fit_context(lm, 900)  # trained 256 -> smallest power of two covering 900 is x4
    assert note.startswith("yarn x4")
    hf_yarn = AutoModelForCausalLM.from_config(with_yarn(hf.config, 4, 256)).float().eval()
    hf_yarn.load_state_dict(hf.state_dict())
    ids = torch.randint(0, 300, (1, 40))
    with torch.no_grad():
        ref = hf_yarn(ids).logits
    logits, _ = ours(lm.model, ids, 2)
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_default_model_matches_transformers(default_model):
    """SmolLM2-135M on a real prompt: fp32 logits within 1e-3 and 24 identical greedy tokens."""
    from kvbench.engine.weights import cache_dir, default_gguf_path, file_hash

    folder = cache_dir() / "gguf" / file_hash([default_gguf_path()])
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = default_model.tokenizer
    text = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition,"
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = hf(ids).logits
    logits, toks = ours(default_model.model, ids, 24)
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-3)
    hf.generation_config.eos_token_id = None
    gen = hf.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(toks, gen[:, ids.shape[1] :])  # a real model on a real prompt: no ties to excuse
    assert len(set(toks[0].tolist())) > 10  # fluent, not a loop


@pytest.mark.slow
def test_gguf_conversion_matches_transformers_loader(default_model):
    """Our GGUF dequantization (gguf package + llama.cpp Q/K un-permute) equals
    transformers' own GGUF loader tensor for tensor."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from kvbench.engine.weights import default_gguf_path, gguf_tensors

    path = default_gguf_path()
    cfg = default_model.args.hf_config
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    mine = gguf_tensors(path, cfg.num_attention_heads, cfg.num_key_value_heads)
    assert set(theirs) <= set(mine)
    for name, t in theirs.items():
        assert torch.equal(mine[name], t.float()), name


def test_gguf_conversion_waits_for_another(tmp_path, monkeypatch):
    """Two processes asked to convert one GGUF: the second waits on the first's file lock, then takes
    its folder instead of converting again and replacing the folder under the first one's reader."""
    import threading

    from filelock import FileLock

    from kvbench.engine import weights

    monkeypatch.setattr(weights, "cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(weights, "_convert_gguf", lambda *a: pytest.fail("converted while another conversion ran"))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF" + bytes(64))
    digest = weights.file_hash([src])
    folder = tmp_path / "cache" / "gguf" / digest
    folder.parent.mkdir(parents=True)
    got = []
    with FileLock(str(folder.parent / f".{digest}.lock")):  # the first process, converting
        waiter = threading.Thread(target=lambda: got.append(weights.gguf_to_hf_folder(src)))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not got  # it waits on the lock
        folder.mkdir()
        (folder / "DONE").write_text(str(src))  # the first process is done
    waiter.join(30)
    assert got == [folder]

"""Peer rows: transformers' own caches on a transformers model holding kvbench's weights.

The transformers model must equal kvbench's fp16 engine (logits within 1e-4 in
float32, identical greedy tokens), so any difference in a peer row comes from
the cache alone. Optional backends (optimum-quanto, hqq) are skipped when absent.
"""

import dataclasses

import pytest
import torch
from tiny_hf import BASE
from transformers import AutoConfig, AutoModelForCausalLM

from kvbench import peers, quality
from kvbench.engine.generate import greedy_decode, prefill
from kvbench.engine.weights import _read_safetensors, load_model
from kvbench.errors import KvbenchError
from kvbench.kv import build_caches

FAMILIES = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True),
    "qwen2-bias": dict(model_type="qwen2", tie_word_embeddings=False),
    "qwen3-qknorm": dict(model_type="qwen3", head_dim=32),
}


def save_folder(tmp_path, family="llama", seed=0):
    """A tiny random Hugging Face folder with weights large enough for varied greedy tokens."""
    kw = {**BASE, **FAMILIES[family]}
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0, 0.15)
    m.save_pretrained(tmp_path)
    return tmp_path


def fp16_caches(lm, capacity=None):
    a = lm.args
    return build_caches(
        "fp16",
        n_layers=a.n_layers,
        batch=1,
        n_kv_heads=a.n_kv_heads,
        head_dim=a.head_dim,
        dtype=torch.float32,
        device="cpu",
        capacity=capacity,
    )


def engine_logits(lm, ids):
    with torch.inference_mode():
        return lm.model(ids, torch.arange(ids.shape[1]), fp16_caches(lm))


def engine_greedy(lm, ids, n):
    caches = fp16_caches(lm, ids.shape[1] + n)
    first = prefill(lm.model, ids, caches, 0)
    toks, logits = greedy_decode(lm.model, first, caches, n)
    return toks[0], logits[0]


def hf_logits(hf, ids):
    with torch.inference_mode():
        return hf(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def tiny():
    lm = load_model("dummy:tiny", dtype=torch.float32)
    return lm, peers.hf_model_for(lm, "cpu", torch.float32)


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory):
    lm = load_model(str(save_folder(tmp_path_factory.mktemp("hf"))), dtype=torch.float32)
    return lm, peers.hf_model_for(lm, "cpu", torch.float32)


# ------------------------------------------------------------------ the model
def test_hf_model_equals_engine_on_dummy(tiny):
    lm, hf = tiny
    ids = torch.randint(3, lm.args.vocab_size, (1, 37))
    torch.testing.assert_close(hf_logits(hf, ids), engine_logits(lm, ids), rtol=0, atol=1e-4)
    # same weights, not a copy: the fused QKV's rows are transformers' q/k/v
    q = hf.model.layers[0].self_attn.q_proj.weight
    assert q.data_ptr() == lm.model.layers[0].attn.wqkv.weight.data_ptr()


def test_hf_model_takes_the_plain_w_o_of_a_folded_engine():
    """A fused turbo decoder folds V's inverse rotation into W_o in place (`engine.fold`): the peer
    model gets the plain W_o, and its own copy, so a fold after it does not reach it."""
    from kvbench.engine.fold import fold_output, is_folded
    from kvbench.kv.turbo import Rotation

    lm = load_model("dummy:tiny", dtype=torch.float32)
    plain = lm.model.layers[1].attn.wo.weight.detach().clone()
    rot = Rotation(lm.args.head_dim, (3, 4))
    owner = type("Owner", (), {})()  # a stand-in decoder (held weakly)
    fold_output(lm.model, owner, {1: (rot.s1, rot.s2)})
    assert is_folded(lm.model) and not torch.equal(lm.model.layers[1].attn.wo.weight, plain)
    hf = peers.hf_model_for(lm, "cpu", torch.float32)
    assert not is_folded(lm.model)
    o_proj = hf.model.layers[1].self_attn.o_proj.weight
    assert torch.equal(o_proj, plain)
    fold_output(lm.model, owner, {1: (rot.s1, rot.s2)})
    assert torch.equal(o_proj, plain) and o_proj.data_ptr() != lm.model.layers[1].attn.wo.weight.data_ptr()


def test_hf_model_equals_engine_on_hf_folder(folder_model):
    lm, hf = folder_model
    ids = torch.randint(0, 300, (1, 29))
    torch.testing.assert_close(hf_logits(hf, ids), engine_logits(lm, ids), rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_kvbench_to_hf_inverts_hf_to_kvbench(family, tmp_path):
    """The split of fused QKV (with bias) and gate|up gives back the checkpoint's tensors,
    and a model built from the config with them (the dummy path) equals the engine."""
    folder = save_folder(tmp_path, family, seed=1)
    lm = load_model(str(folder), dtype=torch.float32)
    original, _ = _read_safetensors(folder)
    back = peers.kvbench_to_hf(lm.model.state_dict(), lm.args)
    assert set(back) == set(original) - ({"lm_head.weight"} if lm.args.tie_word_embeddings else set())
    for name, t in back.items():
        assert torch.equal(t, original[name]), name
    as_dummy = dataclasses.replace(lm, source="dummy:test")
    hf = peers.hf_model_for(as_dummy, "cpu", torch.float32)
    ids = torch.randint(0, 300, (1, 19))
    torch.testing.assert_close(hf_logits(hf, ids), engine_logits(lm, ids), rtol=0, atol=1e-4)


def test_fit_peer_context_gives_both_models_the_same_yarn(tmp_path):
    lm = load_model(str(save_folder(tmp_path)), dtype=torch.float32)
    hf = peers.hf_model_for(lm, "cpu", torch.float32)
    ids = torch.randint(0, 300, (1, 40))
    before = hf_logits(hf, ids)
    note = peers.fit_peer_context(hf, lm, 900)  # 256 trained positions -> YaRN x4
    assert note.startswith("yarn x4")
    after = hf_logits(hf, ids)
    assert (after - before).abs().max() > 1e-3  # RoPE really changed
    torch.testing.assert_close(after, engine_logits(lm, ids), rtol=0, atol=1e-4)
    assert peers.fit_peer_context(hf, lm, 100) == ""  # and back
    torch.testing.assert_close(hf_logits(hf, ids), before, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_hf_model_equals_engine_on_default_gguf(default_model):
    hf = peers.hf_model_for(default_model, "cpu", torch.float32)
    ids = default_model.tokenizer("Emma Woodhouse, handsome, clever, and rich,", return_tensors="pt").input_ids
    torch.testing.assert_close(hf_logits(hf, ids), engine_logits(default_model, ids), rtol=0, atol=1e-3)


# ------------------------------------------------------------------ decoding
def test_cache_argument_name_matches_forward(tiny):
    import inspect

    _, hf = tiny
    name = peers.cache_arg_name(hf)
    assert name in ("cache", "past_key_values")
    assert name in inspect.signature(hf.forward).parameters


@pytest.mark.parametrize("which", ["tiny", "folder_model"])
def test_dynamic_greedy_equals_engine(which, request):
    lm, hf = request.getfixturevalue(which)
    ids = torch.randint(3, lm.args.vocab_size, (1, 31))
    ref, ref_logits = engine_greedy(lm, ids, 20)
    toks, logits = peers.peer_generate(hf, "hf:dynamic", ids, 20)
    assert toks.shape == (20,) and logits.shape == (20, lm.args.vocab_size)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    assert torch.equal(toks, ref)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)
    if which == "folder_model":
        assert len(set(toks.tolist())) > 3  # a real sequence, not one repeated token


def test_static_equals_dynamic_and_generate(folder_model):
    """hf:static decodes the same tokens; the forward loop equals transformers' generate."""
    _, hf = folder_model
    ids = torch.randint(0, 300, (1, 25))
    dyn, dyn_logits = peers.peer_generate(hf, "hf:dynamic", ids, 16)
    sta, sta_logits = peers.peer_generate(hf, "hf:static", ids, 16)
    assert torch.equal(sta, dyn)
    torch.testing.assert_close(sta_logits, dyn_logits, rtol=0, atol=1e-4)
    gen = hf.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert torch.equal(gen[0, 25:], dyn)
    toks, none = peers.peer_generate(hf, "hf:static", ids[0], 16, return_logits=False)
    assert none is None and torch.equal(toks, dyn)


def test_teacher_forced_on_own_tokens_is_the_greedy_pass(folder_model):
    _, hf = folder_model
    ids = torch.randint(0, 300, (1, 21))
    toks, logits = peers.peer_generate(hf, "hf:dynamic", ids, 12)
    forced = peers.peer_teacher_forced(hf, "hf:static", ids, toks)
    assert forced.shape == logits.shape
    torch.testing.assert_close(forced, logits, rtol=0, atol=1e-4)
    assert quality.top1_agreement(toks, forced) == 1.0


def test_peer_generate_takes_one_prompt(tiny):
    _, hf = tiny
    with pytest.raises(KvbenchError, match="one prompt"):
        peers.peer_generate(hf, "hf:dynamic", torch.zeros(2, 5, dtype=torch.long), 2)


# ------------------------------------------------------------------ availability
def test_available_peers_never_raises(monkeypatch):
    got = peers.available_peers()
    assert list(got) == list(peers.PEERS)
    assert got["hf:dynamic"] is None and got["hf:static"] is None
    assert all(v is None or (v.startswith("install ") and "\n" not in v) for v in got.values())

    def broken(*_):
        raise RuntimeError("a broken optional install")

    monkeypatch.setattr(peers, "_backend_ok", broken)
    got = peers.available_peers()
    assert got["hf:dynamic"] is None
    assert all(got[p] for p in peers.PEERS if peers.PEERS[p].backend)


def test_missing_backend_is_one_clear_line(tiny, monkeypatch):
    _, hf = tiny
    monkeypatch.setattr(peers, "_backend_ok", lambda *_: False)
    with pytest.raises(KvbenchError) as err:
        peers.peer_generate(hf, "hf:quanto-int4", torch.zeros(1, 4, dtype=torch.long), 2)
    assert str(err.value) == "hf:quanto-int4 needs optimum-quanto>=0.2.5: pip install 'kvbench[peers]'"
    with pytest.raises(KvbenchError, match=r"^hf:hqq-int8 needs hqq: pip install 'kvbench\[peers\]'$"):
        peers.make_cache(hf, "hf:hqq-int8", 8)
    with pytest.raises(KvbenchError, match="^hf:fp8 needs a transformers whose QuantizedCache has an 'fp8' backend"):
        peers.check_peer("hf:fp8")
    with pytest.raises(KvbenchError, match="unknown peer 'hf:nope'"):
        peers.check_peer("hf:nope")
    assert peers.available_peers()["hf:hqq-int4"] == "install hqq: pip install 'kvbench[peers]'"


# ------------------------------------------------------------------ bytes and bench
def test_cache_nbytes_and_decode_bench(tiny):
    lm, hf = tiny
    a = lm.args
    ids = torch.randint(3, a.vocab_size, (2, 50))
    cache = peers.make_cache(hf, "hf:dynamic", 60)
    with torch.inference_mode():
        hf(input_ids=ids, **{peers.cache_arg_name(hf): cache}, use_cache=True)
    per_token = 2 * a.n_layers * a.n_kv_heads * a.head_dim * 4  # fp32 K and V
    assert peers.cache_nbytes(cache) == 2 * 50 * per_token
    assert peers.cache_nbytes(object()) is None

    r = peers.peer_decode_bench(hf, "hf:dynamic", ids, warmup=2, gen=3, repeats=2, device="cpu")
    assert r["kv_bytes"] == 2 * 50 * per_token and r["kv_bytes_per_token"] == per_token
    assert r["decode_tok_s_min"] <= r["decode_tok_s"] <= r["decode_tok_s_max"] and r["decode_tok_s"] > 0
    assert r["prefill_ms"] > 0 and r["peak_mem_kind"] == "cpu_peak_rss" and r["peak_mem_gb"] > 0
    assert "DynamicCache" in r["_note"]
    s = peers.peer_decode_bench(hf, "hf:static", ids, warmup=1, gen=2, repeats=1, device="cpu")
    assert s["kv_bytes"] == 2 * (50 + 1 + 2 + 1) * per_token  # the whole preallocated buffer
    assert "preallocated" in s["_note"]


# ------------------------------------------------------------------ optional backends
# KL(dynamic || peer) teacher-forced on 8 tokens after a 140-token prompt of the
# random folder model measured 1e-4 (int8), 0.003 (fp8), 0.01-0.04 (int4), 0.4-0.5 (int2)
KL_BOUND = {"hf:hqq-int8": 0.005, "hf:fp8": 0.05, "hf:quanto-int4": 0.15, "hf:hqq-int4": 0.15, "hf:quanto-int2": 2.0}


def _quantized_close(hf, lm, peer):
    ids = torch.randint(3, lm.args.vocab_size, (1, 140))
    ref, ref_logits = peers.peer_generate(hf, "hf:dynamic", ids, 8)
    toks, logits = peers.peer_generate(hf, peer, ids, 8)
    assert toks.shape == (8,) and logits.shape == (8, lm.args.vocab_size)
    torch.testing.assert_close(logits[0], ref_logits[0], rtol=0, atol=1e-5)  # prefill attends full precision
    forced = peers.peer_teacher_forced(hf, peer, ids, ref)
    assert 0 < quality.kl_divergence(ref_logits, forced) < KL_BOUND[peer]
    cache = peers.make_cache(hf, peer, 150)
    with torch.inference_mode():
        hf(input_ids=ids, **{peers.cache_arg_name(hf): cache}, use_cache=True)
    full = 2 * lm.args.n_layers * lm.args.n_kv_heads * lm.args.head_dim * 4 * 140
    assert 0 < peers.cache_nbytes(cache) < full


@pytest.mark.parametrize(
    "peer,backend",
    [
        ("hf:quanto-int4", "optimum.quanto"),
        ("hf:quanto-int2", "optimum.quanto"),
        ("hf:hqq-int4", "hqq"),
        ("hf:hqq-int8", "hqq"),
    ],
)
def test_quantized_backend_peers(folder_model, peer, backend):
    pytest.importorskip(backend)
    lm, hf = folder_model
    if peers.available_peers()[peer]:
        pytest.skip(peers.available_peers()[peer])
    _quantized_close(hf, lm, peer)


def test_fp8_peer(folder_model):
    lm, hf = folder_model
    if peers.available_peers()["hf:fp8"]:
        pytest.skip(peers.available_peers()["hf:fp8"])
    _quantized_close(hf, lm, "hf:fp8")


def test_a_config_that_does_not_fit_the_weights_is_one_line(tmp_path):
    """config.json whose sizes disagree with the safetensors (an edited or mixed-up folder): one line naming
    the tensor and both shapes, not load_state_dict's many-line error."""
    import json

    folder = save_folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 2 * cfg["intermediate_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KvbenchError, match=r"weights do not fit the model's config: layers\.0\.ffn\.w13\.weight "
                       r"is \[192, 64\], the config makes it \[384, 64\] \(and \d+ more\)") as exc:  # fmt: skip
        load_model(str(folder), dtype=torch.float32, device="cpu")
    assert "\n" not in str(exc.value)


def test_a_model_folder_without_a_tokenizer(tmp_path):
    """A real model folder whose tokenizer is missing: the audit (which decodes text) refuses it in one line
    instead of auditing random token ids; decode-bench runs and says its prompts are random ids."""
    from typer.testing import CliRunner

    from kvbench.cli import app

    folder = save_folder(tmp_path / "m")
    runner = CliRunner()
    common = ["--model", str(folder), "--contexts", "32", "--modes", "int8"]
    audit = runner.invoke(app, ["audit", *common, "--gen-tokens", "2", "--out", str(tmp_path / "a")])
    assert audit.exit_code == 2, audit.output
    assert "no usable tokenizer" in audit.output and "the audit decodes text" in audit.output
    assert not (tmp_path / "a").exists()
    bench = runner.invoke(app, ["decode-bench", *common, "--gen", "2", "--warmup", "1", "--repeats", "1",
                                "--out", str(tmp_path / "b")])  # fmt: skip
    assert bench.exit_code == 0, bench.output
    assert "no usable tokenizer; the context is filled as for a dummy model" in " ".join(bench.output.split())
    import csv

    rows = list(csv.DictReader((tmp_path / "b" / "bench.csv").read_text().splitlines()))
    # real weights: not `synthetic` (random weights), and the note gives the real reason for the random fill
    assert rows and all(r["synthetic"] == "false" and "(no prefill; no tokenizer)" in r["notes"] for r in rows), rows


def test_a_config_transformers_rejects_is_one_line(tmp_path):
    """transformers' own config checks raise many-line messages (a class validation error, then the reason):
    the CLI prints them as one line."""
    import json

    from typer.testing import CliRunner

    from kvbench.cli import app

    folder = save_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_attention_heads"] = 5  # 64 is not a multiple of 5
    (folder / "config.json").write_text(json.dumps(cfg))
    result = CliRunner().invoke(app, ["decode-bench", "--model", str(folder), "--contexts", "32"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def test_peers_run_in_a_sharded_run(tmp_path):
    """--devices cpu,cpu with an hf:* peer in --modes: the workers run it beside the kvbench modes (the sharding
    parent once refused it as an unknown KV mode)."""
    import csv

    from typer.testing import CliRunner

    from kvbench.cli import app

    out = tmp_path / "o"
    args = ["decode-bench", "--model", "dummy:tiny", "--modes", "int8,hf:dynamic", "--contexts", "48", "--gen", "2",
            "--warmup", "0", "--repeats", "1", "--devices", "cpu,cpu", "--quiet", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "bench.csv").read_text().splitlines()))
    assert sorted((r["kv_cache_mode"], r["status"]) for r in rows) == [
        ("fp16", "ok"),
        ("hf:dynamic", "ok"),
        ("int8", "ok"),
    ]

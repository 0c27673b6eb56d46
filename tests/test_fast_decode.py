"""The GPU decode engine (fused Triton kernels; on CPU through the Triton
interpreter, without CUDA graphs) against the reference path, for every mode.
`KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0` runs it on a GPU, with CUDA graphs."""

import json
import os

import pytest
import torch

from kvbench.engine.generate import KVCap, make_stepper, prefill, teacher_forced
from kvbench.engine.weights import load_model
from kvbench.kernels.reference import unpack_codes
from kvbench.kv import build_caches, mode_names
from kvbench.kv.turbo_modes import Turbo4DelegatedCache

DEVICE = os.environ.get("KVBENCH_TEST_DEVICE", "cpu")


@pytest.fixture(scope="module")
def tiny():
    lm = load_model("dummy:tiny", dtype=torch.float32, device=DEVICE)
    with torch.no_grad():  # sharper than the dummy init, so logits have spread
        g = torch.Generator().manual_seed(1)
        for name, p in lm.model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return lm


def run(lm, mode, fused, ids, forced, cap=None, gemv=True, sparse_v=0.0, capacity=None, chunk=16):
    a = lm.args
    caches = build_caches(
        mode,
        n_layers=a.n_layers,
        batch=ids.shape[0],
        n_kv_heads=a.n_kv_heads,
        head_dim=a.head_dim,
        dtype=torch.float32,
        device=DEVICE,
        capacity=capacity or ids.shape[1] + forced.shape[1] + 1,
        kernel="triton" if fused else "reference",
        boundary_v=1,
        sparse_v=sparse_v,
    )
    first = prefill(lm.model, ids, caches, chunk, cap)
    step = make_stepper(lm.model, caches, cap, fused=fused, cuda_graphs=DEVICE != "cpu", gemv=gemv)
    return teacher_forced(lm.model, first, caches, forced, cap, step=step), caches


def code_moves(caches, ref_caches) -> tuple[float, int]:
    """Share of the stored quantization codes (live slots) that differ between two runs,
    and the largest difference in cells."""
    moved = total = worst = 0
    for c, r in zip(caches, ref_caches):
        for key, want in r.buffers.items():
            if want.dtype not in (torch.uint8, torch.int8):
                continue
            n = r.cold_len if key.startswith("v_") and hasattr(r, "cold_len") else r.live
            a, b = c.buffers[key][:, :, :n], want[:, :, :n]
            if key.endswith("_codes"):
                bits = getattr(r, f"{key[0]}_bits") or 4
                a, b = unpack_codes(a, bits), unpack_codes(b, bits)
            d = (a.int() - b.int()).abs()
            moved, total = moved + int((d > 0).sum()), total + d.numel()
            worst = max(worst, int(d.max()) if d.numel() else 0)
    return moved / max(total, 1), worst


@pytest.mark.parametrize("mode", mode_names())
def test_fused_decode_matches_reference(tiny, mode, seed, monkeypatch):
    # a small hot window so the delegated fold happens within a short test
    monkeypatch.setattr(Turbo4DelegatedCache, "HOT_MAX", 16)
    monkeypatch.setattr(Turbo4DelegatedCache, "FOLD", 8)
    if mode.startswith("turbo"):  # V's inverse rotation folded into W_o (at batch 1 by default; asked for here)
        monkeypatch.setenv("KVBENCH_ATTN_CONFIG", json.dumps({mode: {"fold_v": True}}))
    ids = torch.randint(0, 512, (2, 29), device=DEVICE)
    forced = torch.randint(0, 512, (2, 30), device=DEVICE)
    ref, ref_caches = run(tiny, mode, False, ids, forced)
    got, caches = run(tiny, mode, True, ids, forced)
    assert caches[0].offset == ref_caches[0].offset == 29 + 29
    if mode == "turbo4-delegated":
        assert caches[1].cold_len == ref_caches[1].cold_len and caches[1].hot_len <= 16
    # fp32 model; the kernels run their tensor-core dots in fp16/tf32 like on the GPU
    tol = 1e-4 if mode == "fp16" else 2e-2
    if mode == "fp16":
        torch.testing.assert_close(got, ref, rtol=0, atol=tol)
    else:
        # Quantized storage is discontinuous: a rounding difference upstream (fp16 dots in
        # the kernels) can move a value across a cell edge, so a stored code moves by one
        # cell and the logits of the steps that attend to it move by up to about one
        # quantization step. Measured for turbo4 over 17 seeds: at most 0.02% of the
        # codes moved, by one cell; max |logit diff| up to 0.030, 99th percentile up to
        # 0.011, and in 2 of ~50 runs some tens of the 30720 logits above 0.02. So the
        # stored codes must agree but for rare one-cell moves, and the logits must agree
        # in bulk (99th percentile) and loosely everywhere. A wiring bug (slot,
        # position, rotation, fold) breaks all three by far. int8's cells are 16x finer
        # (255 of them, each 1/127 of the token's largest value), so more codes sit near an
        # edge: over 3 seeds 0.26-0.44% moved with its integer dots ("s8") and 1.16-1.25%
        # with its fp16 dots (the default), logits within 0.009 either way. The moves compound
        # with depth (none in layer 0, ~2% of the codes in layer 5), so at int8's fine cells one
        # code in ~44,000 has moved by two (seed 3630160093: layer 5's V, decode position 53;
        # 1 of 8 seeds tried, logits within 0.0085); turbo4's did not in the 17 seeds above.
        moved, cells = code_moves(caches, ref_caches)
        limit, max_cells = (0.05, 2) if mode == "int8" else (0.01, 1)
        assert moved < limit and cells <= max_cells, (
            f"seed {seed}: {moved:.2%} of the codes differ, by up to {cells} cells"
        )
        err = (got - ref).abs()
        assert err.max() < 0.25, f"seed {seed}: max |logit diff| {err.max():.3g}"
        q99 = err.quantile(0.99)
        assert q99 < 2 * tol, f"seed {seed}: 99th percentile |logit diff| {q99:.3g}"
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tol  # argmax must agree wherever it is not a tie
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_query_rotation_in_rope_changes_nothing(tiny, monkeypatch):
    """turbo4's query rotation written by RoPE's kernel (`q_rot_in_rope`, the default) or by a launch
    of its own in the attention: the same logits bit for bit, and the launch runs only when asked."""
    import kvbench.kernels.decode_attention as da

    assert da.default_config("turbo4")["q_rot_in_rope"] and not da.default_config("turbo4-asym")["q_rot_in_rope"]
    calls = []
    real = da.rotate
    monkeypatch.setattr(da, "rotate", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(0, 512, (2, 21), device=DEVICE)
    forced = torch.randint(0, 512, (2, 6), device=DEVICE)
    monkeypatch.setenv("KVBENCH_ATTN_CONFIG", json.dumps({"turbo4": {"q_rot_in_rope": True}}))
    fused, caches = run(tiny, "turbo4", True, ids, forced)
    assert caches[1].kernel_mode == "turbo4" and not calls
    monkeypatch.setenv("KVBENCH_ATTN_CONFIG", json.dumps({"turbo4": {"q_rot_in_rope": False}}))
    launched, _ = run(tiny, "turbo4", True, ids, forced)
    assert calls, "the attention's own rotation did not run"
    assert torch.equal(fused, launched)


@pytest.mark.parametrize("mode", ["int8", "turbo4-asym"])
def test_sparse_v_reaches_both_paths(tiny, mode, seed):
    """`sparse_v` on the caches changes the decode of both paths (tau = 0.3 skips most tokens' V;
    the kernel tests check what is skipped), and a tau below every weight changes nothing (on fp16
    storage: the reference path's sparse decode is grouped matmuls, not SDPA, and their last-bit
    differences would move a quantized code across a cell edge now and then)."""
    ids = torch.randint(0, 512, (1, 29), device=DEVICE)
    forced = torch.randint(0, 512, (1, 12), device=DEVICE)
    for fused in (False, True):
        dense, _ = run(tiny, mode, fused, ids, forced)
        sparse, caches = run(tiny, mode, fused, ids, forced, sparse_v=0.3)
        assert all(c.sparse_v == 0.3 for c in caches)
        assert sparse.isfinite().all()
        moved = (sparse - dense).abs().max()
        assert moved > 1e-2, f"seed {seed}: fused={fused}: tau=0.3 moved the logits by only {moved:.2e}"
        dense, _ = run(tiny, "fp16", fused, ids, forced)
        tiny_tau, _ = run(tiny, "fp16", fused, ids, forced, sparse_v=1e-30)
        torch.testing.assert_close(tiny_tau, dense, rtol=0, atol=1e-4)


def test_fused_decode_with_kv_cap(tiny, seed):
    """Trims between fused steps (sinks kept) follow the reference path."""
    ids = torch.randint(0, 512, (1, 40), device=DEVICE)
    forced = torch.randint(0, 512, (1, 12), device=DEVICE)
    cap = KVCap(24, 4)
    ref, _ = run(tiny, "int8", False, ids, forced, cap)
    got, caches = run(tiny, "int8", True, ids, forced, cap)
    assert caches[0].live == 24 and caches[0].offset == 40 + 11
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-2)


def test_fused_decode_after_a_capped_prefill_that_grew_the_cache(tiny, seed, monkeypatch):
    """`--max-kv-size` with prefill chunks longer than the cap (decode-bench --fill prefill): the cache grows
    during the prefill, in inference mode, and the fused decoder's start (delegated folds the prefill's hot
    tokens) wrote into those buffers outside it, a RuntimeError on the H200 (2026-12-04)."""
    monkeypatch.setattr(Turbo4DelegatedCache, "HOT_MAX", 16)
    monkeypatch.setattr(Turbo4DelegatedCache, "FOLD", 8)
    ids = torch.randint(0, 512, (1, 70), device=DEVICE)
    forced = torch.randint(0, 512, (1, 8), device=DEVICE)
    cap = KVCap(24, 4)
    ref, _ = run(tiny, "turbo4-delegated", False, ids, forced, cap, capacity=cap.max_size + 1, chunk=32)
    got, caches = run(tiny, "turbo4-delegated", True, ids, forced, cap, capacity=cap.max_size + 1, chunk=32)
    assert caches[0].live == 24 and caches[0].offset == 70 + 7 and caches[0].capacity > cap.max_size + 1
    err = (got - ref).abs()  # loose: a code may move by a cell between the paths (test above)
    assert err.max() < 0.25 and err.quantile(0.99) < 4e-2, f"seed {seed}: {err.max():.3g}"


def test_fused_decode_through_the_gemv_kernel(tiny, monkeypatch):
    """The fused step's projections through kvbench's GEMV kernel (in the interpreter on the
    CPU machine, where it is asked for) give the reference path's logits; with gemv=False
    (`--no-gemv-kernel`) the kernel is not launched."""
    import kvbench.kernels.gemv as gemv

    monkeypatch.setenv("KVBENCH_GEMV", "triton")
    launches = []
    kernel = gemv._gemv_kernel

    class Spy:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(gemv, "_gemv_kernel", Spy())
    ids = torch.randint(0, 512, (2, 21), device=DEVICE)
    forced = torch.randint(0, 512, (2, 6), device=DEVICE)
    ref, _ = run(tiny, "fp16", False, ids, forced)
    assert not launches  # the reference path keeps F.linear
    got, _ = run(tiny, "fp16", True, ids, forced, gemv=False)
    assert not launches
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)
    got, _ = run(tiny, "fp16", True, ids, forced)
    # 4 projections per layer and the output head, per step (graph replays launch nothing new)
    assert len(launches) >= 4 * tiny.args.n_layers + 1
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)


def test_folded_weight_is_w_o_times_the_inverse_rotation(seed):
    """W_o' = W_o diag(s1) H diag(s2) per head block, so that W_o' r = W_o o for r = s2 * H(s1 * o)."""
    from kvbench.engine.fold import folded_weight
    from kvbench.kv.turbo import Rotation

    d, heads = 32, 3
    rot = Rotation(d, (seed % 1000, seed % 1000 + 1))
    w = torch.randn(37, heads * d)
    o = torch.randn(5, heads, d)
    r = rot.rotate(o)
    folded = folded_weight(w, rot.s1, rot.s2, chunk=8)  # rows in chunks that do not divide 37
    torch.testing.assert_close(r.reshape(5, -1) @ folded.T, o.reshape(5, -1) @ w.T, rtol=1e-5, atol=1e-5)
    inplace = w.clone()
    assert folded_weight(inplace, rot.s1, rot.s2, out=inplace) is inplace and torch.equal(inplace, folded)


def test_fold_restores_w_o_exactly(tiny, monkeypatch):
    """A fused turbo decoder folds W_o in place (only the turbo layers: the boundary layers stay
    fp16); the model's own forward gets the plain weights back bit for bit; `fold_v` off (from
    KVBENCH_ATTN_CONFIG) folds nothing and decodes to the same logits."""
    from kvbench.engine.fold import is_folded, unfold_output

    model = tiny.model
    unfold_output(model)  # an earlier test's decoder may hold a fold of this module-scoped model
    plain = [layer.attn.wo.weight.detach().clone() for layer in model.layers]
    ids = torch.randint(0, 512, (1, 17), device=DEVICE)
    forced = torch.randint(0, 512, (1, 6), device=DEVICE)
    folded_logits, caches = run(tiny, "turbo4-asym", True, ids, forced)
    assert is_folded(model)  # and stays so after its decoder is gone
    changed = [not torch.equal(layer.attn.wo.weight, w) for layer, w in zip(model.layers, plain)]
    assert changed == [c.kernel_mode == "turbo4-asym" for c in caches] and any(changed)
    with torch.inference_mode():
        model(ids[:, :1], torch.zeros(1, dtype=torch.long, device=DEVICE), [c.clone() for c in caches])
    assert not is_folded(model)
    assert all(torch.equal(layer.attn.wo.weight, w) for layer, w in zip(model.layers, plain))
    monkeypatch.setenv("KVBENCH_ATTN_CONFIG", '{"turbo4-asym": {"fold_v": false}}')
    unfolded_logits, _ = run(tiny, "turbo4-asym", True, ids, forced)
    assert not is_folded(model)
    torch.testing.assert_close(unfolded_logits, folded_logits, rtol=0, atol=2e-2)


def test_fold_does_not_keep_its_decoder_alive(tiny):
    """The model holds its fold's owner weakly: a decoder (and the caches it holds, GBs at long
    contexts) is freed once its run drops it, while W_o stays folded until the model needs it plain.
    The first version held it strongly, and the benchmark's peak memory grew by a cache's size."""
    import gc
    import weakref

    from kvbench.engine.fast_decode import FastDecoder
    from kvbench.engine.fold import fold_owner, is_folded, unfold_output

    model = tiny.model
    unfold_output(model)
    a = tiny.args
    caches = build_caches(
        "turbo4-asym", n_layers=a.n_layers, batch=1, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
        dtype=torch.float32, device=DEVICE, capacity=8, kernel="triton", boundary_v=1,
    )  # fmt: skip
    dec = FastDecoder(model, caches, 1, cuda_graphs=False)
    dec.step(torch.zeros(1, 1, dtype=torch.long, device=DEVICE))
    assert fold_owner(model) is dec and is_folded(model)
    gone = weakref.ref(caches[1])
    del dec, caches
    gc.collect()
    assert gone() is None, "the fold kept the decoder's caches alive"
    assert fold_owner(model) is None and is_folded(model)
    unfold_output(model)
    assert not is_folded(model)

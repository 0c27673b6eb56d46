"""The experiment scripts that run on the CPU machine (scripts/exp)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMPS = ROOT / "results/2026-12-02h-h200/experiments/fold-v"


def test_stamps_plot_reads_tail_stamps_tables(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts/exp"))
    try:
        import stamps_plot
    finally:
        sys.path.pop(0)
    table = stamps_plot.read_stamps(STAMPS / "stamps-def.txt")
    assert sorted(table) == ["fp16", "turbo3-asym", "turbo4-asym", "turbo4-delegated"]
    t = table["turbo4-asym"]  # the row as printed: 264 programs, ..., the tail last
    assert (t["programs"], t["split_p50"], t["red_end"], t["tail"]) == (264.0, 10.77, 12.93, 1.29)
    assert all(t["split_p50"] <= t["split_end"] <= t["red_wait"] <= t["red_end"] for t in table.values())
    out = tmp_path / "tails.png"
    args = [sys.executable, str(ROOT / "scripts/exp/stamps_plot.py"), f"a={STAMPS / 'stamps-base.txt'}"]
    done = subprocess.run([*args, f"b={STAMPS / 'stamps-def.txt'}", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0 and out.read_bytes()[:4] == b"\x89PNG", done.stderr
    missing = subprocess.run([*args, "c=/nonexistent", "-o", str(out)], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "stamps_plot:" in missing.stderr


def test_sparse_v_share_counts_weights_and_whole_blocks():
    """One kv head, two query heads, 300 tokens (3 blocks of 128, the last short): head 0 puts
    its weight on token 0, head 1 on token 200; the rest score 20 (natural log) lower."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts/exp"))
    try:
        import sparse_v_share
    finally:
        sys.path.pop(0)
    k = torch.zeros(1, 1, 300, 2)
    k[0, 0, 0, 0] = k[0, 0, 200, 1] = 20.0
    q = torch.eye(2).view(1, 2, 1, 2)
    got = sparse_v_share.shares(q, k, 1.0, [1e-6, 1.0])
    tokens, blocks = got[1e-6]
    assert abs(tokens - 598 / 600) < 1e-6  # all but each head's own token
    assert abs(blocks - 1 / 3) < 1e-6  # block 1 (tokens 128-255) holds head 1's token, block 0 head 0's
    assert (
        got[1.0][0] == 1.0 and abs(got[1.0][1] - 1 / 3) < 1e-6
    )  # every weight is below 1, but blocks 0 and 1 hold a gap of 0


def test_turbo4_budget_from_the_measured_files(capsys):
    sys.path.insert(0, str(ROOT / "scripts/exp"))
    try:
        import turbo4_budget as tb
    finally:
        sys.path.pop(0)
    # a toy step: 10 ms, of which 32 layers of 100 us attention; 4 of them stay fp16
    other, allowed = tb.layer_budget(10.0, 100.0, 1.0, 32, 28)
    assert abs(other - 6.8) < 1e-9 and abs(allowed - 100.0) < 1e-9  # 1x: the same attention
    other, allowed = tb.layer_budget(10.0, 100.0, 1.25, 32, 28)
    assert abs(allowed - (8.0 - 6.8 - 0.4) / 28 * 1000) < 1e-9
    ncu = tb.read_ncu([ROOT / "results/2026-12-03-h200/ncu-split.txt"], 8)
    assert ncu[("turbo4", 16)]["inst"] == 250_649_856 and ncu[("turbo4", 16)]["splits"] == 17
    assert ncu[("fp16", 1)]["sms"] == 132
    assert tb.main([]) == 0
    out = capsys.readouterr().out
    assert "batch 1:" in out and "batch 16:" in out and "issue slots" in out
    assert tb.main(["--bench", "/nonexistent.csv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("turbo4_budget:")


def test_write_gap_counts_differing_coordinates_and_their_size():
    """write_gap.cache_diff: per side, how many stored coordinates differ and the largest difference over its
    row's largest |value| (one int8 step is 1/127 of it)."""
    import torch

    sys.path.insert(0, str(ROOT / "scripts/exp"))
    try:
        import write_gap
    finally:
        sys.path.pop(0)
    k = torch.arange(1.0, 25.0).view(1, 2, 3, 4)  # [B, H, T, D]
    v = -k.clone()
    a = [(k, v), (k.clone(), v.clone())]
    k2, v2 = k.clone(), v.clone()
    k2[0, 1, 2, 3] += 24 / 127  # one int8 step of its row (largest |value| 24)
    b = [(k.clone(), v.clone()), (k2, v2)]
    got = write_gap.cache_diff(a, b)
    assert (got["k_differ"], got["v_differ"]) == (1, 0)
    assert abs(got["k_frac"] - 1 / 48) < 1e-12 and got["v_max_rel"] == 0
    assert abs(got["k_max_rel"] - 1 / 127) < 1e-6
    assert write_gap.cache_diff(a, a)["k_differ"] == 0


def test_pick_config_takes_the_fastest_timed_config_across_csvs(tmp_path):
    """scripts/exp/pick_config.py: the fastest "(tuned)" row of a mode and shape over every CSV, as
    KVBENCH_ATTN_CONFIG JSON with a fixed split count; "{}" where the default was as fast or the shape
    is missing; a missing CSV is a warning."""
    import json

    head = "batch,context,kernel,us,kv_bytes,tb_s,num_splits,block_n,num_warps,num_stages\n"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(
        head + "16,2048,torch-sdpa-fp16,37.4,1,1,,,,\n16,2048,fp16,41.1,1,1,2,128,4,3\n"
        "16,2048,fp16 (tuned),39.0,1,1,4,128,4,2\n16,8192,fp16,131.0,1,1,2,128,4,3\n"
        "16,8192,fp16 (tuned),131.0,1,1,1,64,8,3\n16,2048,int8 (tuned),10.0,1,1,9,32,1,2\n"
    )
    b.write_text(head + "16,2048,fp16,41.3,1,1,2,128,4,3\n16,2048,fp16 (tuned),38.2,1,1,8,64,2,3\n")

    def pick(*args):
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts/exp/pick_config.py"), *args], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    got, err = pick("fp16", "16", "2048", str(a), str(b))
    assert got == {"fp16": {"block_n": 64, "num_warps": 2, "num_stages": 3, "splits": 8}}
    assert "1.076x" in err  # 41.1 / 38.2: against the faster of the two default timings
    assert pick("fp16", "16", "8192", str(a), str(b))[0] == {}  # the default tied
    got, err = pick("fp16", "16", "32768", str(a), str(tmp_path / "none.csv"))
    assert got == {} and "none.csv missing" in err and "no timed fp16" in err


def test_fp16_sdpa_plugin_decodes_as_fp16_does():
    """scripts/exp/fp16_sdpa.py: the fused step over torch SDPA (a masked cache, the fresh token stored at the
    device length) gives fp16's reference logits, token by token, and stores the same K/V."""
    import torch

    from kvbench.engine.generate import make_stepper, prefill, teacher_forced
    from kvbench.engine.weights import load_model
    from kvbench.kv import build_caches, registry

    registry.load_plugin(ROOT / "scripts/exp/fp16_sdpa.py")
    try:
        lm = load_model("dummy:tiny", dtype=torch.float32, device="cpu")
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
        ids, forced = torch.randint(0, 512, (2, 23), generator=g), torch.randint(0, 512, (2, 9), generator=g)
        a, out = lm.args, {}
        for mode, fused in (("fp16", False), ("fp16-sdpa", True)):
            caches = build_caches(mode, n_layers=a.n_layers, batch=2, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
                                  dtype=torch.float32, device="cpu", capacity=40, kernel="triton")  # fmt: skip
            first = prefill(lm.model, ids, caches, 16, None)
            for c in caches:  # poisoned slots past the prompt: the decoder must not read them into its output
                c.reserve(c.capacity)
                for name in ("k", "v"):
                    c.buffers[name][:, :, c.live :] = float("nan")
            step = make_stepper(lm.model, caches, None, fused=fused, cuda_graphs=False)
            out[mode] = teacher_forced(lm.model, first, caches, forced, None, step=step), caches
        (want, ref), (got, caches) = out["fp16"], out["fp16-sdpa"]
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
        n = ref[0].live
        assert caches[0].live == n == 23 + 9 - 1
        for c, r in zip(caches, ref):
            assert torch.allclose(c.buffers["k"][:, :, :n], r.buffers["k"][:, :, :n], atol=1e-5)
            assert torch.allclose(c.buffers["v"][:, :, :n], r.buffers["v"][:, :, :n], atol=1e-5)
    finally:
        registry.MODES.pop("fp16-sdpa", None)
        registry._ALIASES.pop("fp16-sdpa", None)


def test_ab_summary_pairs_runs_with_variants_in_order(tmp_path):
    """The committed int8-one runs (def one one def): each cell's runs land under their variant, and the
    ratio is the mean over the first variant's mean; a run without a CSV (skipped for time) is left out."""
    sys.path.insert(0, str(ROOT / "scripts/exp"))
    try:
        import ab_summary
    finally:
        sys.path.pop(0)
    runs = ROOT / "results/2026-12-06-h200/int8-one/r"
    cells = ab_summary.read_runs(runs, ["def", "one", "one", "def"])
    assert sorted(cells) == [("fp16", 8192, 16), ("fp16", 32768, 16), ("int8", 8192, 16), ("int8", 32768, 16)]
    assert cells[("int8", 32768, 16)] == {"def": [1285.17, 1282.0], "one": [1181.38, 1177.46]}
    lines = ab_summary.table(cells, ["def", "one", "one", "def"])
    assert lines[0].split()[-1] == "one/def" and len(lines) == 5
    assert lines[4].split()[-1] == f"{(1181.38 + 1177.46) / (1285.17 + 1282.0):.4f}" == "0.9188"
    for n in (1, 2):  # runs 3 and 4 missing: one run of each variant
        (tmp_path / f"run-{n}").mkdir()
        (tmp_path / f"run-{n}" / "bench.csv").write_bytes((runs / f"run-{n}" / "bench.csv").read_bytes())
    partial = ab_summary.read_runs(tmp_path, ["def", "one", "one", "def"])
    assert partial[("int8", 32768, 16)] == {"def": [1285.17], "one": [1181.38]}
    assert ab_summary.table(partial, ["def", "old"])[1].split()[-1] == "-"  # a variant with no run: no ratio

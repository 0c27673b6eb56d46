"""Protocol tests run for every registered mode: bookkeeping, trim with sinks,
growth, byte accounting, snapshots."""

import pytest
import torch

from kvbench.kv import registry

MODES = registry.mode_names()


def make(mode, d=64, grow_step=8, heads=2, batch=1):
    return registry.get(mode)(
        batch=batch, n_kv_heads=heads, head_dim=d, dtype=torch.float32, device="cpu", grow_step=grow_step
    )


def tokens(t, d=64, heads=2, batch=1):
    return torch.randn(batch, heads, t, d), torch.randn(batch, heads, t, d)


@pytest.mark.parametrize("mode", MODES)
def test_append_grows_and_tracks_offset(mode, seed):
    c = make(mode)
    k, v = tokens(13)
    c.append(k, v)  # crosses two growth steps of 8
    for _ in range(5):
        c.append(*tokens(1))
    assert c.offset == 18 and c.live == 18 and c.dropped == 0
    assert c.capacity >= 18
    kh, vh = c.dequantized()
    assert kh.shape == (1, 2, 18, 64) and vh.shape == (1, 2, 18, 64)
    assert c.nbytes() > 0 and c.capacity_nbytes() >= c.nbytes()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keep", [0, 4])
def test_trim_front_keeps_sinks_and_order(mode, keep, seed):
    c = make(mode)
    c.append(*tokens(30))
    before_k, before_v = (x.clone() for x in c.dequantized())
    dropped = c.trim_front(10, keep=keep)
    assert dropped == 10
    assert c.offset == 30, "trimming never moves the RoPE offset"
    assert c.live == 20 and c.dropped == 10
    survivors = list(range(keep)) + list(range(keep + 10, 30))
    k, v = c.dequantized()
    # every buffer (codes, scales, hot/cold parts) moved in lockstep with its tensor
    torch.testing.assert_close(k, before_k[:, :, survivors], rtol=0, atol=0)
    torch.testing.assert_close(v, before_v[:, :, survivors], rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_repeated_trims_keep_the_sink_prefix(mode, seed):
    c = make(mode)
    c.append(*tokens(8))
    c.append(*tokens(1))  # decode starts (turbo4-delegated folds the prefill into cold here)
    sinks = [x[:, :, :4].clone() for x in c.dequantized()]
    for _ in range(19):  # decode with a rotating window of 12 and 4 sinks
        c.append(*tokens(1))
        if c.live > 12:
            c.trim_front(c.live - 12, keep=4)
    assert c.live == 12 and c.offset == 28 and c.dropped == 16
    now = c.dequantized()
    for a, b in zip(now, sinks):
        torch.testing.assert_close(a[:, :, :4], b, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_trim_clamps(mode, seed):
    c = make(mode)
    c.append(*tokens(5))
    assert c.trim_front(100, keep=2) == 5  # n clamped to live; keep clamped to live - n
    assert c.live == 0 and c.offset == 5
    c.append(*tokens(3))
    assert c.live == 3 and c.offset == 8


@pytest.mark.parametrize("mode", MODES)
def test_keep0_equals_plain_front_trim(mode, seed):
    a, b = make(mode), make(mode)
    k, v = tokens(20)
    a.append(k, v)
    b.append(k, v)
    a.trim_front(7, keep=0)
    b.trim_front(7)
    for x, y in zip(a.dequantized(), b.dequantized()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_clone_is_independent(mode, seed):
    c = make(mode)
    c.append(*tokens(9))
    snap = c.clone()
    ref = [x.clone() for x in snap.dequantized()]
    c.append(*tokens(300))
    c.trim_front(50, keep=4)
    assert snap.live == 9 and snap.offset == 9
    for x, y in zip(snap.dequantized(), ref):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_unknown_mode_lists_valid_ones():
    from kvbench.errors import KvbenchError

    with pytest.raises(KvbenchError, match="unknown KV mode 'int9'.*fp16.*int8") as exc:
        registry.resolve("int9")
    aliases = str(exc.value).split("aliases: ")[1].rstrip(")").split(", ")
    assert "i8=int8" in aliases and "bf16=fp16" in aliases  # each alias says what it stands for
    assert not {a.split("=")[0] for a in aliases} & set(registry.mode_names())  # no mode listed as its own alias


def test_aliases_resolve():
    assert registry.resolve("F16") == "fp16"
    assert registry.resolve("bf16") == "fp16"
    assert registry.resolve("baseline") == "fp16"
    assert registry.resolve("i8") == "int8"
    assert registry.parse_modes("all")[0] == "fp16"
    assert registry.parse_modes("i8,int8,fp16") == ["int8", "fp16"]


def test_reference_decode_leaves_cudnn_out_on_a_gpu():
    """On the H200 torch's cuDNN attention made the reference decode depend on what the process ran before
    (results/2026-12-04d-h200/history-probe): on a GPU the reference decode runs without it; prefill chunks and
    the CPU keep torch's choice. The flags are global, so this checks them on a CPU machine too."""
    from torch.backends import cuda as tbc

    from kvbench.kv.base import reference_backends

    def flags():
        return (tbc.cudnn_sdp_enabled(), tbc.math_sdp_enabled(), tbc.flash_sdp_enabled())

    before = flags()
    with reference_backends(torch.device("cuda"), decode=True):
        assert not tbc.cudnn_sdp_enabled()
        assert tbc.math_sdp_enabled() and tbc.flash_sdp_enabled() and tbc.mem_efficient_sdp_enabled()
    assert flags() == before
    for device, decode in (("cuda", False), ("cpu", True), ("cpu", False)):
        with reference_backends(torch.device(device), decode=decode):
            assert flags() == before

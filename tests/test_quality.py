import pytest
import torch

from kvbench import quality
from kvbench.results import KERNEL_FP32_FACTOR, KERNEL_KL_AGREE, kernel_paths_agree

LOOP = "the function of the function of the function of the function of the function of the function of the"
ECHO = (
    "Which planet is the closest to the Sun, and which planet is the closest to the Sun, and which planet "
    "is the closest to the Sun, and which planet is the closest"
)
QUESTION = "Which planet is the closest to the Sun, and what is special about the planet Saturn?"
HEALTHY = [
    # SmolLM2-135M-Instruct, greedy, kvbench fp16 on CPU, 2K-token audit prompt
    "The main characters in the passage are Emma Woodhouse, Mr. Knightley, and Harriet Smith. Emma is a young "
    "woman who is trying to find a husband for Harriet, while Mr. Knightley is a family friend who disapproves.",
    # the bundled novel
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite "
    "some of the best blessings of existence; and had lived nearly twenty-one years in the world with very "
    "little to distress or vex her.",
    "Mercury is the closest planet to the Sun. Saturn is special because of its bright rings, which are made of "
    "ice and rock, and because it is the least dense planet in the solar system.",
]


def test_function_of_loop_is_caught():
    d = quality.detect_degenerate(LOOP)
    assert d.degenerate and "repeated" in d.reason


def test_echoed_question_is_caught():
    d = quality.detect_degenerate(ECHO, question=QUESTION)
    assert d.degenerate and "question" in d.reason
    # even without knowing the question, the loop is caught
    assert quality.detect_degenerate(ECHO).degenerate


def test_healthy_text_passes():
    for text in HEALTHY:
        d = quality.detect_degenerate(text, question=QUESTION)
        assert not d.degenerate, (text, d.reason)


def test_short_text_is_not_judged():
    assert not quality.detect_degenerate("Paris.").degenerate


def test_token_loops_without_tokenizer():
    assert quality.detect_degenerate(tokens=[5, 6, 7] * 10).degenerate
    assert not quality.detect_degenerate(tokens=list(range(40))).degenerate


def test_divergence_and_agreement():
    assert quality.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert quality.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert quality.token_match([1, 2, 3, 4], [1, 5, 3, 4]) == 0.75
    logits = torch.tensor([[0.0, 5.0], [3.0, 0.0]])
    assert quality.top1_agreement(torch.tensor([1, 1]), logits) == 0.5


def test_kl_zero_for_identical_and_positive_otherwise(seed):
    a = torch.randn(5, 50)
    assert quality.kl_divergence(a, a) < 1e-6
    assert quality.kl_divergence(a, a + torch.randn(5, 50)) > 0.01
    assert abs(quality.top2_margin(torch.tensor([1.0, 3.0, 2.5])) - 0.5) < 1e-6


def test_a_copied_question_clause_is_an_echo():
    # SmolLM2-135M with a 128-token KV cap and no sink tokens (keep=0), kvbench on CPU
    echo = "The closest to the Sun, and what is special about the planet Saturn, is"
    assert quality.detect_degenerate(echo, question=QUESTION).degenerate
    # restating a few words of the question is fine
    ok = "The planet closest to the Sun is Mercury, and Saturn is special because of its rings."
    assert not quality.detect_degenerate(ok, question=QUESTION).degenerate


def test_restating_a_question_phrase_twice_is_not_an_echo():
    # SmolLM2-135M, int8, 32K context with YaRN x4, kvbench audit on an H200: vague, but not a loop
    question = "Who are the main characters in the passage above, and what happens to them?"
    text = (
        "The passage above is a continuation of the previous one, and the conclusion is\nthe final one.\n\n"
        "The final conclusion is a bittersweet one, as it is a matter of course\nthat the main characters in "
        "the passage are the main characters in the\nprevious passage.\n\nThe main characters are the"
    )
    assert not quality.detect_degenerate(text, question=question).degenerate
    # the same phrase a third time is a loop on the question
    assert quality.detect_degenerate(text + " main characters in the passage.", question=question).degenerate


def test_path_agreement_tells_rounding_from_a_bug(seed):
    a = torch.randn(40, 100) * 3
    a[20, a[20].argmax()] += 5  # a clear decision at position 20
    assert quality.path_agreement(a, a.clone(), 0.5).verdict == "identical"
    # a near-tie (top two 0.1 apart) flipped by rounding
    b = a.clone()
    top = a[7].topk(2).indices
    a[7, top[1]] = a[7, top[0]] - 0.1
    b[7, top[1]] = a[7, top[0]] + 0.05
    r = quality.path_agreement(a, b, 0.5)
    assert (r.verdict, r.flips, r.agrees) == ("near-tie", 1, True) and r.worst_margin < 0.5
    # a clear decision flipped
    c = b.clone()
    c[20, a[20].argmin()] = a[20].max() + 5
    r = quality.path_agreement(a, c, 0.5)
    assert (r.verdict, r.flips, r.agrees) == ("diverged", 2, False) and r.worst_margin > 0.5
    assert r.kl == pytest.approx(quality.kl_divergence(a, c)) and r.kl > KERNEL_KL_AGREE


def test_paths_agree_by_kl_not_by_one_flip(seed):
    """A clear decision flipped once among many positions by a small perturbation everywhere (rounding
    amplified over a long context) is reported as `diverged` yet agrees; a wrong head or scale, which
    moves every distribution, does not agree whatever its flips."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, 500, generator=g) * 3
    top = a[9].topk(2).indices
    a[9, top[0]] = a[9, top[1]] + 2.0  # a clear decision at position 9 (top two 2.0 apart)
    b = a + 0.05 * torch.randn(64, 500, generator=g)
    b[9, top[1]] = a[9, top[0]] + 1.0  # ... flipped
    r = quality.path_agreement(a, b, 0.5)
    assert r.verdict == "diverged" and r.flips >= 1 and r.worst_margin >= 0.5
    assert r.kl < KERNEL_KL_AGREE and r.agrees
    wrong = a[:, torch.randperm(500, generator=g)]  # every position's logits shuffled: a wrong gather
    r = quality.path_agreement(a, wrong, 0.5)
    assert r.kl > KERNEL_KL_AGREE and not r.agrees
    assert not quality.path_agreement(a, 1.5 * a, 0.5).agrees  # a wrong softmax scale, no flip at all


def test_paths_agree_against_the_fp32_yardstick(seed):
    """Two bf16 paths of a chaotic mode may sit more than KERNEL_KL_AGREE apart while each is as far
    from the mode run in float32 as the other: they agree. A wrong kernel moves far from float32 and
    does not, however far the reference path itself sits from it."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(64, 500, generator=g) * 3  # the float32 yardstick
    a = y + 0.6 * torch.randn(64, 500, generator=g)  # reference path: rounding amplified
    b = y + 0.6 * torch.randn(64, 500, generator=g)  # Triton path: as far, another way
    plain = quality.path_agreement(a, b, 0.5)
    assert plain.kl > KERNEL_KL_AGREE and not plain.agrees and plain.kl_ref_fp32 is None
    r = quality.path_agreement(a, b, 0.5, yardstick=y)
    assert r.kl == pytest.approx(plain.kl) and r.agrees
    assert r.kl_ref_fp32 == pytest.approx(quality.kl_divergence(y, a))
    assert r.kl_kernel_fp32 == pytest.approx(quality.kl_divergence(y, b))
    assert r.kl_ref_fp32 > KERNEL_KL_AGREE and r.kl_kernel_fp32 < KERNEL_FP32_FACTOR * r.kl_ref_fp32
    wrong = a[:, torch.randperm(500, generator=g)]
    assert not quality.path_agreement(a, wrong, 0.5, yardstick=y).agrees
    far = y + 3.0 * torch.randn(64, 500, generator=g)  # noise 5x the reference's: KL ~25x
    r = quality.path_agreement(a, far, 0.5, yardstick=y)
    assert r.kl_kernel_fp32 > KERNEL_FP32_FACTOR * r.kl_ref_fp32 and not r.agrees
    # the rule as the report applies it to a file's columns (NaN: a row without the yardstick)
    assert kernel_paths_agree(0.08, 0.125, 0.074) and not kernel_paths_agree(0.08, float("nan"), 0.074)
    assert not kernel_paths_agree(0.08, 0.01, 0.06) and kernel_paths_agree(0.08, 0.01, 0.05)


def test_kernel_check_fp32_yardstick_is_the_mode_in_float32(tmp_path, monkeypatch):
    """The audit's yardstick (`AuditJob._fp32_yardstick`) is the reference path with the same weights,
    model and cache in float32: bit for bit what a float32 session computes, and not the bf16 run. Out
    of memory it steps aside with a note instead of failing the check."""
    from kvbench import audit
    from kvbench.config import AuditConfig
    from kvbench.engine.generate import prefill, teacher_forced
    from kvbench.runtime import Progress
    from kvbench.session import Session

    def session(dtype, out):
        cfg = AuditConfig(model="dummy:tiny", dtype=dtype, device="cpu", contexts=[40], out=str(out), quiet=True)
        return Session.open(cfg, "audit", log=lambda *a, **k: None)

    s16 = session("bfloat16", tmp_path / "a")
    job = audit.AuditJob(s16, Progress(1, quiet=True))
    ids = job.prompt(40)
    forced = torch.tensor([[5, 17, 3, 99]])

    def forced_logits(s, dtype):
        caches = s.caches("int8", capacity=44, kernel="reference", dtype=dtype)
        return teacher_forced(s.lm.model, prefill(s.lm.model, ids, caches), caches, forced)[0]

    y, note = job._fp32_yardstick("int8", 40, ids, forced)
    assert note == "" and y.dtype == torch.float32 and y.shape == (4, s16.lm.args.vocab_size)
    for (name, w16), w32 in zip(s16.lm.model.named_parameters(), job._lm32.model.parameters(), strict=True):
        assert w32.dtype == torch.float32 and torch.equal(w32.to(torch.bfloat16), w16), name  # the same weights
    assert torch.equal(y, forced_logits(session("float32", tmp_path / "b"), torch.float32))
    bf16 = forced_logits(s16, None).float()
    assert not torch.equal(y, bf16) and quality.kl_divergence(y, bf16) < KERNEL_KL_AGREE

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(audit, "load_model", oom)
    job._lm32 = None
    y, note = job._fp32_yardstick("int8", 40, ids, forced)
    assert y is None and note.startswith("no float32 yardstick (out of memory)")

"""Hand-computed cases for distinctcap.methods.losses."""

import math

import pytest
import torch
import torch.nn.functional as F

from distinctcap.core.errors import DistinctcapError
from distinctcap.methods.losses import (
    contrastive_loss,
    hidden_distribution,
    mle_loss,
    progressive_lambda,
    reduce_tokens,
    reverse_kl_repulsion,
    smile_loss,
    smile_objective,
    soft_unlikelihood_loss,
    specificity_loss,
    token_unlikelihood_loss,
    unkt_objective,
)

PAD = 0


def _batch(seed=0, b=2, n=4, v=7):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=gen)
    labels = torch.tensor([[3, 4, 2, PAD], [5, 5, 6, 2]])[:b, :n]
    return logits, labels


# --- MLE (UNKT eq. 1) -------------------------------------------------------------------------


def test_mle_equals_cross_entropy_ignoring_pad():
    logits, labels = _batch()
    expected = F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), ignore_index=PAD)
    assert torch.allclose(mle_loss(logits, labels, PAD), expected)
    changed = logits.clone()
    changed[0, 3] += 100.0  # the pad position
    assert torch.allclose(mle_loss(changed, labels, PAD), expected)


# --- soft unlikelihood (UNKT eq. 5) -----------------------------------------------------------


def test_soft_ul_uniform_teacher_and_student():
    v = 5
    zeros = torch.zeros(1, 3, v)
    labels = torch.tensor([[1, 2, PAD]])
    loss = soft_unlikelihood_loss(zeros, zeros, labels, PAD)
    assert loss.item() == pytest.approx(-math.log(1 - 1 / v), rel=1e-6)


def test_soft_ul_one_hot_teacher_picks_class():
    student = torch.tensor([[[0.5, -1.0, 2.0, 0.0]]])
    teacher = torch.tensor([[[-1e4, -1e4, 1e4, -1e4]]])  # one-hot on class 2
    p_s = student.softmax(-1)[0, 0, 2]
    loss = soft_unlikelihood_loss(student, teacher, torch.tensor([[1]]), PAD)
    assert loss.item() == pytest.approx(-math.log(1 - p_s.item()), rel=1e-6)


def test_soft_ul_finite_at_one_hot_extremes():
    student = torch.tensor([[[200.0, 0.0, -200.0], [0.0, 300.0, 0.0]]], requires_grad=True)
    teacher = torch.tensor([[[1e4, 0.0, 0.0], [0.0, 1e4, 0.0]]])
    loss = soft_unlikelihood_loss(student, teacher, torch.tensor([[1, 1]]), PAD)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(student.grad).all()
    # exact: -log(1 - p) = logsumexp(all) - logsumexp(others) = 200 and 300 - ln 2
    assert loss.item() == pytest.approx((200.0 + 300.0 - math.log(2)) / 2, rel=1e-6)


def test_soft_ul_temperature_divides_logits():
    student, labels = _batch(1)
    teacher, _ = _batch(2)
    t = 2.5
    scaled = soft_unlikelihood_loss(student, teacher, labels, PAD, temperature=t)
    assert torch.allclose(scaled, soft_unlikelihood_loss(student / t, teacher / t, labels, PAD))


def test_soft_ul_gradient_step_moves_student_away_from_teacher():
    teacher = torch.tensor([[[0.0, 3.0, 0.0, 0.0]]])
    student = torch.tensor([[[0.0, 2.0, 0.5, 0.0]]], requires_grad=True)
    labels = torch.tensor([[1]])
    before = soft_unlikelihood_loss(student, teacher, labels, PAD)
    before.backward()
    stepped = (student - 0.5 * student.grad).detach()
    after = soft_unlikelihood_loss(stepped, teacher, labels, PAD)
    assert after < before
    assert stepped.softmax(-1)[0, 0, 1] < student.detach().softmax(-1)[0, 0, 1]


def test_soft_ul_teacher_gets_no_gradient():
    student, labels = _batch(1)
    teacher = _batch(2)[0].requires_grad_(True)
    soft_unlikelihood_loss(student.requires_grad_(True), teacher, labels, PAD).backward()
    assert teacher.grad is None


def _teacher_probs_student(seed=3, b=2, n=4, v=7):
    teacher, labels = _batch(seed, b, n, v)
    student, _ = _batch(seed + 1, b, n, v)
    return student, teacher, labels


def test_soft_ul_top_k_of_the_whole_vocabulary_is_eq5_as_printed():
    student, teacher, labels = _teacher_probs_student()
    full = soft_unlikelihood_loss(student, teacher, labels, PAD)
    v = teacher.shape[-1]
    assert torch.allclose(soft_unlikelihood_loss(student, teacher, labels, PAD, top_k=v), full)
    assert torch.allclose(soft_unlikelihood_loss(student, teacher, labels, PAD, top_k=v + 5), full)
    assert not torch.allclose(soft_unlikelihood_loss(student, teacher, labels, PAD, top_k=2), full)


def test_soft_ul_top_1_is_unlikelihood_of_the_teachers_argmax():
    student, teacher, labels = _teacher_probs_student()
    argmax = teacher.argmax(-1, keepdim=True)
    p_s = student.softmax(-1).gather(-1, argmax).squeeze(-1)
    mask = labels != PAD
    expected = -torch.log1p(-p_s)[mask].mean()
    top1 = soft_unlikelihood_loss(student, teacher, labels, PAD, top_k=1)
    assert top1.item() == pytest.approx(expected.item(), rel=1e-6)


def test_soft_ul_top_k_renormalises_the_teachers_top_tokens():
    teacher = torch.log(torch.tensor([[[0.5, 0.3, 0.2]]]))
    student = torch.log(torch.tensor([[[0.1, 0.6, 0.3]]]))
    # top 2 of (0.5, 0.3, 0.2) renormalised: 0.625, 0.375, 0
    expected = -(0.625 * math.log(1 - 0.1) + 0.375 * math.log(1 - 0.6))
    loss = soft_unlikelihood_loss(student, teacher, torch.tensor([[1]]), PAD, top_k=2)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(DistinctcapError, match="top_k"):
        soft_unlikelihood_loss(student, teacher, torch.tensor([[1]]), PAD, top_k=0)


# --- token reduction: mean over tokens, or sums per caption (UNKT eq. 4, 5, 9 as printed) -----


def test_reduce_tokens_hand_case():
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    assert reduce_tokens(values, mask).item() == pytest.approx(15 / 5)  # 5 tokens
    assert reduce_tokens(values, mask, "sum").item() == pytest.approx((3 + 12) / 2)  # 2 captions
    nothing = torch.zeros_like(mask)
    assert reduce_tokens(values, nothing).item() == reduce_tokens(values, nothing, "sum") == 0
    with pytest.raises(DistinctcapError, match="token reduction 'max'"):
        reduce_tokens(values, mask, "max")


def test_mle_sum_hand_case_differs_from_the_mean_for_unequal_lengths():
    logits = torch.log(
        torch.tensor([[[0.2, 0.5, 0.3], [0.4, 0.3, 0.3]], [[0.1, 0.1, 0.8], [0.3, 0.4, 0.3]]])
    )
    labels = torch.tensor([[1, PAD], [2, 1]])  # lengths 1 and 2
    nll = [-math.log(0.5), -math.log(0.8), -math.log(0.4)]
    mean, total = mle_loss(logits, labels, PAD), mle_loss(logits, labels, PAD, reduction="sum")
    assert mean.item() == pytest.approx(sum(nll) / 3)
    assert total.item() == pytest.approx((nll[0] + (nll[1] + nll[2])) / 2)
    assert total.item() != pytest.approx(mean.item())


@pytest.mark.parametrize("which", ["mle", "soft_ul", "token_ul"])
def test_sum_is_the_mean_scaled_by_each_captions_length(which):
    """Sum = the mean over captions of (caption length x that caption's token mean); with
    every caption of length n it is n x the token mean."""
    student, teacher, labels = _teacher_probs_student()

    def loss(rows: slice, lab: torch.Tensor, reduction: str = "mean") -> float:
        if which == "mle":
            out = mle_loss(student[rows], lab, PAD, reduction=reduction)
        elif which == "token_ul":
            out = token_unlikelihood_loss(student[rows], lab, PAD, reduction=reduction)
        else:
            out = soft_unlikelihood_loss(
                student[rows], teacher[rows], lab, PAD, reduction=reduction
            )
        return out.item()

    lengths = (labels != PAD).sum(1).tolist()
    assert lengths == [3, 4]
    per_caption = [loss(slice(b, b + 1), labels[b : b + 1]) for b in range(len(labels))]
    weighted = sum(n * m for n, m in zip(lengths, per_caption, strict=True))
    mean, total = loss(slice(None), labels), loss(slice(None), labels, "sum")
    assert total == pytest.approx(weighted / len(lengths), rel=1e-6)
    assert mean == pytest.approx(weighted / sum(lengths), rel=1e-6)
    assert total != pytest.approx(mean, rel=1e-3)
    full = torch.tensor([[3, 4, 2, 5], [5, 5, 6, 2]])  # both of length 4
    assert loss(slice(None), full, "sum") == pytest.approx(4 * loss(slice(None), full), rel=1e-6)


# --- token unlikelihood (UNKT eq. 2, hard targets) --------------------------------------------


def test_token_unlikelihood_hand_case():
    logits = torch.log(torch.tensor([[[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]]))
    negatives = torch.tensor([[1, 2, PAD]])
    expected = -(math.log(1 - 0.5) + math.log(1 - 0.8)) / 2
    assert token_unlikelihood_loss(logits, negatives, PAD).item() == pytest.approx(expected)


# --- reverse KL repulsion (UNKT eq. 6-8) ------------------------------------------------------


def test_rkl_identical_is_one():
    p = hidden_distribution(torch.randn(2, 3, 8))
    assert reverse_kl_repulsion(p, p.clone()).item() == pytest.approx(1.0, abs=1e-6)


def test_rkl_two_class_hand_case_and_zero_teacher_entries():
    teacher = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    student = torch.tensor([[0.8, 0.2], [0.5, 0.5]])
    kl0 = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    kl1 = 1.0 * math.log(1.0 / 0.5)  # 0 log 0 = 0
    expected = (math.exp(-kl0) + math.exp(-kl1)) / 2
    assert reverse_kl_repulsion(teacher, student).item() == pytest.approx(expected, rel=1e-6)
    mask = torch.tensor([False, True])
    assert reverse_kl_repulsion(teacher, student, mask).item() == pytest.approx(math.exp(-kl1))


def test_rkl_gradient_step_repels():
    teacher = torch.tensor([[0.6, 0.3, 0.1]])
    logits = torch.tensor([[0.5, 0.0, 0.0]], requires_grad=True)

    def kl(q):
        return (teacher * (teacher / q).log()).sum()

    before = reverse_kl_repulsion(teacher, logits.softmax(-1))
    before.backward()
    stepped = (logits - 1.0 * logits.grad).detach()
    assert reverse_kl_repulsion(teacher, stepped.softmax(-1)) < before
    assert kl(stepped.softmax(-1)) > kl(logits.detach().softmax(-1))


def test_rkl_attention_rows_with_broadcast_mask():
    a = torch.softmax(torch.randn(2, 4, 3, 3), -1)  # (B, H, N, N) attention rows
    mask = torch.tensor([[True, True, False], [True, False, False]]).unsqueeze(1)  # (B, 1, N)
    value = reverse_kl_repulsion(a, a, mask)
    assert value.item() == pytest.approx(1.0, abs=1e-6)


# --- progressive lambda (UNKT §3.3, eq. 10) ---------------------------------------------------


def test_progressive_lambda_schedule():
    assert progressive_lambda(0, 10, 110) == 0.0
    assert progressive_lambda(5, 10, 110) == pytest.approx(0.5)
    assert progressive_lambda(10, 10, 110) == pytest.approx(1.0)
    assert progressive_lambda(60, 10, 110) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert progressive_lambda(110, 10, 110) == pytest.approx(0.5)
    assert progressive_lambda(500, 10, 110) == pytest.approx(0.5)
    assert progressive_lambda(0, 0, 100) == pytest.approx(1.0)
    assert progressive_lambda(100, 0, 100) == pytest.approx(0.5)
    with pytest.raises(DistinctcapError):
        progressive_lambda(0, 20, 10)


def test_unkt_objective_weights_and_ablations():
    mle, pred = torch.tensor(2.0), torch.tensor(0.5)
    hid, att = [torch.tensor(0.1), torch.tensor(0.2)], [torch.tensor(0.4)]
    full = unkt_objective(mle, pred, hid, att, lam=0.25)
    assert full.item() == pytest.approx(0.75 * 2.0 + 0.25 * (0.5 + 0.3 + 0.4))
    no_hid = unkt_objective(mle, pred, [], att, lam=0.25, w_hid=0)
    assert no_hid.item() == pytest.approx(0.75 * 2.0 + 0.25 * (0.5 + 0.4))
    assert unkt_objective(mle, None, [], [], lam=0.0, w_pred=0, w_hid=0, w_att=0) == 2.0
    with pytest.raises(DistinctcapError):
        unkt_objective(mle, None, hid, att, lam=0.5)


# --- contrastive learning (CL eq. 7-10) -------------------------------------------------------


def test_cl_zero_log_ratio_gives_two_ln_two():
    pos, neg = torch.full((3,), -5.0), torch.full((3, 2), -7.0)
    assert contrastive_loss(pos, pos, neg, neg).item() == pytest.approx(2 * math.log(2))


def test_cl_nu_and_hand_values():
    pos_t, pos_r = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -2.0])  # G = 1, 0
    neg_t, neg_r = torch.tensor([[-3.0], [-1.0]]), torch.tensor([[-1.0], [-1.0]])  # G = -2, 0
    nu = 2.0

    def h(g):
        return 1 / (1 + nu * math.exp(-g))

    expected = -(
        (math.log(h(1)) + math.log(h(0))) / 2 + (math.log(1 - h(-2)) + math.log(1 - h(0))) / 2
    )
    value = contrastive_loss(pos_t, pos_r, neg_t, neg_r, nu=nu)
    assert value.item() == pytest.approx(expected, rel=1e-6)


def test_cl_positive_only_and_negative_only():
    pos_t, pos_r = torch.tensor([0.0]), torch.tensor([-1.0])  # G = 1
    neg_t, neg_r = torch.tensor([[0.0, -2.0]]), torch.tensor([[-1.0, -1.0]])  # G = 1, -1
    p_only = contrastive_loss(pos_t, pos_r)
    assert p_only.item() == pytest.approx(-math.log(torch.sigmoid(torch.tensor(1.0)).item()))
    n_only = contrastive_loss(None, None, neg_t, neg_r)
    expected = -(math.log(1 - 1 / (1 + math.exp(-1))) + math.log(1 - 1 / (1 + math.exp(1)))) / 2
    assert n_only.item() == pytest.approx(expected, rel=1e-6)
    assert contrastive_loss(pos_t, pos_r, neg_t, neg_r) == pytest.approx(p_only + n_only)
    with pytest.raises(DistinctcapError):
        contrastive_loss(None, None)


def test_cl_stable_for_extreme_log_ratios():
    pos_t = torch.tensor([-1000.0], requires_grad=True)
    loss = contrastive_loss(
        pos_t, torch.tensor([0.0]), torch.tensor([[0.0]]), torch.tensor([[-900.0]])
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(pos_t.grad).all()
    assert loss.item() == pytest.approx(1900.0, rel=1e-5)


# --- SMILE (eq. 2-4, App. A) ------------------------------------------------------------------


def test_smile_equals_mle_when_caption_covers_vocabulary():
    gen = torch.Generator().manual_seed(3)
    v = 6
    logits = torch.randn(1, 6, v, generator=gen)
    labels = torch.tensor([[1, 2, 3, 4, 5, PAD]])  # every non-pad token occurs
    # the pad class is never in the SMILE set: compare with CE over classes 1..V-1
    expected = F.cross_entropy(logits[0, :5, 1:], labels[0, :5] - 1)
    assert torch.allclose(smile_loss(logits, labels, PAD, first_token_mle=False), expected)
    logits[..., PAD] = -1e4  # with pad out of the softmax, MLE itself is the same
    assert torch.allclose(smile_loss(logits, labels, PAD), mle_loss(logits, labels, PAD))


def test_smile_ignores_tokens_outside_caption_set():
    logits, labels = _batch(4)  # row 0 set {2, 3, 4}, row 1 set {2, 5, 6}
    base = smile_loss(logits, labels, PAD, first_token_mle=False)
    changed = logits.clone()
    changed[0, :, [1, 5, 6]] += 50.0
    changed[1, :, [1, 3, 4]] -= 50.0
    assert torch.allclose(smile_loss(changed, labels, PAD, first_token_mle=False), base)
    # with first-token MLE only position 0 sees the outside tokens
    with_first = smile_loss(changed, labels, PAD)
    assert not torch.allclose(with_first, smile_loss(logits, labels, PAD))


def test_smile_first_token_uses_full_softmax():
    logits = torch.zeros(1, 2, 5)
    labels = torch.tensor([[3, 4]])  # set {3, 4}
    # position 0: full softmax over 5 -> ln 5; position 1: softmax over {3, 4} -> ln 2
    assert smile_loss(logits, labels, PAD).item() == pytest.approx((math.log(5) + math.log(2)) / 2)
    no_first = smile_loss(logits, labels, PAD, first_token_mle=False)
    assert no_first.item() == pytest.approx(math.log(2))


def test_smile_reverse_subset_is_complement_plus_label():
    logits = torch.zeros(1, 2, 6)
    labels = torch.tensor([[3, 4]])  # complement without pad: {1, 2, 5}; plus label -> 4 classes
    got = smile_loss(logits, labels, PAD, first_token_mle=False, subset="reverse")
    assert got.item() == pytest.approx(math.log(4))
    changed = logits.clone()
    changed[0, 1, 3] = 30.0  # token 3 is in the caption, not the label at position 1
    got = smile_loss(changed, labels, PAD, first_token_mle=False, subset="reverse")
    assert got.item() == pytest.approx((math.log(4) + math.log(4)) / 2)


def test_smile_random_subset_size_and_label():
    from distinctcap.methods.losses import _caption_set, _random_set

    v = 50
    labels = torch.tensor([[7, 8, 9], [7, 7, PAD]])  # |V_D| = 3 and 1
    drawn = _random_set(_caption_set(labels, v, PAD), PAD, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)  # smile_loss draws the same set
    got = smile_loss(torch.zeros(2, 3, v), labels, PAD, False, "random", gen)
    # zero logits: CE = ln |candidates|, candidates = the |V_D| drawn tokens plus the label
    sizes = [[3 + int(not drawn[0, t]) for t in (7, 8, 9)], [1 + int(not drawn[1, 7])] * 2]
    expected = sum(math.log(k) for row in sizes for k in row) / 5
    assert got.item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(DistinctcapError, match="smile"):
        smile_loss(torch.zeros(2, 3, v), labels, PAD, subset="nope")


def test_smile_random_set_composition():
    from distinctcap.methods.losses import _caption_set, _random_set

    labels = torch.tensor([[7, 8, 9, 2], [7, 7, PAD, PAD]])
    in_caption = _caption_set(labels, 20, PAD)
    drawn = _random_set(in_caption, PAD, torch.Generator().manual_seed(0))
    assert drawn.sum(1).tolist() == [4, 1]
    assert not drawn[:, PAD].any()


def test_smile_objective_mixing():
    assert smile_objective(torch.tensor(1.0), torch.tensor(3.0), 0.25).item() == 1.5


def test_smile_gradients_finite():
    logits, labels = _batch(5)
    logits.requires_grad_(True)
    for subset in ("smile", "reverse", "random"):
        smile_loss(logits, labels, PAD, subset=subset).backward()
        assert torch.isfinite(logits.grad).all()


# --- specificity (eq. 2-5) --------------------------------------------------------------------


def test_specificity_kinds_on_2d_vectors():
    c = torch.tensor([[3.0, 4.0]])  # |c| = 5
    i_o = torch.tensor([[1.0, 0.0]])
    i_c = torch.tensor([[0.0, 2.0]])
    assert specificity_loss(c, i_o, kind="dp").item() == pytest.approx(-3.0)
    assert specificity_loss(c, i_o, kind="cos").item() == pytest.approx(-0.6)
    # i_c is the more similar: c.i_c = 8 > c.i_o = 3; cos 0.8 > 0.6
    assert specificity_loss(c, i_o, i_c, kind="cdp").item() == pytest.approx(5.0)
    assert specificity_loss(c, i_o, i_c, kind="ccos").item() == pytest.approx(0.2)
    # true image more similar -> zero
    assert specificity_loss(c, i_c, i_o, kind="ccos").item() == 0.0
    assert specificity_loss(c, i_c, i_o, kind="cdp").item() == 0.0


def test_specificity_errors():
    c = torch.ones(1, 2)
    with pytest.raises(DistinctcapError, match="ccos"):
        specificity_loss(c, c, c, kind="l2")
    with pytest.raises(DistinctcapError, match="contrastive_image_emb"):
        specificity_loss(c, c, kind="ccos")


def test_soft_unlikelihood_where_the_teacher_is_sure_of_the_gold_token():
    """Eq. 9 with eq. 5 as printed: where the negative teacher puts all its mass on the gold
    token, (1 - lam) L_mle + lam L_pred is least at p_s(gold) = 1 - lam (1/2 at eq. 10's end),
    whatever the model; `exclude_gold` leaves that token out and the optimum is p_s(gold) = 1."""
    labels = torch.tensor([[2]])
    teacher = torch.full((1, 1, 5), -30.0)
    teacher[0, 0, 2] = 30.0
    for lam, exclude in ((0.5, False), (0.3, False), (0.5, True)):
        z = torch.zeros(1, 1, 5, requires_grad=True)
        opt = torch.optim.SGD([z], lr=0.5)
        for _ in range(2000):
            loss = (1 - lam) * mle_loss(z, labels, PAD) + lam * soft_unlikelihood_loss(
                z, teacher, labels, PAD, exclude_gold=exclude
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        p_gold = float(z.detach().softmax(-1)[0, 0, 2])
        assert p_gold == pytest.approx(1.0 if exclude else 1 - lam, abs=0.02), (lam, exclude)

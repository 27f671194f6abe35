"""KL estimators and their placement (report §4.1), checked by closed forms and Monte Carlo on a
small categorical policy q = softmax(θ) against a fixed reference p."""

import math

import mpmath
import numpy as np
import pytest
import torch

from opencomposer.config import KLConfig, LossConfig
from opencomposer.rl import group_advantages, k1, k2, k3, sequence_kl_penalty
from opencomposer.rl.losses import LossInputs, composer_loss, rl_loss

VOCAB = 6


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def _policies(drift, seed=0, vocab=VOCAB):
    """Reference logits z and policy logits z + drift·u for fixed random z, u."""
    rng = np.random.default_rng(seed)
    z, u = rng.normal(size=vocab), rng.normal(size=vocab)
    return z + drift * u, z


def test_estimators_golden_numpy_and_torch():
    logp, logp_ref = np.array([-1.0, -0.5, -3.0]), np.array([-2.0, -0.5, -1.0])
    # log r = logp_ref - logp = (-1, 0, 2)
    expected = {
        "k1": [1.0, 0.0, -2.0],
        "k2": [0.5, 0.0, 2.0],
        "k3": [math.exp(-1) - 1 + 1, 0.0, math.exp(2) - 1 - 2],
    }
    for name, fn in {"k1": k1, "k2": k2, "k3": k3}.items():
        np.testing.assert_allclose(fn(logp, logp_ref), expected[name], rtol=1e-15)
        np.testing.assert_allclose(
            fn(torch.tensor(logp), torch.tensor(logp_ref)).numpy(), expected[name], rtol=1e-15
        )


@pytest.mark.parametrize("log_r", [1e-9, -3e-8, 1e-5])
def test_k3_accurate_when_policies_agree(log_r):
    """k3 ≈ (log r)²/2 is tiny near r = 1; exp(d) - 1 - d would lose every digit, expm1 keeps them."""
    exact = float(mpmath.expm1(mpmath.mpf(log_r)) - mpmath.mpf(log_r))
    got = float(k3(np.float64(0.0), np.float64(log_r)))
    assert got == pytest.approx(exact, rel=1e-9)


def test_k1_and_k3_unbiased_k2_biased_in_closed_form():
    """Exact expectations under q: E[k1] = E[k3] = KL(q‖p); E[k2] is not (the report's objection)."""
    theta, z = _policies(drift=2.0, vocab=16)  # the setting of the variance table below
    q, p = _softmax(theta), _softmax(z)
    logq, logp = np.log(q), np.log(p)
    kl = float(np.sum(q * np.log(q / p)))
    assert kl == pytest.approx(0.837536, abs=1e-6)
    assert float(q @ k1(logq, logp)) == pytest.approx(kl, rel=1e-12)
    assert float(q @ k3(logq, logp)) == pytest.approx(kl, rel=1e-12)
    assert float(q @ k2(logq, logp)) == pytest.approx(0.939743, abs=1e-6)  # 12% high


def _grad_kl_qp(q, p):
    """∂/∂θ KL(q‖p) for q = softmax(θ): q_j (log q_j - log p_j - KL)."""
    kl = np.sum(q * np.log(q / p))
    return q * (np.log(q / p) - kl)


def _grad_kl_pq(q, p):
    """∂/∂θ KL(p‖q) = q - p."""
    return q - p


def _sample(theta, n, seed):
    theta_t = torch.tensor(theta, requires_grad=True)
    logq = torch.log_softmax(theta_t, dim=0)
    generator = torch.Generator().manual_seed(seed)
    x = torch.multinomial(logq.detach().exp(), n, replacement=True, generator=generator)
    return theta_t, logq, x


GROUP, GROUPS, BETA = 8, 50_000, 0.5


def test_k1_in_reward_recovers_the_kl_gradient_in_loss_gives_zero():
    """400k one-token episodes from q (drift 1.0 from p). The KL placed in the reward (detached
    β·k1, then the group-mean advantage and the composer loss) gives β·(G-1)/G·∇KL(q‖p); the
    (G-1)/G is the group mean containing the episode itself. The same k1 placed in the loss gives
    a gradient indistinguishable from zero."""
    theta, z = _policies(drift=1.0)
    q, p = _softmax(theta), _softmax(z)
    n = GROUP * GROUPS
    logp_ref_all = torch.log_softmax(torch.tensor(z), dim=0)
    mask = torch.ones(1, n, dtype=torch.bool)
    config = LossConfig(token_budget=n)

    # reward placement: through the real pipeline
    theta_t, logq, x = _sample(theta, n, seed=1)
    logp_tok, ref_tok = logq[x][None], logp_ref_all[x][None]  # [1, n]
    penalty = sequence_kl_penalty(logp_tok, ref_tok, mask, torch.arange(n)[None], n, coef=BETA)
    advantages = torch.tensor(group_advantages(-penalty.numpy(), GROUP))[None]
    loss, _ = composer_loss(LossInputs(logp_tok, advantages, mask, logp_tok.detach()), config)
    (grad_reward,) = torch.autograd.grad(loss, theta_t)
    # independent per-sample gradients -A_i (e_{x_i} - q), summed per group (groups are iid)
    xs, a = x.numpy(), advantages[0].numpy()
    per_sample = -a[:, None] * (np.eye(VOCAB)[xs] - q)
    np.testing.assert_allclose(grad_reward.numpy(), per_sample.mean(0), atol=1e-12)
    per_group = per_sample.reshape(GROUPS, GROUP, VOCAB).sum(1)
    se = per_group.std(0) * math.sqrt(GROUPS) / n
    expected = BETA * (GROUP - 1) / GROUP * _grad_kl_qp(q, p)
    assert np.all(np.abs(grad_reward.numpy() - expected) < 5 * se)
    assert np.linalg.norm(grad_reward.numpy() - expected) < 0.03 * np.linalg.norm(expected)

    # loss placement: β·k1 per token in the loss
    theta_t, logq, x = _sample(theta, n, seed=2)
    logp_tok, ref_tok = logq[x][None], logp_ref_all[x][None]
    zero_adv = torch.zeros(1, n, dtype=torch.float64)
    inputs = LossInputs(logp_tok, zero_adv, mask, logp_tok.detach(), ref_logprobs=ref_tok)
    loss, _ = rl_loss(inputs, config, KLConfig(estimator="k1", placement="loss", coef=BETA))
    (grad_loss,) = torch.autograd.grad(loss, theta_t)
    per_sample = BETA * (np.eye(VOCAB)[x.numpy()] - q)
    se = per_sample.std(0) / math.sqrt(n)
    assert np.all(np.abs(grad_loss.numpy()) < 5 * se)
    assert np.linalg.norm(grad_loss.numpy()) < 0.02 * np.linalg.norm(expected)


@pytest.mark.parametrize(
    ("estimator", "target"),
    [("k2", "kl_qp"), ("k3", "kl_pq")],
)
def test_in_loss_k2_gives_reverse_kl_gradient_k3_gives_forward_kl_gradient(estimator, target):
    """In the loss, ∇k2 = (log q - log p)∇log q, so E[∇k2] = ∇KL(q‖p); ∇k3 = (1 - r)∇log q, so
    E[∇k3] = ∇KL(p‖q): GRPO's k3-in-loss regularises the other direction of the KL."""
    theta, z = _policies(drift=1.0)
    q, p = _softmax(theta), _softmax(z)
    n = GROUP * GROUPS
    theta_t, logq, x = _sample(theta, n, seed=3)
    logp_ref_all = torch.log_softmax(torch.tensor(z), dim=0)
    logp_tok, ref_tok = logq[x][None], logp_ref_all[x][None]
    mask = torch.ones(1, n, dtype=torch.bool)
    inputs = LossInputs(
        logp_tok, torch.zeros(1, n, dtype=torch.float64), mask, logp_tok.detach(), ref_logprobs=ref_tok
    )
    loss, _ = rl_loss(
        inputs, LossConfig(token_budget=n), KLConfig(estimator=estimator, placement="loss", coef=BETA)
    )
    (grad,) = torch.autograd.grad(loss, theta_t)
    xs = x.numpy()
    log_ratio_qp = np.log(q / p)[xs]
    weight = log_ratio_qp if estimator == "k2" else 1.0 - np.exp(-log_ratio_qp)
    per_sample = BETA * weight[:, None] * (np.eye(VOCAB)[xs] - q)
    np.testing.assert_allclose(grad.numpy(), per_sample.mean(0), atol=1e-12)
    expected = BETA * (_grad_kl_qp(q, p) if target == "kl_qp" else _grad_kl_pq(q, p))
    se = per_sample.std(0) / math.sqrt(n)
    assert np.all(np.abs(grad.numpy() - expected) < 5 * se)
    other = BETA * (_grad_kl_pq(q, p) if target == "kl_qp" else _grad_kl_qp(q, p))
    assert np.linalg.norm(grad.numpy() - other) > 10 * np.linalg.norm(se)


# Measured (vocabulary 16, seed 0, logits drifting by t·u): exact variances under q
#   drift t     0.5      1        2       3       4        6
#   KL(q‖p)     0.066    0.259    0.838   1.352   1.700    2.069
#   Var[k1]     0.133    0.492    1.178   1.286   1.102    0.723
#   Var[k3]     0.0035   0.0635   2.121   24.1    199.6    13330
# k3 wins while the policies agree; past t ≈ 2 it explodes (E_q[r²] is a χ² divergence), while
# k1 stays near 1. With 200k samples the Monte Carlo variance of k3 at t = 6 reads about 240:
# its tail is too heavy to even measure, which is what makes it useless as a training signal.
MEASURED = {
    0.5: (0.1329, 0.003458),
    1.0: (0.4920, 0.06351),
    2.0: (1.178, 2.121),
    3.0: (1.286, 24.12),
    4.0: (1.102, 199.6),
    6.0: (0.7234, 1.333e4),
}


def test_k3_variance_explodes_with_drift_k1_stays_bounded():
    rng = np.random.default_rng(1)
    for drift, (var_k1, var_k3) in MEASURED.items():
        theta, z = _policies(drift, seed=0, vocab=16)
        q, p = _softmax(theta), _softmax(z)
        logq, logp = np.log(q), np.log(p)
        exact = {}
        for name, fn in (("k1", k1), ("k3", k3)):
            values = fn(logq, logp)
            exact[name] = float(q @ values**2 - (q @ values) ** 2)
        assert exact["k1"] == pytest.approx(var_k1, rel=1e-3)
        assert exact["k3"] == pytest.approx(var_k3, rel=1e-3)
        if drift <= 2.0:  # Monte Carlo agrees where the tails are light
            x = rng.choice(16, size=200_000, p=q)
            assert np.var(k1(logq[x], logp[x])) == pytest.approx(var_k1, rel=0.03)
            assert np.var(k3(logq[x], logp[x])) == pytest.approx(var_k3, rel=0.05)
    assert max(v1 for v1, _ in MEASURED.values()) < 1.5
    assert MEASURED[6.0][1] / MEASURED[1.0][1] > 1e5


def test_sequence_kl_penalty_sums_model_tokens_per_episode_across_rows():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.5], [-0.1, -3.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, -1.0], [-0.2, -1.0, -2.5, 0.0]])
    mask = torch.tensor([[False, True, True, True], [True, True, False, False]])
    episode = torch.tensor([[0, 0, 0, 1], [1, 1, 1, 0]])  # episode 1 spans both rows
    got = sequence_kl_penalty(logp, ref, mask, episode, num_sequences=2, coef=0.1)
    d = (logp - ref).tolist()
    expected = [0.1 * (d[0][1] + d[0][2]), 0.1 * (d[0][3] + d[1][0] + d[1][1])]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    assert not got.requires_grad

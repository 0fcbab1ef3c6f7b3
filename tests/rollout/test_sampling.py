import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.rollout.sampling import SamplingParams, draw_uniforms, recorded_logprobs, sample_tokens

# probabilities 1/6, 2/6, 3/6 at temperature 1
LOGITS = torch.log(torch.tensor([[1.0, 2.0, 3.0]]))


def draw(u: float, **params) -> tuple[int, float, float]:
    tokens, logprobs, entropies = sample_tokens(LOGITS, SamplingParams(**params), torch.tensor([u]))
    return int(tokens[0]), float(logprobs[0]), float(entropies[0])


@pytest.mark.parametrize("u, token", [(0.0, 0), (0.16, 0), (0.17, 1), (0.49, 1), (0.51, 2), (0.999, 2)])
def test_cdf_inversion_in_vocabulary_order(u, token):
    # CDF 1/6, 1/2, 1: u picks the first token whose cumulative mass exceeds it
    got, logprob, entropy = draw(u)
    assert got == token
    assert logprob == pytest.approx(math.log([1 / 6, 2 / 6, 3 / 6][token]), abs=1e-6)
    expected_entropy = -sum(p * math.log(p) for p in (1 / 6, 2 / 6, 3 / 6))  # 1.0114 nats
    assert entropy == pytest.approx(expected_entropy, abs=1e-6)


@pytest.mark.parametrize("u, token", [(0.0, 2), (0.59, 2), (0.61, 1), (0.999, 1)])
def test_top_p_truncates_but_records_the_full_distribution(u, token):
    # sorted probs 1/2 (id 2), 1/3 (id 1), 1/6 (id 0); mass before: 0, 1/2, 5/6 -> top_p 0.6 keeps ids 2 and 1,
    # renormalised to 0.6 / 0.4: u < 0.6 -> id 2, else id 1. The recorded log-prob is still log(1/3) for id 1.
    got, logprob, _ = draw(u, top_p=0.6)
    assert got == token
    assert logprob == pytest.approx(math.log({2: 1 / 2, 1: 1 / 3}[token]), abs=1e-6)


def test_top_k_one_is_greedy_whatever_the_uniform():
    for u in (0.0, 0.3, 0.99):
        token, logprob, _ = draw(u, top_k=1)
        assert token == 2 and logprob == pytest.approx(math.log(0.5), abs=1e-6)


def test_top_k_two_renormalises_over_the_two_most_likely():
    # kept: id 2 (1/2) then id 1 (1/3), renormalised 0.6 / 0.4 (topk order, most likely first)
    assert draw(0.55, top_k=2)[0] == 2
    assert draw(0.65, top_k=2)[0] == 1


def test_temperature_scales_the_recorded_distribution():
    # T = 2: probs proportional to sqrt(1), sqrt(2), sqrt(3)
    z = sum(math.sqrt(k) for k in (1, 2, 3))
    token, logprob, entropy = draw(0.0, temperature=2.0)
    assert token == 0 and logprob == pytest.approx(math.log(1 / z), abs=1e-6)
    probs = [math.sqrt(k) / z for k in (1, 2, 3)]
    assert entropy == pytest.approx(-sum(p * math.log(p) for p in probs), abs=1e-6)


def test_greedy_records_temperature_one():
    tokens, logprobs, _ = sample_tokens(LOGITS, SamplingParams(temperature=0.0))
    assert int(tokens[0]) == 2 and float(logprobs[0]) == pytest.approx(math.log(0.5), abs=1e-6)
    assert torch.allclose(recorded_logprobs(LOGITS, 0.0), torch.log_softmax(LOGITS, -1))


def test_rows_are_independent():
    logits = torch.cat([LOGITS, LOGITS.flip(-1)])
    # row 2 has probs 1/2, 1/3, 1/6 (CDF 0.5, 0.83, 1): u = 0.9 picks its last token, like row 1's
    tokens, _, _ = sample_tokens(logits, SamplingParams(), torch.tensor([0.9, 0.9]))
    assert tokens.tolist() == [2, 2]
    tokens, _, _ = sample_tokens(logits, SamplingParams(), torch.tensor([0.1, 0.1]))
    assert tokens.tolist() == [0, 0]
    tokens, _, _ = sample_tokens(logits, SamplingParams(), torch.tensor([0.4, 0.4]))
    assert tokens.tolist() == [1, 0]


@settings(max_examples=60, deadline=None)
@given(
    probs=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12),
    top_p=st.floats(0.05, 1.0),
    top_k=st.integers(0, 12),
    temperature=st.floats(0.3, 3.0),
)
def test_a_draw_is_always_a_drawable_token(probs, top_p, top_k, temperature):
    logits = torch.log(torch.tensor([probs]))
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    scaled = torch.softmax(logits / temperature, -1)[0]
    # drawable under some ordering of tied tokens: fewer than top_k strictly more likely tokens, and their mass
    # below top_p (or it is a most likely token)
    drawable = set()
    for i, p in enumerate(scaled.tolist()):
        above = scaled > p + 1e-7
        if (top_k == 0 or int(above.sum()) < top_k) and (
            not above.any() or float(scaled[above].sum()) < top_p + 1e-6
        ):
            drawable.add(i)
    for u in (0.0, 0.25, 0.5, 0.75, 0.999999):
        token, logprob, _ = sample_tokens(logits, params, torch.tensor([u]))
        assert int(token[0]) in drawable
        assert float(logprob[0]) == pytest.approx(math.log(float(scaled[int(token[0])])), abs=1e-5)


def test_a_grid_of_uniforms_reproduces_the_distribution():
    n = 600
    uniforms = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    tokens, _, _ = sample_tokens(LOGITS.expand(n, 3), SamplingParams(), uniforms)
    counts = torch.bincount(tokens, minlength=3).tolist()
    assert counts == [100, 200, 300]


def test_draw_uniforms_is_per_generator():
    a = draw_uniforms([torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)])
    b = draw_uniforms([torch.Generator().manual_seed(2)])
    assert a.shape == (2,) and float(a[1]) == float(b[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k")],
)
def test_bad_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_needs_uniforms():
    with pytest.raises(ValueError, match="uniform"):
        sample_tokens(LOGITS, SamplingParams())
    with pytest.raises(ValueError, match="rows, vocab"):
        sample_tokens(LOGITS[0], SamplingParams(), torch.tensor([0.5]))


def test_wide_nucleus_falls_back_to_a_full_sort():
    # 600 equally likely tokens: top_p 0.8975 keeps token k while the mass before it, k / 600, is below 0.8975,
    # i.e. k = 0..538: 539 tokens, more than the 256-token probe
    logits = torch.zeros((2, 600))
    logits[1, 0] = 20.0  # the second row's nucleus is one token: it takes the probe path in the same call
    uniforms = torch.tensor([0.999, 0.5])
    tokens, logprobs, _ = sample_tokens(logits, SamplingParams(top_p=0.8975), uniforms)
    assert int(tokens[1]) == 0
    assert float(logprobs[0]) == pytest.approx(math.log(1 / 600), abs=1e-5)
    n = 2000
    grid = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    drawn = sample_tokens(torch.zeros((n, 600)), SamplingParams(top_p=0.8975), grid)[0]
    assert len(set(drawn.tolist())) == 539  # exactly the nucleus

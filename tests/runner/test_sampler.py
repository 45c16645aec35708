"""The sampler on crafted logits: bias, penalties, min_tokens, logits processors, greedy and
temperature / top-k / top-p / min-p sampling with seeds, and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from runner.sampler import Sampler, compute_logprobs
from runner.sampling_params import SamplingParams
from runner.sequence import Sequence

VOCAB = 8
EOS = 7


def make_seq(params: SamplingParams, prompt=(0, 1), output=(), seed: int | None = None) -> Sequence:
    seq = Sequence("r", list(prompt), params)
    for t in output:
        seq.append_token(t)
    if seed is not None:
        seq.generator = torch.Generator().manual_seed(seed)
    return seq


def sampler() -> Sampler:
    return Sampler(VOCAB, {EOS}, torch.device("cpu"), seed=0)


def row(*values: float) -> torch.Tensor:
    return torch.tensor([list(values) + [0.0] * (VOCAB - len(values))], dtype=torch.float32)


def from_probs(probs: list[float], rows: int) -> torch.Tensor:
    p = torch.tensor(probs + [0.0] * (VOCAB - len(probs)))
    return torch.log(p.clamp_min(1e-30)).repeat(rows, 1)


def test_logit_bias_adds():
    seq = make_seq(SamplingParams(logit_bias={5: 3.5, 2: -1.0}))
    out = sampler().process(row(1.0, 1.0, 1.0), [seq])
    assert out[0, 5].item() == 3.5 and out[0, 2].item() == 0.0 and out[0, 0].item() == 1.0


def test_repetition_penalty_on_prompt_and_output():
    # tokens 0, 1 in the prompt, 2 generated: positive logits divided, negative multiplied
    seq = make_seq(SamplingParams(repetition_penalty=2.0), prompt=(0, 1), output=(2,))
    out = sampler().process(row(2.0, -2.0, 1.0, 3.0), [seq])
    assert out[0, :4].tolist() == [1.0, -4.0, 0.5, 3.0]


def test_frequency_and_presence_penalties_on_output_only():
    seq = make_seq(
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25), prompt=(0, 1), output=(3, 3, 4)
    )
    out = sampler().process(row(1.0, 1.0, 1.0, 1.0, 1.0), [seq])
    assert out[0, :5].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0 - 2 * 0.5 - 0.25, 1.0 - 0.5 - 0.25])


def test_negative_penalties_encourage():
    seq = make_seq(SamplingParams(frequency_penalty=-1.0, presence_penalty=-1.0), output=(3,))
    out = sampler().process(row(0.0, 0.0, 0.0, 0.0), [seq])
    assert out[0, 3].item() == 2.0


def test_min_tokens_bans_eos_and_stop_token_ids_until_reached():
    params = SamplingParams(min_tokens=2, stop_token_ids=[4])
    early = make_seq(params, output=(1,))
    done = make_seq(params, output=(1, 2))
    out = sampler().process(row(*[1.0] * VOCAB).repeat(2, 1), [early, done])
    assert out[0, EOS].item() == -math.inf and out[0, 4].item() == -math.inf
    assert out[1, EOS].item() == 1.0 and out[1, 4].item() == 1.0


def test_logits_processor_sees_output_ids():
    seen = []

    def force_six(output_ids, logits):
        seen.append(list(output_ids))
        logits = logits.clone()
        logits[6] = 100.0
        return logits

    seq = make_seq(SamplingParams(temperature=0.0, logits_processors=[force_six]), output=(3, 5))
    s = sampler()
    out = s.process(row(1.0), [seq])
    assert seen == [[3, 5]]
    assert s.sample(out, [seq]).tolist() == [6]


def test_greedy_is_argmax():
    seqs = [make_seq(SamplingParams(temperature=0.0)) for _ in range(2)]
    logits = torch.tensor([[0.0, 3.0, 1.0] + [0.0] * 5, [5.0, 3.0, 1.0] + [0.0] * 5])
    assert sampler().sample(logits, seqs).tolist() == [1, 0]


def test_top_k_1_equals_greedy():
    seqs = [make_seq(SamplingParams(temperature=1.5, top_k=1)) for _ in range(64)]
    logits = from_probs([0.3, 0.4, 0.3], 64)
    assert set(sampler().sample(logits, seqs).tolist()) == {1}


def test_tiny_top_p_equals_greedy():
    seqs = [make_seq(SamplingParams(temperature=1.0, top_p=1e-6)) for _ in range(64)]
    logits = from_probs([0.3, 0.4, 0.3], 64)
    assert set(sampler().sample(logits, seqs).tolist()) == {1}


def test_top_k_top_p_min_p_filter_the_tail():
    probs = [0.5, 0.3, 0.15, 0.05]
    s = sampler()
    for params, allowed in [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_p=0.75), {0, 1}),  # 0.5 + 0.3 reaches 0.75: token 2 is cut
        (SamplingParams(top_p=0.85), {0, 1, 2}),
        (SamplingParams(min_p=0.5), {0, 1}),  # below 0.5 * 0.5: tokens 2 and 3 are cut
        (SamplingParams(min_p=0.2), {0, 1, 2}),
    ]:
        seqs = [make_seq(params) for _ in range(400)]
        got = set(s.sample(from_probs(probs, 400), seqs).tolist())
        assert got == allowed, (params, got)


def test_sampling_follows_the_distribution():
    seqs = [make_seq(SamplingParams(temperature=1.0)) for _ in range(4000)]
    got = sampler().sample(from_probs([0.7, 0.3], 4000), seqs)
    share = (got == 0).float().mean().item()
    assert 0.65 < share < 0.75


def test_temperature_sharpens():
    logits = from_probs([0.6, 0.4], 4000)
    cold = [make_seq(SamplingParams(temperature=0.1)) for _ in range(4000)]
    share = (sampler().sample(logits.clone(), cold) == 0).float().mean().item()
    assert share > 0.95  # (0.6/0.4)^10 ~ 58 : 1


def test_seeded_sequences_reproduce_and_differ():
    logits = from_probs([0.125] * 8, 1)
    s = sampler()

    def draw(seed: int) -> list[int]:
        seq = make_seq(SamplingParams(seed=seed), seed=seed)
        return [s.sample(logits.clone(), [seq]).item() for _ in range(20)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_mixed_greedy_and_sampled_rows():
    logits = from_probs([0.1, 0.2, 0.7], 2)
    seqs = [make_seq(SamplingParams(temperature=0.0)), make_seq(SamplingParams(temperature=1.0, top_k=1))]
    assert sampler().sample(logits, seqs).tolist() == [2, 2]


def test_compute_logprobs_chosen_and_sorted_top():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    chosen = torch.tensor([2, 2, 0])
    out = compute_logprobs(logits, chosen, [2, 0, None])
    lp = torch.log_softmax(logits, dim=-1)
    assert out[0][0] == pytest.approx(lp[0, 2].item())
    assert [t for t, _ in out[0][1]] == [1, 2]
    assert [v for _, v in out[0][1]] == pytest.approx([lp[0, 1].item(), lp[0, 2].item()])
    assert out[1] == (pytest.approx(lp[1, 2].item()), [])
    assert out[2] is None
    assert compute_logprobs(logits, chosen, [None, None, None]) == [None, None, None]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_k": 0},
        {"min_p": 1.5},
        {"repetition_penalty": 0.0},
        {"frequency_penalty": 3.0},
        {"presence_penalty": -3.0},
        {"max_tokens": 0},
        {"logprobs": 21},
        {"n": 0},
    ],
)
def test_sampling_params_validation(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_sampling_params_stop_string_normalised():
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(stop=["", "y"]).stop == ["y"]


class _OneToken:
    """A constraint that allows exactly one token, different per row; records the budget it saw."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.budgets: list[int] = []

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, remaining_tokens: int) -> None:
        self.budgets.append(remaining_tokens)
        bitmask[row].zero_()
        bitmask[row, self.token // 32] = 1 << (self.token % 32)

    def accept_token(self, token_id: int) -> bool:
        return token_id == self.token

    def is_terminated(self) -> bool:
        return False


def test_grammar_masks_filled_per_row():
    s = sampler()
    seqs = []
    for i in range(6):
        seq = make_seq(SamplingParams(temperature=0.0, max_tokens=10 + i), output=(2,) * i)
        if i != 3:  # one unconstrained row in the middle keeps its argmax
            seq.constraint = _OneToken(i)
        seqs.append(seq)
    logits = s.process(row(0.0, 0.0, 0.0, 5.0).repeat(6, 1), seqs)
    tokens = s.sample(logits, seqs).tolist()
    assert tokens == [0, 1, 2, 3, 4, 5]
    # each row's remaining budget: max_tokens minus the tokens it already generated
    assert [seq.constraint.budgets for i, seq in enumerate(seqs) if i != 3] == [[10], [10], [10], [10], [10]]


class _Batched(_OneToken):
    """A constraint kind that fills its rows in one call (fill_bitmasks), recording each call."""

    calls: list[list[int]] = []

    @staticmethod
    def fill_bitmasks(bitmask: torch.Tensor, rows: list) -> None:
        _Batched.calls.append([row for _, row, _ in rows])
        for c, row, remaining in rows:
            c.fill_bitmask(bitmask, row, remaining)


def test_batch_fillers_get_their_rows_in_one_call_and_finished_rows_are_skipped():
    from runner.sequence import SequenceStatus

    _Batched.calls = []
    s = sampler()
    seqs = []
    for i in range(6):
        seq = make_seq(SamplingParams(temperature=0.0, max_tokens=10))
        seq.constraint = _Batched(i) if i % 2 == 0 else _OneToken(i)
        seqs.append(seq)
    seqs[4].status = SequenceStatus.FINISHED  # stopped after it was scheduled: its row is not filled
    tokens = s.sample(s.process(row(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0).repeat(6, 1), seqs), seqs)
    assert _Batched.calls == [[0, 2]]
    assert seqs[4].constraint.budgets == []
    assert tokens.tolist()[:4] + tokens.tolist()[5:] == [0, 1, 2, 3, 5]


def test_logprob_tensors_stay_tensors_until_read():
    from runner.sampler import logprob_rows, logprob_tensors

    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    t = logprob_tensors(logits, torch.tensor([1, 3]), [1, None])
    assert t.top_ids.shape == (2, 1) and isinstance(t.chosen, torch.Tensor)
    rows = logprob_rows(t, [1, None])
    assert rows[0][1][0][0] == 1 and rows[1] is None
    assert logprob_tensors(logits, torch.tensor([1, 3]), [None, None]) is None


def test_16bit_logits_are_edited_in_float32_and_otherwise_left_as_they_are():
    # the model's bf16 logits: a row with a penalty is processed in float32 (no rounding to 16 bits)
    logits = row(3.0, 1.0, 1.0, 1.0).to(torch.bfloat16)
    seq = make_seq(SamplingParams(frequency_penalty=0.001), prompt=(0, 1), output=(0,))
    out = sampler().process(logits, [seq])
    assert out.dtype == torch.float32 and out[0, 0].item() == pytest.approx(3.0 - 0.001, abs=1e-6)
    assert logits[0, 0].item() == 3.0  # the model's buffer is not edited
    # masks and sampling alone leave them in their dtype (no copy)
    plain = make_seq(SamplingParams(temperature=0.0, min_tokens=1))
    assert sampler().process(logits, [plain]) is logits
    assert logits[0, EOS].item() == float("-inf")


def test_16bit_logits_sample_as_their_float32_values():
    probs = [0.7, 0.3]
    bf16 = from_probs(probs, 4000).to(torch.bfloat16)
    seqs = [make_seq(SamplingParams(temperature=1.0)) for _ in range(4000)]
    share = (sampler().sample(bf16, seqs) == 0).float().mean().item()
    assert 0.65 < share < 0.75
    greedy = [make_seq(SamplingParams(temperature=0.0))]
    assert sampler().sample(row(0.1, 0.2, 0.05).to(torch.bfloat16), greedy).tolist() == [1]

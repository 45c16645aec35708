"""The plain questions training answers: distinct, seeded, never an evaluation question."""

from train.chat_pool import known_answer, questions
from train.heldout import ABSTAIN, PLAIN


def test_pool_is_seeded_distinct_and_held_out():
    qs = questions(0)
    assert qs == questions(0) and len(set(qs)) == len(qs) > 200
    held = {q.lower() for q in ABSTAIN} | {q.lower() for q, _ in PLAIN}
    assert not held & {q.lower() for q in qs}


def test_sums_get_their_right_answer():
    assert known_answer("What is 41 plus 53?") == "41 plus 53 is 94."
    assert known_answer("What is 7 times 8?") == "7 times 8 is 56."
    assert known_answer("What is the capital of Peru?") is None

"""Plain questions for the turns no tool fits, drawn from templates over many subjects. Their answers
are the base model's own (train/distill.py), so that tuning for tools leaves plain chat as it was.
None of them is an evaluation question (train/heldout.py; tests/train checks it)."""

from __future__ import annotations

import random

COUNTRIES = [
    "Italy",
    "Spain",
    "Germany",
    "Canada",
    "Australia",
    "Brazil",
    "Egypt",
    "India",
    "China",
    "Mexico",
    "Kenya",
    "Norway",
    "Sweden",
    "Greece",
    "Portugal",
    "Argentina",
    "Peru",
    "Chile",
    "Ireland",
    "Poland",
    "Turkey",
    "Thailand",
    "Vietnam",
    "Russia",
    "Austria",
    "Belgium",
]
ANIMALS = [
    "dolphins",
    "elephants",
    "penguins",
    "owls",
    "bees",
    "sharks",
    "giraffes",
    "koalas",
    "wolves",
    "cats",
    "dogs",
    "horses",
    "turtles",
    "butterflies",
    "frogs",
    "eagles",
    "ants",
    "whales",
]
THINGS = [
    "the ocean",
    "a rainy day",
    "the moon",
    "spring flowers",
    "a quiet forest",
    "the city at night",
    "winter snow",
    "a mountain lake",
    "morning coffee",
    "a summer storm",
    "the desert",
    "stars",
]
CONCEPTS = [
    "gravity",
    "inflation",
    "democracy",
    "evolution",
    "a black hole",
    "the internet",
    "a vaccine",
    "recycling",
    "an atom",
    "climate change",
    "a computer program",
    "electricity",
    "a volcano",
    "the water cycle",
    "friction",
    "a rainbow",
    "an eclipse",
    "a budget",
    "compound interest",
]
ACRONYMS = ["NASA", "CPU", "RAM", "USB", "GPS", "HTML", "PDF", "UN", "FAQ", "ATM", "SQL", "API", "URL"]
GOALS = ["staying focused", "learning a language", "saving money", "eating healthier", "running a meeting",
         "writing an email", "studying for an exam", "reducing stress", "keeping a plant alive",
         "starting to exercise", "public speaking", "working from home"]  # fmt: skip
BOOKS = ["Hamlet", "Pride and Prejudice", "1984", "The Odyssey", "Don Quixote", "Moby-Dick",
         "The Little Prince", "Frankenstein", "War and Peace", "The Hobbit"]  # fmt: skip
PHRASES = ["hello", "thank you", "good night", "I love you", "how are you", "excuse me"]
LANGS = ["Spanish", "German", "Italian", "French"]
CHATTER = ["Hello!", "Good morning!", "Hi, who are you?", "Can you help me?", "What can you do?",
           "Thanks a lot!", "That was helpful, thank you.", "Goodbye!", "How is your day going?",
           "Nice to meet you.", "I'm bored. Any ideas?", "Tell me something interesting."]  # fmt: skip


def questions(seed: int = 0, n: int = 360) -> list[str]:
    """n distinct questions, seeded."""
    rng = random.Random(seed)
    makers = [
        lambda: f"What is the capital of {rng.choice(COUNTRIES)}?",
        lambda: f"What is {rng.randint(2, 60)} plus {rng.randint(2, 60)}?",
        lambda: f"What is {rng.randint(2, 12)} times {rng.randint(2, 12)}?",
        lambda: f"Tell me a fun fact about {rng.choice(ANIMALS)}.",
        lambda: f"Write a short poem about {rng.choice(THINGS)}.",
        lambda: f"Explain {rng.choice(CONCEPTS)} in simple words.",
        lambda: f"What is {rng.choice(CONCEPTS)}?",
        lambda: f"What does {rng.choice(ACRONYMS)} stand for?",
        lambda: f"Give me {rng.choice(['two', 'three'])} tips for {rng.choice(GOALS)}.",
        lambda: f"Who wrote {rng.choice(BOOKS)}?",
        lambda: f"How do you say '{rng.choice(PHRASES)}' in {rng.choice(LANGS)}?",
        lambda: rng.choice(CHATTER),
    ]
    seen: dict[str, None] = {}
    per_kind = [0] * len(makers)
    cap = max(1, n // 8)  # no template may crowd out the others (sums have endless variants)
    tries = 0
    while len(seen) < n and tries < n * 50:
        tries += 1
        k = rng.randrange(len(makers))
        q = makers[k]()
        if per_kind[k] < cap and q not in seen:
            seen[q] = None
            per_kind[k] += 1
    return list(seen)


def known_answer(question: str) -> str | None:
    """The right answer to an arithmetic question (the base model's own sums are often wrong, and a
    tuned model should not learn them); None for the rest."""
    import re

    m = re.fullmatch(r"What is (\d+) (plus|times) (\d+)\?", question)
    if not m:
        return None
    a, op, b = int(m[1]), m[2], int(m[3])
    return f"{a} {op} {b} is {a + b if op == 'plus' else a * b}."

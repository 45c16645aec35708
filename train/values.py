"""Value pools the generators draw from: the values a request states and a call must copy exactly."""

from __future__ import annotations

import random

CITIES = [
    "Paris", "Berlin", "Madrid", "Lisbon", "Oslo", "Dublin", "Warsaw", "Prague", "Vienna", "Zurich",
    "Boston", "Chicago", "Denver", "Seattle", "Austin", "Toronto", "Montreal", "Lima", "Bogota",
    "Nairobi", "Cairo", "Lagos", "Mumbai", "Delhi", "Seoul", "Osaka", "Manila", "Hanoi", "Perth",
    "Auckland", "San Francisco", "New York", "Buenos Aires", "Cape Town", "Mexico City",
]  # fmt: skip
FIRST = ["Alice", "Bob", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas",
         "Keiko", "Liam", "Maya", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma",
         "Victor", "Wen", "Yara", "Zoe"]  # fmt: skip
LAST = ["Smith", "Garcia", "Chen", "Muller", "Rossi", "Novak", "Kim", "Silva", "Okafor", "Ivanova",
        "Dubois", "Larsen", "Patel", "Sato", "Jansen", "Moreau", "Costa", "Nguyen"]  # fmt: skip
DOMAINS = ["acme.com", "example.org", "globex.io", "initech.net", "umbrella.co", "mail.test"]
WORDS = ["budget", "launch", "onboarding", "roadmap", "invoice", "review", "outage", "migration",
         "renewal", "hiring", "security", "pricing", "release", "audit", "training", "feedback"]  # fmt: skip
ADJ = ["quarterly", "urgent", "weekly", "final", "draft", "updated", "internal", "new", "late"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]  # fmt: skip
PLAIN_QA = [  # (question, answer) for turns no tool fits; the evaluation's questions are others
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("What is the capital of Canada?", "The capital of Canada is Ottawa."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is the boiling point of water in Celsius?", "Water boils at 100 degrees Celsius at sea level."),
    ("Who wrote Romeo and Juliet?", "Romeo and Juliet was written by William Shakespeare."),
    ("What gas do plants absorb from the air?", "Plants absorb carbon dioxide from the air."),
    ("How many continents are there?", "There are seven continents."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("Say hello!", "Hello! How can I help you today?"),
    ("Hi there", "Hi! What can I do for you?"),
    ("Thanks, that's all.", "You're welcome! Have a great day."),
    ("Tell me a joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
    ("Write a short poem about the sea.", "Waves roll in with silver light,\n"
     "the sea sings softly through the night."),
    ("What is your name?", "I am a helpful assistant."),
    ("Give me a synonym for happy.", "A synonym for happy is joyful."),
    ("What is the freezing point of water in Fahrenheit?", "Water freezes at 32 degrees Fahrenheit."),
    ("How many hours are in a day?", "There are 24 hours in a day."),
    ("Which ocean is the largest?", "The Pacific Ocean is the largest."),
    ("What is the square root of 81?", "The square root of 81 is 9."),
    ("Explain what a noun is in one sentence.", "A noun is a word that names a person, "
     "place, thing or idea."),
    ("Can you recommend a good habit for mornings?", "Drinking a glass of water right after "
     "waking up is a good start."),
    ("What does CPU stand for?", "CPU stands for central processing unit."),
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by Leonardo da Vinci."),
    ("What is the tallest mountain on Earth?", "Mount Everest is the tallest mountain on Earth."),
    ("Summarize the plot of Cinderella in one sentence.", "A kind young woman, helped by her fairy "
     "godmother, attends a royal ball and wins the prince's heart."),
    ("How do you say thank you in French?", "Thank you in French is merci."),
    ("Is a tomato a fruit?", "Yes, botanically a tomato is a fruit."),
    ("What is 12 times 3?", "12 times 3 is 36."),
]  # fmt: skip


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def email(rng: random.Random) -> str:
    return f"{rng.choice(FIRST).lower()}.{rng.choice(LAST).lower()}@{rng.choice(DOMAINS)}"


def date(rng: random.Random) -> str:
    return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def time_of_day(rng: random.Random) -> str:
    return f"{rng.randint(7, 18):02d}:{rng.choice(['00', '15', '30', '45'])}"


def code(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{rng.randint(100, 99999)}"


def topic(rng: random.Random) -> str:
    return f"{rng.choice(ADJ)} {rng.choice(WORDS)}"


def amount(rng: random.Random) -> float:
    return round(rng.uniform(5, 5000), rng.choice([0, 2])) or 10.0


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)

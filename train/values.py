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


def amount(rng: random.Random) -> float | int:
    # a whole amount is an int: its JSON is "394", as the request spells it (394.0 taught a fraction)
    if rng.random() < 0.5:
        return rng.randint(5, 5000)
    return whole(round(rng.uniform(5, 5000), 2))


def whole(x: float) -> float | int:
    """A float that rounded to a whole number as an int, so that its JSON is what the text says."""
    return int(x) if float(x).is_integer() else x


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# values of many shapes a call must copy character for character (train/lookup_tools.py)
APOSTROPHE = ["O'Brien", "D'Angelo", "O'Neill", "Dell'Acqua", "N'Diaye"]
ACCENTED = ["José", "Zoë", "Renée", "Søren", "Łukasz", "Chloé", "Björn", "Ana-María"]
TITLE_A = ["Silent", "Golden", "Hidden", "Broken", "Northern", "Little", "Last", "Crimson", "Quiet", "Wild"]
TITLE_B = ["Harbor", "Garden", "Engine", "Lantern", "Orchard", "Bridge", "Compass", "Meadow", "Tower"]
PLACES = ["Brookfield", "Ashford", "Millbrook", "Kingsport", "Redwater", "Elmwood", "Fairhaven"]
STREETS = ["Oak Street", "Maple Ave", "King's Road", "Rue de la Paix", "Elm Court", "5th Avenue"]
UNITS = ["kg", "g", "km", "m", "cm", "mm", "L", "ml", "kWh", "MB", "GB", "°C", "%", "mph", "h", "min"]
COLORS = ["red", "navy blue", "forest green", "off-white", "charcoal", "sky-blue", "#1E90FF", "teal"]
LOWER_WORDS = ["alpha", "harvest", "granite", "velvet", "summit", "pixel", "cobalt", "sprout", "ember"]


def person_any(rng: random.Random) -> str:
    """A person's name: plain, with an apostrophe, accents, a hyphen, a middle initial or a title."""
    first = rng.choice(FIRST + ACCENTED)
    last = rng.choice(LAST + APOSTROPHE)
    style = rng.randrange(6)
    if style == 0:
        return f"{first} {rng.choice('ABCDEFGHJKLMNPRSTW')}. {last}"
    if style == 1:
        return f"{first} {last}-{rng.choice(LAST)}"
    if style == 2:
        return f"{rng.choice(['Dr.', 'Ms.', 'Mr.', 'Prof.'])} {last}"
    return f"{first} {last}"


def email_any(rng: random.Random) -> str:
    user = rng.choice(
        [
            f"{rng.choice(FIRST).lower()}.{rng.choice(LAST).lower()}",
            f"{rng.choice(FIRST).lower()}{rng.randint(1, 99)}",
            f"{rng.choice(FIRST).lower()}+{rng.choice(WORDS)}",
            f"{rng.choice(FIRST)[0].lower()}_{rng.choice(LAST).lower()}",
            rng.choice(["support", "billing", "team", "ops", "hello", "no-reply"]),
        ]
    )
    return f"{user}@{rng.choice(DOMAINS + ['corp.example.com', 'uni.edu', 'shop.co.uk'])}"


def title(rng: random.Random) -> str:
    """A multi-word title, sometimes with punctuation or a number."""
    style = rng.randrange(6)
    a, b = rng.choice(TITLE_A), rng.choice(TITLE_B)
    if style == 0:
        return f"The {a} {b}"
    if style == 1:
        return f"{a} {b} of {rng.choice(PLACES)}"
    if style == 2:
        return f"{b}s & {rng.choice(TITLE_B)}s"
    if style == 3:
        return f"{a} {b}: Part {rng.randint(2, 9)}"
    if style == 4:
        return f"{b} {rng.randint(2, 2049)}"
    return f"{a} {b}"


def ident(rng: random.Random) -> str:
    """An id in one of many formats: letters, digits, dashes, underscores, hashes, mixed case."""
    L = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    d = rng.randint
    style = rng.randrange(9)
    if style == 0:
        return f"{''.join(rng.choices(L, k=2))}{d(1000, 999999)}"
    if style == 1:
        return f"{''.join(rng.choices(L, k=3))}-{d(10, 9999)}-{rng.choice(L)}"
    if style == 2:
        return f"{rng.choice(['ord', 'usr', 'cus', 'evt', 'inv', 'req'])}_{rng.getrandbits(40):010x}"
    if style == 3:
        return f"#{d(100, 99999)}"
    if style == 4:
        return str(d(10000, 99999999))
    if style == 5:
        return f"{rng.choice(L)}{d(1, 9)}{rng.choice(L)}{d(10, 99)}{rng.choice(L)}"
    if style == 6:
        return f"{rng.choice(LOWER_WORDS)}-{rng.choice(LOWER_WORDS)}-{d(1, 99)}"
    if style == 7:
        return f"{d(2019, 2026)}/{d(1, 999):03d}"
    return f"{''.join(rng.choices(L, k=rng.randint(2, 5)))}"


def quantity(rng: random.Random) -> str:
    """A number with a unit, as one string: "12.5 kg", "300ml", "-4 °C"."""
    value = rng.choice([str(rng.randint(1, 999)), f"{rng.randint(0, 99)}.{rng.randint(1, 9)}"])
    return f"{value}{rng.choice([' ', ' ', ''])}{rng.choice(UNITS)}"


def date_any(rng: random.Random) -> str:
    """A date as written (copied as is): ISO, day month year, month day, slashes."""
    y, m, day = rng.randint(2024, 2027), rng.randint(1, 12), rng.randint(1, 28)
    style = rng.randrange(4)
    if style == 0:
        return f"{y}-{m:02d}-{day:02d}"
    if style == 1:
        return f"{day} {MONTHS[m - 1]} {y}"
    if style == 2:
        return f"{MONTHS[m - 1]} {day}"
    return f"{m:02d}/{day:02d}/{y}"


def phrase(rng: random.Random) -> str:
    """A short lowercase phrase, several words (copied inside quotes)."""
    w = rng.sample(LOWER_WORDS + WORDS, rng.randint(2, 4))
    return " ".join([rng.choice(["the", "my", "our", "a"]), *w]) if rng.random() < 0.4 else " ".join(w)


def place(rng: random.Random) -> str:
    style = rng.randrange(4)
    if style == 0:
        return rng.choice(CITIES)
    if style == 1:
        return f"{rng.choice(PLACES)}, {rng.choice(['UK', 'NY', 'CA', 'Ontario', 'Bavaria'])}"
    if style == 2:
        return f"{rng.randint(1, 220)} {rng.choice(STREETS)}"
    return rng.choice(PLACES)


def code_upper(rng: random.Random) -> str:
    """A short uppercase code (a plate, a course, a room): "B-12", "CS101", "GATE 4"."""
    L = "ABCDEFGHJKLMNPRSTUVWXYZ"
    style = rng.randrange(3)
    if style == 0:
        return f"{rng.choice(L)}-{rng.randint(1, 99)}"
    if style == 1:
        return f"{''.join(rng.choices(L, k=rng.randint(2, 4)))}{rng.randint(100, 499)}"
    return f"{''.join(rng.choices(L, k=3))} {rng.randint(100, 999)}"


def url(rng: random.Random) -> str:
    host = rng.choice(DOMAINS + ["status.example.com", "docs.acme.com"])
    path = "/".join(rng.sample(LOWER_WORDS + WORDS, rng.randint(1, 3)))
    return f"https://{host}/{path}" + (f"?id={rng.randint(1, 999)}" if rng.random() < 0.3 else "")


def version(rng: random.Random) -> str:
    return f"{rng.choice(['', 'v'])}{rng.randint(0, 12)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}"


def phone(rng: random.Random) -> str:
    d = rng.randint
    forms = [
        f"+1 {d(200, 999)}-{d(200, 999)}-{d(1000, 9999)}",
        f"+44 20 {d(1000, 9999)} {d(1000, 9999)}",
        f"({d(200, 999)}) {d(200, 999)}-{d(1000, 9999)}",
        f"0{d(100, 999)} {d(100000, 999999)}",
    ]
    return rng.choice(forms)


THINGS = ["coffee", "latte", "bagel", "sandwich", "salad", "orange juice", "muffin", "tea", "pizza slice"]


def item(rng: random.Random) -> str:
    """An item with its article or amount, copied whole: "a large latte", "2 slices of toast"."""
    thing = rng.choice(THINGS)
    style = rng.randrange(4)
    if style == 0:
        return f"{'an' if thing[0] in 'aeiou' else 'a'} {thing}"
    if style == 1:
        return f"a {rng.choice(['small', 'large', 'medium'])} {thing}"
    if style == 2:
        return f"{rng.randint(2, 6)} {rng.choice(['cups', 'portions', 'boxes'])} of {thing}"
    return f"{rng.randint(100, 500)} {rng.choice(['grams', 'ml'])} of {thing}"

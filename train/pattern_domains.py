"""The round-4 pattern tools' table (train/pattern_tools.py builds them): value pools, the encoders
whose results the answers quote, and per pattern its tools with their requests and answers. None of
heldout.py's domains, names or phrases occurs here; tests/train checks it.

Over 400 lines on purpose: it is a table (the tools of five request patterns), read as one."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from train import values as V
from train.toolspec import enum, integer, number, string

Gen = Callable[[random.Random], Any]
Result = Callable[[dict[str, Any], random.Random], dict[str, Any]]


def _pick(pool: list[str]) -> Gen:
    return lambda r: r.choice(pool)


def _fields(**gens: Gen) -> Result:
    """A result of independent values, one generator per key."""
    return lambda a, r: {k: g(r) for k, g in gens.items()}


# --- value pools -----------------------------------------------------------------------------------
DIRS = ["reports", "exports", "backups", "archive/2024", "shared/finance", "tmp", "projects/atlas"]
STEMS = ["budget", "roadmap", "invoices", "notes", "summary", "payroll", "minutes", "q3-plan"]
EXTS = ["csv", "xlsx", "md", "txt", "pdf", "json"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "tomorrow", "next Tuesday"]
PROGRAMS = ["Cafe Stars", "PixelCoins", "BookWorm Credits", "Brightmart Points", "FuelPlus Points",
            "Garden Club Seeds", "arcade tokens", "prize tickets"]  # fmt: skip
BASES = {"binary": 2, "octal": 8, "decimal": 10, "hexadecimal": 16}
FORMATS = ["pdf", "docx", "odt", "markdown", "html", "txt", "epub", "rtf"]
PAINTS = ["white", "ivory", "cobalt blue", "lemon yellow", "burnt sienna", "forest green", "crimson",
          "charcoal", "teal", "#1E90FF", "#F4A261", "off-white"]  # fmt: skip
BRANCHES = ["main", "develop", "staging", "release/2.4", "release/3.0", "feature/login-page",
            "hotfix/cart-total", "feature/dark-mode"]  # fmt: skip
SITES = ["North Hub", "Central Depot", "Dock 7", "Rotterdam East", "Site B", "Leeds DC", "Annex 2"]
SHORT_TITLES = ["Tide", "Ashes", "Orbit", "Ivy", "Wren", "Nine", "Glass", "Salt", "Ember", "Us",
                "Big Sky", "Night Shift", "Paper Moon", "Lanterns", "Ruby"]  # fmt: skip
HALLS = ["Playhouse", "Theatre", "Arts Centre", "Stage", "Civic Hall", "Community Centre"]
GROUPS = ["Rivertown Rovers", "Quizzly Bears", "Night Owls", "Brainstormers", "Elmwood Eagles",
          "Harbor Hawks", "Know-It-Alls", "Trivia Titans", "Fairhaven Foxes", "Millbrook Mavericks",
          "Circuit Breakers", "Gear Grinders", "Byte Knights", "Falcons", "Otters",
          "Kingsport Comets"]  # fmt: skip
CLUBS = ["Ashford Ramblers", "Elmwood Chess Club", "Redwater Book Circle", "Green Thumbs",
         "Kingsport Camera Club", "Millbrook Walkers", "Oak Street Knitters"]  # fmt: skip
CAUSES = ["river cleanup", "food drive", "tree planting", "park litter pick", "book swap", "charity run"]
TEXTS = ["good luck", "happy birthday", "see you soon", "help", "hello world", "sos", "open the gate",
         "well done", "call me", "on my way", "coffee break", "all clear", "meet at noon"]  # fmt: skip
NAMES = ["Kowalski", "Nguyen", "harbor", "Zephyr", "Quinn", "Okafor", "pixel", "Bjorn", "Xavier"]


def path(r: random.Random) -> str:
    return f"/{r.choice(DIRS)}/{r.choice(STEMS)}.{r.choice(EXTS)}"


def file_or_folder(r: random.Random) -> str:
    return path(r) if r.random() < 0.6 else f"/{r.choice(DIRS)}/"


def meeting(r: random.Random) -> str:
    return f"{r.choice(V.ADJ)} {r.choice(V.WORDS)} {r.choice(['sync', 'review', 'standup', 'call'])}"


def play_title(r: random.Random) -> str:
    """A title, often one short word ("Tide", "Us"): the round-3 adapter wrote "Up in Tallinn"."""
    return r.choice(SHORT_TITLES) if r.random() < 0.5 else V.title(r)


def hall(r: random.Random) -> str:
    return f"{r.choice(V.PLACES)} {r.choice(HALLS)}"


def carrier_id(r: random.Random) -> str:
    """An id shaped like a carrier's tracking number (1Z..., JD..., LX...CN, TBA...) or like none:
    orders, tickets and serials carry them too, so the request's words pick the tool."""
    d = lambda n: "".join(r.choices("0123456789", k=n))
    an = lambda n: "".join(r.choices("0123456789ABCDEFGHJKLMNPRSTUVWXYZ", k=n))
    style = r.randrange(7)
    if style == 0:
        return f"1Z{an(6)}{d(10)}"
    if style == 1:
        return f"JD{d(18)}"
    if style == 2:
        return f"{r.choice(['LX', 'RR', 'CP', 'EE'])}{d(9)}{r.choice(['CN', 'DE', 'GB', 'US'])}"
    if style == 3:
        return f"TBA{d(12)}"
    if style == 4:
        return d(r.choice([12, 20, 22]))
    return V.ident(r)


# --- encoders (the results the answers quote) ------------------------------------------------------
MORSE = dict(zip("abcdefghijklmnopqrstuvwxyz0123456789", [
    ".-", "-...", "-.-.", "-..", ".", "..-.", "--.", "....", "..", ".---", "-.-", ".-..", "--", "-.",
    "---", ".--.", "--.-", ".-.", "...", "-", "..-", "...-", ".--", "-..-", "-.--", "--..",
    "-----", ".----", "..---", "...--", "....-", ".....", "-....", "--...", "---..", "----.",
], strict=True))  # fmt: skip
NATO = dict(zip("abcdefghijklmnopqrstuvwxyz", [
    "Alfa", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India", "Juliett", "Kilo",
    "Lima", "Mike", "November", "Oscar", "Papa", "Quebec", "Romeo", "Sierra", "Tango", "Uniform",
    "Victor", "Whiskey", "X-ray", "Yankee", "Zulu",
], strict=True))  # fmt: skip
BRAILLE = dict(zip("abcdefghijklmnopqrstuvwxyz", "⠁⠃⠉⠙⠑⠋⠛⠓⠊⠚⠅⠇⠍⠝⠕⠏⠟⠗⠎⠞⠥⠧⠺⠭⠽⠵", strict=True))
ROMAN = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
         (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]  # fmt: skip


def morse(text: str) -> str:
    return " / ".join(" ".join(MORSE[c] for c in w if c in MORSE) for w in text.lower().split())


def nato(text: str) -> str:
    return " ".join(NATO.get(c, c) for c in text.lower() if c != " ")


def braille(text: str) -> str:
    return "".join(BRAILLE.get(c, c) for c in text.lower())


def binary(text: str) -> str:
    return " ".join(f"{ord(c):08b}" for c in text)


def pig_latin(text: str) -> str:
    def word(w: str) -> str:
        i = next((k for k, c in enumerate(w) if c in "aeiou"), 0)
        return (w[i:] + w[:i] + "ay") if i else w + "way"

    return " ".join(word(w) for w in text.lower().split())


def roman(n: int) -> str:
    out = ""
    for value, numeral in ROMAN:
        while n >= value:
            out, n = out + numeral, n - value
    return out


SCHEMES = {"morse": (morse, "Morse code"), "nato": (nato, "the NATO alphabet"),
           "braille": (braille, "Braille"), "binary": (binary, "binary")}  # fmt: skip


def based(n: int, base: str) -> str:
    """n written in a base, as people write it (hexadecimal in capitals)."""
    return {"binary": f"{n:b}", "octal": f"{n:o}", "decimal": str(n), "hexadecimal": f"{n:X}"}[base]


def _bases(r: random.Random) -> dict[str, Any]:
    """A number written in its base and another base to write it in."""
    src, dst = r.sample(list(BASES), 2)
    return {"number": based(r.randint(2, 4095), src), "from_base": src, "to_base": dst}


def _base_result(a: dict[str, Any], r: random.Random) -> dict[str, Any]:
    return {"result": based(int(a["number"], BASES[a["from_base"]]), a["to_base"])}


def _division(r: random.Random) -> dict[str, Any]:
    divisor = r.randint(2, 60)
    dividend = divisor * r.randint(2, 90) + (r.randint(1, divisor - 1) if r.random() < 0.3 else 0)
    return {"dividend": dividend, "divisor": divisor}


def _difference(r: random.Random) -> dict[str, Any]:
    subtrahend = r.randint(2, 900)
    return {"minuend": subtrahend + r.randint(1, 5000), "subtrahend": subtrahend}


# --- pair: two values of one pool, roles by the words ----------------------------------------------
# domain -> (name, description, params [(name, schema, generator)], the pair (two same-pool params)
# or a joint draw, requests (either order of mention), result, answers). Conversions put the source
# right by the amount ("394 liters"), whatever comes first: "How many PixelCoins is 400 Cafe Stars?"
PAIRS: dict[str, tuple] = {
    "file management": (
        "copy_file",
        "Copy a file to another path or folder.",
        [("from_path", string("Path of the file to copy"), path),
         ("to_path", string("Where the copy goes: a path or a folder"), file_or_folder)],
        ("from_path", "to_path"),
        ["Copy {from_path} to {to_path}.", "Make a copy of {from_path} at {to_path}.",
         "I need {to_path} to hold a copy of {from_path}.", "Copy into {to_path} the file {from_path}.",
         "Put a copy of {from_path} in {to_path}, please.", "{to_path} should get a copy of {from_path}.",
         "Back up {from_path} to {to_path}."],
        _fields(bytes=lambda r: r.randint(200, 900000)),
        ["Copied {from_path} to {to_path} ({bytes} bytes).",
         "Done: {to_path} now has a copy of {from_path}, {bytes} bytes."],
    ),
    "file naming": (
        "rename_file",
        "Rename a file in the workspace.",
        [("old_name", string("Current file name"), path), ("new_name", string("New file name"), path)],
        ("old_name", "new_name"),
        ["Rename {old_name} to {new_name}.", "Change the name of {old_name} to {new_name}.",
         "Call it {new_name} instead of {old_name}: rename the file, please.",
         "I want {new_name} as the new name of {old_name}."],
        _fields(renamed=lambda r: True, version=lambda r: r.randint(2, 40)),
        ["Renamed {old_name} to {new_name} (version {version}).",
         "{old_name} is now {new_name}; that is version {version}."],
    ),
    "meetings": (
        "reschedule_meeting",
        "Move a recurring meeting from one day to another.",
        [("meeting", string("Meeting name"), meeting), ("from_day", string("Day it is on now"), _pick(DAYS)),
         ("to_day", string("Day to move it to"), _pick(DAYS))],
        ("from_day", "to_day"),
        ["Move the {meeting} from {from_day} to {to_day}.", "Reschedule the {meeting} to {to_day}; it's on "
         "{from_day} now.", "Push the {meeting} to {to_day} instead of {from_day}.",
         "Can we have the {meeting} on {to_day} rather than {from_day}?",
         "Shift the {meeting} from {from_day} over to {to_day}.",
         "{to_day} works better than {from_day} for the {meeting}. Please move it."],
        _fields(event_id=lambda r: V.code(r, "EVT"), starts=V.time_of_day),
        ["The {meeting} moved from {from_day} to {to_day}; it starts at {starts} (event {event_id}).",
         "Done, the {meeting} is now on {to_day} at {starts}. Event id: {event_id}."],
    ),
    "loyalty points": (
        "convert_points",
        "Convert loyalty points of one rewards program into another program's points.",
        [("amount", integer("How many points to convert"), lambda r: r.randint(2, 500) * 10),
         ("from_program", string("Program the points are in now"), _pick(PROGRAMS)),
         ("to_program", string("Program to convert them into"), _pick(PROGRAMS))],
        ("from_program", "to_program"),
        ["Convert {amount} {from_program} to {to_program}.",
         "How many {to_program} is {amount} {from_program}?",
         "How many {to_program} do I get for {amount} {from_program}?",
         "What are {amount} {from_program} worth in {to_program}?",
         "Turn {amount} {from_program} into {to_program}, please.",
         "I have {amount} {from_program}. How many {to_program} is that?",
         "{to_program} for {amount} {from_program}?", "Exchange {amount} {from_program} for {to_program}."],
        lambda a, r: {"converted": a["amount"] * r.choice([2, 3, 5]) // r.choice([1, 4, 10]),
                      "fee": r.randint(0, 50)},
        ["{amount} {from_program} is {converted} {to_program} (fee {fee}).",
         "You'd get {converted} {to_program} for {amount} {from_program}, with a fee of {fee} points."],
    ),
    "number bases": (
        "convert_number_base",
        "Write a number given in one base (binary, octal, decimal, hexadecimal) in another.",
        [("number", string("The number as written"), lambda r: _bases(r)["number"]),
         ("from_base", enum("Base the number is written in", list(BASES)), _pick(list(BASES))),
         ("to_base", enum("Base to write it in", list(BASES)), _pick(list(BASES)))],
        _bases,
        ["Convert {number} from {from_base} to {to_base}.", "What is {from_base} {number} in {to_base}?",
         "Write {from_base} {number} in {to_base}.", "How do I write {from_base} {number} in {to_base}?",
         "{to_base} for {from_base} {number}, please.", "I need {from_base} {number} as {to_base}.",
         "What's {number} {from_base} in {to_base}?", "Give me the {to_base} form of {from_base} {number}.",
         "In {to_base}, what is {from_base} {number}?"],
        _base_result,
        ["{from_base} {number} is {result} in {to_base}.", "In {to_base} that is {result}."],
    ),
    "documents": (
        "convert_document",
        "Convert a document from one file format to another.",
        [("document", string("Document name"), lambda r: f"{r.choice(STEMS)}-{r.randint(1, 30)}"),
         ("from_format", string("Format it is in now"), _pick(FORMATS)),
         ("to_format", string("Format to convert to"), _pick(FORMATS))],
        ("from_format", "to_format"),
        ["Convert {document} from {from_format} to {to_format}.",
         "Turn {document} into {to_format}; it is {from_format} now.",
         "I need {document} as {to_format} instead of {from_format}.",
         "Export {document} to {to_format} from {from_format}."],
        _fields(url=V.url, pages=lambda r: r.randint(1, 80)),
        ["{document} is now {to_format}: {url} ({pages} pages).",
         "Converted {document} to {to_format}, {pages} pages, at {url}."],
    ),
    "paint mixing": (
        "mix_paint",
        "Mix a tint into a base paint and name the resulting shade.",
        [("base_color", string("The base paint"), _pick(PAINTS)),
         ("tint_color", string("The tint added to the base"), _pick(PAINTS))],
        ("base_color", "tint_color"),
        ["Mix a little {tint_color} into {base_color}.", "Add {tint_color} to {base_color}.",
         "Tint {base_color} with {tint_color}.", "Start from {base_color} and add some {tint_color}.",
         "What do I get if I mix {tint_color} into {base_color}?",
         "Use {base_color} as the base and {tint_color} as the tint."],
        _fields(shade=_pick(["dusty rose", "sage", "slate", "peach", "storm grey"]),
                hex=lambda r: f"#{r.getrandbits(24):06X}"),
        ["{tint_color} in {base_color} gives {shade} ({hex}).", "You'd get {shade}, hex {hex}."],
    ),
    "source control": (
        "merge_branch",
        "Merge one git branch into another.",
        [("source_branch", string("Branch whose changes are merged"), _pick(BRANCHES)),
         ("target_branch", string("Branch that receives them"), _pick(BRANCHES))],
        ("source_branch", "target_branch"),
        ["Merge {source_branch} into {target_branch}.",
         "Update {target_branch} with the changes from {source_branch}.",
         "Bring {source_branch} into {target_branch}.",
         "{target_branch} needs the commits from {source_branch}; merge them."],
        _fields(commit=lambda r: f"{r.getrandbits(28):07x}", conflicts=lambda r: r.randint(0, 3)),
        ["Merged {source_branch} into {target_branch} as {commit}, {conflicts} conflicts.",
         "{target_branch} now has {source_branch} (merge commit {commit}; conflicts: {conflicts})."],
    ),
    "telephony": (
        "forward_calls",
        "Forward the calls of one phone number to another.",
        [("from_number", string("Number whose calls are forwarded"), V.phone),
         ("to_number", string("Number that receives them"), V.phone)],
        ("from_number", "to_number"),
        ["Forward calls from {from_number} to {to_number}.", "Send calls for {from_number} to {to_number}.",
         "Route {from_number} to {to_number} while I'm away.",
         "I'm out today: forward {from_number} to {to_number}.",
         "Have {to_number} take the calls from {from_number}.",
         "Let {to_number} ring instead of {from_number}: forward my calls."],
        _fields(rule_id=lambda r: V.code(r, "FWD")),
        ["Calls to {from_number} now ring {to_number} (rule {rule_id}).",
         "Forwarding is on from {from_number} to {to_number}, rule {rule_id}."],
    ),
    "directions": (
        "get_directions",
        "Directions and travel time between two places.",
        [("origin", string("Where the trip starts"), V.place),
         ("destination", string("Where it ends"), V.place)],
        ("origin", "destination"),
        ["Directions from {origin} to {destination}, please.", "How do I get to {destination} from {origin}?",
         "How far is {destination} from {origin}?", "I'm at {origin}. How do I get to {destination}?",
         "What's the fastest way from {origin} to {destination}?",
         "Route to {destination}, starting from {origin}."],
        _fields(minutes=lambda r: r.randint(4, 300), distance=lambda r: f"{r.randint(1, 400)} km"),
        ["From {origin} to {destination} takes {minutes} minutes ({distance}).",
         "It's {distance} to {destination}, about {minutes} minutes."],
    ),
    "stock transfers": (
        "transfer_stock",
        "Move units of an item from one warehouse site to another.",
        [("sku", string("Item SKU"), lambda r: V.code(r, "SKU")),
         ("quantity", integer("Units to move"), lambda r: r.randint(2, 400)),
         ("from_site", string("Site the units leave"), _pick(SITES)),
         ("to_site", string("Site that receives them"), _pick(SITES))],
        ("from_site", "to_site"),
        ["Move {quantity} units of {sku} from {from_site} to {to_site}.",
         "{to_site} needs {quantity} units of {sku} from {from_site}.",
         "Transfer {quantity} of {sku} to {to_site} out of {from_site}.",
         "Restock {to_site} with {quantity} {sku} from {from_site}."],
        _fields(transfer_id=lambda r: V.code(r, "TRF"), arrives=V.date_any),
        ["Transfer {transfer_id}: {quantity} of {sku} from {from_site} to {to_site}, arriving {arrives}.",
         "{to_site} gets {quantity} units on {arrives} (transfer {transfer_id})."],
    ),
    "date math": (
        "days_between",
        "Count the days from one date to another.",
        [("start_date", string("Date to count from, as written"), V.date_any),
         ("end_date", string("Date to count to, as written"), V.date_any)],
        ("start_date", "end_date"),
        ["How many days from {start_date} to {end_date}?",
         "How many days until {end_date}, counting from {start_date}?",
         "If today is {start_date}, how long until {end_date}?",
         "Count the days to {end_date} starting from {start_date}."],
        _fields(days=lambda r: r.randint(1, 900), weekdays=lambda r: r.randint(1, 640)),
        ["{days} days ({weekdays} weekdays).", "From {start_date} to {end_date} is {days} days, "
         "{weekdays} of them weekdays."],
    ),
    "releases": (
        "compare_versions",
        "List what changed from one release to another.",
        [("from_version", string("Version to compare from"), V.version),
         ("to_version", string("Version to compare to"), V.version)],
        ("from_version", "to_version"),
        ["What changed in {to_version} since {from_version}?", "Show the changes from {from_version} to "
         "{to_version}.", "Changelog from {from_version} to {to_version}?",
         "Upgrading to {to_version} from {from_version}: what's different?"],
        _fields(commits=lambda r: r.randint(1, 400), breaking=lambda r: r.randint(0, 4)),
        ["{commits} commits between {from_version} and {to_version}, {breaking} breaking.",
         "{to_version} adds {commits} commits over {from_version}; {breaking} are breaking changes."],
    ),
    "subtraction": (
        "subtract",
        "Subtract one number from another.",
        [("minuend", number("The number subtracted from"), lambda r: _difference(r)["minuend"]),
         ("subtrahend", number("The number taken away"), lambda r: _difference(r)["subtrahend"])],
        _difference,
        ["Subtract {subtrahend} from {minuend}.", "Take {subtrahend} away from {minuend}.",
         "What's {minuend} minus {subtrahend}?", "How much is left if I take {subtrahend} from {minuend}?",
         "{minuend} less {subtrahend}?"],
        lambda a, r: {"difference": a["minuend"] - a["subtrahend"]},
        ["{minuend} - {subtrahend} = {difference}.", "That leaves {difference}."],
    ),
    "division": (
        "divide",
        "Divide one number by another.",
        [("dividend", number("The number divided"), lambda r: _division(r)["dividend"]),
         ("divisor", number("The number it is divided by"), lambda r: _division(r)["divisor"])],
        _division,
        ["Divide {dividend} by {divisor}.", "How many times does {divisor} go into {dividend}?",
         "How many {divisor}s fit in {dividend}?", "What's {dividend} divided by {divisor}?",
         "Split {dividend} into groups of {divisor}: how many groups?"],
        lambda a, r: {"quotient": V.whole(round(a["dividend"] / a["divisor"], 4))},
        ["{dividend} / {divisor} = {quotient}.", "It goes {quotient} times."],
    ),
}  # fmt: skip

# --- venue: a title "in <city>" / "at <place>", the place its own parameter ------------------------
# domain -> (name, description, (title param, schema), (place param, schema, generator), requests, result,
# answers)
VENUES: dict[str, tuple] = {
    "theatre": (
        "get_play_times",
        "List the performances of a stage play in a city.",
        ("play", string("Play title")),
        ("city", string("City"), _pick(V.CITIES)),
        ["When is {play} on in {city} tonight?", "Is {play} playing in {city} this week?",
         "What time does {play} start in {city}?", "Performances of {play} in {city}, please.",
         "I want to see {play} in {city}. When is it on?", "{play} in {city}: when are the shows?"],
        _fields(next_show=lambda r: f"{r.randint(14, 21)}:{r.choice(['00', '30'])}",
                seats=lambda r: r.randint(0, 90)),
        ["{play} is next on at {next_show} in {city}, {seats} seats left.",
         "The next performance of {play} starts at {next_show} ({seats} seats free)."],
    ),
    "stage seats": (
        "check_play_seats",
        "Seats left for a play at a theatre.",
        ("play", string("Play title")),
        ("theatre", string("Theatre name"), hall),
        ["Are there seats left for {play} at the {theatre}?",
         "Can I still get tickets for {play} at {theatre}?",
         "Seats for {play} at the {theatre}?", "How full is {play} at the {theatre}?"],
        _fields(seats=lambda r: r.randint(0, 120), cheapest=lambda r: r.randint(12, 90)),
        ["{seats} seats left for {play}, from {cheapest}.", "The {theatre} has {seats} seats for {play}; "
         "cheapest {cheapest}."],
    ),
    "exhibitions": (
        "get_exhibition_hours",
        "Opening hours of an art exhibition in a city.",
        ("exhibition", string("Exhibition title")),
        ("city", string("City"), _pick(V.CITIES)),
        ["Is {exhibition} still on in {city}?", "Opening hours of {exhibition} in {city}?",
         "When can I visit {exhibition} in {city}?", "How late is {exhibition} open in {city} today?"],
        _fields(opens=lambda r: f"{r.randint(8, 11)}:00", closes=lambda r: f"{r.randint(17, 21)}:00"),
        ["{exhibition} in {city} is open {opens} to {closes}.",
         "It opens at {opens} and closes at {closes}."],
    ),
    "library holds": (
        "reserve_library_book",
        "Put a hold on a library book at a branch.",
        ("title", string("Book title")),
        ("branch", string("Branch name"), _pick(V.PLACES)),
        ["Reserve {title} at the {branch} branch.", "Put {title} on hold at {branch}, please.",
         "Can I pick up {title} at the {branch} library?", "Hold {title} for me at {branch}."],
        _fields(hold_id=lambda r: V.code(r, "HOLD"), ready=V.date_any),
        ["{title} is on hold at {branch} (hold {hold_id}), ready {ready}.",
         "Hold {hold_id}: pick up {title} at {branch} from {ready}."],
    ),
    "talks": (
        "find_talk",
        "When a public talk takes place at a venue.",
        ("talk", string("Talk title")),
        ("venue", string("Venue name"), hall),
        ["When is the talk {talk} at the {venue}?", "Is {talk} at {venue} this month?",
         "What time does {talk} start at the {venue}?"],
        _fields(date=V.date_any, starts=V.time_of_day),
        ["{talk} is on {date} at {starts} at the {venue}.", "It's on {date}, starting {starts}."],
    ),
    "bookshops": (
        "check_bookshop_stock",
        "Whether a bookshop in a city has a title in stock.",
        ("title", string("Book title")),
        ("city", string("City of the shop"), _pick(V.CITIES)),
        ["Is {title} in stock in {city}?", "Does the {city} shop have {title}?",
         "Can I buy {title} in {city} today?", "Do you have {title} in {city}?"],
        _fields(copies=lambda r: r.randint(0, 12), shelf=V.code_upper),
        ["{copies} copies of {title} in {city}, shelf {shelf}.",
         "The {city} shop has {copies} on shelf {shelf}."],
    ),
}  # fmt: skip

# --- named: a group spoken with "the", its name argument without it ---------------------------------
# domain -> (name, description, (param, schema, pool), extra params [(name, schema, generator)], requests,
# result, answers)
NAMED: dict[str, tuple] = {
    "quiz league": (
        "get_quiz_result",
        "The latest pub quiz result of a quiz team.",
        ("team", string("Team name"), GROUPS),
        [],
        ["How did the {team} do at quiz night?", "Did the {team} win last week's quiz?",
         "What was the score in the last {team} quiz?", "Check the quiz result for the {team}.",
         "How many points did the {team} get at the pub quiz?", "{team} quiz result?"],
        _fields(points=lambda r: r.randint(20, 80), rank=lambda r: r.randint(1, 12)),
        ["The {team} scored {points} points and came {rank}.", "{points} points, rank {rank}."],
    ),
    "debating": (
        "get_next_debate",
        "The next debate of a debating team and its opponent.",
        ("team", string("Team name"), GROUPS),
        [],
        ["When do the {team} debate next?", "Who are the {team} up against in their next debate?",
         "Next debate for the {team}?", "Is there a debate for the {team} this week?"],
        _fields(date=V.date_any, opponent=_pick(GROUPS)),
        ["The {team} debate {opponent} on {date}.", "Next up: {opponent}, on {date}."],
    ),
    "robotics league": (
        "get_robotics_rank",
        "A robotics team's place in the league table.",
        ("team", string("Team name"), GROUPS),
        [],
        ["Where do the {team} rank in the robotics league?", "How are the {team} doing this season?",
         "League position of the {team}?", "What place are the {team} in?"],
        _fields(rank=lambda r: r.randint(1, 30), wins=lambda r: r.randint(0, 20)),
        ["The {team} are {rank} with {wins} wins.", "Rank {rank}, {wins} wins so far."],
    ),
    "clubs": (
        "get_club_meeting",
        "When and where a local club meets next.",
        ("club", string("Club name"), CLUBS),
        [],
        ["When does the {club} meet next?", "Where is the next {club} meeting?",
         "Is the {club} meeting this week?", "Next meetup of the {club}?"],
        _fields(date=V.date_any, place=V.place),
        ["The {club} meets on {date} at {place}.", "Next meeting: {date}, {place}."],
    ),
    "volunteering": (
        "sign_up_group",
        "Sign a volunteer group up for a community event.",
        ("group", string("Group name"), GROUPS + CLUBS),
        [("event", string("Event name"), _pick(CAUSES))],
        ["Sign the {group} up for the {event}.", "Put the {group} down for the {event}, please.",
         "Can the {group} join the {event}?", "Register the {group} for the {event}."],
        _fields(slot=V.date_any, signup_id=lambda r: V.code(r, "VOL")),
        ["The {group} are signed up for the {event} on {slot} ({signup_id}).",
         "Done: {signup_id}, {event} on {slot}."],
    ),
}  # fmt: skip

# --- ident: look-alike ids, the request's words pick the tool ---------------------------------------
# domain -> (name, description, id param, its schema description, requests, result, answers)
IDENTS: dict[str, tuple] = {
    "shop orders": (
        "get_order_status",
        "Status of a shop order by its order number.",
        "order_number", "Order number",
        ["What's the status of order {order_number}?", "Is my order {order_number} ready?",
         "Order {order_number}: where is it at?", "Check order number {order_number} for me."],
        _fields(status=_pick(["being packed", "ready for pickup", "cancelled", "paid"]), total=V.amount),
        ["Order {order_number} is {status} (total {total}).", "Status: {status}, total {total}."],
    ),
    "support tickets": (
        "get_support_ticket",
        "Read a customer support ticket by its ticket number.",
        "ticket_number", "Support ticket number",
        ["Any update on ticket {ticket_number}?", "What's happening with support ticket {ticket_number}?",
         "Look up ticket {ticket_number}.", "Has ticket {ticket_number} been answered?"],
        _fields(state=_pick(["open", "waiting on customer", "solved"]), agent=V.person),
        ["Ticket {ticket_number} is {state}, handled by {agent}.", "{agent} has it; it's {state}."],
    ),
    "warranty": (
        "check_warranty",
        "Whether a device is under warranty, by serial number.",
        "serial_number", "Device serial number",
        ["Is serial {serial_number} still under warranty?", "Check the warranty for serial number "
         "{serial_number}.", "Warranty status of device {serial_number}?",
         "My laptop's serial is {serial_number}. Is it covered?"],
        _fields(covered_until=V.date_any, plan=_pick(["basic", "extended", "none"])),
        ["{serial_number} is covered until {covered_until} ({plan} plan).",
         "Plan {plan}, valid to {covered_until}."],
    ),
    "claims": (
        "get_expense_claim",
        "Status of an expense or damage claim by its claim id.",
        "claim_id", "Claim id",
        ["Where is my claim {claim_id} at?", "Has claim {claim_id} been approved?",
         "Status of claim {claim_id}, please.", "Any news on claim {claim_id}?"],
        _fields(status=_pick(["approved", "in review", "paid", "rejected"]), amount=V.amount),
        ["Claim {claim_id} is {status}, amount {amount}.", "It's {status}; the amount is {amount}."],
    ),
    "returns": (
        "get_return_status",
        "Status of a product return (RMA) and its refund.",
        "return_id", "Return authorization number",
        ["Has my return {return_id} been refunded?", "Status of return {return_id}?",
         "Where is my refund for return {return_id}?", "Check RMA {return_id}."],
        _fields(refund=V.amount, refunded_on=V.date_any),
        ["Return {return_id} was refunded {refund} on {refunded_on}.",
         "Refund of {refund}, on {refunded_on}."],
    ),
    "repairs": (
        "get_repair_status",
        "Progress of a repair job by its job number.",
        "job_number", "Repair job number",
        ["Is repair job {job_number} done?", "How is the repair {job_number} going?",
         "When will repair {job_number} be finished?", "Any progress on repair job {job_number}?"],
        _fields(stage=_pick(["diagnosis", "waiting for parts", "done"]), ready=V.date_any),
        ["Repair {job_number} is at {stage}, ready {ready}.", "Stage {stage}; expected {ready}."],
    ),
    "lost property": (
        "find_lost_item",
        "Look up an item reported to lost property by its report number.",
        "report_number", "Lost property report number",
        ["Has lost item {report_number} been found?", "Any news on lost property report {report_number}?",
         "I lost my bag, report {report_number}. Did it turn up?"],
        _fields(found=lambda r: r.random() < 0.5, office=V.place),
        ["Report {report_number}: found {found}, at {office}.",
         "The office at {office} says found: {found}."],
    ),
    "lab samples": (
        "get_sample_result",
        "The result of a lab sample by its sample id.",
        "sample_id", "Lab sample id",
        ["Is the result for sample {sample_id} in?", "Lab result of sample {sample_id}?",
         "What did sample {sample_id} show?"],
        _fields(result=_pick(["negative", "positive", "inconclusive"]), tested=V.date_any),
        ["Sample {sample_id} was {result} (tested {tested}).", "{result}, tested on {tested}."],
    ),
}  # fmt: skip

# --- encode: "say X in Morse code" calls the tool ---------------------------------------------------
# domain -> (name, description, params [(name, schema, generator, spelling or None)], requests,
# result, answers)
ENCODES: dict[str, tuple] = {
    "morse code": (
        "text_to_morse",
        "Write text in Morse code.",
        [("text", string("The text"), _pick(TEXTS + V.LOWER_WORDS), None)],
        ['How do I say "{text}" in Morse code?', 'What is "{text}" in Morse?', "Write {text} in Morse code.",
         'Put "{text}" into Morse code, please.', 'Tap out "{text}" in Morse for me.'],
        lambda a, r: {"morse": morse(a["text"])},
        ['In Morse code, "{text}" is {morse}', "{morse}"],
    ),
    "phonetic spelling": (
        "spell_phonetic",
        "Spell a word letter by letter in the NATO phonetic alphabet.",
        [("word", string("The word to spell"), _pick(NAMES + V.LOWER_WORDS), None)],
        ["How do I spell {word} in the NATO alphabet?", "Spell {word} phonetically.",
         "Say {word} in NATO phonetics.", "What's {word} in the phonetic alphabet?"],
        lambda a, r: {"spelling": nato(a["word"])},
        ["{word} is spelled {spelling}.", "Phonetically: {spelling}."],
    ),
    "text encodings": (
        "encode_text",
        "Write text in an encoding: Morse code, the NATO alphabet, Braille or binary.",
        [("text", string("The text"), _pick(TEXTS + NAMES), None),
         ("scheme", enum("The encoding", list(SCHEMES)), _pick(list(SCHEMES)), lambda v: SCHEMES[v][1])],
        ['How do I say "{text}" in {scheme}?', 'Write "{text}" in {scheme}.',
         'What does "{text}" look like in {scheme}?', "How would {text} be written in {scheme}?"],
        lambda a, r: {"encoded": SCHEMES[a["scheme"]][0](a["text"])},
        ['"{text}" becomes {encoded}', "Here it is: {encoded}"],
    ),
    "roman numerals": (
        "to_roman_numerals",
        "Write a whole number in Roman numerals.",
        [("number", integer("The number, 1 to 3999"), lambda r: r.randint(1, 3999), None)],
        ["How do you write {number} in Roman numerals?", "Say {number} in Roman numerals.",
         "What's {number} in Roman numerals?", "{number} as a Roman numeral?"],
        lambda a, r: {"roman": roman(a["number"])},
        ["{number} is {roman} in Roman numerals.", "{roman}."],
    ),
    "word games": (
        "to_pig_latin",
        "Rewrite text in Pig Latin.",
        [("text", string("The text"), _pick(TEXTS + V.LOWER_WORDS), None)],
        ['How do I say "{text}" in Pig Latin?', 'Say "{text}" in Pig Latin.',
         'What is "{text}" in Pig Latin?'],
        lambda a, r: {"pig_latin": pig_latin(a["text"])},
        ['"{text}" in Pig Latin is "{pig_latin}".', "That's {pig_latin}."],
    ),
}  # fmt: skip

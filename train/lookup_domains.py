"""The lookup tools' table (train/lookup_tools.py builds them): domains, the shapes of the values a
request states, and per domain its subject, qualifiers and operations with their result fields.
None of heldout.py's domains occurs here; tests/train checks it.

Over 400 lines on purpose: it is a table (the domains, their value shapes and fields), read as one."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from train import values as V

Gen = Callable[[random.Random], Any]


def _pick(pool: list[str]) -> Gen:
    return lambda r: r.choice(pool)


def _num(lo: int, hi: int, decimals: bool = False) -> Gen:
    return lambda r: f"{r.randint(lo, hi)}.{r.randint(10, 99)}" if decimals else str(r.randint(lo, hi))


def _by(r: random.Random) -> str:
    """A work and its author in one value: "The Quiet Tower - Ana Costa"."""
    return f"{V.title(r)} - {V.person_any(r)}"


def _clock(r: random.Random) -> str:
    return f"{r.randint(0, 23):02d}:{r.choice(['00', '05', '15', '20', '30', '45', '50'])}"


def _pair(r: random.Random) -> str:
    return f"{r.randint(0, 9)}-{r.randint(0, 9)}"


SHAPES: dict[str, tuple[str, Gen]] = {  # shape -> (schema description hint, generator)
    "person": ("Full name", V.person_any),
    "email": ("Email address", V.email_any),
    "title": ("Title", V.title),
    "id": ("Identifier", V.ident),
    "quantity": ("Amount with its unit, e.g. 5 kg", V.quantity),
    "date": ("Date as the user wrote it", V.date_any),
    "phrase": ("Text, exactly as given", V.phrase),
    "place": ("Place or address", V.place),
    "code": ("Code, e.g. B-12", V.code_upper),
    "url": ("Full URL", V.url),
    "version": ("Version string", V.version),
    "phone": ("Phone number", V.phone),
    "city": ("City name", lambda r: r.choice(V.CITIES)),
    "word": ("One word", _pick(V.LOWER_WORDS + V.WORDS)),
    "item": ("The item with its amount", V.item),
    "number": (
        "A number",
        lambda r: r.randint(2, 900) if r.random() < 0.6 else V.whole(round(r.uniform(1, 900), 2)),
    ),
    "integer": ("A whole number", lambda r: r.randint(1, 40)),
    "color": ("Color name or hex code", _pick(V.COLORS)),
}

# domain -> (system, subjects [(param, label, shape)], qualifiers [(param, shape, phrase)], operations
# [(verb, noun of the result, description, [(result key, label, generator)])])
DOMAINS: dict[str, tuple[str, list, list, list]] = {
    "library": (
        "library catalog",
        [("book_title", "book", "title")],
        [("branch", "place", "at {v}")],
        [
            (
                "get",
                "book_availability",
                "Check whether a library book is on the shelf.",
                [("copies_available", "copies available", _num(0, 9)), ("shelf", "shelf", V.code_upper)],
            ),
            ("get", "due_date", "Get when a borrowed book is due back.", [("due", "due date", V.date_any)]),
        ],
    ),
    "plants": (
        "garden planner",
        [("plant", "plant", "word")],
        [],
        [
            (
                "get",
                "watering_schedule",
                "How often a plant needs water.",
                [("every_days", "days between waterings", _num(1, 14)), ("amount", "amount", V.quantity)],
            ),
        ],
    ),
    "pets": (
        "vet clinic",
        [("pet_name", "pet", "title")],
        [("owner", "person", "owned by {v}")],
        [
            (
                "get",
                "vaccination_status",
                "Look up a pet's next vaccination.",
                [
                    ("next_vaccine", "next vaccine", V.date_any),
                    ("vaccine", "vaccine", _pick(["rabies", "DHPP", "FVRCP"])),
                ],
            ),
        ],
    ),
    "real estate": (
        "property listings",
        [("address", "property", "place")],
        [],
        [
            (
                "get",
                "property_estimate",
                "Estimate the market value of a property.",
                [
                    ("estimate", "estimated value", _num(90, 990, True)),
                    ("currency", "currency", _pick(["EUR", "GBP"])),
                ],
            ),
            (
                "list",
                "property_details",
                "Size and rooms of a listed property.",
                [("area", "floor area", V.quantity), ("rooms", "rooms", _num(1, 8))],
            ),
        ],
    ),
    "jobs": (
        "job board",
        [("job_id", "job posting", "id")],
        [],
        [
            (
                "get",
                "job_posting",
                "Read a job posting by id.",
                [("role", "role", V.title), ("salary", "salary", _num(30, 180, True))],
            ),
            (
                "check",
                "application_status",
                "Status of an application to a posting.",
                [("stage", "stage", _pick(["screening", "interview", "offer", "rejected"]))],
            ),
        ],
    ),
    "fitness": (
        "fitness tracker",
        [("user", "member", "person")],
        [("day", "date", "on {v}")],
        [
            ("get", "step_count", "Steps a member walked on a day.", [("steps", "steps", _num(800, 25000))]),
            (
                "get",
                "workout_summary",
                "Summary of a member's workout.",
                [("calories_burned", "calories burned", _num(90, 900)), ("duration", "duration", V.quantity)],
            ),
        ],
    ),
    "banking": (
        "bank",
        [("account", "account", "id")],
        [],
        [
            (
                "get",
                "account_balance",
                "Current balance of a bank account.",
                [
                    ("balance", "balance", _num(0, 99999, True)),
                    ("currency", "currency", _pick(["USD", "EUR", "CHF"])),
                ],
            ),
            (
                "list",
                "last_transaction",
                "The latest transaction on an account.",
                [("payee", "payee", V.person_any), ("amount", "amount", _num(1, 900, True))],
            ),
        ],
    ),
    "museums": (
        "museum guide",
        [("museum", "museum", "title")],
        [("on", "date", "on {v}")],
        [
            (
                "get",
                "opening_hours",
                "Opening hours of a museum.",
                [("opens", "opening time", _clock), ("closes", "closing time", _clock)],
            ),
        ],
    ),
    "parking": (
        "parking service",
        [("plate", "licence plate", "code")],
        [("zone", "code", "in zone {v}")],
        [
            (
                "check",
                "parking_permit",
                "Whether a car has a valid parking permit.",
                [("valid_until", "valid until", V.date_any), ("permit", "permit number", V.ident)],
            ),
        ],
    ),
    "energy": (
        "utility portal",
        [("meter_id", "meter", "id")],
        [("month", "date", "for {v}")],
        [
            (
                "get",
                "energy_usage",
                "Electricity used by a meter.",
                [("usage", "usage", V.quantity), ("cost", "cost", _num(10, 400, True))],
            ),
        ],
    ),
    "smart home": (
        "home hub",
        [("device", "device", "title")],
        [("room", "word", "in the {v} room")],
        [
            (
                "get",
                "device_state",
                "Current state of a smart-home device.",
                [
                    ("state", "state", _pick(["on", "off", "standby", "charging"])),
                    ("battery", "battery", V.quantity),
                ],
            ),
            (
                "set",
                "light_color",
                "Change the color of a smart light.",
                [("color", "color", _pick(V.COLORS))],
            ),
        ],
    ),
    "warehouse": (
        "inventory system",
        [("sku", "item", "id")],
        [("site", "place", "in {v}")],
        [
            (
                "get",
                "stock_level",
                "Units of an item held in a warehouse.",
                [("on_hand", "units on hand", _num(0, 5000)), ("bin", "bin", V.code_upper)],
            ),
        ],
    ),
    "school": (
        "school portal",
        [("student", "student", "person")],
        [("course", "code", "in {v}")],
        [
            (
                "get",
                "grade_report",
                "A student's latest grade.",
                [("grade", "grade", _pick(["A", "B+", "C-", "A-"])), ("teacher", "teacher", V.person_any)],
            ),
        ],
    ),
    "vehicles": (
        "fleet manager",
        [("vehicle", "vehicle", "code")],
        [],
        [
            (
                "get",
                "vehicle_location",
                "Where a fleet vehicle is now.",
                [("last_seen", "last seen at", V.place), ("speed", "speed", V.quantity)],
            ),
            (
                "check",
                "service_due",
                "When a vehicle next needs service.",
                [("service_date", "next service", V.date_any)],
            ),
        ],
    ),
    "insurance": (
        "insurance system",
        [("claim_id", "claim", "id")],
        [],
        [
            (
                "get",
                "claim_status",
                "Status of an insurance claim.",
                [
                    ("status", "status", _pick(["approved", "under review", "paid", "needs documents"])),
                    ("payout", "payout", _num(50, 9000, True)),
                ],
            ),
        ],
    ),
    "clinics": (
        "clinic scheduler",
        [("patient", "patient", "person")],
        [("doctor", "person", "with {v}")],
        [
            (
                "find",
                "next_appointment",
                "The next free appointment slot.",
                [("slot", "slot", V.date_any), ("at", "time", _clock)],
            ),
        ],
    ),
    "restaurants": (
        "restaurant guide",
        [("restaurant", "restaurant", "title")],
        [("area", "place", "in {v}")],
        [
            (
                "get",
                "restaurant_rating",
                "Average rating of a restaurant.",
                [("rating", "rating", _num(1, 4, True)), ("reviews", "reviews", _num(3, 900))],
            ),
        ],
    ),
    "news": (
        "news feed",
        [("topic", "topic", "phrase")],
        [],
        [
            (
                "get",
                "top_headline",
                "The top headline about a topic.",
                [("headline", "headline", V.title), ("source", "source", _pick(V.DOMAINS))],
            ),
        ],
    ),
    "air quality": (
        "air monitor",
        [("location", "place", "place")],
        [],
        [
            (
                "get",
                "air_quality",
                "Air quality index at a place.",
                [("aqi", "AQI", _num(5, 300)), ("level", "level", _pick(["good", "moderate", "poor"]))],
            ),
        ],
    ),
    "transit": (
        "transit app",
        [("stop", "stop", "title")],
        [("line", "code", "for line {v}")],
        [
            (
                "get",
                "next_departure",
                "When the next bus or tram leaves a stop.",
                [("departs", "departure", _clock), ("platform", "platform", V.code_upper)],
            ),
        ],
    ),
    "code hosting": (
        "git server",
        [("repo", "repository", "phrase")],
        [("branch", "word", "on branch {v}")],
        [
            (
                "get",
                "latest_commit",
                "The newest commit of a repository.",
                [("sha", "commit", V.ident), ("author", "author", V.person_any)],
            ),
            (
                "check",
                "build_status",
                "The CI status of a repository.",
                [("build", "build", _pick(["passing", "failing"]))],
            ),
        ],
    ),
    "packages": (
        "package index",
        [("package", "package", "word")],
        [("at_version", "version", "at {v}")],
        [
            (
                "get",
                "package_version",
                "The newest release of a software package.",
                [("latest", "latest version", V.version), ("released", "released", V.date_any)],
            ),
        ],
    ),
    "networking": (
        "network tools",
        [("host", "host", "url")],
        [],
        [
            (
                "check",
                "uptime",
                "Whether a web address responds.",
                [
                    ("http_status", "HTTP status", _pick(["200", "404", "503"])),
                    ("latency", "latency", V.quantity),
                ],
            ),
        ],
    ),
    "contacts": (
        "address book",
        [("name", "contact", "person")],
        [],
        [
            ("get", "phone_number", "A contact's phone number.", [("phone", "phone", V.phone)]),
            ("find", "email_address", "A contact's email address.", [("email", "email", V.email_any)]),
        ],
    ),
    "payroll": (
        "payroll system",
        [("employee", "employee", "person")],
        [("period", "date", "for {v}")],
        [
            (
                "get",
                "payslip",
                "Net pay of an employee for a period.",
                [("net_pay", "net pay", _num(900, 9000, True))],
            ),
        ],
    ),
    "leave": (
        "HR portal",
        [("employee_email", "employee", "email")],
        [],
        [
            ("get", "vacation_balance", "Vacation days left.", [("days_left", "days left", _num(0, 30))]),
        ],
    ),
    "licenses": (
        "license server",
        [("license_key", "license", "id")],
        [],
        [
            (
                "check",
                "license",
                "Whether a software license is valid.",
                [("expires", "expires", V.date_any), ("seats", "seats", _num(1, 500))],
            ),
        ],
    ),
    "feature flags": (
        "flag service",
        [("flag", "flag", "phrase")],
        [("env", "word", "in {v}")],
        [
            (
                "get",
                "flag_state",
                "Whether a feature flag is on.",
                [("enabled", "enabled", _pick(["yes", "no"])), ("rollout", "rollout", V.quantity)],
            ),
        ],
    ),
    "monitoring": (
        "metrics store",
        [("service", "service", "phrase")],
        [("window", "quantity", "over {v}")],
        [
            (
                "get",
                "error_rate",
                "Error rate of a service.",
                [("errors", "error rate", V.quantity), ("requests", "requests", _num(100, 90000))],
            ),
        ],
    ),
    "certificates": (
        "certificate monitor",
        [("site", "site", "url")],
        [],
        [
            (
                "check",
                "certificate_expiry",
                "When a TLS certificate expires.",
                [("not_after", "expiry", V.date_any), ("issuer", "issuer", V.title)],
            ),
        ],
    ),
    "tides": (
        "marine service",
        [("harbor", "harbor", "title")],
        [("day", "date", "on {v}")],
        [
            (
                "get",
                "high_tide",
                "Time and height of the next high tide.",
                [("high_tide", "high tide", _clock), ("height", "height", V.quantity)],
            ),
        ],
    ),
    "events": (
        "event platform",
        [("event", "event", "title")],
        [],
        [
            (
                "get",
                "event_details",
                "Date and venue of an event.",
                [("starts", "date", V.date_any), ("venue", "venue", V.place)],
            ),
            ("check", "seats_left", "Seats left for an event.", [("seats", "seats left", _num(0, 400))]),
            ("get", "headliner", "Who performs at an event.", [("act", "act", _by)]),
        ],
    ),
    "rooms": (
        "room booking",
        [("room", "room", "code")],
        [("day", "date", "on {v}")],
        [
            (
                "check",
                "room_availability",
                "Whether a meeting room is free.",
                [("free_from", "free from", _clock), ("capacity", "capacity", _num(2, 40))],
            ),
        ],
    ),
    "postcodes": (
        "geo service",
        [("postcode", "postcode", "code")],
        [],
        [
            (
                "lookup",
                "postcode",
                "The town of a postcode.",
                [("town", "town", V.place), ("region", "region", V.place)],
            ),
        ],
    ),
    "phones": (
        "telecom portal",
        [("number", "number", "phone")],
        [],
        [
            (
                "check",
                "phone_plan",
                "The plan and data left on a phone number.",
                [("plan", "plan", V.title), ("data_left", "data left", V.quantity)],
            ),
        ],
    ),
    "surveys": (
        "survey tool",
        [("survey", "survey", "title")],
        [],
        [
            (
                "get",
                "survey_results",
                "Response count and top answer of a survey.",
                [("responses", "responses", _num(3, 2000)), ("top_answer", "top answer", V.phrase)],
            ),
        ],
    ),
    "reading": (
        "reading list",
        [("reader", "reader", "email")],
        [],
        [
            (
                "get",
                "current_book",
                "The book a reader has open.",
                [("book", "book", _by), ("page", "page", _num(1, 600))],
            ),
        ],
    ),
    "paint": (
        "paint store",
        [("color", "color", "color")],
        [("size", "quantity", "in {v}")],
        [
            ("get", "paint_price", "Price of a paint color.", [("price", "price", _num(8, 120, True))]),
        ],
    ),
    "loans": (
        "loan calculator",
        [("principal", "loan of", "number")],
        [("years", "integer", "over {v} years")],
        [
            (
                "get",
                "monthly_payment",
                "Monthly payment of a loan.",
                [("payment", "monthly payment", _num(50, 3000, True))],
            )
        ],
    ),
    "bills": (
        "bill splitter",
        [("total", "bill of", "number")],
        [("people", "integer", "split {v} ways")],
        [("get", "split_bill", "Each person's share of a bill.", [("share", "share", _num(5, 300, True))])],
    ),
    "cafe": (
        "coffee shop",
        [("item", "order", "item")],
        [("store", "place", "at the {v} store")],
        [
            ("get", "order_price", "The price of an order.", [("price", "price", _num(2, 40, True))]),
            ("check", "pickup_time", "When an order is ready.", [("ready_at", "ready at", _clock)]),
        ],
    ),
    "carbon": (
        "carbon calculator",
        [("activity", "activity", "item")],
        [],
        [("get", "carbon_footprint", "CO2 of an activity.", [("co2", "CO2", V.quantity)])],
    ),
    "trips": (
        "trip planner",
        [("distance_km", "trip of", "number")],
        [("car", "code", "with car {v}")],
        [("get", "fuel_cost", "Fuel cost of a drive.", [("cost", "fuel cost", _num(5, 200, True))])],
    ),
}

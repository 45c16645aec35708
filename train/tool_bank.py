"""The training tools: hand-written ones for the domains n8n agents use most (weather, email,
calendar, CRM, tickets, SQL, HTTP, arithmetic, files, search, chat messages, reminders) and
procedural ones (an action on a record type, with varied field types and name styles). None of the
held-out evaluation's names or domains (heldout.py) occur here; a test checks it."""

from __future__ import annotations

import random

from train import values as V
from train.toolspec import Param, Tool, array, boolean, enum, integer, string

CONDITIONS = ["sunny", "cloudy", "light rain", "snow", "fog", "clear skies", "thunderstorms"]


def _weather(args, rng):
    return {"city": args["city"], "temperature": rng.randint(-5, 35), "condition": rng.choice(CONDITIONS)}


def _calc(args, rng):
    expr = args["input"] if "input" in args else args["expression"]
    return {"result": V.number_text(round(eval(expr, {"__builtins__": {}}), 4))}  # noqa: S307 (our own text)


def _arith(rng: random.Random) -> str:
    a, b = rng.randint(2, 9999), rng.randint(2, 999)
    return f"{a} {rng.choice(['+', '-', '*', '*', '/'])} {b}"


def hand_tools() -> list[Tool]:
    city = Param("city", string("The city name, e.g. Paris"), lambda r: r.choice(V.CITIES))
    unit = Param(
        "unit",
        {"type": "string", "enum": ["celsius", "fahrenheit"]},
        lambda r: r.choice(["celsius", "fahrenheit"]),
        ["Use {v}.", "Give it in {v}."],
        required=False,
    )
    tools = [
        Tool(
            "get_weather",
            "Get the current weather for a city.",
            [city, unit],
            [
                "What's the weather in {city}?",
                "Is it raining in {city} right now?",
                "How warm is it in {city} today?",
                "weather {city}",
                "Check the weather for {city} please.",
                "I'm heading to {city}. What's the weather like there?",
            ],
            _weather,
            [
                "It is {temperature} degrees with {condition} in {city}.",
                "Right now {city} has {condition} and {temperature} degrees.",
            ],
            "weather",
        ),
        Tool(
            "send_email",
            "Send an email message.",
            [
                Param("to", string("Recipient address"), V.email),
                Param(
                    "subject",
                    string("Subject line"),
                    lambda r: r.choice(V.ADJ).title() + " " + r.choice(V.WORDS),
                ),
                Param(
                    "body",
                    string("Message text"),
                    lambda r: f"Please review the {V.topic(r)} by {V.date(r)}.",
                ),
                Param("cc", string("Copy address"), V.email, ["Copy {v} on it.", "CC {v}."], required=False),
            ],
            [
                'Email {to} with the subject "{subject}" saying: {body}',
                'Send an email to {to}, subject "{subject}", body: {body}',
                "Write to {to}. Subject: {subject}. Message: {body}",
            ],
            lambda a, r: {"status": "sent", "message_id": V.code(r, "MSG")},
            [
                "Done, the email to {to} was sent (message id {message_id}).",
                "I sent it. The message id is {message_id}.",
            ],
            "email",
        ),
        Tool(
            "create_calendar_event",
            "Create an event in the user's calendar.",
            [
                Param("title", string("Event title"), lambda r: V.topic(r).title() + " meeting"),
                Param("date", string("Date, YYYY-MM-DD", format="date"), V.date),
                Param("time", string("Start time, HH:MM"), V.time_of_day),
                Param(
                    "attendees",
                    array("Guest emails", {"type": "string"}),
                    lambda r: [V.email(r) for _ in range(r.randint(1, 2))],
                    ["Invite {v}.", "Add {v} as guests."],
                    required=False,
                    text=lambda v: " and ".join(v),
                ),
                Param(
                    "duration_minutes",
                    integer("Length in minutes"),
                    lambda r: r.choice([15, 30, 45, 60, 90]),
                    ["It lasts {v} minutes.", "Make it {v} minutes long."],
                    required=False,
                ),
            ],
            [
                'Schedule "{title}" on {date} at {time}.',
                "Put {title} in my calendar for {date} at {time}.",
                "Book a calendar event called {title}, {date}, starting {time}.",
            ],
            lambda a, r: {"event_id": V.code(r, "EVT"), "status": "confirmed"},
            [
                'Your event "{title}" is booked for {date} at {time} (id {event_id}).',
                "Scheduled: {title} on {date} at {time}. Event id: {event_id}.",
            ],
            "calendar",
        ),
        Tool(
            "run_sql_query",
            "Run a read-only SQL query against the analytics database and return the rows.",
            [
                Param(
                    "query",
                    string("The SQL statement"),
                    lambda r: (
                        f"SELECT COUNT(*) FROM {r.choice(['orders', 'users', 'events', 'payments'])} "
                        f"WHERE created_at >= '{V.date(r)}'"
                    ),
                )
            ],
            ["Run this SQL: {query}", "Execute the query {query}", "Can you run `{query}` for me?"],
            lambda a, r: {"rows": [[r.randint(0, 5000)]], "row_count": 1},
            ["The query returned {rows}.", "Result: {rows} (1 row)."],
            "sql",
        ),
        Tool(
            "http_request",
            "Make an HTTP request to a URL and return the status and body.",
            [
                Param(
                    "url",
                    string("Full URL"),
                    lambda r: f"https://api.{r.choice(V.DOMAINS)}/v1/{r.choice(V.WORDS)}",
                ),
                Param(
                    "method",
                    enum("HTTP method", ["GET", "POST", "PUT", "DELETE"]),
                    lambda r: r.choice(["GET", "POST", "DELETE"]),
                ),
            ],
            [
                "Send a {method} request to {url}.",
                "Do an HTTP {method} on {url}",
                "Call {url} with {method}.",
            ],
            lambda a, r: {"status": r.choice([200, 201, 204, 404]), "body": '{"ok": true}'},
            ["The server answered with status {status}.", "{method} {url} returned status {status}."],
            "http",
        ),
        Tool(
            "calculator",
            "Useful for getting the result of a math expression. The input to this tool should be a valid "
            "mathematical expression that could be executed by a simple calculator.",
            [Param("input", string("A math expression"), _arith)],
            [
                "What is {input}?",
                "Calculate {input}.",
                "How much is {input}?",
                "Compute {input} for me.",
                "{input} = ?",
                "Can you work out {input}?",
            ],
            _calc,
            ["{input} = {result}.", "The result is {result}.", "{input} equals {result}."],
            "arithmetic",
        ),
        Tool(
            "read_file",
            "Read a text file from the workspace.",
            [
                Param(
                    "path",
                    string("File path"),
                    lambda r: (
                        f"/data/{r.choice(V.WORDS)}/{r.choice(['notes', 'report', 'todo', 'summary'])}"
                        f".{r.choice(['txt', 'md', 'csv'])}"
                    ),
                )
            ],
            ["Open {path} and show me what's in it.", "Read the file {path}.", "What does {path} contain?"],
            lambda a, r: {"content": f"{V.topic(r)} due {V.date(r)}", "size_bytes": r.randint(20, 9000)},
            ["{path} says: {content}", 'The file contains "{content}".'],
            "files",
        ),
        Tool(
            "web_search",
            "Search the web and return the top results.",
            [
                Param(
                    "query",
                    string("Search terms"),
                    lambda r: f"{r.choice(V.WORDS)} best practices {r.randint(2019, 2025)}",
                ),
                Param(
                    "max_results",
                    integer("How many results"),
                    lambda r: r.randint(1, 10),
                    ["Show {v} results.", "Limit it to {v} results."],
                    required=False,
                ),
            ],
            ["Search the web for {query}.", 'Google "{query}" for me.', "Look up {query} online."],
            lambda a, r: {
                "top_result": f"A guide to {a['query']}",
                "url": f"https://{r.choice(V.DOMAINS)}/guide",
            },
            ['The top result is "{top_result}" at {url}.', 'I found "{top_result}" ({url}).'],
            "search",
        ),
        Tool(
            "post_chat_message",
            "Post a message to a team chat channel.",
            [
                Param(
                    "channel",
                    string("Channel name without #"),
                    lambda r: r.choice(["general", "dev", "ops", "sales", "random", "support"]),
                ),
                Param("text", string("Message"), lambda r: f"The {V.topic(r)} is ready."),
                Param(
                    "urgent",
                    boolean("Mention everyone"),
                    lambda r: True,
                    ["Mark it urgent.", "Ping everyone."],
                    required=False,
                ),
            ],
            [
                'Post "{text}" in #{channel}.',
                "Tell the {channel} channel: {text}",
                "Send {text} to #{channel}.",
            ],
            lambda a, r: {
                "ok": True,
                "timestamp": f"{r.randint(1700000000, 1799999999)}.{r.randint(100, 999)}",
            },
            ["Posted to #{channel}.", "Your message is in #{channel} (ts {timestamp})."],
            "chat",
        ),
        Tool(
            "set_reminder",
            "Create a reminder for the user.",
            [
                Param(
                    "text",
                    string("What to remember"),
                    lambda r: f"call {V.person(r)} about the {r.choice(V.WORDS)}",
                ),
                Param(
                    "when",
                    string("Date and time, YYYY-MM-DD HH:MM"),
                    lambda r: f"{V.date(r)} {V.time_of_day(r)}",
                ),
            ],
            [
                "Remind me to {text} at {when}.",
                "Set a reminder for {when}: {text}.",
                "At {when}, remind me to {text}.",
            ],
            lambda a, r: {"reminder_id": V.code(r, "REM")},
            ["OK, I'll remind you to {text} at {when}.", "Reminder {reminder_id} set for {when}."],
            "reminders",
        ),
    ]
    return tools

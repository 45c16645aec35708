"""The evaluation's held-out tools: domains and names that never occur in training (tool_bank.py,
procedural.py): stocks, units, translation, parcels, flights, recipes, dictionary, sports, hotels,
music, time zones, nutrition, cinema, domain names. Also the abstention requests and the plain
questions (with the strings a right answer contains), none of them in training's PLAIN_QA."""

from __future__ import annotations

from train.toolspec import Param, Tool, enum, integer, number, string

SYMBOLS = ["AAPL", "MSFT", "NVDA", "TSLA", "AMZN", "IBM", "ORCL", "SAP", "ASML", "SONY"]
LANGS = ["Spanish", "German", "French", "Italian", "Japanese", "Portuguese"]
PHRASES = [
    "good morning",
    "where is the station",
    "thank you very much",
    "see you tomorrow",
    "how much is this",
]
UNITS = [("kilometers", "miles"), ("pounds", "kilograms"), ("liters", "gallons"), ("inches", "centimeters")]
AIRPORTS = ["JFK", "LHR", "CDG", "FRA", "NRT", "SFO", "MAD", "AMS", "DXB", "SIN"]
INGREDIENTS = ["chickpeas", "salmon", "mushrooms", "lentils", "spinach", "tofu", "eggplant", "shrimp"]
TERMS = ["ephemeral", "ubiquitous", "serendipity", "laconic", "quixotic", "meticulous"]
TEAMS = ["Lakers", "Celtics", "Arsenal", "Juventus", "Yankees", "Real Madrid", "Bayern Munich"]
SONGS = [
    ("Bohemian Rhapsody", "Queen"),
    ("Imagine", "John Lennon"),
    ("Hey Jude", "The Beatles"),
    ("Halo", "Beyonce"),
]
ZONES = ["Tokyo", "Sydney", "Honolulu", "Reykjavik", "Singapore", "Anchorage"]
FOODS = ["an avocado", "a banana", "100 grams of rice", "a boiled egg", "an apple"]
MOVIES = ["Dune", "Oppenheimer", "Inside Out", "The Matrix", "Up"]
SITES = ["brightkettle.com", "lunarfern.io", "quietmaple.net", "tidalbyte.org"]
CITIES = ["Rome", "Athens", "Kyoto", "Lyon", "Porto", "Tallinn"]


def _pick(pool):
    return lambda r: r.choice(pool)


def heldout_tools() -> list[Tool]:
    """Each result has a `key` value that a grounded answer must repeat (eval_tools checks it)."""
    return [
        Tool(
            "get_stock_quote",
            "Get the latest trading price of a stock by its ticker symbol.",
            [Param("symbol", string("Ticker symbol, e.g. AAPL"), _pick(SYMBOLS))],
            [
                "What's the current price of {symbol} stock?",
                "How is {symbol} trading right now?",
                "Get me a quote for {symbol}.",
            ],
            lambda a, r: {
                "symbol": a["symbol"],
                "price": f"{r.randint(20, 900)}.{r.randint(10, 99)}",
                "currency": "USD",
            },
            [],
            "stocks",
        ),
        Tool(
            "convert_units",
            "Convert a quantity from one unit of measure to another.",
            [
                Param("value", number("The quantity"), lambda r: r.randint(2, 500)),
                Param("from_unit", string("Unit to convert from"), lambda r: None),
                Param("to_unit", string("Unit to convert to"), lambda r: None),
            ],
            ["Convert {value} {from_unit} to {to_unit}.", "How many {to_unit} is {value} {from_unit}?"],
            lambda a, r: {"result": f"{r.randint(1, 900)}.{r.randint(10, 99)}", "unit": a["to_unit"]},
            [],
            "units",
        ),
        Tool(
            "translate_text",
            "Translate a piece of text into another language.",
            [
                Param("text", string("Text to translate"), _pick(PHRASES)),
                Param("target_language", enum("Language to translate into", LANGS), _pick(LANGS)),
            ],
            ['Translate "{text}" into {target_language}.', 'How do I say "{text}" in {target_language}?'],
            lambda a, r: {
                "translation": r.choice(["Buenos dias", "Guten Morgen", "Bonjour", "Ohayo", "Grazie mille"])
            },
            [],
            "translation",
        ),
        Tool(
            "track_package",
            "Track a parcel shipment by its tracking number.",
            [
                Param(
                    "tracking_number",
                    string("Carrier tracking number"),
                    lambda r: f"1Z{r.randint(10**9, 10**10 - 1)}",
                )
            ],
            [
                "Where is my package {tracking_number}?",
                "Track parcel {tracking_number} please.",
                "Any update on delivery {tracking_number}?",
            ],
            lambda a, r: {"status": "in transit", "location": r.choice(CITIES)},
            [],
            "parcels",
        ),
        Tool(
            "search_flights",
            "Search for flights between two airports on a date.",
            [
                Param("origin", string("Origin airport code"), _pick(AIRPORTS[:5])),
                Param("destination", string("Destination airport code"), _pick(AIRPORTS[5:])),
                Param(
                    "date",
                    string("Departure date, YYYY-MM-DD"),
                    lambda r: f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                ),
            ],
            [
                "Find flights from {origin} to {destination} on {date}.",
                "Are there flights {origin} to {destination} on {date}?",
            ],
            lambda a, r: {
                "cheapest_fare": f"{r.randint(90, 990)}",
                "airline": r.choice(["SkyLark", "Aerona", "BlueJet"]),
            },
            [],
            "flights",
        ),
        Tool(
            "find_recipe",
            "Find a cooking recipe that uses an ingredient.",
            [
                Param("ingredient", string("Main ingredient"), _pick(INGREDIENTS)),
                Param(
                    "max_minutes",
                    integer("Longest cooking time"),
                    lambda r: r.choice([20, 30, 45]),
                    required=False,
                ),
            ],
            ["Find me a recipe with {ingredient}.", "What can I cook with {ingredient}?"],
            lambda a, r: {
                "recipe": f"{a['ingredient'].title()} {r.choice(['curry', 'stew', 'salad', 'tacos'])}",
                "minutes": r.randint(15, 60),
            },
            [],
            "recipes",
        ),
        Tool(
            "define_word",
            "Look up the dictionary definition of an English word.",
            [Param("word", string("The word"), _pick(TERMS))],
            [
                'Look up the dictionary definition of "{word}".',
                "Define the word {word} using the dictionary.",
            ],
            lambda a, r: {
                "definition": r.choice(["lasting a very short time", "found everywhere", "a happy accident"])
            },
            [],
            "dictionary",
        ),
        Tool(
            "get_sports_score",
            "Get the result of a sports team's most recent game.",
            [Param("team", string("Team name"), _pick(TEAMS))],
            ["What was the score of the last {team} game?", "Did the {team} win their last match?"],
            lambda a, r: {"score": f"{r.randint(0, 5)}-{r.randint(0, 5)}", "opponent": r.choice(TEAMS)},
            [],
            "sports",
        ),
        Tool(
            "book_hotel",
            "Reserve a hotel room in a city.",
            [
                Param("city", string("City"), _pick(CITIES)),
                Param(
                    "check_in",
                    string("Check-in date, YYYY-MM-DD"),
                    lambda r: f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                ),
                Param("nights", integer("Number of nights"), lambda r: r.randint(1, 7)),
            ],
            [
                "Book a hotel in {city} from {check_in} for {nights} nights.",
                "I need a hotel room in {city}, checking in {check_in}, {nights} nights.",
            ],
            lambda a, r: {
                "confirmation": f"HT{r.randint(10000, 99999)}",
                "hotel": r.choice(["Grand Plaza", "Riverside Inn"]),
            },
            [],
            "hotels",
        ),
        Tool(
            "play_song",
            "Play a song on the user's speakers.",
            [
                Param("title", string("Song title"), lambda r: None),
                Param("artist", string("Artist"), lambda r: None),
            ],
            ["Play {title} by {artist}.", 'Put on "{title}" from {artist}.'],
            lambda a, r: {"now_playing": f"{a['title']} - {a['artist']}"},
            [],
            "music",
        ),
        Tool(
            "get_local_time",
            "Get the current local time in a place.",
            [Param("location", string("City or region"), _pick(ZONES))],
            ["What time is it in {location} right now?", "Tell me the local time in {location}."],
            lambda a, r: {"time": f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"},
            [],
            "time zones",
        ),
        Tool(
            "get_nutrition_facts",
            "Get calories and nutrients of a food.",
            [Param("food", string("The food and amount"), _pick(FOODS))],
            ["How many calories are in {food}?", "Nutrition facts for {food}, please."],
            lambda a, r: {"calories": str(r.randint(50, 400))},
            [],
            "nutrition",
        ),
        Tool(
            "get_movie_showtimes",
            "List today's showtimes of a movie in a city.",
            [
                Param("movie", string("Movie title"), _pick(MOVIES)),
                Param("city", string("City"), _pick(CITIES)),
            ],
            ["When is {movie} playing in {city} today?", "Showtimes for {movie} in {city}?"],
            lambda a, r: {"first_showing": f"{r.randint(12, 22)}:{r.choice(['00', '30'])}"},
            [],
            "cinema",
        ),
        Tool(
            "check_domain_availability",
            "Check whether an internet domain name can be registered.",
            [Param("domain", string("Domain name"), _pick(SITES))],
            ["Is {domain} available to register?", "Can I still buy the domain {domain}?"],
            lambda a, r: {"available": "yes", "price_usd": str(r.randint(8, 60))},
            [],
            "domain names",
        ),
    ]


# the value of the result a grounded answer must contain, per tool
RESULT_KEY = {
    "get_stock_quote": "price", "convert_units": "result", "translate_text": "translation",
    "track_package": "location", "search_flights": "cheapest_fare", "find_recipe": "recipe",
    "define_word": "definition", "get_sports_score": "score", "book_hotel": "confirmation",
    "play_song": "now_playing", "get_local_time": "time", "get_nutrition_facts": "calories",
    "get_movie_showtimes": "first_showing", "check_domain_availability": "price_usd",
}  # fmt: skip

ABSTAIN = [
    "What is the capital of Japan?", "Write a haiku about autumn leaves.", "Who discovered penicillin?",
    "How many sides does a hexagon have?", "Hello, how are you today?", "What is the plural of mouse?",
    "Give me three tips for better sleep.", "Who was the first person on the Moon?",
    "Explain photosynthesis in one sentence.", "What is 15 plus 27?", "Tell me a fun fact about octopuses.",
    "What does DNA stand for?",
]  # fmt: skip

PLAIN = [  # (question, strings any one of which a right answer contains, lowercased)
    ("What is the capital of France?", ["paris"]),
    ("What is the largest planet in our solar system?", ["jupiter"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("How many days are there in a week?", ["7", "seven"]),
    ("What do bees make?", ["honey"]),
    ("What is the opposite of hot?", ["cold"]),
    ("Which language is mainly spoken in Brazil?", ["portuguese"]),
    ("What is the chemical formula of water?", ["h2o", "h₂o"]),
    ("What animal is known as the king of the jungle?", ["lion"]),
    ("What is 2 + 2?", ["4", "four"]),
]  # fmt: skip


def fill_pairs(tool: Tool, r, args: dict) -> dict:
    """Values drawn together (a unit pair, a song and its artist) for the tools that need them."""
    if tool.name == "convert_units":
        a, b = r.choice(UNITS)
        args.update(from_unit=a, to_unit=b)
    elif tool.name == "play_song":
        title, artist = r.choice(SONGS)
        args.update(title=title, artist=artist)
    return args

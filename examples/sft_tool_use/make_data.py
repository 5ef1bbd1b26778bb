"""Generate the synthetic tool-calling dataset of this example, deterministically.

    python examples/sft_tool_use/make_data.py            # writes train.jsonl and eval.jsonl beside itself
    python examples/sft_tool_use/make_data.py --train 400 --eval 60 --seed 1

Three tools (get_weather, convert_currency, search_flights) and a travel assistant. About 70% of the requests
need a tool: the assistant calls it, the tool answers, and the assistant writes the final answer from the
result. The rest need a direct answer (general questions, greetings, requests the tools cannot serve), and the
assistant answers without calling anything. Rows are OpenAI chat fine-tuning rows (messages + tools).

Deliberate simplifications: the tool results are made up by this script (no real API is called), the final
answers follow a few fixed phrasings so a small model can learn them in minutes, and train and eval draw from
the same pools of cities and currencies (eval rows are different combinations, not unseen entities).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a travel assistant. Call a tool when it helps; otherwise answer directly."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount between currencies.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number"},
                    "from_currency": {"type": "string"},
                    "to_currency": {"type": "string"},
                },
                "required": ["amount", "from_currency", "to_currency"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Flights between two cities on a date (YYYY-MM-DD).",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string"},
                    "destination": {"type": "string"},
                    "date": {"type": "string"},
                },
                "required": ["origin", "destination", "date"],
            },
        },
    },
]

CITIES = ["Lisbon", "Paris", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Oslo", "Dublin", "Athens",
          "Tokyo", "Toronto", "Chicago", "Sydney", "Cairo", "Lima", "Seoul", "Nairobi"]  # fmt: skip
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowing"]
RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CHF": 0.9, "CAD": 1.36, "AUD": 1.52}
AIRLINES = ["TP", "AF", "LH", "IB", "AZ", "OS", "KL"]

WEATHER_ASKS = ["What's the weather like in {city}?", "Is it raining in {city} right now?",
                "How is the weather in {city} today?", "weather in {city}?"]  # fmt: skip
WEATHER_F_ASKS = [
    "How warm is it in {city}? Give me Fahrenheit.",
    "What's the temperature in {city} in fahrenheit?",
]
CURRENCY_ASKS = ["Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?",
                 "What are {amount} {src} worth in {dst}?"]  # fmt: skip
FLIGHT_ASKS = ["Find me a flight from {origin} to {destination} on {date}.",
               "Are there flights from {origin} to {destination} on {date}?",
               "I need to fly {origin} to {destination}, {date}. What's available?"]  # fmt: skip
DIRECT = [
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("What is the capital of Portugal?", "The capital of Portugal is Lisbon."),
    ("What is the capital of Canada?", "The capital of Canada is Ottawa."),
    ("Hi!", "Hello! I can check the weather, convert currencies and search for flights. What do you need?"),
    ("Thanks, that's all.", "You're welcome. Have a good trip!"),
    ("Can you book a hotel in Rome for me?",
     "I can't book hotels. I can check the weather, convert currencies and search for flights."),
    ("Can you rent me a car in Oslo?",
     "I can't rent cars. I can check the weather, convert currencies and search for flights."),
    ("What does 'bonjour' mean?", "'Bonjour' is French for 'hello'."),
    ("What does 'gracias' mean?", "'Gracias' is Spanish for 'thank you'."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("Which tools can you use?", "I can check the weather, convert currencies and search for flights."),
    ("Do I need a passport to fly from Paris to Berlin?",
     "Inside the Schengen area you need an ID card or a passport, but no passport check is usual."),
]  # fmt: skip


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def tool_row(ask: str, name: str, arguments: dict[str, Any], result: dict[str, Any], answer: str) -> dict:
    call_id = "call_1"
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ask},
            {"role": "assistant", "tool_calls": [call(name, arguments, call_id)]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
            {"role": "assistant", "content": answer},
        ],
        "tools": TOOLS,
    }


def weather(rng: random.Random) -> dict:
    city = rng.choice(CITIES)
    fahrenheit = rng.random() < 0.3
    ask = rng.choice(WEATHER_F_ASKS if fahrenheit else WEATHER_ASKS).format(city=city)
    celsius = rng.randint(-5, 35)
    temp, unit, symbol = (
        (round(celsius * 9 / 5 + 32), "fahrenheit", "°F") if fahrenheit else (celsius, "celsius", "°C")
    )
    conditions = rng.choice(CONDITIONS)
    args = {"city": city, "unit": unit} if fahrenheit else {"city": city}
    result = {"city": city, "temperature": temp, "unit": unit, "conditions": conditions}
    return tool_row(
        ask, "get_weather", args, result, f"It is {temp}{symbol} and {conditions} in {city} right now."
    )


def currency(rng: random.Random) -> dict:
    src, dst = rng.sample(sorted(RATES), 2)
    amount = rng.choice([10, 25, 50, 100, 120, 200, 250, 500, 1000])
    ask = rng.choice(CURRENCY_ASKS).format(amount=amount, src=src, dst=dst)
    rate = round(RATES[dst] / RATES[src], 4)
    converted = round(amount * rate, 2)
    args = {"amount": amount, "from_currency": src, "to_currency": dst}
    result = {"amount": amount, "from": src, "to": dst, "rate": rate, "converted": converted}
    return tool_row(
        ask, "convert_currency", args, result, f"{amount} {src} is {converted:.2f} {dst} (rate {rate})."
    )


def flights(rng: random.Random) -> dict:
    origin, destination = rng.sample(CITIES, 2)
    date = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    ask = rng.choice(FLIGHT_ASKS).format(origin=origin, destination=destination, date=date)
    found = []
    for _ in range(rng.randint(0, 2)):
        hour = rng.randint(6, 20)
        number = f"{rng.choice(AIRLINES)}{rng.randint(100, 999)}"
        departure = f"{hour:02d}:{rng.choice(['05', '30', '45'])}"
        found.append({"flight": number, "departure": departure, "price_eur": rng.randint(49, 480)})
    args = {"origin": origin, "destination": destination, "date": date}
    if not found:
        answer = f"There are no flights from {origin} to {destination} on {date}."
    else:
        listed = "; ".join(f"{f['flight']} at {f['departure']} for {f['price_eur']} EUR" for f in found)
        answer = f"Flights from {origin} to {destination} on {date}: {listed}."
    return tool_row(ask, "search_flights", args, {"flights": found}, answer)


def direct(rng: random.Random) -> dict:
    ask, answer = rng.choice(DIRECT)
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ask},
            {"role": "assistant", "content": answer},
        ],
        "tools": TOOLS,
    }


def make_rows(n: int, rng: random.Random) -> list[dict]:
    makers = [weather, weather, currency, currency, flights, flights, direct, direct, direct]
    return [rng.choice(makers)(rng) for _ in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=240, help="training rows")
    parser.add_argument("--eval", type=int, default=40, help="held-out rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE, help="folder for train.jsonl and eval.jsonl")
    args = parser.parse_args()
    # Separate streams, so changing --eval never changes the training rows.
    write_jsonl(args.out / "train.jsonl", make_rows(args.train, random.Random(f"train:{args.seed}")))
    write_jsonl(args.out / "eval.jsonl", make_rows(args.eval, random.Random(f"eval:{args.seed}")))
    print(
        f"wrote {args.train} rows to {args.out / 'train.jsonl'} and {args.eval} to {args.out / 'eval.jsonl'}"
    )


if __name__ == "__main__":
    main()

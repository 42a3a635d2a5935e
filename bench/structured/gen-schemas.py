#!/usr/bin/env python3
"""Varied JSON schemas with a prompt each, for `osprey bench structured`.

Writes bench/structured/schemas-dev.jsonl and schemas-heldout.jsonl: the same generator with
different seeds (and different topics), so nothing tuned on one set is measured on the other.
Each line is {"name", "prompt", "schema", "tool"}: `tool` says whether the case is asked as a
tool call (the schema as a function's parameters) instead of a response_format.

The schemas mix what real ones use: nested objects, arrays with bounds, enums and consts,
integers and numbers with ranges, strings with lengths, patterns and formats, nullable fields,
optional fields, anyOf, and $defs with $ref; plus a few written by hand (an invoice, a calendar
event, a product, a support ticket...).

    python3 bench/structured/gen-schemas.py
"""

import json
import pathlib
import random

HERE = pathlib.Path(__file__).parent

TOPICS = {
    "dev": ["a bookshop", "a mountain hike", "a jazz concert", "a hospital ward", "a chess club",
            "a bakery order", "a train timetable", "a weather station", "a library loan",
            "a software release", "a football match", "a recipe", "a hotel booking",
            "a museum exhibit", "a bank transfer", "a university course"],
    "heldout": ["a ferry crossing", "a violin workshop", "a vineyard harvest", "a dentist visit",
                "a satellite launch", "a flower shop", "a marathon", "a tax return",
                "a cinema screening", "a beekeeper's hive", "a car rental", "a lighthouse",
                "a pottery class", "a wedding", "an airport gate", "a city council vote"],
}

WORDS = ["title", "name", "city", "status", "owner", "count", "price", "date", "email", "code",
         "rating", "notes", "tags", "level", "score", "kind", "color", "phone", "start", "end",
         "total", "items", "author", "year", "active", "weight", "country", "label", "id", "size"]

ENUMS = [["low", "medium", "high"], ["open", "closed", "pending"], ["red", "green", "blue"],
         ["draft", "published"], ["small", "medium", "large", "xl"], ["yes", "no"]]


def leaf(rng, depth):
    """A schema for one value."""
    kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum", "format",
                       "pattern", "nullable", "const"] + (["array", "object"] if depth < 2 else []))
    if kind == "string":
        s = {"type": "string", "maxLength": rng.choice([10, 20, 40, 80])}
        if rng.random() < 0.3:
            s["minLength"] = 1
        return s
    if kind == "integer":
        lo = rng.choice([0, 1, -10, 1900])
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([10, 100, 1000, 200])}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 100, 10000])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.choice(ENUMS)}
    if kind == "format":
        return {"type": "string", "format": rng.choice(["date", "email", "date-time", "uuid"])}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(
            ["^[A-Z]{3}-[0-9]{3}$", "^[a-z]+$", "^\\+?[0-9]{7,12}$", "^#[0-9a-f]{6}$"])}
    if kind == "nullable":
        return {"type": [rng.choice(["string", "integer"]), "null"]}
    if kind == "const":
        return {"const": rng.choice(["v1", "v2", 1, True])}
    if kind == "array":
        lo = rng.choice([0, 1])
        return {"type": "array", "items": leaf(rng, depth + 1), "minItems": lo,
                "maxItems": lo + rng.choice([2, 3, 5])}
    return obj(rng, depth + 1)


def obj(rng, depth):
    n = rng.randint(1, 5 if depth == 0 else 3)
    names = rng.sample(WORDS, n)
    props = {k: leaf(rng, depth) for k in names}
    required = [k for k in names if rng.random() < 0.75] or [names[0]]
    s = {"type": "object", "properties": props, "required": required}
    if rng.random() < 0.7:
        s["additionalProperties"] = False
    return s


def with_extras(rng, schema):
    """Sometimes anyOf, sometimes $defs/$ref."""
    r = rng.random()
    if r < 0.15:
        return {"anyOf": [schema, obj(rng, 1)]}
    if r < 0.3:
        inner = obj(rng, 1)
        schema.setdefault("properties", {})["ref"] = {"$ref": "#/$defs/part"}
        schema.setdefault("required", []).append("ref")
        schema["$defs"] = {"part": inner}
    return schema


HAND = [
    ("invoice", {"type": "object", "properties": {
        "invoice_number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
        "customer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                                      "email": {"type": "string", "format": "email"}},
                     "required": ["name", "email"], "additionalProperties": False},
        "lines": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "properties": {"item": {"type": "string", "maxLength": 30},
                                             "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                                             "unit_price": {"type": "number", "minimum": 0, "maximum": 1000}},
            "required": ["item", "quantity", "unit_price"], "additionalProperties": False}},
        "currency": {"enum": ["EUR", "USD", "GBP"]}},
        "required": ["invoice_number", "customer", "lines", "currency"], "additionalProperties": False},
     "Write an invoice for two books and a pen bought by Ana Silva."),
    ("event", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 60}, "date": {"type": "string", "format": "date"},
        "attendees": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 5},
        "online": {"type": "boolean"}}, "required": ["title", "date", "attendees", "online"]},
     "Create a calendar event for a team lunch next Friday with three colleagues."),
    ("ticket", {"type": "object", "properties": {
        "summary": {"type": "string", "maxLength": 80}, "priority": {"enum": ["P1", "P2", "P3"]},
        "component": {"enum": ["billing", "login", "search", "other"]},
        "steps": {"type": "array", "items": {"type": "string", "maxLength": 60}, "minItems": 1, "maxItems": 4}},
        "required": ["summary", "priority", "component", "steps"], "additionalProperties": False},
     "A user cannot log in after resetting their password. File a support ticket."),
    ("product", {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"}, "name": {"type": "string", "maxLength": 40},
        "price": {"type": "number", "minimum": 0, "maximum": 500},
        "in_stock": {"type": "boolean"}, "dimensions": {"type": "object", "properties": {
            "w": {"type": "number", "minimum": 0, "maximum": 300}, "h": {"type": "number", "minimum": 0, "maximum": 300}},
            "required": ["w", "h"]}}, "required": ["sku", "name", "price", "in_stock"]},
     "Describe a wooden desk lamp for an online shop."),
]


def generate(split, seed, n):
    rng = random.Random(seed)
    cases = []
    for name, schema, prompt in HAND if split == "dev" else []:
        cases.append({"name": f"{split}-{name}", "prompt": prompt, "schema": schema, "tool": False})
    i = 0
    while len(cases) < n:
        topic = rng.choice(TOPICS[split])
        schema = with_extras(rng, obj(rng, 0))
        fields = ", ".join(sorted(schema.get("properties", {"fields": 0}).keys()))
        prompt = rng.choice([
            f"Describe {topic} as a JSON record.",
            f"Give me the details of {topic}.",
            f"Fill in the fields ({fields}) for {topic}.",
            f"Invent realistic data about {topic}.",
            f"Summarise {topic} in structured form.",
        ])
        cases.append({"name": f"{split}-{i:03d}", "prompt": prompt, "schema": schema,
                      "tool": rng.random() < 0.25})
        i += 1
    return cases


if __name__ == "__main__":
    for split, seed in [("dev", 7), ("heldout", 1234)]:
        cases = generate(split, seed, 220)
        path = HERE / f"schemas-{split}.jsonl"
        with open(path, "w") as f:
            for c in cases:
                f.write(json.dumps(c) + "\n")
        print(f"{path}: {len(cases)} cases, {sum(c['tool'] for c in cases)} as tool calls")

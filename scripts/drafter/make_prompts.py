#!/usr/bin/env python3
"""Writes the block drafter's prompt sets: a training set and a held-out set
with no topic, passage or template instance in common (checked below).

  python3 scripts/drafter/make_prompts.py     # rewrites the two files below

Both are JSON lines {"name", "category", "text"}; categories are free-form
(questions, instructions, code, chit-chat, other languages) and
input-grounded (a passage to summarise, rewrite or extract from).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "train_prompts.jsonl")
HELDOUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "data", "spec_heldout.jsonl")

TRAIN_TOPICS = [
    "photosynthesis", "the water cycle", "volcanoes", "the moon's phases", "earthquakes", "rainbows", "tides",
    "the immune system", "vaccines", "black holes", "gravity", "magnets", "electric circuits", "batteries",
    "the internet", "email", "passwords", "recycling", "composting", "bees", "whales", "coral reefs", "deserts",
    "the Roman Empire", "the printing press", "the steam engine", "the French Revolution", "ancient Egypt",
    "chess", "football", "the piano", "jazz", "watercolour painting", "baking bread", "coffee", "tea", "rice",
    "sleep", "running", "meditation", "budgeting", "saving money", "interest rates", "inflation", "taxes",
    "climate change", "solar panels", "wind turbines", "electric cars", "bicycles", "trains", "airplanes",
    "clouds", "snow", "lightning", "dinosaurs", "fossils", "DNA", "cells", "the heart", "the brain",
    "libraries", "museums", "maps", "compasses", "clocks", "calendars", "bridges", "skyscrapers", "roads",
]
HELDOUT_TOPICS = [
    "glaciers", "octopuses", "the Silk Road", "telescopes", "sourdough", "the violin", "hurricanes",
    "honey", "lighthouses", "vitamins", "the stock market", "submarines",
]

QUESTION_T = [
    "What is {t}? Explain it simply.",
    "Explain {t} to a ten-year-old.",
    "Give three interesting facts about {t}.",
    "Why is {t} important?",
    "Write a short paragraph about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "How would you describe {t} in five sentences?",
    "List five questions a student might ask about {t}, with short answers.",
]
INSTRUCT_T = [
    "Write a short poem about {t}.",
    "Write a two-paragraph story in which {t} plays a role.",
    "Write a short blog post introduction about {t}.",
    "Give me a step-by-step plan to learn about {t} in one week.",
    "Write a friendly email inviting a colleague to a talk about {t}.",
    "Write a product description for a book about {t}.",
]
CHAT_T = [
    "Hi! I've been reading about {t} lately. Any tips?",
    "I'm bored. Tell me something fun about {t}.",
    "My friend says {t} is boring. How can I change her mind?",
    "Can you recommend a weekend activity related to {t}?",
]
LANG_T = [
    ("fr", "Explique {t} en quelques phrases simples."),
    ("es", "Explica qué es {t} en pocas palabras."),
    ("de", "Erkläre kurz, was {t} ist."),
    ("it", "Spiega in breve che cos'è {t}."),
]
CODE_TASKS_TRAIN = [
    "reverses a string", "computes the factorial of a number", "checks whether a number is prime",
    "returns the largest element of a list", "counts the vowels in a string", "merges two sorted lists",
    "removes duplicates from a list", "converts Celsius to Fahrenheit", "computes the average of a list of numbers",
    "finds the second largest number in a list", "checks whether two strings are anagrams",
    "returns the nth Fibonacci number", "flattens a nested list", "counts word frequencies in a text",
    "validates an email address with a simple rule", "sorts a list of dictionaries by a key",
    "computes the greatest common divisor of two numbers", "reads a CSV file and sums a column",
    "rotates a list by k positions", "checks whether a year is a leap year",
]
CODE_TASKS_HELDOUT = [
    "converts a Roman numeral to an integer", "returns the median of a list", "capitalises every word of a sentence",
    "computes the dot product of two vectors", "checks whether brackets in a string are balanced",
]
LANGS_CODE = ["Python", "JavaScript", "C", "Rust", "Go", "Java"]
CODE_T = [
    "Write a {lang} function that {task}.",
    "Write a {lang} function that {task}, and explain how it works.",
    "Show a short {lang} example that {task}, with comments.",
]

PASSAGE_SUBJECTS_TRAIN = [
    ("the town of Brenford", "a new bus line", "14", "2.5 million euros", "June"),
    ("Lakeview school", "a vegetable garden", "40", "3,000 dollars", "April"),
    ("the city hospital", "a new emergency wing", "120", "18 million pounds", "October"),
    ("a small bakery", "a second shop", "6", "80,000 euros", "September"),
    ("the regional library", "longer opening hours", "25", "150,000 dollars", "January"),
    ("a software company", "a four-day week", "300", "no extra cost", "March"),
    ("the football club", "a new stadium roof", "55", "9 million euros", "August"),
    ("the harbour authority", "a ferry to the islands", "30", "4 million dollars", "May"),
    ("a village council", "street lights powered by solar panels", "12", "60,000 pounds", "November"),
    ("the university", "a free tutoring programme", "200", "500,000 euros", "February"),
    ("a museum", "a children's science room", "18", "750,000 dollars", "July"),
    ("the water company", "new pipes in the old town", "90", "11 million euros", "December"),
]
PASSAGE_SUBJECTS_HELDOUT = [
    ("the island of Korsa", "a desalination plant", "35", "7 million euros", "March"),
    ("a cycling club", "a repair workshop for members", "8", "20,000 pounds", "May"),
    ("the national park", "a new visitor centre", "60", "5 million dollars", "October"),
    ("a theatre company", "a summer festival", "45", "400,000 euros", "July"),
]
PASSAGE_T = (
    "Last week {s} announced a plan for {p}. The project will involve {n} people and is expected to cost {c}. "
    "Supporters say it will make daily life easier and bring new visitors to the area. Critics worry about the "
    "cost and ask whether the money could be spent on something more urgent. A final decision is expected in {m}, "
    "after a public meeting where residents can ask questions."
)
GROUNDED_T = [
    "Summarise this text in two sentences:\n\n{x}",
    "Rewrite this text in simpler words:\n\n{x}",
    "List every number mentioned in this text, one per line:\n\n{x}",
    "Write three questions about this text and answer them:\n\n{x}",
    "Turn this text into a short news headline and a one-line summary:\n\n{x}",
    "Rewrite this text as a formal letter to residents:\n\n{x}",
]


def build(topics, code_tasks, passages, rng, n_code_langs):
    out = []
    for t in topics:
        for i, tmpl in enumerate(QUESTION_T):
            out.append({"name": f"q{i}-{t}", "category": "free-form", "text": tmpl.format(t=t)})
        for i, tmpl in enumerate(INSTRUCT_T):
            out.append({"name": f"i{i}-{t}", "category": "free-form", "text": tmpl.format(t=t)})
        for i, tmpl in enumerate(CHAT_T):
            out.append({"name": f"c{i}-{t}", "category": "free-form", "text": tmpl.format(t=t)})
        lang, tmpl = LANG_T[rng.randrange(len(LANG_T))]
        out.append({"name": f"l-{lang}-{t}", "category": "free-form", "text": tmpl.format(t=t)})
    for task in code_tasks:
        for lang in rng.sample(LANGS_CODE, n_code_langs):
            tmpl = CODE_T[rng.randrange(len(CODE_T))]
            out.append({"name": f"code-{lang}-{task}", "category": "free-form",
                        "text": tmpl.format(lang=lang, task=task)})
    for s, p, n, c, m in passages:
        x = PASSAGE_T.format(s=s, p=p, n=n, c=c, m=m)
        for i, tmpl in enumerate(GROUNDED_T):
            out.append({"name": f"g{i}-{s}", "category": "input-grounded", "text": tmpl.format(x=x)})
    return out


def main():
    rng = random.Random(35)
    train = build(TRAIN_TOPICS, CODE_TASKS_TRAIN, PASSAGE_SUBJECTS_TRAIN, rng, 3)
    rng.shuffle(train)
    # The held-out set: its own topics, code tasks and passages, a subset of
    # templates so that it stays small enough to benchmark.
    held_rng = random.Random(36)
    full = build(HELDOUT_TOPICS, CODE_TASKS_HELDOUT, PASSAGE_SUBJECTS_HELDOUT, held_rng, 1)
    free = [p for p in full if p["category"] == "free-form"]
    grounded = [p for p in full if p["category"] == "input-grounded"]
    held = held_rng.sample(free, 10) + held_rng.sample(grounded, 6)
    train_texts = {p["text"] for p in train}
    assert not any(p["text"] in train_texts for p in held), "a held-out prompt is in the training set"
    for t in HELDOUT_TOPICS:
        assert t not in TRAIN_TOPICS
    for path, rows in ((TRAIN, train), (HELDOUT, held)):
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"wrote {len(rows)} prompts to {os.path.relpath(path)}")


if __name__ == "__main__":
    main()

"""``kb-multihop``: a fictional world rendered as passages for BM25, with 1-, 2- and 3-hop questions.

Every name (people, companies, universities, cities, countries) is invented from syllables, so no answer
can come from a model's memory: the agent has to search. The world is generated from a seed and holds two
disconnected regions with disjoint entities, ``train`` and ``test``; questions of a split only touch its
own region, so training never teaches a fact a test question needs, yet both splits search one corpus
(the other region is extra distractors).

Guarantees, checked by the tests:

* every relation is functional (one founder, one CEO, one headquarters, one birthplace, one university,
  one country, one capital; a person founds at most one company and runs at most one), so every question
  has exactly one answer, and every invented word is used in one name only (generic words such as
  "Labs" or "University" aside), so a name never matches another entity;
* one passage per entity, titled with its name, states each of its relations in prose, plus distractor
  sentences (other figures, a regional office or a visit in another city) that a careless reader could
  confuse with the asked relation;
* each hop of a question is answerable from the passage of that hop's subject, which BM25 retrieves with
  the subject's name.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentcredit.tasks.example import Example, stable_rng
from agentcredit.tasks.paths import default_cache_dir

TASK = "kb-multihop"
SPLITS = ("train", "test")
HOPS = (1, 2, 3)

# Entities per region. Seed 0 offers 648 / 852 / 750 train and 260 / 341 / 300 test questions of 1 / 2 / 3 hops.
REGION_SIZES: dict[str, dict[str, int]] = {
    "train": {"country": 6, "city": 30, "university": 12, "company": 60, "person": 150},
    "test": {"country": 3, "city": 12, "university": 5, "company": 24, "person": 60},
}


@dataclass
class Entity:
    """One thing in the world. ``facts`` maps a relation name to the name of the entity it points to."""

    kind: str
    name: str
    region: str
    facts: dict[str, str] = field(default_factory=dict)
    traits: dict[str, str] = field(default_factory=dict)  # decoration for the prose; never asked about


@dataclass(frozen=True)
class Relation:
    """A functional relation: ``source`` kind -> ``target`` kind, how to ask it, how to nest it in a phrase."""

    name: str
    source: str
    target: str
    question: str  # "Who founded {x}?"
    phrase: str  # "the founder of {x}"


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation("born_in", "person", "city", "In which city was {x} born?", "the city where {x} was born"),
        Relation(
            "studied_at",
            "person",
            "university",
            "Which university did {x} attend?",
            "the university {x} attended",
        ),
        Relation("founded", "person", "company", "Which company did {x} found?", "the company {x} founded"),
        Relation(
            "ceo_of", "person", "company", "Which company is {x} the CEO of?", "the company {x} is the CEO of"
        ),
        Relation("founded_by", "company", "person", "Who founded {x}?", "the founder of {x}"),
        Relation("ceo", "company", "person", "Who is the CEO of {x}?", "the CEO of {x}"),
        Relation(
            "headquartered_in",
            "company",
            "city",
            "In which city is {x} headquartered?",
            "the city where {x} is headquartered",
        ),
        Relation(
            "located_in",
            "university",
            "city",
            "In which city is {x} located?",
            "the city where {x} is located",
        ),
        Relation(
            "located_in_country",
            "city",
            "country",
            "In which country is {x}?",
            "the country that {x} belongs to",
        ),
        Relation("capital", "country", "city", "What is the capital of {x}?", "the capital of {x}"),
    )
}
# Consecutive relations that lead straight back (the founder of the company X founded is X).
_BACKTRACKS = {
    ("founded_by", "founded"),
    ("founded", "founded_by"),
    ("ceo", "ceo_of"),
    ("ceo_of", "ceo"),
    ("capital", "located_in_country"),
    ("located_in_country", "capital"),
}

# ----------------------------------------------------------------------------------------------------
# Names

# Short, pronounceable syllables: names stay a few tokens long for a small model's tokenizer.
_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "l", "m", "n", "p", "r", "s", "st", "t", "tr", "v", "z")
_ONSETS += ("th", "sh", "ch", "h", "j", "w")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ou")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "k", "th")
_COMPANY_SUFFIX = ("Dynamics", "Labs", "Works", "Systems", "Holdings", "Foundry", "Industries", "Analytics")
_UNIVERSITY_FORMS = ("{w} University", "{w} Institute of Technology", "{w} College", "University of {w}")
_COUNTRY_ENDINGS = ("ia", "land", "ova", "ar", "eth")


class _Namer:
    """Invented words, each used once in the whole world, so every name token identifies one entity."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: tuple[int, int] = (2, 2), ending: str = "") -> str:
        while True:
            count = self.rng.randint(*syllables)
            word = "".join(
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                for _ in range(count)
            )
            word = (word + ending).capitalize()
            if len(word) >= 4 and word.lower() not in self.used and word.lower() not in RESERVED_WORDS:
                self.used.add(word.lower())
                return word


def _name(kind: str, namer: _Namer, rng: random.Random) -> str:
    if kind == "person":
        return f"{namer.word()} {namer.word((2, 3))}"
    if kind == "company":
        return f"{namer.word()} {rng.choice(_COMPANY_SUFFIX)}"
    if kind == "university":
        return rng.choice(_UNIVERSITY_FORMS).format(w=namer.word())
    if kind == "country":
        return namer.word(ending=rng.choice(_COUNTRY_ENDINGS))
    return namer.word((2, 3))


# ----------------------------------------------------------------------------------------------------
# The world

_PROFESSIONS = (
    "engineer",
    "chemist",
    "economist",
    "architect",
    "novelist",
    "physician",
    "investor",
    "designer",
)
_INDUSTRIES = ("shipping", "software", "textile", "biotech", "mining", "aerospace", "food", "energy")
_HOBBIES = ("amateur astronomy", "competitive sailing", "collecting maps", "restoring clocks", "beekeeping")
_RIVERS_SUFFIX = " river"
_CURRENCIES = ("crown", "mark", "florin", "dinar", "thaler")


# Every word of the prose and question templates. An invented name never uses one: a city called "Home"
# would match every passage that says "is home to" and BM25 could no longer find it by name.
_TEMPLATE_WORDS = """
a about alumni an and at attend attended became belongs born by capital ceo chief cities city companies company
conference country currency did employs established executive for found founded founder has headquartered home
in include inhabitants is known later lies located of office officer on once people regional river runs spent
studied summer that the to university was what where which who whose years
"""
RESERVED_WORDS: frozenset[str] = frozenset(
    word.lower()
    for phrase in (_TEMPLATE_WORDS, *_PROFESSIONS, *_INDUSTRIES, *_HOBBIES, *_CURRENCIES, *_COMPANY_SUFFIX)
    + _UNIVERSITY_FORMS
    for word in phrase.replace("{w}", " ").split()
)


@dataclass
class World:
    """Every entity by name, in creation order (which fixes the passage order)."""

    seed: int
    entities: dict[str, Entity]

    def of(self, kind: str, region: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind and e.region == region]

    def target(self, subject: str, relation: str) -> str | None:
        return self.entities[subject].facts.get(relation)


def _build_region(region: str, namer: _Namer, rng: random.Random, entities: dict[str, Entity]) -> None:
    sizes = REGION_SIZES[region]
    made: dict[str, list[Entity]] = {}
    for kind in ("country", "city", "university", "company", "person"):
        made[kind] = []
        for _ in range(sizes[kind]):
            entity = Entity(kind, _name(kind, namer, rng), region)
            entities[entity.name] = entity
            made[kind].append(entity)
    countries, cities, people = made["country"], made["city"], made["person"]
    # Every country gets at least one city (its capital is one of its own cities).
    for i, city in enumerate(cities):
        country = countries[i] if i < len(countries) else rng.choice(countries)
        city.facts["located_in_country"] = country.name
    for country in countries:
        own = [c.name for c in cities if c.facts["located_in_country"] == country.name]
        country.facts["capital"] = rng.choice(own)
        country.traits["currency"] = rng.choice(_CURRENCIES)
    for city in cities:
        city.traits["population"] = f"{rng.randint(20, 2_000) * 1000:,}"
        city.traits["river"] = namer.word() + _RIVERS_SUFFIX
    for university in made["university"]:
        university.facts["located_in"] = rng.choice(cities).name
        university.traits["founded"] = str(rng.randint(1650, 1990))
    # Founders and CEOs are distinct people, so "the company X founded" and "the company X runs" are unique.
    chosen = rng.sample(people, 2 * len(made["company"]))
    founders, ceos = chosen[: len(made["company"])], chosen[len(made["company"]) :]
    for company, founder, ceo in zip(made["company"], founders, ceos, strict=True):
        company.facts["founded_by"] = founder.name
        company.facts["ceo"] = ceo.name
        company.facts["headquartered_in"] = rng.choice(cities).name
        founder.facts["founded"] = company.name
        ceo.facts["ceo_of"] = company.name
        company.traits["industry"] = rng.choice(_INDUSTRIES)
        company.traits["year"] = str(rng.randint(1890, 2015))
        company.traits["employees"] = f"{rng.randint(40, 90_000):,}"
        company.traits["office"] = rng.choice(
            [c.name for c in cities if c.name != company.facts["headquartered_in"]]
        )
    for person in people:
        person.facts["born_in"] = rng.choice(cities).name
        person.facts["studied_at"] = rng.choice(made["university"]).name
        person.traits["profession"] = rng.choice(_PROFESSIONS)
        person.traits["hobby"] = rng.choice(_HOBBIES)
        person.traits["visited"] = rng.choice([c.name for c in cities if c.name != person.facts["born_in"]])


def build_world(seed: int = 0) -> World:
    """The world for ``seed``: a ``train`` region and a disjoint ``test`` region; the same in every process."""
    rng = stable_rng(TASK, "world", seed)
    namer = _Namer(rng)
    entities: dict[str, Entity] = {}
    for region in SPLITS:
        _build_region(region, namer, rng, entities)
    return World(seed, entities)


# ----------------------------------------------------------------------------------------------------
# Passages


def _listing(names: list[str]) -> str:
    if len(names) <= 2:
        return " and ".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _article(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _passage_text(entity: Entity, world: World) -> str:
    f, t, name = entity.facts, entity.traits, entity.name
    others = world.entities.values()
    if entity.kind == "person":
        sentences = [
            f"{name} is {_article(t['profession'])} who was born in {f['born_in']}.",
            f"{name} studied at {f['studied_at']}.",
        ]
        if "founded" in f:
            sentences.append(f"{name} founded {f['founded']}.")
        if "ceo_of" in f:
            sentences.append(f"{name} is the chief executive officer (CEO) of {f['ceo_of']}.")
        sentences += [
            f"In later years {name} became known for {t['hobby']}.",
            f"{name} once spent a summer in {t['visited']} for a conference.",
        ]
    elif entity.kind == "company":
        sentences = [
            f"{name} is {_article(t['industry'])} company headquartered in {f['headquartered_in']}.",
            f"{name} was founded by {f['founded_by']} in {t['year']}.",
            f"The chief executive officer (CEO) of {name} is {f['ceo']}.",
            f"{name} employs about {t['employees']} people and runs a regional office in {t['office']}.",
        ]
    elif entity.kind == "university":
        alumni = [e.name for e in others if e.facts.get("studied_at") == name]
        sentences = [
            f"{name} is a university located in the city of {f['located_in']}.",
            f"{name} was established in {t['founded']}.",
        ]
        if alumni:
            sentences.append(f"Alumni of {name} include {_listing(alumni)}.")
    elif entity.kind == "city":
        companies = [e.name for e in others if e.facts.get("headquartered_in") == name]
        universities = [e.name for e in others if e.facts.get("located_in") == name]
        natives = [e.name for e in others if e.facts.get("born_in") == name]
        sentences = [f"{name} is a city in the country of {f['located_in_country']}."]
        capital_of = [e.name for e in others if e.facts.get("capital") == name]
        if capital_of:
            sentences.append(f"{name} is the capital of {capital_of[0]}.")
        sentences.append(f"{name} lies on the {t['river']} and has about {t['population']} inhabitants.")
        if companies:
            sentences.append(f"Companies headquartered in {name} include {_listing(companies)}.")
        if universities:
            sentences.append(f"{name} is home to {_listing(universities)}.")
        if natives:
            sentences.append(f"People born in {name} include {_listing(natives)}.")
    else:  # country
        cities = [e.name for e in others if e.facts.get("located_in_country") == name]
        sentences = [
            f"{name} is a country whose capital is {f['capital']}.",
            f"The cities of {name} include {_listing(cities)}.",
            f"The currency of {name} is the {name} {t['currency']}.",
        ]
    return " ".join(sentences)


def kb_corpus(seed: int = 0) -> list[dict[str, str]]:
    """The world of ``seed`` as passages ``{id, title, text}``, one per entity (both regions)."""
    world = build_world(seed)
    return [
        {"id": f"kb{seed}-{i}", "title": e.name, "text": _passage_text(e, world)}
        for i, e in enumerate(world.entities.values())
    ]


def write_kb_corpus(seed: int = 0, path: str | Path | None = None) -> Path:
    """Write :func:`kb_corpus` as JSONL for the search tool and return its path.

    Without ``path`` the file goes to ``<cache>/kb-multihop/seed<seed>-<content hash>.jsonl`` and is
    written only once: the hash in the name changes whenever the generator's output does, so a stale
    cache can never be read. The write is atomic (temp file + rename), safe for concurrent workers.
    """
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in kb_corpus(seed))
    if path is None:
        digest = hashlib.sha256(lines.encode("utf-8")).hexdigest()[:12]
        path = default_cache_dir() / TASK / f"seed{seed}-{digest}.jsonl"
        if path.is_file():
            return path
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(lines, encoding="utf-8")
    tmp.replace(path)
    return path


# ----------------------------------------------------------------------------------------------------
# Questions


def _chains(world: World, region: str, hops: int) -> Iterator[list[tuple[str, str, str]]]:
    """Every chain of ``hops`` relations from an entity of ``region`` that never revisits an entity."""

    def extend(chain: list[tuple[str, str, str]], visited: set[str]) -> Iterator[list[tuple[str, str, str]]]:
        if len(chain) == hops:
            yield chain
            return
        subject = chain[-1][2]
        for relation, obj in world.entities[subject].facts.items():
            if (chain[-1][1], relation) in _BACKTRACKS or obj in visited:
                continue
            yield from extend([*chain, (subject, relation, obj)], visited | {obj})

    for entity in world.entities.values():
        if entity.region != region:
            continue
        for relation, obj in entity.facts.items():
            if obj != entity.name:
                yield from extend([(entity.name, relation, obj)], {entity.name, obj})


def question_text(chain: list[tuple[str, str, str]]) -> str:
    """English for a chain: inner relations become nested phrases, the last one the question."""
    subject = chain[0][0]
    for _, relation, _ in chain[:-1]:
        subject = RELATIONS[relation].phrase.format(x=subject)
    return RELATIONS[chain[-1][1]].question.format(x=subject)


def available_questions(seed: int = 0, split: str = "train") -> dict[int, int]:
    """How many distinct questions of each hop count the world of ``seed`` offers for ``split``."""
    world = build_world(seed)
    return {h: sum(1 for _ in _chains(world, split, h)) for h in HOPS}


def generate(n: int, seed: int = 0, *, split: str = "train") -> list[Example]:
    """``n`` questions about the world of ``seed``: hop counts as equal as possible (1, 2, 3), no repeats.

    ``info`` holds ``hops``, the ``chain`` of ``[subject, relation, object]`` triples (the answer is the last
    object), and ``supporting_titles`` (the passage titles, one per hop). Same inputs, same output.
    """
    if split not in SPLITS:
        raise ValueError(f"{TASK}: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"{TASK}: n must be >= 0, got {n}")
    world = build_world(seed)
    rng = stable_rng(TASK, "questions", split, seed)
    per_hop = {h: n // len(HOPS) + (1 if i < n % len(HOPS) else 0) for i, h in enumerate(HOPS)}
    picked: list[tuple[int, list[tuple[str, str, str]]]] = []
    for hops, count in per_hop.items():
        chains = list(_chains(world, split, hops))
        if count > len(chains):
            raise ValueError(
                f"{TASK}: the {split} region of world {seed} has {len(chains)} {hops}-hop questions, asked for {count}"
            )
        picked += [(hops, chain) for chain in rng.sample(chains, count)]
    rng.shuffle(picked)
    return [
        Example(
            id=f"{TASK}-{split}-s{seed}-{i:05d}",
            question=question_text(chain),
            answers=[chain[-1][2]],
            task=TASK,
            info={
                "metric": "em",
                "hops": hops,
                "chain": [list(step) for step in chain],
                "supporting_titles": [step[0] for step in chain],
                "split": split,
                "world_seed": seed,
            },
        )
        for i, (hops, chain) in enumerate(picked)
    ]

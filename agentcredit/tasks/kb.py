"""``kb-multihop``: a fictional world rendered as passages for BM25, with 1-, 2- and 3-hop questions.

Every name (people, companies, universities, cities, countries) is invented from syllables, so no answer
can come from a model's memory: the agent has to search. The world is generated from a seed and holds three
disconnected regions with disjoint entities, ``train``, ``test`` and ``novel``; questions of a split only
touch its own region, so training never teaches a fact a test question needs, yet every split searches one
corpus (the other regions are extra distractors).

``train`` and ``test`` share their kinds of entity, relations, question templates and passage prose. ``novel``
shares none of them: musicians, bands, record labels, towns and provinces, asked about in other phrasings
("Name the record label that ... records for.") and described in other sentences. It measures whether a
policy learned to read a retrieved passage or only the templates of its training questions.

Guarantees, checked by the tests:

* every relation is functional (one founder, one CEO, one headquarters, one birthplace, one university,
  one country, one capital; a person founds at most one company and runs at most one; in the novel region
  one hometown, one band per musician, one lead vocalist (a member), one label, one studio town, one
  province, one seat), so every question has exactly one answer, and every invented word is used in one name only (generic words such as
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
import math
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from agentcredit.tasks.example import Example, stable_rng
from agentcredit.tasks.paths import default_cache_dir

TASK = "kb-multihop"
SPLITS = ("train", "test", "novel")
HOPS = (1, 2, 3)

# Entities per region. Seed 0 offers 648 / 852 / 750 train, 260 / 341 / 300 test and 173 / 199 / 175 novel
# questions of 1 / 2 / 3 hops.
REGION_SIZES: dict[str, dict[str, int]] = {
    "train": {"country": 6, "city": 30, "university": 12, "company": 60, "person": 150},
    "test": {"country": 3, "city": 12, "university": 5, "company": 24, "person": 60},
    "novel": {"province": 3, "town": 12, "label": 6, "band": 20, "musician": 60},
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
        # the novel region: relations, kinds and phrasings that train and test never use
        Relation(
            "grew_up_in", "musician", "town", "Name the town that {x} grew up in.", "the town {x} grew up in"
        ),
        Relation(
            "plays_with", "musician", "band", "{x} performs with which band?", "the band {x} performs with"
        ),
        Relation(
            "lead_vocalist", "band", "musician", "Tell me who sings lead for {x}.", "the lead vocalist of {x}"
        ),
        Relation(
            "records_for",
            "band",
            "label",
            "Name the record label that {x} records for.",
            "the record label {x} records for",
        ),
        Relation(
            "studios_in",
            "label",
            "town",
            "Tell me the town where {x} keeps its studios.",
            "the town where {x} keeps its studios",
        ),
        Relation(
            "in_province", "town", "province", "{x} sits in which province?", "the province {x} sits in"
        ),
        Relation(
            "seat", "province", "town", "Name the seat of government of {x}.", "the seat of government of {x}"
        ),
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
_BAND_FORMS = ("The {w} Collective", "{w} Quartet", "The {w} Ensemble", "{w} Choir")
_LABEL_SUFFIX = ("Records", "Recordings", "Sound")
_PROVINCE_ENDINGS = ("shire", "vale", "moor")


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
    if kind == "musician":
        return f"{namer.word((1, 2))} {namer.word((2, 3))}"
    if kind == "band":
        return rng.choice(_BAND_FORMS).format(w=namer.word())
    if kind == "label":
        return f"{namer.word()} {rng.choice(_LABEL_SUFFIX)}"
    if kind == "province":
        return namer.word(ending=rng.choice(_PROVINCE_ENDINGS))
    return namer.word((2, 3))  # city, town


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
_INSTRUMENTS = ("cello", "banjo", "trumpet", "violin", "harp", "drum")
_GENRES = ("folk", "jazz", "punk", "gospel", "techno")
_CRAFTS = ("pottery", "glassblowing", "woodcarving", "weaving")
_DIALECTS = ("northern", "coastal", "highland")


# Every word of the prose and question templates. An invented name never uses one: a city called "Home"
# would match every passage that says "is home to" and BM25 could no longer find it by name.
_TEMPLATE_WORDS = """
a about alumni an and at attend attended became belongs born by capital ceo chief cities city companies company
conference country currency did employs established executive for found founded founder has headquartered home
in include inhabitants is known later lies located of office officer on once people regional river runs spent
studied summer that the to university was what where which who whose years
also band bands days dialect every festival from government governed grew group held its keeps label labels
last lead market me members musicians name performs player plays province record records rehearsal rents
rooms seat sings sits speak spring started studios tell these through toured town towns up vocalist week with
"""
RESERVED_WORDS: frozenset[str] = frozenset(
    word.lower()
    for phrase in (
        _TEMPLATE_WORDS,
        *_PROFESSIONS,
        *_INDUSTRIES,
        *_HOBBIES,
        *_CURRENCIES,
        *_COMPANY_SUFFIX,
        *_INSTRUMENTS,
        *_GENRES,
        *_CRAFTS,
        *_DIALECTS,
        *_LABEL_SUFFIX,
    )
    + _UNIVERSITY_FORMS
    + _BAND_FORMS
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


def _build_novel_region(namer: _Namer, rng: random.Random, entities: dict[str, Entity]) -> None:
    """Musicians, bands, labels, towns and provinces: the same shape of world in kinds training never saw."""
    sizes = REGION_SIZES["novel"]
    made: dict[str, list[Entity]] = {}
    for kind in ("province", "town", "label", "band", "musician"):
        made[kind] = []
        for _ in range(sizes[kind]):
            entity = Entity(kind, _name(kind, namer, rng), "novel")
            entities[entity.name] = entity
            made[kind].append(entity)
    provinces, towns, musicians = made["province"], made["town"], made["musician"]
    for i, town in enumerate(towns):  # every province gets a town, its seat is one of its own
        town.facts["in_province"] = (provinces[i] if i < len(provinces) else rng.choice(provinces)).name
        town.traits["market"] = rng.choice(_CRAFTS)
    for province in provinces:
        province.facts["seat"] = rng.choice(
            [t.name for t in towns if t.facts["in_province"] == province.name]
        )
        province.traits["dialect"] = rng.choice(_DIALECTS)
    for label in made["label"]:
        label.facts["studios_in"] = rng.choice(towns).name
        label.traits["year"] = str(rng.randint(1950, 2020))
        label.traits["rooms"] = rng.choice([t.name for t in towns if t.name != label.facts["studios_in"]])
    # Each band has 2 or 3 members, one of them its lead vocalist; a musician plays with at most one band, so
    # "the band X performs with" and "the lead vocalist of B" are both unique.
    pool = list(musicians)
    rng.shuffle(pool)
    for band in made["band"]:
        members = [pool.pop() for _ in range(rng.choice((2, 3)))]
        band.facts["lead_vocalist"] = rng.choice(members).name
        band.facts["records_for"] = rng.choice(made["label"]).name
        band.traits["genre"] = rng.choice(_GENRES)
        band.traits["festival"] = rng.choice(towns).name
        for member in members:
            member.facts["plays_with"] = band.name
    for musician in musicians:
        musician.facts["grew_up_in"] = rng.choice(towns).name
        musician.traits["instrument"] = rng.choice(_INSTRUMENTS)
        musician.traits["toured"] = rng.choice(
            [t.name for t in towns if t.name != musician.facts["grew_up_in"]]
        )


def build_world(seed: int = 0) -> World:
    """The world for ``seed``: disjoint ``train``, ``test`` and ``novel`` regions; the same in every process.

    The novel region is built last, so adding it left the train and test regions exactly as they were.
    """
    rng = stable_rng(TASK, "world", seed)
    namer = _Namer(rng)
    entities: dict[str, Entity] = {}
    for region in ("train", "test"):
        _build_region(region, namer, rng, entities)
    _build_novel_region(namer, rng, entities)
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
    elif entity.kind == "country":
        cities = [e.name for e in others if e.facts.get("located_in_country") == name]
        sentences = [
            f"{name} is a country whose capital is {f['capital']}.",
            f"The cities of {name} include {_listing(cities)}.",
            f"The currency of {name} is the {name} {t['currency']}.",
        ]
    else:
        sentences = _novel_passage(entity, world)
    return " ".join(sentences)


def _novel_passage(entity: Entity, world: World) -> list[str]:
    """Prose for the novel region: other sentence shapes, and the distractors a careless reader confuses."""
    f, t, name = entity.facts, entity.traits, entity.name
    others = world.entities.values()
    if entity.kind == "musician":
        sentences = [f"{name}, a {t['instrument']} player, grew up in {f['grew_up_in']}."]
        if "plays_with" in f:
            sentences.append(f"These days {name} performs with {f['plays_with']}.")
        sentences.append(f"Last spring {name} toured through {t['toured']}.")
        return sentences
    if entity.kind == "band":
        members = [e.name for e in others if e.facts.get("plays_with") == name]
        return [
            f"{name} is a {t['genre']} group that records for {f['records_for']}.",
            f"The lead vocalist of {name} is {f['lead_vocalist']}.",
            f"Members of {name} include {_listing(members)}.",
            f"Every spring {name} plays a festival held in {t['festival']}.",
        ]
    if entity.kind == "label":
        bands = [e.name for e in others if e.facts.get("records_for") == name]
        sentences = [
            f"{name} is a record label that keeps its studios in {f['studios_in']}.",
            f"{name} was started in {t['year']} and also rents rehearsal rooms in {t['rooms']}.",
        ]
        if bands:
            sentences.append(f"Bands that record for {name} include {_listing(bands)}.")
        return sentences
    if entity.kind == "town":
        seat_of = [e.name for e in others if e.facts.get("seat") == name]
        grew_up = [e.name for e in others if e.facts.get("grew_up_in") == name]
        studios = [e.name for e in others if e.facts.get("studios_in") == name]
        sentences = [f"{name} sits in the province of {f['in_province']}."]
        if seat_of:
            sentences.append(f"{name} is the seat of government of {seat_of[0]}.")
        sentences.append(f"A {t['market']} market is held in {name} every week.")
        if studios:
            sentences.append(f"Record labels with studios in {name} include {_listing(studios)}.")
        if grew_up:
            sentences.append(f"Musicians who grew up in {name} include {_listing(grew_up)}.")
        return sentences
    if entity.kind == "province":
        towns = [e.name for e in others if e.facts.get("in_province") == name]
        return [
            f"{name} is governed from its seat of government, {f['seat']}.",
            f"The towns of {name} include {_listing(towns)}.",
            f"People in {name} speak a {t['dialect']} dialect.",
        ]
    raise ValueError(f"{TASK}: no prose for an entity of kind {entity.kind!r}")


def kb_corpus(seed: int = 0) -> list[dict[str, str]]:
    """The world of ``seed`` as passages ``{id, title, text}``, one per entity (every region)."""
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


EQUAL_THIRDS: dict[int, Fraction] = {h: Fraction(1, len(HOPS)) for h in HOPS}
OPTION = "task.options.train_hop_fractions"


def hop_fractions(value: Any) -> dict[int, Fraction]:
    """``train_hop_fractions`` checked and read: a mapping hop count (1, 2, 3; YAML ints or, after a JSON round
    trip, the strings "1".."3") -> share in [0, 1], the shares summing to 1 (within 1e-6); a hop left out gets 0.
    None means equal thirds. Each share is read as the decimal it was written as (``Fraction(str(x))``), so 0.3
    of 10 questions is exactly 3. Raises ValueError naming the option."""
    if value is None:
        return dict(EQUAL_THIRDS)
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            f"{TASK}: {OPTION} must be a mapping of hop count to share, e.g. {{1: 0.5, 2: 0.3, 3: 0.2}}, "
            f"got {value!r}"
        )
    shares: dict[int, Fraction] = dict.fromkeys(HOPS, Fraction(0))
    for key, share in value.items():
        hop = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if isinstance(hop, bool) or hop not in HOPS:
            raise ValueError(f"{TASK}: {OPTION} keys must be hop counts {list(HOPS)}, got {key!r}")
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
            raise ValueError(f"{TASK}: {OPTION}[{hop}] must be a number in [0, 1], got {share!r}")
        shares[hop] = Fraction(str(share))
    total = sum(shares.values())
    if abs(total - 1) > Fraction(1, 10**6):
        raise ValueError(f"{TASK}: {OPTION} must sum to 1, got {float(total):g} ({dict(value)!r})")
    # renormalised to exactly 1, so that hop_counts splits n exactly
    return {h: share / total for h, share in shares.items()}


def hop_counts(n: int, fractions: Mapping[int, Fraction]) -> dict[int, int]:
    """How many of ``n`` questions get each hop count: ``floor(n * share)``, then the questions left over (at most
    two) to the hops with the largest remainders, ties to the fewer hops. Equal thirds give the split the
    generator always made: ``n // 3`` each, the first ``n % 3`` hops one more."""
    floors = {h: math.floor(n * fractions[h]) for h in HOPS}
    left = n - sum(floors.values())
    ranked = sorted(HOPS, key=lambda h: (-(n * fractions[h] - floors[h]), h))
    return {h: floors[h] + (1 if h in ranked[:left] else 0) for h in HOPS}


DEFAULT_SIZE = {"train": 1500, "test": 300, "novel": 300}


def most_questions(available: Mapping[int, int], fractions: Mapping[int, Fraction], cap: int) -> int:
    """The largest ``n <= cap`` whose :func:`hop_counts` the ``available`` questions per hop can fill. Searched
    downwards, not solved: largest-remainder counts are not monotone in ``n`` (a hop can lose a question when
    ``n`` grows by one), so the first fitting ``n`` below the bound is checked, not assumed."""
    bound = cap
    for h, share in fractions.items():
        if share > 0:  # a fitting n has n * share - 1 < count <= available
            bound = min(bound, math.floor((available[h] + 1) / share))
    for n in range(bound, -1, -1):
        if all(c <= available[h] for h, c in hop_counts(n, fractions).items()):
            return n
    return 0


def default_size(
    split: str = "train", seed: int = 0, *, train_hop_fractions: Mapping[Any, float] | None = None
) -> int:
    """How many questions a split has when no ``limit`` is asked for: :data:`DEFAULT_SIZE`, or on the train split
    the most a ``train_hop_fractions`` mix can fill from the world when that is fewer. World 0's train region has
    648 1-hop questions, so an 80% 1-hop mix gets 810 questions, not an error about 1,200 that nobody asked for
    (that error once stopped a study's timed steps after its long precondition). An explicit ``n`` the
    world cannot fill stays an error (:func:`generate`)."""
    size = DEFAULT_SIZE[split]
    if split != "train" or train_hop_fractions is None:
        return (
            size  # no mix: the size the generator always made (world 0 fits 500 per hop; the tests check it)
        )
    return most_questions(available_questions(seed, split), hop_fractions(train_hop_fractions), size)


def generate(
    n: int, seed: int = 0, *, split: str = "train", train_hop_fractions: Mapping[Any, float] | None = None
) -> list[Example]:
    """``n`` questions about the world of ``seed``, no repeats. Hop counts (1, 2, 3) as equal as possible, or, on
    the ``train`` split only, in the shares ``train_hop_fractions`` asks for (:func:`hop_fractions`,
    :func:`hop_counts`): an easier training mix for a small start. ``test`` and ``novel`` keep equal thirds
    whatever it says (it is still checked), so a held-out set drawn with a run's task options never changes
    with its training mix.

    ``info`` holds ``hops``, the ``chain`` of ``[subject, relation, object]`` triples (the answer is the last
    object), and ``supporting_titles`` (the passage titles, one per hop). Same inputs, same output.
    """
    if split not in SPLITS:
        raise ValueError(f"{TASK}: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"{TASK}: n must be >= 0, got {n}")
    fractions = hop_fractions(train_hop_fractions)
    world = build_world(seed)
    rng = stable_rng(TASK, "questions", split, seed)
    per_hop = hop_counts(n, fractions if split == "train" else EQUAL_THIRDS)
    picked: list[tuple[int, list[tuple[str, str, str]]]] = []
    for hops, count in per_hop.items():
        chains = list(_chains(world, split, hops))
        if count > len(chains):
            most = most_questions(available_questions(seed, split), fractions, n)
            raise ValueError(
                f"{TASK}: the {split} region of world {seed} has {len(chains)} {hops}-hop questions, asked for "
                f"{count} of {n}; this hop mix fills at most {most} questions (task.limit)"
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

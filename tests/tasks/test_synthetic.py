"""The synthetic tasks: determinism, tiers, hops, train/test separation and the kb world's consistency."""

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter

import bm25s
import pytest

from agentcredit.tasks import arith, kb, load_task, task_corpus

# ---------------------------------------------------------------------------------------------------
# Determinism across processes (no salted hash() anywhere)

_FINGERPRINT = (
    "import hashlib, json; from agentcredit.tasks import load_task, kb_corpus; "
    "rows = [e.to_dict() for e in load_task('arith-tools', 'train', 300, seed=5)]"
    " + [e.to_dict() for e in load_task('kb-multihop', 'test', 60, seed=2)] + kb_corpus(2); "
    "print(hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest())"
)


def _fingerprint_here() -> str:
    from agentcredit.tasks import kb_corpus

    rows = [e.to_dict() for e in load_task("arith-tools", "train", 300, seed=5)]
    rows += [e.to_dict() for e in load_task("kb-multihop", "test", 60, seed=2)] + kb_corpus(2)
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_generation_is_identical_across_processes():
    here = _fingerprint_here()
    for hash_seed in ("1", "987"):
        out = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT],
            env={"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == here


def test_same_seed_same_examples_other_seed_differs():
    assert arith.generate(50, 1) == arith.generate(50, 1)
    assert arith.generate(50, 1) != arith.generate(50, 2)
    assert kb.generate(30, 1) == kb.generate(30, 1)
    assert kb.kb_corpus(1) != kb.kb_corpus(2)


# ---------------------------------------------------------------------------------------------------
# arith-tools


def test_arith_tiers_answers_and_phrasing():
    examples = arith.generate(400, seed=0, easy_fraction=0.25)
    tiers = Counter(ex.info["tier"] for ex in examples)
    assert tiers == {"easy": 100, "hard": 300}
    for ex in examples:
        # The gold is the exact integer value of the canonical expression.
        assert ex.answers == [str(eval(ex.info["expression"], {"__builtins__": {}}))]
        assert int(ex.answers[0]) >= 0
        if ex.info["tier"] == "easy":
            assert int(ex.answers[0]) <= 100
        else:
            assert int(ex.answers[0]) >= 100
    assert len({ex.info["expression"] for ex in examples}) == 400  # no repeats within a call
    templates = Counter(ex.info["template"].split("-")[0] for ex in examples)
    assert templates["word"] > 60 and templates["plain"] > 200  # about 30% word problems
    assert len({ex.info["template"] for ex in examples}) >= 10
    # The carl-segment paper's hard case: three-digit x two-digit products are in the hard tier.
    kinds = Counter(ex.info["kind"] for ex in examples if ex.info["tier"] == "hard")
    assert set(kinds) == {"mul", "mul_add", "sum_mul", "mul_sub", "div"}
    mul = next(ex for ex in examples if ex.info["tier"] == "hard" and ex.info["kind"] == "mul")
    a, b = mul.info["operands"]
    assert 100 <= a <= 999 and 11 <= b <= 99


def test_arith_train_and_test_never_share_an_expression():
    train = {ex.info["expression"] for seed in range(3) for ex in arith.generate(600, seed, split="train")}
    test = {ex.info["expression"] for seed in range(3) for ex in arith.generate(200, seed, split="test")}
    assert not train & test
    assert all(arith.split_of(e) == "test" for e in test)


def test_arith_easy_pool_is_bounded_with_a_clear_error():
    with pytest.raises(ValueError, match="could only find .* distinct easy test questions, asked for 1000"):
        arith.generate(1000, 0, split="test", easy_fraction=1.0)
    with pytest.raises(ValueError, match="split must be one of"):
        arith.generate(5, 0, split="dev")
    with pytest.raises(ValueError, match="easy_fraction must be in"):
        arith.generate(5, 0, easy_fraction=1.5)


def test_arith_through_registry():
    examples = load_task("arith-tools", "test", limit=10, seed=3, easy_fraction=0.5)
    assert len(examples) == 10 and all(ex.task == "arith-tools" and ex.metric == "numeric" for ex in examples)
    assert len(load_task("arith-tools", "test")) == 200
    assert task_corpus("arith-tools") is None


# ---------------------------------------------------------------------------------------------------
# kb-multihop: the world


@pytest.fixture(scope="module")
def world():
    return kb.build_world(0)


@pytest.fixture(scope="module")
def passages():
    return {p["title"]: p for p in kb.kb_corpus(0)}


_GENERIC = {"dynamics", "labs", "works", "systems", "holdings", "foundry", "industries", "analytics"}
_GENERIC |= {"university", "institute", "of", "technology", "college"}
_GENERIC |= {"the", "collective", "quartet", "ensemble", "choir", "records", "recordings", "sound"}


def test_names_are_unique_down_to_each_word(world):
    owner: dict[str, str] = {}
    for entity in world.entities.values():
        for word in entity.name.lower().split():
            if word in _GENERIC:
                continue
            assert owner.setdefault(word, entity.name) == entity.name, word
    assert len(world.entities) == sum(sum(sizes.values()) for sizes in kb.REGION_SIZES.values())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_names_never_use_a_template_word(seed):
    # Otherwise a city called "Home" would match every "is home to" and BM25 could not find it by name.
    world = kb.build_world(seed)
    name_words = {w.lower() for e in world.entities.values() for w in e.name.split()} - _GENERIC
    name_words |= {
        e.traits["river"].split()[0].lower() for e in world.entities.values() if "river" in e.traits
    }
    assert not name_words & kb.RESERVED_WORDS
    prose = set()
    for passage in kb.kb_corpus(seed):
        prose |= set(re.findall(r"[a-z]+", passage["text"].lower()))
    for ex in kb.generate(300, seed):
        prose |= set(re.findall(r"[a-z]+", ex.question.lower()))
    # ... and the reserved list really covers every word the templates write.
    assert prose - name_words - _GENERIC <= kb.RESERVED_WORDS


def test_relations_are_functional_and_stay_in_region(world):
    founders = Counter()
    ceos = Counter()
    for entity in world.entities.values():
        for relation, target in entity.facts.items():
            spec = kb.RELATIONS[relation]
            assert spec.source == entity.kind and world.entities[target].kind == spec.target
            assert world.entities[target].region == entity.region
        founders.update([entity.facts["founded_by"]] if entity.kind == "company" else [])
        ceos.update([entity.facts["ceo"]] if entity.kind == "company" else [])
    assert max(founders.values()) == 1 and max(ceos.values()) == 1  # inverse relations are functional too
    for country in (e for e in world.entities.values() if e.kind == "country"):
        assert world.entities[country.facts["capital"]].facts["located_in_country"] == country.name


# One reading rule per relation: the pattern must match exactly once in the subject's passage.
_READERS = {
    "born_in": r"who was born in ([^.]+)\.",
    "studied_at": r"{s} studied at ([^.]+)\.",
    "founded": r"{s} founded ([^.]+)\.",
    "ceo_of": r"{s} is the chief executive officer \(CEO\) of ([^.]+)\.",
    "founded_by": r"{s} was founded by (.+?) in \d{{4}}\.",
    "ceo": r"The chief executive officer \(CEO\) of {s} is ([^.]+)\.",
    "headquartered_in": r"company headquartered in ([^.]+)\.",
    "located_in": r"{s} is a university located in the city of ([^.]+)\.",
    "located_in_country": r"{s} is a city in the country of ([^.]+)\.",
    "capital": r"{s} is a country whose capital is ([^.]+)\.",
    "grew_up_in": r"{s}, an? \w+ player, grew up in ([^.]+)\.",
    "plays_with": r"These days {s} performs with ([^.]+)\.",
    "lead_vocalist": r"The lead vocalist of {s} is ([^.]+)\.",
    "records_for": r"{s} is an? \w+ group that records for ([^.]+)\.",
    "studios_in": r"{s} is a record label that keeps its studios in ([^.]+)\.",
    "in_province": r"{s} sits in the province of ([^.]+)\.",
    "seat": r"{s} is governed from its seat of government, ([^.]+)\.",
}


def _read(passage_text: str, subject: str, relation: str) -> str:
    pattern = _READERS[relation].format(s=re.escape(subject))
    found = re.findall(pattern, passage_text)
    assert len(found) == 1, (subject, relation, found)
    return found[0]


def test_every_answer_is_derivable_by_chaining_passages(passages):
    # Every 1-hop question of the three regions (648 + 260 + 173) and as many 2- and 3-hop ones.
    questions = kb.generate(3 * 648, 0, split="train") + kb.generate(3 * 260, 0, split="test")
    questions += kb.generate(3 * 173, 0, split="novel")
    assert Counter(ex.info["hops"] for ex in questions) == {1: 1081, 2: 1081, 3: 1081}
    for ex in questions:
        subject = ex.info["chain"][0][0]
        assert subject in ex.question
        for step_subject, relation, _ in ex.info["chain"]:
            assert step_subject == subject
            subject = _read(passages[subject]["text"], subject, relation)  # read, don't look up
        assert ex.answers == [subject]
        assert subject not in ex.question
        assert ex.info["supporting_titles"] == [step[0] for step in ex.info["chain"]]


def test_questions_stay_in_their_region(world):
    for split in kb.SPLITS:
        for ex in kb.generate(300, 0, split=split):
            assert {world.entities[s].region for s, _, o in ex.info["chain"]} == {split}


def test_hop_distribution_and_no_repeats():
    examples = kb.generate(100, 0)
    assert Counter(ex.info["hops"] for ex in examples) == {1: 34, 2: 33, 3: 33}
    assert len({ex.question for ex in examples}) == 100
    assert kb.available_questions(0, "test") == {1: 260, 2: 341, 3: 300}
    assert kb.available_questions(0, "novel") == {1: 173, 2: 199, 3: 175}
    with pytest.raises(ValueError, match="has 260 1-hop questions, asked for 400"):
        kb.generate(1200, 0, split="test")


# sha256 of the seed-0 train and test passages and of 300 test + 300 train questions, measured before the novel
# region existed: adding it must not change a single question or passage the earlier splits had.
_TRAIN_TEST_PASSAGES = "ff9930b239a2611bbfb5cfdf7bd6da98afd1e68f80213a5b1f35f5a9866a6104"
_TRAIN_TEST_QUESTIONS = "7db35f38a0649f870c06e303644c0eace6d291b1359702c0d25b58698e7334d4"


def test_the_novel_region_left_train_and_test_as_they_were(world):
    corpus = kb.kb_corpus(0)
    earlier = [p for p in corpus if world.entities[p["title"]].region != "novel"]
    assert corpus[: len(earlier)] == earlier  # novel passages come last
    assert hashlib.sha256(json.dumps(earlier).encode()).hexdigest() == _TRAIN_TEST_PASSAGES
    questions = kb.generate(300, 0, split="test") + kb.generate(300, 0)
    digest = hashlib.sha256(json.dumps([e.to_dict() for e in questions]).encode()).hexdigest()
    assert digest == _TRAIN_TEST_QUESTIONS


def test_the_novel_region_shares_no_kind_relation_or_question_wording_with_training(world):
    def kinds_and_relations(region):
        entities = [e for e in world.entities.values() if e.region == region]
        return {e.kind for e in entities}, {r for e in entities for r in e.facts}

    novel_kinds, novel_relations = kinds_and_relations("novel")
    train_kinds, train_relations = kinds_and_relations("train")
    assert novel_kinds == {"musician", "band", "label", "town", "province"}
    assert not novel_kinds & train_kinds and not novel_relations & train_relations
    assert novel_relations == {r.name for r in kb.RELATIONS.values() if r.source in novel_kinds}

    def opening(question):  # a question's template shows in its first two words ("Which company", "Name the")
        return " ".join(question.split()[:2])

    train_openings = {opening(e.question) for e in kb.generate(300, 0)}
    novel = kb.generate(90, 0, split="novel")
    assert Counter(e.info["hops"] for e in novel) == {1: 30, 2: 30, 3: 30}
    assert not {opening(e.question) for e in novel} & train_openings


def test_novel_region_inverse_relations_are_functional(world):
    bands = [e for e in world.entities.values() if e.kind == "band"]
    for band in bands:
        members = [e for e in world.entities.values() if e.facts.get("plays_with") == band.name]
        assert 2 <= len(members) <= 3 and band.facts["lead_vocalist"] in {m.name for m in members}
    for province in (e for e in world.entities.values() if e.kind == "province"):
        assert world.entities[province.facts["seat"]].facts["in_province"] == province.name


def test_multi_hop_question_text():
    chain = [
        ("Ada Vor", "founded", "Zel Labs"),
        ("Zel Labs", "headquartered_in", "Brom"),
        ("Brom", "located_in_country", "Tavia"),
    ]
    assert kb.question_text(chain[:1]) == "Which company did Ada Vor found?"
    assert (
        kb.question_text(chain)
        == "In which country is the city where the company Ada Vor founded is headquartered?"
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_hop_is_retrievable_by_bm25_with_the_entity_name(seed):
    passages = kb.kb_corpus(seed)
    titles = [p["title"] for p in passages]
    # Index the text only (stricter than the search tool, which also indexes the title); Pyserini's k1, b.
    retriever = bm25s.BM25(k1=0.9, b=0.4)
    retriever.index(
        bm25s.tokenize([p["text"] for p in passages], stopwords="en", show_progress=False),
        show_progress=False,
    )
    queries = bm25s.tokenize(titles, stopwords="en", show_progress=False)
    results, _ = retriever.retrieve(queries, k=3, show_progress=False)
    # Every entity is some question's hop subject, so every title must come back in the top 3 for its name.
    misses = [
        title for i, (title, row) in enumerate(zip(titles, results, strict=True)) if i not in row.tolist()
    ]
    assert misses == []


def test_kb_corpus_file_is_cached_by_content(temp_home):
    path = task_corpus("kb-multihop", seed=4)
    assert path.parent == temp_home / "kb-multihop" and path.name.startswith("seed4-")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == kb.kb_corpus(4)
    assert all(set(r) == {"id", "title", "text"} for r in rows)
    mtime = path.stat().st_mtime_ns
    assert kb.write_kb_corpus(4) == path and path.stat().st_mtime_ns == mtime  # not rewritten
    assert task_corpus("kb-multihop", "test", seed=4) == path  # one corpus for both splits
    explicit = kb.write_kb_corpus(4, temp_home / "mine.jsonl")
    assert explicit.read_text(encoding="utf-8") == path.read_text(encoding="utf-8")

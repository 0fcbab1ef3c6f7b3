"""The PORTool tool suite: schemas, each tool's happy path with hand-checked values, the paper's error texts,
unknown tools, concurrent calls and determinism."""

from __future__ import annotations

import json
import math
import threading
from datetime import datetime
from zoneinfo import ZoneInfo

import jsonschema
import pytest

from agentcredit.tools.base import ToolCall
from agentcredit.tools.search import BM25Search, passage_from_row
from agentcredit.tools.suite import (
    TOOL_NAMES,
    SuiteContext,
    build_suite,
    suite_runtime,
    suite_schemas,
    validate_arguments,
)
from agentcredit.tools.suite.data import haversine_km, load_json
from agentcredit.tools.suite.simulated import _diurnal, _is_open

LA = ZoneInfo("America/Los_Angeles")
PAPER_TOOLS = [
    "news_search", "weather_search", "flights_search", "stocks_search", "sports_search", "maps_search",
    "conversion_calculation", "math_calculation", "get_current_context", "timestamp_comparator", "sort_list",
    "holiday_search", "knowledge_search", "filter_list", "timestamp_converter", "timestamp_interval_calculator",
    "response_gen",
]  # fmt: skip
SIMULATED = [
    "news_search",
    "weather_search",
    "flights_search",
    "stocks_search",
    "sports_search",
    "maps_search",
]


@pytest.fixture(scope="module")
def tools():
    return build_suite()


def call(tools, name: str, **args):
    out = tools[name](args)
    return out if out.startswith(("ERROR", "[", "No ")) or name == "response_gen" else json.loads(out)


def at(*args: int) -> SuiteContext:
    return SuiteContext(now=datetime(*args, tzinfo=LA))


# ----------------------------------------------------------------------------------------- schemas


def test_the_17_tools_of_the_paper() -> None:
    assert TOOL_NAMES == PAPER_TOOLS
    schemas = suite_schemas()
    assert [s["function"]["name"] for s in schemas] == PAPER_TOOLS
    for s in schemas:
        assert s["type"] == "function" and s["function"]["description"]
        jsonschema.Draft202012Validator.check_schema(s["function"]["parameters"])
    json.dumps(schemas)  # renderable as the system prompt's {tool_json}


def test_appendix_d_required_fields() -> None:
    required = {s["function"]["name"]: s["function"]["parameters"]["required"] for s in suite_schemas()}
    assert required["get_current_context"] == ["requested_context"]
    assert required["maps_search"] == ["query"]
    assert required["knowledge_search"] == ["query"]
    assert required["math_calculation"] == ["expression"]
    assert required["conversion_calculation"] == ["query"]
    assert required["timestamp_interval_calculator"] == ["from_timestamp", "interval", "operation"]
    assert required["response_gen"] == ["response"]


def test_simulated_tools_say_so() -> None:
    descriptions = {s["function"]["name"]: s["function"]["description"] for s in suite_schemas()}
    for name in SIMULATED:
        assert "Simulated" in descriptions[name], name
    assert "simulated" in descriptions["conversion_calculation"]


def test_suite_schemas_returns_copies() -> None:
    first = suite_schemas()
    first[0]["function"]["parameters"]["required"].append("junk")
    assert "junk" not in suite_schemas()[0]["function"]["parameters"]["required"]


# ----------------------------------------------------------------------------------------- schema errors


@pytest.mark.parametrize(
    ("name", "args", "expected"),
    [
        ("math_calculation", {}, "ERROR: invalid arguments for math_calculation: 'expression' is a required property"),
        ("math_calculation", {"expression": 5},
         "ERROR: invalid arguments for math_calculation: expression must be of type string, got a number"),
        ("get_current_context", {"requested_context": "current_time"},
         "ERROR: invalid arguments for get_current_context: requested_context must be of type array, got a string"),
        ("get_current_context", {"requested_context": ["weather"]},
         'ERROR: invalid arguments for get_current_context: requested_context[0] must be one of "current_location", '
         '"current_time", got "weather"'),
        ("get_current_context", {"requested_context": []},
         "ERROR: invalid arguments for get_current_context: requested_context: [] should be non-empty"),
        ("timestamp_comparator", {"timestamp1": "2025-01-01", "timestamp2": "2025-01-02", "comparison_operator": "<"},
         "ERROR: invalid arguments for timestamp_comparator: 'timezone1' is a required property"),
        ("sort_list", {"list": [1], "property": "x"},
         "ERROR: invalid arguments for sort_list: list[0] must be of type object, got a number"),
        ("response_gen", "a string", "ERROR: the arguments of response_gen must be a JSON object (a dictionary), got a string"),
        ("news_search", None, "ERROR: the arguments of news_search must be a JSON object (a dictionary), got null"),
    ],
)  # fmt: skip
def test_schema_violations_return_error_text(tools, name: str, args, expected: str) -> None:
    assert tools[name](args) == expected
    assert validate_arguments(name, args) == expected


def test_extra_arguments_are_ignored_like_a_go_backend(tools) -> None:
    assert tools["math_calculation"]({"expression": "add(1, 2)", "precision": 3}) == '{"result": 3}'


def test_unknown_tool_through_the_runtime() -> None:
    runtime = suite_runtime()
    try:
        [result] = runtime.run([ToolCall("web_browser", {"url": "x"})])
        assert not result.ok and result.output.startswith("ERROR: unknown tool 'web_browser'; available: ")
        assert validate_arguments("web_browser", {}).startswith("ERROR: unknown tool 'web_browser'")
    finally:
        runtime.close()


# ----------------------------------------------------------------------------------------- knowledge_search


def test_knowledge_search_default_corpus_and_entity_labels(tools) -> None:
    out = tools["knowledge_search"](
        {"query": "Steelers performance last 3 seasons", "entity_labels": ["Steelers"]}
    )
    assert out.startswith(
        "[1] Title: Pittsburgh Steelers\nThe Pittsburgh Steelers are a professional American football team"
    )
    out = tools["knowledge_search"]({"query": "Super Bowl LIX score New Orleans"})
    assert out.startswith("[1] Title: Super Bowl LIX\n") and "40-22" in out
    assert tools["knowledge_search"]({"query": "xylophone quasar"}) == (
        "No relevant passages found for the query 'xylophone quasar'."
    )
    assert tools["knowledge_search"]({"query": " "}).startswith("ERROR:")


def test_knowledge_search_uses_the_given_retriever(tmp_path) -> None:
    rows = [("a", "Kiss and Tell", "Shirley Temple plays Corliss Archer."), ("b", "Paris", "Capital of France."),
            ("c", "Shirley Temple", "An actress."), ("d", "Lyon", "A French city.")]  # fmt: skip
    retriever = BM25Search([passage_from_row({"id": i, "title": t, "text": x}, where="t", default_id=i) for i, t, x in rows],
                           cache_dir=tmp_path)  # fmt: skip
    tool = build_suite(retriever, knowledge_k=2)["knowledge_search"]
    assert (
        tool({"query": "Corliss Archer"}) == "[1] Title: Kiss and Tell\nShirley Temple plays Corliss Archer."
    )
    out = tool({"query": "Shirley Temple", "entity_labels": ["Paris", "Lyon", "Nowhere"]})
    # Labelled pages first (both kept even beyond k), no room left for query hits.
    assert out == "[1] Title: Paris\nCapital of France.\n[2] Title: Lyon\nA French city."
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "z", "title": "Zed", "text": "zebra facts"}) + "\n")
    assert build_suite(str(corpus))["knowledge_search"]({"query": "zebra"}) == "[1] Title: Zed\nzebra facts"


# ----------------------------------------------------------------------------------------- weather


def test_weather_hourly_values_follow_the_fixture(tools) -> None:
    day = next(
        r
        for r in load_json("weather.json")["daily"]
        if r["location"] == "Cupertino" and r["date"] == "2025-09-27"
    )
    out = call(tools, "weather_search", start_datetime="2025-09-27T15:00:00")
    assert out["unit"] == "fahrenheit" and out["precision"] == "hour"
    [entry] = out["forecast"]
    assert entry["time"] == "2025-09-27T15:00:00-07:00" and entry["condition"] == day["condition"]
    assert entry["temperature"] == round(day["high_c"] * 9 / 5 + 32)  # the diurnal maximum is at 15:00
    out = call(
        tools, "weather_search", location="Cupertino", start_datetime="2025-09-27T06:00:00", unit="celsius"
    )
    assert out["forecast"][0]["temperature"] == day["low_c"]  # the minimum is at 06:00
    # 10:30 is half-way between the 06:00 minimum and the 15:00 maximum: (1 - cos(pi/2)) / 2 = 0.5.
    assert _diurnal(10.5, 10.0, 20.0) == pytest.approx(15.0)
    assert _diurnal(3.0, 10.0, 20.0) == pytest.approx(10 + 10 * (1 + math.cos(math.pi * 12 / 15)) / 2)


def test_weather_daily_and_paper_errors() -> None:
    tools = build_suite(context=at(2025, 9, 27, 17, 10, 23))  # the paper's Fig. 1 clock (5:10 PM)
    assert tools["weather_search"]({"start_datetime": "2025-09-27T07:00:00"}) == (
        "ERROR: weather_search tool cannot retrieve the past weather."
    )
    out = tools["weather_search"](
        {"location": "New Zealand", "start_datetime": "December 1", "end_datetime": "Deccember 31"}
    )
    assert out.startswith("ERROR: Both start_datetime and end_datetime format is incorrect. Expected ")
    assert tools["weather_search"]({"start_datetime": "soon"}).startswith(
        "ERROR: start_datetime format is incorrect"
    )
    out = json.loads(
        tools["weather_search"](
            {"location": "Tokyo", "start_datetime": "2025-09-28", "end_datetime": "2025-09-30"}
        )
    )
    assert out["location"] == "Tokyo, Japan" and out["unit"] == "celsius" and out["precision"] == "day"
    assert [d["date"] for d in out["forecast"]] == ["2025-09-28", "2025-09-29", "2025-09-30"]
    out = json.loads(
        tools["weather_search"](
            {"location": "Auckland", "start_datetime": "2025-12-01", "end_datetime": "2025-12-31"}
        )
    )
    assert out["result"] == "No data is available" and "14 days from 2025-09-27" in out["detail"]
    assert tools["weather_search"](
        {"start_datetime": "2025-09-30T00:00:00", "end_datetime": "2025-09-29T00:00:00"}
    ).startswith("ERROR: end_datetime must not be earlier")
    assert tools["weather_search"]({"start_datetime": "2025-09-27T18:00:00", "end_datetime": "2025-10-02T18:00:00",
                                    "precision": "hour"}).startswith("ERROR: at most 72 hourly entries")  # fmt: skip


# ----------------------------------------------------------------------------------------- stocks, news, sports


def test_stocks_latest_close_and_change(tools) -> None:
    prices = [r for r in load_json("stocks.json")["prices"] if r["symbol"] == "AAPL"]
    out = call(tools, "stocks_search", query="Apple stock price")
    [result] = out["results"]
    assert result["symbol"] == "AAPL" and result["market_status"] == "closed"  # the clock is a Saturday
    [latest] = result["prices"]
    assert latest["date"] == "2025-09-26" and latest["close"] == prices[-1]["close"] == 255.5
    assert latest["change"] == round(prices[-1]["close"] - prices[-2]["close"], 2)
    history = call(tools, "stocks_search", query="MSFT", start_date="2025-09-22", end_date="2025-09-26")
    assert [p["date"] for p in history["results"][0]["prices"]] == [f"2025-09-{d}" for d in range(22, 27)]
    weekend = call(tools, "stocks_search", query="Nvidia", date="2025-09-21")  # a Sunday: the Friday before
    assert weekend["results"][0]["prices"][0]["date"] == "2025-09-19"
    assert (
        call(tools, "stocks_search", query="Apple", date="2025-10-01")
        == "ERROR: stocks_search cannot retrieve future prices"
    )
    assert call(tools, "stocks_search", query="Acme Corp") == {"result": "No data is available"}
    assert call(tools, "stocks_search", query="x", date="last week").startswith(
        "ERROR: date format is incorrect"
    )


def test_market_open_depends_on_the_clock() -> None:
    tools = build_suite(context=at(2025, 9, 26, 7, 0, 0))  # 10:00 in New York on a Friday
    assert json.loads(tools["stocks_search"]({"query": "AAPL"}))["results"][0]["market_status"] == "open"


def test_news_search_and_clock_filter(tools) -> None:
    out = call(tools, "news_search", query="Cupertino library hours", limit=2)
    assert len(out["articles"]) == 2
    assert out["articles"][0]["title"] == "Cupertino library extends weekend hours for fall term"
    assert "(simulated)" in out["articles"][0]["source"]
    early = build_suite(context=at(2025, 9, 20, 12, 0, 0))
    dates = [
        a["published"] for a in json.loads(early["news_search"]({"query": "Cupertino library"}))["articles"]
    ]
    assert dates and max(dates) <= "2025-09-20"  # nothing from the clock's future
    assert call(tools, "news_search", query="quantum zeppelin") == {"result": "No data is available"}
    ranged = call(tools, "news_search", query="stocks market", start_date="2025-09-26", end_date="2025-09-26")
    assert {a["published"] for a in ranged["articles"]} == {"2025-09-26"}


def test_sports_standings_like_the_paper_example(tools) -> None:
    out = call(tools, "sports_search", query="Steelers standings last 3 seasons",
               use_case={"standings": {"requested_info": "PERFORMANCE"}})  # fmt: skip
    [team] = out["standings"]
    assert team["team"] == "Pittsburgh Steelers"
    assert [(s["season"], s["wins"], s["losses"]) for s in team["seasons"]] == [
        ("2022", 9, 8),
        ("2023", 10, 7),
        ("2024", 10, 7),
    ]
    assert team["seasons"][0]["win_percentage"] == round(9 / 17, 3)
    out = call(tools, "sports_search", query="Ravens or Eagles last season")
    assert [(t["team"], t["seasons"][0]["wins"]) for t in out["standings"]] == [
        ("Baltimore Ravens", 12),
        ("Philadelphia Eagles", 14),
    ]
    assert (
        call(tools, "sports_search", query="who won the Super Bowl")["champions"]["NFL"]["2024"]
        == "Philadelphia Eagles"
    )
    assert call(tools, "sports_search", query="49ers next game")["games"][0]["away"] == "Los Angeles Rams"
    assert call(tools, "sports_search", query="curling scores") == {
        "result": "No data is available"
    }  # verbatim
    assert call(tools, "sports_search", query="Steelers", use_case={"tickets": {}}).startswith(
        "ERROR: unsupported use_case"
    )


# ----------------------------------------------------------------------------------------- flights, holidays


def test_flight_times_and_status_follow_the_clock() -> None:
    def status(*clock: int) -> dict:
        out = json.loads(build_suite(context=at(*clock))["flights_search"]({"flight_number": "UA 1234",
                                                                              "start_datetime": "2025-09-27"}))  # fmt: skip
        [flight] = out["flights"]
        return flight

    early = status(2025, 9, 27, 2, 47, 20)
    # SFO 07:05 PDT + 330 min = 12:35 PDT = 15:35 EDT.
    assert early["scheduled_departure"] == "2025-09-27T07:05:00-07:00"
    assert early["scheduled_arrival"] == "2025-09-27T15:35:00-04:00"
    fixture = next(f for f in load_json("flights.json")["flights"] if f["flight_number"] == "UA1234"
                   and f["scheduled_departure"].startswith("2025-09-27"))  # fmt: skip
    assert early["status"] == ("delayed" if fixture["delay_minutes"] else "scheduled")
    assert status(2025, 9, 27, 10, 0, 0)["status"] == "departed"
    assert status(2025, 9, 27, 23, 0, 0)["status"] == "landed"


def test_flight_route_search_and_errors(tools) -> None:
    out = call(tools, "flights_search", departure_location="San Jose", arrival_location="Seattle")
    assert out["flights"] and all(f["flight_number"] == "AS1321" for f in out["flights"])
    assert call(tools, "flights_search").startswith("ERROR: flights_search needs at least one of")
    assert call(tools, "flights_search", flight_number="ZZ999") == {"result": "No data is available"}


def test_holidays(tools) -> None:
    out = call(tools, "holiday_search", query="Thanksgiving", year=2025)
    assert out == {"country": "United States",
                   "holidays": [{"date": "2025-11-27", "weekday": "Thursday", "name": "Thanksgiving Day", "types": ["public"]}]}  # fmt: skip
    upcoming = call(tools, "holiday_search")["holidays"]
    assert (
        upcoming[0]["date"] == "2025-10-13" and upcoming[0]["name"] == "Columbus Day"
    )  # first one after 2025-09-27
    uk = call(tools, "holiday_search", country="UK", year=2025, holiday_type="bank")["holidays"]
    assert {
        "date": "2025-12-25",
        "weekday": "Thursday",
        "name": "Christmas Day",
        "types": ["bank", "public"],
    } in uk
    assert call(tools, "holiday_search", country="Atlantis").startswith("ERROR: unknown country 'Atlantis'")
    assert call(tools, "holiday_search", country="JP", date="2025-09-28") == {
        "result": "No data is available"
    }


# ----------------------------------------------------------------------------------------- maps


def test_maps_travel_time_is_computed_from_coordinates(tools) -> None:
    out = call(tools, "maps_search", query="eta from Apple Park Visitor Center to San Francisco International Airport",
               eta_type="departure", eta_time="2025-09-27T09:00:00")  # fmt: skip
    places = {p["name"]: p for p in load_json("places.json")["places"]}
    a, b = places["Apple Park Visitor Center"], places["San Francisco International Airport"]
    km = haversine_km(a["latitude"], a["longitude"], b["latitude"], b["longitude"]) * 1.3
    minutes = round(km / 85.0 * 60)  # >= 40 km: 85 km/h band
    assert out["distance_km"] == round(km, 1) and out["drive_minutes"] == minutes
    assert out["departure_time"] == "2025-09-27T09:00:00-07:00"
    assert out["arrival_time"] == f"2025-09-27T09:{minutes:02d}:00-07:00"


def test_haversine_hand_checked() -> None:
    # One degree of latitude on a 6371 km sphere: 6371 * pi / 180 = 111.195 km.
    assert haversine_km(0, 0, 1, 0) == pytest.approx(6371 * math.pi / 180, rel=1e-9)


def test_maps_find_open_and_ambiguity(tools) -> None:
    found = call(tools, "maps_search", query="find coffee near De Anza College")
    assert found["results"][0]["name"] == "Philz Coffee"
    assert [r["distance_km"] for r in found["results"]] == sorted(r["distance_km"] for r in found["results"])
    out = call(tools, "maps_search", query="is McDonald's open now")
    assert out.startswith(
        'ERROR: "McDonald\'s" is ambiguous (3 places match); first issue "find McDonald\'s"'
    )
    out = call(tools, "maps_search", query="is McDonald's at Homestead open now")
    assert out["address"].startswith("20990 Homestead Rd") and out["open"] is False  # 02:47, opens 06:00
    assert call(tools, "maps_search", query="is Philz Coffee open at 9am")["open"] is True
    assert call(tools, "maps_search", query="is Computer History Museum open on Monday") | {} == {
        "name": "Computer History Museum", "address": "1401 N Shoreline Blvd, Mountain View, CA 94043",
        "day": "Monday", "open": False, "hours": "closed"}  # fmt: skip
    assert (
        call(tools, "maps_search", query="phone number of Philz Coffee")["result"]["phone"]
        == "(408) 555-0112"
    )
    assert call(tools, "maps_search", query="find a planetarium") == {"result": "No data is available"}
    assert call(tools, "maps_search", query="how far from here to Atlantis").startswith(
        "ERROR: cannot resolve the location"
    )


def test_opening_hours_past_midnight() -> None:
    in_n_out = next(
        p for p in load_json("places.json")["places"] if p["name"] == "In-N-Out Burger"
    )  # 10:30-01:00
    assert _is_open(in_n_out, datetime(2025, 9, 28, 0, 30, tzinfo=LA))  # Saturday's hours run into Sunday
    assert not _is_open(in_n_out, datetime(2025, 9, 28, 1, 30, tzinfo=LA))
    assert _is_open(in_n_out, datetime(2025, 9, 27, 23, 0, tzinfo=LA))


# ----------------------------------------------------------------------------------------- lists, response_gen


def test_sort_and_filter_lists(tools) -> None:
    items = [{"city": "A", "temp": 21.5}, {"city": "B", "temp": 18}, {"city": "C", "temp": 30}]
    assert [i["city"] for i in call(tools, "sort_list", list=items, property="temp")["result"]] == [
        "B",
        "A",
        "C",
    ]
    assert [
        i["city"] for i in call(tools, "sort_list", list=items, property="temp", order="descending")["result"]
    ] == ["C", "A", "B"]
    assert (
        call(tools, "sort_list", list=items, property="city")
        == 'ERROR: list[0].city must be a number to sort by it, got "A"'
    )
    assert (
        call(tools, "sort_list", list=[{"x": 1}], property="temp") == "ERROR: list[0] has no property 'temp'"
    )
    assert call(tools, "filter_list", list=items, property="temp", operator=">", value=20)["result"] == [
        items[0],
        items[2],
    ]
    assert call(tools, "filter_list", list=items, property="city", operator="==", value="B")["result"] == [
        items[1]
    ]
    out = call(tools, "filter_list", list=[*items, {"city": "D"}], property="temp", operator="<=", value=21.5)
    assert out == {"result": [items[0], items[1]], "items_without_property": 1}
    assert call(tools, "filter_list", list=items, property="temp", operator="<", value="cold").startswith(
        "ERROR: list[0].temp = 21.5 cannot be compared"
    )


def test_response_gen_passes_the_response_through(tools) -> None:
    args = {
        "response": "You will be 14 in 2030.",
        "items": [{"tool": "math_calculation", "fact": "The answer is 16"}],
    }
    assert tools["response_gen"](args) == "You will be 14 in 2030."


# ----------------------------------------------------------------------------------------- runtime


class BarrierRetriever:
    """A retriever whose calls only return when ``parties`` of them run at the same time."""

    def __init__(self, parties: int):
        self.barrier = threading.Barrier(parties, timeout=10)
        self.passages = []

    def retrieve(self, query, k=3):
        self.barrier.wait()  # raises BrokenBarrierError (-> ERROR text) if the calls were serialised
        return []

    def by_title(self, title):
        return []


def test_parallel_calls_in_one_step_run_concurrently() -> None:
    runtime = suite_runtime(BarrierRetriever(4), max_workers=4)
    try:
        results = runtime.run([ToolCall("knowledge_search", {"query": f"q{i}"}) for i in range(4)])
    finally:
        runtime.close()
    assert [r.output for r in results] == [
        f"No relevant passages found for the query 'q{i}'." for i in range(4)
    ]


MIXED_STEP = [
    ToolCall("get_current_context", {"requested_context": ["current_time"]}),
    ToolCall("math_calculation", {"expression": "add(random(1, 100), 1)"}),
    ToolCall("weather_search", {"location": "Paris", "start_datetime": "2025-09-28"}),
    ToolCall("stocks_search", {"query": "Tesla"}),
    ToolCall("maps_search", {"query": "find coffee near me"}),
    ToolCall("knowledge_search", {"query": "capital of New Zealand"}),
    ToolCall("conversion_calculation", {"query": "3 tbsp to ml"}),
    ToolCall("holiday_search", {"country": "Japan", "year": 2025}),
    ToolCall(
        "timestamp_comparator",
        {
            "timestamp1": "now",
            "timezone1": "UTC",
            "timestamp2": "2025-01-01",
            "timezone2": "UTC",
            "comparison_operator": "<",
        },
    ),  # fmt: skip
    ToolCall("nonexistent_tool", {}),
]


def test_runtime_keeps_order_and_equals_sequential_calls() -> None:
    tools = build_suite()
    runtime = suite_runtime(max_workers=8)
    try:
        results = runtime.run(MIXED_STEP)
    finally:
        runtime.close()
    assert [r.name for r in results] == [c.name for c in MIXED_STEP]
    for call_, result in zip(MIXED_STEP[:-1], results[:-1], strict=True):
        assert result.output == tools[call_.name](call_.arguments)
        assert result.ok == (not result.output.startswith("ERROR:"))
    assert [r.ok for r in results][-2:] == [False, False]


def test_two_suites_answer_identically() -> None:
    first, second = build_suite(), build_suite()
    for c in MIXED_STEP[:-1]:
        assert first[c.name](c.arguments) == second[c.name](c.arguments)


def test_context_requires_an_aware_clock() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        SuiteContext(now=datetime(2025, 1, 1))
    assert SuiteContext(now=datetime(2025, 1, 1, 0, 0, 0, 999, tzinfo=LA)).now.microsecond == 0
    with pytest.raises(ValueError, match="knowledge_k"):
        build_suite(knowledge_k=0)

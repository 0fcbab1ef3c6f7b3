"""Date/time tools and unit conversion: the paper's examples verbatim, hand-checked arithmetic, properties."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.tools.suite import SuiteContext, build_suite
from agentcredit.tools.suite.timestamps import human_delta, parse_duration

LA = ZoneInfo("America/Los_Angeles")


@pytest.fixture(scope="module")
def tools():
    return build_suite()


def call(tools, name: str, **args):
    out = tools[name](args)
    return out if out.startswith("ERROR") else json.loads(out)


# ------------------------------------------------------------------------------ the paper's examples


def test_get_current_context_matches_paper_fig9(tools) -> None:
    out = tools["get_current_context"]({"requested_context": ["current_time"]})
    assert out == (
        '{"current_time": {"date_time": "Saturday 2025-09-27T02:47:20-07:00 Week_number 39 Day_number 270", '
        '"time_zone": "America/Los_Angeles"}}'
    )


def test_injected_clock_matches_paper_fig10() -> None:
    ctx = SuiteContext(now=datetime(2025, 10, 5, 16, 52, 30, tzinfo=LA))
    out = json.loads(build_suite(context=ctx)["get_current_context"]({"requested_context": ["current_time"]}))
    assert (
        out["current_time"]["date_time"] == "Sunday 2025-10-05T16:52:30-07:00 Week_number 40 Day_number 278"
    )


def test_current_location_is_cupertino(tools) -> None:
    out = call(
        tools,
        "get_current_context",
        requested_context=["current_location", "current_time", "current_location"],
    )
    assert list(out) == ["current_location", "current_time"]
    assert (
        out["current_location"]["city"] == "Cupertino"
        and out["current_location"]["time_zone"] == "America/Los_Angeles"
    )


def test_interval_calculator_matches_paper_fig8(tools) -> None:
    out = tools["timestamp_interval_calculator"](
        {
            "from_timestamp": "2023-03-21T00:00:00",
            "interval": "P70D",
            "operation": "add",
            "from_timezone": "",
            "from_location": "",
        }
    )
    assert out == (
        '{"calculatedTime": "Tuesday 2023-05-30T00:00:00-07:00 Week_number 22 Day_number 150", '
        '"timezoneLocal": "America/Los_Angeles"}'
    )


def test_interval_calculator_date_only_error_is_verbatim(tools) -> None:
    out = tools["timestamp_interval_calculator"](
        {"from_timestamp": "2023-03-21", "interval": "P70D", "operation": "add"}
    )
    assert out == (
        "ERROR: invalid timestamp: {2023-03-21}. supported time formats include ISO 8601 date-time with or without "
        "timezone (e.g., 2006-01-02T15:04:05Z07:00, 2006-01-02 15:04:05), 12-hour AM/PM with or without seconds "
        "(e.g., 03:04:05 PM, 03:04PM), and 24-hour formats (e.g., 15:04:05, 15:04)"
    )


def test_comparator_matches_paper_fig9(tools) -> None:
    out = tools["timestamp_comparator"](
        {
            "timestamp1": "2025-09-27T02:47:20-07:00",
            "timezone1": "America/Los_Angeles",
            "timestamp2": "2025-09-28T00:00:00-07:00",
            "timezone2": "America/Los_Angeles",
            "comparison_operator": "<",
        }
    )
    assert out == '{"comparisonResult": true, "timeDifference": "21 hours, 12 minutes, 40 seconds"}'


def test_comparator_now_error_is_verbatim(tools) -> None:
    out = tools["timestamp_comparator"](
        {
            "timestamp1": "now",
            "timezone1": "UTC",
            "timestamp2": "tomorrow",
            "timezone2": "UTC",
            "comparison_operator": ">",
        }
    )
    assert out == (
        "ERROR: invalid format for timestamp1: The value must be in a valid ISO 8601 format. Valid templates include: "
        "YYYY-MM-DD for date, YYYY-MM-DDThh:mm:ss for local time without timezone, YYYY-MM-DDThh:mm:ssZ for UTC time, "
        "and YYYY-MM-DDThh:mm:ss+hh:mm / YYYY-MM-DDThh:mm:ss-hh:mm for times with timezone offsets (ahead or behind UTC "
        "time)."
    )
    bad2 = call(tools, "timestamp_comparator", timestamp1="2025-01-01", timezone1="UTC", timestamp2="soon",
                timezone2="UTC", comparison_operator="<")  # fmt: skip
    assert bad2.startswith("ERROR: invalid format for timestamp2:")


# ------------------------------------------------------------------------------ hand-checked arithmetic


def test_comparator_across_time_zones_and_dates(tools) -> None:
    # 09:00 in New York (EDT, UTC-4) is 06:00 in Los Angeles: LA 07:00 is one hour later.
    out = call(tools, "timestamp_comparator", timestamp1="2025-09-27T09:00:00", timezone1="America/New_York",
               timestamp2="2025-09-27T07:00:00", timezone2="America/Los_Angeles", comparison_operator="<")  # fmt: skip
    assert out == {"comparisonResult": True, "timeDifference": "1 hour, 0 minutes, 0 seconds"}
    out = call(tools, "timestamp_comparator", timestamp1="2025-01-01", timezone1="UTC", timestamp2="2025-01-03T01:01:01Z",
               timezone2="UTC", comparison_operator="==")  # fmt: skip
    assert out == {"comparisonResult": False, "timeDifference": "2 days, 1 hour, 1 minute, 1 second"}
    bad = call(tools, "timestamp_comparator", timestamp1="2025-01-01", timezone1="Mars/Olympus", timestamp2="2025-01-02",
               timezone2="UTC", comparison_operator="<")  # fmt: skip
    assert bad.startswith("ERROR: unknown time zone 'Mars/Olympus' in timezone1")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # Calendar months clamp the day: Jan 31 + 1 month = Feb 29 in a leap year.
        ({"from_timestamp": "2024-01-31 10:00:00", "interval": "P1M", "operation": "add"},
         "Thursday 2024-02-29T10:00:00-08:00 Week_number 9 Day_number 60"),
        # DST ends 2025-11-02 in Los Angeles: P1D keeps the wall clock, PT24H is elapsed time.
        ({"from_timestamp": "2025-11-01T12:00:00", "interval": "P1D", "operation": "add"},
         "Sunday 2025-11-02T12:00:00-08:00 Week_number 44 Day_number 306"),
        ({"from_timestamp": "2025-11-01T12:00:00", "interval": "PT24H", "operation": "add"},
         "Sunday 2025-11-02T11:00:00-08:00 Week_number 44 Day_number 306"),
        # 2025-03-01 - 1Y2M = 2024-01-01; - 25 days = 2023-12-07 00:00; - 5:06:07 elapsed = 12-06 18:53:53.
        ({"from_timestamp": "2025-03-01T00:00:00", "interval": "P1Y2M3W4DT5H6M7S", "operation": "subtract"},
         "Wednesday 2023-12-06T18:53:53-08:00 Week_number 49 Day_number 340"),
        # A time of day means today (2025-09-27) in that zone; 12-hour clock.
        ({"from_timestamp": "03:04PM", "interval": "PT1H30M", "operation": "subtract", "from_location": "Tokyo"},
         "Saturday 2025-09-27T13:34:00+09:00 Week_number 39 Day_number 270"),
        ({"from_timestamp": "2025-09-27T02:47:20-07:00", "interval": "P1D", "operation": "add", "from_timezone": "UTC"},
         "Sunday 2025-09-28T09:47:20Z Week_number 39 Day_number 271"),
    ],
)  # fmt: skip
def test_interval_calculator_hand_checked(tools, args: dict, expected: str) -> None:
    assert call(tools, "timestamp_interval_calculator", **args)["calculatedTime"] == expected


def test_interval_errors(tools) -> None:
    out = call(
        tools,
        "timestamp_interval_calculator",
        from_timestamp="2025-01-01T00:00:00",
        interval="70 days",
        operation="add",
    )
    assert out.startswith("ERROR: invalid interval: {70 days}")
    out = call(
        tools,
        "timestamp_interval_calculator",
        from_timestamp="2025-01-01T00:00:00",
        interval="P1D",
        operation="multiply",
    )
    assert (
        out
        == 'ERROR: invalid arguments for timestamp_interval_calculator: operation must be one of "add", "subtract", got "multiply"'
    )
    out = call(tools, "timestamp_interval_calculator", from_timestamp="2025-01-01T00:00:00", interval="P1D")
    assert (
        out
        == "ERROR: invalid arguments for timestamp_interval_calculator: 'operation' is a required property"
    )
    out = call(
        tools,
        "timestamp_interval_calculator",
        from_timestamp="9999-12-31T00:00:00",
        interval="P1Y",
        operation="add",
    )
    assert out.startswith("ERROR: the calculated time is outside")


def test_converter(tools) -> None:
    out = call(tools, "timestamp_converter", timestamp="2025-09-27T09:00:00", to_timezone="Asia/Tokyo")
    assert out["convertedTime"] == "Sunday 2025-09-28T01:00:00+09:00 Week_number 39 Day_number 271"
    assert out["timezoneOriginal"] == "America/Los_Angeles"
    out = call(
        tools,
        "timestamp_converter",
        timestamp="2025-12-01 09:00:00",
        from_location="New York",
        to_location="London",
    )
    assert out["convertedTime"] == "Monday 2025-12-01T14:00:00+00:00 Week_number 49 Day_number 335"
    out = call(
        tools, "timestamp_converter", timestamp="2025-07-01T12:00:00", from_timezone="PST", to_timezone="IST"
    )
    assert out["convertedTime"].startswith("Wednesday 2025-07-02T00:30:00+05:30")
    assert call(tools, "timestamp_converter", timestamp="2025-07-01T12:00:00").startswith(
        "ERROR: timestamp_converter needs a target"
    )
    assert call(
        tools, "timestamp_converter", timestamp="2025-07-01T12:00:00", to_location="Atlantis"
    ).startswith("ERROR: unknown location 'Atlantis'")


def test_human_delta() -> None:
    assert human_delta(76360) == "21 hours, 12 minutes, 40 seconds"
    assert human_delta(-3661) == "1 hour, 1 minute, 1 second"
    assert human_delta(86400 * 2) == "2 days, 0 hours, 0 minutes, 0 seconds"


@pytest.mark.parametrize("bad", ["P", "PT", "P1", "1D", "P1H", "PT1D", "P-1D", ""])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid interval"):
        parse_duration(bad)


@settings(max_examples=60, deadline=None)
@given(
    st.dates(min_value=datetime(2000, 1, 1).date(), max_value=datetime(2090, 1, 1).date()),
    st.integers(0, 4000),
)
def test_adding_then_subtracting_days_round_trips(day, days: int) -> None:
    t = _TOOLS["timestamp_interval_calculator"]
    start = f"{day.isoformat()}T12:00:00"
    there = json.loads(t({"from_timestamp": start, "interval": f"P{days}D", "operation": "add"}))[
        "calculatedTime"
    ]
    expected_date = day + timedelta(days=days)
    assert there.split(" ")[1].startswith(f"{expected_date.isoformat()}T12:00:00")
    back = json.loads(
        t({"from_timestamp": there.split(" ")[1][:19], "interval": f"P{days}D", "operation": "subtract"})
    )["calculatedTime"]
    assert back.split(" ")[1].startswith(start)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_comparator_is_consistent(a: int, b: int) -> None:
    base = datetime(2025, 1, 1)
    t1, t2 = (base + timedelta(seconds=a)).isoformat(), (base + timedelta(seconds=b)).isoformat()
    results = {
        op: json.loads(
            _TOOLS["timestamp_comparator"](
                {
                    "timestamp1": t1,
                    "timezone1": "UTC",
                    "timestamp2": t2,
                    "timezone2": "UTC",
                    "comparison_operator": op,
                }
            )
        )  # fmt: skip
        for op in ("<", ">", "==")
    }
    assert sum(r["comparisonResult"] for r in results.values()) == 1
    assert results["<"]["comparisonResult"] == (a < b)
    assert results["<"]["timeDifference"] == human_delta(b - a)


_TOOLS = build_suite()


# ------------------------------------------------------------------------------ unit conversion


@pytest.mark.parametrize(
    ("args", "unit", "value"),
    [
        ({"query": "convert 5 miles to km"}, "kilometer", 8.04672),  # 1 mi = 1.609344 km exactly
        ({"query": "100 F to C"}, "degree_Celsius", 37.77777778),  # (100 - 32) * 5/9
        ({"query": "how many cups in 2 liters"}, "cup", 8.453505675),  # 2000 / 236.5882365
        ({"query": "1 acre to sq ft"}, "foot ** 2", 43560),
        ({"query": "60 mph in km/h"}, "kilometer / hour", 96.56064),
        ({"query": "q", "from": [{"unit": "feet", "value": 5}, {"unit": "inches", "value": 10}], "to_units": ["cm"]},
         "centimeter", 177.8),  # 70 in * 2.54
        # 2 US cups = 473.176473 mL; flour 0.53 g/mL -> 250.7835307 g
        ({"query": "q", "from": [{"unit": "cup", "value": 2}], "to_units": ["gram"], "substance": "all-purpose flour"},
         "gram", 250.7835307),
        ({"query": "q", "from": [{"unit": "g", "value": 500}], "to_units": ["ml"], "substance": "water"}, "milliliter", 500),
    ],
)  # fmt: skip
def test_conversions_hand_checked(args: dict, unit: str, value: float) -> None:
    out = json.loads(_TOOLS["conversion_calculation"](args))
    assert out["to"] == {"unit": unit, "value": pytest.approx(value, rel=1e-9)}


def test_currency_uses_dated_simulated_rates() -> None:
    out = json.loads(_TOOLS["conversion_calculation"]({"query": "100 dollars to euros"}))
    assert (
        out["to"] == {"unit": "EUR", "value": 85.6}
        and out["rate_date"] == "2025-09-26"
        and "simulated" in out["note"]
    )
    out = json.loads(
        _TOOLS["conversion_calculation"](
            {"query": "q", "from": [{"unit": "EUR", "value": 100}], "to_units": ["GBP"]}
        )
    )
    assert out["to"]["value"] == pytest.approx(100 / 0.856 * 0.746, abs=1e-4)  # 87.1495


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"query": "2 cups to grams"}, "needs a 'substance'"),
        ({"query": "5 kg to meters"}, "cannot convert kilogram"),
        ({"query": "3 blorps to km"}, "unknown unit 'blorps'"),
        ({"query": "10 dollars to km"}, "currency and a non-currency"),
        (
            {
                "query": "q",
                "from": [{"unit": "cup", "value": 1}],
                "to_units": ["g"],
                "substance": "unobtainium",
            },
            "unknown substance",
        ),
        ({"query": "what is the weather"}, "cannot read a conversion"),
        ({"query": "q", "to_units": ["km", "m"]}, "to_units must contain only one element"),
        ({"query": "q", "from": [{"unit": "km"}], "to_units": ["m"]}, "'value' is a required property"),
        (
            {"query": "q", "from": [{"unit": "km", "value": "5"}], "to_units": ["m"]},
            "from[0].value must be of type number",
        ),
        (
            {
                "query": "q",
                "from": [{"unit": "km", "value": 1}, {"unit": "kg", "value": 1}],
                "to_units": ["m"],
            },
            "mix dimensions",
        ),
    ],
)
def test_conversion_errors(args: dict, message: str) -> None:
    out = _TOOLS["conversion_calculation"](args)
    assert out.startswith("ERROR: ") and message in out

"""The simulated, time-sensitive tools: weather, stocks, news, sports, flights, holidays and maps.

Each answers from a dated fixture table under ``agentcredit/data/tools/`` (see the README there) relative to the
suite's injected clock, so a call is deterministic: the same arguments and clock give the same text. Travel
times are computed (great-circle distance x a road factor / a speed by distance band); hourly temperatures are
interpolated from the daily high/low on a fixed diurnal curve.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from agentcredit.tools.search import BM25Search, read_corpus
from agentcredit.tools.suite.data import (
    SuiteContext,
    data_path,
    find_location,
    haversine_km,
    load_json,
    location_index,
    norm,
)
from agentcredit.tools.suite.timestamps import TimeError, parse_comparator_timestamp

NO_DATA = {"result": "No data is available"}  # verbatim from the paper's sports_search example (§2.5.4)
_ISO_HINT = "Expected ISO 8601 format YYYY-MM-DDThh:mm:ss (e.g., 2025-09-27T19:00:00) or YYYY-MM-DD"


class SimError(ValueError):
    """A bad call; ``str(exc)`` is the full ``ERROR: ...`` text."""


def _parse_when(text: str | None, zone: ZoneInfo) -> datetime | None:
    """ISO date or date-time (offset optional) in ``zone``; None for empty; ValueError when unreadable."""
    if text is None or not str(text).strip():
        return None
    try:
        dt = parse_comparator_timestamp(str(text), "x")
    except TimeError:
        raise ValueError(text) from None
    return dt.replace(tzinfo=zone) if dt.tzinfo is None else dt.astimezone(zone)


def _date_arg(args: dict[str, Any], key: str) -> date | None:
    value = (args.get(key) or "").strip()
    if not value:
        return None
    try:
        return (
            date.fromisoformat(value[:10])
            if re.match(r"^\d{4}-\d{2}-\d{2}", value)
            else _bad_date(key, value)
        )
    except ValueError:
        return _bad_date(key, value)


def _bad_date(key: str, value: str) -> date:
    raise SimError(
        f"ERROR: {key} format is incorrect: {value!r}. Expected ISO 8601 date YYYY-MM-DD (e.g., 2025-09-27)"
    )


# ------------------------------------------------------------------------------------------ weather


@functools.cache
def _weather_table() -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["location"], r["date"]): r for r in load_json("weather.json")["daily"]}


def _diurnal(hour: float, low: float, high: float) -> float:
    """Minimum at 06:00, maximum at 15:00, cosine segments in between."""
    if 6 <= hour <= 15:
        frac = (1 - math.cos(math.pi * (hour - 6) / 9)) / 2
    else:
        h = hour if hour > 15 else hour + 24
        frac = (1 + math.cos(math.pi * (h - 15) / 15)) / 2
    return low + (high - low) * frac


def _temp(celsius: float, unit: str) -> float:
    return round(celsius * 9 / 5 + 32) if unit == "fahrenheit" else round(celsius, 1)


def weather_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    text = (args.get("location") or "").strip()
    row = find_location(text or ctx.location.city)
    if row is None:
        return {"result": f"No data is available for the location {text!r}"}
    zone = ZoneInfo(row["time_zone"])
    start_raw, end_raw = args.get("start_datetime"), args.get("end_datetime")
    bad = []
    try:
        start = _parse_when(start_raw, zone)
    except ValueError:
        bad.append("start_datetime")
    try:
        end = _parse_when(end_raw, zone)
    except ValueError:
        bad.append("end_datetime")
    if len(bad) == 2:
        # The paper's Fig. 2 shows "Both start_datetime and end_datetime format is incorrect. Expected ..." (the
        # rest is cut off in the figure). We keep that wording and add the "ERROR: " prefix every other tool error
        # in the paper carries (§2.3), so the runtime and the formatting reward see a failed call.
        raise SimError(f"ERROR: Both start_datetime and end_datetime format is incorrect. {_ISO_HINT}")
    if bad:
        raise SimError(f"ERROR: {bad[0]} format is incorrect. {_ISO_HINT}")
    now = ctx.now.astimezone(zone).replace(minute=0, second=0)
    precision = args.get("precision")
    date_only_end = bool(end_raw) and len(str(end_raw).strip()) == 10
    if start is None and end is None:
        start = end = now
    elif start is None:
        start = now
    if end is None:
        end = start if precision != "day" else start.replace(hour=23)
    elif date_only_end:
        end = end.replace(hour=23)
    if end < start:
        raise SimError("ERROR: end_datetime must not be earlier than start_datetime")
    if end < now:
        raise SimError("ERROR: weather_search tool cannot retrieve the past weather.")
    start = max(start.replace(minute=0, second=0), now)
    precision = precision or ("hour" if end - start <= timedelta(hours=24) else "day")
    unit = args.get("unit") or ("fahrenheit" if row["country"] == "United States" else "celsius")
    table = _weather_table()
    entries: list[dict[str, Any]] = []
    if precision == "hour":
        hours = int((end - start).total_seconds() // 3600) + 1
        if hours > 72:
            raise SimError("ERROR: at most 72 hourly entries per call; use precision 'day' for longer ranges")
        for i in range(hours):
            t = start + timedelta(hours=i)
            day = table.get((row["name"], t.date().isoformat()))
            if day is None:
                break
            entries.append(
                {
                    "time": t.isoformat(timespec="seconds"),
                    "temperature": _temp(_diurnal(t.hour, day["low_c"], day["high_c"]), unit),
                    "condition": day["condition"],
                    "precipitation_chance": day["precipitation_chance"],
                    "humidity": day["humidity"],
                }
            )
    else:
        d = start.date()
        while d <= end.date():
            day = table.get((row["name"], d.isoformat()))
            if day is None:
                break
            entries.append(
                {
                    "date": d.isoformat(),
                    "high": _temp(day["high_c"], unit),
                    "low": _temp(day["low_c"], unit),
                    "condition": day["condition"],
                    "precipitation_chance": day["precipitation_chance"],
                    "humidity": day["humidity"],
                    "wind_kph": day["wind_kph"],
                }
            )
            d += timedelta(days=1)
    if not entries:
        meta = load_json("weather.json")
        return {
            "result": "No data is available",
            "detail": f"the simulated forecast covers {meta['days']} days from {meta['snapshot_start']}",
        }
    place = ", ".join(x for x in (row["name"], row["region"], row["country"]) if x)
    return {
        "location": place,
        "time_zone": row["time_zone"],
        "unit": unit,
        "precision": precision,
        "forecast": entries,
    }


# ------------------------------------------------------------------------------------------ stocks


def _find_tickers(query: str) -> list[dict[str, Any]]:
    tickers = load_json("stocks.json")["tickers"]
    words = set(re.findall(r"[A-Za-z^]+", query))
    q = f" {norm(query)} "
    found = []
    for t in tickers:
        names = [t["name"], *t["aliases"]]
        if (
            t["symbol"] in words
            or t["symbol"].lstrip("^") in words
            or any(f" {norm(n)} " in q for n in names)
        ):
            found.append(t)
    return found


def stocks_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    data = load_json("stocks.json")
    ny = ctx.now.astimezone(ZoneInfo("America/New_York"))
    today = ny.date()
    start, end = _date_arg(args, "start_date"), _date_arg(args, "end_date")
    single = _date_arg(args, "date")
    for d in (single, start, end):
        if d is not None and d > today:
            raise SimError("ERROR: stocks_search cannot retrieve future prices")
    if start and end and end < start:
        raise SimError("ERROR: end_date must not be earlier than start_date")
    tickers = _find_tickers(args["query"])
    if not tickers:
        return dict(NO_DATA)
    open_now = ny.weekday() < 5 and time(9, 30) <= ny.time() < time(16, 0)
    results = []
    for t in tickers:
        rows = [
            r for r in data["prices"] if r["symbol"] == t["symbol"] and date.fromisoformat(r["date"]) <= today
        ]
        if start or end:
            lo, hi = start or date.min, end or today
            picked = [r for r in rows if lo <= date.fromisoformat(r["date"]) <= hi][-31:]
        else:
            target = single or today
            before = [r for r in rows if date.fromisoformat(r["date"]) <= target]
            picked = before[-1:]
        if not picked:
            continue
        entries = []
        for r in picked:
            i = rows.index(r)
            prev = rows[i - 1]["close"] if i > 0 else r["open"]
            entries.append(
                {
                    "date": r["date"],
                    "open": r["open"],
                    "high": r["high"],
                    "low": r["low"],
                    "close": r["close"],
                    "volume": r["volume"],
                    "change": round(r["close"] - prev, 2),
                    "change_percent": round(100 * (r["close"] - prev) / prev, 2),
                }
            )
        results.append(
            {
                "symbol": t["symbol"],
                "name": t["name"],
                "exchange": t["exchange"],
                "currency": data["currency"],
                "market_status": "open" if open_now else "closed",
                "prices": entries,
            }
        )
    if not results:
        return {
            "result": "No data is available",
            "detail": f"the simulated price history ends on {data['as_of']}",
        }
    return {"results": results}


# ------------------------------------------------------------------------------------------ news


@functools.cache
def _news_index() -> BM25Search:
    with _as_file("news.jsonl") as path:
        return BM25Search(read_corpus(path), use_cache=False)


def _as_file(name: str) -> Any:
    from importlib import resources

    return resources.as_file(data_path(name))


def news_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    index = _news_index()
    start, end = _date_arg(args, "start_date"), _date_arg(args, "end_date")
    today = ctx.local_now().date()
    limit = args.get("limit", 5)
    hits = index.retrieve(args["query"], k=len(index))
    articles = []
    for h in hits:
        published = date.fromisoformat(h.passage.extra["published"])
        if published > today or (start and published < start) or (end and published > end):
            continue  # nothing from the clock's future
        articles.append(
            {
                "title": h.passage.title,
                "source": h.passage.extra["source"],
                "published": h.passage.extra["published"],
                "summary": h.passage.text,
            }
        )
        if len(articles) == limit:
            break
    return {"articles": articles} if articles else dict(NO_DATA)


# ------------------------------------------------------------------------------------------ sports

_LEAGUE_WORDS = {
    "nfl": "NFL",
    "super bowl": "NFL",
    "football": "NFL",
    "nba": "NBA",
    "nba finals": "NBA",
    "basketball": "NBA",
    "mlb": "MLB",
    "world series": "MLB",
    "baseball": "MLB",
}


def _sports_intent(query: str, use_case: dict[str, Any] | None) -> str:
    if use_case:
        key = next(iter(use_case))
        for intent in ("standings", "schedule", "champions"):
            if key.startswith(intent[:5]):
                return intent
        if key in ("results", "scores", "record", "records", "performance"):
            return "standings"
        raise SimError(f"ERROR: unsupported use_case {key!r}; use one of standings, schedule, champions")
    q = norm(query)
    if any(w in q for w in ("schedule", "next game", "upcoming", "when do", "when is", "fixture")):
        return "schedule"
    if any(w in q for w in ("champion", "won the", "winner", "title")):
        return "champions"
    return "standings"


def _seasons_wanted(query: str, available: list[str]) -> list[str]:
    q = norm(query)
    years = [y for y in re.findall(r"\b(20\d\d)\b", q) if y in available]
    if years:
        return years
    m = re.search(r"last (\d+|two|three|four|five) seasons?", q)
    if m:
        n = {"two": 2, "three": 3, "four": 4, "five": 5}.get(m.group(1)) or int(m.group(1))
        return available[-n:]
    if "last season" in q:
        return available[-1:]
    return available


def sports_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    data = load_json("sports.json")
    query = args["query"]
    q = f" {norm(query)} "
    use_case = args.get("use_case")
    intent = _sports_intent(query, use_case)
    teams = [t for t in data["teams"] if any(f" {norm(n)} " in q for n in [t["name"], *t["aliases"]])]
    leagues = sorted({lg for w, lg in _LEAGUE_WORDS.items() if f" {w} " in q} | {t["league"] for t in teams})
    if intent == "champions":
        if not leagues:
            return dict(NO_DATA)
        return {"champions": {lg: data["champions"][lg] for lg in leagues}}
    if intent == "schedule":
        now = ctx.now
        names = {t["name"] for t in teams}
        games = [
            g
            for g in data["schedule"]
            if datetime.fromisoformat(g["start"]) > now
            and (g["home"] in names or g["away"] in names or (not names and g["league"] in leagues))
        ]
        return {"games": games} if games else dict(NO_DATA)
    if not teams:
        return dict(NO_DATA)
    out = []
    for t in teams:
        seasons = sorted(t["seasons"])
        rows = []
        for s in _seasons_wanted(query, seasons):
            r = t["seasons"][s]
            games = r["wins"] + r["losses"] + r["ties"]
            rows.append({"season": s, **r, "win_percentage": round((r["wins"] + 0.5 * r["ties"]) / games, 3)})
        out.append({"team": t["name"], "league": t["league"], "seasons": rows})
    return {"standings": out}


# ------------------------------------------------------------------------------------------ flights


def _airports_for(text: str) -> set[str]:
    data = load_json("flights.json")
    raw = text.strip()
    if raw.upper() in data["airports"]:
        return {raw.upper()}
    key = norm(raw)
    return (
        {code for code, a in data["airports"].items() if norm(a["city"]) in key or key in norm(a["city"])}
        if key
        else set()
    )


def flights_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    data = load_json("flights.json")
    number = re.sub(r"[\s-]", "", (args.get("flight_number") or "")).upper()
    carrier = (args.get("carrier_code") or "").strip().upper()
    dep_text, arr_text = args.get("departure_location") or "", args.get("arrival_location") or ""
    if not (number or carrier or dep_text.strip() or arr_text.strip()):
        raise SimError(
            "ERROR: flights_search needs at least one of flight_number, carrier_code, departure_location, "
            "arrival_location"
        )
    dep_codes = _airports_for(dep_text) if dep_text.strip() else None
    arr_codes = _airports_for(arr_text) if arr_text.strip() else None
    zone = ctx.zone
    try:
        start = _parse_when(args.get("start_datetime"), zone)
        end = _parse_when(args.get("end_datetime"), zone)
    except ValueError:
        raise SimError(f"ERROR: start_datetime or end_datetime format is incorrect. {_ISO_HINT}") from None
    now = ctx.now
    start = start or now - timedelta(hours=12)
    end = end or (
        start + timedelta(hours=48) if args.get("start_datetime") is None else start + timedelta(days=1)
    )
    found = []
    for f in data["flights"]:
        dep = datetime.fromisoformat(f["scheduled_departure"])
        if number and f["flight_number"] != number:
            continue
        if carrier and f["carrier_code"] != carrier:
            continue
        if dep_codes is not None and f["departure_airport"] not in dep_codes:
            continue
        if arr_codes is not None and f["arrival_airport"] not in arr_codes:
            continue
        if not start <= dep <= end:
            continue
        found.append(_flight_view(f, data, now))
    found.sort(key=lambda f: f["scheduled_departure"])
    return {"flights": found[:20]} if found else dict(NO_DATA)


def _flight_view(f: dict[str, Any], data: dict[str, Any], now: datetime) -> dict[str, Any]:
    dep = datetime.fromisoformat(f["scheduled_departure"])
    arr = datetime.fromisoformat(f["scheduled_arrival"])
    delay = timedelta(minutes=f["delay_minutes"])
    if f["cancelled"]:
        status = "cancelled"
    elif now < dep + delay:
        status = "delayed" if f["delay_minutes"] else "scheduled"
    elif now < arr + delay:
        status = "departed"
    else:
        status = "landed"
    airports = data["airports"]
    return {
        "flight_number": f["flight_number"],
        "carrier": data["carriers"][f["carrier_code"]],
        "departure_airport": f"{f['departure_airport']} ({airports[f['departure_airport']]['city']})",
        "arrival_airport": f"{f['arrival_airport']} ({airports[f['arrival_airport']]['city']})",
        "scheduled_departure": f["scheduled_departure"],
        "scheduled_arrival": f["scheduled_arrival"],
        "estimated_departure": (dep + delay).isoformat(),
        "estimated_arrival": (arr + delay).isoformat(),
        "status": status,
        "terminal": f["terminal"],
        "gate": f["gate"],
    }


# ------------------------------------------------------------------------------------------ holidays

_COUNTRY_ALIASES = {"usa": "US", "us": "US", "america": "US", "united states of america": "US", "uk": "GB",
                    "britain": "GB", "great britain": "GB", "england": "GB", "korea": "KR"}  # fmt: skip


def _country_code(text: str) -> str:
    rows = load_json("holidays.json")["holidays"]
    names = {norm(r["country"]): r["country_code"] for r in rows}
    codes = {r["country_code"] for r in rows}
    raw = text.strip()
    if raw.upper() in codes:
        return raw.upper()
    key = norm(raw)
    code = names.get(key) or _COUNTRY_ALIASES.get(key)
    if code is None:
        supported = ", ".join(sorted(f"{n.title()} ({c})" for n, c in names.items()))
        raise SimError(f"ERROR: unknown country {text!r}; supported countries: {supported}")
    return code


def holiday_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    code = _country_code(args.get("country") or ctx.location.country_code)
    rows = [r for r in load_json("holidays.json")["holidays"] if r["country_code"] == code]
    kind = args.get("holiday_type")
    if kind:
        rows = [r for r in rows if kind in r["types"]]
    name = norm(args.get("query") or "")
    if name:
        words = [w for w in name.split() if w not in ("day", "holiday", "holidays", "when", "is", "the")]
        rows = [r for r in rows if all(w in norm(r["name"]) for w in words)] if words else rows
    single, start, end = _date_arg(args, "date"), _date_arg(args, "start_date"), _date_arg(args, "end_date")
    year = args.get("year")
    today = ctx.local_now().date()
    if single:
        rows = [r for r in rows if r["date"] == single.isoformat()]
    elif start or end:
        lo, hi = (start or date.min).isoformat(), (end or date.max).isoformat()
        rows = [r for r in rows if lo <= r["date"] <= hi]
    elif year is not None:
        rows = [r for r in rows if r["date"].startswith(f"{year}-")]
    elif not name:
        rows = [r for r in rows if today.isoformat() <= r["date"]][:10]  # the next holidays from today
    if not rows:
        return dict(NO_DATA)
    out = [
        {
            "date": r["date"],
            "weekday": f"{date.fromisoformat(r['date']):%A}",
            "name": r["name"],
            "types": sorted(r["types"]),
        }
        for r in rows[:50]
    ]
    return {"country": rows[0]["country"], "holidays": out}


# ------------------------------------------------------------------------------------------ maps

_HERE = {
    "me",
    "here",
    "my location",
    "near me",
    "from here",
    "current location",
    "my current location",
    "home",
}
_WEEKDAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_DAY_NAMES = {
    d: i for i, d in enumerate(["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])
}


def _places() -> list[dict[str, Any]]:
    return load_json("places.json")["places"]


def _match_places(text: str) -> list[dict[str, Any]]:
    """Places named (or of the category) in ``text``; "X at <street>" narrows by address."""
    key = norm(text)
    hint = ""
    m = re.match(r"^(?P<name>.+?) (?:at|on) (?P<hint>.+)$", key)
    if m:
        key, hint = m["name"], m["hint"]
    key = re.sub(r"^(the|a|an|nearest|closest|nearby) ", "", key).strip()
    if not key:
        return []
    out = []
    for p in _places():
        name = norm(p["name"])
        cats = [norm(c) for c in p["categories"]]
        singular = key[:-1] if key.endswith("s") else key
        if name == key or key in name or name in key or singular in cats or key in cats:
            out.append(p)
    if hint:
        hint_words = [
            w for w in hint.split() if w not in ("st", "street", "ave", "avenue", "blvd", "rd", "road")
        ]
        out = [p for p in out if all(w in norm(p["address"]) for w in hint_words)]
    return out


def _anchor(text: str | None, ctx: SuiteContext) -> tuple[str, float, float]:
    raw = (text or "").strip()
    if not raw or norm(raw) in _HERE:
        loc = ctx.location
        return (f"{loc.city}, {loc.region} (your location)", loc.latitude, loc.longitude)
    exact_city = location_index().get(norm(raw))
    if exact_city is not None:  # "San Jose" is the city, not San Jose airport
        row = exact_city
        return (
            ", ".join(x for x in (row["name"], row["region"], row["country"]) if x),
            row["latitude"],
            row["longitude"],
        )
    places = _match_places(raw)
    if places:
        p = min(
            places,
            key=lambda p: haversine_km(
                ctx.location.latitude, ctx.location.longitude, p["latitude"], p["longitude"]
            ),
        )
        return (f"{p['name']}, {p['address']}", p["latitude"], p["longitude"])
    row = find_location(raw)
    if row is not None:
        return (
            ", ".join(x for x in (row["name"], row["region"], row["country"]) if x),
            row["latitude"],
            row["longitude"],
        )
    raise SimError(f"ERROR: cannot resolve the location {raw!r}; use a concrete place name or address")


def _road(lat1: float, lon1: float, lat2: float, lon2: float) -> tuple[float, int]:
    """Road distance (km) and driving minutes: 1.3 x great-circle distance, speed by distance band."""
    km = haversine_km(lat1, lon1, lat2, lon2) * 1.3
    speed = 35.0 if km < 10 else 55.0 if km < 40 else 85.0
    return round(km, 1), max(1, round(km / speed * 60))


def _hours_for(p: dict[str, Any], day: int) -> str:
    return p["hours"][_WEEKDAYS[day]]


def _is_open(p: dict[str, Any], at: datetime) -> bool:
    minute = at.hour * 60 + at.minute
    for offset, shift in ((0, 0), (-1, 24 * 60)):  # today's hours, then yesterday's past-midnight tail
        spec = _hours_for(p, (at.weekday() + offset) % 7)
        if spec == "closed":
            continue
        a, b = spec.split("-")
        start = int(a[:2]) * 60 + int(a[3:])
        end = int(b[:2]) * 60 + int(b[3:])
        if end <= start:
            end += 24 * 60
        if start <= minute + shift < end:
            return True
    return False


def _place_view(p: dict[str, Any], anchor: tuple[str, float, float], now: datetime) -> dict[str, Any]:
    km, minutes = _road(anchor[1], anchor[2], p["latitude"], p["longitude"])
    return {
        "name": p["name"],
        "address": p["address"],
        "phone": p["phone"],
        "categories": p["categories"],
        "distance_km": km,
        "distance_miles": round(km / 1.609344, 1),
        "drive_minutes": minutes,
        "open_now": _is_open(p, now),
        "hours_today": _hours_for(p, now.weekday()),
    }


def _one_place(text: str, ctx: SuiteContext) -> dict[str, Any]:
    places = _match_places(text)
    if not places:
        raise SimError(f'ERROR: no place matches {text!r}; first issue "find {text}" to resolve candidates')
    if len({p["address"] for p in places}) > 1:
        raise SimError(
            f'ERROR: {text!r} is ambiguous ({len(places)} places match); first issue "find {text}", then use the '
            f'first candidate\'s address, e.g. "{places[0]["name"]} at {places[0]["address"].split(",")[0]}"'
        )
    return places[0]


def maps_search(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    q = args["query"].strip().rstrip("?. ")
    now = ctx.local_now()
    if m := re.match(
        r"^(?:how far|eta|distance|how long|navigate(?: me)?|directions|travel time)\b\s*(?P<rest>.*)$",
        q,
        re.I,
    ):
        return _travel(m["rest"], args, ctx)
    if m := re.match(r"^is (?P<place>.+?) open\b\s*(?P<when>.*)$", q, re.I):
        return _open_check(m["place"], m["when"].lower(), ctx)
    if m := re.match(
        r"^(?:call|phone number|phone|opening hours|hours|address)\b(?: (?:of|for|at))?\s*(?P<place>.+)$",
        q,
        re.I,
    ):
        p = _one_place(m["place"], ctx)
        anchor = _anchor(args.get("anchor_location"), ctx)
        view = _place_view(p, anchor, now)
        view["hours"] = p["hours"]
        return {"result": view}
    m = re.match(
        r"^(?:find |search for |where is |where are )?(?P<what>.+?)(?: (?:near|around|in|close to) (?P<anchor>.+))?$",
        q,
        re.I,
    )
    assert m is not None  # the pattern matches any non-empty text
    anchor = _anchor(args.get("anchor_location") or m["anchor"], ctx)
    places = _match_places(m["what"])
    if not places:
        return dict(NO_DATA)
    views = sorted(
        (_place_view(p, anchor, now) for p in places), key=lambda v: (v["distance_km"], v["address"])
    )
    return {"anchor": anchor[0], "results": views[:5]}


def _travel(rest: str, args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    rest = re.sub(r"^(?:is it |is |to get |does it take |away is |to drive )+", "", rest, flags=re.I).strip()
    origin_text = args.get("anchor_location") or ""
    if m := re.match(r"^from (?P<a>.+?) to (?P<b>.+)$", rest, re.I):
        origin_text, dest_text = m["a"], m["b"]
    elif m := re.match(r"^(?:to )?(?P<b>.+?) from (?P<a>.+)$", rest, re.I):
        origin_text, dest_text = m["a"], m["b"]
    elif m := re.match(r"^between (?P<a>.+?) and (?P<b>.+)$", rest, re.I):
        origin_text, dest_text = m["a"], m["b"]
    else:
        dest_text = re.sub(r"^to ", "", rest, flags=re.I)
    if not dest_text.strip():
        raise SimError(
            'ERROR: the travel query names no destination; use "how far from [anchor] to [target]"'
        )
    origin = _anchor(origin_text, ctx)
    dest = _anchor(dest_text, ctx)
    km, minutes = _road(origin[1], origin[2], dest[1], dest[2])
    out: dict[str, Any] = {
        "origin": origin[0],
        "destination": dest[0],
        "distance_km": km,
        "distance_miles": round(km / 1.609344, 1),
        "drive_minutes": minutes,
    }
    eta_type, eta_time = args.get("eta_type"), args.get("eta_time")
    if eta_time:
        try:
            when = _parse_when(eta_time, ctx.zone)
        except ValueError:
            raise SimError(f"ERROR: eta_time format is incorrect. {_ISO_HINT}") from None
        assert when is not None
        if eta_type == "arrive":
            out["arrival_time"] = when.isoformat()
            out["departure_time"] = (when - timedelta(minutes=minutes)).isoformat()
        else:
            out["departure_time"] = when.isoformat()
            out["arrival_time"] = (when + timedelta(minutes=minutes)).isoformat()
    return out


def _open_check(place_text: str, when: str, ctx: SuiteContext) -> dict[str, Any]:
    p = _one_place(place_text, ctx)
    now = ctx.local_now()
    when = when.strip()
    result: dict[str, Any] = {"name": p["name"], "address": p["address"]}
    if when in ("", "now", "right now", "today"):
        result.update(
            at=now.isoformat(timespec="minutes"),
            open=_is_open(p, now),
            hours_today=_hours_for(p, now.weekday()),
        )
        return result
    if m := re.match(
        r"^(?:at )?(?P<h>\d{1,2})(?::(?P<mi>\d{2}))?\s*(?P<ampm>am|pm)?(?: (?P<day>today|tonight|tomorrow))?$",
        when,
    ):
        hour = int(m["h"])
        if m["ampm"]:
            hour = hour % 12 + (12 if m["ampm"] == "pm" else 0)
        day = now.date() + timedelta(days=1 if m["day"] == "tomorrow" else 0)
        if hour > 23 or int(m["mi"] or 0) > 59:
            raise SimError(f"ERROR: cannot read the time {when!r}")
        at = datetime.combine(day, time(hour, int(m["mi"] or 0)), tzinfo=now.tzinfo)
        result.update(
            at=at.isoformat(timespec="minutes"), open=_is_open(p, at), hours=_hours_for(p, at.weekday())
        )
        return result
    if m := re.match(
        r"^(?:on )?(?P<day>monday|tuesday|wednesday|thursday|friday|saturday|sunday|tomorrow)s?$", when
    ):
        index = (now.weekday() + 1) % 7 if m["day"] == "tomorrow" else _DAY_NAMES[m["day"]]
        hours = _hours_for(p, index)
        result.update(day=list(_DAY_NAMES)[index].title(), open=hours != "closed", hours=hours)
        return result
    raise SimError(
        f'ERROR: cannot read {when!r}; use "is [place] open now", "... open at 9pm" or "... open on Sunday"'
    )

"""The date/time tools: get_current_context, timestamp_comparator, timestamp_converter,
timestamp_interval_calculator. They really compute (zoneinfo, calendar arithmetic); the error texts the paper
shows are reproduced verbatim (portool.md §2.5.4).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agentcredit.tools.suite.data import SuiteContext, find_location, load_json, norm

# Verbatim from the paper (Appendix F, Fig. 7/8): the interval calculator's error for an unsupported timestamp.
INTERVAL_TIMESTAMP_ERROR = (
    "ERROR: invalid timestamp: {{{value}}}. supported time formats include ISO 8601 date-time with or without "
    "timezone (e.g., 2006-01-02T15:04:05Z07:00, 2006-01-02 15:04:05), 12-hour AM/PM with or without seconds "
    "(e.g., 03:04:05 PM, 03:04PM), and 24-hour formats (e.g., 15:04:05, 15:04)"
)
# Verbatim from the paper (Appendix G, Fig. 9): the comparator's error for e.g. "now".
COMPARATOR_TIMESTAMP_ERROR = (
    "ERROR: invalid format for {field}: The value must be in a valid ISO 8601 format. Valid templates include: "
    "YYYY-MM-DD for date, YYYY-MM-DDThh:mm:ss for local time without timezone, YYYY-MM-DDThh:mm:ssZ for UTC time, "
    "and YYYY-MM-DDThh:mm:ss+hh:mm / YYYY-MM-DDThh:mm:ss-hh:mm for times with timezone offsets (ahead or behind "
    "UTC time)."
)


class TimeError(ValueError):
    """A bad time argument; ``str(exc)`` is the full ``ERROR: ...`` text for the model."""


_DATE = r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})"
_CLOCK = r"(?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d{1,9}))?"
_OFFSET = r"(?P<tz>Z|[+-]\d{2}:\d{2})"
_ISO_DATE = re.compile(rf"^{_DATE}$")
_ISO_DATETIME = re.compile(rf"^{_DATE}T{_CLOCK}{_OFFSET}?$")
_SPACE_DATETIME = re.compile(rf"^{_DATE}[ T]{_CLOCK}{_OFFSET}?$")
_CLOCK_12 = re.compile(r"^(?P<h>\d{1,2}):(?P<mi>\d{2})(?::(?P<s>\d{2}))?\s?(?P<ampm>[AaPp][Mm])$")
_CLOCK_24 = re.compile(r"^(?P<h>\d{1,2}):(?P<mi>\d{2})(?::(?P<s>\d{2}))?$")


def _offset(text: str | None) -> timezone | None:
    if text is None:
        return None
    if text == "Z":
        return UTC
    sign = 1 if text[0] == "+" else -1
    hours, minutes = int(text[1:3]), int(text[4:6])
    if hours > 23 or minutes > 59:
        raise ValueError("offset out of range")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


def _from_match(m: re.Match[str]) -> datetime:
    frac = m.group("frac") or ""
    micro = int((frac + "000000")[:6]) if frac else 0
    return datetime(
        int(m.group("y")),
        int(m.group("mo")),
        int(m.group("d")),
        int(m.group("h")),
        int(m.group("mi")),
        int(m.group("s")),
        micro,
        tzinfo=_offset(m.group("tz")),
    )


def parse_comparator_timestamp(value: str, field: str) -> datetime:
    """Date, local date-time, UTC (Z) or offset date-time; naive results are completed by the caller."""
    text = value.strip()
    try:
        if m := _ISO_DATE.match(text):
            return datetime(int(m["y"]), int(m["mo"]), int(m["d"]))
        if m := _ISO_DATETIME.match(text):
            return _from_match(m)
    except ValueError:
        pass
    raise TimeError(COMPARATOR_TIMESTAMP_ERROR.format(field=field))


def parse_interval_timestamp(value: str, today: date) -> datetime:
    """The formats the interval calculator lists; a bare date is refused, exactly as in the paper's Fig. 7."""
    text = value.strip()
    try:
        if m := _SPACE_DATETIME.match(text):
            return _from_match(m)
        if m := _CLOCK_12.match(text):
            hour = int(m["h"])
            if not 1 <= hour <= 12:
                raise ValueError("12-hour clock hour out of range")
            hour = hour % 12 + (12 if m["ampm"].lower() == "pm" else 0)
            return datetime(today.year, today.month, today.day, hour, int(m["mi"]), int(m["s"] or 0))
        if m := _CLOCK_24.match(text):
            return datetime(today.year, today.month, today.day, int(m["h"]), int(m["mi"]), int(m["s"] or 0))
    except ValueError:
        pass
    raise TimeError(INTERVAL_TIMESTAMP_ERROR.format(value=value))


def resolve_zone(tz_text: str | None, location_text: str | None, ctx: SuiteContext, field: str) -> ZoneInfo:
    """A canonical zone from an IANA name, a common abbreviation, or a place; empty means the user's zone."""
    tz_text = (tz_text or "").strip()
    location_text = (location_text or "").strip()
    if tz_text:
        zone = _zone_from_text(tz_text)
        if zone is None:
            raise TimeError(
                f"ERROR: unknown time zone {tz_text!r} in {field}; use a canonical IANA time zone ID such as "
                "America/Los_Angeles, or a location"
            )
        return zone
    if location_text:
        zone = _zone_from_text(location_text)
        if zone is None:
            raise TimeError(
                f"ERROR: unknown location {location_text!r} for its time zone; use a city such as 'London' or a "
                "canonical IANA time zone ID"
            )
        return zone
    return ctx.zone


def _zone_from_text(text: str) -> ZoneInfo | None:
    if "/" in text or text.upper() == "UTC":
        try:
            return ZoneInfo("UTC" if text.upper() == "UTC" else text)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    aliases = load_json("locations.json")["time_zone_aliases"]
    key = norm(text)
    if key in aliases:
        return ZoneInfo(aliases[key])
    row = find_location(text)
    return ZoneInfo(row["time_zone"]) if row else None


def describe(dt: datetime) -> str:
    """The paper's timestamp rendering: ``Saturday 2025-09-27T02:47:20-07:00 Week_number 39 Day_number 270``.

    Week_number is the ISO week: it matches all three of the paper's examples (weeks 39, 22, 40).
    """
    stamp = dt.isoformat(timespec="seconds")
    if stamp.endswith("+00:00") and getattr(dt.tzinfo, "key", None) == "UTC":
        stamp = stamp[:-6] + "Z"
    return f"{dt:%A} {stamp} Week_number {dt.isocalendar().week} Day_number {dt.timetuple().tm_yday}"


def zone_name(zone: Any) -> str:
    return getattr(zone, "key", None) or str(zone)


def localize(naive: datetime, zone: ZoneInfo) -> datetime:
    """Attach a zone to wall-clock time (fold=0: the first of two ambiguous times, like most libraries)."""
    return naive.replace(tzinfo=zone)


def human_delta(seconds: float) -> str:
    """``21 hours, 12 minutes, 40 seconds`` (the paper's comparator format), with days when there are any."""
    total = int(round(abs(seconds)))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = []
    if days:
        parts.append(f"{days} day{'s' if days != 1 else ''}")
    parts += [
        f"{hours} hour{'s' if hours != 1 else ''}",
        f"{minutes} minute{'s' if minutes != 1 else ''}",
        f"{secs} second{'s' if secs != 1 else ''}",
    ]
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------- durations


@dataclass(frozen=True)
class Duration:
    years: int = 0
    months: int = 0
    days: int = 0
    seconds: float = 0.0


_DURATION = re.compile(
    r"^P(?!$)(?:(?P<y>\d+)Y)?(?:(?P<mo>\d+)M)?(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<h>\d+)H)?(?:(?P<mi>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: str) -> Duration:
    m = _DURATION.match(text.strip().upper())
    if not m or not any(m.groupdict().values()):
        raise TimeError(
            f"ERROR: invalid interval: {{{text}}}. expected ISO 8601 duration format P[n]Y[n]M[n]DT[n]H[n]M[n]S "
            "(e.g., P70D, PT3H30M, P1Y2M)"
        )
    g = {k: (v or "0") for k, v in m.groupdict().items()}
    return Duration(
        years=int(g["y"]),
        months=int(g["mo"]),
        days=int(g["w"]) * 7 + int(g["d"]),
        seconds=int(g["h"]) * 3600 + int(g["mi"]) * 60 + float(g["s"]),
    )


def add_months(d: datetime, months: int) -> datetime:
    """Calendar month arithmetic, clamping the day (Jan 31 + 1 month = Feb 28/29, as people expect)."""
    index = d.year * 12 + (d.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    if not 1 <= year <= 9999:
        raise TimeError("ERROR: the calculated time is outside the supported years 1-9999")
    return d.replace(year=year, month=month, day=min(d.day, calendar.monthrange(year, month)[1]))


def shift(local: datetime, duration: Duration, sign: int) -> datetime:
    """Years/months/days move the wall clock (a day stays a calendar day across DST); hours/minutes/seconds
    are elapsed time (computed in UTC)."""
    zone = local.tzinfo
    naive = local.replace(tzinfo=None)
    try:
        naive = add_months(naive, sign * (duration.years * 12 + duration.months))
        naive = naive + timedelta(days=sign * duration.days)
        moved = localize(naive, zone)  # type: ignore[arg-type]
        utc = moved.astimezone(UTC) + timedelta(seconds=sign * duration.seconds)
    except OverflowError:
        raise TimeError("ERROR: the calculated time is outside the supported years 1-9999") from None
    return utc.astimezone(zone)


# ------------------------------------------------------------------------------------------- the tools


def get_current_context(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in dict.fromkeys(args["requested_context"]):  # de-duplicated, order kept
        if item == "current_time":
            out["current_time"] = {
                "date_time": describe(ctx.local_now()),
                "time_zone": ctx.location.time_zone,
            }
        elif item == "current_location":
            out["current_location"] = ctx.location.to_dict()
    return out


def _complete(dt: datetime, zone: ZoneInfo) -> datetime:
    return localize(dt, zone) if dt.tzinfo is None else dt


def timestamp_comparator(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    t1 = parse_comparator_timestamp(args["timestamp1"], "timestamp1")
    t2 = parse_comparator_timestamp(args["timestamp2"], "timestamp2")
    # A timestamp with an explicit offset is absolute; the time zone fields complete local (naive) ones.
    t1 = _complete(t1, resolve_zone(args.get("timezone1"), None, ctx, "timezone1"))
    t2 = _complete(t2, resolve_zone(args.get("timezone2"), None, ctx, "timezone2"))
    op = args["comparison_operator"]
    result = {"<": t1 < t2, ">": t1 > t2, "==": t1 == t2}[op]
    return {"comparisonResult": result, "timeDifference": human_delta((t2 - t1).total_seconds())}


def timestamp_interval_calculator(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    zone = resolve_zone(args.get("from_timezone"), args.get("from_location"), ctx, "from_timezone")
    start = parse_interval_timestamp(args["from_timestamp"], ctx.now.astimezone(zone).date())
    start = start.astimezone(zone) if start.tzinfo is not None else localize(start, zone)
    duration = parse_duration(args["interval"])
    result = shift(start, duration, 1 if args["operation"] == "add" else -1)
    return {"calculatedTime": describe(result), "timezoneLocal": zone_name(zone)}


def timestamp_converter(args: dict[str, Any], ctx: SuiteContext) -> dict[str, Any]:
    if not (args.get("to_timezone") or "").strip() and not (args.get("to_location") or "").strip():
        raise TimeError("ERROR: timestamp_converter needs a target: to_timezone or to_location")
    src = resolve_zone(args.get("from_timezone"), args.get("from_location"), ctx, "from_timezone")
    dst = resolve_zone(args.get("to_timezone"), args.get("to_location"), ctx, "to_timezone")
    start = parse_interval_timestamp(args["timestamp"], ctx.now.astimezone(src).date())
    start = start.astimezone(src) if start.tzinfo is not None else localize(start, src)
    converted = start.astimezone(dst)
    return {
        "convertedTime": describe(converted),
        "timezoneLocal": zone_name(dst),
        "originalTime": describe(start),
        "timezoneOriginal": zone_name(src),
    }

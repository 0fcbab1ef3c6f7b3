"""Fixture tables of the PORTool tool suite (package data under ``agentcredit/data/tools/``) and the context
every time-aware tool shares: the user's location and the clock.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo


def data_text(name: str) -> str:
    return resources.files("agentcredit").joinpath("data", "tools", name).read_text(encoding="utf-8")


@functools.cache
def load_json(name: str) -> Any:
    return json.loads(data_text(name))


def data_path(name: str) -> Any:
    """A Traversable for a fixture file (for the JSONL corpora read with :func:`read_corpus`)."""
    return resources.files("agentcredit").joinpath("data", "tools", name)


@dataclass(frozen=True)
class UserLocation:
    city: str = "Cupertino"
    region: str = "California"
    country: str = "United States"
    country_code: str = "US"
    latitude: float = 37.3230
    longitude: float = -122.0322
    time_zone: str = "America/Los_Angeles"

    def to_dict(self) -> dict[str, Any]:
        return {
            "city": self.city,
            "region": self.region,
            "country": self.country,
            "latitude": self.latitude,
            "longitude": self.longitude,
            "time_zone": self.time_zone,
        }


# The paper's Fig. 9 clock: "Saturday 2025-09-27T02:47:20-07:00" in Cupertino (portool.md §2.5.4-2.5.5).
DEFAULT_NOW = datetime(2025, 9, 27, 2, 47, 20, tzinfo=ZoneInfo("America/Los_Angeles"))


@dataclass(frozen=True)
class SuiteContext:
    """Where and when the simulated user is. Inject ``now`` to replay a recorded execution timestamp (§2.5.5)."""

    now: datetime = DEFAULT_NOW
    location: UserLocation = field(default_factory=UserLocation)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.now.tzinfo is None:
            raise ValueError(
                "SuiteContext.now must be timezone-aware (e.g. tzinfo=ZoneInfo('America/Los_Angeles'))"
            )
        # Second-level precision, as the paper records execution timestamps.
        object.__setattr__(self, "now", self.now.replace(microsecond=0))

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.location.time_zone)

    def local_now(self) -> datetime:
        return self.now.astimezone(self.zone)


def haversine_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance on a sphere of radius 6371 km."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * 6371.0 * math.asin(min(1.0, math.sqrt(a)))


def norm(text: str) -> str:
    """Lower-case, apostrophes removed, punctuation to spaces, single spaces: for matching names."""
    text = text.casefold().replace("'", "").replace("\u2019", "")
    return " ".join("".join(ch if ch.isalnum() else " " for ch in text).split())


@functools.cache
def location_index() -> dict[str, dict[str, Any]]:
    """Normalised name/alias -> location row (cities, plus countries/regions that stand for their main city)."""
    index: dict[str, dict[str, Any]] = {}
    for row in load_json("locations.json")["locations"]:
        for key in [row["name"], *row["aliases"]]:
            index.setdefault(norm(key), row)
        if row["region"]:
            index.setdefault(norm(f"{row['name']} {row['region']}"), row)
        index.setdefault(norm(f"{row['name']} {row['country']}"), row)
    return index


def find_location(text: str) -> dict[str, Any] | None:
    """A known location by name ("San Jose", "Cupertino, CA", "New Zealand"), or None."""
    key = norm(text)
    if not key:
        return None
    index = location_index()
    if key in index:
        return index[key]
    # "Cupertino, CA" / "Paris France" / "downtown Seattle": the longest known name inside the text wins.
    best = None
    for name, row in index.items():
        if f" {name} " in f" {key} " and (best is None or len(name) > len(best[0])):
            best = (name, row)
    return best[1] if best else None

"""``conversion_calculation``: measurement conversions with ``pint`` (which knows hundreds of units and the
affine temperature scales), currency from a dated fixture table of simulated rates, and weight <-> volume
through a fixture table of densities when the call names a substance.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

from agentcredit.tools.suite.data import load_json, norm


class ConversionError(ValueError):
    """A conversion the tool cannot do; the message becomes ``ERROR: <message>``."""


# Spellings models use that pint does not parse (or parses as something else).
_UNIT_ALIASES = {
    "°c": "degC",
    "c": "degC",
    "celsius": "degC",
    "degrees celsius": "degC",
    "degree celsius": "degC",
    "centigrade": "degC",
    "degrees c": "degC",
    "°f": "degF",
    "f": "degF",
    "fahrenheit": "degF",
    "degrees fahrenheit": "degF",
    "degree fahrenheit": "degF",
    "degrees f": "degF",
    "k": "kelvin",
    "kelvins": "kelvin",
    "fl oz": "fluid_ounce",
    "fl. oz": "fluid_ounce",
    "fl. oz.": "fluid_ounce",
    "fluid ounce": "fluid_ounce",
    "fluid ounces": "fluid_ounce",
    "floz": "fluid_ounce",
    "tbsp": "tablespoon",
    "tbs": "tablespoon",
    "tablespoons": "tablespoon",
    "tsp": "teaspoon",
    "teaspoons": "teaspoon",
    "cups": "cup",
    "c.": "cup",
    "mph": "mile/hour",
    "miles per hour": "mile/hour",
    "kph": "kilometer/hour",
    "kmh": "kilometer/hour",
    "km/h": "kilometer/hour",
    "kilometers per hour": "kilometer/hour",
    "kilometres per hour": "kilometer/hour",
    "m/s": "meter/second",
    "meters per second": "meter/second",
    "metres per second": "meter/second",
    "knots": "knot",
    "kt": "knot",
    "kn": "knot",
    "lbs": "pound",
    "lb": "pound",
    "pounds": "pound",
    "oz": "ounce",
    "ounces": "ounce",
    "st": "stone",
    "metric ton": "metric_ton",
    "metric tons": "metric_ton",
    "tonne": "metric_ton",
    "tonnes": "metric_ton",
    "ton": "short_ton",
    "tons": "short_ton",
    "gal": "gallon",
    "gallons": "gallon",
    "qt": "quart",
    "quarts": "quart",
    "pt": "pint",
    "pints": "pint",
    "l": "liter",
    "litre": "liter",
    "litres": "liter",
    "liters": "liter",
    "ml": "milliliter",
    "millilitre": "milliliter",
    "millilitres": "milliliter",
    "cc": "cubic_centimeter",
    "sq ft": "foot**2",
    "square feet": "foot**2",
    "square foot": "foot**2",
    "sq m": "meter**2",
    "square meters": "meter**2",
    "square metres": "meter**2",
    "sq km": "kilometer**2",
    "square kilometers": "kilometer**2",
    "square miles": "mile**2",
    "sq mi": "mile**2",
    "acre": "international_acre",
    "acres": "international_acre",
    "hectares": "hectare",
    "ha": "hectare",
    "in": "inch",
    "inches": "inch",
    '"': "inch",
    "ft": "foot",
    "feet": "foot",
    "'": "foot",
    "yd": "yard",
    "yards": "yard",
    "mi": "mile",
    "miles": "mile",
    "nautical miles": "nautical_mile",
    "nmi": "nautical_mile",
    "km": "kilometer",
    "kilometres": "kilometer",
    "kilometre": "kilometer",
    "m": "meter",
    "metre": "meter",
    "metres": "meter",
    "cm": "centimeter",
    "mm": "millimeter",
    "light years": "light_year",
    "light year": "light_year",
    "kb": "kilobyte",
    "mb": "megabyte",
    "gb": "gigabyte",
    "tb": "terabyte",
    "hrs": "hour",
    "hr": "hour",
    "mins": "minute",
    "min": "minute",
    "secs": "second",
    "sec": "second",
    "yrs": "year",
    "yr": "year",
    "kcal": "kilocalorie",
    "cal": "calorie",
    "calories": "calorie",
    "psi": "psi",
    "atm": "atmosphere",
    "bar": "bar",
}


@functools.cache
def _registry() -> Any:
    import pint

    registry = pint.UnitRegistry(autoconvert_offset_to_baseunit=True)
    # pint's "acre" is the US survey acre (43,560.17 international ft^2); people mean the international one.
    registry.define("international_acre = 43560 * foot ** 2")
    return registry


# pint's registry caches parsed units in dicts; one lock keeps concurrent tool calls from racing on them.
_LOCK = threading.Lock()


def _conversion_table() -> dict[str, Any]:
    return load_json("conversion.json")


def currency_code(text: str) -> str | None:
    table = _conversion_table()
    raw = text.strip()
    if raw.upper() in table["usd_rates"]:
        return raw.upper()
    return table["currency_aliases"].get(raw.casefold()) or table["currency_aliases"].get(norm(raw))


def _unit(text: str) -> Any:
    ureg = _registry()
    raw = text.strip()
    key = raw.casefold()
    name = _UNIT_ALIASES.get(key) or _UNIT_ALIASES.get(key.rstrip(".")) or raw
    try:
        return ureg.Unit(name)
    except Exception:
        pass
    try:  # "square feet" style names with spaces -> underscores ("fluid ounce" -> "fluid_ounce")
        return ureg.Unit(name.replace(" ", "_"))
    except Exception:
        raise ConversionError(f"unknown unit {text!r}") from None


def _density(substance: str) -> float | None:
    densities = _conversion_table()["densities_g_per_ml"]
    key = norm(substance)
    if key in densities:
        return float(densities[key])
    # "all purpose flour" / "cups of sugar": the longest known substance name inside the text.
    best = max((k for k in densities if f" {norm(k)} " in f" {key} "), key=len, default=None)
    return float(densities[best]) if best else None


def _round(value: float) -> float | int:
    rounded = float(f"{value:.10g}")
    return int(rounded) if rounded.is_integer() and abs(rounded) < 1e15 else rounded


_QUERY_PATTERNS = [
    re.compile(
        r"^(?:convert\s+)?(?P<value>-?[\d,]*\.?\d+)\s*(?P<src>.+?)\s+(?:to|in|into|as)\s+(?P<dst>.+?)\??$",
        re.I,
    ),
    re.compile(
        r"^how\s+many\s+(?P<dst>.+?)\s+(?:are\s+|is\s+)?(?:in|is|equals?|make)\s+(?P<value>-?[\d,]*\.?\d+)\s*(?P<src>.+?)\??$",
        re.I,
    ),
]


def parse_query(query: str) -> tuple[list[dict[str, Any]], str]:
    """``"convert 5 miles to km"`` / ``"how many cups in 2 liters"`` -> ([{"unit", "value"}], target unit)."""
    for pattern in _QUERY_PATTERNS:
        m = pattern.match(query.strip())
        if m:
            value = float(m["value"].replace(",", ""))
            return [{"unit": m["src"].strip(), "value": value}], m["dst"].strip()
    raise ConversionError(
        f'cannot read a conversion from the query {query!r}; pass \'from\' ([{{"unit", "value"}}]) and '
        "'to_units' ([one unit]), or phrase it like 'convert 5 miles to km'"
    )


def convert(args: dict[str, Any]) -> dict[str, Any]:
    sources = args.get("from")
    targets = args.get("to_units")
    if not sources or not targets:
        parsed_sources, parsed_target = parse_query(args["query"])
        sources = sources or parsed_sources
        targets = targets or [parsed_target]
    target = targets[0]
    substance = (args.get("substance") or "").strip()

    codes = [currency_code(s["unit"]) for s in sources]
    target_code = currency_code(target)
    if target_code or any(codes):
        return _convert_currency(sources, codes, target, target_code)
    with _LOCK:
        value, unit_out = _convert_measure(sources, target, substance)
    out: dict[str, Any] = {
        "from": [{"unit": s["unit"], "value": _round(float(s["value"]))} for s in sources],
        "to": {"unit": unit_out, "value": _round(value)},
    }
    if substance:
        out["substance"] = substance
    return out


def _convert_currency(
    sources: list[dict[str, Any]], codes: list[str | None], target: str, target_code: str | None
) -> dict[str, Any]:
    table = _conversion_table()
    if target_code is None or not all(codes):
        raise ConversionError(
            f"cannot convert between a currency and a non-currency unit (target {target!r})"
        )
    rates = table["usd_rates"]
    usd = sum(float(s["value"]) / rates[c] for s, c in zip(sources, codes, strict=True))
    value = usd * rates[target_code]
    return {
        "from": [
            {"unit": c, "value": _round(float(s["value"]))} for s, c in zip(sources, codes, strict=True)
        ],
        "to": {"unit": target_code, "value": round(value, 4)},
        "rate_date": table["currency_as_of"],
        "note": "simulated exchange rates from an offline snapshot",
    }


def _convert_measure(sources: list[dict[str, Any]], target: str, substance: str) -> tuple[float, str]:
    ureg = _registry()
    target_unit = _unit(target)
    total = None
    for s in sources:
        q = ureg.Quantity(float(s["value"]), _unit(s["unit"]))
        if total is None:
            total = q
        else:
            if q.dimensionality != total.dimensionality:
                raise ConversionError(f"the 'from' units mix dimensions ({total.units} and {q.units})")
            total = total + q.to(total.units)
    assert total is not None
    if total.dimensionality == target_unit.dimensionality:
        return float(total.to(target_unit).magnitude), str(target_unit)
    mass, volume = ureg.gram.dimensionality, ureg.milliliter.dimensionality
    pair = {total.dimensionality, target_unit.dimensionality}
    if pair == {mass, volume}:
        if not substance:
            raise ConversionError(
                f"converting {total.units} to {target_unit} needs a 'substance' (e.g. 'flour', 'water') for its density"
            )
        density = _density(substance)
        if density is None:
            known = ", ".join(sorted(_conversion_table()["densities_g_per_ml"]))
            raise ConversionError(f"unknown substance {substance!r}; known substances: {known}")
        dens = ureg.Quantity(density, "gram/milliliter")
        converted = total * dens if total.dimensionality == volume else total / dens
        return float(converted.to(target_unit).magnitude), str(target_unit)
    raise ConversionError(
        f"cannot convert {total.units} ({total.dimensionality}) to {target_unit} ({target_unit.dimensionality})"
    )

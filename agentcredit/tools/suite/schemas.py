"""JSON schemas of PORTool's 17 tools (portool.md §2.5).

Seven tools have their schema in the paper's Appendix D; their descriptions and parameter texts are copied
verbatim (field names de-OCR'd). The other ten (§2.5.3) are written from the behaviour the paper describes
(Appendix C.1) [R]; the time-sensitive ones say that they are simulated. Unknown extra arguments are ignored,
not rejected: the paper's backends look like Go services, and Go's JSON decoder ignores unknown fields.
"""

from __future__ import annotations

from typing import Any

SIMULATED = (
    " Simulated: answers come from a fixed offline snapshot (around 2025-09-27, user in Cupertino, California), "
    "not from live data."
)

_STR = {"type": "string"}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _p(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


_ISO = "ISO 8601 format (YYYY-MM-DDThh:mm:ss) or a date YYYY-MM-DD"

_MAPS_QUERY = (
    "User's search intent. The query should follow one of these patterns:\n"
    "1. {navigate me to/find/call/phone number/opening hours/how far/eta}{poi/category/menu items/address}"
    "{near/on/around/in/from/to [anchor_location]}\n"
    "2. find {poi/category} near [anchor_location]\n"
    "3. {how far/eta} from [anchor_location] to [targeted_location]\n"
    "4. is [anchor_location] open {now/at time/on day}\n"
    "All [anchor_location] and [targeted_location] must be concrete and unambiguous. For queries based on the "
    "user's current location, [anchor_location] or [targeted_location] in the above patterns may be filled with "
    '"near me", "from here", or "from my location", and do not include the anchor_location parameter. If a query '
    'contains a vague location (e.g., "McDonald near me"), it is forbidden. Instead, first issue "find [location]" '
    "to resolve candidates, then always select the first candidate and rewrite the query accordingly (e.g., "
    '"is McDonald at 12th Ave open now", "how far is McDonald at 12th Ave from here"). Do not output vague queries '
    'like "is McDonald near me open now" or "how far is McDonald".'
)

_MATH_EXPRESSION = (
    "Mathematical expression using function-call syntax. Available functions include: add(a, b, ...), "
    "subtract(a, b), multiply(a, b, ...), divide(a, b), avg(a, b, ...), modulus(a, b), isDivisible(a, b), "
    "power(base, exponent), root(number, degree), factorial(n), gcd(a, b, ...), lcm(a, b, ...), factor(n), "
    "primeFactor(n), random(min, max), log(number, base), percentOf(value, percent), "
    "percentDiscount(value, percent discount), toPercent(decimal), fromPercent(percent), "
    "decimalToFraction(decimal), fractionToDecimal(fraction). Constants: pi, e, phi, tau. Nested functions may be "
    "used for complex expressions."
)

_LIST_ITEMS = {"type": "array", "items": {"type": "object"}, "description": "The list of objects."}

TOOL_SPECS: list[dict[str, Any]] = [
    {
        "name": "news_search",
        "description": "Provides access to news headlines and articles related to current events, given a query "
        "string." + SIMULATED,
        "parameters": _obj(
            {
                "query": _p("string", "What the news should be about."),
                "start_date": _p("string", "Earliest publication date, YYYY-MM-DD."),
                "end_date": _p("string", "Latest publication date, YYYY-MM-DD."),
                "limit": _p(
                    "integer", "Maximum number of articles (1-10, default 5).", minimum=1, maximum=10
                ),
            },
            ["query"],
        ),
    },
    {
        "name": "weather_search",
        "description": "Returns current weather conditions and forecasts for a specified location. The tool supports "
        "time-bounded queries with start and end times in ISO 8601 format, and allows adjustable precision (e.g., "
        "hour, day). It cannot retrieve past weather." + SIMULATED,
        "parameters": _obj(
            {
                "location": _p("string", "City or place; leave empty for the user's current location."),
                "start_datetime": _p("string", f"Start of the time window, {_ISO}."),
                "end_datetime": _p("string", f"End of the time window, {_ISO}."),
                "precision": _p("string", "Granularity of the forecast.", enum=["hour", "day"]),
                "unit": _p(
                    "string",
                    "Temperature unit (default: fahrenheit in the US, celsius elsewhere).",
                    enum=["celsius", "fahrenheit"],
                ),
            },
            [],
        ),
    },
    {
        "name": "flights_search",
        "description": "Retrieves airline flight information, including schedules, status, arrival, and departure "
        "data. It supports flexible specifications such as carrier codes, flight numbers, departure/arrival "
        "locations, and temporal windows." + SIMULATED,
        "parameters": _obj(
            {
                "flight_number": _p("string", "Carrier code and number, e.g. UA1234."),
                "carrier_code": _p("string", "Two-letter airline code, e.g. UA."),
                "departure_location": _p("string", "Departure airport code or city."),
                "arrival_location": _p("string", "Arrival airport code or city."),
                "start_datetime": _p("string", f"Earliest departure time, {_ISO}."),
                "end_datetime": _p("string", f"Latest departure time, {_ISO}."),
            },
            [],
        ),
    },
    {
        "name": "stocks_search",
        "description": "Fetches real-time and historical stock price information using stock or market names as "
        "input queries." + SIMULATED,
        "parameters": _obj(
            {
                "query": _p("string", "Stock, company or market index name or ticker symbol."),
                "date": _p("string", "A trading date, YYYY-MM-DD (default: the latest)."),
                "start_date": _p("string", "Start of a price history, YYYY-MM-DD."),
                "end_date": _p("string", "End of a price history, YYYY-MM-DD."),
            },
            ["query"],
        ),
    },
    {
        "name": "sports_search",
        "description": "Provides information on sports teams, athletes, schedules, and standings based on query "
        "intent." + SIMULATED,
        "parameters": _obj(
            {
                "query": _p("string", "Teams, league or season the user asks about."),
                "use_case": _p(
                    "object",
                    'The intent, e.g. {"standings": {"requested_info": "PERFORMANCE"}}, {"schedule": {}} or '
                    '{"champions": {}}.',
                ),
            },
            ["query"],
        ),
    },
    {
        "name": "maps_search",
        "description": "finds businesses, landmarks, and addresses and calculates travel times" + SIMULATED,
        "parameters": _obj(
            {
                "query": _p("string", _MAPS_QUERY),
                "anchor_location": _p(
                    "string",
                    'Reference text describing the area or place mentioned in the query (e.g., "4th Street", '
                    '"Central Park"). Leave this empty if the query is related to the user\'s current location.',
                ),
                "eta_type": _p(
                    "string",
                    'Type of ETA query. Allowed values include "departure" and "arrive".',
                    enum=["departure", "arrive"],
                ),
                "eta_time": _p("string", "Time constraint associated with eta_type. Use ISO 8601 format."),
            },
            ["query"],
        ),
    },
    {
        "name": "conversion_calculation",
        "description": "Measurement and currency unit conversions. Currency rates are simulated (offline snapshot).",
        "parameters": _obj(
            {
                "query": _p("string", "The query that contains the conversion to perform."),
                "substance": _p(
                    "string",
                    "The substance the user wants to include as part of the conversion is used to facilitate "
                    "weight-to-volume and volume-to-weight conversions.",
                ),
                "from": {
                    "type": "array",
                    "description": "The units and their respective amounts to convert.",
                    "items": _obj(
                        {
                            "unit": _p("string", "The unit to convert."),
                            "value": _p("number", "The amount or value of the unit."),
                        },
                        ["unit", "value"],
                    ),
                    "minItems": 1,
                },
                "to_units": {
                    "type": "array",
                    "description": "The units the user wants to convert to. This array must contain only one element, "
                    "representing the single target unit for the conversion.",
                    "items": _STR,
                    "minItems": 1,
                    "maxItems": 1,
                },
            },
            ["query"],
        ),
    },
    {
        "name": "math_calculation",
        "description": "Performs mathematical calculations using function-call syntax. Important: Use only raw "
        "numbers in expressions (no currency symbols, units, or % signs). The tool returns numeric results without "
        "formatting—add appropriate context (currency, units, etc.) in your response based on the user's question.",
        "parameters": _obj({"expression": _p("string", _MATH_EXPRESSION)}, ["expression"]),
    },
    {
        "name": "get_current_context",
        "description": "Retrieves specific aspects of the user's request context, such as current location and "
        "current time.",
        "parameters": _obj(
            {
                "requested_context": {
                    "type": "array",
                    "description": 'A list of context fields to retrieve, encompassing "current_location" and/or '
                    '"current_time" only.',
                    "items": {"type": "string", "enum": ["current_location", "current_time"]},
                    "minItems": 1,
                }
            },
            ["requested_context"],
        ),
    },
    {
        "name": "timestamp_comparator",
        "description": "Compares two ISO 8601 timestamps using operators such as <, >, or ==. Time zone information "
        "is required for both timestamps.",
        "parameters": _obj(
            {
                "timestamp1": _p("string", "First timestamp in ISO 8601 format."),
                "timezone1": _p("string", "Time zone of timestamp1 (IANA ID, e.g. America/Los_Angeles)."),
                "timestamp2": _p("string", "Second timestamp in ISO 8601 format."),
                "timezone2": _p("string", "Time zone of timestamp2 (IANA ID)."),
                "comparison_operator": _p(
                    "string", "How to compare timestamp1 with timestamp2.", enum=["<", ">", "=="]
                ),
            },
            ["timestamp1", "timezone1", "timestamp2", "timezone2", "comparison_operator"],
        ),
    },
    {
        "name": "sort_list",
        "description": "Sorts a list of objects by a specified numeric property, in either ascending or descending "
        "order.",
        "parameters": _obj(
            {
                "list": _LIST_ITEMS,
                "property": _p("string", "The numeric property to sort by."),
                "order": _p("string", "Sort order (default ascending).", enum=["ascending", "descending"]),
            },
            ["list", "property"],
        ),
    },
    {
        "name": "holiday_search",
        "description": "Returns holiday information for a specified date, period, or country. It supports filtering "
        "by holiday type (e.g., public, bank, cultural). Covers 2024-2026 for 15 countries.",
        "parameters": _obj(
            {
                "country": _p("string", "Country name or ISO code (default: the user's country)."),
                "query": _p("string", "Holiday name to look for, e.g. Thanksgiving."),
                "date": _p("string", "A date, YYYY-MM-DD."),
                "start_date": _p("string", "Start of a period, YYYY-MM-DD."),
                "end_date": _p("string", "End of a period, YYYY-MM-DD."),
                "year": _p("integer", "A year.", minimum=1900, maximum=2100),
                "holiday_type": _p("string", "Holiday type filter.", enum=["public", "bank", "cultural"]),
            },
            [],
        ),
    },
    {
        "name": "knowledge_search",
        "description": "Returns passages retrieved from the web and the knowledge graph. The tool retrieves top "
        "dynamically ranked passages that answer the query. In addition to decomposed queries, it can also address "
        "complex queries by sourcing multiple passages. Note: Web passages are less effective at providing "
        "real-time and location-sensitive answers.",
        "parameters": _obj(
            {
                "query": _p("string", "The natural language query to search on the web."),
                "entity_labels": {
                    "type": "array",
                    "description": "List of entity labels used to retrieve relevant facts from the knowledge graph.",
                    "items": _STR,
                },
            },
            ["query"],
        ),
    },
    {
        "name": "filter_list",
        "description": "Filters a list of objects by applying a condition (e.g., ==, >, <) to a specified property "
        "field.",
        "parameters": _obj(
            {
                "list": _LIST_ITEMS,
                "property": _p("string", "The property to test."),
                "operator": _p("string", "The condition.", enum=["==", "!=", ">", "<", ">=", "<="]),
                "value": {"description": "The value to compare the property with."},
            },
            ["list", "property", "operator", "value"],
        ),
    },
    {
        "name": "timestamp_converter",
        "description": "Converts a timestamp from one time zone to another, supporting both canonical time zone "
        "identifiers and location-based descriptions.",
        "parameters": _obj(
            {
                "timestamp": _p("string", "The timestamp to convert (ISO 8601 date-time, or a time of day)."),
                "from_timezone": _p("string", "Source time zone (default: the user's)."),
                "from_location": _p("string", "Source location, used when from_timezone is empty."),
                "to_timezone": _p("string", "Target time zone."),
                "to_location": _p("string", "Target location, used when to_timezone is empty."),
            },
            ["timestamp"],
        ),
    },
    {
        "name": "timestamp_interval_calculator",
        "description": "Calculates a new ISO 8601 timestamp by adding or subtracting a time interval from a given "
        "ISO 8601 timestamp.",
        "parameters": _obj(
            {
                "from_timezone": _p("string", "The time zone corresponding to the from_timestamp."),
                "from_location": _p("string", "The location corresponding to the from_timestamp."),
                "from_timestamp": _p(
                    "string",
                    "Input timestamp in ISO 8601 format (YYYY-MM-DDThh:mm:ss). Do not include the time zone offset, "
                    "as it is assumed to be in from_timezone.",
                ),
                "interval": _p(
                    "string",
                    "Time interval to be added or subtracted, in ISO 8601 duration format (P[n]Y[n]M[n]DT[n]H[n]M[n]S).",
                ),
                "operation": _p(
                    "string",
                    "The operation to perform. Allowed values: add, subtract.",
                    enum=["add", "subtract"],
                ),
            },
            ["from_timestamp", "interval", "operation"],
        ),
    },
    {
        "name": "response_gen",
        "description": "Response generation.",
        "parameters": _obj(
            {
                "response": _p("string", "Response to be generated."),
                "query": _p("string", "User query or rewritten query."),
                "context": _p("string", "Context for response generation."),
                "items": {
                    "type": "array",
                    "items": {"type": "object"},
                    "description": "Items with entities and facts.",
                },
            },
            ["response"],
        ),
    },
]

TOOL_NAMES: list[str] = [spec["name"] for spec in TOOL_SPECS]

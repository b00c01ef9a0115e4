"""Checks an answer to an agent's question (ACP elicitation) against its form
before it is sent, by the rules the Rust and TypeScript SDKs apply
(`research/contract.md`, "The SDK and `sandbox-agent prompt`", "Questions"):
every required field present (a ``None`` counts as left out), no field the
form lacks, each value of its field's type (string, number, integer, boolean,
list of strings), a string's length in characters within
``minLength``/``maxLength`` and its value among ``enum``/``oneOf``, a number
within ``minimum``/``maximum``, a list's items among its choices and their
count within ``minItems``/``maxItems``. ``pattern`` and ``format`` are left to
the agent. A URL question takes no content."""

from __future__ import annotations

import json
import math
from typing import Any

from ._check import check
from .types import QuestionAnswer, QuestionRequest

__all__ = ["check_answer"]


def check_answer(question: QuestionRequest, answer: QuestionAnswer) -> str | None:
    """What is wrong with `answer` for `question`, e.g. ``field "name" must be
    at least 1 character long (is 0)``; ``None`` when it fits (declines and
    cancels always fit).

    Raises:
        TypeError: `question` or `answer` is not a dict.
    """
    check("check_answer", "question", question, dict, "a dict")
    check("check_answer", "answer", answer, dict, "a dict")
    if answer.get("action") != "accept":
        return None
    content = answer.get("content")
    given = {} if content is None else content
    if not isinstance(given, dict):
        return "the content must be an object of field values"
    values = {name: value for name, value in given.items() if value is not None}
    if question.get("mode") == "url":
        return None if not values else "a URL question takes no content"
    if question.get("mode") != "form":
        return None  # a future mode: the agent judges
    schema = question.get("requestedSchema")
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    for name in values:
        if name not in properties:
            return f'field "{name}" is not a field of the form'
    for name in schema.get("required") or []:
        if name not in values:
            return f'field "{name}" is required'
    for name, value in values.items():
        prop = properties.get(name)
        problem = _check_value(prop if isinstance(prop, dict) else {}, value)
        if problem is not None:
            return f'field "{name}" {problem}'
    return None


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _plural(n: float) -> str:
    return "" if n == 1 else "s"


def _num(prop: dict[str, Any], key: str) -> float | None:
    value = prop.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fmt(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else str(n)


def _check_value(prop: dict[str, Any], value: Any) -> str | None:
    kind = prop.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return f"must be a string, not {_dump(value)}"
        length = len(value)  # code points, as the other SDKs count characters
        low, high = _num(prop, "minLength"), _num(prop, "maxLength")
        if low is not None and length < low:
            return f"must be at least {_fmt(low)} character{_plural(low)} long (is {length})"
        if high is not None and length > high:
            return f"must be at most {_fmt(high)} character{_plural(high)} long (is {length})"
        allowed = _choices(prop.get("enum"), prop.get("oneOf"))
        if allowed is not None and value not in allowed:
            return f"must be one of {_quoted(allowed)}, not {_dump(value)}"
        return None
    if kind in ("number", "integer"):
        integer = kind == "integer"
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not is_number or (integer and not float(value).is_integer()):
            return f"must be {'an integer' if integer else 'a number'}, not {_dump(value)}"
        low, high = _num(prop, "minimum"), _num(prop, "maximum")
        if low is not None and value < low:
            return f"must be at least {_fmt(low)} (is {_fmt(value)})"
        if high is not None and value > high:
            return f"must be at most {_fmt(high)} (is {_fmt(value)})"
        return None
    if kind == "boolean":
        return None if isinstance(value, bool) else f"must be true or false, not {_dump(value)}"
    if kind == "array":
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return f"must be an array of strings, not {_dump(value)}"
        items = prop.get("items")
        items = items if isinstance(items, dict) else {}
        allowed = _choices(items.get("enum"), items.get("anyOf"))
        if allowed is not None:
            wrong = next((item for item in value if item not in allowed), None)
            if wrong is not None:
                return f"may only hold {_quoted(allowed)}, not {_dump(wrong)}"
        low, high = _num(prop, "minItems"), _num(prop, "maxItems")
        if low is not None and len(value) < low:
            return f"must hold at least {_fmt(low)} (holds {len(value)})"
        if high is not None and len(value) > high:
            return f"must hold at most {_fmt(high)} (holds {len(value)})"
        return None
    return None  # a type this client does not know: the agent judges


def _choices(values: Any, options: Any) -> list[str] | None:
    """The allowed values of an ``enum`` (strings) or a ``oneOf``/``anyOf`` (``{const}`` options)."""
    if isinstance(values, list):
        return [v for v in values if isinstance(v, str)]
    if isinstance(options, list):
        return [o["const"] for o in options if isinstance(o, dict) and isinstance(o.get("const"), str)]
    return None


def _quoted(values: list[str]) -> str:
    return ", ".join(_dump(v) for v in values)

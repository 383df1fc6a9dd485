"""The building blocks of the config file's validation (runconfig.py): a :data:`Check` per value.

A check takes a value and its key path, appends each problem it finds (naming the path, what was
expected and what was received) and returns the value, normalised. ``mapping`` checks the keys of a
mapping and suggests a close match for an unknown one; ``typed``, ``one_of``, ``bool_or`` and the
constants make the leaves.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any, str, list[str]], Any]
"""Validates one value at a key path: appends problems, returns the (normalised) value."""


def kind_of(value: Any) -> str:
    """What ``value`` is (``a list``, ``a string``, ...), without the value itself."""
    kinds = {
        dict: "a mapping",
        list: "a list",
        bool: "a boolean",
        str: "a string",
        int: "an integer",
        float: "a number",
    }
    kind = kinds.get(type(value), "nothing (null)" if value is None else None)
    return kind if kind is not None else f"a {type(value).__name__}"


def _received(value: Any, secret: bool = False) -> str:
    kind = kind_of(value)
    if secret:
        return f"{kind} (not shown: it may hold a secret)" if value is not None else kind
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}" if value is not None else kind


def _problem(path: str, expected: str, value: Any, secret: bool = False) -> str:
    return f"{path}: expected {expected}, received {_received(value, secret)}"


def typed(expected: str, ok: Callable[[Any], bool]) -> Check:
    def check(value: Any, path: str, problems: list[str]) -> Any:
        if not ok(value):
            problems.append(_problem(path, expected, value))
        return value

    return check


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


STRING = typed("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
BOOL = typed("true or false", lambda v: isinstance(v, bool))
POSITIVE_INT = typed("a positive integer", lambda v: _is_int(v) and v > 0)
NON_NEGATIVE_INT = typed("an integer >= 0", lambda v: _is_int(v) and v >= 0)
POSITIVE_NUMBER = typed("a positive number", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0)
SCALAR = typed("a string, number or boolean", lambda v: isinstance(v, str | int | float | bool))


def one_of(*choices: str) -> Check:
    return typed("one of " + ", ".join(repr(c) for c in choices), lambda v: v in choices)


def string_list(value: Any, path: str, problems: list[str]) -> Any:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(_problem(path, "a list of strings", value))
    return value


def string_or_list(value: Any, path: str, problems: list[str]) -> Any:
    """A non-empty string, kept as is, or a non-empty list of them (``debezium.order_by``: one payload
    path or several, and ``order_type``: one type for all or one per path)."""
    if isinstance(value, str) and value.strip():
        return value
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        problems.append(_problem(path, "a non-empty string or a non-empty list of them", value))
    return value


def scalar_map(value: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, dict):
        problems.append(_problem(path, "a mapping of names to strings, numbers or booleans", value))
        return value
    for key, item in value.items():
        SCALAR(item, f"{path}.{key}", problems)
    return {str(k): v for k, v in value.items()}


def secret_map(value: Any, path: str, problems: list[str]) -> Any:
    """:func:`scalar_map` for settings that may hold secrets (catalog properties: tokens,
    credentials, passwords; Spark settings: storage keys), often from environment variables: a
    problem names the key and the kind of value received, never the value."""
    if not isinstance(value, dict):
        problems.append(_problem(path, "a mapping of names to strings, numbers or booleans", value, secret=True))
        return value
    for key, item in value.items():
        if not isinstance(item, str | int | float | bool):
            problems.append(_problem(f"{path}.{key}", "a string, number or boolean", item, secret=True))
    return {str(k): v for k, v in value.items()}


def mapping(
    fields: Mapping[str, Check], required: tuple[str, ...] = (), what: str = "a mapping", secret: bool = False
) -> Check:
    """A mapping with these keys only; unknown keys get a close-match suggestion. ``secret``: a value
    that is not a mapping is named by its kind only (a catalog given as one URL string may hold a
    password)."""

    def check(value: Any, path: str, problems: list[str]) -> Any:
        if not isinstance(value, dict):
            expected = f"{what} with keys {', '.join(fields)}"
            problems.append(_problem(path or "(top level)", expected, value, secret=secret))
            return value
        result = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of {', '.join(fields)}"
                problems.append(f"{sub}: unknown key{hint}")
                continue
            result[key] = fields[key](item, sub, problems)
        for key in required:
            if key not in value:
                problems.append(f"{path + '.' if path else ''}{key}: required, missing")
        return result

    return check


def bool_or(inner: Check) -> Check:
    """``true`` (defaults), ``false`` (off) or a mapping."""

    def check(value: Any, path: str, problems: list[str]) -> Any:
        if isinstance(value, bool):
            return {} if value else None
        if value is None:
            return {}
        return inner(value, path, problems)

    return check

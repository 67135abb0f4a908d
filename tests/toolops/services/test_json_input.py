"""The JSON input checks every entry point shares: the refused value is named by its path."""

from __future__ import annotations

from typing import Any

import pytest

from toolops.services.json_input import MAX_JSON_DEPTH, JsonInputRefused, json_input_check


@pytest.mark.parametrize(("value", "path", "problem"), [
    ({"q": "a\x00b"}, "arguments.q", "U+0000"),
    ({"a": [1, {"b": "\ud800"}]}, "arguments.a[1].b", "lone surrogate"),
    ({"ok": 1, "\udfff": 2}, "arguments key", "lone surrogate"),
    ({"x": float("nan")}, "arguments.x", "NaN"),
    ({"x": [float("inf")]}, "arguments.x[0]", "NaN"),
    ("\x00", "arguments", "U+0000"),
])
def test_refusals_name_the_field(value: Any, path: str, problem: str) -> None:
    with pytest.raises(JsonInputRefused) as refused:
        json_input_check(value, field="arguments")
    assert refused.value.path.startswith(path) and problem in refused.value.problem
    str(refused.value).encode("utf-8")  # the message itself is printable (no surrogate in it)


def test_depth_is_bounded_without_recursion() -> None:
    deep: Any = 1
    for _ in range(100_000):  # far past the interpreter's recursion limit
        deep = [deep]
    with pytest.raises(JsonInputRefused, match="nested deeper"):
        json_input_check(deep, field="evidence")
    ok: Any = 1
    for _ in range(MAX_JSON_DEPTH):
        ok = {"k": ok}
    json_input_check(ok, field="evidence")
    json_input_check({"emoji": "\U0001f600", "n": 2**53, "f": 1.5, "none": None}, field="x")

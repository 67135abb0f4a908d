"""Canonical JSON: the standard library's fast path spells exactly what `rfc8785` spells."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import digests
from ledger.digests import canonical_digest, canonical_json

_scalars = (st.none() | st.booleans()
            | st.integers(min_value=-(2**60), max_value=2**60)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text())
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


def _rfc8785_or_error(value: Any) -> bytes | type[BaseException]:
    try:
        return rfc8785.dumps(value)
    except Exception as exc:  # the same refusal either way
        return type(exc)


def _ours_or_error(value: Any) -> bytes | type[BaseException]:
    try:
        return canonical_json(value)
    except Exception as exc:
        return type(exc)


# Values the fast path takes: ASCII keys, safe integers, any text (control characters, non-ASCII,
# astral, lone surrogates).
_plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1) | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(alphabet=st.characters(max_codepoint=127), max_size=8), children,
                      max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_json)
def test_any_json_value_is_spelled_as_rfc8785_spells_it(value: Any) -> None:
    assert _ours_or_error(value) == _rfc8785_or_error(value)


@settings(max_examples=400, deadline=None)
@given(_plain_json)
def test_a_value_the_fast_path_takes_is_spelled_as_rfc8785_spells_it(value: Any) -> None:
    assert digests._plain(value)
    assert _ours_or_error(value) == _rfc8785_or_error(value)


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [
    {"b": 1, "a": [True, None, "x"], "": {}},
    {"s": "quote \" backslash \\ controls \b\t\n\f\r \x00 \x1f \x7f"},
    {"s": "non-ASCII é 漢 \u2028 \u2029 \U0001f600"},
    {"\U0001f600": 1, "\ue000": 2, "z": 3},  # key order differs between code points and UTF-16
    {"n": 2**53 - 1, "m": -(2**53 - 1)},
    {"n": 2**53},
    {"f": 1.0, "g": 1e21, "h": -0.0},
    {"lone": "\ud800"},
    _nested(70),
    "top-level string", 7, None, True,
])
def test_the_edges_of_the_fast_path(value: Any) -> None:
    assert _ours_or_error(value) == _rfc8785_or_error(value)


def test_the_fast_path_is_taken_only_where_it_is_exact() -> None:
    assert digests._plain({"tool": "t", "arguments": {"k": [1, "v", None, False]}})
    assert not digests._plain({"x": 1.5})
    assert not digests._plain({"é": 1})
    assert not digests._plain({"n": 2**53})
    assert not digests._plain((1, 2))  # a tuple is not JSON's own type: rfc8785 decides
    assert canonical_digest({"b": 1, "a": 2}) == canonical_digest({"a": 2, "b": 1})

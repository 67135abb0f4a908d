"""Checks on JSON that comes from outside (request bodies, CLI flags, API arguments, what a server
answered) before it reaches canonicalisation or the database.

PostgreSQL text and jsonb store no U+0000; UTF-8 (and so RFC 8785 canonical digests and jsonb)
has no lone surrogates; jsonb has no NaN or Infinity; deep nesting costs stack in every recursive
walker downstream. Each is refused here with the path of the offending field, as a typed error,
never found later as a UnicodeEncodeError, a DataError or a RecursionError.

The walk is iterative, so a hostile depth cannot exhaust the stack of the check itself.
"""

from __future__ import annotations

import math
from typing import Any

from toolops.errors import ToolopsError

# Deeper nesting than this is refused: no tool argument, answer or evidence needs it.
MAX_JSON_DEPTH = 64


class JsonInputRefused(ToolopsError):
    """The JSON value holds something that cannot be stored or digested; `path` names where."""

    def __init__(self, *, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def _string_problem(value: str) -> str | None:
    if "\x00" in value:
        return "contains U+0000 (NUL)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return _string_problem(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN and Infinity are not JSON"
    return None


def json_input_check(value: Any, *, field: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise JsonInputRefused for NUL, lone surrogates (keys and values), NaN/Infinity or nesting
    deeper than `max_depth`, naming the path (`arguments.q[2]`). Only containers are pushed on
    the walk's stack; scalars are checked in place and their path is built only for a refusal."""
    problem = _scalar_problem(value)
    if problem:
        raise JsonInputRefused(path=field, problem=problem)
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            raise JsonInputRefused(path=path, problem=f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                label = str(key) if isinstance(key, str) else repr(key)
                key_problem = _string_problem(label)
                if key_problem:
                    shown = label.encode("utf-8", "backslashreplace").decode()[:60]
                    raise JsonInputRefused(path=f"{path} key {shown!r}", problem=key_problem)
                if isinstance(child, dict | list | tuple):
                    stack.append((child, f"{path}.{label[:60]}", depth + 1))
                else:
                    problem = _scalar_problem(child)
                    if problem:
                        raise JsonInputRefused(path=f"{path}.{label[:60]}", problem=problem)
        elif isinstance(item, list | tuple):
            for i, child in enumerate(item):
                if isinstance(child, dict | list | tuple):
                    stack.append((child, f"{path}[{i}]", depth + 1))
                else:
                    problem = _scalar_problem(child)
                    if problem:
                        raise JsonInputRefused(path=f"{path}[{i}]", problem=problem)

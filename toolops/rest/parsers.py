"""The one request body parser of the API: JSON, bounded before any work.

* at most TOOLOPS_MAX_REQUEST_BYTES are read (the middleware already refused a larger declared
  Content-Length; this caps what is read whatever was declared): 413;
* strict UTF-8: 400;
* nesting deeper than MAX_JSON_DEPTH is refused by a flat scan before json.loads runs, so no
  recursion happens on hostile input: 400;
* NaN/Infinity, NUL and lone surrogates (in keys or values, as `\\ud800` escapes) are refused
  with the path of the field: 400.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from toolops.services.json_input import MAX_JSON_DEPTH, JsonInputRefused, json_input_check

# A string, or an unterminated one running to the end: the optional closing quote means a match
# never fails, so there is no backtracking and no rescan from each later quote (linear time).
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]+")
_NUL_OR_SURROGATE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "request_too_large"


def json_depth(text: str, *, stop_above: int = MAX_JSON_DEPTH) -> int:
    """The deepest nesting of `text` (brackets inside strings do not count), counted up to the
    first level past `stop_above`: linear regex passes and a running sum, no recursion."""
    brackets = "".join(_BRACKETS.findall(_STRING.sub("", text)))
    deepest = 0
    for depth in accumulate(1 if c in "[{" else -1 for c in brackets):
        if depth > deepest:
            deepest = depth
            if deepest > stop_above:
                break
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: dict[str, Any] | None = None) -> Any:
        limit = int(settings.TOOLOPS_MAX_REQUEST_BYTES)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise RequestTooLarge(f"request body over {limit} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - body is not UTF-8 (byte {exc.start})") from exc
        if json_depth(text) > MAX_JSON_DEPTH:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels")
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {str(exc)[:200]}") from exc
        # Strict UTF-8 already refused encoded surrogates, and strict json.loads raw control
        # characters: NUL and lone surrogates can only come from \u escapes. Without one, and
        # with the depth already scanned, there is nothing left to walk for.
        if not _NUL_OR_SURROGATE_ESCAPE.search(text):
            return data
        try:
            json_input_check(data, field="body")
        except JsonInputRefused as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        return data

"""Form helpers shared by the admin pages whose actions call toolops services."""

from __future__ import annotations

import json
from typing import Any

from django import forms


def form_json_object(raw: str) -> dict[str, Any] | None:
    """A JSON object typed by an operator, or None when left blank; anything else is a form error."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(f"not valid JSON: {exc.msg}") from exc
    if not isinstance(value, dict):
        raise forms.ValidationError("must be a JSON object")
    return value

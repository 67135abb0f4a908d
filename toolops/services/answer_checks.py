"""An operator's answer to an input round, checked against what the server asked: the shape of
an elicitation result and its content against the server's `requestedSchema`.

Only these checks, no database: the answer is refused with a clear reason before anything is
recorded or sent (toolops/services/inputs.py records and delivers it).
"""

from __future__ import annotations

from typing import Any

from ledger.models import InputRequest
from toolops.errors import ToolopsError

ELICITATION_ACTIONS = frozenset({"accept", "decline", "cancel"})


class InputAnswerRefused(ToolopsError):
    pass


def elicitation_result(*, ir: InputRequest, response: Any) -> dict[str, Any]:
    """The JSON-RPC result we send: `{action, content}`; bare content means accept."""
    if not isinstance(response, dict):
        raise InputAnswerRefused("the answer must be a JSON object")
    if ir.method != "elicitation/create":
        return response  # sampling: the operator supplies the CreateMessageResult verbatim
    result = dict(response) if "action" in response else {"action": "accept", "content": response}
    if result["action"] not in ELICITATION_ACTIONS:
        raise InputAnswerRefused(f"action must be one of {sorted(ELICITATION_ACTIONS)}")
    if result["action"] == "accept":
        schema = ir.params.get("requestedSchema")
        if schema is not None:
            _answer_schema_check(content=result.get("content"), schema=schema)
    return result


# A refusal quotes the validator's message, cut to this: the schema is the server's, not ours.
SCHEMA_REASON_CHARS = 300


def _answer_schema_check(*, content: Any, schema: Any) -> None:
    """The answer against the server's `requestedSchema`; a schema that is not one refuses the
    answer with a clear reason (never an unhandled error: the server wrote it)."""
    # Imported on first use: a worker process that never checks an answer does not load
    # jsonschema and its dependencies (about 2 MB in every worker process).
    import jsonschema

    if not isinstance(schema, dict | bool):
        raise InputAnswerRefused("the server's requested schema is not a JSON Schema")
    try:
        jsonschema.validate(content, schema)
    except jsonschema.ValidationError as exc:
        raise InputAnswerRefused("answer does not match the requested schema: "
                                 f"{exc.message[:SCHEMA_REASON_CHARS]}") from exc
    except jsonschema.SchemaError as exc:
        raise InputAnswerRefused("the server's requested schema is invalid: "
                                 f"{exc.message[:SCHEMA_REASON_CHARS]}") from exc

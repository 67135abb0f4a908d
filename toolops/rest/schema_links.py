"""OpenAPI links between the API's operations (a drf-spectacular postprocessing hook).

They say where an id in one response can be used next (a listed reconciliation item is resolved
by its `id`, a submitted operation is cancelled by its `id`, ...). Clients and the stateful
schemathesis run in the tests follow them.
"""

from __future__ import annotations

from typing import Any

# (source path, method, status) -> [(link name, target path, method, {parameter: expression})]
LINKS: dict[tuple[str, str, str], list[tuple[str, str, str, dict[str, str]]]] = {
    ("/api/operations/", "post", "201"): [
        ("CancelOperation", "/api/operations/{id}/cancel/", "post", {"id": "$response.body#/id"}),
        ("GetOperation", "/api/operations/{id}/", "get", {"id": "$response.body#/id"}),
    ],
    ("/api/operations/", "get", "200"): [
        ("CancelListedOperation", "/api/operations/{id}/cancel/", "post",
         {"id": "$response.body#/results/0/id"}),
    ],
    ("/api/operations/{id}/cancel/", "post", "202"): [
        ("GetCancelledOperation", "/api/operations/{id}/", "get", {"id": "$response.body#/id"}),
    ],
    ("/api/input-requests/", "get", "200"): [
        ("AnswerInputRequest", "/api/input-requests/{id}/answer/", "post",
         {"id": "$response.body#/results/0/id"}),
    ],
    ("/api/input-requests/{id}/answer/", "post", "202"): [
        ("GetAnsweredOperation", "/api/operations/{id}/", "get", {"id": "$response.body#/id"}),
    ],
    ("/api/reconciliation/", "get", "200"): [
        ("ResolveItem", "/api/reconciliation/{id}/resolve/", "post",
         {"id": "$response.body#/results/0/id"}),
    ],
    ("/api/reconciliation/{id}/resolve/", "post", "200"): [
        ("GetResolvedOperation", "/api/operations/{id}/", "get", {"id": "$response.body#/operation"}),
    ],
}


def schema_add_links(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    paths = result.get("paths", {})
    for (path, method, status), links in LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        if response is None:
            continue
        out = response.setdefault("links", {})
        for name, target, target_method, parameters in links:
            op_id = paths.get(target, {}).get(target_method, {}).get("operationId")
            if op_id:
                out[name] = {"operationId": op_id, "parameters": dict(parameters)}
    return result


# Every endpoint can refuse the caller: documented once here, so Swagger UI and Redoc show a 401
# or 403 as a described answer with its body rather than as "Undocumented".
ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "detail": {"type": "string", "description": "one line saying why"},
        "error": {"type": "string", "description": "the refusal's type, when it has one"},
    },
    "required": ["detail"],
}
COMMON_ERRORS = {
    "401": "No credentials, or credentials that are not valid (send `Authorization: Token <key>`).",
    "403": ("Authenticated, but not allowed: no membership in an organisation, or the action needs "
            "a permission or organisation role the caller lacks (README, Security)."),
}


def schema_add_error_responses(result: dict[str, Any], generator: Any, request: Any,
                               public: bool) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("Error", ERROR_SCHEMA)
    for path, methods in result.get("paths", {}).items():
        if not path.startswith("/api/") or path.startswith("/api/schema"):
            continue
        for operation in methods.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for status, description in COMMON_ERRORS.items():
                operation["responses"].setdefault(status, {
                    "description": description,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                })
    return result

"""One permission model for every entry point (REST, admin, CLI, Python API).

Each action that changes a row names one Django permission. A principal may take the action when
* it is the system actor (the CLI, Celery, the embedded runner, host code using `toolops.api`
  without a user): whoever can run those already owns the deployment; or
* the user holds the Django permission (granted to operators, valid for every organisation); or
* the user's organisation role grants the action and the row belongs to that organisation.

The check lives in the services the entry points call, never only in a view, so no entry point
can skip it. A refusal is `PermissionRefused` (REST 403, an admin message, a one-line CLI error).

| action         | permission                            | roles             |
|----------------|---------------------------------------|-------------------|
| submit         | ledger.add_operation                  | member, operator  |
| cancel         | ledger.cancel_operation               | member, operator  |
| answer         | ledger.change_inputrequest            | member, operator  |
| resolve        | ledger.resolve_reconciliationitem     | operator          |
| register       | ledger.add_toolserver                 | (none)            |
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ledger.models import Membership, Operation
from toolops.errors import ToolopsError


class Action(StrEnum):
    SUBMIT = "submit"
    CANCEL = "cancel"
    ANSWER = "answer"
    RESOLVE = "resolve"
    REGISTER = "register"


PERMISSION_BY_ACTION: dict[Action, str] = {
    Action.SUBMIT: "ledger.add_operation",
    Action.CANCEL: "ledger.cancel_operation",
    Action.ANSWER: "ledger.change_inputrequest",
    Action.RESOLVE: "ledger.resolve_reconciliationitem",
    Action.REGISTER: "ledger.add_toolserver",
}

_MEMBER = frozenset({Membership.Role.MEMBER, Membership.Role.OPERATOR})
ROLES_BY_ACTION: dict[Action, frozenset[str]] = {
    Action.SUBMIT: _MEMBER,
    Action.CANCEL: _MEMBER,
    Action.ANSWER: _MEMBER,
    Action.RESOLVE: frozenset({Membership.Role.OPERATOR}),
    Action.REGISTER: frozenset(),
}


class PermissionRefused(ToolopsError):
    """The actor may not take this action on this row; nothing was changed."""


@dataclass(frozen=True)
class Actor:
    """Who acts: a Django user, or the system (named for the audit trail)."""

    name: str
    user: Any = None

    @property
    def is_system(self) -> bool:
        return self.user is None

    @property
    def user_id(self) -> int | None:
        return None if self.user is None else self.user.pk


def actor_system(*, name: str = "system") -> Actor:
    """The actor of the CLI, Celery tasks and host code: trusted by whoever runs them."""
    if not name.strip():
        raise PermissionRefused("a system actor must be named")
    return Actor(name=name)


def actor_for_user(*, user: Any) -> Actor:
    """The actor of an authenticated request (REST, admin)."""
    if user is None or not getattr(user, "is_authenticated", False):
        raise PermissionRefused("authentication required")
    return Actor(name=user.get_username(), user=user)


SYSTEM = actor_system(name="system")


def actor_coerce(actor: Actor | str) -> Actor:
    """A bare string names a system actor (the CLI's `--actor`, scripts): never a user's rights."""
    return actor if isinstance(actor, Actor) else actor_system(name=actor)


def _role_of(*, user: Any) -> tuple[str, str] | None:
    membership = (Membership.objects.select_related("organisation").filter(user_id=user.pk).first())
    return None if membership is None else (membership.organisation.slug, membership.role)


def operation_tenant(operation_id: Any) -> str:
    """The organisation owning an operation ("" when it has none or does not exist)."""
    return Operation.objects.filter(id=operation_id).values_list("tenant", flat=True).first() or ""


def permission_allows(*, actor: Actor, action: Action, tenant: str) -> bool:
    """`tenant`: the organisation that owns the row acted on (blank: no organisation)."""
    if actor.is_system:
        return True
    user = actor.user
    if not getattr(user, "is_active", False):
        return False
    if user.has_perm(PERMISSION_BY_ACTION[action]):
        return True
    found = _role_of(user=user)
    if found is None:
        return False
    org, role = found
    # A role acts only inside its organisation; shared rows (blank tenant) need the permission.
    return bool(tenant) and org == tenant and role in ROLES_BY_ACTION[action]


def permission_require(*, actor: Actor | str, action: Action, tenant: str) -> Actor:
    """Raise PermissionRefused unless `actor` may take `action` on a row of `tenant`."""
    who = actor_coerce(actor)
    if not permission_allows(actor=who, action=action, tenant=tenant):
        raise PermissionRefused(
            f"{who.name} may not {action.value}: needs the {PERMISSION_BY_ACTION[action]} permission"
            + (f" or an organisation role of {', '.join(sorted(ROLES_BY_ACTION[action]))}"
               if ROLES_BY_ACTION[action] else "")
        )
    return who

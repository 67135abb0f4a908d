"""The `manage.py toolops <subcommand>` command line: one module per subcommand.

Each module declares `NAME` and `HELP`, builds its own small parser in `add_arguments(parser)` and
does its work in `run(*, opts, out, err)`: parse, call one service or selector, print JSON. `run`
returns an exit code (or None for 0 without exiting), and raises `CommandError` (or a
`ToolopsError`/`LedgerError`, which the dispatcher turns into one) for a one-line refusal.
The management command (toolops/management/commands/toolops.py) only dispatches.
"""

from __future__ import annotations

from types import ModuleType

from toolops.cli import (
    adapter,
    answer,
    cancel,
    demo,
    gate,
    polls,
    reconcile,
    rollback,
    rollout,
    run,
    server_add,
    show,
    simulate,
    submit,
)

# In the order `manage.py toolops --help` lists them.
SUBCOMMANDS: tuple[ModuleType, ...] = (
    server_add, adapter, submit, show, cancel, answer, run, demo, reconcile, polls, gate, simulate,
    rollback, rollout,
)


def subcommand_module(*, name: str) -> ModuleType:
    for module in SUBCOMMANDS:
        if module.NAME == name:
            return module
    raise KeyError(name)

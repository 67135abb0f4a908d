"""`python manage.py toolops <subcommand>`: a contract other tooling relies on.

A dispatcher only: each subcommand is one module under toolops/cli/ with its own parser. Errors
exit non-zero with one line; a subcommand's exit code is passed on.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import LedgerError
from toolops.cli import SUBCOMMANDS, subcommand_module
from toolops.errors import ToolopsError


class Command(BaseCommand):
    help = "toolops: submit, run and inspect long-running tool calls"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True)
        for module in SUBCOMMANDS:
            module.add_arguments(sub.add_parser(module.NAME, help=module.HELP))

    def handle(self, *args: Any, **opts: Any) -> None:
        module = subcommand_module(name=opts["subcommand"])
        try:
            code = module.run(opts=opts, out=self.stdout, err=self.stderr)
        except (ToolopsError, LedgerError) as exc:
            raise CommandError(str(exc)) from exc
        if code is not None:
            sys.exit(code)

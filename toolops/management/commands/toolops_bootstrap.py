"""`python manage.py toolops_bootstrap --username U --organisation ORG`: the first operator.

Creates a superuser, its organisation and membership, and an API token, then prints one JSON
object with the token (shown this once). The password comes from $DJANGO_SUPERUSER_PASSWORD, or is
asked for on a terminal. Errors exit non-zero with a one-line message and write nothing.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from toolops.services.operators import BootstrapRefused, operator_bootstrap


class Command(BaseCommand):
    help = "Create the first operator: superuser + organisation + membership + API token"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True)
        parser.add_argument("--email", default="")
        parser.add_argument("--organisation", required=True, help="slug (or a name to slugify)")
        parser.add_argument("--organisation-name", default="", help="display name (new organisation)")

    def handle(self, *args: Any, **opts: Any) -> None:
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD", "")
        if not password and sys.stdin.isatty():
            password = getpass.getpass(f"Password for {opts['username']}: ")
        try:
            made = operator_bootstrap(
                username=opts["username"], email=opts["email"], password=password,
                organisation=opts["organisation"], organisation_name=opts["organisation_name"])
        except BootstrapRefused as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps({
            **asdict(made),
            "admin": "/admin/", "api": "/api/", "docs": "/api/docs/",
            "note": "the token is shown only now; send it as 'Authorization: Token <token>'",
        }))

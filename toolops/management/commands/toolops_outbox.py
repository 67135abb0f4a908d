"""`python manage.py toolops_outbox [--loop]`: run the outbox relay (thin: one service call per pass).

Safe to run in several processes at once (claims use SKIP LOCKED). Prints one JSON line per pass
that did something.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from toolops.services.outbox import outbox_relay


class Command(BaseCommand):
    help = "Deliver ready outbox events to the configured handler (TOOLOPS_OUTBOX_HANDLER)"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--handler", default=None, help="dotted path overriding TOOLOPS_OUTBOX_HANDLER")
        parser.add_argument("--limit", type=int, default=None)
        parser.add_argument("--loop", action="store_true", help="keep relaying until interrupted")
        parser.add_argument("--interval", type=float, default=1.0,
                            help="seconds between passes that found nothing (with --loop)")

    def handle(self, *args: Any, **opts: Any) -> None:
        while True:
            stats = outbox_relay(handler=opts["handler"], limit=opts["limit"])
            if stats.claimed or not opts["loop"]:
                self.stdout.write(json.dumps(asdict(stats)))
            if not opts["loop"]:
                return
            if not stats.claimed:
                time.sleep(opts["interval"])

"""`toolops polls`: per-server poll figures, configured QPS against what was observed."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from toolops.cli.base import Output, print_json

NAME = "polls"
HELP = "per-server poll figures: configured QPS vs observed"

COLUMNS = ("server", "configured_qps", "peak_requests_in_one_second", "peak_over_configured",
           "total_requests", "refused_tokens", "operations", "polls_per_operation")


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    parser.add_argument("--server", action="append", default=None, help="limit to these servers")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.services.poll_report import poll_report_servers

    figures = [f.as_dict() for f in poll_report_servers(names=opts["server"])]
    if opts["json"]:
        print_json(out, {"servers": figures})
        return None
    out.write("  ".join(COLUMNS))
    for row in figures:
        out.write("  ".join(str(row[c]) for c in COLUMNS))
    return None

"""`toolops simulate`: seeded series over in-process simulated servers, then the gate report."""

from __future__ import annotations

import argparse
from argparse import ArgumentParser
from typing import Any

from toolops.cli.base import Output

NAME = "simulate"
HELP = "seeded simulation over in-process servers, then the gate"


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--series", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--only", type=int, default=None, help="replay one series index alone")
    parser.add_argument("--workers", type=int, default=4,
                        help="poll threads per tick, per shard (1: sequential)")
    parser.add_argument("--shards", type=int, default=1,
                        help="split the run into this many processes, each owning whole servers")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="run only shard K of N here (the replay of one shard)")
    parser.add_argument("--servers", type=int, default=None,
                        help="simulated servers (default: one per 1,250 series)")
    parser.add_argument("--tag", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shard-report", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--inject-lie", type=int, action="append", default=[],
                        help="test hook: the server misreports this series' ground truth")
    parser.add_argument("--json", action="store_true")


def run(*, opts: dict[str, Any], out: Output, err: Output) -> int | None:
    from toolops.simulation.command import simulate_command

    return simulate_command(series=opts["series"], seed=opts["seed"], only=opts["only"],
                            workers=opts["workers"], lie_about=frozenset(opts["inject_lie"]),
                            as_json=opts["json"], out=out, err=err, shards=opts["shards"],
                            shard=opts["shard"], tag=opts["tag"], shard_report=opts["shard_report"],
                            servers=opts["servers"])

"""`simulate` reports progress on stderr while stdout stays the report alone."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import call_command

from toolops.simulation.progress import progress_step

SEED = 20261129


def test_step_is_a_thousand_series_or_a_tenth_of_a_smaller_run() -> None:
    assert progress_step(series=10_000) == 1000
    assert progress_step(series=25_000) == 1000
    assert progress_step(series=500) == 50
    assert progress_step(series=12) == 2
    assert progress_step(series=1) == 1


@pytest.mark.django_db(transaction=True)
def test_json_stdout_is_one_document_and_progress_goes_to_stderr() -> None:
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("toolops", "simulate", "--series", "20", "--seed", str(SEED), "--workers", "1",
                     "--json", stdout=out, stderr=err)
    assert exited.value.code == 0, err.getvalue()
    report = json.loads(out.getvalue())  # nothing but the report on stdout
    assert report["simulation"]["series"] == 20 and report["passed"] is True
    lines = [line for line in err.getvalue().splitlines() if "series settled" in line]
    settled = [int(m.group(1)) for m in (re.search(r"(\d+)/20 series settled", li) for li in lines) if m]
    assert settled and settled == sorted(settled) and len(set(settled)) == len(settled), lines
    # A line per step of 2 at most, each with the elapsed time and every gate figure so far.
    assert len(lines) <= 10
    for line in lines:
        assert re.search(r"\d+ s elapsed", line)
        for figure in report["figures"]:
            assert figure["name"] in line

"""Dependency direction (docs/architecture.md), checked by import-linter's contracts in pyproject.

Every contract declared in pyproject.toml must be reported KEPT by name, the contracts the
architecture depends on must be declared (whatever else is added), and a planted violation must
be reported BROKEN, so the check is known to bite.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
PRODUCT = ("ledger", "adapters", "toolops", "config")


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(config["tool"]["importlinter"]["contracts"])


def _verdicts(cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    proc = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    verdicts = dict(re.findall(r"^(.+?) (KEPT|BROKEN)$", proc.stdout, flags=re.MULTILINE))
    return proc, verdicts


def test_every_declared_contract_is_kept() -> None:
    proc, verdicts = _verdicts(REPO)
    names = [c["name"] for c in _contracts()]
    assert len(names) == len(set(names)), "contract names must be unique to be reported apart"
    missing = [n for n in names if n not in verdicts]
    assert not missing, f"not reported: {missing}\n{proc.stdout}"
    broken = [n for n in names if verdicts[n] != "KEPT"]
    assert not broken, f"broken: {broken}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _forbids(*, sources: set[str], forbidden: set[str]) -> bool:
    return any(c["type"] == "forbidden" and sources <= set(c["source_modules"])
               and forbidden <= set(c["forbidden_modules"]) for c in _contracts())


def _layered(*, upper: str, lower: str) -> bool:
    """Some layers contract puts `upper` above `lower`."""
    for c in _contracts():
        if c["type"] != "layers":
            continue
        rows = [{m.strip() for m in re.split(r"[|:]", layer)} for layer in c["layers"]]
        up = next((i for i, r in enumerate(rows) if upper in r), None)
        down = next((i for i, r in enumerate(rows) if lower in r), None)
        if up is not None and down is not None and up < down:
            return True
    return False


def test_the_contracts_the_design_rests_on_are_declared() -> None:
    assert _forbids(sources={"ledger"}, forbidden={"toolops", "adapters"})
    assert _forbids(sources={"adapters"}, forbidden={"django", "ledger", "toolops"})
    assert _forbids(sources=set(PRODUCT), forbidden={"tests"})
    assert _layered(upper="toolops.cli", lower="toolops.services")
    assert _layered(upper="toolops.rest", lower="toolops.python_api")
    assert _layered(upper="toolops.python_api", lower="toolops.services")
    assert _layered(upper="ledger.services", lower="ledger.selectors")
    assert _layered(upper="ledger.selectors", lower="ledger.models")
    assert _layered(upper="toolops.services.observe", lower="toolops.services.schedule")
    assert _layered(upper="toolops.services.reconcile", lower="toolops.services.output_checks")
    assert _layered(upper="adapters.registry", lower="adapters.jsonrpc")
    assert _layered(upper="adapters.jsonrpc", lower="adapters.decode")


def test_a_planted_violation_is_reported_broken(tmp_path: Path) -> None:
    for package in PRODUCT:
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    runner = tmp_path / "toolops" / "runner.py"
    runner.write_text(runner.read_text() + "\nimport tests.peers.launch  # planted\n")
    services = tmp_path / "ledger" / "selectors" / "operations.py"
    services.write_text(services.read_text() + "\nimport ledger.services.transitions  # planted\n")
    proc, verdicts = _verdicts(tmp_path)
    assert proc.returncode != 0, proc.stdout
    broken = {n for n, v in verdicts.items() if v == "BROKEN"}
    assert broken == {"the product never imports the tests",
                      "ledger layers: services write, selectors read, both over the models and the "
                      "state table"}, proc.stdout

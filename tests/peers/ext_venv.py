"""Build (once) the separate virtualenv the Shape B reference server runs from.

FastMCP 4.1 and fastmcp-tasks 4.1.4 need mcp 2.x; the project's venv holds mcp 1.30 for the
Shape A peer, and one interpreter cannot import both. So the peer gets its own venv, built
on demand by the test fixture (a fresh CI clone has none) and reused while the pinned
requirements file is unchanged: the venv records the sha256 of the file it was built from.

Location: $TOOLOPS_EXT_VENV if set, else <repo>/var/ext-venv (var/ is gitignored).
Importable without Django: standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).with_name("requirements-ext.txt")
MARKER = ".toolops-requirements.sha256"
# pip on a cold cache downloads ~40 packages; generous, but bounded so CI cannot hang here.
BUILD_TIMEOUT_S = 900


def ext_venv_dir() -> Path:
    configured = os.environ.get("TOOLOPS_EXT_VENV")
    return Path(configured) if configured else REPO_ROOT / "var" / "ext-venv"


def _wanted_digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _is_current(venv: Path) -> bool:
    marker = venv / MARKER
    return _python(venv).exists() and marker.exists() and marker.read_text().strip() == _wanted_digest()


def ext_venv_python() -> Path:
    """The ext venv's interpreter, building the venv first if it is absent or stale."""
    venv = ext_venv_dir()
    if _is_current(venv):
        return _python(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel pytest processes on one checkout): the loser waits,
    # then finds the venv current.
    with open(venv.parent / ".ext-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(venv):
            return _python(venv)
        if venv.exists():
            shutil.rmtree(venv)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=BUILD_TIMEOUT_S)
        subprocess.run(
            [str(_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "-r", str(REQUIREMENTS)],
            check=True, timeout=BUILD_TIMEOUT_S,
        )
        # Written last: a build interrupted before this point is rebuilt next time.
        (venv / MARKER).write_text(_wanted_digest() + "\n")
    return _python(venv)


if __name__ == "__main__":
    print(ext_venv_python())

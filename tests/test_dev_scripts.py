"""Every script in the kernel lab (dev/) runs in its --quick mode: it still imports what the package exports today,
checks its variants against the reference (each script asserts that itself) and exits cleanly, so none can rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "dev").glob("*.py"))


def test_the_lab_has_scripts():
    assert len(SCRIPTS) >= 3, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_dev_script_runs_quick(script):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, str(script), "--quick"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, f"{script.name} --quick failed:\n{p.stdout}\n{p.stderr}"
    assert p.stdout.strip(), f"{script.name} --quick printed no results"

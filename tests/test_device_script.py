"""scripts/device_validate.sh reports GPU failures instead of hiding them."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parent.parent
FAKE = """#!/bin/sh
# a stand-in python3: CUDA "available", pytest exits {pytest}, the suite exits {suite}
case "$*" in
  "-m pytest"*) exit {pytest} ;;
  "-m snsim.cli"*) exit {suite} ;;
  *) echo "fake GPU"; exit 0 ;;
esac
"""


@pytest.mark.parametrize("pytest_rc, suite_rc, ok", [(0, 0, True), (1, 0, False),
                                                     (0, 1, False), (1, 1, False)])
def test_failures_are_not_hidden(tmp_path, pytest_rc, suite_rc, ok):
    fake = tmp_path / "python3"
    fake.write_text(FAKE.format(pytest=pytest_rc, suite=suite_rc))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path)}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "device_validate.sh")], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert (p.returncode == 0) == ok, (p.returncode, p.stdout, p.stderr)
    if not ok:
        assert f"pytest exit {pytest_rc}, suite exit {suite_rc}" in p.stderr

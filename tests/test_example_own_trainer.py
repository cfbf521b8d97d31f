"""examples/dp_deepar.py runs end to end on the bundled data and ends with the JSON comparison line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_example_ends_with_the_json_comparison():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "dp_deepar.py"), "--seed", "0", "--non-dp"], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    last = json.loads(out.strip().splitlines()[-1])
    assert {"private_crps", "seasonal_naive_crps", "non_dp_crps", "beats_seasonal_naive"} <= set(last)
    assert last["epsilon_spent"] <= 1.0 and last["model"] == "combination"

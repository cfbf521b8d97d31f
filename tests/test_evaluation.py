"""Issue 12, evaluation side: rolling test windows, the verdict, and the value bound made true by clipping."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from scipy.stats import norm

from lightning_dpts.app.cli import main
from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.evaluation import (
    QuantileForecasts,
    choose_test_windows,
    clip_bounds,
    clip_values,
    noisy_count,
    quantile_matrix,
    score_windows,
    seasonal_errors,
    verdict,
)
from lightning_dpts.privacy import NeighbouringRelation
from lightning_dpts.randomness import resolve_entropy

warnings.filterwarnings("ignore", category=FutureWarning)


def _dm(series, **kw) -> StructuredSubsamplingDataModule:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*explicit seed")
        return StructuredSubsamplingDataModule(series, **kw)


# ---------------------------------------------------------------------------------------------------------
# rolling test windows
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("test_windows", [1, 4])
def test_rolling_test_windows_are_consecutive_and_training_never_reaches_them(test_windows):
    """A tiny table whose held-out values are negative and training values positive: no training batch (past or
    future part, any window start) ever holds a held-out value, and the test windows tile the held-out tail."""
    horizon, lengths = 3, [30, 34, 41]
    series = []
    for n, length in enumerate(lengths):
        y = 100.0 * (n + 1) + np.arange(length, dtype=float) + 1.0  # > 0: training part
        y[length - test_windows * horizon:] *= -1.0  # < 0: held out
        series.append(y)
    dm = _dm(series, context_length=5, prediction_length=horizon, batch_size=3, test_windows=test_windows,
             seed=0, freq="D")
    assert dm.train_lengths.tolist() == [n - test_windows * horizon for n in lengths]
    for epoch in range(40):
        for step in range(dm.steps_per_epoch):
            batch = dm.train_batch(epoch, step)
            seen = np.concatenate([batch["past_target"].numpy().ravel(), batch["future_target"].numpy().ravel()])
            assert (seen >= 0).all(), "a training window reached into the held-out test windows"
    windows = dm.evaluation_windows("test")
    assert len(windows) == len(lengths) * test_windows
    for n, y in enumerate(series):
        mine = [w for w in windows if w.series_index == n]
        assert [w.window for w in mine] == list(range(test_windows))
        tail = np.concatenate([w.target for w in mine])
        np.testing.assert_array_equal(tail, y[len(y) - test_windows * horizon:])  # consecutive, no gap, no overlap
        for w in mine:  # each forecast sees the whole history before it, nothing after
            np.testing.assert_array_equal(w.history, y[:len(w.history)])


@pytest.mark.parametrize("lengths, past, horizon, expected", [
    ([225, 900], 12, 12, 4),  # bundled data: r 0.119 -> 0.145 (1.22x) with 4 windows
    ([93, 1000], 13, 13, 2),  # M4 weekly: r 0.382 -> 0.473 (1.24x) with 2, 0.619 (1.62x) with 3
    ([30, 40], 6, 6, 1),      # r 12/19 -> 12/13 (1.46x) with 2
    ([13], 6, 6, 1),          # room for one window only
    ([19], 30, 4, 3),         # r = 1 whatever k: more windows cost nothing, capped by >= L_F training steps
])
def test_choose_test_windows_from_public_lengths(lengths, past, horizon, expected):
    """Independent arithmetic: r_k = min(P + L_F, T_k)/T_k, T_k = L_min - k L_F - L_F + 1 (Theorem 4.4)."""
    k, note = choose_test_windows(lengths, past, horizon)
    assert k == expected and str(k) in note

    def rate(k):
        t = min(lengths) - (k + 1) * horizon + 1
        return min(past + horizon, t) / t

    if k > 1:
        assert rate(k) <= 1.25 * rate(1)
    if k < 4 and min(lengths) - (k + 1) * horizon >= horizon:
        assert rate(k + 1) > 1.25 * rate(1)


def test_score_windows_pools_every_window_and_reports_each():
    levels = (0.1, 0.5, 0.9)
    y = [np.array([10.0, 10.0]), np.array([10.0, 10.0])]
    exact = [np.repeat(t[:, None], 3, axis=1) for t in y]
    off = [exact[0], exact[1] + 2.0]  # window 1 is off by 2 at every level
    hist = [np.arange(12.0), np.arange(14.0)]
    out = score_windows(off, y, hist, [0, 1], season=1, levels=levels)
    # window 1: per level 2 * |2 * (1{y <= yhat} - q)| summed over 2 steps / 20; levels 0.1, 0.5, 0.9 -> 3.6, 2, 0.4
    w1 = np.mean([2 * 2 * 2 * (1 - q) / 20 for q in levels])
    assert out["crps_per_window"] == pytest.approx([0.0, w1])
    assert out["crps"] == pytest.approx(w1 * 20 / 40)  # pooled: sums over both windows
    assert out["mae"] == pytest.approx(1.0) and out["forecasts"] == 2
    assert out["mase"] == pytest.approx((0 / 1 + 2 / 1) / 2)  # seasonal error of arange = 1


def _sample_forecasts(count: int, horizon: int = 3):
    """GluonTS sample forecasts with known samples (item i: 0..99 shifted by 10 i at every step)."""
    import pandas as pd
    from gluonts.model.forecast import SampleForecast

    start = pd.Period("2020-01", freq="M")
    base = np.arange(100.0)[:, None] + np.arange(horizon)[None, :]
    return [SampleForecast(base + 10.0 * i, start_date=start) for i in range(count)]


def test_quantile_forecasts_hold_what_quantile_matrix_gives_each_forecast_to_the_bit():
    forecasts = _sample_forecasts(4)
    held = QuantileForecasts.collect(iter(forecasts), 4)  # a generator, as a predictor yields them
    assert held.values.shape == (4, 3, 9) and held.values.dtype == np.float64 and len(held) == 4
    for i, f in enumerate(forecasts):
        assert np.array_equal(held[i], quantile_matrix(f))
        assert np.array_equal(quantile_matrix(held[i]), held[i])  # a row is taken as the matrix it is
    assert np.array_equal(held.take([3, 1]).values, held.values[[3, 1]])
    assert np.array_equal(held[1:3].values, held.values[1:3])
    # scoring the array or the forecast objects gives the same metrics
    labels = [np.full(3, 50.0)] * 4
    hist = [np.arange(30.0) * (i + 1) for i in range(4)]
    as_objects = score_windows([quantile_matrix(f) for f in forecasts], labels, hist, [0, 1, 2, 3], season=2)
    as_array = score_windows(held, labels, hist, [0, 1, 2, 3], season=2, scales=seasonal_errors(hist, 2))
    assert as_array == as_objects


@pytest.mark.parametrize("given, count", [(3, 4), (5, 4)])
def test_quantile_forecasts_refuse_a_count_other_than_one_per_window(given, count):
    with pytest.raises(ConfigurationError, match="forecasts"):
        QuantileForecasts.collect(_sample_forecasts(given), count)
    with pytest.raises(ConfigurationError, match="values"):
        QuantileForecasts(np.zeros((2, 3)))


def test_seasonal_errors_are_mase_denominators_by_hand():
    # season 2: |y_t - y_{t-2}| of [1, 5, 2, 9, 4] is [1, 4, 2] -> 7/3; a constant history has error 0
    out = seasonal_errors([np.array([1.0, 5.0, 2.0, 9.0, 4.0]), np.full(6, 3.0)], 2)
    assert out[0] == pytest.approx(7 / 3) and out[1] == 0.0


# ---------------------------------------------------------------------------------------------------------
# verdict: against the best baseline, and the model or the budget as the limit
# ---------------------------------------------------------------------------------------------------------
def _report(dp: float, naive: float, non_dp: float | None = 0.01, *, ets: float | None = None,
            dp_mase: float = 0.5, naive_mase: float = 1.0, twin_mase: float = 0.5, ets_mase: float = 0.9) -> dict:
    metrics = {"dp": {"crps": dp, "mase": dp_mase}, "seasonal_naive": {"crps": naive, "mase": naive_mase}}
    if ets is not None:
        metrics["autoets"] = {"crps": ets, "mase": ets_mase}
    if non_dp is not None:
        metrics["non_dp"] = {"crps": non_dp, "mase": twin_mase}
    return {"metrics": metrics, "epsilon_budget": 1.0, "noise_multiplier": 7.6,
            "privacy_configuration": {"sampling_spec": {"num_series": 359, "bottom_level_rate": 0.05,
                                                        "context_length": 26, "prediction_length": 13,
                                                        "min_length": 41}},
            "levers": {"sigma_at_larger_epsilon": {"epsilon": 4.0, "noise_multiplier": 2.1}}}


@pytest.mark.parametrize("dp, naive, loses", [(0.0809, 0.0634, True), (0.0634, 0.0634, True),
                                              (float("nan"), 0.06, True), (0.0172, 0.0176, False),
                                              (0.001, 0.5, False)])
def test_verdict_warns_iff_private_crps_is_not_below_the_best_baseline(dp, naive, loses):
    """Twin better than every baseline: a loss is the budget's ("too small"), with the levers' numbers."""
    lines = verdict(_report(dp, naive, non_dp=0.0001))
    first = lines[0]
    assert first.startswith("VERDICT") is loses
    assert ("this budget is too small for this data" in first) is loses
    if loses:
        assert f"CRPS {dp:.4f} vs {naive:.4f} (seasonal naive" in first
        # the levers come from the numbers: sigma now and at 4x epsilon, N/r, r = (L_C + L_F)/T
        assert "7.6 at epsilon = 1" in first and "2.1 at epsilon = 4" in first
        assert "N/r = 359/0.05 = 7,180" in first and "(26 + 13)/29" in first
        assert "coarser time unit" in first
    else:
        assert first.startswith("verdict: the private model beats the best baseline")


def test_verdict_names_the_best_baseline_per_metric_and_needs_both_metrics():
    # AutoETS has the lowest CRPS, seasonal naive the lowest MASE
    report = _report(0.03, 0.05, non_dp=0.001, ets=0.04, dp_mase=0.8, naive_mase=0.85, ets_mase=0.9, twin_mase=0.1)
    first = verdict(report)[0]
    assert first.startswith("verdict: the private model beats the best baseline")
    assert "CRPS 0.0300 vs 0.0400 (AutoETS, 0.75x" in first and "MASE 0.800 vs 0.850 (seasonal naive" in first
    # better CRPS but a worse MASE than seasonal naive: not worth using
    report = _report(0.03, 0.05, non_dp=0.001, ets=0.04, dp_mase=0.86, naive_mase=0.85, twin_mase=0.1)
    first = verdict(report)[0]
    assert first.startswith("VERDICT") and "MASE 0.860 vs 0.850 (seasonal naive, 1.01x)" in first
    assert "AutoETS is better and spends no privacy" in first  # the best by CRPS is named


def test_verdict_blames_the_model_not_the_budget_when_the_twin_loses_too():
    """Issue 37: the twin (no DP) does not beat the best baseline, so a larger epsilon cannot help: not advised."""
    report = _report(0.05, 0.06, non_dp=0.045, ets=0.04, dp_mase=1.2, twin_mase=1.1, ets_mase=0.95)
    lines = verdict(report)
    first = lines[0]
    assert first.startswith("VERDICT: the model, not the budget, is the limit")
    assert "CRPS 0.0450 vs 0.0400 (AutoETS, 1.12x)" in first  # the twin's numbers
    assert "larger epsilon (" not in first and "2.1 at epsilon = 4" not in first
    assert "--season-length" in first and "this budget is too small" not in first
    # positive control: the same numbers with a twin that wins advise the budget
    winning = verdict(_report(0.05, 0.06, non_dp=0.03, ets=0.04, dp_mase=1.2, twin_mase=0.5, ets_mase=0.95))[0]
    assert "this budget is too small" in winning and "2.1 at epsilon = 4" in winning


@pytest.mark.parametrize("dp, plain, inside", [(0.012, 0.01, True), (0.013, 0.01, True), (0.0131, 0.01, False)])
def test_verdict_compares_with_the_non_dp_model_at_1_3x(dp, plain, inside):
    text = "\n".join(verdict(_report(dp, 0.5, plain)))
    assert ("within 1.3x of the same model without DP" in text) is inside
    assert ("outside 1.3x of the same model without DP" in text) is (not inside)


def test_verdict_without_the_twin_and_with_skipped_or_failed_baselines():
    lines = verdict(_report(0.05, 0.04, None))
    assert "not measured" in lines[0] and "a larger epsilon" in lines[0]
    assert "was not trained" in "\n".join(lines)
    report = {**_report(0.01, 0.04), "baselines": {"skipped": "the optional package statsforecast is not "
                                                              "installed (pip install statsforecast)",
                                                   "fallbacks": {"autoets": 0, "autotheta": 3}}}
    text = "\n".join(verdict(report))
    assert "AutoETS and AutoTheta were skipped: the optional package statsforecast is not installed" in text
    assert "AutoTheta could not be fitted to 3 window histories" in text and "AutoETS could not" not in text


# ---------------------------------------------------------------------------------------------------------
# value bound by clipping to a public range
# ---------------------------------------------------------------------------------------------------------
def test_clipping_holds_the_bound_even_after_float32_storage():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_cauchy(10_000) * 1e6, [np.nan, np.inf, -np.inf, 0.1, 0.3]])
    low, high = 0.1, 0.3  # not float32-representable: rounded inward
    lo, hi, v = clip_bounds(low, high)
    assert low <= lo < hi <= high and v == pytest.approx(0.2)
    clipped, changed = clip_values(x, low, high)
    stored = clipped.astype(np.float32).astype(np.float64)  # what the datamodule trains on
    finite = np.isfinite(stored)
    assert (stored[finite] >= low).all() and (stored[finite] <= high).all()
    assert np.isnan(stored[np.isnan(x)]).all()  # missing values stay missing
    assert changed == int(np.sum((x < lo) | (x > hi)))
    # any two clipped values differ by at most v: the (1, v) relation of Theorem G.1 holds for ANY change
    assert stored[finite].max() - stored[finite].min() <= v


def _attacker_advantage(values_d, values_d2, position, v, sigma_c, draws=3000):
    """The attacker's best single-window test between two neighbouring datasets that differ at ``position``.

    One series; the datamodule's noise augmentation is Eq. 1 with std sigma_c * v on the context. The attacker
    (who knows the code, the data but for the changed value, and - as a worst case - which window was drawn) reads
    the augmented context value at the changed position, when the window holds it, and thresholds it at the
    midpoint; otherwise guesses D. Returns the advantage |P_D(below) - P_D'(below)| *given that the window holds
    the changed value in its context* (the same windows are drawn under both datasets: same seed), i.e. the TVD the
    accountant bounds per window.
    """
    relation = NeighbouringRelation(value_bound=v)
    below = []
    for values in (values_d, values_d2):
        dm = _dm([values], context_length=6, prediction_length=2, batch_size=1, test_windows=0,
                 relation=relation, context_noise=sigma_c, seed=7)
        mid = 0.5 * (values_d[position] + values_d2[position])
        hits, inside = 0, 0
        for epoch in range(draws):
            _, starts, _ = dm.sampler.sample_indices(epoch, 0)
            offset = position + 6 - int(starts[0])  # the store pads P = 6 zeros in front of the series
            if 0 <= offset < 6:
                inside += 1
                hits += float(dm.train_batch(epoch, 0)["past_target"][0, offset]) < mid
        below.append(hits / inside)
    return abs(below[0] - below[1])


def test_attacker_breaks_the_accounted_relation_without_clipping_and_not_with_it():
    """Theorem G.1 accounts the leak of one window through TVD(N(0, s), N(1, s)) = 2 Phi(1/(2 s)) - 1 with
    s = sigma_C (the protected step moves by at most v). An attacker who knows everything but the noise changes
    one value by 1000 v (allowed by the event-level relation of raw data): without clipping, one augmented window
    tells the two datasets apart with advantage ~1, far above the accounted TVD, so the reported epsilon would be
    false. With the public range [0, v] (what `dpts fit --clip-low 0 --clip-high v` does before training) the
    advantage stays within the accounted TVD. False-failure rate: each empirical advantage is a difference of two
    means of ~1600 Bernoulli draws (the windows holding the value; sd <= 0.018); the margin 0.1 is > 5 sd
    (rate < 1e-6); seeds are fixed."""
    v, sigma_c, position = 1.0, 2.0, 3
    tau = 2 * norm.cdf(1 / (2 * sigma_c)) - 1  # 0.197, the TVD the accountant uses
    d = np.full(12, 0.5)
    d2 = d.copy()
    d2[position] += 1000 * v
    raw = _attacker_advantage(d, d2, position, v, sigma_c)
    assert raw > tau + 0.5, "without clipping the change is far larger than v and the attacker wins"
    c, c2 = clip_values(d, 0.0, v)[0], clip_values(d2, 0.0, v)[0]
    assert abs(c2[position] - c[position]) <= v
    clipped = _attacker_advantage(c, c2, position, v, sigma_c)
    # clipping moved the value by 0.5 v (<= v): at most the TVD of a shift 0.5 v, below the accounted tau
    assert clipped <= tau + 0.1


def test_noisy_count_adds_laplace_noise_of_the_stated_scale():
    """The clipped-value count is private (sensitivity w): it is released only with Laplace noise of scale w/eps.
    Mean |released - count| over 4000 draws is ~scale (Laplace's mean absolute deviation; sd of the mean ~ scale/63);
    the bounds (0.9, 1.1) x scale are > 6 sd away (false-failure rate < 1e-8); seed fixed."""
    entropy = resolve_entropy(3)
    draws = []
    for k in range(4000):
        released = noisy_count(10_000, 2, 0.1, resolve_entropy(1000 + k))
        draws.append(released["value"] - 10_000)
    assert released["laplace_scale"] == pytest.approx(20.0)
    assert 0.9 * 20 < np.mean(np.abs(draws)) < 1.1 * 20
    assert noisy_count(0, 1, 1.0, entropy)["value"] >= 0  # floored at 0 (post-processing)


def test_fit_with_rolling_windows_clipping_and_verdict_end_to_end(tiny_csv, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--model", "simple_feedforward",
                 "--epsilon", "2.0", "--delta", "1e-6", "--epochs", "1", "--batch-size", "8", "--seed", "1",
                 "--test-windows", "3", "--clip-low", "0", "--clip-high", "2000", "--context-noise", "0.5",
                 "--forecast-noise", "0.5", "--no-private-plots", "--output-dir", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    private = json.loads((out / "private" / "evaluation.json").read_text())  # computed from the private data
    assert report["test_windows"] == 3
    assert private["evaluation"]["test_windows"] == 3 and private["evaluation"]["forecasts"] == 24 * 3
    for name in ("dp", "non_dp", "seasonal_naive"):
        assert len(private["metrics"][name]["crps_per_window"]) == 3
        assert math.isfinite(private["metrics"][name]["mase"])
    assert private["verdict"] and all(line in printed for line in private["verdict"])
    metrics = private["metrics"]
    best = min(metrics[name]["crps"] for name in ("seasonal_naive", "autoets", "autotheta") if name in metrics)
    assert private["verdict"][0].startswith("VERDICT") is (metrics["dp"]["crps"] >= best)
    # clipping: the relation's v is the range, the count spends 2% of epsilon and only a noisy count is written
    assert report["privacy_configuration"]["sampling_spec"]["relation"]["value_bound"] == 2000.0
    assert report["epsilon"] == pytest.approx(report["epsilon_training"] + 0.04) and report["epsilon"] <= 2.0
    assert report["clipping"]["clipped_values_noisy"] >= 0 and "Laplace" in report["clipping"]["count_privacy"]
    assert "values clipped to the public range [0, 2000]" in printed
    assert report["bound"]["theorem"].startswith(("Theorem G.1", "Theorem 4.5"))


@pytest.mark.parametrize("args, option", [
    (["--test-windows", "0"], "--test-windows"),
    (["--clip-low", "0", "--context-noise", "1"], "--clip-low"),
    (["--clip-high", "0", "--context-noise", "1"], "--clip-high"),
    (["--clip-low", "5", "--clip-high", "1", "--context-noise", "1"], "--clip-high"),
    (["--clip-low", "0", "--clip-high", "1"], "--clip-low"),
    (["--clip-low", "0", "--clip-high", "1", "--context-noise", "1", "--value-bound", "3"], "--value-bound"),
    (["--clip-count-epsilon", "0.1"], "--clip-count-epsilon"),
    (["--clip-low", "0", "--clip-high", "1", "--context-noise", "1", "--clip-count-epsilon", "1"],
     "--clip-count-epsilon"),
])
def test_bad_evaluation_and_clipping_options_exit_2_naming_the_option(args, option, tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        main(["fit", *args, "--output-dir", str(out)])
    assert exc.value.code == 2
    assert option in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("bands, label", [(None, "private model (DP-SGD)"), (4, "private model (BandMF b=4)")])
def test_table_names_the_mechanism_that_trained_the_private_model(bands, label):
    from lightning_dpts.app.reporting import format_table

    report = {**_report(0.01, 0.02), "epsilon": 0.9, "delta": 1e-7, "steps": 10,
              "bound": {"theorem": "Theorem 4.4", "kind": "tight"}, "config": {"bands": bands}}
    report["metrics"] = {k: {**v, "mae": 1.0} for k, v in report["metrics"].items()}
    rows = format_table(report).splitlines()
    assert rows[0].startswith("private (") and rows[1].startswith("model ")
    assert rows[2].startswith(label)


# ---------------------------------------------------------------------------------------------------------
# issue 37: protocols, season length, the yardstick in dpts fit
# ---------------------------------------------------------------------------------------------------------
def _daily_csv(path, series: int = 10, days: int = 120):
    """Daily series with a weekly cycle (weekends 30% higher) and noise."""
    import pandas as pd

    rng = np.random.default_rng(7)
    stamps = pd.date_range("2021-01-04", periods=days, freq="D")
    weekend = (stamps.dayofweek >= 5).astype(float)
    frames = [pd.DataFrame({"item_id": f"s{i}", "timestamp": stamps,
                            "target": (50 + 5 * i) * (1 + 0.3 * weekend) + rng.normal(0, 2, days)})
              for i in range(series)]
    pd.concat(frames).to_csv(path, index=False)
    return path


def test_daily_data_gets_season_7_in_the_model_the_baselines_and_the_report(tmp_path, capsys):
    data = _daily_csv(tmp_path / "daily.csv")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(data), "--prediction-length", "7", "--epochs", "2", "--seed", "3",
                 "--test-windows", "2", "--no-private-plots", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    private = json.loads((out / "private" / "evaluation.json").read_text())
    model = json.loads((out / "model.json").read_text())
    assert report["seasons"] == {"season_lengths": [7], "source": "from the frequency "
                                                                  "(lightning_dpts.data.seasonality)"}
    assert "season 7 (MASE scales by 7)" in printed
    assert private["evaluation"]["season_length"] == 7 and private["evaluation"]["protocol"] == "rolling"
    assert model["constructor_arguments"]["model_kwargs"]["seasons"] == [7]  # the model reads the weekly cycle too
    # seasonal naive with intervals reads the weekly cycle: its MASE (scaled by the weekly seasonal error) is ~1,
    # a forecast ignoring the week would be far worse
    assert private["metrics"]["seasonal_naive"]["mase"] < 1.5
    if "autoets" in private["metrics"]:
        assert private["baselines"]["skipped"] is None and "autotheta" in private["metrics"]
    else:
        assert "statsforecast" in private["baselines"]["skipped"]


def test_season_length_option_and_the_last_window_protocol(tiny_csv, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--epochs", "1", "--batch-size", "8",
                 "--seed", "1", "--season-length", "6", "--evaluation", "last", "--no-baselines",
                 "--no-private-plots", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    private = json.loads((out / "private" / "evaluation.json").read_text())
    # 6 replaces the primary season; the year (12, a multiple of 6) stays as the longer one
    assert report["seasons"]["season_lengths"] == [6, 12]
    assert report["seasons"]["source"] == "given (--season-length)" and private["evaluation"]["season_length"] == 6
    assert report["evaluation_protocol"] == "last" and report["test_windows"] == 1
    assert private["evaluation"]["protocol"] == "last" and private["evaluation"]["forecasts"] == 24
    assert set(private["metrics"]) == {"dp", "non_dp", "seasonal_naive"}
    assert "AutoETS and AutoTheta were skipped: not asked for (--no-baselines)" in printed
    assert "the last window (the last H steps)" in printed


@pytest.mark.parametrize("args, option, reason", [
    (["--season-length", "0"], "--season-length", "[1, 100000]"),
    (["--season-length", "500"], "--season-length", "shortest series' training part"),
    (["--season-length", "13", "--context-length", "12"], "--season-length", "past window context_length=12"),
    (["--evaluation", "last", "--test-windows", "2"], "--test-windows", "evaluation 'last'"),
    (["--evaluation", "first"], "--evaluation", "invalid choice"),
    (["--autoets", "--no-baselines"], "--autoets", "--no-baselines"),
])
def test_bad_season_and_protocol_options_exit_2_before_anything_is_written(tiny_csv, args, option, reason,
                                                                           tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", *args, "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and option in err and reason in err
    assert not out.exists()

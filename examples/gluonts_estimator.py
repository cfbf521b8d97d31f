"""GluonTS-style private training: ``PrivateEstimator(estimator, epsilon=, delta=).train(dataset)`` -> Predictor.

The estimator is an ordinary GluonTS torch estimator; :class:`lightning_dpts.gluonts.PrivateEstimator` trains it
with differential privacy (the recipe of ``dpts fit`` for C, batch size and epochs, structured subsampling,
per-window clipping, calibrated noise, a budget the accountant enforces) and returns the estimator's own GluonTS
predictor with ``predictor.privacy_report``. The predictor is then evaluated with GluonTS' own
``make_evaluation_predictions`` and ``Evaluator`` on the last ``--windows`` windows of every series (never trained
on), next to GluonTS' ``SeasonalNaivePredictor``. These scores are computed from the data without DP: they are
for the data owner, not for publication.

The estimator here is the recipe's ``CombinationEstimator`` (what ``dpts fit`` trains: a learned combination of
classical forecasts; ``PrivateEstimator`` also averages its noisy iterates). The earlier recipe model,
``SeasonalLinearEstimator``, beat seasonal naive at epsilon = 1, delta = 1e-7 on the bundled data (seed 0: mean
wQuantileLoss 0.0068 vs 0.0181; seeds 0-4 and M4 weekly in docs/utility.md). Any estimator ``PrivateEstimator``
supports (DeepAR, SimpleFeedForward, DLinear, PatchTST) can be put in its place in ``make_estimator``, but we
measured none of them, unchanged, beating seasonal naive at epsilon
= 1 on every seed (SimpleFeedForward 0.0326 and DeepAR 0.0137 at seed 0 here; docs/benchmarks.md and
docs/utility.md), so this example does not offer them. ``PrivateEstimator`` does not apply ``seasonal_residual``;
for the wrapped models that do beat seasonal naive, see ``examples/dp_deepar.py``.

Run: ``python examples/gluonts_estimator.py [--seed 0]`` (seconds on 2 CPU cores). The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
from gluonts.dataset.common import ListDataset
from gluonts.evaluation import Evaluator, make_evaluation_predictions
from gluonts.model.seasonal_naive import SeasonalNaivePredictor
from gluonts.time_feature import get_seasonality

from lightning_dpts.data import load_dataset
from lightning_dpts.gluonts import PrivateEstimator

FREQ = "M"


def make_estimator(horizon: int, lengths: list[int], epsilon: float, delta: float, windows: int):
    """A plain GluonTS estimator: nothing privacy-specific here (the recipe's model, with the past window the recipe
    chooses from the series' lengths: public metadata)."""
    from lightning_dpts.models import CombinationEstimator
    from lightning_dpts.recipe import choose_recipe

    past = choose_recipe(lengths, freq=FREQ, prediction_length=horizon, epsilon=epsilon, delta=delta,
                         held_out_windows=windows).context_length
    return CombinationEstimator(prediction_length=horizon, context_length=past, freq=FREQ)


def evaluate(predictor, series: list[dict], horizon: int, windows: int) -> dict[str, float]:
    """GluonTS' Evaluator over the last ``windows`` rolling windows of every series."""
    forecasts, truths = [], []
    for w in range(windows):
        cut = (windows - 1 - w) * horizon  # make_evaluation_predictions forecasts the last `horizon` steps
        ds = ListDataset([{**e, "target": e["target"][: len(e["target"]) - cut]} for e in series], freq=FREQ)
        f, t = make_evaluation_predictions(ds, predictor, num_samples=100)
        forecasts += list(f)
        truths += list(t)
    agg, _ = Evaluator(num_workers=0)(iter(truths), iter(forecasts), num_series=len(forecasts))
    return {"mean_wQuantileLoss": float(agg["mean_wQuantileLoss"]), "MASE": float(agg["MASE"]),
            "sMAPE": float(agg["sMAPE"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-7)
    parser.add_argument("--prediction-length", type=int, default=12)
    parser.add_argument("--windows", type=int, default=4, help="held-out rolling windows per series")
    parser.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--seed", type=int, default=None,
                        help="experiments only: the guarantee does not hold against anyone who knows the seed")
    args = parser.parse_args()
    horizon, windows = args.prediction_length, args.windows
    if args.seed is not None:
        import lightning as L

        L.seed_everything(args.seed, verbose=False)  # the initialisation; sampling and noise get the seed too

    table = load_dataset("us_employment")  # 148 monthly series
    series = [{"item_id": item, "start": rows["timestamp"].iloc[0], "target": rows["target"].to_numpy(np.float32)}
              for item, rows in table.groupby("item_id", sort=False)]
    held_out = windows * horizon
    training = ListDataset([{**e, "target": e["target"][:-held_out]} for e in series], freq=FREQ)

    season = int(get_seasonality(FREQ))
    estimator = make_estimator(horizon, [len(e["target"]) for e in series], args.epsilon, args.delta, windows)
    private = PrivateEstimator(estimator, epsilon=args.epsilon, delta=args.delta, epochs=args.epochs,
                               seed=args.seed, trainer_kwargs={"accelerator": "cpu", "enable_progress_bar": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pandas' "'M' is deprecated" inside GluonTS
        predictor = private.train(training)  # a GluonTS PyTorchPredictor
        print(predictor.privacy_report)
        dp = evaluate(predictor, series, horizon, windows)
        naive = evaluate(SeasonalNaivePredictor(prediction_length=horizon, season_length=season), series, horizon,
                         windows)
    print(f"{'':22s}{'mean_wQuantileLoss':>20s}{'MASE':>10s}{'sMAPE':>10s}")
    for name, scores in (("private combination", dp), ("seasonal naive", naive)):
        print(f"{name:22s}{scores['mean_wQuantileLoss']:20.5f}{scores['MASE']:10.4f}{scores['sMAPE']:10.4f}")
    print(json.dumps({"model": "combination", "epsilon_budget": args.epsilon, "delta": args.delta,
                      "epsilon_spent": predictor.privacy_report.epsilon, "steps": predictor.privacy_report.steps,
                      "private": dp, "seasonal_naive": naive,
                      "beats_seasonal_naive": dp["mean_wQuantileLoss"] < naive["mean_wQuantileLoss"]}))


if __name__ == "__main__":
    main()

"""GluonTS' own loop around a private estimator: ``train(training_data, validation_data=...)`` with public validation
series, then ``evaluate_model`` with MASE and the weighted quantile loss (and ``make_evaluation_predictions``).

The bundled us_employment data (148 monthly series) is split by series: the first ``--public`` series play the part
of **public** validation data (series someone published; here the whole data set is public statistics, so the
declaration is true; in your use, declare only data that holds nothing private), the others are private training
data whose last ``--windows`` x 12 months are held out. ``validation_is_public=True`` is the deliberate declaration:
the public series' last window is scored after every epoch and the weights of the best epoch are returned (choosing
among DP epochs with public data costs no privacy). Without it, ``validation_data`` is refused: a validation loss on
private windows is a release outside the guarantee.

The scores below are computed on the held-out windows of the *private* series without DP: they are for the data
owner, not for publication.

    python examples/gluonts_validation.py [--epochs E] [--seed S]

The last line printed is JSON (read by tests/test_gluonts_estimator.py).
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
from gluonts.dataset.common import ListDataset
from gluonts.dataset.split import split
from gluonts.ev.metrics import MASE, MeanWeightedSumQuantileLoss
from gluonts.evaluation import Evaluator, make_evaluation_predictions
from gluonts.model import evaluate_model
from gluonts.model.seasonal_naive import SeasonalNaivePredictor

from lightning_dpts.data import load_dataset
from lightning_dpts.gluonts import PrivateEstimator
from lightning_dpts.models import SeasonalLinearEstimator

FREQ, HORIZON, SEASON = "M", 12, 12
QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def scores(predictor, test_data) -> dict[str, float]:
    """GluonTS' evaluate_model: MASE of the median and the mean weighted quantile loss, over every window."""
    table = evaluate_model(predictor, test_data=test_data, seasonality=SEASON,
                           metrics=[MASE(), MeanWeightedSumQuantileLoss(quantile_levels=QUANTILES)])
    return {"MASE": float(table.iloc[0, 0]), "mean_weighted_quantile_loss": float(table.iloc[0, 1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-7)
    parser.add_argument("--public", type=int, default=24, help="series used as public validation data")
    parser.add_argument("--windows", type=int, default=2, help="held-out windows per private series")
    parser.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--seed", type=int, default=None,
                        help="experiments only: the guarantee does not hold against anyone who knows the seed")
    args = parser.parse_args()
    table = load_dataset("us_employment")
    series = [{"item_id": item, "start": rows["timestamp"].iloc[0], "target": rows["target"].to_numpy(np.float32)}
              for item, rows in table.groupby("item_id", sort=False)]
    public, private = series[: args.public], series[args.public:]
    held_out = args.windows * HORIZON
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pandas' "'M' is deprecated" inside GluonTS
        full = ListDataset(private, freq=FREQ)
        training, test_template = split(full, offset=-held_out)  # GluonTS' own split: history | held-out months
        test_data = test_template.generate_instances(prediction_length=HORIZON, windows=args.windows)
        estimator = SeasonalLinearEstimator(prediction_length=HORIZON, context_length=2 * SEASON, season_length=SEASON)
        private_estimator = PrivateEstimator(estimator, epsilon=args.epsilon, delta=args.delta, epochs=args.epochs,
                                             seed=args.seed,
                                             trainer_kwargs={"accelerator": "cpu", "enable_progress_bar": False})
        predictor = private_estimator.train(training, validation_data=ListDataset(public, freq=FREQ),
                                            validation_is_public=True)
        report = predictor.privacy_report
        dp = scores(predictor, test_data)
        naive = scores(SeasonalNaivePredictor(prediction_length=HORIZON, season_length=SEASON), test_data)
        # the older GluonTS path on the last window: make_evaluation_predictions + Evaluator
        forecasts, truths = make_evaluation_predictions(full, predictor, num_samples=100)
        legacy, _ = Evaluator(quantiles=QUANTILES, num_workers=0)(truths, forecasts, num_series=len(private))
    print(report)
    print(f"validation: {report.validation}")
    print(f"{'':24s}{'MASE':>8s}{'mean wQL':>10s}")
    for name, values in (("private seasonal-linear", dp), ("seasonal naive", naive)):
        print(f"{name:24s}{values['MASE']:8.4f}{values['mean_weighted_quantile_loss']:10.5f}")
    print(json.dumps({"epsilon_spent": report.epsilon, "steps": report.steps, "validation": report.validation,
                      "risk": report.risk, "private": dp, "seasonal_naive": naive,
                      "last_window_mean_wQuantileLoss": float(legacy["mean_wQuantileLoss"])}))


if __name__ == "__main__":
    main()

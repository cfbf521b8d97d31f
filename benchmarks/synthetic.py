"""PETS synthetic data vs DP-SGD at the same (epsilon, delta): Context-FID, TSTR CRPS and wall time.

Usage::

    python benchmarks/synthetic.py [--datasets us_employment,m4_weekly] [--epsilons 0.5,1,4]
        [--m4-path /work/shared/data/m4_weekly.csv.gz] [--dp-sgd-epochs 100] [--output-dir bench-synth]

For every dataset and epsilon, one ``dpts synth`` job (:func:`lightning_dpts.jobs.synth.run_synth`, defaults
unless given) releases synthetic windows and reports, side by side in one run:

* C-FID of the initial public population and of the PETS output (the separately trained evaluation encoder);
* TSTR CRPS (mean weighted quantile loss on the last ``--horizon`` real steps of every series) of DLinear
  trained on the PETS output, of DLinear trained on the initial population, of seasonal naive, and of the same
  DLinear trained privately with DP-SGD (``dpts fit``) at the same (epsilon, delta) on the same test windows;
* wall time of the synth job (public pretraining is cached per window length in ``--output-dir`` and reused,
  so the first job of a dataset includes it and is reported separately).

Units differ, and the table says so: the PETS default protects a whole series (m windows of weight 1/m);
``dpts fit``'s default protects one time step (event level) - a weaker unit, so DP-SGD is favoured here.
M4 weekly is read from ``--m4-path`` (not shipped with the package).
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--epsilons", default="0.5,1,4")
    parser.add_argument("--m4-path", default="/work/shared/data/m4_weekly.csv.gz")
    parser.add_argument("--horizon", type=int, default=None, help="TSTR horizon (default 12 monthly, 13 weekly)")
    parser.add_argument("--length", type=int, default=None, help="window length (default 36 monthly, 39 weekly)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--num-samples", type=int, default=128)
    parser.add_argument("--unit", default="series")
    parser.add_argument("--dp-sgd-epochs", type=int, default=100, help="dpts fit epochs (0 skips DP-SGD)")
    parser.add_argument("--output-dir", default="bench-synth")
    args = parser.parse_args()

    from lightning_dpts.config import FitConfig
    from lightning_dpts.jobs.fit import run_fit
    from lightning_dpts.jobs.synth import SynthConfig, run_synth

    rows = []
    for dataset in args.datasets.split(","):
        weekly = dataset == "m4_weekly"
        data = args.m4_path if weekly else None
        horizon = args.horizon or (13 if weekly else 12)
        length = args.length or (39 if weekly else 36)
        out = Path(args.output_dir) / dataset
        for eps in (float(e) for e in args.epsilons.split(",")):
            started = time.perf_counter()
            report = run_synth(SynthConfig(data=data, length=length, prediction_length=horizon, epsilon=eps,
                                           iterations=args.iterations, num_samples=args.num_samples,
                                           unit=args.unit, output_dir=str(out), progress=False,
                                           overwrite=True),  # one directory per dataset: reuses the public models
                               log=lambda _m: None)
            seconds = time.perf_counter() - started
            tstr = report["private"]["tstr"]
            dp_crps = float("nan")
            if args.dp_sgd_epochs > 0:
                fit = run_fit(FitConfig(data=data, prediction_length=horizon, context_length=length - horizon,
                                        model="dlinear", epsilon=eps, delta=report["delta"], non_dp=False,
                                        epochs=args.dp_sgd_epochs, overwrite=True,
                                        output_dir=str(Path(args.output_dir) / f"{dataset}-dp_sgd_{eps:g}")),
                              progress=lambda _m: None)
                dp_crps = fit["private"]["metrics"]["dp"]["crps"]
            rows.append((dataset, eps, report["epsilon"], report["private"]["c_fid_initial"],
                         report["private"]["c_fid"],
                         tstr["tstr_dlinear_initial"]["crps"], tstr["tstr_dlinear"]["crps"], dp_crps,
                         tstr["seasonal_naive"]["crps"], seconds, report["public_models"]["reused"]))
            print(_format(rows[-1]), flush=True)
    print()
    print(f"unit: PETS {args.unit}-level (delta 1e-5); DP-SGD dpts fit default (event level, "
          f"{args.dp_sgd_epochs} epochs); CRPS = mean weighted quantile loss on the last horizon of every series")
    print(_header())
    for row in rows:
        print(_format(row))


def _header() -> str:
    return (f"{'dataset':14} {'eps':>5} {'eps acc':>8} {'CFID init':>10} {'CFID PETS':>10} {'TSTR init':>10} "
            f"{'TSTR PETS':>10} {'DP-SGD':>8} {'s.naive':>8} {'wall s':>7} pretrain")


def _format(row: tuple) -> str:
    dataset, eps, acc, c0, c1, t0, t1, dp, naive, seconds, reused = row
    return (f"{dataset:14} {eps:>5g} {acc:>8.4f} {c0:>10.3f} {c1:>10.3f} {t0:>10.4f} {t1:>10.4f} {dp:>8.4f} "
            f"{naive:>8.4f} {seconds:>7.1f} {'cached' if reused else 'included'}")


if __name__ == "__main__":
    main()

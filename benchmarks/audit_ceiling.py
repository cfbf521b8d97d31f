"""The white-box audit's ceiling for the modules ``dpts fit`` trains (issue 42; docs/audit.md "Auditing your model").

With nothing sampled, one canary's two worlds move the summed update by ``D = a - b`` (the canary window's clipped
gradients in its two worlds) and the best test of one step has ``mu_step = |D| / (sigma C)``, while the accountant
assumes ``|D| = 2C``. ``|D| / 2C`` is therefore the share of the accountant's mu that *any* white-box score of that
canary can show: a ceiling set by the model's gradients, not by the estimator. For every module (at ``dpts fit``'s
clipping norm) and canary design, on pieces of the bundled series, this prints the median and maximum of ``|D| /
2C`` at the initial parameters, in two windows: the audit's (a piece of ``prediction_length`` steps: the past is
padding) and a window whose whole past is observed (the canary is the forecast step, or the last past step), and
summed over the P + 1 windows of a piece that all hold a canary at its first step (|sum D| / 2kC: the accountant
then charges k = P + 1 windows), with the epsilon at delta = 1e-5 that the maximum would allow at most if it held at
every step (``gaussian_dp_epsilon(ratio * mu)``, mu the accountant's for epsilon = 8).

Run: ``OMP_NUM_THREADS=1 nice python benchmarks/audit_ceiling.py [--pieces 40]``

"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

warnings.filterwarnings("ignore")

P, H = 13, 1
#: (name, in-world value, out-world value) of the canary's step from the base value x there (scaled units)
DESIGNS = (("spike +-50", lambda x: (x + 50.0, x - 50.0)), ("level 3 vs 0", lambda x: (3.0, 0.0)),
           ("x + 20 vs x", lambda x: (x + 20.0, x)), ("x vs -x", lambda x: (x, -x)))


def _clipped(module, batch, c: float):  # noqa: ANN001
    import torch

    from lightning_dpts.training.isolated import IsolatedGradients, silenced, training_loss

    params = [p for p in module.parameters() if p.requires_grad]
    out = []
    with silenced(module):
        for i in range(batch["past_target"].shape[0]):
            loss = training_loss(module.training_step(IsolatedGradients.window(batch, i), 0))
            g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params, allow_unused=False)]).double()
            out.append(g * min(1.0, c / max(float(g.norm()), 1e-300)))
    return torch.stack(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pieces", type=int, default=40)
    args = parser.parse_args()
    from scipy.optimize import brentq

    from lightning_dpts.app.audit_models import fit_model
    from lightning_dpts.audit import gaussian_dp_epsilon
    from lightning_dpts.audit.runner import _base_series
    from lightning_dpts.audit.scores import window_batch
    from lightning_dpts.data import StructuredSubsamplingDataModule

    mu = brentq(lambda u: gaussian_dp_epsilon(u, 1e-5) - 8.0, 1e-3, 40.0)
    base = _base_series("us_employment")
    rng = np.random.default_rng(0)
    pieces = [s[i: i + P + H] for s in base for i in range(0, len(s) - P - H + 1, P + H)]
    pieces = [pieces[i] for i in rng.choice(len(pieces), args.pieces, replace=False)]
    print(f"accountant mu at epsilon 8, delta 1e-5: {mu:.3f}; {args.pieces} pieces, P={P}, H={H}")
    from lightning_dpts.recipe import MAX_GRAD_NORM, MAX_GRAD_NORMS

    combination_c = MAX_GRAD_NORMS.get("combination", MAX_GRAD_NORM)  # the recipe's C, what `dpts fit` clips at
    for name, c in (("combination", combination_c), ("combination", 0.1), ("seasonal_linear", MAX_GRAD_NORM),
                    ("dlinear", 1.0)):
        factory = fit_model(name, season_length=12) if name != "dlinear" else fit_model(name)
        for label, full, at in (("audit window (padded past)", False, -1), ("observed past", True, -1),
                                ("observed past, canary in it", True, P - 1),
                                ("first step, all windows", True, 0)):
            for design, worlds in DESIGNS:
                series = {}
                for which in (0, 1):
                    data = []
                    for x in pieces:
                        y = np.array(x if full else x[-H:], dtype=np.float64)
                        y[at] = worlds(float(x[at]))[which]
                        data.append(y.astype(np.float32))
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        series[which] = StructuredSubsamplingDataModule(
                            data, context_length=P, prediction_length=H, batch_size=len(data), test_windows=0,
                            freq="M", seed=0)
                import torch

                torch.manual_seed(0)
                module = factory(len(pieces), series[0].past_length, H)
                rows = np.arange(len(pieces))
                starts = np.full(len(pieces), P if full else 0)
                a = _clipped(module, window_batch(series[0], rows, starts), c)
                b = _clipped(module, window_batch(series[1], rows, starts), c)
                ratio = ((a - b).norm(dim=1) / (2 * c)).numpy()
                if at == 0:  # every window of the piece holds the canary: the accountant charges k = T of them
                    every = np.repeat(rows, P + 1), np.tile(np.arange(P + 1), len(pieces))
                    a = _clipped(module, window_batch(series[0], *every), c).reshape(len(pieces), P + 1, -1)
                    b = _clipped(module, window_batch(series[1], *every), c).reshape(len(pieces), P + 1, -1)
                    ratio = ((a - b).sum(1).norm(dim=1) / (2 * c * (P + 1))).numpy()
                ceiling = gaussian_dp_epsilon(float(ratio.max()) * mu, 1e-5)
                print(f"{name:16s} C={c:<4g} {label:28s} {design:14s} |D|/2C median {np.median(ratio):.3f} "
                      f"max {ratio.max():.3f} -> epsilon ceiling {ceiling:.2f} of 8", flush=True)


if __name__ == "__main__":
    main()

"""Release a DP synthetic dataset with PETS (Private Evolution), then inspect the privacy numbers.

Run from the repository root::

    python examples/synthetic_pets.py

Uses the bundled us_employment data as the private dataset, public pretraining on the rule-based generator's
output (cached in the output directory), series-level privacy (each series votes with total weight 1) and
(epsilon, delta) = (1, 1e-5) with ``dpts synth``'s defaults (one round, threshold one noise std). It needs
about 21 s of CPU, public pretraining of a first run included (measured: 2 min 49 s wall on a 2-core machine
shared at load average 14-16, so mostly waiting; see docs/synthetic.md) and prints how long it took.
``synthetic.csv.gz`` is the release; the C-FID, TSTR and verdict lines printed at the end are computed from the
private data and are for you, not for publication.
"""

from __future__ import annotations

import time

from lightning_dpts.app.jobs.synth import SynthConfig, run_synth
from lightning_dpts.synthetic import PETSAccountant, theorem_2_epsilon


def main() -> None:
    started = time.perf_counter()
    config = SynthConfig(epsilon=1.0, delta=1e-5, num_samples=128, length=36, prediction_length=12,
                         unit="series", max_windows_per_series=4, output_dir="pets-example",
                         overwrite=True)  # a re-run replaces the earlier run's files (keeps the public models)
    report = run_synth(config)

    sigma, rounds = report["noise_multiplier"], report["iterations"]
    print(f"noise multiplier {sigma:.3f} over {rounds} round(s): PLD epsilon "
          f"{PETSAccountant(sigma).epsilon(rounds, 1e-5):.4f}, Theorem 2 closed form "
          f"{theorem_2_epsilon(1e-5, sigma, rounds):.4f}")
    evaluation = report["private"]  # computed from the private data: for the data owner, not for publication
    print(f"C-FID {evaluation['c_fid']:.3f} vs initial public population {evaluation['c_fid_initial']:.3f}")
    for name, scores in evaluation["tstr"].items():
        print(f"TSTR {name:22} CRPS {scores['crps']:.4f}")
    print("release: pets-example/synthetic.csv.gz (train on it: dpts fit --data pets-example/synthetic.csv.gz)")
    print(f"took {time.perf_counter() - started:.0f} s wall")


if __name__ == "__main__":
    main()

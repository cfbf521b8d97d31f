"""Release a DP synthetic dataset with PETS (Private Evolution), then inspect the privacy numbers.

Run from the repository root::

    python examples/synthetic_pets.py

Uses the bundled us_employment data as the private dataset, public pretraining on the rule-based generator's
output (cached in the output directory), series-level privacy (each series votes with total weight 1) and
(epsilon, delta) = (1, 1e-5) over 6 rounds. ``synthetic.csv.gz`` is the release; the C-FID and TSTR numbers
printed at the end are computed from the private data and are for you, not for publication.
"""

from __future__ import annotations

from lightning_dpts.jobs.synth import SynthConfig, run_synth
from lightning_dpts.synthetic import PETSAccountant, theorem_2_epsilon


def main() -> None:
    config = SynthConfig(epsilon=1.0, delta=1e-5, iterations=6, num_samples=128, length=36, prediction_length=12,
                         unit="series", max_windows_per_series=4, output_dir="pets-example",
                         overwrite=True)  # a re-run replaces the earlier run's files (keeps the public models)
    report = run_synth(config)

    sigma = report["noise_multiplier"]
    print(f"noise multiplier {sigma:.3f}: PLD epsilon {PETSAccountant(sigma).epsilon(6, 1e-5):.4f}, "
          f"Theorem 2 closed form {theorem_2_epsilon(1e-5, sigma, 6):.4f}")
    evaluation = report["private"]  # computed from the private data: for the data owner, not for publication
    print(f"C-FID {evaluation['c_fid']:.3f} vs initial public population {evaluation['c_fid_initial']:.3f}")
    for name, scores in evaluation["tstr"].items():
        print(f"TSTR {name:22} CRPS {scores['crps']:.4f}")
    print("release: pets-example/synthetic.csv.gz (train on it: dpts fit --data pets-example/synthetic.csv.gz)")


if __name__ == "__main__":
    main()

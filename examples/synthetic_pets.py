"""Release a DP synthetic dataset with PETS (Private Evolution), then inspect the privacy numbers.

Run::

    python examples/synthetic_pets.py [--output-dir DIR]

It writes only under ``--output-dir`` (default: a new temporary directory, whose path it prints); running it again
with the same directory replaces the earlier run's files and reuses the public pretrained models.

Uses the bundled us_employment data as the private dataset, public pretraining on the rule-based generator's
output (cached in the output directory), series-level privacy (each series votes with total weight 1) and
(epsilon, delta) = (1, 1e-5) with ``dpts synth``'s defaults (one round, threshold one noise std). It needs
a few minutes on 2 CPU cores, public pretraining of a first run included, and prints how long it took.
``synthetic.csv.gz`` is the release; the C-FID, TSTR and verdict lines printed at the end are computed from the
private data and are for you, not for publication.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lightning_dpts.app.jobs.synth import SynthConfig, run_synth
from lightning_dpts.synthetic import PETSAccountant, theorem_2_epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", help="run directory (default: a new temporary directory)")
    parser.add_argument("--fast", action="store_true", help="tiny settings that check the example runs (tests)")
    args = parser.parse_args()
    out = Path(args.output_dir or tempfile.mkdtemp(prefix="dpts-pets-example-"))
    fast = dict(num_samples=16, pretrain_epochs=(1, 1), num_public=128, tstr_steps=5, progress=False) if args.fast \
        else {}
    started = time.perf_counter()
    config = SynthConfig(epsilon=1.0, delta=1e-5, length=36, prediction_length=12, unit="series",
                         max_windows_per_series=4, output_dir=str(out), overwrite=True,  # a re-run replaces the
                         **{"num_samples": 128, **fast})  # earlier run's files (keeps the public models)
    report = run_synth(config)

    sigma, rounds = report["noise_multiplier"], report["iterations"]
    print(f"noise multiplier {sigma:.3f} over {rounds} round(s): PLD epsilon "
          f"{PETSAccountant(sigma).epsilon(rounds, 1e-5):.4f}, Theorem 2 closed form "
          f"{theorem_2_epsilon(1e-5, sigma, rounds):.4f}")
    evaluation = report["private"]  # computed from the private data: for the data owner, not for publication
    print(f"C-FID {evaluation['c_fid']:.3f} vs initial public population {evaluation['c_fid_initial']:.3f}")
    for name, scores in evaluation["tstr"].items():
        print(f"TSTR {name:22} CRPS {scores['crps']:.4f}")
    print(f"release: {out / 'synthetic.csv.gz'} (standardised values; dpts synth --value-range LO HI writes the "
          "data's units)")
    print(f"took {time.perf_counter() - started:.0f} s wall")


if __name__ == "__main__":
    main()

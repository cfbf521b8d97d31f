"""Writes tests/data/data/batches_before_i30.json: seeded training batches (series and start positions, and a
checksum of the augmented targets) of every top x bottom level, computed by the code of main before issue 30.

    PYTHONPATH=/work/main python tests/data/make_before_batches.py

tests/data/test_scheme_batches.py compares them with == (the mechanism objects draw exactly the same batches).
"""

from __future__ import annotations

import json
import pathlib
import sys
import warnings

import numpy as np

OUT = pathlib.Path(__file__).parent / "data" / "batches_before_i30.json"
LENGTHS = [30, 31, 35, 40, 44, 50, 52, 60, 61, 63, 70, 80]


def configurations() -> list[dict]:
    out = []
    for top in ("iteration", "shuffling", "without_replacement", "poisson"):
        for bottom in ("with_replacement", "poisson"):
            for lam in (1, 2):
                out.append({"top_level": top, "bottom_level": bottom, "instances_per_series": lam,
                            "batch_size": 4 * lam})
    out.append({"top_level": "b_min_sep", "bands": 3, "batch_size": 4})
    out.append({"top_level": "without_replacement", "batch_size": 4, "context_noise": 0.5, "forecast_noise": 0.25,
                "value_bound": 2.0})
    return out


def batches(config: dict) -> dict:
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.privacy import NeighbouringRelation

    kw = dict(config)
    bound = kw.pop("value_bound", None)
    series = [np.sin(np.arange(n) / 3.0) + n for n in LENGTHS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(series, context_length=6, prediction_length=3, test_windows=0, seed=11,
                                             relation=NeighbouringRelation(value_bound=bound), **kw)
    out: dict = {"config": config, "steps": []}
    for epoch in (0, 1):
        for step in range(dm.steps_per_epoch):
            batch = dm.train_batch(epoch, step)
            rows, starts, _ = dm.sampler.sample_indices(epoch, step)
            out["steps"].append({"epoch": epoch, "step": step, "rows": rows.tolist(), "starts": starts.tolist(),
                                 "past_sum": float(batch["past_target"].double().sum()),
                                 "future_sum": float(batch["future_target"].double().sum())})
    return out


def main() -> None:
    table = [batches(c) for c in configurations()]
    OUT.write_text(json.dumps(table) + "\n")
    print(f"{len(table)} configurations -> {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()

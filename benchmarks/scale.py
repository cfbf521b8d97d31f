"""Data at scale (issue 41): peak memory, load time and steps/s of a fit from the memory-mapped series store.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/scale.py [--sizes 15M,150M] [--steps 40] [--batch 256]
        [--dir /tmp/dpts-scale] [--ingest] [--accountant] [--keep] [--fit-job [--fit-args "..."]]

Data (synthetic, of realistic shape): hourly "traffic-like" occupancy rates in [0, 1] (a per-sensor level, a
weekday profile with two rush hours, a weekend profile, multiplicative noise, 0.5% missing values): ``15M`` is the
paper's traffic shape, 862 sensors x 17,544 hours (15.1 M values, 60 MB as float32); ``150M`` is ten times the
sensors (8,620 x 17,544, 151 M values, 605 MB). The store is written series by series
(:class:`~lightning_dpts.data.store.SeriesStoreWriter`, constant memory) before any measurement.

Per size and per kind (``plain``: the Lightning loop without DP on the same datamodule; ``dp``:
``DPForecastStrategy(noise_multiplier=3, max_grad_norm=1)`` with ``AccountantCallback(8, 1e-6)``), one fresh
subprocess: a GluonTS SimpleFeedForward (context 96, horizon 24, 2 x 64 hidden) trained for ``--steps`` steps of
Lambda = ``--batch`` windows (one per sampled series, top level without replacement, one held-out test window) by a
quiet CPU Trainer. It reports

* ``load``: opening the store and building the datamodule (the store's finiteness check reads every value once);
* ``first``: from ``trainer.fit`` to the end of the first (noisy) step (set-up, accountant, probe included);
* ``steps/s``: over the steps after the first;
* ``peak``: the process's peak resident set (``ru_maxrss``: imports, model, mapped pages touched, batches), and
  ``(peak - fixed) / raw``, where ``fixed`` is the peak of the same fit on a small store of the same kind
  (862 x 1,000 values): the memory that grows with the data, per byte of raw float32 data (target <= 2).

``--memory`` adds the kind ``memory``: the plain loop on the in-memory datamodule (the series as a list of numpy
arrays, the path every other input takes), for comparison. ``--ingest`` also converts a long-format Parquet file
(item_id, timestamp, target; one row group per series) of the same data into a store in a fresh subprocess and
reports its time and peak (``store_from_file``, a million rows at a time). ``--accountant`` builds datamodules
over stores of 10^5 series with 10^3 distinct lengths (60..1059; context 500, horizon 24) and counts the
accountant's work (the per-length privacy profiles it evaluates, sigma 3) and its time for epsilon after 1,000
steps, against 10^3 series with the same lengths, for both bottom levels.

``--fit-job`` runs the whole ``dpts fit`` job (``python -m lightning_dpts.app.cli fit --data <store>`` and
``--fit-args``, default ``FIT_ARGS``: one epoch of SimpleFeedForward, Lambda 256, at epsilon 8, the non-DP twin,
seasonal naive on every held-out window, the report and the private plot; AutoETS/AutoTheta are left out by default:
they cost the same CPU time at every size, capped by ``--baseline-windows``) as a subprocess of a fresh child, and
reports its wall time and peak resident set (the child's ``RUSAGE_CHILDREN``), over the raw size and as
(peak - fixed) / raw with ``fixed`` the same job on the small store.

Every measurement runs in its own subprocess; run one size at a time on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

HERE = Path(__file__).resolve().parent
SIZES = {"15M": (862, 17_544), "150M": (8_620, 17_544), "small": (862, 1_000)}
CONTEXT, PREDICTION = 96, 24
EPSILON, DELTA, SIGMA = 8.0, 1e-6, 3.0


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_store(path: Path, sensors: int, hours: int, seed: int = 0) -> dict:
    """Hourly traffic-like occupancy: ``sensors`` series of ``hours`` values, written one series at a time."""
    import numpy as np
    import pandas as pd

    from lightning_dpts.data.store import SeriesStoreWriter

    rng = np.random.default_rng(seed)  # the *data* (synthetic, public): fixed
    t = np.arange(hours)
    hour, day = t % 24, (t // 24) % 7
    rush = np.exp(-0.5 * ((hour - 8) / 1.5) ** 2) + 0.8 * np.exp(-0.5 * ((hour - 17.5) / 2.0) ** 2)
    weekend = 0.35 * np.exp(-0.5 * ((hour - 14) / 3.0) ** 2)
    profile = np.where(day < 5, 0.02 + rush, 0.02 + weekend)
    start = pd.Period("2015-01-01 00:00", freq="h")
    begin = time.perf_counter()
    with SeriesStoreWriter(path, "h", overwrite=True) as writer:
        for n in range(sensors):
            level = rng.beta(2.0, 12.0)
            values = level * profile * rng.lognormal(0.0, 0.25, hours) + 0.003 * rng.random(hours)
            values = np.clip(values, 0.0, 1.0)
            values[rng.random(hours) < 0.005] = np.nan
            writer.add(f"sensor_{n}", values, start)
    return {"seconds": time.perf_counter() - begin, "peak_mib": _peak_mib()}


def fit_child(store: str, kind: str, steps: int, batch: int) -> dict:
    """One fit in this (fresh) process: load time, first-step time, steps/s, peak resident set."""
    import lightning as L
    import torch
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule
    from lightning.pytorch.callbacks import Callback

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    torch.manual_seed(0)
    module = SimpleFeedForwardLightningModule(
        model_kwargs=dict(prediction_length=PREDICTION, context_length=CONTEXT, hidden_dimensions=[64, 64]))
    begin = time.perf_counter()
    data: object = store
    if kind == "memory":  # the in-memory path (a list of arrays, padded window arrays), for comparison
        from lightning_dpts.data.store import SeriesStore

        mapped = SeriesStore(store)
        data = [mapped.series(n).copy() for n in range(mapped.num_series)]
        del mapped
    dm = StructuredSubsamplingDataModule(data, batch_size=batch, instances_per_series=1, model=module,
                                         top_level="without_replacement", test_windows=1)
    load = time.perf_counter() - begin
    ends: list[float] = []

    class Clock(Callback):
        def on_train_batch_end(self, *args) -> None:
            ends.append(time.perf_counter())

    callbacks: list[Callback] = [Clock()]
    if kind == "dp":
        callbacks = [DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=1.0), AccountantCallback(EPSILON, DELTA),
                     *callbacks]
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=callbacks)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    if trainer.global_step != steps:
        raise RuntimeError(f"{kind}: {trainer.global_step} of {steps} steps")
    source = dm.collection
    if kind == "memory":
        source = type("Sizes", (), {"num_series": source.num_series,
                                    "num_values": sum(len(t) for t in source.targets)})()
        source.nbytes = 4 * source.num_values
    return {"load": load, "first": ends[0] - start, "steps_per_s": (len(ends) - 1) / (ends[-1] - ends[0]),
            "peak_mib": _peak_mib(), "raw_mib": source.nbytes / 2**20, "series": source.num_series,
            "values": source.num_values}


#: ``dpts fit`` options of ``--fit-job`` (the rest are the job's defaults).
FIT_ARGS = "--model simple_feedforward --batch-size 256 --epsilon 8 --epochs 1 --no-baselines"


def fit_job_child(store: str, out: str, options: str) -> dict:
    """``dpts fit`` on ``store`` as a subprocess of this (fresh) process: wall time, its peak resident set."""
    import shlex

    from lightning_dpts.data.store import SeriesStore

    cmd = [sys.executable, "-m", "lightning_dpts.app.cli", "fit", "--data", store, "--output-dir", out,
           "--overwrite", *shlex.split(options)]
    import tempfile

    first = float("nan")  # when the job printed its first step line (imports, loading, calibration included; the
    # job prints a line per tenth of the steps, so this is after the first noisy step, not at it)
    with tempfile.TemporaryFile("w+") as errors:
        begin = time.perf_counter()
        job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert job.stdout is not None
        for line in job.stdout:
            if first != first and line.lstrip().startswith("step "):
                first = time.perf_counter() - begin
        code = job.wait()
        seconds = time.perf_counter() - begin
        if code != 0:
            errors.seek(0)
            raise RuntimeError(f"dpts fit exit {code}: {errors.read()[-3000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    store_ = SeriesStore(store)
    result = {"seconds": seconds, "first_step_s": first, "peak_mib": peak, "raw_mib": store_.nbytes / 2**20,
              "values": store_.num_values}
    (Path(out).parent / f"fit-job-{Path(store).stem}.json").write_text(json.dumps(result))  # kept after the run
    return result


def ingest_child(source: str, out: str) -> dict:
    from lightning_dpts.data.store import store_from_file

    begin = time.perf_counter()
    store = store_from_file(source, out, overwrite=True)
    return {"seconds": time.perf_counter() - begin, "peak_mib": _peak_mib(), "raw_mib": store.nbytes / 2**20}


def long_parquet_child(store: str, out: str) -> dict:
    """The store as a long-format Parquet file (item_id, timestamp, value), written row group by row group."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lightning_dpts.data.store import SeriesStore

    s = SeriesStore(store)
    schema = pa.schema([("item_id", pa.string()), ("timestamp", pa.timestamp("s")), ("target", pa.float32())])
    with pq.ParquetWriter(out, schema) as writer:
        for n in range(s.num_series):
            size = int(s.lengths[n])
            first = s.starts[n].to_timestamp().value // 10**9  # type: ignore[index]
            stamps = (first + 3600 * np.arange(size)).astype("datetime64[s]")
            writer.write_table(pa.table({"item_id": pa.array([s.item_ids[n]] * size),
                                         "timestamp": pa.array(stamps), "target": pa.array(s.series(n))},
                                        schema=schema))
    return {"bytes": os.path.getsize(out)}


def accountant_child(directory: str) -> dict:
    """Accountant work and time at 10^5 series with 10^3 distinct lengths, against 10^3 series with those lengths."""
    import numpy as np

    import lightning_dpts.privacy.bounds as bounds
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.data.store import SeriesStoreWriter
    from lightning_dpts.privacy import StructuredSubsamplingAccountant

    calls = {"members": 0}
    for name in ("_single_length_profile", "_poisson_unit_profile"):
        original = getattr(bounds, name)

        def counted(*args, _original=original, **kwargs):
            calls["members"] += 1
            return _original(*args, **kwargs)

        setattr(bounds, name, counted)
    out = {}
    rng = np.random.default_rng(0)
    for num in (10**3, 10**5):
        path = Path(directory) / f"lengths_{num}.arrow"
        lengths = 60 + np.arange(num) % 1000  # 10^3 distinct lengths, 60..1059
        with SeriesStoreWriter(path, None, overwrite=True) as writer:
            for n, size in enumerate(lengths.tolist()):
                writer.add(f"s{n}", rng.standard_normal(size).astype(np.float32))
        row = {}
        for bottom in ("with_replacement", "poisson"):
            begin = time.perf_counter()
            dm = StructuredSubsamplingDataModule(str(path), context_length=500, prediction_length=24, batch_size=64,
                                                 instances_per_series=1, bottom_level=bottom, test_windows=1)
            built = time.perf_counter() - begin
            calls["members"] = 0
            begin = time.perf_counter()
            eps = StructuredSubsamplingAccountant(dm.sampling_spec, SIGMA).epsilon(1000, DELTA)
            row[bottom] = {"datamodule_s": built, "accountant_s": time.perf_counter() - begin,
                           "members": calls["members"], "distinct": len(dm.sampling_spec.distinct_lengths),
                           "epsilon": eps}
        out[num] = row
        path.unlink()
    return out


def _child(mode: str, *args: object) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([mode, *args])]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} {args}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_jobs(directory: Path, small: Path, sizes: list[str], options: str, keep: bool) -> None:
    """``--fit-job``: the whole ``dpts fit`` job per size, against the same job on the small store."""
    out = directory / "fit-run"
    fixed = _child("fitjob", str(small), str(out), options)
    print(f"dpts fit {options}: fixed (862 x 1,000 values) peak {fixed['peak_mib']:.0f} MiB, "
          f"{fixed['seconds']:.0f} s")
    print(f"{'size':>5} {'values':>12} {'raw MiB':>8} {'step s':>8} {'wall s':>7} {'peak MiB':>9} {'peak/raw':>9} "
          f"{'(peak-fixed)/raw':>17}")
    for size in sizes:
        path = directory / f"traffic_{size}.arrow"
        if not path.exists():
            _child("make", str(path), *SIZES[size])
        r = _child("fitjob", str(path), str(out), options)
        print(f"{size:>5} {r['values']:>12,} {r['raw_mib']:>8.0f} {r.get('first_step_s', float('nan')):>8.0f} "
              f"{r['seconds']:>7.0f} {r['peak_mib']:>9.0f} "
              f"{r['peak_mib'] / r['raw_mib']:>9.2f} {(r['peak_mib'] - fixed['peak_mib']) / r['raw_mib']:>17.2f}",
              flush=True)
        if not keep:
            path.unlink()
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    if not keep:
        small.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="15M")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dir", default="/tmp/dpts-scale")
    parser.add_argument("--ingest", action="store_true")
    parser.add_argument("--accountant", action="store_true")
    parser.add_argument("--memory", action="store_true", help="also the in-memory datamodule (a list of arrays)")
    parser.add_argument("--keep", action="store_true", help="keep the stores for another run")
    parser.add_argument("--fit-job", action="store_true", help="only the whole dpts fit job (see the docstring)")
    parser.add_argument("--fit-args", default=FIT_ARGS, help=f"dpts fit options of --fit-job (default {FIT_ARGS!r})")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        mode, *rest = json.loads(args.child)
        fn = {"make": lambda p, n, t: make_store(Path(p), n, t), "fit": fit_child, "ingest": ingest_child,
              "long": long_parquet_child, "accountant": accountant_child, "fitjob": fit_job_child}[mode]
        print(json.dumps(fn(*rest)))
        return
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}; steps {args.steps}, Lambda {args.batch}, SimpleFeedForward "
          f"context {CONTEXT} horizon {PREDICTION}, CPU, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    small = directory / "small.arrow"
    if not small.exists():
        _child("make", str(small), *SIZES["small"])
    if args.fit_job:
        fit_jobs(directory, small, args.sizes.split(","), args.fit_args, args.keep)
        return
    sizes = [size for size in args.sizes.split(",") if size]  # --sizes "": only --accountant
    unknown = [size for size in sizes if size not in SIZES]
    if unknown:
        parser.error(f"--sizes: unknown {unknown}; accepted: {', '.join(SIZES)} (comma-separated) or empty")
    fixed = ({kind: _child("fit", str(small), kind, args.steps, args.batch)["peak_mib"] for kind in ("plain", "dp")}
             if sizes else {})
    if sizes:
        print(f"fixed (862 x 1,000 values): peak plain {fixed['plain']:.0f} MiB, dp {fixed['dp']:.0f} MiB")
    header = (f"{'size':>5} {'kind':>5} {'series':>7} {'values':>12} {'raw MiB':>8} {'make s':>7} {'load s':>7} "
              f"{'first s':>8} {'steps/s':>8} {'peak MiB':>9} {'peak/raw':>9} {'(peak-fixed)/raw':>17}")
    for size in sizes:
        path = directory / f"traffic_{size}.arrow"
        made = _child("make", str(path), *SIZES[size]) if not path.exists() else {"seconds": float("nan")}
        kinds = ("plain", "dp", "memory") if args.memory else ("plain", "dp")
        rows = {kind: _child("fit", str(path), kind, args.steps, args.batch) for kind in kinds}
        print(header)
        for kind, r in rows.items():
            print(f"{size:>5} {kind:>5} {r['series']:>7,} {r['values']:>12,} {r['raw_mib']:>8.0f} "
                  f"{made['seconds']:>7.1f} {r['load']:>7.2f} {r['first']:>8.2f} {r['steps_per_s']:>8.2f} "
                  f"{r['peak_mib']:>9.0f} {r['peak_mib'] / r['raw_mib']:>9.2f} "
                  f"{(r['peak_mib'] - fixed[kind if kind == 'dp' else 'plain']) / r['raw_mib']:>17.2f}")
        p, d = rows["plain"], rows["dp"]
        print(f"{size:>5} dp/plain: steps/s {d['steps_per_s'] / p['steps_per_s']:.3f}, peak "
              f"{d['peak_mib'] / p['peak_mib']:.3f}, first step {d['first'] / p['first']:.2f}")
        if args.ingest:
            parquet = directory / f"traffic_{size}_long.parquet"
            _child("long", str(path), str(parquet))
            ing = _child("ingest", str(parquet), str(directory / "ingested.arrow"))
            print(f"  ingest long Parquet ({os.path.getsize(parquet) / 2**20:.0f} MiB, {p['values']:,} rows) -> "
                  f"store: {ing['seconds']:.1f} s, peak {ing['peak_mib']:.0f} MiB = "
                  f"{ing['peak_mib'] / ing['raw_mib']:.1f} x raw")
            parquet.unlink()
            (directory / "ingested.arrow").unlink()
        if not args.keep:
            path.unlink()
    if args.accountant:
        acc = _child("accountant", str(directory))
        print("accountant (epsilon after 1000 steps, sigma 3): series, bottom level, distinct lengths, profiles "
              "evaluated, datamodule s, accountant s")
        for num, row in acc.items():
            for bottom, r in row.items():
                print(f"  {int(num):>7,} {bottom:>16} {r['distinct']:>5} {r['members']:>4} "
                      f"{r['datamodule_s']:>7.2f} {r['accountant_s']:>7.2f}  eps {r['epsilon']:.4g}")
    if not args.keep:
        small.unlink(missing_ok=True)


if __name__ == "__main__":
    main()

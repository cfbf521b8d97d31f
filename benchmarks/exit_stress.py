"""Clean exits under load (issue 38): no process that trained with the plugin may abort at exit.

Usage::

    python benchmarks/exit_stress.py [--runs 100] [--parallel 6]

Starts ``--runs`` child processes, ``--parallel`` at a time (they load the machine), each of which trains the
default ``seasonal_linear`` on the bundled ``us_employment`` with ``DPForecastStrategy`` and ``AccountantCallback``
for 3 optimizer steps of a planned 5,000-epoch run (an early stop: the epsilon table's thread, which computes up
to the plan, is still running at train end), with the noise drawn in its background thread, prints ``success``
and returns from ``main``. Before issue 38 about 1 in 8 such processes aborted after printing success (SIGABRT,
exit 134, "terminate called without an active exception": the table's daemon thread was inside scipy's C++ FFT
when the interpreter finalised). Printed: the exit codes and how many printed success, with the load average.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time


def child() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    import lightning as L

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset
    from lightning_dpts.models import SeasonalLinearEstimator
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, noisy_step

    noisy_step._spare_core = lambda: True  # the noise's background thread runs (as with a spare core)
    table = load_dataset("us_employment")
    lengths = table.groupby("item_id").size()
    module = SeasonalLinearEstimator(prediction_length=12, context_length=24, season_length=12
                                     ).create_lightning_module()
    dm = StructuredSubsamplingDataModule(table[table.item_id.isin(lengths.index[lengths >= 100])], freq="M",
                                         model=module, batch_size=16, test_windows=4)

    class Stop(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
            trainer.should_stop = trainer.global_step >= 3

    trainer = L.Trainer(max_epochs=5000, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False,
                        callbacks=[DPForecastStrategy(noise_multiplier=3.0, max_grad_norm=0.1),
                                   AccountantCallback(epsilon=1000.0, delta=1e-7), Stop()])
    trainer.fit(module, datamodule=dm)
    print("success", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    codes: collections.Counter[int] = collections.Counter()
    successes, aborted_after_success = 0, 0
    started, load = time.perf_counter(), [os.getloadavg()[0]]
    running: list[subprocess.Popen] = []
    launched = 0
    while launched < args.runs or running:
        while launched < args.runs and len(running) < args.parallel:
            running.append(subprocess.Popen([sys.executable, __file__, "--child"], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True))
            launched += 1
        proc = running.pop(0)
        out, err = proc.communicate()
        codes[proc.returncode] += 1
        success = "success" in out
        successes += success
        aborted_after_success += success and proc.returncode != 0
        if proc.returncode != 0:
            print(f"run exited {proc.returncode}: {err.strip().splitlines()[-1:] if err.strip() else ''}", flush=True)
        load.append(os.getloadavg()[0])
    print(f"{args.runs} runs, {args.parallel} at a time: exit codes {dict(codes)}; {successes} printed success, "
          f"{aborted_after_success} of them then exited non-zero; load average {min(load):.1f}-{max(load):.1f}; "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

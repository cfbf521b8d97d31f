"""Windows per second: StructuredSubsamplingDataModule vs GluonTS's own DeepAR training data loader.

Both pipelines produce DeepAR training batches (past/future target and observed values, time + age
features, dummy static features) for the same series (the training parts of the bundled ``us_employment``
data), the same window geometry (past_length = context_length + max(lags_seq), prediction_length) and the
same batch size. GluonTS uses ``DeepAREstimator.create_transformation()`` (features, computed once and
cached, as in ``estimator.train``) followed by its training loader: ``InstanceSplitter`` with
``ExpectedNumInstanceSampler`` and stacked batches. Measurements alternate between the two pipelines in one
run; the best of ``--repeats`` rounds is reported.

Run: ``python benchmarks/datamodule.py [--batches 200] [--batch-size 32] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

warnings.filterwarnings("ignore")
logging.getLogger("lightning").setLevel(logging.ERROR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="batches per timed round")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--context-length", type=int, default=24)
    parser.add_argument("--prediction-length", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from gluonts.dataset.common import ListDataset
    from gluonts.itertools import Cached
    from gluonts.torch.model.deepar import DeepAREstimator

    from lightning_dpts.data import StructuredSubsamplingDataModule

    estimator = DeepAREstimator(
        freq="M",
        prediction_length=args.prediction_length,
        context_length=args.context_length,
        batch_size=args.batch_size,
        num_batches_per_epoch=args.batches,
        hidden_size=8,
        num_layers=1,
    )
    transformation = estimator.create_transformation()
    module = estimator.create_lightning_module()

    dm = StructuredSubsamplingDataModule(
        "us_employment",
        batch_size=args.batch_size,
        model=module,
        top_level="without_replacement",
        bottom_level="with_replacement",
        seed=0,
    )
    # The same training parts for GluonTS.
    entries = [
        {"target": target[:length, 0], "start": start, "item_id": item}
        for target, length, start, item in zip(
            dm.collection.targets, dm.train_lengths, dm.collection.starts, dm.collection.item_ids, strict=True
        )
    ]
    dataset = ListDataset(entries, freq="M")
    transformed = Cached(transformation.apply(dataset, is_train=True))
    for _ in transformed:  # fill the cache: features are computed once, as in GluonTS training
        pass

    def run_gluonts() -> float:
        loader = estimator.create_training_data_loader(transformed, module)
        t0 = time.perf_counter()
        windows = 0
        for batch in loader:
            windows += batch["past_target"].shape[0]
        return windows / (time.perf_counter() - t0)

    def run_datamodule() -> float:
        t0 = time.perf_counter()
        windows = 0
        step, epoch = 0, 0
        for _ in range(args.batches):
            batch = dm.train_batch(epoch, step)
            windows += batch["past_target"].shape[0]
            step += 1
            if step == dm.steps_per_epoch:
                step, epoch = 0, epoch + 1
        return windows / (time.perf_counter() - t0)

    run_gluonts(), run_datamodule()  # warm-up
    ours, theirs = [], []
    for _ in range(args.repeats):
        theirs.append(run_gluonts())
        ours.append(run_datamodule())
    best_ours, best_theirs = max(ours), max(theirs)
    print(
        f"geometry: past_length={dm.past_length} (context {dm.context_length} + max lag "
        f"{dm.past_length - dm.context_length}), prediction_length={dm.prediction_length}, "
        f"batch_size={args.batch_size}, {dm.num_series} series, "
        f"{args.batches} batches x {args.repeats} rounds"
    )
    print(f"GluonTS InstanceSplitter+ExpectedNumInstanceSampler loader: {best_theirs:12,.0f} windows/s")
    print(f"StructuredSubsamplingDataModule:                          {best_ours:12,.0f} windows/s")
    print(f"ratio (datamodule / GluonTS): {best_ours / best_theirs:.1f}x")


if __name__ == "__main__":
    main()

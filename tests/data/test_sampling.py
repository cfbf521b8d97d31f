"""Statistical and exact checks that the training sampling is the one the theorems analyse.

Every statistical check is a two-sided z-test at 5 standard errors with a fixed seed, so its false-failure
rate (the probability that a correct implementation fails, over the choice of seed) is about 5.7e-7 per
check; with the fixed seeds used here the outcome is deterministic.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_dpts.privacy.spec import NeighbouringRelation

from .conftest import L_F, P_LEN, id_series, make_dm

Z = 5.0  # two-sided z bound; P(|N(0,1)| > 5) ~= 5.7e-7


def assert_mean(samples: np.ndarray, expected: float, variance: float | None = None) -> None:
    """Two-sided z-test of the sample mean (sample variance unless the exact one is given)."""
    samples = np.asarray(samples, dtype=np.float64)
    var = samples.var(ddof=1) if variance is None else variance
    se = math.sqrt(var / len(samples))
    z = (samples.mean() - expected) / se
    assert abs(z) < Z, f"mean {samples.mean():.5f} vs expected {expected:.5f} (z = {z:.2f})"


def covering(rows: np.ndarray, starts: np.ndarray, n0: int, j0: int) -> int:
    """How many sampled windows contain time step j0 of series n0 (window s covers j0-L_F+1 <= s <= j0+P)."""
    return int(np.sum((rows == n0) & (starts >= j0 - L_F + 1) & (starts <= j0 + P_LEN)))


# Element j0 = 30 of series 0 (the shortest, L = 60): interior, so k = P + L_F = 12 windows contain it and
# r = k / T = 12 / 57 is the spec's bottom-level rate for lambda = 1 with replacement.
N0, J0 = 0, 30


@pytest.mark.parametrize("top", ["without_replacement", "poisson"])
@pytest.mark.parametrize("bottom", ["with_replacement", "poisson"])
def test_per_step_inclusion_matches_rho_times_r(ids, top, bottom):
    """Per step, E[#sampled windows containing the element] = rho * r (lambda = 1).

    For bottom-level sampling with replacement and lambda = 1 this count is 0/1, i.e. a probability.
    """
    dm = make_dm(ids, top_level=top, bottom_level=bottom, seed=11)
    spec = dm.sampling_spec
    k, t = spec.windows_per_unit, spec.num_start_positions
    assert (k, t) == (P_LEN + L_F, 57)
    r = k / t  # with replacement: spec.bottom_level_rate; Poisson: k * min(1, lambda/T)
    if bottom == "with_replacement":
        assert spec.bottom_level_rate == pytest.approx(r)
    else:
        assert spec.bottom_level_rate * k == pytest.approx(r)
    expected = spec.top_level_rate * r
    steps = 20_000
    counts = np.array([covering(*dm.sampler.sample_indices(0, b)[:2], N0, J0) for b in range(steps)])
    exact_var = expected * (1 - expected) if bottom == "with_replacement" else None
    assert_mean(counts, expected, exact_var)


def test_per_step_inclusion_lambda_two(ids):
    """lambda = 2, with replacement: E[count] = rho * lambda * k / T with rho = (Lambda/lambda) / N."""
    dm = make_dm(ids, batch_size=8, instances_per_series=2, seed=5)
    spec = dm.sampling_spec
    assert spec.top_level_rate == pytest.approx(4 / 20)
    expected = spec.top_level_rate * 2 * spec.bottom_level_rate
    counts = [covering(*dm.sampler.sample_indices(0, b)[:2], N0, J0) for b in range(20_000)]
    assert_mean(np.array(counts), expected)


@pytest.mark.parametrize("top", ["iteration", "shuffling"])
@pytest.mark.parametrize("bottom", ["with_replacement", "poisson"])
def test_per_epoch_inclusion_matches_r(ids, top, bottom):
    """Iteration/shuffling: each series is used exactly once per epoch (N = 20 is a multiple of N' = 4), so
    per epoch E[#windows containing the element] = r = k/T (Theorem 4.2's r; Theorem E.8's k * rate)."""
    dm = make_dm(ids, top_level=top, bottom_level=bottom, seed=3)
    spec = dm.sampling_spec
    assert spec.steps_per_epoch == 5
    expected = spec.windows_per_unit / spec.num_start_positions
    counts = []
    for epoch in range(4_000):
        total = 0
        for b in range(spec.steps_per_epoch):
            rows, starts, _ = dm.sampler.sample_indices(epoch, b)
            total += covering(rows, starts, N0, J0)
        counts.append(total)
    exact_var = expected * (1 - expected) if bottom == "with_replacement" else None
    assert_mean(np.array(counts), expected, exact_var)


def test_iteration_order_and_shuffling_permutation(ids):
    it = make_dm(ids, top_level="iteration", seed=0)
    for b in range(it.steps_per_epoch):
        rows, _, _ = it.sampler.sample_indices(7, b)
        assert rows.tolist() == list(range(4 * b, 4 * b + 4))
    sh = make_dm(ids, top_level="shuffling", seed=0)
    epochs = []
    for epoch in range(2):
        rows = np.concatenate([sh.sampler.sample_indices(epoch, b)[0] for b in range(sh.steps_per_epoch)])
        assert sorted(rows.tolist()) == list(range(20))  # a permutation: every series once
        epochs.append(rows.tolist())
    assert epochs[0] != epochs[1]  # fresh permutation each epoch


def test_iteration_leftover_series_unused():
    dm = make_dm(id_series([40] * 22), top_level="iteration")
    assert dm.steps_per_epoch == 5  # floor(22 * 1 / 4)
    rows = np.concatenate([dm.sampler.sample_indices(0, b)[0] for b in range(5)])
    assert rows.tolist() == list(range(20))


@pytest.mark.parametrize("top", ["iteration", "shuffling", "without_replacement"])
def test_fixed_schemes_have_batch_size_lambda(ids, top):
    dm = make_dm(ids, top_level=top, batch_size=8, instances_per_series=2, seed=1)
    for epoch in range(3):
        for b in range(dm.steps_per_epoch):
            batch = dm.train_batch(epoch, b)
            assert batch["past_target"].shape == (8, P_LEN)
            assert batch["future_target"].shape == (8, L_F)
    rows, _, _ = dm.sampler.sample_indices(0, 0)
    assert np.all(np.bincount(rows) % 2 == 0)  # lambda = 2 windows from each sampled series


@pytest.mark.parametrize(
    ("top", "bottom"),
    [("poisson", "with_replacement"), ("without_replacement", "poisson"), ("poisson", "poisson")],
)
def test_poisson_schemes_have_mean_batch_size_lambda(ids, top, bottom):
    dm = make_dm(ids, top_level=top, bottom_level=bottom, batch_size=8, instances_per_series=2, seed=9)
    sizes = np.array([len(dm.sampler.sample_indices(0, b)[0]) for b in range(10_000)])
    assert sizes.var() > 0
    assert_mean(sizes, 8.0)


def test_without_replacement_draws_distinct_series(ids):
    dm = make_dm(ids, batch_size=8, seed=2)
    for b in range(200):
        rows, _, _ = dm.sampler.sample_indices(0, b)
        assert len(set(rows.tolist())) == 8


def test_window_geometry_matches_algorithm_4():
    """Start s covers padded[s : s + P + L_F]; s = 0 is all padding in the past, the last window ends at the
    end of the training part, and no start outside {0..T_n - 1} is ever drawn."""
    series = id_series([30, 45])
    dm = make_dm(series, val_windows=1, test_windows=1, batch_size=2, bottom_level="poisson")
    store = dm._train_store
    train = [30 - 8, 45 - 8]
    assert dm.train_lengths.tolist() == train
    out = store.gather(np.array([0, 1, 1]), np.array([0, 0, train[1] - L_F]))
    assert np.all(out["past_observed_values"][:2] == 0) and np.all(out["past_target"][:2] == 0)
    np.testing.assert_array_equal(out["future_target"][0, :, 0], series[0][:L_F])
    np.testing.assert_array_equal(out["future_target"][2, :, 0], series[1][train[1] - L_F : train[1]])
    np.testing.assert_array_equal(out["past_target"][2, :, 0], series[1][train[1] - L_F - P_LEN : train[1] - L_F])
    assert store.num_start_positions.tolist() == [train[0] - L_F + 1, train[1] - L_F + 1]
    assert dm.sampling_spec.min_length == train[0]


@pytest.mark.parametrize("bottom", ["with_replacement", "poisson"])
def test_windows_never_leave_the_training_split(bottom):
    """Values encode (series, time); every observed value in a training batch is from the training part,
    and every window is exactly a contiguous slice of the padded series."""
    lengths = [30 + 3 * n for n in range(10)]
    series = id_series(lengths)
    dm = make_dm(series, batch_size=5, bottom_level=bottom, val_windows=2, test_windows=1, seed=4)
    held = 3 * L_F
    seen_last = set()
    for b in range(400):
        batch = dm.train_batch(b // 2, b % 2)
        window = torch.cat([batch["past_target"], batch["future_target"]], dim=1).numpy()
        mask = torch.cat([batch["past_observed_values"], batch["future_observed_values"]], dim=1).numpy()
        assert np.all((window == 0) == (mask == 0))
        for w in window:
            obs = w[w > 0]
            n = int(obs[0] // 1000) - 1
            j = obs - 1000 * (n + 1) - 1
            assert np.all(j < lengths[n] - held), "window reads data outside the training split"
            assert np.all(np.diff(j) == 1) and np.all(w[len(w) - len(obs) :] == obs)  # contiguous, padded in front
            if j[-1] == lengths[n] - held - 1:
                seen_last.add(n)
    assert len(seen_last) > 0  # windows reaching the very end of the training part do occur


def test_augmentation_noise_has_configured_std_on_past_and_future():
    """Eq. (1): std context_noise * v on the whole past window, forecast_noise * v on the future window.

    Sample-variance check: s^2/sigma^2 has standard error sqrt(2/n) (Gaussian); tested at 5 standard errors.
    """
    series = [np.zeros(40) for _ in range(10)]
    relation = NeighbouringRelation(value_bound=2.0)
    dm = make_dm(series, batch_size=8, relation=relation, context_noise=0.5, forecast_noise=1.5, seed=8)
    spec = dm.sampling_spec
    assert (spec.context_noise, spec.forecast_noise, spec.relation.value_bound) == (0.5, 1.5, 2.0)
    past, future, padded_past = [], [], []
    for b in range(300):
        batch = dm.train_batch(b // dm.steps_per_epoch, b % dm.steps_per_epoch)
        past.append(batch["past_target"].numpy().ravel())
        future.append(batch["future_target"].numpy().ravel())
        padded_past.append(batch["past_target"].numpy()[batch["past_observed_values"].numpy() == 0])
    for values, std in [(np.concatenate(past), 1.0), (np.concatenate(future), 3.0)]:
        n = len(values)
        assert abs(values.mean()) < Z * std / math.sqrt(n)
        assert abs(values.var() / std**2 - 1) < Z * math.sqrt(2 / n)
    padded = np.concatenate(padded_past)
    assert len(padded) > 1000 and abs(padded.var() - 1.0) < Z * math.sqrt(2 / len(padded))  # padding too


def test_augmentation_is_fresh_for_every_window():
    """One series with L = L_F (T = 1): every window is the same slice, yet the noise differs per draw."""
    relation = NeighbouringRelation(value_bound=1.0)
    series = [np.arange(1.0, L_F + 1)]
    kw = dict(batch_size=2, instances_per_series=2)
    dm = make_dm(series, relation=relation, context_noise=1.0, forecast_noise=1.0, **kw)
    batch = dm.train_batch(0, 0)
    for key in ("past_target", "future_target"):
        assert not torch.equal(batch[key][0], batch[key][1])
        assert not torch.equal(batch[key], dm.train_batch(1, 0)[key])
        torch.testing.assert_close(batch[key], dm.train_batch(0, 0)[key])  # reproducible
    without = make_dm(series, **kw).train_batch(0, 0)
    torch.testing.assert_close(without["future_target"][0], torch.arange(1.0, L_F + 1))
    torch.testing.assert_close(without["future_target"][0], without["future_target"][1])


def test_reproducible_and_seed_dependent(ids):
    a, b = make_dm(ids, seed=123), make_dm(ids, seed=123)
    c = make_dm(ids, seed=124)
    for step in range(3):
        for key in a.keys:
            torch.testing.assert_close(a.train_batch(2, step)[key], b.train_batch(2, step)[key])
    assert not torch.equal(a.train_batch(0, 0)["past_target"], c.train_batch(0, 0)["past_target"])


def test_dataloader_epochs_advance_and_workers_do_not_duplicate(ids):
    dm = make_dm(ids, seed=6)
    loader = dm.train_dataloader()
    first = [batch["future_target"] for batch in loader]
    second = [batch["future_target"] for batch in loader]
    assert len(first) == len(second) == dm.steps_per_epoch
    for step in range(dm.steps_per_epoch):
        torch.testing.assert_close(first[step], dm.train_batch(0, step)["future_target"])
        torch.testing.assert_close(second[step], dm.train_batch(1, step)["future_target"])
    # Two workers: same batches in the same order, none duplicated.
    with_workers = make_dm(ids, seed=6, num_workers=2)
    worker_loader = with_workers.train_dataloader()
    for want_epoch in (first, second):
        batches = [batch["future_target"] for batch in worker_loader]
        assert len(batches) == dm.steps_per_epoch
        for got, want in zip(batches, want_epoch, strict=True):
            torch.testing.assert_close(got, want)
    assert isinstance(dm.train_dataloader(), DataLoader)


class _Recorder(L.LightningModule):
    """A plain LightningModule that records the batches the Trainer feeds it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(P_LEN, L_F)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["future_target"].clone())
        return torch.nn.functional.mse_loss(self.layer(batch["past_target"]), batch["future_target"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def test_trainer_sees_epoch_after_epoch_of_the_sampler(ids):
    """A Lightning Trainer iterating two epochs gets exactly train_batch(epoch, step) in order."""
    dm = make_dm(ids, seed=21)
    model = _Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    assert len(model.seen) == 2 * dm.steps_per_epoch
    for i, got in enumerate(model.seen):
        epoch, step = divmod(i, dm.steps_per_epoch)
        torch.testing.assert_close(got, dm.train_batch(epoch, step)["future_target"])


def test_state_dict_keeps_only_the_passes_started_and_resumes_with_fresh_passes(ids):
    dm = make_dm(ids, seed=2)
    assert dm.state_dict() == {"passes_started": 0}
    loader = dm.train_dataloader()
    list(loader)
    list(loader)
    state = dm.state_dict()
    assert state == {"passes_started": 2}  # no seed, no generator state
    resumed = make_dm(ids, seed=2)
    resumed.load_state_dict(state)
    first = next(iter(resumed.train_dataloader()))
    # seeded (an experiment): the resumed run continues with pass 2, never replays passes 0 and 1
    torch.testing.assert_close(first["past_target"], dm.train_batch(2, 0)["past_target"])
    # a checkpoint of an older version (next_epoch/seed) is accepted, its seed ignored
    older = make_dm(ids, seed=3)
    older.load_state_dict({"next_epoch": 5, "seed": 2})
    assert older.state_dict() == {"passes_started": 5}


def test_poisson_top_level_can_yield_an_empty_batch_with_correct_shapes():
    """With rho = 1/20 the chance of an empty step is (19/20)^20 ~ 0.36; empty batches keep their shapes."""
    dm = make_dm(id_series([40] * 20), top_level="poisson", batch_size=1, seed=0)
    empties = [b for b in (dm.train_batch(0, s) for s in range(50)) if b["past_target"].shape[0] == 0]
    assert empties, "expected at least one empty Poisson batch in 50 steps (miss probability 0.64^50 ~ 2e-10)"
    batch = empties[0]
    assert batch["past_target"].shape == (0, P_LEN) and batch["future_target"].shape == (0, L_F)
    assert batch["feat_static_cat"].shape == (0, 1)

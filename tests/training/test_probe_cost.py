"""The window-independence probe at a cost bounded by design (issue 44), with the protection it had.

Work is counted, never timed: which batches the probe runs ``training_step`` on (how many windows, which dtype),
how many probes a fit runs, and how many windows of a pass the comparison keeps. The comparison itself
(:func:`~lightning_dpts.training.probe_batches.largest_window_change`, streamed record by record) is checked
against an independent computation: the per-window gradients materialised for every window of both passes.
The attacker patterns of test_window_mixing.py, test_window_probe_models.py and test_guarantee.py still run
against the new probe; the pattern here mixes only in batches larger than the probe's cap.
"""

from __future__ import annotations

import collections
import math
import warnings

import lightning as L
import pytest
import torch
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec
from lightning_dpts.training import DPForecastStrategy
from lightning_dpts.training.engine import PerWindowClipper
from lightning_dpts.training.probe_batches import (
    PROBE_WINDOWS,
    in_float64,
    largest_window_change,
    perturb_first_window,
    synthetic_probe,
)
from lightning_dpts.training.surgery import make_private_compatible

from .conftest import SpecDataModule, trainer

CTX, H = 6, 3
BIG = 40  # Lambda above the probe's cap


class Counted(L.LightningModule):
    """An MLP forecaster that records (windows, dtype) of every ``training_step`` call; ``pattern`` mixes the
    windows: ``"large_batches"`` subtracts the batch mean when the batch holds more than 20 windows."""

    def __init__(self, pattern: str | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pattern = pattern
        self.net = nn.Sequential(nn.Linear(CTX, 8), nn.Tanh(), nn.Linear(8, H))
        self.calls: list[tuple[int, torch.dtype]] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x = batch["past_target"]
        self.calls.append((x.shape[0], x.dtype))
        if self.pattern == "large_batches" and x.shape[0] > 20:
            x = x - x.mean(0)
        err = (self.net(x) - batch["future_target"]).square() * batch["future_observed_values"]
        return (err.sum(1) / batch["future_observed_values"].sum(1).clamp(min=1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _batch(size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"past_target": 1.0 + torch.rand(size, CTX, generator=g), "past_observed_values": torch.ones(size, CTX),
            "future_target": 1.0 + torch.rand(size, H, generator=g), "future_observed_values": torch.ones(size, H)}


def _fit(module: L.LightningModule, steps: int, size: int = BIG, **kwargs) -> DPForecastStrategy:
    spec = SamplingSpec(num_series=4 * size, min_length=40, context_length=CTX, prediction_length=H, batch_size=size)
    strategy = DPForecastStrategy(1.0, 1.0, seed=0, spot_check=0.0, **kwargs)
    trainer(max_steps=steps, callbacks=[strategy]).fit(
        module, datamodule=SpecDataModule(spec, [_batch(size, s) for s in range(steps)]))
    return strategy


def test_the_probe_runs_on_capped_batches_and_a_logarithmic_number_of_times():
    """31 steps at Lambda = 40: one probe at step 1 and one in each of [2, 4), [4, 8), [8, 16), [16, 32), i.e.
    1 + floor(log2 31) = 5. Each runs two passes of PROBE_WINDOWS windows in float64; the first also two passes of
    the real batch's 40 windows in the module's float32. Nothing else."""
    module = Counted()
    strategy = _fit(module, 31)
    assert strategy.probes == 1 + int(math.log2(31)) == 5 and not strategy.isolated
    calls = collections.Counter(module.calls)
    assert calls == {(PROBE_WINDOWS, torch.float64): 2 * 5, (BIG, torch.float32): 31 + 2}, calls
    # probe work: 2 * 5 * 16 + 2 * 40 = 240 windows against the fit's 1240 (19% for 31 steps); at 1023 steps,
    # 2 * 10 * 16 + 2 * 40 = 400 windows against 40,920 (1.0%)
    assert strategy.probe_seconds > 0


def test_a_batch_within_the_cap_is_probed_whole_in_float64_once_per_probe():
    module = Counted()
    strategy = _fit(module, 7, size=8)
    assert strategy.probes == 1 + int(math.log2(7)) == 3
    assert collections.Counter(module.calls) == {(8, torch.float64): 2 * 3, (8, torch.float32): 7}


def test_the_full_size_pass_keeps_only_the_compared_windows_of_its_first_pass(monkeypatch):
    """Peak memory of the real batch's pass: while the second pass runs, only PROBE_WINDOWS windows of the first
    one are held (copies, so that the full records can be freed)."""
    kept: list[tuple[int, bool, int]] = []
    real = PerWindowClipper.pass_records

    def spy(self, params, windows, *, copy):
        out = real(self, params, windows, copy=copy)
        for _, calls in out.records:
            for blocks, g in calls:
                for t in (*blocks, g):
                    kept.append((t.shape[0], copy, t.untyped_storage().nbytes() // t.element_size()))
        return out

    monkeypatch.setattr(PerWindowClipper, "pass_records", spy)
    _fit(Counted(), 1)
    full = [k for k in kept if k[1]]
    assert full and all(rows == PROBE_WINDOWS for rows, _, _ in kept)
    assert all(storage <= PROBE_WINDOWS * 8 for _, _, storage in full)  # widest record: 8 hidden units


def test_a_mix_only_in_batches_above_the_cap_is_found_before_the_first_step():
    """The capped float64 pass (16 windows) cannot see a forward that mixes only above 20 windows; the first
    probe's pass at the real batch's size does, before any noisy step: ``auto`` isolates, ``fast`` refuses."""
    with pytest.warns(UserWarning, match=f"synthetic probe batch of {BIG} windows .*per_window='isolated'"):
        strategy = _fit(Counted("large_batches"), 2)
    assert strategy.isolated
    module = Counted("large_batches")
    before = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(ConfigurationError, match=f"mixes the windows.*probe batch of {BIG} windows"):
        _fit(module, 2, per_window="fast")
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))  # no update


class Mixed(L.LightningModule):
    """Every layer kind the clipper handles: an embedding and a layer norm (Opacus' per-window gradients), an LSTM
    (DPFastLSTM records: two input blocks, T steps) and linear layers; ``mix`` adds ``mix`` times the batch mean
    of the LSTM's output to every window."""

    def __init__(self, mix: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.mix = mix
        self.embed = nn.Embedding(2, 3)
        self.lstm = nn.LSTM(4, 5, batch_first=True)
        self.norm = nn.LayerNorm(5)
        self.head = nn.Linear(5, H)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int = 0) -> torch.Tensor:
        x = batch["past_target"]
        cat = self.embed(batch["feat_static_cat"][:, 0])[:, None, :].expand(-1, x.shape[1], -1)
        h, _ = self.lstm(torch.cat([x[..., None], cat], dim=-1))
        h = h + self.mix * h.mean(0)
        out = self.head(self.norm(h[:, -1]))
        return (out - batch["future_target"]).square().mean()


def _two_passes(module: L.LightningModule, size: int) -> tuple:
    """Both probe passes by hand in float64: the streamed records and, independently, every window's materialised
    per-window gradients (the old comparison's input)."""
    make_private_compatible(module)
    params = [p for p in module.parameters() if p.requires_grad]
    clipper = PerWindowClipper(module)
    names = [clipper._names[id(p)] for p in params]
    batch = _batch(size)
    batch["feat_static_cat"] = torch.zeros(size, 1, dtype=torch.long)
    out = []
    with in_float64(module, synthetic_probe(batch, size), enabled=True) as (probe, dtype):
        for b in (probe, perturb_first_window(dict(probe), size)):
            clipper.clear(params)
            for p in params:
                p.grad = None
            module.training_step(b).backward()
            grads = [g if g is not None else torch.zeros(size, *p.shape, dtype=dtype)
                     for p, g in zip(params, clipper.per_window_gradients(params), strict=True)]
            out.append((clipper.pass_records(params, size, copy=True), grads))
        clipper.clear(params)
        result = largest_window_change(out[0][0], out[1][0], params, names, dtype)
    clipper.remove()
    return result, out[0][1], out[1][1], names


@pytest.mark.parametrize("mix", [0.0, 1e-7, 0.3])
def test_the_streamed_comparison_equals_the_materialised_per_window_gradients(mix):
    result, base, moved, names = _two_passes(Mixed(mix), 6)
    change = torch.stack([sum((a[j] - b[j]).double().square().sum() for a, b in zip(base, moved, strict=True))
                          for j in range(6)]).sqrt()
    if mix == 0.0:
        assert result is None and float(change[1:].max()) == 0.0  # bitwise equal rows: nothing computed
        return
    assert result is not None, change  # a cross-window term of 1e-7 is found in float64
    value, tolerance, window, param, _ = result
    assert window == int(change[1:].argmax()) + 1
    assert value == pytest.approx(float(change[window]), rel=1e-9)
    assert tolerance < 1e-4 * value
    per_param = [float((a[window] - b[window]).double().square().sum()) for a, b in zip(base, moved, strict=True)]
    assert param == names[max(range(len(names)), key=per_param.__getitem__)]


def test_a_forward_that_calls_a_layer_a_data_dependent_number_of_times_is_compared_by_its_gradients():
    """Another number of calls in the second pass (the changed window raises the batch mean): the records cannot be
    compared row by row, so every window's gradient is compared; the mix is reported."""

    class Branching(Counted):
        def training_step(self, batch, batch_idx):
            x = batch["past_target"]
            h = self.net[0](x)
            if float(x.mean()) > 1.6:  # window 0 changed (x3 + 0.5) pushes the batch mean above it
                h = h + self.net[0](x) * 0.1
            err = (self.net[2](torch.tanh(h)) - batch["future_target"]).square()
            return err.mean()

    with pytest.raises(ConfigurationError, match="mixes the windows"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit(Branching(), 1, size=8, per_window="fast")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_spot_checks_distance_is_the_flat_one(dtype):
    """The spot check's gap ||a x - b y|| over all parameters, one parameter at a time (no flat copy of the whole
    gradient), against the same distance of the concatenated vectors in float64; also with a batched gradient in
    another dtype than the window's own (autocast records)."""
    from lightning_dpts.training.independence import _distance

    gen = torch.Generator().manual_seed(3)
    shapes = [(64, 96), (64,), (1536, 64), (3, 64), (3,)]
    first = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    second = [(x.double() + 1e-3 * torch.randn(x.shape, generator=gen, dtype=torch.float64)).to(torch.float32)
              for x in first]
    for a, b in ((1.0, 1.0), (0.25, 0.75), (256.0, 1.0), (1 / 256, 1.0)):
        flat = torch.cat([x.double().reshape(-1) for x in first]) * a - torch.cat(
            [y.double().reshape(-1) for y in second]) * b
        want = float(torch.linalg.vector_norm(flat))
        assert _distance(first, second, a, b) == pytest.approx(want, rel=1e-2 if dtype == torch.bfloat16 else 1e-5)
    assert _distance(first, [x.clone() for x in first], 1.0, 1.0) == 0.0


def test_the_synthetic_masks_follow_their_documented_pattern():
    """Window 1, 4, ... misses the second half of its time axis, window 2, 5, ... every third step (written out
    element by element here, independently of the vectorised construction), and the real values carry the scales
    1, 2, 0.5, ... per window."""
    size, steps = 7, 8
    batch = {"past_target": torch.ones(3, steps), "past_observed_values": torch.ones(3, steps)}
    probe = synthetic_probe(batch, size)
    mask = probe["past_observed_values"]
    for i in range(size):
        for t in range(steps):
            expected = 0.0 if (i % 3 == 1 and t >= steps // 2) or (i % 3 == 2 and t % 3 == 0) else 1.0
            assert float(mask[i, t]) == expected, (i, t)
    values = probe["past_target"]
    assert bool((values[mask == 0] == 0).all())
    for i in range(size):
        scale = (1.0, 2.0, 0.5)[i % 3]
        observed = values[i][mask[i] != 0]
        assert bool(((observed >= scale) & (observed < 2 * scale)).all()), i

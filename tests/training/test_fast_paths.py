"""The fast paths of issue 15 against independent computations, and the attacker's view of the noise drawn ahead.

* A draw started ahead by :meth:`GaussianNoise.prepare` is exactly the next draw of ``sample`` alone (same seed,
  same order, one per call), each in its own buffer, and a discarded draw is never handed out.
* The hand-written LSTM backward (``_Recurrence``) equals autograd through the unrolled recurrence (float64).
* Both per-window norm forms (ghost norm and per-window products) equal the norms of materialised per-window
  gradients, for one and several input blocks.
* A tapped ``nn.Linear`` (no autograd weight gradient) refuses a weight that gets a gradient from elsewhere, and
  the layer types are restored after fitting.

Every check uses fixed seeds, so its outcome is deterministic; the "no shared value" checks compare float64
normals, where a chance equality between independent draws has probability below 1e-8.
"""

from __future__ import annotations

import gc
import weakref

import lightning as L
import pytest
import torch
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec
from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.training import DPForecastStrategy
from lightning_dpts.training.engine import _add_window_sum, _Record, _squared_norms, _step_sum
from lightning_dpts.training.surgery import DPFastLSTM, _Recurrence

from .conftest import SpecDataModule, trainer


# ---------------------------------------------------------------------------------------------------------
# Noise drawn ahead (GaussianNoise.prepare)
# ---------------------------------------------------------------------------------------------------------
def test_prepared_noise_is_never_handed_out_twice_nor_shared():
    """Attacker: the caller adds the noise in place (p.grad); a reused buffer or a reused draw would let one
    released gradient cancel the noise of another. No two draws may share a value or a buffer."""
    noise = GaussianNoise(resolve_entropy(5))
    held, snapshots = [], []
    for k in range(8):
        noise.prepare(4096, 1.0, torch.float64)
        x = noise.sample(4096, 1.0, torch.float64)  # float64: chance collisions ~1e-8
        assert x.abs().max() < 10  # not a buffer an earlier caller modified
        snapshots.append(x.clone())
        if k % 2:
            x.add_(1e6)  # the caller modifies its vector; no later draw may see or reuse it
            snapshots[-1] += 1e6
        held.append(x)
    for i, a in enumerate(held):
        torch.testing.assert_close(a, snapshots[i], rtol=0, atol=0)  # no later draw wrote into it
        for b in snapshots[i + 1 :]:
            assert not bool(torch.isin(snapshots[i], b).any()), "a noise value reappears in another draw"


def test_prepared_draw_errors_reach_the_caller():
    noise = GaussianNoise(resolve_entropy(1))

    def broken(*args):
        raise RuntimeError("draw failed")

    noise._draw = broken  # the background draw fails; the failure must not be swallowed
    noise.prepare(10, 1.0)
    with pytest.raises(RuntimeError, match="draw failed"):
        noise.sample(10, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_prepared_draw_is_the_next_draw_of_the_stream_handed_out_once(dtype):
    """``prepare`` only moves the next draw earlier: the vectors handed out are those of ``sample`` alone (same seed,
    same order); preparing twice draws once; another std rescales it; another size or dtype drops it for good."""
    plain = GaussianNoise(resolve_entropy(4))
    fast = GaussianNoise(resolve_entropy(4))
    for _ in range(3):
        fast.prepare(700, 0.5, dtype)
        fast.prepare(700, 0.5, dtype)  # already pending: no second draw
        got = fast.sample(700, 0.5, dtype)
        assert got.dtype == dtype and torch.equal(got, plain.sample(700, 0.5, dtype))
    f64 = torch.float64  # chance collisions between float64 normals: ~1e-10 here
    fast.prepare(700, 1.0, f64)
    torch.testing.assert_close(fast.sample(700, 2.0, f64), plain.sample(700, 1.0, f64) * 2.0, rtol=1e-15, atol=0)
    fast.prepare(700, 1.0, f64)
    dropped = plain.sample(700, 1.0, f64)  # what the prepared draw holds
    later = torch.cat([fast.sample(n, 1.0, f64) for n in (300, 700, 700)])
    assert not bool(torch.isin(dropped, later).any())


@pytest.mark.parametrize("spare_core", [True, False])
def test_the_strategy_keeps_one_noise_vector_alive_and_draws_once_per_step(monkeypatch, spare_core):
    """Each step's draw starts only once the previous step's noise (its noisy gradients) is released: one noise
    vector alive at a time, as the plain step holds one gradient. Every draw is handed out (none wasted). With a
    spare core the draw runs in the background from the step's start, else at the optimizer step."""
    from lightning_dpts.training import noisy_step as strategy_module

    monkeypatch.setattr(strategy_module, "_spare_core", lambda: spare_core)
    monkeypatch.setattr(strategy_module, "BACKGROUND_MIN_NUMEL", 0)  # this small model's draw too
    prepared = []
    prepare = GaussianNoise.prepare
    monkeypatch.setattr(GaussianNoise, "prepare", lambda self, *a: prepared.append(a) or prepare(self, *a))
    drawn: list[weakref.ref] = []
    alive_at_draw: list[int] = []
    calls = {"sample": 0}
    draw, sample = GaussianNoise._draw, GaussianNoise.sample

    def counting_draw(self, *args):
        alive_at_draw.append(sum(ref() is not None for ref in drawn))
        out = draw(self, *args)
        drawn.append(weakref.ref(out.untyped_storage()))
        return out

    def counting_sample(self, *args):
        calls["sample"] += 1
        return sample(self, *args)

    monkeypatch.setattr(GaussianNoise, "_draw", counting_draw)
    monkeypatch.setattr(GaussianNoise, "sample", counting_sample)
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, generator=g)} for _ in range(5)]
    spec = SamplingSpec(num_series=8, min_length=20, context_length=3, prediction_length=1, batch_size=4)
    strategy = DPForecastStrategy(1.0, 1.0, seed=0)
    trainer(max_steps=5, callbacks=[strategy]).fit(_Leaky("none"), datamodule=SpecDataModule(spec, batches))
    assert calls["sample"] == 5 and len(alive_at_draw) == 5
    assert alive_at_draw == [0] * 5
    assert len(prepared) == (5 if spare_core else 0)


def test_a_recorded_step_is_released_by_clear_while_its_graph_lives():
    """Lightning keeps the loss (and so the autograd graph) after the step: the recorded inputs and output
    gradients must not stay alive through it (they would double the step's memory for small batches)."""
    from lightning_dpts.training.engine import PerWindowClipper

    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    clipper = PerWindowClipper(net)
    params = list(net.parameters())
    try:
        loss = net(torch.randn(4, 3)).square().mean()
        loss.backward()
        recorded = [t for r in clipper._records.values() for blocks, g in r.calls for t in (*blocks, g)]
        assert len(recorded) == 4
        refs = [weakref.ref(t) for t in recorded]
        del recorded
        clipper.clear(params)
        gc.collect()
        assert loss.grad_fn is not None  # the graph is still referenced
        assert all(ref() is None for ref in refs)
        pending = net(torch.randn(4, 3)).sum()  # a forward without backward: its graph holds the records
        refs = [weakref.ref(blocks[0]) for r in clipper._records.values() for blocks, _ in r.calls]
        assert len(refs) == 2
        clipper.clear(params)
        gc.collect()
        assert pending.grad_fn is not None and all(ref() is None for ref in refs)
    finally:
        clipper.remove()


# ---------------------------------------------------------------------------------------------------------
# LSTM recurrence with a hand-written backward
# ---------------------------------------------------------------------------------------------------------
def test_recurrence_backward_equals_autograd_float64():
    torch.manual_seed(0)
    b, t, d, h = 3, 6, 4, 5
    lstm = DPFastLSTM(nn.LSTM(d, h, batch_first=True)).double()
    w_ih, w_hh, b_ih, b_hh = lstm._weights(0, 0)
    x = torch.randn(b, t, d, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(b, h, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(b, h, dtype=torch.float64, requires_grad=True)
    w_out = torch.randn(t, h, dtype=torch.float64)
    w_hn, w_cn = torch.randn(h, dtype=torch.float64), torch.randn(h, dtype=torch.float64)

    def loss(out, hn, cn):
        return (out * w_out).sum() + (hn * w_hn).sum() + (cn * w_cn).sum()

    # reference: plain autograd through the unrolled recurrence, gradient of the projection included
    proj = (x @ w_ih.T + b_ih + b_hh).detach().requires_grad_(True)
    w_ref = w_hh.detach().clone().requires_grad_(True)
    hs, hh, cc = [], h0, c0
    for step in proj.unbind(1):
        i, f, g, o = (step + hh @ w_ref.T).chunk(4, 1)
        cc = torch.sigmoid(f) * cc + torch.sigmoid(i) * torch.tanh(g)
        hh = torch.sigmoid(o) * torch.tanh(cc)
        hs.append(hh)
    loss(torch.stack(hs, 1), hh, cc).backward()
    recorded = {}

    def record(h_prev, delta):
        recorded["h_prev"], recorded["delta"] = h_prev, delta

    # _Recurrence is time-major: input [T, B, d] in, outputs [T, B, H] and records [T, B, .]
    x2 = x.detach().transpose(0, 1).requires_grad_(True)
    h02, c02 = h0.detach().requires_grad_(True), c0.detach().requires_grad_(True)
    out, hn, cn = _Recurrence.apply(x2, h02, c02, w_ih, w_hh.detach(), record, b_ih, b_hh)
    loss(out.transpose(0, 1), hn, cn).backward()
    torch.testing.assert_close(out.transpose(0, 1), torch.stack(hs, 1))
    torch.testing.assert_close(hn, hh)
    torch.testing.assert_close(cn, cc)
    torch.testing.assert_close(recorded["delta"].transpose(0, 1), proj.grad)
    torch.testing.assert_close(x2.grad.transpose(0, 1), proj.grad @ w_ih.detach())
    torch.testing.assert_close(h02.grad, h0.grad)
    torch.testing.assert_close(c02.grad, c0.grad)
    assert all(w.grad is None for w in (w_ih, w_hh, b_ih, b_hh))  # no autograd weight gradient: the clipper sums it
    # the weight gradient the clipper forms from the record equals autograd's
    torch.testing.assert_close(torch.einsum("tbp,tbh->ph", recorded["delta"], recorded["h_prev"]), w_ref.grad)


@pytest.mark.parametrize("batch_first", [True, False])
def test_recorded_lstm_module_equals_nn_lstm_float64(batch_first):
    """The whole recorded DPFastLSTM (2 layers, bidirectional, given h0/c0, the first layer's reverse direction
    frozen) against nn.LSTM in float64: outputs, final states, input and state gradients, and the weight
    gradients formed from the records (summed over the windows) against autograd's. Per-window gradients are
    checked window by window in test_per_sample_gradients.py."""
    torch.manual_seed(0)
    b, t, d, h = 3, 7, 4, 5
    ref = nn.LSTM(d, h, num_layers=2, batch_first=batch_first, bidirectional=True).double()
    for name in ("weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse"):
        getattr(ref, name).requires_grad_(False)
    lstm = DPFastLSTM(ref)
    records = []
    lstm.recorder = lambda module, x, h_prev, delta, weights: records.append((x, h_prev, delta, weights))
    shape = (b, t, d) if batch_first else (t, b, d)
    x = torch.randn(*shape, dtype=torch.float64)
    h0 = torch.randn(4, b, h, dtype=torch.float64)
    c0 = torch.randn(4, b, h, dtype=torch.float64)
    w_out = torch.randn(*shape[:2], 2 * h, dtype=torch.float64)
    w_hn, w_cn = torch.randn(4, b, h, dtype=torch.float64), torch.randn(4, b, h, dtype=torch.float64)

    def run(module, inputs):
        out, (hn, cn) = module(*inputs)
        loss = (out * w_out).sum() + (hn * w_hn).sum() + (cn * w_cn).sum()
        return out, hn, cn, loss

    got_in = [v.clone().requires_grad_(True) for v in (x, h0, c0)]
    want_in = [v.clone().requires_grad_(True) for v in (x, h0, c0)]
    out, hn, cn, loss = run(lstm, (got_in[0], (got_in[1], got_in[2])))
    loss.backward()
    r_out, r_hn, r_cn, r_loss = run(ref, (want_in[0], (want_in[1], want_in[2])))
    r_loss.backward()
    for a, w in zip((out, hn, cn, *[v.grad for v in got_in]), (r_out, r_hn, r_cn, *[v.grad for v in want_in]),
                    strict=True):
        torch.testing.assert_close(a, w)
    assert all(p.grad is None for p in lstm.parameters())  # the clipper forms the weight gradients
    assert len(records) == 3  # layer 0 forward, layer 1 both directions (layer 0 reverse is frozen)
    # summed over windows, the recorded products are the weight gradients autograd gives nn.LSTM
    names = {id(p): n for n, p in lstm.named_parameters()}  # DPFastLSTM keeps nn.LSTM's parameter names
    for x_rec, h_prev, delta, (w_ih, w_hh, b_ih, b_hh) in records:
        torch.testing.assert_close(torch.einsum("btp,btd->pd", delta, x_rec), getattr(ref, names[id(w_ih)]).grad)
        torch.testing.assert_close(torch.einsum("btp,btd->pd", delta, h_prev), getattr(ref, names[id(w_hh)]).grad)
        for bias in (b_ih, b_hh):
            torch.testing.assert_close(delta.sum((0, 1)), getattr(ref, names[id(bias)]).grad)
    # without a recorder (and in evaluation) it is nn.LSTM's own kernel
    lstm.recorder = None
    torch.testing.assert_close(lstm(x, (h0, c0))[0], ref(x, (h0, c0))[0], rtol=0, atol=0)


def test_a_first_layer_training_only_w_hh_is_recorded():
    """Only W_hh of the first layer trains and the input needs no gradient: the layer must still be recorded
    (its clipped sum formed); otherwise its update would silently be noise only."""
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4, batch_first=True).double()
    for name, p in ref.named_parameters():
        p.requires_grad_(name == "weight_hh_l0")
    lstm = DPFastLSTM(ref)
    records = []
    lstm.recorder = lambda module, x, h_prev, delta, weights: records.append((h_prev, delta))
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    out, _ = lstm(x)
    assert out.requires_grad
    out.square().sum().backward()
    ref(x)[0].square().sum().backward()
    (h_prev, delta), = records
    torch.testing.assert_close(torch.einsum("btp,btd->pd", delta, h_prev), ref.weight_hh_l0.grad)


# ---------------------------------------------------------------------------------------------------------
# Per-window norms: both forms against materialised per-window gradients
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("t", "widths", "p"), [(1, [7], 5), (3, [20, 12], 16), (40, [3, 2], 8), (9, [6], 30), (40, [7, 5], 4)]
)
def test_squared_norms_equal_materialised_per_window_norms(t, widths, p):
    g = torch.Generator().manual_seed(t)
    b = 4
    blocks = [torch.randn(b, t, d, generator=g, dtype=torch.float64) for d in widths]
    grad = torch.randn(b, t, p, generator=g, dtype=torch.float64)
    weights = [(nn.Parameter(torch.empty(p, d)), k) for k, d in enumerate(widths)]
    record = _Record(weights, [nn.Parameter(torch.empty(p)), nn.Parameter(torch.empty(p))])
    want = sum(torch.einsum("btp,btd->bpd", grad, a).square().sum((1, 2)) for a in blocks)
    want = want + 2 * grad.sum(1).square().sum(1)
    # contiguous time-major tensors, and the transposed batch-first views the clipper passes
    for layout in ([a.transpose(0, 1).contiguous() for a in blocks], [a.transpose(0, 1) for a in blocks]):
        g_tm = grad.transpose(0, 1).contiguous() if layout[0].is_contiguous() else grad.transpose(0, 1)
        norms, per_window, g_sum = _squared_norms(record, layout, g_tm)
        torch.testing.assert_close(norms, want)
        torch.testing.assert_close(g_sum, grad.sum(1))  # the per-window bias gradient the clipped sum reuses
        if per_window is not None:  # the per-window weight gradients, when formed (both orientations)
            c = torch.rand(b, generator=g, dtype=torch.float64)
            for full, a in zip(per_window, blocks, strict=True):
                torch.testing.assert_close(full, torch.einsum("btp,btd->bpd", grad, a))
                # the weighted sum over windows that the clipped sum takes from them
                summed = torch.ones(p, a.shape[-1], dtype=torch.float64)
                _add_window_sum(summed, c, full, 0.5)
                torch.testing.assert_close(summed, 1.0 + 0.5 * torch.einsum("b,btp,btd->pd", c, grad, a))
        torch.testing.assert_close(_step_sum(g_tm), grad.sum(1))


# ---------------------------------------------------------------------------------------------------------
# Tapped linear layers
# ---------------------------------------------------------------------------------------------------------
class _Leaky(L.LightningModule):
    """A linear layer whose weight also enters the loss directly (``mode="direct"``) or that runs in eval mode
    (``mode="eval"``): both give the weight a gradient no per-window hook sees."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 1)
        self.mode = mode

    def training_step(self, batch, batch_idx):
        if self.mode == "eval":
            self.lin.eval()
        loss = ((self.lin(batch["x"]).squeeze(-1) - batch["y"]) ** 2).mean()
        if self.mode == "direct":
            loss = loss + self.lin.weight.square().sum()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("mode", ["direct", "eval"])
def test_a_weight_with_a_gradient_from_outside_its_layer_is_refused(mode):
    g = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, generator=g)}
    spec = SamplingSpec(num_series=8, min_length=20, context_length=3, prediction_length=1, batch_size=4)
    module = _Leaky(mode)
    strategy = DPForecastStrategy(1.0, 1.0, seed=0, check_independence=False)
    with pytest.raises(ConfigurationError, match="lin.weight"):
        trainer(max_steps=1, callbacks=[strategy]).fit(module, datamodule=SpecDataModule(spec, [batch]))
    assert type(module.lin) is nn.Linear and "_dpts_tap" not in vars(module.lin)  # restored after the error


def test_tapped_layers_are_plain_linear_again_after_fit_and_train_normally():
    g = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, generator=g)}
    spec = SamplingSpec(num_series=8, min_length=20, context_length=3, prediction_length=1, batch_size=4)
    module = _Leaky("none")
    before = module.lin.weight.detach().clone()
    trainer(max_steps=2, callbacks=[DPForecastStrategy(1.0, 1.0, seed=0)]).fit(
        module, datamodule=SpecDataModule(spec, [batch, batch])
    )
    assert type(module.lin) is nn.Linear and "_dpts_tap" not in vars(module.lin)
    assert not torch.equal(module.lin.weight, before)
    module.lin.weight.grad = None
    module.training_step(batch, 0).backward()  # ordinary autograd again: the weight gets its gradient
    assert module.lin.weight.grad is not None


class _TinyLSTM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(2, 3, batch_first=True)
        self.head = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return ((self.head(self.lstm(batch["x"])[0]).squeeze(-1) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_non_finite_gradient_through_the_fused_lstm_path_is_an_error():
    from lightning_dpts.training import NonFiniteGradientError

    g = torch.Generator().manual_seed(0)
    batch = {"x": torch.randn(4, 6, 2, generator=g), "y": torch.randn(4, 6, generator=g)}
    batch["x"][2, 3, 0] = float("nan")
    spec = SamplingSpec(num_series=8, min_length=20, context_length=6, prediction_length=1, batch_size=4)
    strategy = DPForecastStrategy(1.0, 1.0, seed=0, check_independence=False)
    with pytest.raises(NonFiniteGradientError) as info:
        trainer(max_steps=1, callbacks=[strategy]).fit(_TinyLSTM(), datamodule=SpecDataModule(spec, [batch]))
    assert info.value.windows == [2]

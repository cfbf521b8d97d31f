"""benchmarks/dp_fit.py (``python benchmarks/dp_training.py``): each DP kind is the default DP fit less exactly the
default it names, and a bad ``--kinds`` exits with 2 before any model is built or trained."""

from __future__ import annotations

import pytest

from lightning_dpts.training import AccountantCallback, DPForecastStrategy

#: kind -> (spot_check, check_independence, secure_mode, accountant, risk_readouts): what differs from the default
EXPECTED = {
    "dp": (0.1, True, False, True, True),
    "dp_secure": (0.1, True, True, True, True),
    "dp_nospot": (0.0, True, False, True, True),
    "dp_noprobe": (0.1, False, False, True, True),
    "dp_bare": (0.0, False, False, True, True),
    "dp_noreadouts": (0.1, True, False, True, False),
    "dp_noaccountant": (0.1, True, False, False, None),
}


def test_each_kind_drops_exactly_the_default_it_names(benchmark_script):
    dp_fit = benchmark_script("dp_fit")
    assert set(dp_fit.VARIANTS) == set(EXPECTED)
    assert dp_fit.dp_callbacks("plain", 2.0) == []
    default = DPForecastStrategy(noise_multiplier=2.0, max_grad_norm=1.0)
    for kind, (spot, probe, secure, accountant, readouts) in EXPECTED.items():
        callbacks = dp_fit.dp_callbacks(kind, 2.0)
        strategy = callbacks[0]
        assert isinstance(strategy, DPForecastStrategy), kind
        assert (strategy.spot_check, strategy.check_independence, strategy.secure_mode) == (spot, probe, secure), kind
        assert strategy.noise_multiplier == 2.0 and strategy.max_grad_norm == default.max_grad_norm, kind
        assert strategy.per_window == default.per_window, kind
        assert strategy.require_accountant is accountant, kind
        accountants = [c for c in callbacks if isinstance(c, AccountantCallback)]
        assert len(accountants) == int(accountant) and len(callbacks) == 1 + int(accountant), kind
        if accountant:
            acc = accountants[0]
            assert (acc.epsilon, acc.delta) == (dp_fit.EPSILON, dp_fit.DELTA), kind
            assert acc.risk_readouts is readouts, kind
    assert default.spot_check == 0.1 and default.check_independence and not default.secure_mode
    assert AccountantCallback(dp_fit.EPSILON, dp_fit.DELTA).risk_readouts  # the default the variant drops


@pytest.mark.parametrize("kinds", ["plain,dp,dp_foo", "dp,dp_bare", "plain,dp_bare", "plain,dp,dp"])
def test_bad_kinds_exit_2_before_any_work(benchmark_script, monkeypatch, capsys, kinds):
    dp_fit = benchmark_script("dp_fit")

    def no_work(*args, **kwargs):
        raise AssertionError("work started")

    monkeypatch.setattr(dp_fit, "build", no_work)
    monkeypatch.setattr(dp_fit, "time_config", no_work)
    with pytest.raises(SystemExit) as exit_:
        dp_fit.main(["--configs", "sff:64", "--kinds", kinds])
    assert exit_.value.code == 2
    assert "--kinds" in capsys.readouterr().err

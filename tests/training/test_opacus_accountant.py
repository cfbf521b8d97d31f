"""Issue 43: the structured accountant in Opacus (register_accountant): same epsilon as the package's accountant."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from opacus import PrivacyEngine
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.training import StructuredOpacusAccountant, register_structured_accountant

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-7
PAPER = {
    "traffic": (dict(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256), 4.0),
    "electricity": (dict(num_series=321, min_length=21000, context_length=24, prediction_length=24, batch_size=128),
                    2.0),
    "solar": (dict(num_series=137, min_length=50000, context_length=240, prediction_length=60, batch_size=128), 4.0),
}


@pytest.fixture(autouse=True)
def _unbound_registry():
    """Leave Opacus' "structured" entry unbound after every test (the registry is global)."""
    yield
    from opacus.accountants import register_accountant

    register_accountant("structured", StructuredOpacusAccountant, force=True)


@pytest.mark.parametrize("name", list(PAPER))
def test_a_plain_loop_of_steps_reads_the_packages_epsilon(name):
    kw, sigma = PAPER[name]
    spec = SamplingSpec(**kw)
    acc = StructuredOpacusAccountant(spec)
    for _ in range(10_000):
        acc.step(noise_multiplier=sigma, sample_rate=spec.top_level_rate)
    assert len(acc) == 10_000 and acc.history == [(sigma, spec.top_level_rate, 10_000)]
    ours = StructuredSubsamplingAccountant(spec, sigma).epsilon(10_000, DELTA)
    assert abs(acc.get_epsilon(DELTA) / ours - 1) <= 1e-3
    assert acc.risk(DELTA) == StructuredSubsamplingAccountant(spec, sigma).risk(10_000, DELTA)


def test_registration_binds_the_spec_for_privacy_engine_and_opacus_calibration():
    spec = SamplingSpec(**PAPER["traffic"][0])
    bound = register_structured_accountant(spec)
    assert bound.mechanism() == "structured" and isinstance(create_accountant("structured"), StructuredOpacusAccountant)
    engine = PrivacyEngine(accountant="structured")
    assert engine.accountant.spec == spec
    # Opacus' hook after every DPOptimizer step (it reads the optimizer's sigma and accumulated iterations)
    optimizer = SimpleNamespace(noise_multiplier=4.0, accumulated_iterations=1)
    hook = engine.accountant.get_optimizer_hook_fn(sample_rate=spec.top_level_rate)
    for _ in range(100):
        hook(optimizer)
    assert engine.get_epsilon(DELTA) == StructuredSubsamplingAccountant(spec, 4.0).epsilon(100, DELTA)
    # the state dict carries the spec; another spec refuses it
    state = engine.accountant.state_dict()
    again = create_accountant("structured")
    again.load_state_dict(state)
    assert len(again) == 100
    other = StructuredOpacusAccountant(SamplingSpec(**PAPER["solar"][0]))
    with pytest.raises(ConfigurationError, match="spec"):
        other.load_state_dict(state)
    # Opacus' own noise calibration creates accountants by name: it finds sigma for our epsilon
    small = SamplingSpec(num_series=148, min_length=213, context_length=24, prediction_length=12, batch_size=32)
    register_structured_accountant(small)
    sigma = get_noise_multiplier(target_epsilon=1.0, target_delta=DELTA, sample_rate=1 / small.steps_per_epoch,
                                 steps=100, accountant="structured", epsilon_tolerance=0.01)
    eps = StructuredSubsamplingAccountant(small, sigma).epsilon(100, DELTA)
    assert 0.99 - 1e-9 <= eps <= 1.0


def test_what_the_accountant_refuses():
    spec = SamplingSpec(**PAPER["traffic"][0])
    unbound = create_accountant("structured")
    unbound.step(noise_multiplier=4.0, sample_rate=spec.top_level_rate)
    with pytest.raises(ConfigurationError, match="sampling spec"):
        unbound.get_epsilon(DELTA)
    unbound.set_spec(spec)
    assert unbound.get_epsilon(DELTA) == StructuredSubsamplingAccountant(spec, 4.0).epsilon(1, DELTA)
    with pytest.raises(ConfigurationError, match="spec"):
        unbound.set_spec(SamplingSpec(**PAPER["solar"][0]))
    mixed = StructuredOpacusAccountant(spec)
    mixed.step(noise_multiplier=4.0, sample_rate=spec.top_level_rate)
    mixed.step(noise_multiplier=3.0, sample_rate=spec.top_level_rate)
    with pytest.raises(ConfigurationError, match="noise_multiplier"):
        mixed.get_epsilon(DELTA)
    wrong = StructuredOpacusAccountant(spec)
    wrong.step(noise_multiplier=4.0, sample_rate=2 * spec.top_level_rate)  # e.g. gradient accumulation
    with pytest.raises(ConfigurationError, match="sample_rate"):
        wrong.get_epsilon(DELTA)
    assert StructuredOpacusAccountant(spec).get_epsilon(DELTA) == 0.0
    tiny = StructuredOpacusAccountant(spec)
    for _ in range(1000):
        tiny.step(noise_multiplier=0.05, sample_rate=spec.top_level_rate)
    assert tiny.get_epsilon(DELTA) == math.inf  # no epsilon certified: Opacus' calibration raises sigma
    with pytest.raises(ConfigurationError, match="name"):
        register_structured_accountant(spec, name="rdp")


@pytest.mark.slow  # the whole example in a fresh process
def test_example_accounts_a_plain_opacus_loop():
    """examples/opacus_structured.py: PrivacyEngine(accountant="structured"), make_private_with_epsilon, a loop."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "opacus_structured.py"), "--epochs", "3"],
                         capture_output=True, text=True, env=env, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 12
    assert result["epsilon_opacus"] == pytest.approx(result["epsilon_package"], rel=1e-3)
    assert result["epsilon_opacus"] <= 1.0 and result["noise_multiplier"] > 0
    assert set(result["risk"]["tpr_at_fpr"]) == {"0.001", "0.01"}

"""Writes tests/privacy/data/epsilons_before_i30.json: epsilons, theorems and reprs of a matrix of configurations,
computed by the code of main before issue 30 (run with PYTHONPATH pointing at that checkout).

    PYTHONPATH=/work/main python tests/privacy/make_before_table.py

The table is compared with == by tests/privacy/test_mechanisms.py (behaviour unchanged by the mechanism objects).
"""

from __future__ import annotations

import json
import pathlib
import sys

OUT = pathlib.Path(__file__).parent / "data" / "epsilons_before_i30.json"
#: Privacy ledgers (checkpoint form) written by main's DPForecastStrategy for some of the specs.
LEDGERS = pathlib.Path(__file__).parent / "data" / "ledgers_before_i30.json"
#: (steps, delta) read-outs of every configuration; FINE adds the small-delta read-out level for some of them.
READOUTS = ((1, 1e-5), (40, 1e-5))
FINE = ((40, 1e-9),)


def configurations() -> list[dict]:
    """Every top x bottom level, lambda in {1, 2}, three relations, augmentation, lengths, both bounds."""
    rel = {
        "event1": {"level": "event", "size": 1},
        "event3": {"level": "event", "size": 3},
        "user2": {"level": "user", "size": 2},
    }
    out: list[dict] = []
    base = {"num_series": 40, "min_length": 60, "context_length": 12, "prediction_length": 4}
    for top in ("iteration", "shuffling", "without_replacement", "poisson"):
        for bottom in ("with_replacement", "poisson"):
            for lam in (1, 2):
                for rname, r in rel.items():
                    for bound in ("upper", "lower") if rname == "event1" else ("upper",):
                        out.append({**base, "batch_size": 4 * lam, "instances_per_series": lam, "top_level": top,
                                    "bottom_level": bottom, "relation": r, "bound": bound, "sigma": 1.3,
                                    "name": f"{top}/{bottom}/lam{lam}/{rname}/{bound}",
                                    "fine": rname == "event1" and bound == "upper"})
    # several series lengths, and lengths=None (worst case over every length >= min_length)
    for top in ("iteration", "without_replacement"):
        for bottom in ("with_replacement", "poisson"):
            for lengths in ([60, 61, 75, 200], None):
                out.append({**base, "batch_size": 4, "top_level": top, "bottom_level": bottom,
                            "relation": rel["event1"], "lengths": lengths, "bound": "upper", "sigma": 1.1,
                            "name": f"{top}/{bottom}/lengths={lengths}"})
    # augmentation (Theorems 4.5, G.1 and their Appendix I extensions)
    for top in ("without_replacement", "poisson"):
        for cn, fn in ((0.5, 0.5), (0.2, 1.0)):
            for rname, r in (("event1", rel["event1"]), ("event3", rel["event3"]), ("dims", {"num_dims": 3})):
                if cn != fn and rname == "event3":
                    continue
                for lengths in ((60,), (60, 70, 90), None):
                    out.append({**base, "batch_size": 4, "top_level": top, "bottom_level": "with_replacement",
                                "relation": {**r, "value_bound": 2.0}, "context_noise": cn, "forecast_noise": fn,
                                "lengths": list(lengths) if lengths else None, "bound": "upper", "sigma": 0.9,
                                "name": f"{top}/aug{cn},{fn}/{rname}/lengths={lengths}"})
    # naive DP-SGD comparison (Propositions C.1, C.2)
    for bound in ("upper", "lower"):
        out.append({**base, "batch_size": 4, "top_level": "without_replacement", "relation": rel["event3"],
                    "bound": bound, "naive": True, "sigma": 1.0, "name": f"naive/{bound}"})
    # b-min-sep: spec only (the structured accountant refuses it)
    out.append({**base, "batch_size": 4, "top_level": "b_min_sep", "bands": 4, "relation": rel["event1"],
                "bound": "upper", "sigma": 1.0, "name": "b_min_sep/bands4"})
    return out


def build(config: dict):
    from lightning_dpts.privacy import NeighbouringRelation, SamplingSpec

    keys = ("num_series", "min_length", "context_length", "prediction_length", "batch_size", "instances_per_series",
            "top_level", "bottom_level", "context_noise", "forecast_noise", "bands")
    kwargs = {k: config[k] for k in keys if k in config}
    if config.get("lengths") is not None:
        kwargs["lengths"] = tuple(config["lengths"])
    elif "lengths" not in config:
        kwargs["lengths"] = (config["min_length"],)
    return SamplingSpec(relation=NeighbouringRelation(**config["relation"]), **kwargs)


def evaluate(config: dict) -> dict:
    from lightning_dpts.errors import ConfigurationError
    from lightning_dpts.privacy import StructuredSubsamplingAccountant

    spec = build(config)
    row: dict = {"repr": repr(spec), "steps_per_epoch": spec.steps_per_epoch,
                 "bottom_level_rate": spec.bottom_level_rate, "accounts_per_epoch": spec.accounts_per_epoch,
                 "at_least_lengths": list(spec.at_least_lengths()), "compositions": spec.compositions(40)}
    try:
        acc = StructuredSubsamplingAccountant(spec, config["sigma"], bound=config["bound"],
                                              naive=config.get("naive", False))
    except ConfigurationError as err:
        row["error"] = [err.parameter, str(err)]
        return row
    row.update(theorem=acc.theorem, kind=acc.kind, unit=acc.unit)
    readouts = READOUTS + (FINE if config.get("fine") else ())
    row["epsilons"] = [[s, d, acc.epsilon(s, d)] for s, d in readouts]
    row["delta"] = acc.delta(40, 1.0)
    return row


def ledgers() -> list[dict]:
    """Checkpoint ledgers of every top x bottom level (and b-min-sep), as main writes them."""
    from lightning_dpts.training.ledger import PrivacyLedger

    out = []
    for config in configurations():
        if config["bound"] != "upper" or config.get("naive"):
            continue
        ledger = PrivacyLedger(steps=12, epochs=3, noise_multiplier=config["sigma"], max_grad_norm=1.0,
                               sampling_spec=repr(build(config)))
        out.append({"config": config, "ledger": ledger.to_dict()})
    return out


def main() -> None:
    table = []
    for config in configurations():
        table.append({"config": config, **evaluate(config)})
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    LEDGERS.write_text(json.dumps(ledgers(), indent=1) + "\n")
    print(f"{len(table)} configurations -> {OUT}, {LEDGERS}", file=sys.stderr)


if __name__ == "__main__":
    main()

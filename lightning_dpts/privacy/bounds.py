"""Which theorem accounts for which configuration: the table of docs/privacy.md of that name, as code.

:func:`select_profile` maps a :class:`~lightning_dpts.privacy.spec.SamplingSpec`, a noise multiplier and the
requested bound (``"upper"`` or ``"lower"``) to the privacy profile of **one composition unit** (an epoch
for iteration/shuffling, an optimizer step otherwise). Configurations the theorems do not cover raise
:class:`~lightning_dpts.errors.ConfigurationError`; there is no silent fallback to another bound.

Top-level Poisson sampling (each series independently with rate rho = N'/N) is accounted with the
without-replacement theorems: the reduction of Lemma F.3 only needs that, conditioned on whether the
changed series is sampled, the rest of the top-level sample is the same under both datasets. Poisson
sampling couples exactly that way (the other series are independent of it), and the batch without the
series is then at distance <= C (not 2C) from the others, inside the constraint set of Lemmas F.6/G.4. The
bounds are therefore sound for it, but we claim neither tightness nor an optimistic lower bound there.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import profiles
from lightning_dpts.privacy.profiles import PrivacyProfile, gaussian_tvd
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["BOUNDS", "MAX_LENGTH_MEMBERS", "select_profile", "augmentation_leak_probability", "naive_dpsgd_profile"]

BOUNDS: tuple[str, ...] = ("upper", "lower")
#: Largest noise multiplier accepted: beyond it every mean of the dominating mixtures is below 1e-8 (in units of
#: the noise std), epsilon is 0 to every printed digit, and the means underflow for sigma near 1e308.
MAX_NOISE_MULTIPLIER = 1e8
#: Smallest noise multiplier accepted (a single step's privacy loss is then far beyond any grid anyway).
MIN_NOISE_MULTIPLIER = 1e-6


def _check_sigma(noise_multiplier: float) -> float:
    try:
        sigma = float(noise_multiplier)
    except (TypeError, ValueError):
        raise ConfigurationError("noise_multiplier", noise_multiplier, "must be a number > 0") from None
    if not (MIN_NOISE_MULTIPLIER <= sigma <= MAX_NOISE_MULTIPLIER):
        raise ConfigurationError("noise_multiplier", noise_multiplier,
                                 f"must be a number in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}]")
    return sigma


def augmentation_leak_probability(spec: SamplingSpec) -> float:
    """p2 of Theorem G.1: the probability that one step leaks the protected unit despite augmentation.

    p2 = rho * (n_F * tau_F + n_C * tau_C) / T where n_F (n_C) counts the windows in which the protected
    time step falls in the forecast (context) part and tau = TVD(N(0, s), N(shift, s)) for the
    augmentation std s in units of v. With T >= L_C + L_F this is the paper's
    rho * r * (phi * tau_F + (1 - phi) * tau_C) for the worst-placed step; for shorter series (Appendix I.1)
    we take the exact maximum over positions instead of only capping k.

    With sigma_C = sigma_F (Appendix I.2) the bound extends to w-event/w-user relations as
    rho * (k / T) * TVD(N(0, s), N(sqrt(w) * shift_D, s)); sigma_C != sigma_F is only proven for w = 1.
    """
    relation = spec.relation
    rho = spec.top_level_rate
    T = spec.num_start_positions
    if spec.context_noise == spec.forecast_noise:
        tau = gaussian_tvd(relation.value_shift, spec.context_noise)
        return min(1.0, rho * spec.windows_per_unit / T * tau)
    if relation.size != 1:
        raise ConfigurationError(
            "forecast_noise",
            spec.forecast_noise,
            f"context_noise != forecast_noise is proven only for w = 1 (Theorem G.1; Appendix I.2), but the "
            f"relation has size w={relation.size}; use equal context and forecast noise",
        )
    shift = relation.value_shift  # sqrt(D) for per-coordinate bounds (Appendix I.1)
    tau_c = gaussian_tvd(shift, spec.context_noise)
    tau_f = gaussian_tvd(shift, spec.forecast_noise)
    L, L_C, L_F = spec.min_length, spec.context_length, spec.prediction_length
    t = np.arange(1, L + 1)  # position of the changed step in the unpadded series (1-based)
    # Window starts s in {1..T} on the series padded with L_C zeros; the step sits at padded index t + L_C.
    n_forecast = np.clip(np.minimum(t, T) - np.maximum(t - L_F + 1, 1) + 1, 0, None)
    n_context = np.clip(np.minimum(t + L_C, T) - np.maximum(t + 1, 1) + 1, 0, None)
    worst = float(np.max(n_forecast * tau_f + n_context * tau_c))
    return min(1.0, rho * worst / T)


#: Most members the pointwise maximum over series lengths evaluates exactly; beyond it, neighbouring
#: members are grouped into one dominating member (upper bound) or subsampled (lower bound).
MAX_LENGTH_MEMBERS = 48


def select_profile(spec: SamplingSpec, noise_multiplier: float, bound: str = "upper") -> PrivacyProfile:
    """The privacy profile of one composition unit for ``spec`` (see the module docstring).

    With series of different lengths (``spec.lengths``) this is the pointwise maximum of the per-length
    profiles, reduced to the lengths that can attain it (docs/privacy.md, "Series of different lengths"); with
    ``lengths=None`` (every series has *at least* ``min_length`` steps) the maximum over every length >=
    ``min_length``, which is attained in the finite range :meth:`~lightning_dpts.privacy.SamplingSpec.at_least_lengths`:

    * bottom level with replacement, no augmentation (Theorems 4.2, 4.4, E.1, F.1): every profile is
      non-decreasing in r = min(k, T)/T, which is non-increasing in T, so the shortest series decides;
    * augmentation (Theorem G.1): the profile is non-decreasing in p2, so the length with the largest p2
      decides; p2 is evaluated for every length with T < L_C + L_F and the shortest one above (beyond it p2
      falls as 1/T);
    * bottom-level Poisson (Theorems E.8, F.2): the profile is non-decreasing in k and in r separately, but
      k = min(k_max, T) grows and r = min(1, lambda/T) falls with T, so every length with lambda < T < k_max
      is a member, plus the longest with T <= lambda and the shortest with T >= max(k_max, lambda). More than
      :data:`MAX_LENGTH_MEMBERS` members are grouped into runs of consecutive lengths, each accounted with
      its largest k and largest r (a dominating, slightly pessimistic member).

    Args:
        spec: the sampling description (usually ``datamodule.sampling_spec``).
        noise_multiplier: sigma, noise std on the summed clipped gradient divided by the clipping norm C.
        bound: ``"upper"`` for the best sound upper bound (a guarantee), ``"lower"`` for the paper's
            optimistic lower bound (what the mechanism provably leaks in the worst case; not a guarantee).

    Raises:
        ConfigurationError: for out-of-range inputs and configurations no theorem covers.
    """
    sigma = _check_sigma(noise_multiplier)
    if bound not in BOUNDS:
        raise ConfigurationError("bound", bound, "must be 'upper' or 'lower'")
    if spec.lengths is None:  # every series has at least min_length steps: the worst case over those lengths
        lengths = spec.at_least_lengths()
        label = f"worst case over lengths >= {spec.min_length}"
        if len(lengths) == 1:  # the shortest decides: the same profile as exactly min_length steps
            return _single_length_profile(spec, sigma, bound)
        profile = select_profile(dataclasses.replace(spec, lengths=lengths), sigma, bound)
        return _relabel(profile, profile.theorem.replace(f"max over {len(lengths)} series lengths", label),
                        profile.kind)
    if len(spec.lengths) == 1:
        return _single_length_profile(spec, sigma, bound)
    count = len(spec.lengths)
    if spec.has_augmentation:
        threshold = spec.window_length  # T >= L_C + L_F: worst position sees every window, p2 ~ 1/T
        candidates = [L for L in spec.lengths if L - spec.prediction_length + 1 < threshold]
        above = [L for L in spec.lengths if L - spec.prediction_length + 1 >= threshold]
        if above:
            candidates.append(above[0])
        _augmented_profile(spec.at_length(spec.min_length), sigma, bound)  # validates the configuration
        best = max(candidates, key=lambda L: augmentation_leak_probability(spec.at_length(L)))
        profile = _single_length_profile(spec.at_length(best), sigma, bound)
        return _relabel(profile, f"{profile.theorem}, max over {count} series lengths (L={best} decides)",
                        profile.kind)
    if spec.bottom_level_scheme.shortest_series_decides:
        profile = _single_length_profile(spec.at_length(spec.min_length), sigma, bound)
        return _relabel(profile, f"{profile.theorem}, max over {count} series lengths (the shortest decides)",
                        profile.kind)
    return _poisson_max_profile(spec, sigma, bound)


def _relabel(profile: PrivacyProfile, theorem: str, kind: str) -> PrivacyProfile:
    return dataclasses.replace(profile, theorem=theorem, kind=kind)


def _poisson_members(spec: SamplingSpec) -> list[tuple[int, int, float]]:
    """(T, k, r) of the lengths that can attain the maximum for bottom-level Poisson (undominated ones)."""
    lam = spec.instances_per_series
    k_max = spec.relation.windows_containing(spec.window_length, 2**62)
    starts = [L - spec.prediction_length + 1 for L in spec.distinct_lengths]
    low = [T for T in starts if T <= lam]
    high = [T for T in starts if T >= max(k_max, lam)]
    chosen = ([max(low)] if low else []) + [T for T in starts if lam < T < k_max] + ([min(high)] if high else [])
    members = [(T, min(k_max, T), min(1.0, lam / T)) for T in sorted(set(chosen))]
    return [m for m in members
            if not any(o != m and o[1] >= m[1] and o[2] >= m[2] for o in members)]


def _poisson_unit_profile(spec: SamplingSpec, k: int, r: float, sigma: float, bound: str) -> PrivacyProfile:
    """The member of one series length (k windows per unit, rate r) under the spec's top level."""
    return spec.top_level_scheme.unit_profile(spec, sigma, bound, k=k, r=r)


def _poisson_max_profile(spec: SamplingSpec, sigma: float, bound: str) -> PrivacyProfile:
    """Pointwise maximum of Theorem E.8/F.2 (F.8 for the lower bound) over the lengths present."""
    _single_length_profile(spec.at_length(spec.min_length), sigma, bound)  # validates the configuration
    members = _poisson_members(spec)
    grouped = len(members) > MAX_LENGTH_MEMBERS
    if grouped and bound == "upper":
        # Runs of consecutive members, each dominated by its largest k and largest r (the profile is
        # non-decreasing in both; docs/privacy.md).
        runs = np.array_split(np.arange(len(members)), MAX_LENGTH_MEMBERS)
        params = [(max(members[i][1] for i in run), max(members[i][2] for i in run)) for run in runs]
    elif grouped:
        # A lower bound may leave lengths out: every member is attained by a series that is present.
        picks = np.unique(np.linspace(0, len(members) - 1, MAX_LENGTH_MEMBERS).round().astype(int))
        params = [(members[i][1], members[i][2]) for i in picks]
    else:
        params = [(k, r) for _, k, r in members]
    parts = [_poisson_unit_profile(spec, k, r, sigma, bound) for k, r in params]
    kinds = {p.kind for p in parts}
    if bound == "lower":
        kind = "lower"
    elif kinds == {"tight"} and not grouped:
        kind = "tight"
    else:
        kind = "upper"
    Ts = ", ".join(str(T) for T, _, _ in members[:6]) + (", ..." if len(members) > 6 else "")
    theorem = (f"{parts[0].theorem.split(' (')[0]}, max over {len(spec.distinct_lengths)} series lengths "
               f"({len(members)} members: T = {Ts}{'; grouped' if grouped and bound == 'upper' else ''})")
    if len(parts) == 1:
        return _relabel(parts[0], theorem, kind)
    return profiles.pointwise_max(parts, theorem, kind, f"max of {len(parts)} profiles: "
                                  + "; ".join(p.description for p in parts[:3]) + ("; ..." if len(parts) > 3 else ""))


def _single_length_profile(spec: SamplingSpec, sigma: float, bound: str) -> PrivacyProfile:
    """The profile when every series has ``spec.min_length`` steps (docs/privacy.md's theorem table)."""
    if spec.has_augmentation:
        return _augmented_profile(spec, sigma, bound)
    # the top level picks the composition unit (epoch: Appendix E; step: Appendix F), the bottom level the theorem
    return spec.top_level_scheme.unit_profile(spec, sigma, bound)


def _augmented_profile(spec: SamplingSpec, sigma: float, bound: str) -> PrivacyProfile:
    """Theorem G.1 (and its Appendix I extensions); every other augmented configuration is an error."""
    if not spec.top_level_scheme.supports_augmentation:
        raise ConfigurationError(
            "top_level",
            spec.top_level,
            "amplification by context/forecast noise (Theorem G.1) is proven for top_level="
            "'without_replacement' (and, via Lemma F.3, 'poisson'); set context_noise = forecast_noise = 0 "
            "to account iteration/shuffling without it",
        )
    if not spec.bottom_level_scheme.supports_augmentation:
        raise ConfigurationError(
            "bottom_level",
            spec.bottom_level,
            "amplification by context/forecast noise (Theorem G.1) is proven for bottom_level="
            "'with_replacement' only; set context_noise = forecast_noise = 0 for Poisson bottom level",
        )
    if spec.instances_per_series != 1:
        raise ConfigurationError(
            "instances_per_series",
            spec.instances_per_series,
            "amplification by context/forecast noise (Theorem G.1) is proven for instances_per_series=1 only",
        )
    if bound == "lower":
        raise ConfigurationError(
            "bound", bound, "the paper gives no optimistic lower bound with augmentation (Theorem G.1)"
        )
    p2 = augmentation_leak_probability(spec)
    theorem = "Theorem 4.5" if spec.context_noise == spec.forecast_noise else "Theorem G.1"
    if spec.relation.size != 1 or spec.relation.level != "event":
        theorem += " (Appendix I.2)"
    if spec.relation.num_dims != 1:
        theorem += " (Appendix I.1)"
    return profiles.theorem_g_1(p2, sigma, _theorem=theorem)


def naive_dpsgd_profile(spec: SamplingSpec, noise_multiplier: float, bound: str = "upper") -> PrivacyProfile:
    """What DP-SGD over the flattened set of all N * T windows gives (Appendix C.3), per step.

    ``bound="upper"`` is Proposition C.1, the guarantee standard DP-SGD would *report* (valid only if one
    window were the unit of privacy); ``bound="lower"`` is Proposition C.2, an optimistic lower bound on the
    true per-step leakage for the spec's relation, where k windows contain the protected unit.
    """
    sigma = _check_sigma(noise_multiplier)
    total = spec.num_series * spec.num_start_positions
    if spec.batch_size > total:
        raise ConfigurationError("batch_size", spec.batch_size, f"must be <= N * T = {total} windows")
    if bound == "upper":
        return profiles.proposition_c_1(total, spec.batch_size, sigma)
    if bound == "lower":
        return profiles.proposition_c_2(total, spec.windows_per_unit, spec.batch_size, sigma)
    raise ConfigurationError("bound", bound, "must be 'upper' or 'lower'")

"""Counting work instead of timing it (issue 39: no test asserts a wall-clock limit).

A test that guards against a slow path counts what the slow path would do many more times: points pushed through
the FFTs and convolutions that every privacy-loss composition runs (scipy.fft, scipy.signal.fftconvolve,
numpy.convolve, which both this package and dp_accounting call through their modules, so a patch of the module
attribute sees every call), rows of data read (pandas.read_csv / read_parquet) and Trainer fits. The counts do not
depend on the machine or its load.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest


class Work:
    """Calls and points per counted kernel (``calls["rfft"]``, ``points["rfft"]``)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.points: Counter[str] = Counter()

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    @property
    def total_points(self) -> int:
        return sum(self.points.values())

    def wrap(self, monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
             size: Callable[..., int] = lambda *a, **k: 0) -> None:
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            self.points[name] += int(size(*args, **kwargs))
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def _fft_size(x, n=None, *args, **kwargs) -> int:
    n = kwargs.get("n", n)
    return int(np.size(x)) if n is None else int(n) * max(1, int(np.size(x)) // max(1, np.shape(x)[-1]))


def _pair_size(a, b, *args, **kwargs) -> int:
    return int(np.size(a)) + int(np.size(b))


def count_kernel_work(monkeypatch: pytest.MonkeyPatch) -> Work:
    """Count the FFT and convolution calls (and their points) of privacy-loss compositions from now on."""
    import scipy.fft
    import scipy.signal

    work = Work()
    for name in ("rfft", "irfft", "fft", "ifft"):
        work.wrap(monkeypatch, scipy.fft, name, _fft_size)
    work.wrap(monkeypatch, scipy.signal, "fftconvolve", _pair_size)
    work.wrap(monkeypatch, np, "convolve", _pair_size)
    return work


def count_data_and_training(monkeypatch: pytest.MonkeyPatch) -> Work:
    """Count tables read (pandas), Trainer fits and privacy-loss kernels: a refusal made up front does none."""
    import lightning.pytorch as pl
    import pandas as pd

    work = count_kernel_work(monkeypatch)
    work.wrap(monkeypatch, pd, "read_csv")
    work.wrap(monkeypatch, pd, "read_parquet")
    work.wrap(monkeypatch, pl.Trainer, "fit")
    return work

"""Use a model ``dpts fit`` trained without reading ``fit.py``: checkpoint, predictor, forecasts as CSV.

``dpts fit`` writes, next to ``dp-model.ckpt``:

* ``predictor/`` - a GluonTS predictor (``PyTorchPredictor.serialize``: input transformation, network
  constructor arguments and weights). ``gluonts.model.Predictor.deserialize(Path("run/predictor"))`` gives a
  predictor whose ``predict(dataset)`` forecasts new data;
* ``model.json`` - the LightningModule class, its constructor arguments and the estimator that built it
  (GluonTS serde encoding), the frequency and the window lengths.

The GluonTS quirk. GluonTS torch LightningModules take their constructor arguments through ``@validated()`` and
never call ``save_hyperparameters``, so their Lightning checkpoints carry no ``hyper_parameters`` and
``SomeLightningModule.load_from_checkpoint(path)`` fails with ``model_kwargs field required`` - for any GluonTS
checkpoint, DP or not. :func:`make_checkpoint_loadable` records the constructor arguments as Lightning
hyperparameters before training. Arguments that equal the model's defaults and are objects (the default
``StudentTOutput()`` distribution head) are left out, so that the checkpoint loads with torch's default
``weights_only=True`` unpickler; the class default rebuilds the same object. A non-default object argument is
kept, and that checkpoint then needs ``load_from_checkpoint(path, weights_only=False)`` (a file you trust).

Only the DP-trained model is exported. The optional non-DP reference model of ``dpts fit`` is trained on the
private data without noise and is never written to disk.

``dpts predict --model DIR --data PATH`` (:func:`lightning_dpts.app.jobs.predict.predict_to_csv`) writes the
forecasts of every series in a long-format file, starting after the series' last time stamp, as quantiles in a CSV
file, with :func:`load_predictor` and :func:`forecast_table`.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "MODEL_FILE",
    "PREDICTOR_DIR",
    "attach_quantile_predict_step",
    "check_quantiles",
    "export_model",
    "forecast_table",
    "load_predictor",
    "make_checkpoint_loadable",
    "model_frequency",
]

#: Sub-directory of a ``dpts fit`` run holding the serialized GluonTS predictor.
PREDICTOR_DIR = "predictor"
#: File of a ``dpts fit`` run describing the model (class, constructor arguments, estimator, geometry).
MODEL_FILE = "model.json"

_PREDICTOR_MARKERS = ("gluonts-config.json", "type.txt")  # GluonTS >= 0.14 / older
_PRIMITIVES = (int, float, str, bool, type(None))


def _is_plain(value: Any) -> bool:
    """Whether ``value`` is made only of types torch's ``weights_only`` unpickler accepts."""
    if isinstance(value, _PRIMITIVES):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _same(a: Any, b: Any) -> bool:
    from gluonts.core import serde

    try:
        return serde.encode(a) == serde.encode(b)
    except Exception:  # not serde-encodable: compare conservatively
        return a is b


def _loadable_hparams(module: Any) -> dict[str, Any]:
    init_args = getattr(module, "__init_args__", None)
    if init_args is None:
        raise ConfigurationError(
            "model", type(module).__name__,
            "must be a GluonTS torch LightningModule (constructor arguments recorded by @validated())",
        )
    hparams: dict[str, Any] = {}
    for name, value in init_args.items():
        if name == "model_kwargs" and isinstance(value, dict):
            inner = getattr(module, "model", None)
            defaults = {} if inner is None else inspect.signature(type(inner).__init__).parameters
            kwargs = {}
            for key, arg in value.items():
                param = defaults.get(key)
                if not _is_plain(arg) and param is not None and param.default is not inspect.Parameter.empty \
                        and _same(arg, param.default):
                    continue  # the class default rebuilds the same object; keeps the checkpoint weights_only-safe
                kwargs[key] = list(arg) if isinstance(arg, tuple) else arg
            hparams[name] = kwargs
        else:
            hparams[name] = value
    return hparams


def make_checkpoint_loadable(module: Any) -> dict[str, Any]:
    """Record a GluonTS LightningModule's constructor arguments as Lightning hyperparameters.

    Afterwards every checkpoint of ``module`` (``trainer.save_checkpoint``, ``ModelCheckpoint``) loads with
    ``type(module).load_from_checkpoint(path)``. See the module docstring for the quirk this fixes. Returns the
    recorded hyperparameters. Call it before ``trainer.fit`` so that loggers also record the architecture.
    """
    hparams = _loadable_hparams(module)
    module.save_hyperparameters(hparams)
    return hparams


def export_model(estimator: Any, module: Any, directory: str | Path, *, freq: str | None,
                 checkpoint: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``directory/predictor/`` (GluonTS ``serialize``) and ``directory/model.json``.

    Args:
        estimator: the GluonTS estimator whose ``create_transformation``/``create_predictor`` apply to ``module``.
        module: the trained GluonTS torch LightningModule (the DP-trained one; never a non-DP model of
            private data).
        directory: the run directory.
        freq: pandas frequency of the training data (used by ``dpts predict`` to read new data).
        checkpoint: file name of the Lightning checkpoint in ``directory``, recorded in ``model.json``.
        extra: further JSON-able facts to record (e.g. the privacy spent).

    Returns:
        The predictor directory.
    """
    from gluonts.core import serde

    from lightning_dpts.outputs import atomic_directory, write_json

    directory = Path(directory)
    predictor_dir = directory / PREDICTOR_DIR
    predictor = estimator.create_predictor(estimator.create_transformation(), module)
    with atomic_directory(predictor_dir) as tmp:  # a failure leaves no half-written predictor
        predictor.serialize(tmp)
    inner = getattr(module, "model", module)
    description = {
        "lightning_module": f"{type(module).__module__}.{type(module).__qualname__}",
        "constructor_arguments": serde.encode(dict(getattr(module, "__init_args__", {}))),
        "estimator": serde.encode(estimator),
        "freq": freq,
        "prediction_length": int(inner.prediction_length),
        "context_length": int(inner.context_length),
        "past_length": int(getattr(inner, "_past_length", inner.context_length)),
        "checkpoint": checkpoint,
        "predictor": PREDICTOR_DIR,
        "load": {  # paths relative to this directory, so that the run directory can be moved
            "predictor": f"gluonts.model.Predictor.deserialize(Path({PREDICTOR_DIR!r}))",
            "checkpoint": None if checkpoint is None else
            f"{type(module).__qualname__}.load_from_checkpoint({checkpoint!r})",
        },
    }
    if extra:
        description.update(extra)
    write_json(directory / MODEL_FILE, description)
    return predictor_dir


def _predictor_dir(path: str | Path) -> Path:
    path = Path(path)
    for candidate in (path, path / PREDICTOR_DIR):
        if any((candidate / marker).is_file() for marker in _PREDICTOR_MARKERS):
            return candidate
    raise ConfigurationError(
        "model", str(path), f"must be a dpts fit output directory (with {PREDICTOR_DIR}/) or a serialized "
        "GluonTS predictor directory (with gluonts-config.json)",
    )


def load_predictor(path: str | Path) -> Any:
    """The GluonTS predictor of a ``dpts fit`` run directory (or of a predictor directory itself).

    A predictor directory whose files cannot be read (truncated or corrupt weights, a broken configuration)
    raises :class:`ConfigurationError` (``model``).
    """
    from gluonts.model.predictor import Predictor

    directory = _predictor_dir(path)
    try:
        return Predictor.deserialize(directory)
    except Exception as err:  # torch.load / json / serde errors of a damaged directory
        raise ConfigurationError("model", str(path), f"holds a predictor that cannot be loaded ({type(err).__name__}: "
                                 f"{str(err)[:200]}); its files are damaged or were not written by dpts fit: run "
                                 "dpts fit again") from None


def _model_description(path: str | Path) -> dict[str, Any]:
    """``model.json`` of a run (``{}`` where there is none). A file that cannot be read as a JSON object (truncated,
    damaged, not written by ``dpts fit``) raises :class:`ConfigurationError` (``model``)."""
    predictor_dir = _predictor_dir(path)
    for candidate in (predictor_dir.parent / MODEL_FILE, predictor_dir / MODEL_FILE):
        if candidate.is_file():
            try:
                data = json.loads(candidate.read_text())
            except (OSError, ValueError) as err:  # JSONDecodeError, UnicodeDecodeError
                raise ConfigurationError(
                    "model", str(path), f"{candidate} cannot be read as JSON ({type(err).__name__}: {str(err)[:120]}): "
                    "the file is damaged or was not written by dpts fit; restore it or run dpts fit again") from None
            if not isinstance(data, dict):
                raise ConfigurationError("model", str(path), f"{candidate} is not a JSON object as dpts fit writes "
                                         "it; restore it or run dpts fit again")
            return data
    return {}


def model_frequency(path: str | Path) -> str | None:
    """The frequency the model was trained at (``model.json``), ``None`` where it is not recorded."""
    freq = _model_description(path).get("freq")
    if freq is None:
        return None
    from lightning_dpts.data.sources import period_freq

    try:
        period_freq(freq, "model")
    except ConfigurationError:
        raise ConfigurationError("model", str(path), f"its {MODEL_FILE} records freq={freq!r}, which is not a pandas "
                                 "frequency: the file is damaged; restore it or run dpts fit again") from None
    return str(freq)


def model_columns(path: str | Path) -> dict[str, str] | None:
    """The column names the run read its data with (``id_column``, ``timestamp_column``, ``value_column``):
    from ``model.json``, else from the run's ``report.json`` configuration (runs before they were recorded;
    their ``time_column`` key is read too), else ``None``."""
    columns = _model_description(path).get("columns")
    if isinstance(columns, dict):
        return {str(k): str(v) for k, v in columns.items()}
    report = _predictor_dir(path).parent / "report.json"
    if report.is_file():
        try:
            config = json.loads(report.read_text()).get("config") or {}
        except ValueError:
            return None
        if config.get("data") is None:
            return None  # the bundled data: no file, no column names
        out = {"id_column": config.get("id_column"),
               "timestamp_column": config.get("timestamp_column", config.get("time_column")),
               "value_column": config.get("value_column")}
        if all(isinstance(v, str) for v in out.values()):
            return out
    return None


def check_quantiles(quantiles: Sequence[float]) -> list[float]:
    out = []
    for q in quantiles:
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not (0 < q < 1) or not math.isfinite(q):
            raise ConfigurationError("quantiles", q, "every quantile level must lie strictly between 0 and 1")
        out.append(float(q))
    if not out:
        raise ConfigurationError("quantiles", list(quantiles), "give at least one quantile level")
    return out


def forecast_table(forecasts: Sequence[Any], quantiles: Sequence[float], *, id_column: str = "item_id",
                   timestamp_column: str = "timestamp", timestamp_style: dict[str, Any] | None = None) -> pd.DataFrame:
    """GluonTS forecasts as a long table: the id column, the time stamp column (named ``id_column`` and
    ``timestamp_column``), ``horizon`` (1..H), ``mean``, one column per quantile level (named like ``"0.1"``).

    Time stamps are written as :func:`lightning_dpts.data.loading.format_stamps` writes them for ``timestamp_style``
    (the input's own format, e.g. ``2024-06-01`` for a monthly input that wrote ``2024-05-01``); without a
    style, the period's start date in ISO 8601."""
    import warnings

    from lightning_dpts.data.loading import format_stamps

    levels = check_quantiles(quantiles)
    frames = []
    for forecast in forecasts:
        index = forecast.index
        stamps = format_stamps(index, timestamp_style) if index is not None else [""] * forecast.prediction_length
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            columns: dict[str, Any] = {
                id_column: forecast.item_id,
                timestamp_column: list(stamps),
                "horizon": np.arange(1, forecast.prediction_length + 1),
                "mean": np.asarray(forecast.mean, dtype=float),
            }
            for q in levels:
                columns[f"{q:g}"] = np.asarray(forecast.quantile(q), dtype=float)
        frames.append(pd.DataFrame(columns))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def attach_quantile_predict_step(module: Any, quantiles: Sequence[float] | None = None,
                                 num_samples: int = 100) -> Any:
    """Give a GluonTS torch LightningModule a ``predict_step`` so that ``trainer.predict`` works on it.

    GluonTS modules define no ``predict_step``, and Lightning's default calls ``module(batch)`` with the whole
    dict, which their ``forward`` (keyword inputs) rejects. The attached step feeds the model the inputs it
    declares (``module.model.describe_inputs()``) from the batch - e.g. a
    :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` predict batch - and returns the forecast
    quantiles as a ``[B, L_F, Q]`` tensor, estimated from ``num_samples`` sample paths (DeepAR's forward returns
    sample paths; the distribution-head models return distribution arguments, which are sampled). Returns the
    module (changed in place).
    """
    import types

    import torch

    from lightning_dpts.metrics import DEFAULT_QUANTILES

    levels = check_quantiles(DEFAULT_QUANTILES if quantiles is None else quantiles)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ConfigurationError("num_samples", num_samples, "must be an integer >= 1")
    inner = getattr(module, "model", None)
    if inner is None or not hasattr(inner, "describe_inputs"):
        raise ConfigurationError("model", type(module).__name__, "must be a GluonTS torch LightningModule")
    names = list(inner.describe_inputs(1))
    q = torch.tensor(levels)

    def predict_step(self: Any, batch: dict[str, torch.Tensor], batch_idx: int = 0,
                     dataloader_idx: int = 0) -> torch.Tensor:
        out = self.model(**{name: batch[name] for name in names})
        if isinstance(out, tuple) and hasattr(self.model, "distr_output"):
            distr_args, loc, scale = out
            distr = self.model.distr_output.distribution(distr_args, loc, scale)
            samples = distr.sample((num_samples,))  # [S, B, H]
        else:  # sample paths [B, S, H] (DeepAR)
            samples = out.transpose(0, 1)
        return torch.quantile(samples.to(q.dtype), q.to(samples.device), dim=0).permute(1, 2, 0)

    module.predict_step = types.MethodType(predict_step, module)
    return module


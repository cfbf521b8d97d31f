"""``dpts fit --logger csv|tensorboard|mlflow`` (issue 32): the logs live under the run's private/ folder, a logger
whose package is missing is refused before any work."""

from __future__ import annotations

import importlib.util
import json

import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.app.config import FitConfig

FAST = ["--prediction-length", "6", "--model", "simple_feedforward", "--epsilon", "2.0", "--delta", "1e-6",
        "--epochs", "1", "--batch-size", "8", "--no-non-dp", "--no-private-plots", "--test-windows", "1"]


def test_default_logger_is_csv_as_before():
    assert FitConfig().logger == "csv"


@pytest.mark.parametrize("logger, package", [("mlflow", "mlflow"), ("mlflow", "sqlalchemy"),
                                             ("tensorboard", "tensorboard")])
def test_a_logger_without_its_package_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, logger,
                                                                           package):
    real = importlib.util.find_spec
    present = {"mlflow", "sqlalchemy", "tensorboard"} - {package}  # as if only `package` were missing

    def find_spec(name, *a):
        if name in (package, "tensorboardX"):
            return None
        return object() if name in present else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--logger", logger, "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--logger" in err and f"pip install {package}" in err
    assert not (tmp_path / "run").exists()


def test_an_unknown_logger_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--logger", "wandb", "--output-dir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and "--logger" in capsys.readouterr().err


def test_tensorboard_logs_are_private_and_show_the_dp_settings(tiny_csv, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), *FAST, "--logger", "tensorboard", "--output-dir", str(out)]) == 0
    events = list((out / "private" / "logs").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file under private/logs"
    assert not [p for p in out.rglob("events.out.tfevents.*") if "private" not in p.relative_to(out).parts]
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["logger"] == "tensorboard"
    assert report["files"]["private/logs/"].startswith("private: ")  # listed as a folder: ...
    assert "tfevents" not in (out / "report.json").read_text()  # ... the event file's name is not public (R5)
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["dp/noise_multiplier"].number_value == pytest.approx(report["noise_multiplier"])
    assert "dp/max_steps" in hparams and any(not name.startswith("dp/") for name in hparams)
    assert "epsilon" in acc.Tags()["scalars"]


def test_mlflow_logs_are_private(tiny_csv, tmp_path):
    pytest.importorskip("mlflow")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), *FAST, "--logger", "mlflow", "--output-dir", str(out)]) == 0
    assert (out / "private" / "logs" / "mlflow.db").is_file()
    assert not (out / "mlruns").exists() and not (out / "mlflow.db").exists()
    import mlflow

    store = (out / "private" / "logs" / "mlflow.db").resolve()
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{store}")
    run = client.search_runs([client.get_experiment_by_name("dpts").experiment_id])[0]
    report = json.loads((out / "report.json").read_text())
    assert float(run.data.params["dp/noise_multiplier"]) == pytest.approx(report["noise_multiplier"])
    assert "epsilon" in run.data.metrics


def test_r5_public_files_hold_no_host_name_process_id_or_time(tiny_csv, tmp_path):
    """Issue 38, R5: with --logger tensorboard, report.json named the event file
    ``events.out.tfevents.<time>.<host>.<pid>.0``. Now no public file's name or text holds the host name, the process
    id or the event file's time stamp."""
    pytest.importorskip("tensorboard")
    import os
    import re
    import socket

    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), *FAST, "--logger", "tensorboard", "--output-dir", str(out)]) == 0
    event = next((out / "private" / "logs").rglob("events.out.tfevents.*")).name
    stamp = event.split(".")[3]  # the time stamp TensorBoard put into the name
    words = re.compile(rf"(?<![0-9A-Za-z_-])({re.escape(socket.gethostname())}|{os.getpid()}|{stamp})(?![0-9A-Za-z_-])")
    files = json.loads((out / "report.json").read_text())["files"]
    public = [rel for rel, what in files.items() if what.startswith("public: ")]
    assert "report.json" in public and "ledger.json" in public
    for rel in public:
        assert not words.search(rel), rel
        data = (out / rel).read_bytes()
        assert event.encode() not in data and stamp.encode() not in data, rel  # weights are random bytes: the
        if rel.endswith(".json"):  # host name (here 2 letters) and the pid are looked for in text files only
            assert not words.search(data.decode()), rel

"""Issue 24: what a run writes. Public files are the same for neighbouring datasets, private files live under
``private/``, output directories are not silently overwritten or shared, and writes are atomic.

The neighbouring-dataset test plays the attacker of docs/privacy.md's threat model: it knows the code, the
configuration and every public file, and tries to tell D from D' (one held-out value changed) and D'' (one training
value changed). On the code before issue 24 it wins at once: ``report.json`` held seasonal naive's CRPS on the
held-out windows.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lightning_dpts.app.cli import main

FIT = ["fit", "--data", "data.csv", "--prediction-length", "6", "--model", "simple_feedforward", "--epsilon", "2.0",
       "--delta", "1e-6", "--epochs", "1", "--batch-size", "8", "--seed", "1", "--output-dir", "run"]
#: The DP model's own weights: covered by the guarantee, but they differ between neighbouring datasets (that is
#: what DP allows, with bounded probability ratios); every other public file must not depend on the data at all.
MODEL_WEIGHTS = {"dp-model.ckpt", "predictor/prediction-net-state.pt", "checkpoints/last.ckpt"}


def _public(run: Path) -> dict[str, bytes]:
    """Every file outside ``private/`` (what a user publishes), the DP weights and the empty lock file aside."""
    return {rel: path.read_bytes() for path in sorted(run.rglob("*")) if path.is_file()
            and not (rel := path.relative_to(run).as_posix()).startswith("private/")
            and rel not in MODEL_WEIGHTS and rel != ".lock"}


def covered(run: Path, files: dict[str, str]) -> bool:
    """The manifest lists every file written, and only those: a file by name, or under a listed private directory
    (whose file names are not public); every listed private directory holds files."""
    on_disk = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
    folders = [rel for rel in files if rel.endswith("/")]
    assert all(rel.startswith("private/") and any(f.startswith(rel) for f in on_disk) for rel in folders), folders
    return on_disk == {f for f in on_disk if f in files or any(f.startswith(d) for d in folders)} and \
        {rel for rel in files if not rel.endswith("/")} <= on_disk


def _fit_in(directory: Path, table: pd.DataFrame, *extra: str) -> Path:
    """Run the tiny seeded fit in ``directory`` (relative paths: the configuration is the same bytes)."""
    directory.mkdir(exist_ok=True)
    table.to_csv(directory / "data.csv", index=False)
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        assert main([*FIT, *extra]) == 0
    finally:
        os.chdir(cwd)
    return directory / "run"


def test_neighbouring_datasets_give_byte_identical_public_files(tiny_csv, tmp_path, capsys):
    data = pd.read_csv(tiny_csv)
    first = data["item_id"] == data["item_id"].iloc[0]
    held_out = data.copy()  # D': the last (held-out test) value of one series +1000
    held_out.loc[first[first].index[-1], "target"] += 1000.0
    trained = data.copy()  # D'': one early (training) value of the same series +1e6
    trained.loc[first[first].index[5], "target"] += 1e6

    runs = {name: _fit_in(tmp_path / name, table) for name, table in
            (("d", data), ("held_out", held_out), ("trained", trained))}
    printed = capsys.readouterr().out
    assert "seasonal naive" in printed and "privacy spent" in printed  # the terminal shows it: its reader owns the data

    public = {name: _public(run) for name, run in runs.items()}
    assert {"report.json", "epsilon.png", "model.json", "predictor/predictor.json"} <= set(public["d"])
    for name in ("held_out", "trained"):
        assert set(public[name]) == set(public["d"])
        for rel, content in public["d"].items():
            assert public[name][rel] == content, f"{rel} tells D from {name}"

    for run in runs.values():
        report = json.loads((run / "report.json").read_text())
        files = report["files"]
        assert covered(run, files)  # the manifest lists every file written, and only those
        for rel, what in files.items():
            assert what.startswith("private: ") == rel.startswith("private/"), rel
        assert {"private/evaluation.json", "private/forecasts.png"} <= set(files)
        assert files["private/logs/"].startswith("private: ") and list((run / "private" / "logs").rglob("metrics.csv"))
        for key in ("metrics", "verdict", "levers", "evaluation", "seconds", "plots", "best_baseline", "baselines"):
            assert key not in report, key
        text = (run / "report.json").read_text()
        for metric in ('"crps"', '"mase"', '"mae"', '"coverage"', '"crps_per_window"'):  # no score of any model
            assert metric not in text, metric
        assert report["seasons"]["season_lengths"] == [12]  # public: from the frequency, not the values
        assert report["epsilon_curve"]["steps"][-1] == report["steps"]
        assert report["epsilon_curve"]["epsilon"][-1] == report["epsilon"]
    # positive control: the private evaluation does tell the datasets apart (which is why it is private)
    evaluation = {n: json.loads((r / "private" / "evaluation.json").read_text()) for n, r in runs.items()}
    assert evaluation["d"]["metrics"]["seasonal_naive"] != evaluation["held_out"]["metrics"]["seasonal_naive"]
    # the whole yardstick is in the private file: every baseline that ran, the best of them, the twin
    private = evaluation["d"]
    assert {"dp", "non_dp", "seasonal_naive"} <= set(private["metrics"]) and private["best_baseline"]["crps"]
    assert set(private["baselines"]["run"]) <= set(private["metrics"])


def test_no_private_outputs_writes_only_public_files(tiny_csv, tmp_path, capsys):
    run = _fit_in(tmp_path, pd.read_csv(tiny_csv), "--no-private-outputs", "--no-non-dp")
    assert "seasonal naive" in capsys.readouterr().out  # the terminal still shows the evaluation
    assert not (run / "private").exists()
    files = json.loads((run / "report.json").read_text())["files"]
    assert all(what.startswith("public: ") for what in files.values())
    assert {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()} == set(files)


def test_the_published_epsilon_curve_is_within_one_percent_of_epsilon_after_every_step(tiny_csv, tmp_path):
    """report.json's epsilon_curve (drawn in epsilon.png) bounds epsilon after every step and stays within 1% of
    the accountant's own epsilon(step) (issue 26: it used to be a staircase of 32 points, 3x too high at step 1)."""
    from lightning_dpts.app.reporting import curve_by_step
    from lightning_dpts.privacy import NeighbouringRelation, SamplingSpec, StructuredSubsamplingAccountant

    run = _fit_in(tmp_path, pd.read_csv(tiny_csv), "--no-private-outputs", "--no-non-dp", "--epochs", "40")
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] > 64  # more steps than the old 32-point grid
    spec_dict = dict(report["privacy_configuration"]["sampling_spec"])
    relation = NeighbouringRelation(**spec_dict.pop("relation"))
    for derived in ("top_level_rate", "bottom_level_rate", "windows_per_unit", "steps_per_epoch"):
        spec_dict.pop(derived)
    spec_dict["lengths"] = tuple(spec_dict["lengths"]) if spec_dict["lengths"] else None
    acc = StructuredSubsamplingAccountant(SamplingSpec(relation=relation, **spec_dict), report["noise_multiplier"])
    steps, bound = curve_by_step(report["epsilon_curve"], report["steps"])
    assert list(steps) == list(range(1, report["steps"] + 1))
    for s in sorted({1, 2, 3, *range(5, report["steps"] + 1, max(1, report["steps"] // 12)), report["steps"]}):
        exact = acc.epsilon(int(s), report["delta"])
        assert exact * (1 - 1e-9) <= bound[s - 1] <= exact * 1.011, (s, exact, bound[s - 1])


def test_rerun_into_a_used_directory_is_refused_and_overwrite_removes_the_stale_plot(tiny_csv, tmp_path, capsys,
                                                                                     monkeypatch):
    """The stale-plot scenario: an earlier run left private/forecasts.png; a new run must not sit next to it."""
    table = pd.read_csv(tiny_csv)
    run = _fit_in(tmp_path, table, "--no-non-dp")
    assert (run / "private" / "forecasts.png").is_file()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main([*FIT, "--no-non-dp", "--no-private-plots"])
    assert exit_.value.code == 2 and "--output-dir" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # untouched
    _fit_in(tmp_path, table, "--no-non-dp", "--no-private-plots", "--overwrite")
    assert not (run / "private" / "forecasts.png").exists()
    files = json.loads((run / "report.json").read_text())["files"]
    assert covered(run, files)


def test_overwrite_never_removes_files_no_run_wrote(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "forecasts.png").write_bytes(b"stale private plot")
    for extra in ([], ["--overwrite"]):
        with pytest.raises(SystemExit) as exit_:
            main(["fit", "--output-dir", str(out), *extra])
        assert exit_.value.code == 2 and "--output-dir" in capsys.readouterr().err
    assert (out / "forecasts.png").read_bytes() == b"stale private plot"


def test_a_file_as_output_dir_is_refused_up_front(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    for out in (target, target / "below"):
        with pytest.raises(SystemExit) as exit_:
            main(["fit", "--output-dir", str(out)])
        assert exit_.value.code == 2 and "--output-dir" in capsys.readouterr().err
    assert target.read_text() == "x"


def test_a_concurrent_writer_is_refused(tmp_path, capsys):
    from lightning_dpts.outputs import LOCK, OutputDirectory, check_output_dir

    out = tmp_path / "run"
    with OutputDirectory(out):  # another run holds the lock (flock locks are per open file description)
        with pytest.raises(SystemExit) as exit_:
            main(["fit", "--output-dir", str(out), "--overwrite"])
        assert exit_.value.code == 2 and "another dpts run" in capsys.readouterr().err
        with pytest.raises(Exception, match="another dpts run"):
            OutputDirectory(out, overwrite=True).open()
    fd = os.open(out / LOCK, os.O_RDWR)  # released when the first run ends
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    check_output_dir(out, overwrite=False)  # only the lock and the journal: empty


def test_a_failed_write_leaves_no_file_at_the_final_path(tmp_path):
    from lightning_dpts.outputs import atomic_path, write_text

    path = tmp_path / "report.json"
    with pytest.raises(OSError, match="No space"):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b'{"half": ')
            raise OSError(28, "No space left on device")
    assert not path.exists() and list(tmp_path.iterdir()) == []
    write_text(path, "old")
    with pytest.raises(OSError):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"trunc")
            raise OSError(28, "No space left on device")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_failed_checkpoint_write_leaves_no_checkpoint(tiny_csv, tmp_path, monkeypatch, capsys):
    """Disk full while Lightning writes dp-model.ckpt: the run fails and no truncated checkpoint is left."""
    import lightning as L

    def half_then_full(self, filepath, weights_only=False, storage_options=None):
        Path(filepath).write_bytes(b"PK\x03\x04 truncated")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(L.Trainer, "save_checkpoint", half_then_full)
    table = pd.read_csv(tiny_csv)
    (tmp_path / "d").mkdir()
    table.to_csv(tmp_path / "d" / "data.csv", index=False)
    monkeypatch.chdir(tmp_path / "d")
    assert main([*FIT, "--no-non-dp"]) == 1
    assert "No space left" in capsys.readouterr().err
    run = tmp_path / "d" / "run"
    assert not (run / "dp-model.ckpt").exists()
    assert not [p for p in run.rglob("*") if p.name.startswith(".dp-model.ckpt")]  # no temporary left either
    # the failed run's files are in its journal: --overwrite may clean them up
    from lightning_dpts.outputs import check_output_dir

    monkeypatch.undo()
    monkeypatch.chdir(tmp_path / "d")
    check_output_dir("run", overwrite=True)


def test_synth_refuses_bad_input_before_creating_anything(tiny_csv, tmp_path, capsys):
    import numpy as np

    out = tmp_path / "synth"
    gap = tmp_path / "gap.csv"  # every series has a missing value inside the last TSTR context only
    values = np.arange(30.0)
    values[23] = np.nan
    pd.DataFrame({"id": np.repeat(["a", "b", "c"], 30), "timestamp": np.tile(pd.date_range("2000-01-01", periods=30,
                  freq="MS"), 3), "value": np.tile(values, 3)}).to_csv(gap, index=False)
    for args in (["--data", str(tmp_path / "missing.csv")], ["--data", str(tiny_csv), "--length", "500"],
                 ["--data", str(tiny_csv), "--public-data", str(tmp_path / "missing.csv")],
                 ["--data", str(gap), "--length", "8", "--prediction-length", "4", "--num-samples", "4"]):
        with pytest.raises(SystemExit) as exit_:
            main(["synth", *args, "--no-progress", "--output-dir", str(out)])
        assert exit_.value.code == 2, capsys.readouterr().err
        assert not out.exists()


def test_synth_splits_public_and_private_files(tiny_csv, tmp_path, capsys):
    tiny = ["--length", "12", "--num-samples", "8", "--iterations", "2", "--prediction-length", "4",
            "--pretrain-epochs", "1,1", "--num-public", "64", "--tstr-steps", "3", "--lookahead", "1", "--no-progress"]
    out = tmp_path / "synth"
    assert main(["synth", "--data", str(tiny_csv), *tiny, "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("c_fid", "c_fid_initial", "tstr", "private_windows", "private_windows_skipped_missing", "seconds"):
        assert key not in report, key
    files = report["files"]
    assert covered(out, files)
    assert files["synthetic.csv.gz"].startswith("public: ")
    assert files["private/real_vs_synthetic.png"].startswith("private: ")
    assert "c_fid" in json.loads((out / "private" / "evaluation.json").read_text())
    for rel, what in files.items():
        assert what.startswith("private: ") == rel.startswith("private/"), rel
    cache = [rel for rel in files if rel.startswith("pretrained-")]
    assert len(cache) == 1 and files[cache[0]].startswith("public: ")
    # a second run needs --overwrite; it keeps the public pretrained weights and writes no private file
    with pytest.raises(SystemExit) as exit_:
        main(["synth", "--data", str(tiny_csv), *tiny, "--output-dir", str(out)])
    assert exit_.value.code == 2 and "--output-dir" in capsys.readouterr().err
    assert main(["synth", "--data", str(tiny_csv), *tiny, "--no-tstr", "--no-private-outputs", "--overwrite",
                 "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["public_models"]["reused"] is True and not (out / "private").exists()
    assert covered(out, report["files"])
    shutil.rmtree(out)
    assert main(["synth", "--data", str(tiny_csv), *tiny, "--no-tstr", "--no-private-plots",
                 "--output-dir", str(out)]) == 0
    assert (out / "private" / "evaluation.json").is_file() and not (out / "private" / "real_vs_synthetic.png").exists()


def test_overwrite_removes_the_journaled_files_and_leftover_temporaries_and_keeps_public_caches(tmp_path):
    """A run killed mid-write leaves ``.NAME.<random>.tmp``: --overwrite removes it with the files the journal lists;
    a cache matched by ``keep`` stays (and stays listed); a file no run wrote makes it refuse."""
    from lightning_dpts.errors import ConfigurationError
    from lightning_dpts.outputs import JOURNAL, OutputDirectory, write_text

    out = tmp_path / "run"
    with OutputDirectory(out) as run:
        for rel in ("report.json", "private/evaluation.json", "cache-1.pt"):
            write_text(run.register(rel, f"{'private' if rel.startswith('private') else 'public'}: x"), "old")
        run.register("predictor/", "public: a directory")
        write_text(out / "predictor" / "net.pt", "weights")
    write_text(out / ".report.json.k3x_9.tmp", "half")  # what a kill -9 during an atomic write leaves
    (out / ".predictor.ab12.tmp").mkdir()
    write_text(out / ".predictor.ab12.tmp" / "net.pt", "half")
    with OutputDirectory(out, overwrite=True, keep={"cache-*.pt": "public: a cache"}) as run:
        left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
        assert left == [".dpts-files.json", ".lock", "cache-1.pt"]
        assert json.loads((out / JOURNAL).read_text())["paths"] == ["cache-1.pt"]
    write_text(out / "mine.txt", "not written by dpts")
    with pytest.raises(ConfigurationError, match="mine.txt"):
        OutputDirectory(out, overwrite=True).open()
    assert (out / "mine.txt").read_text() == "not written by dpts" and (out / "cache-1.pt").is_file()


def test_a_refusal_inside_the_run_leaves_nothing_behind(tmp_path):
    """A ConfigurationError raised while the directory is open (e.g. a check during training) removes what the
    run wrote and the directories it created; an earlier run's kept cache stays."""
    from lightning_dpts.errors import ConfigurationError
    from lightning_dpts.outputs import OutputDirectory, write_text

    out = tmp_path / "new" / "run"
    with pytest.raises(ConfigurationError):
        with OutputDirectory(out) as run:
            write_text(run.register("private/evaluation.json", "private: x"), "{}")
            raise ConfigurationError("model", "buffer", "changed during DP training")
    assert not (tmp_path / "new").exists()

    with OutputDirectory(out) as run:
        write_text(run.register("cache-1.pt", "public: a cache"), "weights")
    with pytest.raises(ConfigurationError):
        with OutputDirectory(out, overwrite=True, keep={"cache-*.pt": "public: a cache"}) as run:
            write_text(run.register("report.json", "public: x"), "{}")
            raise ConfigurationError("model", "buffer", "changed during DP training")
    assert sorted(p.name for p in out.iterdir()) == [".dpts-files.json", ".lock", "cache-1.pt"]


def test_dp_metrics_are_released_with_noise_and_their_epsilon_is_composed(tiny_csv, tmp_path, capsys):
    """--dp-metrics-epsilon: the only evaluation number in the public report is Laplace-noised (sensitivity = the
    test windows of one series) and its epsilon is taken from the training budget."""
    run = _fit_in(tmp_path, pd.read_csv(tiny_csv), "--no-non-dp", "--no-private-outputs", "--test-windows", "2",
                  "--dp-metrics-epsilon", "0.5")
    assert "DP-released (public)" in capsys.readouterr().out
    report = json.loads((run / "report.json").read_text())
    released = report["dp_metrics"]
    assert released["windows"] == 24 * 2 and 0 <= released["windows_better_than_seasonal_naive_noisy"]
    assert released["epsilon"] == 0.5 and "scale 4 (sensitivity 2" in released["privacy"]
    assert report["epsilon_training"] <= 1.5 and report["epsilon"] == pytest.approx(report["epsilon_training"] + 0.5)
    assert report["dp_hyperparameters"]["epsilon_budget"] == pytest.approx(1.5)


def test_window_wins_and_independent_noise_streams():
    import numpy as np

    from lightning_dpts.evaluation import noisy_count, window_wins
    from lightning_dpts.randomness import resolve_entropy

    y = [np.array([1.0, 2.0]), np.array([1.0, np.nan]), np.array([np.nan, np.nan])]
    exact = [np.tile(v[:, None], (1, 9)) for v in (np.array([1.0, 2.0]), np.array([1.0, 5.0]), np.zeros(2))]
    off = [e + 1.0 for e in exact]
    assert window_wins(exact, off, y) == 2 and window_wins(off, exact, y) == 0 and window_wins(exact, exact, y) == 0
    entropy = resolve_entropy(5)
    a = noisy_count(1000, 1, 0.1, entropy)["value"]
    b = noisy_count(1000, 1, 0.1, entropy, stream=(6, 1))["value"]
    assert a == noisy_count(1000, 1, 0.1, entropy)["value"] and a != b  # each release draws its own noise


@pytest.mark.parametrize("args", [["--dp-metrics-epsilon", "1"],
                                  ["--epsilon", "2", "--dp-metrics-epsilon", "0.5", "--bands", "2",
                                   "--top-level", "b_min_sep", "--noise-multiplier", "2"]])
def test_dp_metrics_epsilon_is_refused_where_the_budget_cannot_hold_it(args, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *args, "--output-dir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and "--dp-metrics-epsilon" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()

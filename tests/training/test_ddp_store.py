"""Two DDP processes read one memory-mapped series store (issue 41; docs/distributed.md).

``python -m torch.distributed.run --nproc-per-node 2 tests/training/ddp_store_worker.py`` on 2 CPU processes
(gloo). Slow-marked: two processes importing torch and Lightning take about a minute on the shared 2-core machine.
Checked: each rank maps the store file (no per-process copy of the values), the shares of every batch form one
global structured sample (their union is rank 0's single-process batch from the broadcast entropy, windows
included), and the DP fit ends with identical weights on both ranks (one noisy update per step).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lightning_dpts.data.store import SeriesStoreWriter
from tests.training import ddp_worker
from tests.training.test_ddp import REPO, _free_port

WORKER = REPO / "tests" / "training" / "ddp_store_worker.py"


@pytest.mark.slow
def test_two_processes_sample_one_global_batch_from_one_mapped_store(tmp_path) -> None:
    with SeriesStoreWriter(tmp_path / "store.arrow", chunk_values=200) as writer:  # several record batches
        for n, values in enumerate(ddp_worker.series()):
            writer.add(f"s{n}", values)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(WORKER), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"store{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["mapped"] and not r["owns_values"] and not r["writeable"]
    reference = ranks[0]["reference"]
    assert len(reference) == 20
    for p, batches in enumerate(reference):
        for s, whole in enumerate(batches):
            a, b = ranks[0]["shares"][p][s], ranks[1]["shares"][p][s]
            assert a["rows"] + b["rows"] == whole["rows"]
            np.testing.assert_array_equal(np.array(a["past"] + b["past"]), np.array(whole["past"]))
            assert a["rows"] and b["rows"]  # without replacement, 4 series x 2 windows: both ranks get windows
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 4
    assert ranks[0]["ledger_steps"] == ranks[1]["ledger_steps"] == 4
    assert ranks[0]["weights"] == ranks[1]["weights"]

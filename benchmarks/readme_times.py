"""Time the commands whose duration README.md and docs/quickstart.md quote, and print the machine.

    python benchmarks/readme_times.py            # every command (several minutes on 2 cores)
    python benchmarks/readme_times.py --only accountant

Each command runs once, in a fresh temporary directory (its run directory is removed afterwards), with the
environment it would have in a user's shell; the wall time is printed next to the machine (CPU model, cores,
threads torch uses, load average before the run) and the date, so a README figure names what it was measured on.
The figures are wall-clock seconds of one run on a shared machine: quote them as "about", with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: name -> (the command as the README shows it, the argv run; {run} is a fresh run directory)
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "accountant": ("python examples/privacy_accounting.py",
                   [sys.executable, str(ROOT / "examples" / "privacy_accounting.py")]),
    "fit-no-baselines": ("dpts fit --output-dir runs/demo --overwrite --no-baselines",
                         [sys.executable, "-m", "lightning_dpts.app.cli", "fit", "--output-dir", "{run}",
                          "--no-baselines"]),
    "fit": ("dpts fit --output-dir runs/demo --overwrite  (make demo)",
            [sys.executable, "-m", "lightning_dpts.app.cli", "fit", "--output-dir", "{run}"]),
}


def machine() -> str:
    """CPU model, cores, torch threads and the load average: the machine a figure was measured on."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        threads = torch.get_num_threads()
    except ImportError:  # pragma: no cover
        threads = None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{model}, {os.cpu_count()} cores, torch threads {threads}, load average {load:.1f}, "
            f"Python {platform.python_version()}, {platform.system()}")


def time_command(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the command and its children, exit code) of one run in a fresh temporary
    directory. On a shared machine the CPU seconds are the steadier figure."""
    with tempfile.TemporaryDirectory(prefix="dpts-readme-times-") as tmp:
        argv = [a.replace("{run}", str(Path(tmp) / "run")) for a in argv]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        cpu_before = _children_cpu()
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - started
        cpu = _children_cpu() - cpu_before
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
        return seconds, cpu, done.returncode


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), help="time these commands only")
    args = parser.parse_args(argv)
    print(f"date: {datetime.date.today().isoformat()}; machine: {machine()}")
    print("| command | wall seconds | CPU seconds | exit code |")
    print("|---|---|---|---|")
    worst = 0
    for name in args.only or list(COMMANDS):
        shown, run = COMMANDS[name]
        seconds, cpu, code = time_command(run)
        worst = max(worst, code)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"| `{shown}` | {seconds:.0f} | {cpu:.0f} | {code} |  (load average {load:.1f} at the end)",
              flush=True)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())

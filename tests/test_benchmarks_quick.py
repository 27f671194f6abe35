"""Every script in ``benchmarks/`` runs its whole path with ``--quick``, so that none rots.

One subprocess per script (found by glob: a new script is covered without a change here), each
must exit 0, print a table, and leave ``benchmarks/results/`` untouched (a quick run's numbers go
to a temporary folder). Slow: all of them together take minutes; ``make test-all`` runs them. The
two SmolLM2 scripts are run by tests of their own instead (``OWN_TEST``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
# scripts whose --quick path a test of their own runs (with more checks), so not twice in the slow set:
# both load SmolLM2 and take 4-30 minutes even quick, by the load on the machine
OWN_TEST = {
    "smollm2_bugs": "tests/bench/test_smollm2_bugs.py",
    "smollm2_practical": "tests/bench/test_smollm2_practical.py",
}
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py")
                 if not p.name.startswith("_") and p.stem not in OWN_TEST)  # _quick.py is their helper
COLUMNS = re.compile(r"\s{2,}|\s*[|│┃]\s*")


def printed_table(stdout: str) -> bool:
    """Whether ``stdout`` has a table: two consecutive lines of three or more columns each
    (columns set apart by two spaces or a rule), a header and a row at least."""
    widths = [len([cell for cell in COLUMNS.split(line.strip()) if cell]) for line in stdout.splitlines()]
    return any(a >= 3 and b >= 3 for a, b in zip(widths, widths[1:]))


def results_state() -> dict[str, int]:
    return {str(p.relative_to(BENCHMARKS)): p.stat().st_mtime_ns for p in (BENCHMARKS / "results").rglob("*")}


def test_every_script_left_out_has_a_test_that_runs_its_quick_path():
    for name, test in OWN_TEST.items():
        assert (BENCHMARKS / f"{name}.py").is_file(), name
        assert "--quick" in (ROOT / test).read_text(), (name, test)


def test_the_table_check():
    assert printed_table("title\nname    ms    tok/s\nours    9.1   1,200\n")
    assert printed_table("┃ a ┃ b ┃ c ┃\n│ 1 │ 2 │ 3 │\n")
    assert not printed_table("wrote results.json\nname: 3\n")


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_quick_mode_runs_and_prints_its_table(script: Path):
    before = results_state()
    run = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    output = f"stdout:\n{run.stdout[-4000:]}\nstderr:\n{run.stderr[-4000:]}"
    assert run.returncode == 0, output
    assert printed_table(run.stdout), output
    assert results_state() == before, "a quick run wrote into benchmarks/results/"

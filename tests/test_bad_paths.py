"""Every command, given a path that is not there (a flag, a positional or a recipe key), says so in one
line that names the path and exits 2, before it loads a model or starts any work: no traceback.

``MISSING`` is a path that does not exist; ``UNDER_FILE`` one that cannot be made because its parent
is a regular file (what an output argument is refused for). The cases run ``cli.main`` in-process;
one runs the installed ``opencomposer`` entry point, as a user does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opencomposer.cli import main

SUITE = "src/opencomposer/suites/cursorbench"
ROOT = Path(__file__).resolve().parents[1]
M, U = "{missing}", "{under_file}"  # filled in per test with tmp_path

CASES = {
    # command: [argv, ...]; each argv holds exactly one bad path
    "quickstart": [["--recipe", M], ["--set", f"model.path={M}"], ["--set", f"model.tokenizer_path={M}"],
                   ["--set", f"run.out_dir={U}"]],
    "pretrain": [["--recipe", M], ["--set", f"model.path={M}"], ["--set", f"model.tokenizer_path={M}"],
                 ["--set", f"sft.tasks={M}"], ["--set", f"run.out_dir={U}"], ["--set", f'corpus.sources=["{M}"]']],
    "models info": [["--recipe", M], ["--set", "model.kind=hf", "--set", f"model.path={M}"],
                    ["--set", f"model.tokenizer_path={M}"]],
    "eval": [["--suite", SUITE, "--recipe", M], ["--suite", M], ["--suite", SUITE, "--out", U],
             ["--suite", SUITE, "--set", f"run.out_dir={U}"], ["--suite", SUITE, "--policy", f"local:{M}"],
             ["--suite", SUITE, "--policy", "local", "--set", f"model.path={M}"],
             ["--suite", SUITE, "--policy", "local", "--set", f"model.tokenizer_path={M}"]],
    "tasks check": [[M]],
    "tasks import": [["humaneval", "--out", U], ["swebench", "instances.jsonl", "--repo", M, "--out", "{tmp}/o"],
                     ["swebench", "instances.jsonl", "--repo", ".", "--find-links", M, "--out", "{tmp}/o"],
                     ["harbor", M, "--out", "{tmp}/o"], ["harbor", SUITE, "--out", "{tmp}/o", "--recipe", M]],
    "tasks export": [["harbor", M, "--out", "{tmp}/o"], ["swebench", M, "--out", "{tmp}/p.jsonl"],
                     ["harbor", SUITE, "--out", U]],
    "tasks generate": [["--kind", "bugs", "--count", "1", "--out", U],
                       ["--kind", "bugs", "--count", "1", "--out", "{tmp}/o", "--source", M],
                       ["--kind", "bugs", "--count", "1", "--out", "{tmp}/o", "--recipe", M]],
    "tasks mine": [[M, "--out", "{tmp}/o"], [".", "--out", U], [".", "--out", "{tmp}/o", "--recipe", M]],
    "tasks stats": [[M], [SUITE, "--png", f"{U}.png"], [SUITE, "--recipe", M]],
    "tasks validate": [[M], [SUITE, "--recipe", M]],
    "tasks build-env": [[M], [SUITE, "--recipe", M]],
    "sft": [["--recipe", M], ["--set", f"sft.init={M}"], ["--set", f"sft.tasks={M}"],
            ["--set", f"model.tokenizer_path={M}"], ["--set", f"sft.out={U}"], ["--set", f"run.out_dir={U}"]],
    "rl": [["--recipe", M], ["--set", f"rl.train_tasks={M}"], ["--set", f"rl.train_tasks={SUITE}", "--set",
           f"rl.eval_suite={M}"], ["--set", f"model.path={M}"], ["--set", f"model.tokenizer_path={M}"],
           ["--set", f"run.out_dir={U}"]],
    "ablate": [["--recipe", M], ["--out", U], ["--set", f"rl.train_tasks={M}"], ["--set", f"model.path={M}"],
               ["--set", f"model.tokenizer_path={M}"], ["--set", f"run.out_dir={U}"]],
    "report": [[M]],
    "serve": [["--model", M]],
    "basecheck": [["--model", M, "--out", "{tmp}/b.json"], ["--model", "tiny_moe", "--out", U],
                  ["--model", "tiny_moe", "--out", "{tmp}/b.json", "--nll-repo", M],
                  ["--model", "tiny_moe", "--out", "{tmp}/b.json", "--history-repo", M],
                  ["--model", "tiny_moe", "--out", "{tmp}/b.json", "--recipe", M]],
    "config": [["--recipe", M]],
}


def _fill(argv: list[str], tmp_path: Path) -> tuple[list[str], str]:
    """``argv`` with its placeholders filled in, and the bad path it names."""
    (tmp_path / "file").write_text("a regular file\n")
    values = {"missing": str(tmp_path / "missing"), "under_file": str(tmp_path / "file" / "out"), "tmp": str(tmp_path)}
    filled = [arg.format(**values) for arg in argv]
    bad = next(values[name] for name in ("missing", "under_file") if any(values[name] in arg for arg in filled))
    return filled, bad


@pytest.mark.parametrize("command, argv", [(c, a) for c, cases in CASES.items() for a in cases],
                         ids=lambda value: value if isinstance(value, str) else " ".join(value))
def test_a_bad_path_is_one_line_and_exit_2(command, argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # SUITE and "." are relative to the repository
    argv, bad = _fill(argv, tmp_path)
    assert main([*command.split(), *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and bad in lines[0], captured.err
    assert not captured.out


def test_the_entry_point_reports_a_missing_training_folder(tmp_path):
    """The installed command, as a user runs it: RL from a recipe whose training folder is not there."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[rl]\ntrain_tasks = "{tmp_path / "missing"}"\n')
    result = subprocess.run([str(Path(sys.executable).parent / "opencomposer"), "rl", "--recipe", str(recipe)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"opencomposer: invalid recipe: rl.train_tasks: {tmp_path / 'missing'}: no such file or folder\n"

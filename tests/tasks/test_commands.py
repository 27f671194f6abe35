"""``opencomposer tasks check|import|export`` through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencomposer.cli import main
from tests.conftest import skip_missing

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def test_check_lists_the_suite(capsys: pytest.CaptureFixture):
    assert main(["tasks", "check", str(FIXTURES)]) == 0
    out = capsys.readouterr().out
    assert "fix-add: 2 fail->pass, 1 pass->pass, gold patch: yes" in out and out.endswith("3 task(s) OK\n")


def test_check_reports_a_broken_folder(tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.toml").write_text("id = 'x y'\n")
    assert main(["tasks", "check", str(tmp_path)]) == 2
    assert f"{tmp_path / 't' / 'task.toml'}: id: 'x y' must be a string" in capsys.readouterr().err


def test_import_humaneval_and_refuse_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture):
    try:
        from opencomposer.tasks.importers import humaneval_wheel

        humaneval_wheel()
    except RuntimeError as e:  # offline machine without the cached wheel (`make setup` fetches it)
        skip_missing(str(e))
    assert main(["tasks", "import", "humaneval", "--limit", "2", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["humaneval-0", "humaneval-1"]
    assert main(["tasks", "import", "humaneval", "--limit", "1", "--out", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.bwrap
def test_export_harbor_and_swebench_predictions(tmp_path: Path):
    assert main(["tasks", "export", "harbor", str(FIXTURES), "--out", str(tmp_path / "harbor")]) == 0
    assert sorted(p.name for p in (tmp_path / "harbor").iterdir()) == ["feature-slugify", "fix-add",
                                                                       "refactor-drop-legacy"]
    assert main(["eval", "--suite", str(FIXTURES), "--policy", "oracle", "--limit", "1",
                 "--out", str(tmp_path / "eval")]) == 0
    preds = tmp_path / "preds.jsonl"
    assert main(["tasks", "export", "swebench", str(tmp_path / "eval" / "results.jsonl"), "--out", str(preds)]) == 0
    [row] = [json.loads(line) for line in preds.read_text().splitlines()]
    assert row["instance_id"] == "feature-slugify" and row["model_name_or_path"] == "oracle"
    assert row["model_patch"] == (FIXTURES / "feature-slugify" / "solution" / "gold.patch").read_text()

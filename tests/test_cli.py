"""The command line: answers --help without torch, reports bad recipes clearly."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from opencomposer import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "for name in ('quickstart', 'models', 'config'):\n"
        "    try:\n        cli.main([name, '--help'])\n    except SystemExit:\n        pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO_TORCH')\n"
    )
    result = _run("-c", code)
    assert result.returncode == 0, result.stderr
    assert "quickstart" in result.stdout
    assert result.stdout.strip().endswith("NO_TORCH")


def test_config_command_prints_resolved_recipe():
    result = _run("-m", "opencomposer.cli", "config", "--set", "model.num_experts=16")
    assert result.returncode == 0, result.stderr
    assert "num_experts = 16" in result.stdout


def test_invalid_recipe_exits_2_with_message():
    result = _run("-m", "opencomposer.cli", "config", "--set", "model.kind=gpt5")
    assert result.returncode == 2
    assert "invalid recipe: model.kind: 'gpt5' (str) is not one of" in result.stderr

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
        "for name in ('quickstart', 'pretrain', 'models', 'eval', 'tasks', 'sft', 'rl', 'report', 'serve', 'basecheck', 'config'):\n"
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


def test_a_recipe_flag_is_the_same_as_its_set_override():
    """``--workers 4`` appends ``tasks.workers=4`` to the overrides, in command-line order with
    the ``--set`` ones: the later of the two wins, and the handler reads only the recipe."""
    from opencomposer.cli import build_parser
    from opencomposer.config import load_recipe

    parser = build_parser()
    flag = parser.parse_args(["tasks", "validate", "suite", "--workers", "4"])
    assert flag.overrides == parser.parse_args(["tasks", "validate", "suite", "--set", "tasks.workers=4"]).overrides
    assert load_recipe(None, flag.overrides).tasks.workers == 4
    args = parser.parse_args(["eval", "--set", "eval.passes=2", "--passes", "3", "--suite", "my suite",
                              "--workers", "5", "--set", "eval.workers=6"])
    config = load_recipe(None, args.overrides)
    assert (config.eval.passes, config.eval.suite, config.eval.workers) == (3, "my suite", 6)
    assert not hasattr(args, "workers")  # nothing for a handler to merge by hand

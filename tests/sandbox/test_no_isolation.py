"""What the sandbox does without bubblewrap; these tests run on every machine.

Without bwrap, ``Sandbox`` refuses unless ``sandbox.isolation = "none"``, which runs commands on
the host with the rlimits and the timeout only and warns each time. Path confinement (``resolve``),
``close`` and the config checks happen on the host whatever the isolation. The jail itself is
tested in ``test_sandbox.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opencomposer.config import ConfigError, SandboxConfig
from opencomposer.sandbox import jail
from opencomposer.sandbox.workspace import PathOutsideWorkspace, Sandbox, SandboxError, SandboxUnavailable


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("VALUE = 1\n")
    return root


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one without bubblewrap, whether or not it has it."""
    monkeypatch.setattr(jail, "BWRAP", "bwrap-not-installed-anywhere")
    monkeypatch.setattr(jail, "_BWRAP_OK", None)


def unisolated(repo: Path | None, **config) -> Sandbox:
    """A ``isolation = "none"`` sandbox; checks that it warns."""
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        return Sandbox(repo, SandboxConfig(isolation="none", **config))


def test_missing_bwrap_refuses_and_says_how_to_fix_it(repo: Path, no_bwrap: None):
    with pytest.raises(SandboxUnavailable) as refused:
        Sandbox(repo)
    message = str(refused.value)
    assert "bubblewrap (bwrap) is missing" in message and "apt-get install bubblewrap" in message
    assert 'sandbox.isolation = "none"' in message


def test_isolation_none_runs_in_the_workspace_with_the_timeout(repo: Path, no_bwrap: None):
    with unisolated(repo) as sb:
        done = sb.run("cat pkg/mod.py; echo err >&2; exit 3")
        killed = sb.run("echo started; sleep 30; echo never", timeout_s=1)
        sb.run("echo 'VALUE = 2' > pkg/mod.py")
        diff = sb.diff()
    assert (done.exit_code, done.output, done.timed_out) == (3, "VALUE = 1\nerr\n", False)
    assert killed.timed_out and killed.output == "started\n"
    assert "-VALUE = 1\n+VALUE = 2\n" in diff
    assert (repo / "pkg" / "mod.py").read_text() == "VALUE = 1\n"  # the source is never touched


def test_isolation_none_keeps_the_rlimits(repo: Path):
    with unisolated(repo, file_size_mb=1) as sb:
        result = sb.run("head -c 5000000 /dev/zero > big.bin; echo $?")
        size = (sb.workspace / "big.bin").stat().st_size
    assert size <= 1 << 20 and result.output.strip().splitlines()[-1] != "0"


def test_resolve_keeps_paths_inside_the_workspace(repo: Path):
    with unisolated(repo) as sb:
        (sb.workspace / "leak").symlink_to("/etc/passwd")
        (sb.workspace / "up").symlink_to("..")
        (sb.workspace / "inner").symlink_to("pkg")
        assert sb.resolve("pkg/mod.py") == sb.workspace / "pkg" / "mod.py"
        assert sb.resolve("/workspace/pkg/mod.py") == sb.workspace / "pkg" / "mod.py"
        assert sb.resolve("inner/mod.py") == sb.workspace / "pkg" / "mod.py"
        for bad in ("../x", "pkg/../../x", "/etc/passwd", "leak", "up/x", "", "a\0b"):
            with pytest.raises(PathOutsideWorkspace):
                sb.resolve(bad)


def test_close_twice_and_run_after_close(repo: Path):
    sb = unisolated(repo)
    root = sb.root
    sb.close()
    sb.close()
    assert not root.exists()
    with pytest.raises(SandboxError, match="closed sandbox"):
        sb.run("true")


def test_max_concurrent_must_not_be_negative():
    with pytest.raises(ConfigError, match="max_concurrent"):
        SandboxConfig(max_concurrent=-1).validate()

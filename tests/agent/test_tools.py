"""Tools: golden results, strict argument checks, and escapes through paths and symlinks refused."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from opencomposer.agent.errors import Submitted
from opencomposer.agent.tools import Toolbox, ToolError, check_arguments
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.types import ToolCall


@pytest.fixture
def box(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "app.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 1\n")
    (repo / "notes.md").write_text("line\n" * 5)
    with Sandbox(repo) as sandbox:
        yield Toolbox(sandbox)


def run(box: Toolbox, name: str, **arguments) -> str:
    return box.execute(ToolCall(name, arguments))


@pytest.mark.bwrap
def test_read_file_numbers_lines_and_pages(box: Toolbox):
    assert run(box, "read_file", path="src/app.py") == (
        "     1\tdef f():\n     2\t    return 1\n     3\t\n     4\t\n     5\tdef g():\n     6\t    return 1"
    )
    assert run(box, "read_file", path="notes.md", offset=2, limit=2) == (
        "     2\tline\n     3\tline\n[lines 2-3 of 5; call read_file with offset=4 for more]"
    )
    with pytest.raises(ToolError, match="offset 9 is past the end of notes.md \\(5 lines\\)"):
        run(box, "read_file", path="notes.md", offset=9)


@pytest.mark.bwrap
def test_list_dir_and_grep(box: Toolbox):
    assert run(box, "list_dir", path=".") == "notes.md (25 bytes)\nsrc/"
    assert run(box, "grep", pattern="return [0-9]") == "src/app.py:2:    return 1\nsrc/app.py:6:    return 1"
    assert run(box, "grep", pattern="def g", path="src") == "src/app.py:5:def g():"
    assert run(box, "grep", pattern="nothing here") == "no matches for 'nothing here' in ."
    with pytest.raises(ToolError, match="^grep: Invalid regular expression"):
        run(box, "grep", pattern="([")


@pytest.mark.bwrap
def test_edit_needs_one_exact_match(box: Toolbox):
    with pytest.raises(ToolError, match=r"occurs 2 times in src/app.py \(at lines 2, 6\)"):
        run(box, "edit", path="src/app.py", old="    return 1", new="    return 2")
    with pytest.raises(ToolError, match="was not found in src/app.py. A line like the first line of `old` is at line 1"):
        run(box, "edit", path="src/app.py", old="def f():\n  return 1", new="x")
    with pytest.raises(ToolError, match="must not be empty"):
        run(box, "edit", path="src/app.py", old="", new="x")
    assert run(box, "edit", path="src/app.py", old="def g():\n    return 1", new="def g():\n    return 2") == (
        "Edited src/app.py: replaced 2 line(s) starting at line 5 with 2 line(s)."
    )
    assert box.sandbox.workspace.joinpath("src/app.py").read_text().endswith("def g():\n    return 2\n")


@pytest.mark.bwrap
def test_write_file_creates_folders(box: Toolbox):
    assert run(box, "write_file", path="pkg/sub/new.py", content="a\nb\n") == "Created pkg/sub/new.py (2 lines)."
    assert run(box, "write_file", path="pkg/sub/new.py", content="c") == "Overwrote pkg/sub/new.py (1 lines)."
    assert box.sandbox.workspace.joinpath("pkg/sub/new.py").read_text() == "c"


@pytest.mark.bwrap
def test_run_reports_exit_code_and_timeouts(box: Toolbox):
    assert run(box, "run", command="echo hi; exit 3") == "hi\n[exit code 3]"
    assert run(box, "run", command="true") == "[exit code 0]"
    assert run(box, "run", command="sleep 5", timeout_s=0.5) == "[timed out after 0.5 s; the command was killed]"
    with pytest.raises(ToolError, match=r"timeout_s must be in \(0, 600\]"):
        run(box, "run", command="true", timeout_s=10_000)


@pytest.mark.bwrap
def test_finish_submits(box: Toolbox):
    with pytest.raises(Submitted, match="all done"):
        run(box, "finish", message="all done")


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (ToolCall("rm_rf", {}), "unknown tool 'rm_rf'; the tools are: read_file, list_dir, grep, edit, write_file, run"),
        (ToolCall("read_file", {"path": "a", "lines": 3}), "read_file: unknown argument 'lines'; valid arguments: path"),
        (ToolCall("edit", {"path": "a", "old": "x"}), "edit: missing required argument 'new'"),
        (ToolCall("read_file", {"path": 3}), "read_file: argument 'path' must be a string, got 3"),
        (ToolCall("read_file", {"path": "a", "offset": True}), "argument 'offset' must be an integer, got True"),
        (ToolCall("read_file", {"path": "a", "offset": 2.0}), "argument 'offset' must be an integer, got 2.0"),
        (ToolCall("run", {"command": "ls", "timeout_s": "9"}), "argument 'timeout_s' must be a number, got '9'"),
        (ToolCall("finish", ["done"]), "finish: arguments must be a JSON object, got list"),
    ],
)
def test_argument_checks_are_strict(call: ToolCall, problem: str):
    with pytest.raises(ToolError) as info:
        check_arguments(call)
    assert problem in str(info.value)


@pytest.mark.bwrap
def test_paths_and_symlinks_cannot_leave_the_workspace(box: Toolbox, tmp_path: Path):
    outside = tmp_path / "outside.txt"
    outside.write_text("HOST FILE\n")
    box.sandbox.workspace.joinpath("leak").symlink_to(outside)
    box.sandbox.workspace.joinpath("updir").symlink_to(tmp_path)
    for name, args in [
        ("read_file", {"path": "../outside.txt"}),
        ("read_file", {"path": str(outside)}),
        ("read_file", {"path": "leak"}),
        ("write_file", {"path": "leak", "content": "pwned"}),
        ("write_file", {"path": "updir/new.txt", "content": "pwned"}),
        ("edit", {"path": "leak", "old": "HOST", "new": "PWNED"}),
        ("list_dir", {"path": "updir"}),
        ("grep", {"pattern": "HOST", "path": "updir"}),
    ]:
        with pytest.raises(ToolError, match="outside the workspace|'..' is not allowed"):
            run(box, name, **args)
    assert outside.read_text() == "HOST FILE\n" and not (tmp_path / "new.txt").exists()
    assert run(box, "grep", pattern="HOST") == "no matches for 'HOST' in ."  # grep does not follow the link out


@pytest.mark.bwrap
def test_special_files_are_refused_without_blocking(box: Toolbox):
    box.sandbox.run("mkfifo pipe; printf 'a\\0b' > blob.bin")
    done = threading.Event()

    def read_pipe():
        with pytest.raises(ToolError, match="not a regular file"):
            run(box, "read_file", path="pipe")
        done.set()

    worker = threading.Thread(target=read_pipe)
    worker.start()
    worker.join(timeout=5)
    assert done.is_set()
    with pytest.raises(ToolError, match="binary file"):
        run(box, "read_file", path="blob.bin")
    with pytest.raises(ToolError, match="is a folder"):
        run(box, "read_file", path="src")
    with pytest.raises(ToolError, match="no such file"):
        run(box, "read_file", path="missing.py")


@pytest.mark.bwrap
def test_a_path_the_system_refuses_is_a_tool_error_not_a_crash(box: Toolbox, monkeypatch: pytest.MonkeyPatch):
    """A policy wrote a 400-character file name (a tiny model looping on a word did): reading it
    raised ENAMETOOLONG out of the episode and stopped the evaluation. Such a path is the model's
    mistake, shown to it like a missing file; the host's own failures still propagate."""
    import errno

    import opencomposer.agent.tools as tools

    long_name = "src/" + " time" * 80 + ".txt"  # in a folder that exists, as the notes/ of its task did
    for name, arguments in (("read_file", {"path": long_name}), ("write_file", {"path": long_name, "content": "x"}),
                            ("edit", {"path": long_name, "old": "a", "new": "b"}),
                            ("read_file", {"path": "notes.md/inside.txt"}),
                            ("write_file", {"path": "notes.md/inside.txt", "content": "x"})):
        with pytest.raises(ToolError, match=f"^{name}: .*(File name too long|Not a directory|a file stands where a folder)"):
            run(box, name, **arguments)
    assert box.sandbox.workspace.joinpath("notes.md").read_text() == "line\n" * 5  # nothing written
    # control: without the rule the same call escapes as the OSError that stopped the evaluation
    monkeypatch.setattr(tools, "PATH_ERRORS", frozenset())
    with pytest.raises(OSError) as raised:
        run(box, "read_file", path=long_name)
    assert raised.value.errno == errno.ENAMETOOLONG and not isinstance(raised.value, ToolError)
    # and an error of the host is never turned into the model's
    monkeypatch.setattr(tools, "PATH_ERRORS", frozenset({errno.ENAMETOOLONG}))

    def full_disk(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(box, "_write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run(box, "write_file", path="a.txt", content="x")

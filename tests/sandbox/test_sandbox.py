"""The sandbox really blocks what model-written code must not do: each test attempts the escape.

Every test here runs commands in the bubblewrap jail; what works without it (``isolation =
"none"``, the refusal when bwrap is missing, path checks on the host) is in ``test_no_isolation.py``.
Limits are checked by their outcomes (the timed-out flag, the exit code, what the command printed,
timestamps the commands took inside the jail), never by how long a run took on this machine;
``benchmarks/sandbox.py`` measures the costs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from opencomposer.config import SandboxConfig
from opencomposer.sandbox.workspace import Sandbox, SandboxError

pytestmark = pytest.mark.bwrap


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (root / "README.md").write_text("hello\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0stale bytecode")
    return root


def test_command_runs_in_the_workspace_as_an_unprivileged_user(repo: Path):
    with Sandbox(repo) as sb:
        result = sb.run("pwd; id -u; cat pkg/mod.py; ls pkg; python -c 'print(6 * 7)'")
    assert result.exit_code == 0 and not result.timed_out and not result.truncated
    assert result.output == "/workspace\n1000\nVALUE = 1\nmod.py\n42\n"  # caches were not copied in


def test_exit_code_and_stderr_are_reported(repo: Path):
    with Sandbox(repo) as sb:
        result = sb.run("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.output) == (7, "out\nerr\n")


def test_network_is_unreachable(repo: Path):
    probe = (
        "import socket\n"
        "for host in [('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
        "    try:\n"
        "        socket.create_connection(host, timeout=3)\n"
        "        print('CONNECTED')\n"
        "    except OSError as e:\n"
        "        print('blocked', e.errno)\n"
        "print(sorted(__import__('os').listdir('/sys/class/net')) if __import__('os').path.exists('/sys/class/net') else 'no sysfs')\n"
    )
    with Sandbox(repo) as sb:
        (sb.workspace / "probe.py").write_text(probe)
        result = sb.run("python probe.py")
    assert "CONNECTED" not in result.output
    assert result.output.splitlines()[:2] == ["blocked 101", "blocked 101"]  # ENETUNREACH: loopback only


def test_writes_outside_the_workspace_do_not_reach_the_host(repo: Path, tmp_path: Path):
    marker = f"oc-escape-{uuid.uuid4().hex[:8]}"
    host_targets = [Path("/tmp") / marker, tmp_path / marker, Path(os.path.realpath(__import__("sys").prefix)) / marker]
    commands = "; ".join(f"echo x > {t} 2>/dev/null && echo WROTE {t}" for t in host_targets)
    with Sandbox(repo) as sb:
        result = sb.run(f"{commands}; touch /{marker} 2>&1; touch /usr/{marker} 2>&1; echo ok > /tmp/{marker}-inside && echo tmp-private")
    assert "WROTE" not in result.output.replace(f"WROTE /tmp/{marker}", "")  # /tmp inside is private
    assert "Read-only file system" in result.output and "tmp-private" in result.output
    for target in host_targets:
        assert not target.exists(), f"{target} appeared on the host"
    assert not (Path("/tmp") / f"{marker}-inside").exists()


def test_hard_links_to_bound_files_are_refused(repo: Path):
    """A hard link in the workspace would let host-side tools write through to a host file."""
    with Sandbox(repo) as sb:
        result = sb.run("ln /usr/bin/env a; ln /etc/passwd b; ln \"$(command -v python)\" c; ls")
    assert result.output.count("Invalid cross-device link") == 3
    assert result.output.splitlines()[-2:] == ["README.md", "pkg"]


def test_files_outside_the_binds_cannot_be_read(repo: Path, tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    source_file = Path(__file__).resolve()
    with Sandbox(repo) as sb:
        result = sb.run(f"cat {secret} {source_file} /etc/shadow /root/.bash_history 2>&1; ls /home 2>&1; cat /proc/1/cmdline | tr '\\0' ' '")
    assert "TOP-SECRET" not in result.output
    assert result.output.count("No such file or directory") == 5
    assert "bwrap" in result.output  # pid 1 is the jail's own init, not the host's


def test_fork_bomb_is_contained_and_leaves_nothing(repo: Path):
    config = SandboxConfig(max_processes=64)
    marker = f"ocbomb{uuid.uuid4().hex[:6]}"
    # The shell forks once, to start the bomb in the background before any pid is taken, then waits
    # on builtins only: a fork of its own afterwards (`sleep`, or the bomb's first pipeline) would race
    # the bomb for the last pids, and bash gives up on a fork that keeps failing -- a property of
    # bash, not of the jail (under load the first pipeline lost that race once).
    wait = "SECONDS=0; while (( SECONDS < 3 )); do :; done"
    bomb = f"{marker}() {{ {marker} | {marker} & }}; {marker} & {wait}; echo survived"
    with Sandbox(repo, config) as sb:
        result = sb.run(bomb, timeout_s=20)
        cgroup = sb._cgroup
        if cgroup is not None:
            assert int((cgroup / "pids.peak").read_text()) <= 64
        after = sb.run("echo usable; ls", timeout_s=20)  # the bomb's leftovers are gone before this runs
    assert "survived" in result.output and not result.timed_out  # the shell went on after the bomb
    assert after.exit_code == 0 and after.output.startswith("usable\n")
    assert "fork" in result.output.lower() or "resource temporarily unavailable" in result.output.lower()
    assert processes_with(marker) == []


def test_memory_hog_fails_inside_the_sandbox(repo: Path):
    with Sandbox(repo, SandboxConfig(memory_mb=512)) as sb:
        result = sb.run("python -c 'x = bytearray(2 << 30); print(len(x))'")
    assert result.exit_code == 1 and "MemoryError" in result.output


def test_endless_loop_is_killed_at_the_wall_clock_limit(repo: Path):
    with Sandbox(repo) as sb:
        result = sb.run("echo started; while true; do :; done; echo never", timeout_s=1)
    assert result.timed_out and result.exit_code == 137  # SIGKILL
    assert result.output == "started\n" and result.duration_s >= 1.0  # not killed before its limit


def test_cpu_time_limit_kills_a_busy_process(repo: Path):
    with Sandbox(repo, SandboxConfig(cpu_s=1)) as sb:
        result = sb.run("python -c 'while True: pass'", timeout_s=20)
    # killed by the 1 s CPU limit, long before the 20 s wall-clock limit would have timed it out
    assert not result.timed_out and result.exit_code in (137, 152)  # SIGKILL or SIGXCPU


def test_huge_output_is_capped_keeping_head_and_tail(repo: Path):
    config = SandboxConfig(output_limit_bytes=2000, max_output_mb=1)
    with Sandbox(repo, config) as sb:
        finite = sb.run("seq 1 100000")
        endless = sb.run("yes", timeout_s=30)
    assert finite.truncated and finite.exit_code == 0
    assert finite.output.startswith("1\n2\n3\n") and finite.output.endswith("99999\n100000\n")
    assert "bytes of output omitted" in finite.output and len(finite.output) < 2200
    assert endless.truncated and not endless.timed_out  # stopped at the output cap, not the time limit
    assert "printed more than 1 MiB" in endless.output and len(endless.output) < 2300


def test_file_size_limit(repo: Path):
    with Sandbox(repo, SandboxConfig(file_size_mb=1)) as sb:
        result = sb.run("head -c 5000000 /dev/zero > big.bin; echo $?")
        size = (sb.workspace / "big.bin").stat().st_size
    assert size <= 1 << 20 and result.output.strip().splitlines()[-1] != "0"


def test_no_process_survives_a_command_or_close(repo: Path):
    marker = f"oc-left-{uuid.uuid4().hex[:8]}"
    with Sandbox(repo) as sb:
        result = sb.run(
            f"(exec -a {marker}-a sleep 1000) & nohup bash -c 'exec -a {marker}-b sleep 1000' >/dev/null 2>&1 & "
            f"setsid bash -c 'exec -a {marker}-c sleep 1000' & echo started",
            timeout_s=30,
        )
        # returned when the shell exited: it did not wait out the sleeps to its limit
        assert result.output.strip() == "started" and not result.timed_out and result.exit_code == 0
        time.sleep(0.2)
        assert processes_with(marker) == []
        root = sb.root
    assert processes_with(marker) == [] and not root.exists()


def test_diff_shows_added_changed_and_deleted_files(repo: Path):
    with Sandbox(repo) as sb:
        sb.run("echo 'VALUE = 2' > pkg/mod.py; rm README.md; printf 'new\\nfile' > notes.txt; mkdir -p .pytest_cache; touch .pytest_cache/x")
        diff = sb.diff()
    assert diff == (
        "diff --git a/README.md b/README.md\n"
        "deleted file mode 100644\n"
        "--- a/README.md\n"
        "+++ /dev/null\n"
        "@@ -1 +0,0 @@\n"
        "-hello\n"
        "diff --git a/notes.txt b/notes.txt\n"
        "new file mode 100644\n"
        "--- /dev/null\n"
        "+++ b/notes.txt\n"
        "@@ -0,0 +1,2 @@\n"
        "+new\n"
        "+file\n"
        "\\ No newline at end of file\n"
        "diff --git a/pkg/mod.py b/pkg/mod.py\n"
        "--- a/pkg/mod.py\n"
        "+++ b/pkg/mod.py\n"
        "@@ -1 +1 @@\n"
        "-VALUE = 1\n"
        "+VALUE = 2\n"
    )


def test_a_jail_that_cannot_be_set_up_is_a_sandbox_error(repo: Path):
    with Sandbox(repo, workdir="/proc/sys/oc-cannot-mount-here") as sb:
        with pytest.raises(SandboxError, match="bubblewrap failed"):
            sb.run("true")


def _stamped_runs(repo: Path, commands: list[tuple[float, float]], limit: int) -> list[tuple[int, int, object]]:
    """Run ``sleep seconds`` under each (seconds, timeout) in its own sandbox and thread, all at once,
    with at most ``limit`` commands running; (start, end, result) of each, the times in nanoseconds
    as the command itself read them inside its jail (the jail shares the host's real-time clock)."""
    import threading

    config = SandboxConfig(max_concurrent=limit)
    sandboxes = [Sandbox(repo, config) for _ in commands]
    results: list = [None] * len(commands)

    def one(i: int) -> None:
        seconds, timeout_s = commands[i]
        results[i] = sandboxes[i].run(f"date +%s%N; sleep {seconds}; date +%s%N", timeout_s=timeout_s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(commands))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sb in sandboxes:
        sb.close()
    spans = []
    for result in results:
        start, end = (int(line) for line in result.output.split())
        spans.append((start, end, result))
    return spans


def test_commands_over_all_sandboxes_wait_for_one_of_max_concurrent_slots(repo: Path):
    spans = _stamped_runs(repo, [(1.0, 30.0)] * 5, limit=2)
    assert all(result.exit_code == 0 and not result.timed_out for _, _, result in spans)
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans])
    running, peak = 0, 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        peak = max(peak, running)
    assert peak == 2  # five sandboxes, never more than two commands at once, and two did run together


def test_waiting_for_a_slot_does_not_count_toward_the_timeout(repo: Path):
    # One slot: whichever command goes second waits ~1 s for it, then runs ~1 s, past its 1.5 s
    # limit if the wait counted.
    spans = _stamped_runs(repo, [(1.0, 1.5), (1.0, 1.5)], limit=1)
    assert all(result.exit_code == 0 and not result.timed_out for _, _, result in spans)
    (first_start, first_end, _), (second_start, second_end, _) = sorted(spans, key=lambda span: span[0])
    assert first_end <= second_start  # the second began only after the first had finished


# --------------------------------------------------------------------------------------------------
# How a command starts: bwrap waits for its options (``--args``) until it has the limits and is in
# the pids cgroup, into which it is born where the kernel allows it (``jail.CgroupSpawner``).


@pytest.mark.parametrize("spawn", ["born in the cgroup", "moved into the cgroup", "behind a shell"])
def test_limits_reach_every_process_of_the_command(repo: Path, spawn: str):
    config = SandboxConfig(cpu_s=7, memory_mb=1234, file_size_mb=3, max_processes=12)
    fork_until_refused = (
        "import os, time\n"
        "children = 0\n"
        "try:\n"
        "    for _ in range(40):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(5)\n"
        "            os._exit(0)\n"
        "        children += 1\n"
        "except BlockingIOError:\n"
        "    print('refused after', children)\n"
    )
    thread_cgroup = Path("/proc/thread-self/cgroup").read_text()
    with Sandbox(repo, config) as sb:
        if spawn == "moved into the cgroup":
            sb._spawner = None  # as on cgroup v2: bwrap is moved in before it reads its options
        if spawn == "behind a shell":
            sb._command_line.wrapped = True  # as for a setuid bwrap, which takes no limits from us
        (sb.workspace / "fork.py").write_text(fork_until_refused)
        result = sb.run("ulimit -t; ulimit -v; ulimit -f; ulimit -c; python fork.py; cat /proc/self/cgroup")
    lines = result.output.splitlines()
    assert lines[:4] == ["7", str(1234 << 10), str(3 << 10), "0"]  # bash counts -v and -f in KiB
    assert lines[4].startswith("refused after ") and int(lines[4].split()[-1]) < 12
    # the jail's cgroup namespace is rooted where bwrap was when it made it: in the sandbox's cgroup
    assert all(line.endswith(":/") for line in lines[5:]), lines[5:]
    assert Path("/proc/thread-self/cgroup").read_text() == thread_cgroup  # the caller's thread is back


def test_bwrap_that_never_gets_its_options_runs_nothing(repo: Path, tmp_path: Path):
    marker = tmp_path / "ran"
    with Sandbox(repo) as sb:
        args_read, args_write = os.pipe()
        os.close(args_write)  # the options never come: end-of-file
        try:
            done = subprocess.run(sb._command_line.argv(args_read, "/bin/sh", f"touch {marker}"),
                                  pass_fds=(args_read,), capture_output=True, timeout=60)
        finally:
            os.close(args_read)
    assert done.returncode != 0 and b"No such file" in done.stderr  # an empty root: no shell to run
    assert not marker.exists()


def test_the_jail_has_no_controlling_terminal_even_when_the_caller_has_one(repo: Path):
    caller = (
        "import os\n"
        "from opencomposer.sandbox.workspace import Sandbox\n"
        "os.setsid()\n"
        "_, terminal = os.openpty()\n"
        "os.open(os.ttyname(terminal), os.O_RDWR)  # a session leader's first terminal becomes its own\n"
        "os.close(os.open('/dev/tty', os.O_RDWR))\n"
        f"with Sandbox({str(repo)!r}) as sb:\n"
        "    print(sb.run('exec 3<>/dev/tty && echo GOT-TTY || echo no-tty').output)\n"
    )
    done = subprocess.run([sys.executable, "-c", caller], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no-tty" in done.stdout and "GOT-TTY" not in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the pids cgroup is made only when running as root")
def test_killing_the_cgroup_spares_the_thread_that_is_spawning_into_it(repo: Path):
    caller = (
        "from opencomposer.sandbox import jail\n"
        "from opencomposer.sandbox.workspace import Sandbox\n"
        f"with Sandbox({str(repo)!r}) as sb:\n"
        "    with sb._spawner.entered() as inside:\n"
        "        jail.empty_cgroup(sb._cgroup)\n"
        "    print('alive', inside)\n"
    )
    done = subprocess.run([sys.executable, "-c", caller], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("alive"), (done.returncode, done.stderr)


def test_the_jail_sees_the_sandboxs_own_read_only_etc(repo: Path):
    expected = {"passwd", "group", "hosts"} | {
        name for name in ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime")
        if os.path.exists(f"/etc/{name}")
    }
    with Sandbox(repo) as sb:
        result = sb.run("ls /etc; getent passwd agent; touch /etc/passwd /etc/new 2>&1 | grep -c 'Read-only'")
    lines = result.output.splitlines()
    assert set(lines[:-2]) == expected
    assert lines[-2:] == ["agent:x:1000:1000:agent:/tmp:/bin/sh", "2"]

"""What the bubblewrap sandbox costs, beside the same work with no sandbox.

1. Start-up: create a sandbox from a small repo, run ``python -c pass``, close it; median of N
   runs, beside ``python -c pass`` run directly (and the same split for ``true``, which isolates
   the jail from the interpreter).
2. Limits: how long past a 1 s wall-clock limit an endless loop is killed, and how long a fork
   bomb's command (``sandbox.max_processes = 64``) takes to return; medians of a few runs. The tests
   check only that these limits hold (``tests/sandbox/test_sandbox.py``), not how fast.
3. Throughput: oracle episodes per second on the first T HumanEval tasks (agent loop, sandbox,
   grading with pytest in a fresh sandbox), with 1 and 2 workers, beside the same run with
   ``sandbox.isolation = "none"`` (rlimits and timeouts only).
4. Per-command cost in an open sandbox: ``Sandbox.run("true")`` on a sandbox created once, beside
   ``true`` run directly and in a raw minimal bubblewrap jail (``--ro-bind / / --dev /dev --proc
   /proc --unshare-all --die-with-parent``: the namespaces and mounts every jail pays for); the
   three are run in turn, N times each, so load on the machine falls on all of them alike; medians
   and the ratio sandbox / raw bwrap. RL's environment service runs thousands of tool calls per
   step, so this is the sandbox's own overhead that matters there.

    .venv/bin/python benchmarks/sandbox.py [--runs 50 --tasks 40] [--only command] [--busy 1]
    .venv/bin/python benchmarks/sandbox.py --quick   # every section, 2 runs and 2 tasks

``--only`` runs one section; ``--busy K`` keeps K processes spinning during the sections (the
per-command cost is most sensitive to a loaded machine). Results are printed and written to
benchmarks/results/sandbox.json, updating the keys measured and keeping the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from _quick import parse_args

from opencomposer.agent.policies.scripted import oracle_policy
from opencomposer.bench.eval import run_eval
from opencomposer.config import Config, SandboxConfig
from opencomposer.sandbox.workspace import Sandbox
from opencomposer.tasks.importers import humaneval_problems, humaneval_task

QUICK = {"runs": 2, "tasks": 2}
REPO = Path(__file__).parents[1] / "tests" / "fixtures" / "tasks" / "fix-add" / "repo"


def median_ms(fn, runs: int) -> float:
    fn()  # warm up caches
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def sandboxed(command: str) -> None:
    with Sandbox(REPO) as sandbox:
        result = sandbox.run(command)
    assert result.exit_code == 0, result.output


def direct(argv: list[str]) -> None:
    subprocess.run(argv, check=True, cwd=REPO, stdin=subprocess.DEVNULL)


def startup(runs: int) -> dict[str, float]:
    out = {
        "sandbox_python_pass_ms": median_ms(lambda: sandboxed("python -c pass"), runs),
        "direct_python_pass_ms": median_ms(lambda: direct([sys.executable, "-c", "pass"]), runs),
        "sandbox_true_ms": median_ms(lambda: sandboxed("true"), runs),
        "direct_true_ms": median_ms(lambda: direct(["/bin/true"]), runs),
    }
    out["python_pass_ratio"] = out["sandbox_python_pass_ms"] / out["direct_python_pass_ms"]
    out["true_ratio"] = out["sandbox_true_ms"] / out["direct_true_ms"]
    return out


def limits(runs: int) -> dict[str, float]:
    overshoot, bomb = [], []
    for _ in range(runs):
        with Sandbox(REPO) as sandbox:
            result = sandbox.run("while true; do :; done", timeout_s=1)
        assert result.timed_out, result
        overshoot.append(result.duration_s - 1.0)
        with Sandbox(REPO, SandboxConfig(max_processes=64)) as sandbox:
            result = sandbox.run("bomb() { bomb | bomb & }; bomb; wait; echo contained", timeout_s=60)
        assert not result.timed_out and "contained" in result.output, result
        bomb.append(result.duration_s)
    return {"timeout_overshoot_ms": 1000 * statistics.median(overshoot),
            "fork_bomb_returned_s": statistics.median(bomb)}


def per_command(runs: int) -> dict[str, float]:
    load = os.getloadavg()[0]
    raw_bwrap = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                 "--unshare-all", "--die-with-parent", "--", "/bin/true"]

    def captured(argv: list[str]) -> None:  # output piped, as the sandbox's is
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    with Sandbox(REPO) as sandbox:
        def sandboxed_true() -> None:
            result = sandbox.run("true")
            assert result.exit_code == 0, result.output

        cases = {"direct": lambda: captured(["/bin/true"]), "raw_bwrap": lambda: captured(raw_bwrap),
                 "sandbox": sandboxed_true}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for fn in cases.values():
            fn()  # warm up caches
        for _ in range(runs):
            for name, fn in cases.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    out: dict[str, float] = {"command_runs": runs, "command_load_at_start": load}
    out.update({f"command_{name}_true_ms": 1000 * statistics.median(t) for name, t in times.items()})
    out["command_sandbox_vs_raw_bwrap"] = out["command_sandbox_true_ms"] / out["command_raw_bwrap_true_ms"]
    return out


@contextlib.contextmanager
def busy(processes: int):
    """``processes`` processes spinning on the CPU until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def throughput(count: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tasks = [humaneval_task(p, Path(tmp) / str(i)) for i, p in enumerate(humaneval_problems()[:count])]
        for name, isolation, workers in (("bwrap_1_worker", "bwrap", 1), ("bwrap_2_workers", "bwrap", 2),
                                         ("none_1_worker", "none", 1), ("none_2_workers", "none", 2)):
            config = Config(sandbox=SandboxConfig(isolation=isolation))
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # isolation = "none" warns per sandbox
                result = run_eval(tasks, oracle_policy(), config, Path(tmp) / name, workers=workers, progress=False)
            elapsed = time.perf_counter() - start
            assert result.summary["resolved"] == 1.0, result.summary
            out[f"{name}_episodes_per_s"] = len(tasks) / elapsed
    out["bwrap_vs_none_1_worker"] = out["bwrap_1_worker_episodes_per_s"] / out["none_1_worker_episodes_per_s"]
    out["bwrap_2_vs_1_workers"] = out["bwrap_2_workers_episodes_per_s"] / out["bwrap_1_worker_episodes_per_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="repetitions of each start-up and per-command measurement")
    parser.add_argument("--tasks", type=int, default=40, help="HumanEval tasks per throughput run")
    parser.add_argument("--only", choices=("startup", "limits", "throughput", "command"), help="run this section only")
    parser.add_argument("--busy", type=int, default=0, help="processes kept spinning on the CPU while measuring")
    args = parse_args(parser, QUICK)
    sections = [args.only] if args.only else ["startup", "limits", "throughput", "command"]
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.2f} at start, {args.busy} spinning processes beside")
    results: dict[str, float] = {"cpus": os.cpu_count()}
    if set(sections) - {"command"}:
        results.update({"load_at_start": load, "runs": args.runs, "busy": args.busy})
    with busy(args.busy):
        if "startup" in sections:
            up = startup(args.runs)
            print(f"\nstart-up, median of {args.runs} (create + run + close for the sandbox):")
            print(f"  python -c pass   sandbox {up['sandbox_python_pass_ms']:7.1f} ms   direct {up['direct_python_pass_ms']:7.1f} ms"
                  f"   ratio {up['python_pass_ratio']:.2f}x")
            print(f"  true             sandbox {up['sandbox_true_ms']:7.1f} ms   direct {up['direct_true_ms']:7.1f} ms"
                  f"   ratio {up['true_ratio']:.2f}x")
            results.update(up)
        if "limits" in sections:
            lim = limits(max(1, args.runs // 10))
            print(f"\nlimits, median of {max(1, args.runs // 10)}:")
            print(f"  endless loop killed {lim['timeout_overshoot_ms']:.0f} ms after its 1 s limit")
            print(f"  fork bomb command returned after {lim['fork_bomb_returned_s']:.2f} s (max_processes = 64)")
            results.update(lim)
        if "throughput" in sections:
            tp = throughput(args.tasks)
            print(f"\noracle on {args.tasks} HumanEval tasks (episode + grading), episodes per second:")
            for workers in ("1_worker", "2_workers"):
                b, n = tp[f"bwrap_{workers}_episodes_per_s"], tp[f"none_{workers}_episodes_per_s"]
                print(f"  {workers.replace('_', ' '):10s} bwrap {b:6.2f}/s   no sandbox {n:6.2f}/s   ratio {b / n:.2f}x")
            print(f"  2 workers vs 1 (bwrap): {tp['bwrap_2_vs_1_workers']:.2f}x")
            results.update({"tasks": args.tasks, **tp})
        if "command" in sections:
            cmd = per_command(args.runs)
            print(f"\nper-command cost in an open sandbox, `true`, median of {args.runs}:")
            print(f"  direct {cmd['command_direct_true_ms']:6.2f} ms   raw bwrap {cmd['command_raw_bwrap_true_ms']:6.2f} ms"
                  f"   Sandbox.run {cmd['command_sandbox_true_ms']:6.2f} ms"
                  f"   sandbox / raw bwrap {cmd['command_sandbox_vs_raw_bwrap']:.2f}x")
            results.update({**cmd, "command_busy": args.busy})
    out = args.results_dir / "sandbox.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**kept, **results}, indent=2) + "\n")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()

"""The HTML reports the project writes, opened in a real headless browser (issue 37 §2).

Each page (the eval's Pareto report, the RL report, the quickstart's page, the ablation report) is
built by the functions that write it, from small synthetic inputs, and opened from ``file://`` in
Debian's ``chromium-headless-shell`` (``make setup`` installs it) with every host name resolving
to nothing, so the page must stand alone. A probe script, put first in the page's ``<head>``,
collects every script error, ``console.error`` and ``console.warn`` call and every resource that
failed to load, and at the ``load`` event writes down each plot (``img``, outer ``svg``) with its
natural and laid-out size and every resource the page fetched; ``--dump-dom`` prints the page
with that record in it. A page passes when nothing went wrong, nothing was fetched from outside
the file, and every plot has a natural size and a box of non-zero width and height.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

from tests.conftest import skip_missing

BROWSER = "chromium-headless-shell"
PROBE = """<script>
window.__problems = [];
addEventListener('error', e => __problems.push(e.message || 'failed to load ' + (e.target.src || e.target.href)), true);
addEventListener('unhandledrejection', e => __problems.push('unhandled rejection: ' + e.reason));
for (const level of ['error', 'warn']) {
  const original = console[level];
  console[level] = (...args) => { __problems.push(level + ': ' + args.join(' ')); original.apply(console, args); };
}
addEventListener('load', () => {
  const outer = [...document.querySelectorAll('img, svg')].filter(e => !e.parentElement.closest('svg'));
  const plots = outer.map(e => {
    const box = e.getBoundingClientRect();
    return {tag: e.tagName.toLowerCase(), alt: e.getAttribute('alt') || '', box: [box.width, box.height],
            natural: e.tagName === 'IMG' ? [e.naturalWidth, e.naturalHeight] : [box.width, box.height]};
  });
  const record = document.createElement('pre');
  record.id = '__probe';
  record.textContent = JSON.stringify({problems: __problems, plots: plots,
                                       fetched: performance.getEntriesByType('resource').map(r => r.name)});
  document.body.appendChild(record);
});
</script>"""


def open_in_browser(page: Path, tmp_path: Path) -> dict:
    """What the probe saw of ``page`` (module doc): ``problems``, ``plots``, ``fetched``."""
    binary = shutil.which(BROWSER)
    if binary is None:
        skip_missing(f"{BROWSER} (Debian: apt-get install chromium-headless-shell; `make setup` does it as root)")
    text = page.read_text()
    assert text.count("<head>") == 1, f"{page}: expected one <head> to put the probe in"
    probed = tmp_path / f"probed-{page.parent.name}-{page.name}"
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    command = [binary, "--no-sandbox", "--disable-gpu", "--headless", "--dump-dom", "--window-size=1280,2000",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000",
               f"--user-data-dir={tmp_path / 'browser-profile'}", probed.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="__probe">(.*?)</pre>', done.stdout, re.S)
    assert done.returncode == 0 and found, f"{BROWSER} exit {done.returncode}; stderr tail: {done.stderr[-1500:]}"
    return json.loads(html.unescape(found.group(1)))


def assert_renders(page: Path, tmp_path: Path, plots: int) -> None:
    seen = open_in_browser(page, tmp_path)
    assert seen["problems"] == [], f"{page.name}: {seen['problems']}"
    assert all(name.startswith("file:") for name in seen["fetched"]), f"{page.name} fetched {seen['fetched']}"
    assert len(seen["plots"]) == plots, seen["plots"]
    for plot in seen["plots"]:
        assert min(plot["natural"]) > 0 and min(plot["box"]) > 0, f"{page.name}: {plot['alt'] or plot['tag']}: {plot}"


def test_the_probe_catches_what_a_broken_page_does(tmp_path: Path):
    """The checks can fail: a script error, a console error, an image that does not decode, an
    image from the network and an empty svg are all seen."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><title>broken</title></head><body>'
                    '<img alt="remote" src="http://example.com/plot.png"><img alt="torn" src="data:image/png;base64,AAAA">'
                    '<svg width="0" height="0"></svg><script>console.error("boom"); notDefined();</script></body></html>')
    seen = open_in_browser(page, tmp_path)
    problems = " | ".join(seen["problems"])
    assert "error: boom" in problems and "notDefined is not defined" in problems
    assert "failed to load http://example.com/plot.png" in problems and "failed to load data:image/png" in problems
    assert [plot["natural"][0] for plot in seen["plots"]] == [0, 0, 0]


def test_the_eval_pareto_report(tmp_path: Path):
    from opencomposer.bench.pareto import write_report
    from opencomposer.bench.summary import summarize
    from opencomposer.types import Grade

    def row(task: str, policy: str, resolved: bool, dollars: float, wall_s: float) -> dict:
        grade = Grade(resolved=resolved, fail_to_pass=float(resolved), pass_to_pass=1.0, tests_passed=1,
                      tests_failed=0, tests_errored=0, test_exit_code=0, test_timed_out=False, rubric_ok=True,
                      files_changed=1, lines_added=1, lines_removed=0, lines_changed=1, todo_added=0,
                      comment_lines_added=0, lint_added=0, grading_s=0.1)
        return {"task_id": task, "status": "ok", "policy": policy, **grade.to_json(), "dollars": dollars,
                "wall_s": wall_s, "first_edit_s": wall_s / 2, "rubric": None}

    summaries = {policy: summarize([row(task, policy, resolved, dollars, wall) for task, resolved in
                                    zip("abcd", outcomes, strict=True)])
                 for policy, outcomes, dollars, wall in (("big", (1, 1, 1, 0), 0.40, 30.0),
                                                         ("small", (1, 0, 1, 0), 0.05, 8.0),
                                                         ("worse", (0, 0, 1, 0), 0.30, 20.0))}
    page = write_report(tmp_path / "eval", summaries, "eval of three policies")
    assert "Pareto front" in page.read_text() and "On the Pareto front" in page.read_text()
    assert_renders(page, tmp_path, plots=2)


def rl_run(run_dir: Path) -> Path:
    """A small RL run folder: training and held-out rows, and a rollout the hack monitor flagged."""
    rows = []
    for step in range(1, 6):
        rows.append({"kind": "train", "step": step, "reward_mean": 0.1 * step, "resolved_rate": 0.1 * step,
                     "loss": 1.0 / step, "kl_ref": 0.01 * step, "entropy": 1.0 - 0.05 * step,
                     "episode_tokens": 100 + step, "episode_turns": 3.0, "hack_suspected_rate": 0.2 if step == 2 else 0.0,
                     "reward/resolved": 0.1 * step})
        rows.append({"kind": "eval", "step": step, "mean_reward": 0.1 * step, "pass_at_1": 0.1 * step,
                     "best_of_k": 0.2 * step, "episode_tokens": 90 + step})
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run_dir / "rollouts").mkdir()
    flagged = {"step": 2, "task_id": "humaneval-0", "sample": 1, "resolved": 1.0, "reward": 0.5,
               "hack_suspected": True, "hack_reasons": ["constant-dunder solution.py:5: __eq__ returns True"],
               "diff": "--- a/solution.py\n+++ b/solution.py\n@@ -1 +1,2 @@\n+class Any:\n"}
    (run_dir / "rollouts" / "step-000002.jsonl").write_text(json.dumps(flagged) + "\n")
    return run_dir


def test_the_rl_report(tmp_path: Path):
    from opencomposer.rl.report import draw_report, hack_monitor_section
    from opencomposer.training.html import HtmlReport

    run_dir = rl_run(tmp_path / "rl")
    report = HtmlReport("RL run")
    report.section("rl", "RL")
    paths = draw_report(run_dir)
    for path in paths:
        report.image(path, path.stem)
    hack_monitor_section(report, run_dir)
    assert_renders(report.write(run_dir / "report.html"), tmp_path, plots=len(paths))


def test_the_quickstart_report(tmp_path: Path):
    """The parts ``commands.quickstart`` puts on its page, in its order: the pretraining loss with
    its table, sampled completions, the SFT loss, the RL curves with the hack monitor, the held-out
    table, the recipe."""
    from opencomposer.pretrain.plots import plot_loss
    from opencomposer.rl.report import draw_report, hack_monitor_section
    from opencomposer.training.html import HtmlReport

    history = [{"kind": "train", "step": step, "loss": 5.0 / step, "lr": 1e-3, "tokens": 64 * step}
               for step in range(1, 9)] + [{"kind": "eval", "step": 8, "heldout_loss": 1.1}]
    report = HtmlReport(f"opencomposer quickstart: {tmp_path}")
    report.section("pretrain", "1. Pretraining")
    report.image(plot_loss(history, tmp_path / "loss.png"), "pretraining loss")
    report.table(["step", "tokens", "train loss", "held-out loss"], [["8", "512", "0.625", "1.100"]])
    report.section("samples", "Sampled completions")
    report.code("def add(a, b):\n    return a + b", caption="'def add'")
    report.section("sft", "2. SFT")
    report.image(plot_loss(history, tmp_path / "sft-loss.png", title="SFT loss"), "SFT loss")
    run_dir = rl_run(tmp_path / "rl")
    report.section("rl", "3. RL")
    report.image(draw_report(run_dir)[-1], "RL curves")
    hack_monitor_section(report, run_dir)
    report.section("heldout", "4. Held-out pass rate before and after RL")
    report.table(["", "before", "after"], [["held-out pass@1", "0.100", "0.500"]])
    report.section("recipe", "Recipe")
    report.code("[run]\nname = 'quickstart'\n")
    assert_renders(report.write(tmp_path / "report.html"), tmp_path, plots=3)


def test_the_ablation_report(tmp_path: Path):
    from opencomposer.bench.ablation import CellRun, write_report

    runs = []
    metrics = ["eval/pass_at_1", "train/reward_mean"]
    for cell, lift in (("rl.advantage.std_normalize=false", 0.0), ("rl.advantage.std_normalize=true", 0.05)):
        for seed in (0, 1):
            run_dir = tmp_path / "cells" / cell / f"seed-{seed}"
            run_dir.mkdir(parents=True)
            rows = [{"kind": kind, "step": step, name: 0.1 * step + lift + 0.01 * seed}
                    for step in (1, 2, 3) for kind, name in (("eval", "pass_at_1"), ("train", "reward_mean"))]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            runs.append(CellRun(cell, {"rl.advantage.std_normalize": cell.rpartition("=")[2]}, seed, str(run_dir),
                                status="finished", metrics={"eval/pass_at_1": 0.3 + lift, "train/reward_mean": 0.3}))
    page = write_report(tmp_path / "study", runs, metrics, "ablation", "[ablation]\nvary = []\n")
    assert_renders(page, tmp_path, plots=len(metrics))

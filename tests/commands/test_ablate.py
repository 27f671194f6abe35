"""``opencomposer ablate``: the grid section, the interval math, bad input, and small grids end to end
(ablation.json, the report, skipping finished runs, resuming a killed one, the shared SFT prefix,
the Ray backend)."""

from __future__ import annotations

import json
import math
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from opencomposer.bench.ablation import (
    CellRun,
    clipped_band,
    format_table,
    interval,
    is_share,
    t_975,
    table,
    table_note,
)
from opencomposer.cli import main
from opencomposer.config import AblationConfig, Config, ConfigError, load_recipe
from opencomposer.config.ablation import cell_name
from opencomposer.config.loader import from_dict

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "recipes" / "ablations" / "advantage-std.toml"
SMALL = [  # the smallest RL run (tests/rl/test_loop.py's), two steps with a checkpoint after each
    "run.threads=1", "model.hidden_size=64", "model.num_layers=2", "model.head_dim=16", "model.num_experts=4",
    "model.moe_intermediate_size=64", "sampling.max_new_tokens=12", "grading.lint=false",
    "rl.task_family=tiny", "rl.batch_tasks=1", "rl.group_size=2", "rl.lr=1e-3", "rl.steps=2", "rl.checkpoint_every=1",
    "rl.eval_every=2", "rl.eval_tasks=1", "rl.eval_samples=2",
]


def sets(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


# --------------------------------------------------------------------------------------------- math


def test_the_interval_is_the_t_interval_of_scipy():
    stats = pytest.importorskip("scipy.stats")
    for values in ([0.5, 0.75, 0.625], [1.0, 2.0], [0.1, 0.4, 0.35, 0.8, 0.2, 0.55], list(map(float, range(40)))):
        found = interval(values)
        low, high = stats.t.interval(0.95, len(values) - 1, loc=stats.tmean(values), scale=stats.sem(values))
        assert found.mean == pytest.approx(stats.tmean(values), abs=1e-12)
        assert (found.low, found.high) == (pytest.approx(low, abs=1e-5), pytest.approx(high, abs=1e-5))
    for df in range(1, 300):
        assert t_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-6), df


def test_the_interval_against_golden_values():
    """Worked by hand: [1, 2, 3] has mean 2 and s = 1, so the half-width is t(0.975, 2) / sqrt(3)."""
    found = interval([1.0, 2.0, 3.0])
    assert found.mean == 2.0 and found.n == 3
    assert found.half == pytest.approx(4.302653 / math.sqrt(3), abs=1e-6)  # 2.484138
    assert interval([0.2, 0.2]).half == 0.0
    one = interval([0.5])
    assert one.half is None and one.low is None and one.text() == "0.500"
    with pytest.raises(ValueError):
        interval([])


def test_a_share_is_drawn_within_0_and_1_and_other_metrics_as_computed():
    # three seeds, one collapsed: the t-interval of a pass rate reaches below 0 and above 1
    found = interval([0.0, 0.664, 0.0])
    assert found.low < 0 and found.high > 1
    for metric in ("eval/pass_at_1", "eval/best_of_k", "train/resolved_rate", "router_replay_replace_rate"):
        assert is_share(metric)
        assert clipped_band(metric, [found.low], [found.high]) == ([0.0], [1.0])
    for metric in ("train/reward_mean", "train/step_s", "train/kl_ref", "train/loss"):
        assert not is_share(metric)
        assert clipped_band(metric, [found.low], [found.high]) == ([found.low], [found.high])


def test_the_table_says_when_there_is_one_seed():
    runs = [CellRun("a=1", {"a": "1"}, 0, "x", "finished", {"eval/pass_at_1": 0.5}),
            CellRun("a=2", {"a": "2"}, 0, "y", "failed", {}, "RuntimeError: boom")]
    header, rows = table(runs, ["eval/pass_at_1"])
    assert rows == [["a=1", "1", "0.500"], ["a=2", "0", "-"]]
    assert "One seed" in table_note(runs) and "no interval" in table_note(runs)
    assert format_table(header, rows).splitlines()[0].split() == ["cell", "seeds", "eval/pass_at_1"]
    two = [*runs, replace(runs[0], seed=1, metrics={"eval/pass_at_1": 0.7})]
    assert table(two, ["eval/pass_at_1"])[1][0][2] == interval([0.5, 0.7]).text()
    assert "95 %" in table_note(two) and "no claim" in table_note(two)


# ------------------------------------------------------------------------------------------ section


def section(text: str) -> AblationConfig:
    return from_dict(Config, tomllib.loads(text)).ablation


def test_the_section_takes_a_table_or_strings_and_makes_the_grid():
    table_form = section('[ablation]\nvary = {"rl.reward.succinctness" = [0.0, 0.05], "rl.kl.estimator" = ["k1"]}\n'
                         "seeds = [0, 1, 2]\n")
    strings = section('[ablation]\nvary = ["rl.reward.succinctness=0.0,0.05", "rl.kl.estimator=\\"k1\\""]\n'
                      "seeds = [0, 1, 2]\n")
    assert table_form.vary == ['rl.reward.succinctness=0.0,0.05', 'rl.kl.estimator="k1"']
    assert table_form.grid() == strings.grid() == [
        {"rl.reward.succinctness": "0.0", "rl.kl.estimator": '"k1"'},
        {"rl.reward.succinctness": "0.05", "rl.kl.estimator": '"k1"'}]  # one value is a fine axis
    assert AblationConfig().grid() == [{}] and AblationConfig().seeds == [0]
    assert [cell_name(cell) for cell in table_form.grid()] == ["rl.reward.succinctness=0.0,rl.kl.estimator=k1",
                                                             "rl.reward.succinctness=0.05,rl.kl.estimator=k1"]
    assert cell_name({"rl.train_tasks": "tasks/a b"}) == "rl.train_tasks=tasks_a_b" and cell_name({}) == "base"
    long = {f"rl.reward.term_{i}": "0.0" for i in range(12)}
    assert len(cell_name(long)) == 120 and cell_name(long) != cell_name({**long, "rl.reward.term_0": "0.1"})
    lists = AblationConfig(vary=['corpus.sources=["stdlib"],["a,b", "c"]'])
    assert [cell["corpus.sources"] for cell in lists.grid()] == ['["stdlib"]', '["a,b", "c"]']


@pytest.mark.parametrize("text, message", [
    ('vary = ["rl.lr"]', "is not KEY=V1,V2"),
    ('vary = ["rl.lr=1e-4,"]', "empty value"),
    ('vary = ["rl.lr=1e-4,1e-4"]', "repeats a value"),
    ('vary = ["rl.lr=1e-4", "rl.lr=3e-4"]', "varied twice"),
    ('vary = ["run.seed=1,2"]', "seeds go in ablation.seeds"),
    ('vary = ["ablation.seeds=[1]"]', "cannot be varied"),
    ('vary = {"rl.lr" = 1e-4}', "expected a list of values"),
    ('vary = {"rl.lr" = [{a = 1}]}', "cannot be a varied value"),
    ("seeds = []", "at least one seed"),
    ("seeds = [1, 1]", "repeats a seed"),
    ('metrics = ["pass_at_1"]', 'not "eval/NAME"'),
    ('prefix = "pretrain"', "is not one of"),
])
def test_the_section_refuses_what_it_cannot_run(text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        section(f"[ablation]\n{text}\n")


def test_the_example_study_is_the_rl_tiny_recipe_with_a_grid():
    study = load_recipe(STUDY)
    assert study.ablation.grid() == [{"rl.advantage.std_normalize": "false"}, {"rl.advantage.std_normalize": "true"}]
    assert study.ablation.seeds == [0, 1, 2] and study.ablation.prefix == "sft"
    plain = replace(study, ablation=AblationConfig(), run=replace(study.run, name="rl-tiny"))
    assert plain == load_recipe(ROOT / "recipes" / "rl-tiny.toml")


def test_the_plan_shares_sft_across_rl_keys_only(tmp_path: Path):
    from opencomposer.commands.ablate import plan

    study = replace(load_recipe(STUDY).ablation, seeds=[0, 1])
    runs, jobs = plan(str(STUDY), [], study, tmp_path)
    assert [(run.cell, run.seed) for run in runs] == [("rl.advantage.std_normalize=false", 0),
                                                     ("rl.advantage.std_normalize=false", 1),
                                                     ("rl.advantage.std_normalize=true", 0),
                                                     ("rl.advantage.std_normalize=true", 1)]
    shared = [job for job in jobs if job.run is None]
    assert [job.sft.sft.out for job in shared] == [str(tmp_path / "shared" / f"seed-{s}-sft") for s in (0, 1)]
    cells = [job for job in jobs if job.run is not None]
    assert all(job.sft is None and job.rl.model.path == str(tmp_path / "shared" / f"seed-{job.rl.run.seed}-sft")
               for job in cells)
    assert cells[2].rl.run.path == tmp_path / "cells" / "rl.advantage.std_normalize=true" / "seed-0"
    assert cells[2].rl.rl.advantage.std_normalize and cells[2].rl.ablation == AblationConfig()

    # a varied SFT key: each cell its own SFT stage, in its folder
    study = replace(study, vary=["sft.lr=5e-3,1e-2"])
    runs, jobs = plan(str(STUDY), [], study, tmp_path)
    assert all(job.run is not None for job in jobs)
    assert jobs[3].sft.sft.out == jobs[3].rl.model.path == str(tmp_path / "cells" / "sft.lr=1e-2" / "seed-1-sft")
    assert jobs[3].sft.sft.lr == 1e-2


def test_the_plan_chains_pretraining_sft_and_rl_like_the_quickstart(tmp_path: Path):
    from opencomposer.commands.ablate import plan

    quickstart = str(ROOT / "recipes" / "quickstart.toml")
    study = AblationConfig(vary=["rl.lr=1e-3,3e-4"], seeds=[3], prefix="pretrain_sft")
    runs, jobs = plan(quickstart, [], study, tmp_path)
    (shared, *cells) = jobs
    assert shared.run is None and shared.pretrain.run.path == tmp_path / "shared" / "seed-3-pretrain"
    assert shared.pretrain.run.seed == shared.sft.run.seed == 3
    assert shared.sft.sft.init == str(tmp_path / "shared" / "seed-3-pretrain" / "checkpoint")
    assert [(job.pretrain, job.sft, job.rl.model.kind, job.rl.model.path) for job in cells] == [
        (None, None, "hf", str(tmp_path / "shared" / "seed-3-sft"))] * 2
    assert [job.rl.rl.lr for job in cells] == [1e-3, 3e-4]

    runs, jobs = plan(quickstart, [], replace(study, vary=["pretrain.lr=1e-3,3e-3"]), tmp_path)
    assert len(jobs) == 2 and jobs[1].pretrain.pretrain.lr == 3e-3
    assert jobs[1].pretrain.run.path == tmp_path / "cells" / "pretrain.lr=3e-3" / "seed-3-pretrain"
    assert jobs[1].rl.model.path == jobs[1].sft.sft.out == str(tmp_path / "cells" / "pretrain.lr=3e-3" / "seed-3-sft")


# ------------------------------------------------------------------------------------------ command


@pytest.mark.parametrize("vary, message", [
    ("rl.no_such_key=1,2", "--vary rl.no_such_key=1: unknown key 'rl.no_such_key'"),
    ("rl.lr=1e-4,fast", "--vary rl.lr=fast: rl.lr: expected a number, got 'fast'"),
    ("rl.kl.estimator=k1,k9", "--vary rl.kl.estimator=k9: rl.kl.estimator: 'k9' (str) is not one of"),
    ("rl.lr", "'rl.lr' is not KEY=V1,V2"),
    ("run.name=a,b", "run.name cannot be varied"),
])
def test_a_bad_vary_is_one_line_and_exit_2(vary: str, message: str, tmp_path: Path, capsys):
    out = tmp_path / "study"
    assert main(["ablate", "--vary", vary, "--out", str(out), *sets(*SMALL)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert not captured.out and not out.exists()


def test_a_cell_whose_rl_outgrows_its_task_pool_is_refused_before_anything_runs(tmp_path: Path, capsys):
    # tiny-composed has 112 training prompts, each trained once: 30 steps of 4 need 120
    out = tmp_path / "study"
    args = ["ablate", "--vary", "rl.steps=2,30", "--out", str(out), *sets(*SMALL, "rl.task_family=tiny-composed",
                                                                           "rl.batch_tasks=4")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cell rl.steps=30: rl.task_family = 'tiny-composed': its training split holds 112" in err, err
    assert not out.exists()  # no SFT prefix spent on a grid one of whose cells cannot run
    from opencomposer.rl.tasks import check_family_length

    fits = [*SMALL, "rl.task_family=tiny-composed", "rl.batch_tasks=4"]
    check_family_length(load_recipe(None, [*fits, "rl.steps=28"]))  # the control: 28 x 4 = 112 fits
    with pytest.raises(ConfigError, match="rl.steps × rl.batch_tasks = 30 × 4 = 120"):
        check_family_length(load_recipe(None, [*fits, "rl.steps=30"]))


def test_a_bad_cell_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path, capsys):
    out = tmp_path / "study"
    assert main(["ablate", "--cell", "rl.lr=fast;rl.steps=2", "--out", str(out), *sets(*SMALL)]) == 2
    assert "ablation.cells rl.lr=fast;rl.steps=2: rl.lr: expected a number, got 'fast'" in capsys.readouterr().err
    assert main(["ablate", "--cell", "rl.lr=1e-3", "--vary", "rl.lr=1e-4,3e-4", "--out", str(out), *sets(*SMALL)]) == 2
    assert "both in a listed cell and varied" in capsys.readouterr().err
    assert not out.exists()


def summaries(out: Path) -> dict[str, int]:
    return {str(path.relative_to(out)): path.stat().st_mtime_ns for path in sorted(out.glob("cells/*/*/summary.json"))}


@pytest.mark.integration
@pytest.mark.bwrap
def test_a_grid_runs_reports_skips_finished_runs_and_resumes_a_killed_one(tmp_path: Path, capsys):
    out = tmp_path / "study"
    argv = ["ablate", "--vary", "rl.advantage.std_normalize=false,true", "--seeds", "0,1", "--out", str(out),
            *sets(*SMALL)]
    assert main(argv) == 0
    record = json.loads((out / "ablation.json").read_text())
    cells = record["cells"]
    assert [(c["cell"], c["seed"], c["status"]) for c in cells] == [
        ("rl.advantage.std_normalize=false", 0, "finished"), ("rl.advantage.std_normalize=false", 1, "finished"),
        ("rl.advantage.std_normalize=true", 0, "finished"), ("rl.advantage.std_normalize=true", 1, "finished")]
    metrics = record["metrics"]
    assert all(set(c["metrics"]) == set(metrics) for c in cells)
    assert cells[3]["overrides"] == {"rl.advantage.std_normalize": "true"}
    assert cells[3]["run_dir"] == str(out / "cells" / "rl.advantage.std_normalize=true" / "seed-1")
    recipe = load_recipe(Path(cells[3]["run_dir"]) / "recipe.toml")  # an ordinary run's recipe
    assert recipe.rl.advantage.std_normalize and recipe.run.seed == 1 and recipe.ablation == AblationConfig()
    assert len(record["table"]["rows"]) == 2 and "±" in record["table"]["rows"][0][2]
    page = (out / "report.html").read_text()
    assert page.count("<img ") == len(metrics) and all(f'id="{m.replace("/", "-")}"' in page for m in metrics)
    assert all((out / "report" / f"{m.replace('/', '-')}.png").stat().st_size > 5000 for m in metrics)
    printed = capsys.readouterr().out
    assert "4 jobs to run" in printed and "95 % t-interval over 2 seeds" in printed

    # a rerun runs nothing: every run is finished
    before = summaries(out)
    assert len(before) == 4
    assert main(argv) == 0
    assert summaries(out) == before
    assert "4 finished already, 0 jobs to run" in capsys.readouterr().out

    # a run killed after its first checkpoint resumes there: step 1 is not run again
    killed = Path(cells[1]["run_dir"])
    (killed / "summary.json").unlink()
    shutil.rmtree(killed / "checkpoints" / "step-000002")
    first_step = (killed / "rollouts" / "step-000001.jsonl").stat().st_mtime_ns
    others = {name: mtime for name, mtime in before.items() if not name.startswith(str(killed.relative_to(out)))}
    assert main(argv) == 0
    assert "3 finished already, 1 jobs to run" in capsys.readouterr().out
    assert (killed / "summary.json").is_file()
    assert (killed / "rollouts" / "step-000001.jsonl").stat().st_mtime_ns == first_step
    assert {name: mtime for name, mtime in summaries(out).items() if name in others} == others
    rows = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert json.loads((out / "ablation.json").read_text())["cells"] == cells


@pytest.mark.slow  # the grid test above runs the runner end to end in make test; this adds the SFT stage
@pytest.mark.integration
@pytest.mark.bwrap
def test_the_sft_prefix_runs_once_per_seed_for_every_cell(tmp_path: Path, capsys):
    out = tmp_path / "study"
    shrunk = ["sft.steps=2", "sft.num_tasks=2", "sft.batch_size=2", "rl.steps=1", "rl.batch_tasks=2",
              "rl.group_size=2", "rl.eval_every=1", "rl.eval_tasks=2", "rl.eval_samples=2"]
    argv = ["ablate", "--recipe", str(STUDY), "--seeds", "0", "--out", str(out), *sets(*shrunk)]
    assert main(argv) == 0
    assert [p.name for p in (out / "shared").iterdir()] == ["seed-0-sft"]
    assert not list(out.glob("cells/*/*-sft"))
    for run_dir in out.glob("cells/*/seed-0"):
        assert load_recipe(run_dir / "recipe.toml").model.path == str(out / "shared" / "seed-0-sft")
    record = json.loads((out / "ablation.json").read_text())
    assert [c["status"] for c in record["cells"]] == ["finished", "finished"]
    assert "One seed" in record["table"]["note"]
    made = (out / "shared" / "seed-0-sft" / "model.safetensors").stat().st_mtime_ns
    assert main(argv) == 0 and "0 jobs to run" in capsys.readouterr().out  # nothing again, the prefix neither
    assert (out / "shared" / "seed-0-sft" / "model.safetensors").stat().st_mtime_ns == made


@pytest.mark.slow  # a local Ray cluster and two workers importing torch: a minute on two busy cores
@pytest.mark.integration
@pytest.mark.bwrap
def test_the_ray_backend_runs_the_grid_as_tasks(tmp_path: Path):
    pytest.importorskip("ray")
    from tests.conftest import skip_missing

    out = tmp_path / "study"
    argv = ["ablate", "--vary", "rl.kl.estimator=k1", "--seeds", "0,1", "--out", str(out), "--backend", "ray",
            *sets(*SMALL, "rl.steps=1", "services.ray_num_cpus=2")]
    try:
        code = main(argv)
    except Exception as e:  # a local cluster that cannot start here (no shared memory, no ports)
        if not type(e).__module__.startswith("ray"):
            raise
        skip_missing(f"a local Ray cluster cannot start here: {type(e).__name__}: {e}")
    assert code == 0
    record = json.loads((out / "ablation.json").read_text())
    assert [(c["cell"], c["seed"], c["status"]) for c in record["cells"]] == [
        ("rl.kl.estimator=k1", 0, "finished"), ("rl.kl.estimator=k1", 1, "finished")]
    assert all(set(c["metrics"]) == set(record["metrics"]) for c in record["cells"])
    assert (out / "report.html").is_file()


QUICKSTART_SHRUNK = [  # tests/commands/test_quickstart.py's
    "run.threads=1", 'corpus.sources=["stdlib"]', "corpus.max_files=1000", "model.hidden_size=32", "model.num_layers=1",
    "model.head_dim=8", "model.num_experts=4", "model.moe_intermediate_size=32", "pretrain.max_steps=24",
    "pretrain.warmup_steps=4", "pretrain.eval_every=12", "pretrain.seq_len=64", "sft.steps=2", "sft.num_tasks=2",
    "sft.batch_size=2", "sft.warmup_steps=1", "rl.steps=1", "rl.batch_tasks=1", "rl.group_size=2",
    "rl.lr_warmup_steps=0", "rl.eval_every=1", "rl.eval_tasks=1", "rl.eval_samples=1", "rl.checkpoint_every=1",
]


@pytest.mark.slow  # pretraining gathers a corpus and trains a tokenizer first
@pytest.mark.integration
@pytest.mark.bwrap
def test_the_quickstart_chain_pretrains_and_fine_tunes_once_per_seed(tmp_path: Path):
    out = tmp_path / "study"
    argv = ["ablate", "--recipe", str(ROOT / "recipes" / "quickstart.toml"), "--vary", "rl.lr=1e-3,3e-4",
            "--seeds", "0", "--out", str(out), *sets(*QUICKSTART_SHRUNK, "ablation.prefix=pretrain_sft")]
    assert main(argv) == 0
    assert sorted(p.name for p in (out / "shared").iterdir()) == ["seed-0-pretrain", "seed-0-sft"]
    assert (out / "shared" / "seed-0-pretrain" / "checkpoint" / "config.json").is_file()
    for run_dir in out.glob("cells/*/seed-0"):
        assert load_recipe(run_dir / "recipe.toml").model.path == str(out / "shared" / "seed-0-sft")
    record = json.loads((out / "ablation.json").read_text())
    assert [c["status"] for c in record["cells"]] == ["finished", "finished"]


def test_listed_cells_make_a_grid_that_is_not_a_product(tmp_path: Path):
    text = ('[ablation]\ncells = [{"rl.kl.coef" = 0.0, "rl.kl.reference" = "none"},\n'
            '         {"rl.kl.estimator" = "k1", "rl.kl.placement" = "reward"},\n'
            '         "rl.kl.estimator=k3;rl.kl.placement=loss"]\nvary = ["rl.lr=1e-4,3e-4"]\n')
    study = section(text)
    assert study.cells == ['rl.kl.coef=0.0;rl.kl.reference="none"', 'rl.kl.estimator="k1";rl.kl.placement="reward"',
                           "rl.kl.estimator=k3;rl.kl.placement=loss"]
    grid = study.grid()
    assert len(grid) == 6 and grid[0] == {"rl.kl.coef": "0.0", "rl.kl.reference": '"none"', "rl.lr": "1e-4"}
    assert [cell_name(cell) for cell in grid[4:]] == ["rl.kl.estimator=k3,rl.kl.placement=loss,rl.lr=1e-4",
                                                      "rl.kl.estimator=k3,rl.kl.placement=loss,rl.lr=3e-4"]
    from opencomposer.commands.ablate import plan

    runs, jobs = plan(str(ROOT / "recipes" / "rl-tiny.toml"), [], replace(study, seeds=[0], prefix="sft"), tmp_path)
    assert len(runs) == 6 and len([job for job in jobs if job.run is None]) == 1  # every key rl.*: one shared SFT
    kl = [(job.rl.rl.kl.coef, job.rl.rl.kl.estimator, job.rl.rl.kl.placement) for job in jobs if job.run is not None]
    assert kl[0][0] == 0.0 and kl[2][1:] == ("k1", "reward") and kl[4][1:] == ("k3", "loss")


@pytest.mark.parametrize("text, message", [
    ('cells = ["rl.lr"]', "is not KEY=VALUE;KEY=VALUE"),
    ('cells = ["rl.lr=1e-4;rl.lr=3e-4"]', "sets rl.lr twice"),
    ('cells = ["rl.lr=1e-4", "rl.lr=1e-4"]', "listed twice"),
    ('cells = [{}]', "an empty cell"),
    ('cells = ["run.seed=1"]', "seeds go in ablation.seeds"),
    ('cells = ["rl.lr=1e-4"]\nvary = ["rl.lr=3e-4"]', "both in a listed cell and varied"),
])
def test_listed_cells_refuse_what_they_cannot_run(text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        section("[ablation]\n" + text + "\n")

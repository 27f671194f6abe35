"""``rl.task_pass_rate_band`` (``rl.screening``): the screen keeps the in-band tasks in stream
order, stops once the run has enough, records the rates, screens nothing twice on a restart, and
the real loop trains exactly the kept tasks, once each, a resume screening with the policy the run
started from. The rollouts of every test but the last are simulated (a task's pass rate is a
function of its pool index), so they run in well under a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencomposer.config import ConfigError, load_recipe
from opencomposer.rl import rollouts
from opencomposer.rl.screening import RECORD, Screened, kept_indices, read_record, screen_pool
from opencomposer.rl.tasks import TaskStream
from opencomposer.types import Episode, EpisodeStatus, Grade, Group, Segment


def _grade(resolved: bool) -> Grade:
    return Grade(resolved=resolved, fail_to_pass=float(resolved), pass_to_pass=1.0, tests_passed=1, tests_failed=0,
                 tests_errored=0, test_exit_code=0, test_timed_out=False, rubric_ok=True, files_changed=1,
                 lines_added=1, lines_removed=0, lines_changed=1, todo_added=0, comment_lines_added=0, lint_added=0,
                 grading_s=0.0)


def simulated_rate(task_id: str) -> float:
    """The simulated policy's pass rate on a task: four kinds, by the task id's hash."""
    return (0.0, 0.25, 0.5, 1.0)[sum(map(ord, task_id)) % 4]


class Simulated:
    """Stands in for ``make_sampler`` and ``run_groups``: task t's G episodes resolve at
    ``simulated_rate(t)`` exactly (the first round(rate × G) of them), or all fail on
    infrastructure for the ids in ``down``. Counts the episodes it ran."""

    def __init__(self, monkeypatch, down: frozenset[str] = frozenset()):
        self.episodes, self.down, self.seeds = 0, down, []
        monkeypatch.setattr(rollouts, "make_sampler", lambda *a, **k: object())  # the screen only passes it on
        monkeypatch.setattr(rollouts, "run_groups", self.run_groups)

    def run_groups(self, tasks, batcher, tokenizer, config, *, group_size, seeds, **_):
        self.seeds += seeds
        groups = []
        for task in tasks:
            self.episodes += group_size
            passing = round(simulated_rate(task.id) * group_size)
            episodes = [Episode(task_id=task.id, segments=[Segment(prompt_ids=[1], turns=[])],
                                status=EpisodeStatus.INFRA_ERROR, error="sandbox down") if task.id in self.down
                        else Episode(task_id=task.id, segments=[Segment(prompt_ids=[1], turns=[])],
                                     grade=_grade(j < passing)) for j in range(group_size)]
            groups.append(Group(task=task, episodes=episodes))
        return groups


def _config(tmp_path: Path, *overrides: str):
    return load_recipe(None, ["rl.task_family=tiny-long", "rl.batch_tasks=3", "rl.steps=4", "rl.task_pass_rate_samples=4",
                              "rl.task_pass_rate_band=[0.2, 0.8]", f"run.out_dir={tmp_path}", *overrides])


def _screen(tmp_path: Path, *overrides: str, resumed: bool = False) -> tuple[TaskStream, list[int]]:
    config = _config(tmp_path, *overrides)
    stream = TaskStream(config, tmp_path)
    kept = screen_pool(stream, config, tmp_path, policy=lambda: None, tokenizer=None, resumed=resumed,
                       progress=False)
    return stream, kept


def test_the_screen_keeps_the_in_band_tasks_in_stream_order_and_stops_when_the_run_has_enough(tmp_path, monkeypatch):
    simulated = Simulated(monkeypatch)
    reference = TaskStream(_config(tmp_path / "unscreened", "rl.task_pass_rate_band=[]"), tmp_path / "unscreened")
    stream, kept = _screen(tmp_path)
    expected = [k for k in range(reference.size) if 0.2 <= simulated_rate(reference.candidate(k).id) <= 0.8][:12]
    assert kept == expected and stream.size == 12  # steps × batch_tasks
    assert [stream.task(i).id for i in range(12)] == [reference.candidate(k).id for k in expected]
    screened = (max(expected) // 3 + 1) * 3  # whole chunks of batch_tasks, up to the one that filled the run
    assert simulated.episodes == 4 * screened
    record = json.loads((tmp_path / RECORD).read_text())
    assert record["screened"] == screened and record["kept"] == 12 and record["band"] == [0.2, 0.8]
    rows = record["tasks"]
    assert [r["pool_index"] for r in rows] == list(range(screened))
    assert all(r["rate"] == simulated_rate(r["task_id"]) and r["kept"] == (r["pool_index"] in kept) for r in rows)
    # the seeds are the screen's own: none is a training or evaluation episode's
    assert simulated.seeds[0][0] == rollouts.episode_seed(stream.config.run.seed, "screen", 0, 0)
    assert simulated.seeds[0][0] != rollouts.episode_seed(stream.config.run.seed, "train", 0, 0)


def test_a_restart_screens_nothing_twice_and_a_new_band_selects_from_the_record(tmp_path, monkeypatch):
    Simulated(monkeypatch)
    _screen(tmp_path)
    again = Simulated(monkeypatch)
    config = _config(tmp_path)
    kept = screen_pool(TaskStream(config, tmp_path), config, tmp_path, tokenizer=None, resumed=True, progress=False,
                       policy=lambda: pytest.fail("a restart with every rate recorded loaded a policy"))
    assert again.episodes == 0
    # more steps: only the candidates after those recorded are screened
    stream, more = _screen(tmp_path, "rl.steps=6")
    assert more[:12] == kept and len(more) == 18 and again.episodes > 0
    seed = stream.config.run.seed
    assert not {s[0] for s in again.seeds} & {rollouts.episode_seed(seed, "screen", k, 0) for k in range(max(kept) + 1)}
    # a narrower band: chosen again from the rates, more screened where they do not suffice
    _, half = _screen(tmp_path, "rl.task_pass_rate_band=[0.5, 0.5]")
    assert half == kept_indices(read_record(tmp_path, 4, resumed=False)[0], [0.5, 0.5], 12)
    assert [r["pool_index"] for r in json.loads((tmp_path / RECORD).read_text())["tasks"] if r["kept"]] == half
    assert all(simulated_rate(TaskStream(_config(tmp_path), tmp_path).candidate(k).id) == 0.5 for k in half)


def test_another_sample_count_screens_again_on_a_fresh_run_and_is_refused_on_a_resume(tmp_path, monkeypatch):
    Simulated(monkeypatch)
    _screen(tmp_path)
    simulated = Simulated(monkeypatch)
    with pytest.raises(ConfigError, match="rl.task_pass_rate_samples = 4, and this resumed run asks for 8"):
        _screen(tmp_path, "rl.task_pass_rate_samples=8", resumed=True)
    assert simulated.episodes == 0
    _, kept = _screen(tmp_path, "rl.task_pass_rate_samples=8")
    assert simulated.episodes > 0 and json.loads((tmp_path / RECORD).read_text())["samples"] == 8 and kept


def test_too_few_tasks_in_the_band_is_one_clear_error_after_which_nothing_is_screened_twice(tmp_path, monkeypatch):
    simulated = Simulated(monkeypatch)
    config = load_recipe(None, ["rl.steps=2", "rl.batch_tasks=2", "rl.task_pass_rate_samples=2",
                                "rl.task_pass_rate_band=[0.6, 0.9]", f"run.out_dir={tmp_path}",
                                f"rl.train_tasks={Path(__file__).parents[1] / 'fixtures' / 'tasks'}"])
    stream = TaskStream(config, tmp_path)
    screen_pool(stream, config, tmp_path, lambda: None, None, resumed=False, progress=False)  # no task at 0.6-0.9
    with pytest.raises(ConfigError, match=r"rl.task_pass_rate_band = \[0.6, 0.9\] kept 0 of the .* widen the band"):
        stream.check_length(4)
    assert simulated.episodes == 2 * stream.pool_size


def test_a_task_without_a_scored_episode_is_not_kept_and_a_chunk_all_down_stops_the_screen(tmp_path, monkeypatch):
    from opencomposer.types import InfrastructureDown

    reference = TaskStream(_config(tmp_path / "r", "rl.task_pass_rate_band=[]"), tmp_path / "r")
    ids = [reference.candidate(k).id for k in range(3)]
    Simulated(monkeypatch, down=frozenset(ids[:1]))
    _, kept = _screen(tmp_path, "rl.task_pass_rate_band=[0, 1]")
    assert 0 not in kept and kept[:2] == [1, 2]
    assert json.loads((tmp_path / RECORD).read_text())["tasks"][0]["rate"] is None
    Simulated(monkeypatch, down=frozenset(ids))
    with pytest.raises(InfrastructureDown, match="sandbox down"):
        _screen(tmp_path / "down", "rl.task_pass_rate_band=[0, 1]")
    assert not (tmp_path / "down" / RECORD).exists()  # nothing recorded: the same command screens them again


def test_screened_in_band_and_the_config_check():
    assert Screened(0, "t", 1, 4).in_band([0.25, 0.75]) and not Screened(0, "t", 0, 4).in_band([0.1, 1.0])
    assert not Screened(0, "t", 0, 0).in_band([0.0, 1.0])  # no scored episode: no rate
    for band in ("[0.5]", "[0.8, 0.2]", "[-0.1, 0.5]", "[0.5, 1.5]"):
        with pytest.raises(ConfigError, match="rl.task_pass_rate_band"):
            load_recipe(None, [f"rl.task_pass_rate_band={band}"])
    with pytest.raises(ConfigError, match="rl.task_pass_rate_samples"):
        load_recipe(None, ["rl.task_pass_rate_samples=0"])
    assert load_recipe(None, ["rl.task_pass_rate_band=[0, 1]"]).rl.task_pass_rate_band == [0, 1]


@pytest.mark.integration
@pytest.mark.bwrap
@pytest.mark.slow  # make test-all: ~15 s that kept make test over its 600 s; the band's rules are tested above
def test_the_real_loop_trains_the_kept_tasks_once_and_a_resume_screens_with_the_initial_policy(tmp_path, monkeypatch):
    import torch

    from opencomposer.rl import screening
    from opencomposer.rl.loop import _load_folder, run_rl

    policies = []  # the weights each screen was given

    def recording(stream, config, run_dir, policy, *args, **kwargs):
        def loaded():
            model = policy()
            policies.append([p.detach().clone() for p in model.parameters()])
            return model
        return screen_pool(stream, config, run_dir, loaded, *args, **kwargs)

    monkeypatch.setattr(screening, "screen_pool", recording)
    small = ["run.threads=1", "model.hidden_size=64", "model.num_layers=2", "model.head_dim=16", "model.num_experts=4",
             "model.moe_intermediate_size=64", "sampling.max_new_tokens=8", "grading.lint=false",
             "rl.task_family=tiny", "rl.batch_tasks=2", "rl.group_size=2", "rl.lr=1e-2", "rl.eval_every=0",
             "rl.task_pass_rate_band=[0, 1]", "rl.task_pass_rate_samples=2", f"run.out_dir={tmp_path}"]
    run_rl(load_recipe(None, [*small, "run.name=straight", "rl.steps=2"]), progress=False)
    run_rl(load_recipe(None, [*small, "run.name=resumed", "rl.steps=1"]), progress=False)
    config = load_recipe(None, [*small, "run.name=resumed", "rl.steps=2"])
    run_rl(config, progress=False)

    def read(name: str) -> tuple[list[dict], list[dict]]:
        trained = json.loads((tmp_path / name / "checkpoints" / "step-000002" / "state.json").read_text())["trained"]
        return trained, json.loads((tmp_path / name / RECORD).read_text())["tasks"]

    trained, rates = read("straight")
    assert len(rates) == 4 and all(r["scored"] == 2 and r["kept"] for r in rates)
    assert [r["task_id"] for r in trained] == [r["task_id"] for r in rates]  # the kept tasks, in order, once each
    assert read("resumed") == (trained, rates)
    # the screen's sampling is in the run's cost: more tokens sampled than its training rollouts hold
    rollouts = [json.loads(line) for path in sorted((tmp_path / "straight" / "rollouts").glob("step-*.jsonl"))
                for line in path.read_text().splitlines()]
    cost = json.loads((tmp_path / "straight" / "cost.json").read_text())
    assert cost["tokens"]["sampled"] > sum(row["tokens"] for row in rollouts)
    # the resume screened its second step's tasks with the policy the run started from, not step 1's
    assert len(policies) == 3  # each run that had a task left to screen loaded a policy, once
    fresh, resumed = policies[1], policies[2]
    assert all(torch.equal(a, b) for a, b in zip(fresh, resumed, strict=True))
    step1 = _load_folder(tmp_path / "resumed" / "checkpoints" / "step-000001" / "model", config)[0]
    assert not all(torch.equal(a, b.detach()) for a, b in zip(fresh, step1.parameters(), strict=True))

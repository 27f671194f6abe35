"""``run.trackers``: Weights & Biases (offline) and MLflow (a file store) get every metrics row
once, at its step, and the resolved recipe once; a tracker nobody named is never imported. Both
are the ``trackers`` extra, which ``make test`` installs, so these tests do not skip."""

from __future__ import annotations

import glob
import subprocess
import sys
import time

import pytest

from opencomposer.config import ConfigError, load_recipe, to_toml
from opencomposer.training.metrics import MetricsLog, read_metrics

ROWS = [(0, "eval", {"pass_at_1": 0.25}), (1, "train", {"loss": 1.5, "reward/resolved": 0.5}),
        (2, "train", {"loss": 1.25, "reward/resolved": 0.75}), (2, "eval", {"pass_at_1": 0.5})]


def _log_rows(folder, trackers: list[str]) -> str:
    config = load_recipe(None, ["run.name=tracked", "rl.lr=3e-4", f"run.trackers={trackers!r}".replace("'", '"')])
    recipe = to_toml(config)
    with MetricsLog(folder, trackers=config.run.trackers, recipe=recipe, name=config.run.name) as log:
        for step, kind, metrics in ROWS:
            log.log(step, kind, metrics)
    assert len(read_metrics(folder)) == len(ROWS)  # metrics.jsonl as always
    return recipe


def test_mlflow_file_store_gets_each_row_once_at_its_step_and_the_recipe(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    recipe = _log_rows(tmp_path, ["mlflow"])
    assert not (tmp_path / "tb").exists()  # TensorBoard only when named
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("opencomposer").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    history = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
               for key in ("train/loss", "train/reward/resolved", "eval/pass_at_1")}
    assert history == {"train/loss": [(1, 1.5), (2, 1.25)], "train/reward/resolved": [(1, 0.5), (2, 0.75)],
                       "eval/pass_at_1": [(0, 0.25), (2, 0.5)]}
    logged = client.download_artifacts(run.info.run_id, "recipe.toml", str(tmp_path))
    assert open(logged).read() == recipe


def test_wandb_offline_gets_each_row_once_at_its_step_and_the_recipe(tmp_path, monkeypatch):
    import wandb
    from wandb.sdk.wandb_run import Run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb-dir").mkdir()
    calls, configs = [], []
    real_log, real_init = Run.log, wandb.init

    def log(self, data, step=None, **kwargs):
        calls.append((step, dict(data)))
        return real_log(self, data, step=step, **kwargs)

    def init(*args, **kwargs):
        configs.append(kwargs.get("config"))
        return real_init(*args, **kwargs)

    monkeypatch.setattr(Run, "log", log)
    monkeypatch.setattr(wandb, "init", init)
    _log_rows(tmp_path / "run", ["tensorboard", "wandb"])
    assert calls == [(step, {f"{kind}/{name}": value for name, value in metrics.items()}) for step, kind, metrics in ROWS]
    assert len(configs) == 1 and configs[0]["rl"]["lr"] == 3e-4 and configs[0]["run"]["name"] == "tracked"
    (stored,) = glob.glob(str(tmp_path / "wandb-dir" / "wandb" / "offline-run-*" / "run-*.wandb"))
    deadline = time.monotonic() + 30  # W&B's service process may still be writing the file out
    while b"train/reward/resolved" not in open(stored, "rb").read() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert b"train/reward/resolved" in open(stored, "rb").read()  # the offline run holds the rows
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_unknown_or_repeated_trackers_are_refused():
    with pytest.raises(ConfigError, match="'comet' is not one of tensorboard, wandb, mlflow"):
        load_recipe(None, ['run.trackers=["comet"]'])
    with pytest.raises(ConfigError, match="names a tracker twice"):
        load_recipe(None, ['run.trackers=["wandb", "wandb"]'])


def test_the_core_does_not_import_the_trackers():
    code = ("import sys; from opencomposer.training.metrics import MetricsLog; import opencomposer.rl.loop; "
            "print(sorted(m for m in ('wandb', 'mlflow') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_log_moved_after_its_run_keeps_its_mlflow_store_where_it_stays(tmp_path, monkeypatch):
    """SFT logs in a scratch folder it moves into the checkpoint: its MLflow store is given a folder
    that stays (``tracker_folder``), so the run's artifacts are still there after the move."""
    import shutil

    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    scratch, stays = tmp_path / "scratch", tmp_path / "runs"
    with MetricsLog(scratch, trackers=["mlflow"], recipe='[run]\nname = "moved"\n', name="moved",
                    tracker_folder=stays) as log:
        log.log(1, "train", {"loss": 1.0})
    shutil.move(scratch, tmp_path / "checkpoint")
    client = MlflowClient(tracking_uri=(stays / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("opencomposer").experiment_id])
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1.0]
    assert open(client.download_artifacts(run.info.run_id, "recipe.toml", str(tmp_path))).read().startswith("[run]")

"""The shared metrics log: rows written and read back, fsynced on ``sync``, cut back on resume
(the torn last line of a kill included), TensorBoard events purged past the resume step."""

from __future__ import annotations

import json
import os
from pathlib import Path

from opencomposer.training.metrics import MetricsLog, read_metrics


def scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "tb"))
    events.Reload()
    return [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]


def test_rows_are_written_and_read_back_by_kind(tmp_path: Path):
    with MetricsLog(tmp_path) as log:
        log.log(0, "eval", {"pass_at_1": 0.25})
        log.log(1, "train", {"loss": 2.5, "lr": 1e-3})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in rows] == [(0, "eval"), (1, "train")]
    assert rows[1]["loss"] == 2.5 and rows[1]["lr"] == 1e-3 and isinstance(rows[1]["time"], float)
    assert read_metrics(tmp_path, kind="eval") == [rows[0]]  # a folder reads its metrics.jsonl
    assert scalars(tmp_path, "train/loss") == [(1, 2.5)]


def test_sync_fsyncs_the_file(tmp_path: Path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    log = MetricsLog(tmp_path, tensorboard=False)
    log.log(1, "train", {"loss": 1.0})
    synced.clear()
    log.sync()
    assert synced == [log.file.fileno()]
    log.close()
    assert not (tmp_path / "tb").exists()


def test_resume_cuts_the_log_back_to_the_step_and_drops_a_torn_line(tmp_path: Path):
    with MetricsLog(tmp_path) as log:
        for step in range(1, 5):
            log.log(step, "train", {"loss": float(step)})
        log.log(2, "eval", {"pass_at_1": 0.5})
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 5, "kind": "tra')  # a kill mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 2]  # the torn line is skipped

    with MetricsLog(tmp_path, resume_step=2) as log:
        assert [(r["step"], r["kind"]) for r in read_metrics(tmp_path)] == [(1, "train"), (2, "train"), (2, "eval")]
        log.log(3, "train", {"loss": 30.0})  # the replayed step
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 2, 3]
    assert scalars(tmp_path, "train/loss") == [(1, 1.0), (2, 2.0), (3, 30.0)]  # 3 and 4 of the first run purged


def test_a_fresh_log_starts_empty(tmp_path: Path):
    with MetricsLog(tmp_path, tensorboard=False) as log:
        log.log(1, "train", {"loss": 1.0})
    with MetricsLog(tmp_path, tensorboard=False) as log:
        log.log(1, "train", {"loss": 0.5})
    assert [r["loss"] for r in read_metrics(tmp_path)] == [0.5]

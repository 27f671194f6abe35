"""``run.device`` resolved the same way for pretraining, SFT and RL."""

from __future__ import annotations

import pytest
import torch

from opencomposer.config import ConfigError
from opencomposer.model.device import resolve_device


@pytest.mark.parametrize("cuda_present", [True, False])
def test_auto_takes_the_gpu_when_there_is_one(monkeypatch, cuda_present):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_present)
    assert resolve_device("auto") == torch.device("cuda" if cuda_present else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_is_honoured_when_present_and_refused_when_absent(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("cuda") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="run.device = 'cuda'.*no CUDA device"):
        resolve_device("cuda")


def test_an_unknown_device_is_refused_by_name():
    with pytest.raises(ConfigError, match="run.device.*'tpu'"):
        resolve_device("tpu")

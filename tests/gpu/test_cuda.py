"""The trainer on a GPU (``run.device = "cuda"``) against the same code on the CPU, and on two or
more GPUs (NCCL) against one. Marked ``gpu``: ``make test`` leaves them out; ``scripts/gpu_check.sh``
runs them with the vLLM tests, and its ``GPU_PYTHON`` mode runs these alone on a machine whose
Python already has a CUDA torch but no vLLM (docs/gpu.md).

- the MX and NVFP4 quantisers give the same bits on the GPU as on the CPU;
- phased pretraining (next-token and MTP losses, MoE routing, the load-balancing loss) gives the
  same losses, data and weights on the GPU as on the CPU in float32;
- one RL ``train_step`` gives the same loss and update on the GPU in float32, and one within
  bf16 tolerance under ``rl.bf16`` (autocast);
- an RL run on the GPU (sampler, router replay, sandboxed episodes, trainer) finishes with its
  exactly-once record and a sampler/trainer mismatch near zero;
- the sampler is batch-invariant on cuBLAS too (its fixed-shape matmul premise, then completions
  alone and in batches);
- with ``run.deterministic``, two RL runs on the GPU end with the same weights bit for bit, and
  the fixed-point sums that stand in for CUDA's ``cumsum`` give the CPU's bits;
- on two GPUs, an RL run (data-, context- or expert-parallel, NCCL) equals one GPU.

``OPENCOMPOSER_GPU_TESTS_DEVICE=cpu`` runs these bodies with the CPU as "the GPU" (then each
comparison is of the CPU with itself): a check of the tests, not of CUDA.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("OPENCOMPOSER_GPU_TESTS_DEVICE", "cuda")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"),
]
two_gpus = pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2,
                              reason="needs two CUDA devices (NCCL refuses two ranks on one GPU)")


def test_the_quantisers_give_the_same_bits_on_the_gpu():
    from opencomposer.numerics.mx import quantize_mx
    from opencomposer.numerics.nvfp4 import quantize_nvfp4

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=generator) * torch.logspace(-6, 6, 64)[:, None]
    x[0, :8] = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 448.0, -448.0, 3e38, 2.0**-127])  # zeros, subnormals, edges
    for source in (x, x.bfloat16()):
        for elem, mode in (("e4m3", "floor"), ("e5m2", "floor"), ("e4m3", "rceil")):
            cpu, gpu = quantize_mx(source, elem, scale_mode=mode), quantize_mx(source.to(DEVICE), elem, scale_mode=mode)
            assert torch.equal(cpu.data, gpu.data.cpu()) and torch.equal(cpu.scale, gpu.scale.cpu()), (elem, mode)
        for granularity in ("token", "tensor"):
            cpu, gpu = quantize_nvfp4(source, granularity), quantize_nvfp4(source.to(DEVICE), granularity)
            assert torch.equal(cpu.data, gpu.data.cpu()) and torch.equal(cpu.block_scale, gpu.block_scale.cpu())
            assert torch.equal(cpu.global_scale, gpu.global_scale.cpu()), granularity


def test_prefix_sums_in_deterministic_mode_give_the_cpus_bits_on_the_gpu():
    """The fixed-point sums that stand in for CUDA's cumsum under ``run.deterministic`` are exact
    integer sums between float64 conversions that round alike on both devices."""
    from opencomposer.inference.sampling import prefix_sums

    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(8, 50_000, generator=generator) * 3, dim=-1)
    torch.use_deterministic_algorithms(True)  # tests/conftest.py turns it back
    assert torch.equal(prefix_sums(probs.to(DEVICE)).cpu(), prefix_sums(probs))


def test_the_sampler_is_batch_invariant_on_the_gpu(tiny_tokenizer):
    """The premise of ``inference.invariant`` on cuBLAS (a fixed-shape ``[TILE, K] @ [K, N]``
    problem gives a row the same bits whatever the number of problems and the row's slot), then
    the engine: a prompt's samples are the same tokens, logprobs and routes alone as in batches."""
    from opencomposer.inference import LocalEngine, SamplingParams
    from opencomposer.inference.invariant import linear_rows
    from opencomposer.inference.local import row_seed
    from opencomposer.model.loading import load_model

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4096, 128, generator=generator).to(DEVICE)
    row = torch.randn(128, generator=generator).to(DEVICE)
    reference = linear_rows(row[None], weight)[0]
    for rows in (1, 2, 3, 15, 16, 17, 40, 257, 1000):
        others = torch.randn(rows, 128, generator=generator).to(DEVICE)
        for slot in sorted({0, rows // 2, rows - 1}):
            batch = others.clone()
            batch[slot] = row
            assert torch.equal(linear_rows(batch, weight)[slot], reference), (rows, slot)

    model, tokenizer = load_model("tiny_moe", tiny_tokenizer, seed=0, device=DEVICE)
    engine = LocalEngine(model, tokenizer)
    assert engine.batch_invariant
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 4000, size=length).tolist() for length in (37, 5, 64, 130, 90, 12)]
    params = SamplingParams(max_new_tokens=32, temperature=1.0, stop_token_ids=list(range(100, 400)),
                            ignore_eos=True)
    seeds = [row_seed(7, 0, j) for j in range(4)]

    def exact(completion) -> tuple:
        return completion.token_ids, completion.logprobs, completion.routed_experts.tobytes()

    alone = [exact(c) for c in engine.generate([prompts[0]], params, n=4, row_seeds=seeds)]
    for others, position in [([1], 0), ([2, 3], 1), ([5, 4, 1, 3, 2], 5)]:
        batch = [prompts[i] for i in others]
        batch.insert(position, prompts[0])
        row_seeds = [int(x) for x in rng.integers(2**62, size=len(batch) * 4)]
        row_seeds[position * 4 : (position + 1) * 4] = seeds
        out = engine.generate(batch, params, n=4, row_seeds=row_seeds)
        assert [exact(c) for c in out[position * 4 : (position + 1) * 4]] == alone, (others, position)


def assert_close_but_for_noise(got: torch.Tensor, want: torch.Tensor, bound: float, name: str) -> None:
    """Adam divides by sqrt(v): an element whose gradient is rounding noise moves by up to lr
    either way, whichever order the device summed in. So: nearly every element equal to float
    tolerance, and none further apart than ``bound`` (2 lr a step)."""
    close = torch.isclose(got, want, rtol=1e-4, atol=1e-6)
    assert close.float().mean() > 0.999, (name, int((~close).sum()), close.numel())
    assert float((got - want).abs().max()) <= bound, name


SMALL_MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.head_dim=16", "model.num_experts=4",
               "model.moe_intermediate_size=32", "model.num_mtp_layers=1"]
PHASES = 'pretrain.phases=[{name="lm", seq_len=64, steps=4, batch_size=4, warmup_steps=1, lr=3e-3, losses=["lm", "mtp"]}]'


def test_pretraining_on_the_gpu_matches_the_cpu(tmp_path: Path, tiny_tokenizer):
    from opencomposer.config import load_recipe
    from opencomposer.pretrain.phases import run_phases
    from tests.pretrain.test_phases import _corpus

    runs = {}
    for name, device in (("reference", "cpu"), ("device", DEVICE)):
        config = load_recipe(None, [*SMALL_MODEL, PHASES, f"run.out_dir={tmp_path}", f"run.name={name}",
                                    f"run.device={device}", "run.threads=1", "pretrain.eval_every=100",
                                    "pretrain.eval_batches=1", "pretrain.checkpoint_every=0"])
        model, _, result = run_phases(config, _corpus(), tiny_tokenizer, progress=False)
        assert next(model.parameters()).device.type == torch.device(device).type
        train = [row for row in result.history if row["kind"] == "train"]
        runs[name] = train, {key: t.detach().cpu() for key, t in model.state_dict().items()}
    (cpu_rows, cpu_weights), (gpu_rows, gpu_weights) = runs["reference"], runs["device"]
    assert len(cpu_rows) == len(gpu_rows) == 4
    assert [r["data_crc"] for r in gpu_rows] == [r["data_crc"] for r in cpu_rows]
    for got, want in zip(gpu_rows, cpu_rows, strict=True):
        for key in ("loss", "lm_loss", "mtp_loss", "grad_norm"):
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-4), (key, got["step"])
    for key, value in cpu_weights.items():
        assert_close_but_for_noise(gpu_weights[key], value, bound=2 * 3e-3 * len(cpu_rows), name=key)


def rl_rows(tokenizer_vocab: int):
    from opencomposer.training.packing import SequenceRow

    rng = np.random.default_rng(0)
    prefix = rng.integers(10, tokenizer_vocab, 40)
    rows = []
    for i in range(8):
        ids = np.concatenate([prefix, rng.integers(10, tokenizer_vocab, 24)])
        mask = np.zeros(len(ids), dtype=bool)
        mask[len(prefix):] = True
        rows.append(SequenceRow(i // 4, ids[:-1], ids[1:], mask[1:], np.full(len(ids) - 1, -1.0, np.float32),
                                float(rng.normal())))
    return rows


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_an_rl_train_step_on_the_gpu_matches_the_cpu(tiny_tokenizer, bf16: bool):
    from opencomposer.config import RLConfig
    from opencomposer.model.loading import load_model
    from opencomposer.rl.step import train_step
    from opencomposer.training.optim import build_optimizer
    from opencomposer.training.packing import collate, micro_batches
    from tests.training.test_forward import SMALL

    model = load_model(SMALL, tiny_tokenizer, seed=3)[0]
    rows = rl_rows(min(len(tiny_tokenizer), 3000))
    results = {}
    for name, device, autocast in (("reference", "cpu", False), ("device", DEVICE, bf16)):
        config = RLConfig(lr=1e-3, micro_batch_tokens=256, bf16=autocast)
        copy_ = copy.deepcopy(model).to(device)
        optimizer = build_optimizer(copy_, lr=config.lr, betas=tuple(config.adam_betas), eps=config.adam_eps)
        batches = [collate(chunk, 0) for chunk in micro_batches(rows, config.micro_batch_tokens)]
        assert len(batches) > 1  # micro-batches add up on the device too
        loss, metrics = train_step(copy_, optimizer, batches, config)
        results[name] = float(loss), metrics, {n: p.detach().cpu() for n, p in copy_.named_parameters()}
    (cpu_loss, cpu_metrics, cpu_weights), (gpu_loss, gpu_metrics, gpu_weights) = results["reference"], results["device"]
    tolerance = 3e-2 if bf16 else 1e-4
    assert gpu_loss == pytest.approx(cpu_loss, rel=tolerance, abs=1e-6)
    assert gpu_metrics["grad_norm"] == pytest.approx(cpu_metrics["grad_norm"], rel=tolerance)
    before = {n: p.detach() for n, p in model.named_parameters()}
    for name, value in cpu_weights.items():
        step_cpu, step_gpu = value - before[name], gpu_weights[name] - before[name]
        if bf16:  # Adam's first step moves each element by about lr * sign(g): compare the directions
            moved = step_cpu.abs() > 1e-4
            agree = (torch.sign(step_cpu[moved]) == torch.sign(step_gpu[moved])).float().mean()
            assert moved.sum() == 0 or agree > 0.9, (name, float(agree))
        else:
            assert_close_but_for_noise(step_gpu, step_cpu, bound=2 * 1e-3, name=name)


RECIPE = ROOT / "recipes" / "rl-tiny.toml"
RL_RUN = ["model.path=", "rl.steps=2", "rl.batch_tasks=2", "rl.group_size=4", "rl.eval_every=0",
          "rl.checkpoint_every=2", "sampling.max_new_tokens=24"]


def rl_command(tmp_path: Path, name: str, *extra: str) -> Path:
    sets = [a for s in [*RL_RUN, f"run.out_dir={tmp_path}", f"run.name={name}", f"run.device={DEVICE}", *extra]
            for a in ("--set", s)]
    subprocess.run([sys.executable, "-m", "opencomposer.cli", "rl", "--recipe", str(RECIPE), *sets], check=True,
                   timeout=900)
    return tmp_path / name


def train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "train"]


@pytest.mark.integration
@pytest.mark.bwrap
def test_an_rl_run_on_the_gpu_finishes_with_its_record_and_no_mismatch(tmp_path: Path):
    run_dir = rl_command(tmp_path, "gpu", "rl.router_replay=replay")
    rows = train_rows(run_dir)
    assert [row["step"] for row in rows] == [1, 2]
    assert all(np.isfinite(row["loss"]) for row in rows)
    # the sampler and the trainer (router replay on) score the same tokens alike, in float32 on one device
    assert all(row["mismatch_kl"] < 1e-3 for row in rows), [row["mismatch_kl"] for row in rows]
    record = json.loads((run_dir / "checkpoints/step-000002/state.json").read_text())["trained"]
    assert sorted(r["index"] for r in record) == [0, 1, 2, 3]


@pytest.mark.integration
@pytest.mark.bwrap
def test_a_deterministic_rl_run_on_the_gpu_repeats_bit_for_bit(tmp_path: Path):
    """``run.deterministic = true``: two runs of the same recipe on the GPU (sampler, sandboxed
    episodes, trainer with router replay, top-p 0.8) end with the same weights, bit for bit, and
    the same losses. Without it, atomics in the backward change the last bits from run to run."""
    from safetensors.torch import load_file

    runs = [rl_command(tmp_path, name, "run.deterministic=true", "rl.router_replay=replay")
            for name in ("first", "second")]
    a, b = (load_file(d / "checkpoints/step-000002/model/model.safetensors") for d in runs)
    assert a.keys() == b.keys()
    assert [key for key in a if not torch.equal(a[key], b[key])] == []
    keys = ("loss", "grad_norm", "mismatch_kl", "reward_mean")
    first, second = ([{key: row.get(key) for key in keys} for row in train_rows(d)] for d in runs)
    assert first == second


@two_gpus
@pytest.mark.integration
@pytest.mark.bwrap
@pytest.mark.parametrize("extra", [(), ("parallel.cp=2",), ("parallel.ep=2",), ("parallel.ep=2", "parallel.ep_fsdp=true")],
                         ids=["data", "context", "expert", "expert-fsdp"])
def test_an_rl_run_on_two_gpus_equals_one(tmp_path: Path, extra: tuple):
    """Weights are compared after the first step: the second step samples from weights that
    differ by rounding noise, and a draw near a boundary of its inverse CDF may then take another
    token (seen once in ten runs with the CPU standing in), after which the runs train on
    different episodes. The second step still runs, sampling from the two ranks' weights."""
    from safetensors.torch import load_file

    one = rl_command(tmp_path, "one", "rl.checkpoint_every=1")
    two = rl_command(tmp_path, "two", "rl.checkpoint_every=1", "trainer.world_size=2", *extra)
    a = load_file(one / "checkpoints/step-000001/model/model.safetensors")
    b = load_file(two / "checkpoints/step-000001/model/model.safetensors")
    assert a.keys() == b.keys()
    for key in a:  # one step at the recipe's lr (rl-tiny.toml: 3e-4)
        assert_close_but_for_noise(b[key], a[key], bound=2 * 3e-4, name=key)
    record = [json.loads((d / "checkpoints/step-000002/state.json").read_text())["trained"] for d in (one, two)]
    assert [r for r in record[0] if r["step"] == 1] == [r for r in record[1] if r["step"] == 1]
    assert sorted(r["index"] for r in record[0]) == sorted(r["index"] for r in record[1]) == [0, 1, 2, 3]

"""``run.deterministic``: the settings it applies, and that the project's training and sampling
code calls no op that torch refuses in deterministic mode on CUDA.

The CPU cannot show CUDA's nondeterminism, but it can show which ops run: every aten op of a
pretraining step (next-token and MTP losses, MoE routing), an RL step (scoring with a top-p cut,
the loss, Adam; SFT scores its tokens the same way; also with MXFP8 and NVFP4 ``[numerics]``)
and sampling with a top-p cut (plain and MTP-speculative) is recorded and checked against the
ops that torch's ``use_deterministic_algorithms`` documents as having no deterministic CUDA
kernel. ``tests/gpu/test_cuda.py`` runs a deterministic RL run twice on a GPU and compares the
bits.
"""

from __future__ import annotations

import collections
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opencomposer.config import ConfigError, RunConfig
from opencomposer.inference.sampling import kept_tokens, prefix_sums
from opencomposer.model.device import apply_run_settings
from opencomposer.training.forward import target_nll


@pytest.fixture
def no_cublas_variable(monkeypatch):
    """No cuBLAS variable to start with; ``tests/conftest.py`` puts deterministic mode and the
    variable back as they were after every test."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)


# --- what run.deterministic sets


def test_run_deterministic_turns_on_torchs_deterministic_mode_and_a_fixed_cublas_workspace(
        no_cublas_variable):
    apply_run_settings(RunConfig())
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    apply_run_settings(RunConfig(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()  # refuse, not warn: a warning lets it through
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def test_run_deterministic_keeps_a_valid_cublas_workspace_and_refuses_another(no_cublas_variable,
                                                                               monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    apply_run_settings(RunConfig(deterministic=True))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    torch.use_deterministic_algorithms(False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG=':0:0'"):
        apply_run_settings(RunConfig(deterministic=True))
    assert not torch.are_deterministic_algorithms_enabled()  # refused before anything was turned on


def test_a_recipe_sets_run_deterministic():
    from opencomposer.config import load_recipe

    assert load_recipe(None, ["run.deterministic=true"]).run.deterministic is True
    with pytest.raises(ConfigError):
        load_recipe(None, ["run.deterministic=maybe"])


# --- the replacements for ops torch has no deterministic CUDA kernel for


def test_target_nll_is_cross_entropy_in_value_and_gradient():
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=generator) * 4).requires_grad_()
    targets = torch.randint(0, 50, (3, 7), generator=generator)
    ours = target_nll(logits, targets)
    reference = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-6)
    (grad_ours,) = torch.autograd.grad(ours.mean(), logits)
    (grad_reference,) = torch.autograd.grad(reference.mean(), logits)
    torch.testing.assert_close(grad_ours, grad_reference, rtol=1e-6, atol=1e-7)
    assert target_nll(logits.bfloat16(), targets).dtype == torch.float32  # scored in float32 at least


@pytest.mark.parametrize("width", [1, 2, 5, 64, 1000, 50_000])
def test_prefix_sums_in_deterministic_mode_are_running_sums_that_never_fall(width: int,
                                                                            no_cublas_variable):
    from opencomposer.inference.sampling import FIXED_POINT_BITS

    generator = torch.Generator().manual_seed(width)
    x = torch.softmax(torch.randn(4, width, generator=generator) * 3, dim=-1)
    x[:, 1::3] = 0.0  # cut tokens: the sums must stay flat over them
    assert torch.equal(prefix_sums(x), x.cumsum(-1))  # outside deterministic mode: cumsum itself
    torch.use_deterministic_algorithms(True)
    sums = prefix_sums(x)
    assert sums.dtype == x.dtype and sums.shape == x.shape
    exact = x.double().cumsum(-1)
    bound = width * 2.0 ** -(FIXED_POINT_BITS + 1) + 2.0**-24  # each step's rounding, then float32's
    assert float((sums.double() - exact).abs().max()) <= bound
    rises = sums.diff(dim=-1)
    assert bool((rises >= 0).all())  # an inverse CDF for searchsorted
    assert bool((rises[x[:, 1:] == 0] == 0).all())  # flat over zeros: a draw never lands on a cut token
    dyadic = torch.randint(0, 8, (3, width), generator=generator).float() / 1024  # sums exact in float32
    assert torch.equal(prefix_sums(dyadic), dyadic.cumsum(-1))
    # each row on its own: the same bits whatever else shares the batch
    assert torch.equal(prefix_sums(x[1:2]), sums[1:2])
    assert torch.equal(prefix_sums(torch.cat([x, x.flip(0)]))[:4], sums)


def test_the_sampler_never_draws_a_cut_token_in_deterministic_mode(no_cublas_variable):
    from opencomposer.inference.local import sample_tokens
    from opencomposer.types import SamplingParams

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 50_000, generator=generator) * 2
    params = SamplingParams(temperature=1.0, top_p=0.9)
    keep = kept_tokens(logits, top_p=0.9)
    torch.use_deterministic_algorithms(True)
    for _ in range(25):  # 200k draws, a quarter of them in the last 1e-4 of the mass
        uniforms = torch.rand(8, generator=generator)
        uniforms[::4] = 1 - uniforms[::4] * 1e-4
        tokens, logprobs = sample_tokens(logits, params, uniforms)
        assert bool(keep.gather(1, tokens[:, None]).all()) and bool(torch.isfinite(logprobs).all())


def test_top_p_keeps_the_same_tokens_in_deterministic_mode(no_cublas_variable):
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 300, generator=generator) * 3
    default = kept_tokens(logits, top_p=0.8, top_k=40)
    torch.use_deterministic_algorithms(True)
    assert torch.equal(kept_tokens(logits, top_p=0.8, top_k=40), default)


# --- no op without a deterministic CUDA kernel in the training and sampling paths

# torch.use_deterministic_algorithms's docstring (torch 2.13): the ops that raise in deterministic
# mode on CUDA, as the aten ops they dispatch to, each with the condition under which it raises.
_always = lambda args, kwargs: True  # noqa: E731
NO_DETERMINISTIC_CUDA_KERNEL = {
    "avg_pool3d_backward": _always,
    "_adaptive_avg_pool2d_backward": _always,
    "_adaptive_avg_pool3d_backward": _always,
    "adaptive_max_pool2d_backward": _always,
    "fractional_max_pool2d_backward": _always,
    "fractional_max_pool3d_backward": _always,
    "max_unpool2d": _always,
    "max_unpool3d": _always,
    "upsample_linear1d_backward": _always,
    "upsample_bilinear2d_backward": _always,
    "upsample_bicubic2d_backward": _always,
    "upsample_trilinear3d_backward": _always,
    "reflection_pad1d_backward": _always,
    "reflection_pad2d_backward": _always,
    "reflection_pad3d_backward": _always,
    "nll_loss_forward": _always,
    "nll_loss2d_forward": _always,
    "_ctc_loss_backward": _always,
    "_embedding_bag_backward": _always,  # raises for mode="max"; flagged whatever the mode
    "put_": _always,
    "put": _always,
    # transformers' grouped MoE experts count the tokens per expert with histc: of the expert ids
    # as floats on the CPU (no integer histc there), as integers on CUDA (deterministic). Recorded
    # on the CPU, a histc of whole numbers is that one.
    "histc": lambda args, kwargs: args[0].is_floating_point() and not torch.equal(args[0], args[0].round()),
    "bincount": lambda args, kwargs: (args[1] if len(args) > 1 else kwargs.get("weights")) is not None,
    "median": lambda args, kwargs: len(args) > 1 or "dim" in kwargs,  # the form that returns indices
    "nanmedian": lambda args, kwargs: len(args) > 1 or "dim" in kwargs,
    "grid_sampler_2d_backward": _always,
    "grid_sampler_3d_backward": _always,
    "cumsum": lambda args, kwargs: (kwargs.get("dtype") or args[0].dtype).is_floating_point,
    "cumsum_": lambda args, kwargs: args[0].is_floating_point(),
    "scatter_reduce": lambda args, kwargs: (args[4] if len(args) > 4 else kwargs.get("reduce")) == "prod",
    "scatter_reduce_": lambda args, kwargs: (args[4] if len(args) > 4 else kwargs.get("reduce")) == "prod",
}


class OpRecorder(TorchDispatchMode):
    """Counts every aten op that runs (forward and backward), and those of them that deterministic
    mode refuses on CUDA."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        condition = NO_DETERMINISTIC_CUDA_KERNEL.get(name)
        if condition is not None and condition(args, kwargs):
            self.refused[name] += 1
        return func(*args, **kwargs)


def test_the_recorder_sees_what_deterministic_mode_refuses_on_cuda():
    """The recorder against ops that CUDA would refuse, so that an empty result below means something."""
    logits = torch.randn(6, 10, requires_grad=True)
    with OpRecorder() as recorder:
        torch.nn.functional.cross_entropy(logits, torch.arange(6)).backward()
        torch.rand(5).cumsum(0)
        torch.arange(5).cumsum(0)  # integers: deterministic
        torch.histc(torch.rand(9), bins=3)
        torch.histc(torch.tensor([0.0, 2.0, 2.0]), bins=3)  # whole numbers: the MoE's count (see the table)
        torch.bincount(torch.tensor([0, 1, 1]))  # no weights: deterministic
        torch.zeros(3).scatter_reduce(0, torch.tensor([0, 0, 2]), torch.ones(3), "prod")
        torch.zeros(3).scatter_reduce(0, torch.tensor([0, 0, 2]), torch.ones(3), "amax")  # deterministic
    assert set(recorder.refused) == {"nll_loss_forward", "cumsum", "histc", "scatter_reduce"}


SMALL_MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.head_dim=16", "model.num_experts=4",
               "model.moe_intermediate_size=32", "model.num_mtp_layers=1"]


@pytest.mark.integration
def test_training_and_sampling_call_no_op_that_cuda_refuses_in_deterministic_mode(
        tmp_path, tiny_tokenizer, no_cublas_variable):
    from opencomposer.config import RLConfig, load_recipe
    from opencomposer.inference.local import LocalEngine
    from opencomposer.pretrain.phases import run_phases
    from opencomposer.rl.step import train_step
    from opencomposer.training.optim import build_optimizer
    from opencomposer.training.packing import collate, micro_batches
    from opencomposer.types import SamplingParams
    from tests.gpu.test_cuda import rl_rows
    from tests.pretrain.test_phases import _corpus

    phases = 'pretrain.phases=[{name="lm", seq_len=64, steps=2, batch_size=4, warmup_steps=1, lr=3e-3, losses=["lm", "mtp"]}]'
    config = load_recipe(None, [*SMALL_MODEL, phases, f"run.out_dir={tmp_path}", "run.name=pretrain",
                                "run.device=cpu", "run.threads=1", "run.deterministic=true",
                                "pretrain.eval_every=100", "pretrain.eval_batches=1", "pretrain.checkpoint_every=0"])
    with OpRecorder() as pretraining:
        model, _, _ = run_phases(config, _corpus(), tiny_tokenizer, progress=False)
    assert torch.are_deterministic_algorithms_enabled()  # the run applied run.deterministic
    assert pretraining.ops["mm"] and pretraining.ops["topk"] and pretraining.ops["_log_softmax_backward_data"]

    rl = RLConfig(lr=1e-3, micro_batch_tokens=256)
    optimizer = build_optimizer(model, lr=rl.lr, betas=tuple(rl.adam_betas), eps=rl.adam_eps)
    batches = [collate(chunk, 0) for chunk in micro_batches(rl_rows(min(len(tiny_tokenizer), 3000)),
                                                            rl.micro_batch_tokens)]
    with OpRecorder() as rl_step:
        train_step(model, optimizer, batches, rl, temperature=0.9, top_p=0.8, top_k=50)
    assert rl_step.ops["sort"] and rl_step.ops["_foreach_add_"] + rl_step.ops["add_"]  # the cut and Adam ran

    engine = LocalEngine(model.eval(), tiny_tokenizer)
    with OpRecorder() as sampling:
        for speculative in ("off", "mtp"):  # with the MTP layer drafting: its inverse-CDF draws too
            engine.generate([[5, 6, 7, 8], [9, 10]], SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.8,
                                                                     seed=0, ignore_eos=True, speculative=speculative),
                            n=2)
    assert sampling.ops["sort"] and sampling.ops["searchsorted"] >= 2

    assert not pretraining.refused, dict(pretraining.refused)
    assert not rl_step.refused, dict(rl_step.refused)
    assert not sampling.refused, dict(sampling.refused)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4_fwd_mxfp8_bwd"])
def test_a_quantised_rl_step_calls_no_op_that_cuda_refuses_in_deterministic_mode(
        recipe: str, tiny_tokenizer, no_cublas_variable):
    from opencomposer.config import NumericsConfig, RLConfig
    from opencomposer.model.loading import load_model
    from opencomposer.numerics.convert import convert_model
    from opencomposer.rl.step import train_step
    from opencomposer.training.optim import build_optimizer
    from opencomposer.training.packing import collate, micro_batches
    from tests.gpu.test_cuda import rl_rows
    from tests.training.test_forward import SMALL

    model = load_model(SMALL, tiny_tokenizer, seed=3)[0]
    convert_model(model, NumericsConfig(recipe=recipe, quantize_linears=True, quantize_dispatch=True))
    rl = RLConfig(lr=1e-3, micro_batch_tokens=256)
    optimizer = build_optimizer(model, lr=rl.lr, betas=tuple(rl.adam_betas), eps=rl.adam_eps)
    batches = [collate(chunk, 0) for chunk in micro_batches(rl_rows(min(len(tiny_tokenizer), 3000)),
                                                            rl.micro_batch_tokens)]
    torch.use_deterministic_algorithms(True)
    with OpRecorder() as recorder:
        train_step(model, optimizer, batches, rl, top_p=0.8)
    assert recorder.ops["index_add_"]  # the quantised experts ran (deterministic on CUDA in this mode)
    assert not recorder.refused, dict(recorder.refused)

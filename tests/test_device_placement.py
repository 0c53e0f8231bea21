"""The code that runs on the model's device creates its tensors there, checked without a GPU.

Under `torch.device("meta")` as the default device, a tensor created without an explicit device lands on the meta
device: given CPU inputs and a CPU model, such code then fails (mixing devices) or returns meta tensors, where on a
GPU it would have mixed CPU and CUDA tensors. Each check below runs a device-agnostic path that way and compares it
with the same call outside. The C kernels are turned off (they are CPU-only by design and allocate CPU tensors).
CUDA itself: tests/test_cuda.py (marker gpu, scripts/gpu_check.sh).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import shared_prompt_batch
from thermik.config.schema import AlgorithmConfig, OptimizerConfig, TrainerConfig
from thermik.cpu import gemm
from thermik.cpu import kernels as cpu_kernels
from thermik.inference.native_model import NativeCausalLM
from thermik.inference.sampling import process_logits, sample, token_logprobs
from thermik.training import fused_ops
from thermik.training.loss import LossSetup
from thermik.training.optim import build_optimizer
from thermik.training.sft import sft_loss
from thermik.training.shared_prefix import token_logprobs_shared
from thermik.training.update import policy_update
from thermik.training.vocab_logprobs import vocab_logprobs

META = torch.device("meta")


@pytest.fixture(autouse=True)
def _no_cpu_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("THERMIK_CPU_KERNELS", "0")


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_shared_prompt_forward_and_backward_create_no_tensor_on_the_default_device(model: torch.nn.Module) -> None:
    batch = shared_prompt_batch()
    expected = token_logprobs_shared(model, batch.input_ids, batch.attention_mask, batch.prompt_lens)
    with META:
        logp, entropy = token_logprobs_shared(model, batch.input_ids, batch.attention_mask, batch.prompt_lens)
        (logp * batch.mask).sum().backward()
    assert logp.device.type == entropy.device.type == "cpu"
    torch.testing.assert_close((logp, entropy), expected)
    assert all(p.grad is None or p.grad.device.type == "cpu" for p in model.parameters())
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("shared_prefix", [True, False])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_policy_update_creates_no_tensor_on_the_default_device(
    model: torch.nn.Module, shared_prefix: bool, autocast: torch.dtype | None
) -> None:
    trainer = TrainerConfig(shared_prefix=shared_prefix, micro_batch_size=2)
    results = []
    for device in (torch.device("cpu"), META):
        policy = copy.deepcopy(model)
        optimizer, scheduler = build_optimizer(policy, OptimizerConfig(lr=1e-3))
        setup = LossSetup.from_config(AlgorithmConfig(), trainer, 1.0, autocast=autocast)
        batch = shared_prompt_batch()
        with device:
            metrics = policy_update(policy, None, batch, setup, optimizer, scheduler)
        results.append((metrics, [p.detach().clone() for p in policy.parameters()]))
    (plain, before), (meta, after) = results
    assert meta == pytest.approx(plain)
    torch.testing.assert_close(after, before)


def test_sft_loss_builds_its_tensors_where_the_model_is(model: torch.nn.Module) -> None:
    examples = [([1, 2, 3, 4], [0, 0, 1, 1]), ([5, 6, 7], [0, 1, 1])]
    expected = sft_loss(model, examples, 0)
    with META:
        loss = sft_loss(model, examples, 0)
    assert loss.device.type == "cpu"
    torch.testing.assert_close(loss, expected)


def test_native_forward_creates_no_tensor_on_the_default_device(model: torch.nn.Module) -> None:
    native = NativeCausalLM(copy.deepcopy(model))
    tokens, slots = torch.randint(1, 200, (2, 5), generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1])
    starts, last = torch.tensor([0, 3]), torch.tensor([4, 2])
    expected = native.forward(tokens, slots, starts, last, native.new_cache(4, 64))
    with META:
        logits = native.forward(tokens, slots, starts, last, native.new_cache(4, 64))
    assert logits.device.type == "cpu"
    torch.testing.assert_close(logits, expected)


def test_sampling_with_per_row_settings_creates_no_tensor_on_the_default_device() -> None:
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(2))
    knobs = tuple(torch.tensor(v) for v in ([0.0, 1.0, 0.7], [0, 5, 3], [1.0, 0.9, 0.8], [0.0, 0.1, 0.0]))

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        rows = [None, torch.Generator().manual_seed(1), None]
        ids = sample(process_logits(logits, *knobs), torch.Generator().manual_seed(0), rows)
        return ids, token_logprobs(logits, ids, knobs[0])

    expected = draw()
    with META:
        ids, logp = draw()
    assert ids.device.type == logp.device.type == "cpu"
    torch.testing.assert_close((ids, logp), expected)


def test_vocab_logprobs_forward_and_backward_create_no_tensor_on_the_default_device() -> None:
    logits = torch.randn(2, 5, 300, generator=torch.Generator().manual_seed(3), requires_grad=True)
    targets = torch.randint(0, 300, (2, 4), generator=torch.Generator().manual_seed(4))
    results = []
    for device in (torch.device("cpu"), META):
        logits.grad = None
        with device:
            logp, entropy = vocab_logprobs(logits, targets, 0.8)
            (logp.sum() + entropy.sum()).backward()
        results.append((logp, entropy, logits.grad))
    assert all(t.device.type == "cpu" for t in results[1])
    torch.testing.assert_close(results[1], results[0])


def test_the_c_kernels_are_never_handed_a_tensor_off_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each CPU-only kernel refuses (packed weights) or declines (None: the caller's PyTorch path runs) a tensor that
    lives elsewhere, while it takes the same tensor on the CPU; on a GPU the C code would read device pointers as
    host memory."""
    monkeypatch.setenv("THERMIK_CPU_KERNELS", "1")
    if cpu_kernels.load_vocab() is None or cpu_kernels.load_train() is None or cpu_kernels.load_checksum() is None:
        pytest.skip("no C compiler: the kernels are not built here")
    on_cpu, off_cpu = torch.zeros(64, 64), torch.zeros(64, 64, device=META)
    with pytest.raises(ValueError, match="CPU-only"):
        gemm.Packed(off_cpu, "float32")
    assert gemm.choose(("float32",), off_cpu, 1 << 30) == ("blas", {})
    assert cpu_kernels.vocab_kernels_for(on_cpu[None]) is not None
    assert cpu_kernels.vocab_kernels_for(off_cpu[None]) is None
    assert fused_ops._kernels(on_cpu) is not None and fused_ops._kernels(on_cpu, off_cpu) is None
    checksum = cpu_kernels.load_checksum()
    assert checksum(on_cpu, torch.float32) is not None and checksum(off_cpu, torch.float32) is None


def test_a_token_batch_moves_every_tensor() -> None:
    moved = shared_prompt_batch().to(META)
    assert all(t is None or t.device == META for t in moved.__dict__.values())
    assert moved.old_logp is None and moved.values is None


@pytest.mark.parametrize("precision", ["int8", "bf16-weights"])
def test_packed_engine_precisions_are_refused_off_the_cpu(precision: str) -> None:
    from pydantic import ValidationError

    from thermik.config.schema import RunConfig

    with pytest.raises(ValidationError, match=f"inference.precision = '{precision}' packs the weights .* 'cuda'"):
        RunConfig.model_validate({"model": {"device": "cuda"}, "inference": {"precision": precision}})
    assert RunConfig.model_validate({"inference": {"precision": precision}}).inference.precision == precision

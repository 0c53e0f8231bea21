"""SFT: packing equals padding per token, the row formats, the roles that train, the data order, LoRA."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
from conftest import cli_env

from thermik.config.schema import FailuresConfig, LoRAConfig, OptimizerConfig
from thermik.data.conversations import DataOrder, as_conversation, encode_all, load_conversations, trains
from thermik.errors import NothingDoneError
from thermik.models.chat import ChatTokenizer
from thermik.models.loading import load_model, load_tokenizer
from thermik.runs.verdict import sft_verdict
from thermik.training import packing
from thermik.training.optim import build_optimizer
from thermik.training.packing import block_causal_bias, pack
from thermik.training.sft import auto_micro_batch_tokens, micro_batches, sft_loss, sft_token_logprobs, sft_update


def _examples(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Mixed lengths 3..80, loss on the second half of each."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 81, (n,), generator=g).tolist()
    out = []
    for length in lengths:
        ids = torch.randint(1, 200, (length,), generator=g).tolist()
        out.append((ids, [0] * (length // 2) + [1] * (length - length // 2)))
    return out


def test_pack_places_every_sequence_once_within_capacity():
    seqs = [[1] * n for n in (5, 9, 3, 7, 2, 9)]
    packed = pack(seqs, 12, pad_id=0)
    assert packed.rows == 3  # first-fit decreasing: (9, 3), (9, 2), (7, 5)
    for i, (row, start, n) in enumerate(packed.places):
        assert n == len(seqs[i])
        assert packed.position_ids[row, start : start + n].tolist() == list(range(n))
        assert (packed.segments[row, start : start + n] == i + 1).all()
    used = sorted((row, start, start + n) for row, start, n in packed.places)
    for (r1, _, e1), (r2, s2, _) in itertools.pairwise(used):
        assert r1 != r2 or e1 <= s2, "sequences overlap"


def test_block_causal_bias_is_causal_within_a_segment_only():
    segments = torch.tensor([[1, 1, 2, 2, 2, -1]])
    allowed = block_causal_bias(segments, torch.float32)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


@pytest.mark.parametrize("varlen", [True, False])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_per_token_loss_and_gradients_equal_the_padded_batch(tiny_model_dir, monkeypatch, attention, varlen):
    # varlen: one row, per-sequence attention; else the masked rows (SDPA takes a boolean mask, eager an additive one)
    monkeypatch.setattr(packing, "SEGMENTS_ON_CPU", varlen)
    model = load_model(tiny_model_dir)
    model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention
    examples = _examples(12)
    padded_logp, mask = sft_token_logprobs(model, examples, pad_id=0)
    packed_logp, packed_mask = sft_token_logprobs(model, examples, pad_id=0, pack_tokens=96)
    assert torch.equal(mask, packed_mask)
    on = mask.bool()
    torch.testing.assert_close(packed_logp[on], padded_logp[on], rtol=0, atol=1e-5)
    grads = []
    for pack_tokens in (0, 96):
        model.zero_grad(set_to_none=True)
        sft_loss(model, examples, 0, pack_tokens=pack_tokens).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_micro_batches_bound_the_padded_size_and_give_the_batch_gradient(tiny_model_dir):
    """Micro-batches of at most 160 padded tokens: the same loss and gradient as the whole batch at once, with and
    without packing, to float rounding."""
    examples = _examples(12)
    chunks = micro_batches(examples, 160)
    assert [e for c in chunks for e in c] == examples and len(chunks) > 2
    assert all(len(c) == 1 or len(c) * max(len(e[0]) for e in c) <= 160 for c in chunks)
    for pack_tokens in (0, 96):
        grads, losses = [], []
        for budget in (0, 160):
            model = load_model(tiny_model_dir)
            optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-3))
            out = sft_update(model, examples, 0, optimizer, scheduler, 1e9, pack_tokens=pack_tokens,
                             micro_batch_tokens=budget)  # fmt: skip
            losses.append(out["sft/loss"])
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)


def test_auto_micro_batch_keeps_a_small_model_whole_and_splits_a_big_vocabulary(tiny_model_dir):
    from transformers import LlamaConfig

    tiny = load_model(tiny_model_dir)
    assert auto_micro_batch_tokens(tiny, 512) >= 16 * 512  # the calculator's batch in one piece
    smollm2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          vocab_size=49152)  # fmt: skip
    tokens = auto_micro_batch_tokens(_with_config(smollm2), 512)
    assert 128 <= tokens <= 1024


def _with_config(config) -> torch.nn.Module:
    module = torch.nn.Module()
    module.config = config
    return module


def test_prompt_completion_rows_train_the_completion_only(tiny_model_dir, tmp_path):
    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    rows = [
        {"prompt": "reverse abc", "completion": "cba"},
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "completion": "ok"},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs = load_conversations(str(path))
    assert convs[0]["messages"] == [{"role": "user", "content": "reverse abc"}, {"role": "assistant", "content": "cba"}]
    assert convs[1]["messages"][-1] == {"role": "assistant", "content": "ok"}
    (ids, mask), *_ = encode_all(chat, convs, 512)
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert trained == [*chat.encode("cba"), chat.eos_id]
    with pytest.raises(ValueError, match=r"'messages'.*'prompt' and 'completion'"):
        as_conversation({"text": "no"}, "rows.jsonl:4")


def test_train_roles_add_the_content_of_other_roles_never_their_template(tiny_model_dir):
    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    messages = [
        {"role": "user", "content": "compute 2+3"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "five"},
    ]
    default_ids, default_mask = chat.encode_conversation(messages)
    ids, mask = chat.encode_conversation(messages, roles=("user", "assistant"))
    assert ids == default_ids, "roles never change the token ids"
    text = lambda m: chat.tokenizer.decode([i for i, on in zip(ids, m, strict=True) if on])  # noqa: E731
    assert text(default_mask) == "call<|im_end|>five<|im_end|>"
    assert text(mask) == "compute 2+3call<|im_end|>five<|im_end|>"
    _, tool_mask = chat.encode_conversation(messages, roles=("tool",))
    assert text(tool_mask) == "5"
    convs = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    assert not any(map(trains, encode_all(chat, convs, 64, roles=("system",)))), "the SFT verdict refuses this"
    verdict = sft_verdict(FailuresConfig(), 64, ("system",))
    verdict.observe({"conversations/kept": 0.0, "conversations/cut": 0.0})
    with pytest.raises(NothingDoneError, match=r"train_roles \('system',\) match no content"):
        verdict.conclude()


def test_data_order_continues_from_a_saved_position():
    whole = DataOrder(7, seed=3)
    batches = [whole.next_batch(3) for _ in range(6)]
    assert sorted(batches[0] + batches[1] + [batches[2][0]]) == list(range(7)), "an epoch is a permutation"
    resumed = DataOrder(7, seed=3, position=9)
    assert [resumed.next_batch(3) for _ in range(3)] == batches[3:]


def test_sft_with_lora_overfits_a_tiny_batch(tiny_model_dir):
    from thermik.training.lora import apply_lora

    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    rows = [
        {"messages": [{"role": "user", "content": "reverse abcd"}, {"role": "assistant", "content": "dcba"}]},
        {"messages": [{"role": "user", "content": "reverse xyz"}, {"role": "assistant", "content": "zyx"}]},
    ]
    batch = encode_all(chat, rows, 64)
    torch.manual_seed(0)
    model = apply_lora(
        load_model(tiny_model_dir), LoRAConfig(enabled=True, rank=8, alpha=16, modules_to_save=("norm",))
    )
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer, scheduler = build_optimizer(model, OptimizerConfig(lr=1e-2))
    losses = [sft_update(model, batch, 0, optimizer, scheduler, 1.0, pack_tokens=64)["sft/loss"] for _ in range(80)]
    assert losses[-1] < 0.05 * losses[0], losses[::10]
    frozen = dict(model.named_parameters())
    assert all(torch.equal(frozen[n], p) for n, p in base.items()), "the base weights stay frozen"


def test_lora_without_peft_names_the_extra(tiny_model_dir, tmp_path):
    code = (
        "import sys; sys.modules['peft'] = None\n"
        "from thermik.config.schema import LoRAConfig, ModelConfig\n"
        "from thermik.assembly.components import load_policy\n"
        f"load_policy(ModelConfig(path={str(tiny_model_dir)!r}), LoRAConfig(enabled=True))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert 'pip install -e ".[lora]"' in proc.stderr, proc.stderr[-2000:]


@pytest.fixture
def packing_bench():
    from conftest import load_benchmark

    yield from load_benchmark("packing")


def test_packing_benchmark_times_every_side_on_equal_losses(packing_bench, tiny_model_dir):
    model = load_model(tiny_model_dir).train()
    batch = packing_bench.mixed_batch(6, 4, 40, model.config.vocab_size, seed=1)
    result = packing_bench.run(model, batch, 40, repeats=1)
    assert set(result) == {"padded", "varlen", "masked"} and all(s > 0 for s in result.values())
    assert not packing.SEGMENTS_ON_CPU and packing.VARLEN_SEGMENTS == ("sdpa", "eager")  # restored


@pytest.mark.slow
def test_sft_with_lora_checkpoints_resumes_and_exports_the_adapter(tiny_model_dir, tmp_path):
    from conftest import run_thermik

    rows = [{"prompt": f"reverse ab{i}", "completion": f"{i}ba"} for i in range(8)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "sft", "--model.path", str(tiny_model_dir), "--train_path", str(tmp_path / "rows.jsonl"), "--batch_size", "4",
        "--checkpoint.every", "2", "--eval_every", "0", "--output_dir", str(tmp_path), "--name", "lora",
        "--progress", "false", "--lora.enabled", "true", "--lora.modules_to_save", '["norm"]',
    ]  # fmt: skip
    first = run_thermik(*args, "--max_steps", "3", timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_thermik(*args, "--max_steps", "5", timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    run = tmp_path / "lora"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5], "the second run resumed from step 3's checkpoint"
    assert (run / "checkpoints" / "step_4" / "model" / "adapter_model.safetensors").is_file()
    assert (run / "model" / "adapter" / "adapter_model.safetensors").is_file()
    assert (run / "model" / "model.safetensors").is_file(), "the merged model beside its adapter"


def test_learning_rate_warms_up_then_decays_linearly_to_its_floor() -> None:
    model = torch.nn.Linear(2, 2)
    cfg = OptimizerConfig(lr=1e-2, warmup_steps=4, decay_steps=14, final_lr_ratio=0.1)
    optimizer, scheduler = build_optimizer(model, cfg)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[:4] == pytest.approx([2e-3, 4e-3, 6e-3, 8e-3])  # warm-up
    assert rates[4] == pytest.approx(1e-2) and rates[9] == pytest.approx(1e-2 * (1 - 0.9 * 5 / 10))
    assert rates[14:] == pytest.approx([1e-3] * 6)  # the floor from decay_steps on
    assert all(a >= b for a, b in itertools.pairwise(rates[4:]))
    constant, _ = build_optimizer(model, OptimizerConfig(lr=1e-2, warmup_steps=4))
    assert constant.param_groups[0]["lr"] == pytest.approx(2e-3)  # decay_steps 0: warm-up, then constant


def test_held_out_checks_run_every_step_once_one_comes_close_and_stop_at_the_threshold() -> None:
    from thermik.runs.held_out_stop import HeldOutStop

    stop = HeldOutStop(stop_at=0.6, every=5, min_step=10, every_step_from=0.4)
    values = {10: 0.2, 15: 0.45, 16: 0.3, 17: 0.55, 18: 0.62}
    checked = []
    for step in range(1, 30):
        if stop.checks_at(step):
            checked.append(step)
            stop.record(values[step])
        if stop.reached():
            break
    assert checked == [10, 15, 16, 17, 18], "every 5 from step 10, then every step from the first check >= 0.4"
    assert step == 18 and stop.mean() == 0.62
    resumed = HeldOutStop(stop_at=0.6, every=5, min_step=10, every_step_from=0.4)
    resumed.load(stop.state())
    assert resumed.checks_at(19) and not HeldOutStop(0.6, 5, 10, 0.4).checks_at(19)
    assert not HeldOutStop(0.6, 0, 0, 0.0).checks_at(5), "eval_every 0 turns the check off"

    windowed = HeldOutStop(stop_at=0.6, every=1, window=3)
    for value in (0.5, 0.5, 0.72):  # one lucky check alone does not stop the run: the mean is 0.573
        windowed.record(value)
        assert not windowed.reached()
    windowed.record(0.65)
    assert windowed.reached() and windowed.recent == [0.5, 0.72, 0.65]
    resumed = HeldOutStop(stop_at=0.6, every=1, window=3)
    resumed.load(windowed.state())
    assert resumed.reached()


@pytest.mark.slow
def test_sft_checks_every_step_after_a_close_check_and_a_resumed_run_keeps_doing_so(tmp_path):
    from conftest import run_thermik

    from thermik.models.presets import init_model

    model = init_model("qwen2-1m", tmp_path / "init", seed=0)
    data = run_thermik("synthesize", "--env", "calculator", "--n", "40", "--out", str(tmp_path / "data"))
    assert data.returncode == 0, data.stderr[-3000:]
    args = [
        "sft", "--model.path", str(model), "--train_path", str(tmp_path / "data" / "sft.jsonl"), "--env.name",
        "calculator", "--batch_size", "4", "--checkpoint.every", "1", "--eval_every", "3", "--eval_size", "2",
        "--min_steps", "3", "--eval_every_step_from", "0", "--output_dir", str(tmp_path), "--name", "close",
        "--progress", "false",
    ]  # fmt: skip
    first = run_thermik(*args, "--max_steps", "4", timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_thermik(*args, "--max_steps", "5", timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "close" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/success" in r] == [3, 4, 5]
    stopped = run_thermik(*args, "--max_steps", "9", "--stop_at", "0", "--name", "stops", timeout=300)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert json.loads((tmp_path / "stops" / "sft_result.json").read_text())["steps"] == 3

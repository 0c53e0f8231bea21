"""Checkpoints are complete or absent; training state round-trips exactly."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from thermik.training.checkpoint import CheckpointManager, load_training_state, save_training_state


def _writer(payload: str):
    def write(d: Path) -> None:
        (d / "payload.txt").write_text(payload)
        (d / "sub").mkdir()
        (d / "sub" / "more.txt").write_text(payload * 2)

    return write


def test_save_keep_latest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "ckpt", keep=2)
    assert mgr.latest() is None and mgr.list_complete() == []
    for step in (1, 2, 10, 3):
        path = mgr.save(step, _writer(f"s{step}"))
        assert path == tmp_path / "ckpt" / f"step_{step}"
    # keep=2: the oldest by step number go first, and the latest marker names the last save
    assert [p.name for p in mgr.list_complete()] == ["step_3", "step_10"]
    assert mgr.latest() == tmp_path / "ckpt" / "step_3"
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_3"
    assert (mgr.latest() / "sub" / "more.txt").read_text() == "s3s3"
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".tmp")]


def test_keep_one_never_removes_newest_before_write(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=1)
    mgr.save(1, _writer("a"))
    seen: list[list[str]] = []

    def write(d: Path) -> None:  # what is on disk while the new checkpoint is being written
        seen.append([p.name for p in mgr.list_complete()])
        (d / "x").write_text("b")

    mgr.save(2, write)
    assert seen == [["step_1"]]
    assert [p.name for p in mgr.list_complete()] == ["step_2"]


def test_crash_midway_leaves_previous_intact(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(5, _writer("good"))

    def crash(d: Path) -> None:
        (d / "payload.txt").write_text("half")
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError, match="killed"):
        mgr.save(6, crash)
    assert mgr.latest() == tmp_path / "step_5"
    assert [p.name for p in mgr.list_complete()] == ["step_5"]
    assert (tmp_path / "step_5" / "payload.txt").read_text() == "good"
    assert not (tmp_path / "step_6").exists() and not (tmp_path / ".tmp_step_6").exists()


def test_stale_tmp_and_dangling_marker(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    mgr.save(1, _writer("one"))
    # A run killed with SIGKILL leaves a temp dir behind and, worse, a marker naming a step that never landed.
    (tmp_path / ".tmp_step_2").mkdir()
    (tmp_path / ".tmp_step_2" / "partial.bin").write_bytes(b"\0" * 10)
    (tmp_path / "latest").write_text("step_2\n")
    assert mgr.latest() == tmp_path / "step_1"  # falls back to the highest complete step
    (tmp_path / "latest").write_text("../../etc\n")
    assert mgr.latest() == tmp_path / "step_1"
    mgr.save(3, _writer("three"))
    assert not (tmp_path / ".tmp_step_2").exists()
    assert [p.name for p in mgr.list_complete()] == ["step_1", "step_3"]
    assert mgr.latest() == tmp_path / "step_3"


def test_resave_same_step_replaces_it(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    mgr.save(4, _writer("old"))
    mgr.save(4, _writer("new"))
    assert [p.name for p in mgr.list_complete()] == ["step_4"]
    assert (mgr.latest() / "payload.txt").read_text() == "new"


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep"):
        CheckpointManager(tmp_path, keep=0)
    with pytest.raises(ValueError, match="step"):
        CheckpointManager(tmp_path, keep=1).save(-1, _writer("x"))


# ---------------------------------------------------------------- training state


def _tiny_model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    return Qwen2ForCausalLM(cfg)


def _train_steps(model: Qwen2ForCausalLM, opt: torch.optim.Optimizer, n: int) -> None:
    ids = torch.randint(0, 64, (2, 8))
    for _ in range(n):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_training_state_round_trip(tmp_path: Path) -> None:
    model = _tiny_model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train_steps(model, opt, 2)
    mgr = CheckpointManager(tmp_path, keep=2)
    mgr.save(2, lambda d: save_training_state(d, model, opt, step=2, extra={"data_pos": 17}))
    after_save = (torch.rand(4), random.random(), np.random.rand(3))

    # A different model/optimizer, trained differently, with the RNG moved on.
    other = _tiny_model(1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    _train_steps(other, other_opt, 1)
    state = load_training_state(mgr.latest(), other, other_opt)

    assert state == {"step": 2, "data_pos": 17}
    after_load = (torch.rand(4), random.random(), np.random.rand(3))
    assert torch.equal(after_load[0], after_save[0])
    assert after_load[1] == after_save[1]
    np.testing.assert_array_equal(after_load[2], after_save[2])
    for (name, p), q in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    saved_opt, loaded_opt = opt.state_dict(), other_opt.state_dict()
    assert saved_opt["param_groups"] == loaded_opt["param_groups"]
    for k, s in saved_opt["state"].items():
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s[field], loaded_opt["state"][k][field])
    # Identical next step from both: the optimizer moments really were restored.
    torch.manual_seed(3)
    _train_steps(model, opt, 1)
    torch.manual_seed(3)
    _train_steps(other, other_opt, 1)
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q)


def test_extra_step_must_agree(tmp_path: Path) -> None:
    model = _tiny_model(0)
    with pytest.raises(ValueError, match="extra"):
        save_training_state(tmp_path, model, torch.optim.AdamW(model.parameters()), step=3, extra={"step": 2})


def test_load_rejects_mismatched_model(tmp_path: Path) -> None:
    model = _tiny_model(0)
    save_training_state(tmp_path, model, torch.optim.AdamW(model.parameters()), step=0, rng=False)
    bigger = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
        )
    )
    with pytest.raises(RuntimeError, match="missing"):
        load_training_state(tmp_path, bigger, None)
    with pytest.raises(FileNotFoundError, match=r"trainer_state\.json"):
        load_training_state(tmp_path / "model", model, None)


def test_tied_embeddings_round_trip(tmp_path: Path) -> None:
    # save_pretrained stores tied weights once; loading must accept the missing tied key and keep the tie.
    cfg = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    cfg |= {"num_key_value_heads": 1, "intermediate_size": 64, "tie_word_embeddings": True}
    torch.manual_seed(0)
    src = Qwen2ForCausalLM(Qwen2Config(**cfg))
    torch.manual_seed(1)
    dst = Qwen2ForCausalLM(Qwen2Config(**cfg))
    save_training_state(tmp_path, src, torch.optim.AdamW(src.parameters()), step=1, rng=False)
    load_training_state(tmp_path, dst, None)
    assert torch.equal(dst.model.embed_tokens.weight, src.model.embed_tokens.weight)
    assert dst.lm_head.weight.data_ptr() == dst.model.embed_tokens.weight.data_ptr()


def test_lora_adapter_round_trip(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    src = peft.get_peft_model(_tiny_model(0), lora)
    dst = peft.get_peft_model(_tiny_model(0), lora)
    with torch.no_grad():
        for name, p in dst.named_parameters():
            if "lora_" in name:
                p.normal_()
    trainable = [p for p in src.parameters() if p.requires_grad]
    save_training_state(tmp_path, src, torch.optim.AdamW(trainable), step=1, rng=False)
    load_training_state(tmp_path, dst, torch.optim.AdamW([p for p in dst.parameters() if p.requires_grad]))
    for (name, p), q in zip(src.state_dict().items(), dst.state_dict().values(), strict=True):
        assert torch.equal(p, q), name

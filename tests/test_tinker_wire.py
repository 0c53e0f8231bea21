"""`thermik tinker` pieces without a server: the config surface, the wire format, the SQLite store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard

pytest.importorskip("tinker", reason="the tinker SDK is in requirements/dev.txt")
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from thermik.tinker import wire
from thermik.tinker.config import TinkerConfig
from thermik.tinker.service import Job, Service, ok
from thermik.tinker.store import Store


def test_config_surface_is_frozen() -> None:
    sections = {name: sorted(type(section).model_fields) for name, section in TinkerConfig().__dict__.items()}
    assert sections == {
        "model": [
            "chat_template",
            "device",
            "dtype",
            "enable_thinking",
            "lm_head_precision",
            "path",
            "seed",
            "train_precision",
        ],
        "server": ["access_log", "api_key", "base_model_name", "host", "port"],
        "service": ["max_lora_rank", "max_sampler_engines", "num_threads", "poll_s", "state_dir"],
    }
    assert TinkerConfig().server.host == "127.0.0.1"


def test_forward_backward_request_round_trips_through_zstd_and_sparse_tensors() -> None:
    import torch

    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": torch.tensor([[6, 7, 8]]), "weights": torch.tensor([[0.0, 1.0, 0.5]])},
    )  # 2-D torch inputs: the SDK sends them as sparse CSR
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="ppo", loss_fn_config={"beta": 0.1}),
        model_id="m",
        seq_id=4,
    )
    body = zstandard.ZstdCompressor().compress(forward_backward_request_to_proto(request).SerializeToString())
    parsed = wire.parse_forward_backward(wire.decode_body(body, "zstd"))
    assert (parsed.model_id, parsed.seq_id, parsed.loss_fn, parsed.config) == ("m", 4, "ppo", {"beta": 0.1})
    assert parsed.data[0].tokens.tolist() == [5, 6, 7]
    np.testing.assert_array_equal(parsed.data[0].inputs["weights"].reshape(-1), [0.0, 1.0, 0.5])
    with pytest.raises(wire.WireError, match="unsupported Content-Encoding 'br'"):
        wire.decode_body(body, "br")
    with pytest.raises(wire.WireError, match="not a ForwardBackwardRequest"):
        wire.parse_forward_backward(b"\xff\xff\xff")


def test_outputs_decode_with_the_sdks_own_readers() -> None:
    outputs = [{"logprobs": np.array([-1.0, -2.0], np.float32)}, {"logprobs": np.array([-0.5], np.float32)}]
    fb = deserialize_forward_backward_output(wire.forward_backward_output(outputs, {"loss:sum": 3.5}))
    assert fb.metrics == {"loss:sum": 3.5} and fb.loss_fn_outputs[1]["logprobs"].tolist() == [-0.5]
    seqs = [wire.Sequence([1, 2], [-0.1, -0.2], "stop"), wire.Sequence([3], [-0.3], "length")]
    sample = deserialize_sample_response(wire.sample_response(seqs, [float("nan"), -1.5]))
    assert [s.stop_reason for s in sample.sequences] == ["stop", "length"] and sample.prompt_logprobs == [None, -1.5]
    assert pb.STOP_REASON_STOP != pb.STOP_REASON_LENGTH


def test_tinker_paths() -> None:
    path = wire.tinker_path("s:train:0", "sampler_weights", "final")
    assert types.ParsedCheckpointTinkerPath.from_tinker_path(path).checkpoint_id == "sampler_weights/final"
    assert wire.parse_tinker_path(path) == ("s:train:0", "sampler_weights", "final")
    with pytest.raises(wire.WireError, match="invalid checkpoint path"):
        wire.parse_tinker_path("tinker://run/other/x")


def test_store_keeps_futures_idempotent_across_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "t.sqlite")
    rid, created = store.new_future("fwdbwd", "train:m:1")
    assert created and store.new_future("fwdbwd", "train:m:1") == (rid, False)
    store.finish(rid, "done", "application/x-protobuf", b"abc")
    store.close()
    again = Store(tmp_path / "t.sqlite")
    row = again.future(rid)
    assert row is not None and (row.status, row.payload) == ("done", b"abc")
    assert again.new_future("fwdbwd", "train:m:1") == (rid, False)


def _held(gate: threading.Event):
    """A job body that keeps the worker busy until `gate` is set."""

    def run() -> tuple[str, bytes]:
        gate.wait(10)
        return ok({"done": True})

    return run


class _RecordingTrainer:
    """Stands in for the Trainer: records what the worker asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def forward_backward(self, model_id, loss_fn, config, parts, forward_only) -> None:
        self.calls.append(("fwdbwd", model_id, len(parts)))
        for part in parts:
            part.outputs, part.metrics = [], {"loss:sum": 0.0}


def test_worker_batches_forward_backward_per_adapter_up_to_a_barrier(tmp_path: Path) -> None:
    trainer, gate = _RecordingTrainer(), threading.Event()
    service = Service(Store(tmp_path / "t.sqlite"), trainer, samplers=None, num_threads=0)  # type: ignore[arg-type]
    req = wire.FwdBwdRequest("A", 0, "cross_entropy", False, [wire.Datum(np.array([1]), {})])
    other = wire.FwdBwdRequest("B", 0, "cross_entropy", False, [wire.Datum(np.array([1]), {})])

    def optim() -> tuple[str, bytes]:
        trainer.calls.append(("optim", "A", 0))
        return ok({})

    service.submit(Job("", "A", "hold", run=_held(gate)), None)  # every job below is queued behind it
    ids = [
        service.submit(Job("", "A", "fwdbwd", fwdbwd=req), None)[0],
        service.submit(Job("", "B", "fwdbwd", fwdbwd=other), None)[0],
        service.submit(Job("", "A", "fwdbwd", fwdbwd=req), None)[0],
        service.submit(Job("", "A", "optim", run=optim), None)[0],
        service.submit(Job("", "A", "fwdbwd", fwdbwd=req), None)[0],
    ]
    gate.set()
    deadline = time.monotonic() + 10
    while any(service.store.future(i).status == "pending" for i in ids):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    service.close()
    assert trainer.calls == [("fwdbwd", "A", 2), ("fwdbwd", "B", 1), ("optim", "A", 0), ("fwdbwd", "A", 1)]


def test_retrieve_future_answers_try_again_before_the_sdks_timeout(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from thermik.tinker.api import Served, TinkerAPI
    from thermik.tinker.api_weights import WeightsAPI
    from thermik.tinker.app import build_app

    gate = threading.Event()
    service = Service(Store(tmp_path / "t.sqlite"), _RecordingTrainer(), samplers=None)  # type: ignore[arg-type]
    rid, _ = service.submit(Job("", "A", "hold", run=_held(gate)), None)
    api = TinkerAPI(service, Served("m", tmp_path, "qwen2", 100, 64, 8))
    with TestClient(build_app(api, WeightsAPI(api, tmp_path / "ckpt"), poll_s=0.2)) as http:
        t0 = time.monotonic()
        pending = http.post("/api/v1/retrieve_future", json={"request_id": rid}).json()
        assert pending == {"type": "try_again", "request_id": rid, "queue_state": "active"}
        assert 0.2 <= time.monotonic() - t0 < 5
        gate.set()
        assert http.post("/api/v1/retrieve_future", json={"request_id": rid}).json() == {"done": True}
        missing = http.post("/api/v1/retrieve_future", json={"request_id": "nope"})
        assert missing.status_code == 404 and "unknown request_id" in missing.json()["detail"]
    service.close()


def test_samplers_never_close_an_engine_under_a_request(tiny_model_dir: Path, tmp_path: Path) -> None:
    import asyncio

    from thermik.models.loading import load_tokenizer
    from thermik.tinker.sampler import Samplers
    from thermik.tinker.trainer import Trainer

    trainer = Trainer(tiny_model_dir)
    trainer.create("run-a", {"rank": 2, "seed": 0})
    trainer.save_sampler("run-a", tmp_path / "a")
    samplers = Samplers(trainer.plain, load_tokenizer(tiny_model_dir), max_engines=1)
    adapter = str(tmp_path / "a")

    async def main() -> None:
        base = await samplers.engine(None)  # busy, as under a running request
        await samplers.engine(adapter)
        assert set(samplers._engines) == {None, adapter}  # over the limit, but the busy one stays
        samplers.release(None)
        samplers.release(adapter)
        assert await samplers.engine(adapter) is samplers._engines[adapter]
        assert set(samplers._engines) == {adapter}  # the idle, least recently used one went
        samplers.release(adapter)
        assert base.weight_version == 0
        await samplers.close()

    asyncio.run(main())

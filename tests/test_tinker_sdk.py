"""The official tinker SDK 0.38, unmodified, against `thermik tinker` on loopback."""

from __future__ import annotations

import itertools
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the tinker SDK is in requirements/dev.txt (pip install -r ...)")

from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker_support import API_KEY, fixed_datum, start_tinker  # noqa: E402

from thermik.tinker.wire import PROTO  # noqa: E402


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    srv = start_tinker(tiny_model_dir, tmp_path_factory.mktemp("tinker") / "state", "--server.api_key", API_KEY)
    yield srv
    srv.stop()


def _train(client, datum, steps: int, lr: float = 1e-2) -> list[float]:
    losses = []
    for _ in range(steps):
        fwdbwd = client.forward_backward([datum, datum], "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fwdbwd.result().metrics["loss:sum"])
        optim.result()
    return losses


def test_sdk_trains_lora_saves_and_samples(server, tiny_model_dir: Path) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    client = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=8, seed=1).result()
    info = client.get_info()
    assert info.model_data.tokenizer_id == str(tiny_model_dir.resolve()) and info.lora_rank == 8
    datum = fixed_datum(client.get_tokenizer())
    losses = _train(client, datum, steps=6)
    assert all(b < a for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] < 0.5 * losses[0]
    # forward-only: outputs per datum, no gradient kept
    fwd = client.forward([datum], "cross_entropy").result()
    assert list(fwd.loss_fn_outputs[0]["logprobs"].shape) == [len(datum.model_input.to_ints())]
    path = client.save_weights_for_sampler("after-6").result().path
    assert path.startswith("tinker://") and "/sampler_weights/after-6" in path
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints(datum.model_input.to_ints()[:4])
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    result = sampler.sample(prompt, num_samples=3, sampling_params=params, include_prompt_logprobs=True).result()
    assert len(result.sequences) == 3
    assert len({s.sequence_id for s in result.sequences}) == 3 and all(s.sequence_id for s in result.sequences)
    for seq in result.sequences:
        assert 1 <= len(seq.tokens) <= 6 and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
    assert result.prompt_logprobs[0] is None and len(result.prompt_logprobs) == 4
    last2 = sampler.sample(prompt, 1, params, include_prompt_logprobs=True, prompt_logprobs_last_n=2).result()
    assert last2.prompt_logprobs[:2] == [None, None] and last2.prompt_logprobs[2:] == result.prompt_logprobs[2:]
    with pytest.raises(Exception, match="does not support \\['topk_sample_logprobs'\\]"):
        sampler.sample(prompt, 1, params, topk_sample_logprobs=3).result()
    # the sampler's weights are the trained adapter's: its logprobs equal the training forward's
    seq = result.sequences[0]
    full = prompt.to_ints() + list(seq.tokens)
    check = types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": np.array(full[1:]), "weights": np.ones(len(full) - 1, np.float32)},
    )
    train_lp = client.forward([check], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(train_lp[-len(seq.tokens) :], seq.logprobs, atol=2e-3)
    np.testing.assert_allclose(train_lp[: len(prompt.to_ints()) - 1], result.prompt_logprobs[1:], atol=2e-3)


def test_bad_requests_are_refused_with_a_message(server, tiny_model_dir: Path) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    with pytest.raises(Exception, match="not served here"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    no_key = httpx.post(f"{server.url}/api/v1/create_session", json={}, timeout=10)
    assert no_key.status_code == 401
    headers = {"X-API-Key": API_KEY}
    bad = httpx.post(f"{server.url}/api/v1/optim_step", json={"model_id": "nope"}, headers=headers, timeout=10)
    assert bad.status_code == 400 and "bad request" in bad.json()["detail"]
    client = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=2).result()
    short = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": np.array([2, 3])}
    )
    with pytest.raises(Exception, match="has 2 values for 3 input tokens"):
        client.forward_backward([short], "cross_entropy").result()


def _fwdbwd_body(model_id: str, seq_id: int, datum) -> bytes:
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def _post(url: str, path: str, **kwargs) -> dict:
    response = httpx.post(
        f"{url}/api/v1/{path}", headers={"X-API-Key": API_KEY, **kwargs.pop("headers", {})}, timeout=60, **kwargs
    )
    response.raise_for_status()
    return response.json()


def _result(url: str, request_id: str) -> httpx.Response:
    while True:
        response = httpx.post(
            f"{url}/api/v1/retrieve_future", json={"request_id": request_id},
            headers={"X-API-Key": API_KEY, "Accept": PROTO}, timeout=60,
        )  # fmt: skip
        response.raise_for_status()
        if "protobuf" in response.headers["content-type"] or response.json().get("type") != "try_again":
            return response


def _new_model(url: str, seed: int) -> str:
    session = _post(url, "create_session", json={"tags": [], "user_metadata": None, "sdk_version": "test"})
    body = {"session_id": session["session_id"], "model_seq_id": 0, "base_model": "qwen2-1m",
            "lora_config": {"rank": 4, "seed": seed}}  # fmt: skip
    future = _post(url, "create_model", json=body)
    _result(url, future["request_id"])
    return future["model_id"]


def test_replayed_forward_backward_is_applied_once(server, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    datum = fixed_datum(AutoTokenizer.from_pretrained(tiny_model_dir))
    norms = []
    for replays in (1, 3):
        model_id = _new_model(server.url, seed=7)
        body = _fwdbwd_body(model_id, 1, datum)
        ids = {_post(server.url, "forward_backward", content=body, headers={"Content-Type": PROTO})["request_id"]
               for _ in range(replays)}  # fmt: skip
        assert len(ids) == 1
        _result(server.url, ids.pop())
        step = _post(server.url, "optim_step", json={"model_id": model_id, "seq_id": 2, "adam_params": {}})
        norms.append(_result(server.url, step["request_id"]).json()["metrics"]["grad_norm:mean"])
    assert norms[0] == pytest.approx(norms[1], rel=1e-6)


def test_two_clients_concurrently_equal_each_alone(server, tiny_model_dir: Path) -> None:
    def run(seed: int, text: str, out: dict) -> None:
        service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        client = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=seed).result()
        out[seed] = _train(client, fixed_datum(client.get_tokenizer(), text), steps=4)

    jobs = [(11, "one two three four five six"), (12, "abc abc abc def def def")]
    alone: dict[int, list[float]] = {}
    for seed, text in jobs:
        run(seed, text, alone)
    together: dict[int, list[float]] = {}
    threads = [threading.Thread(target=run, args=(seed, text, together)) for seed, text in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for seed, _ in jobs:
        np.testing.assert_allclose(together[seed], alone[seed], rtol=1e-5)


def test_restart_between_submit_and_retrieve_serves_the_result(tiny_model_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_tinker(tiny_model_dir, state)
    try:
        from transformers import AutoTokenizer

        model_id = _new_model(first.url, seed=3)
        datum = fixed_datum(AutoTokenizer.from_pretrained(tiny_model_dir))
        future = _post(
            first.url, "forward_backward", content=_fwdbwd_body(model_id, 1, datum), headers={"Content-Type": PROTO}
        )
        save = _post(first.url, "save_weights", json={"model_id": model_id, "path": "kept", "seq_id": 2})
        with sqlite3.connect(state / "tinker.sqlite") as db:  # finished, never retrieved
            deadline = time.monotonic() + 60
            query = "SELECT count(*) FROM futures WHERE status = 'done' AND request_id IN (?, ?)"
            while db.execute(query, (future["request_id"], save["request_id"])).fetchone()[0] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        first.kill()
    finally:
        first.stop()
    second = start_tinker(tiny_model_dir, state)
    try:
        response = _result(second.url, future["request_id"])
        assert "protobuf" in response.headers["content-type"]
        output = tinker.proto.response_conv.deserialize_forward_backward_output(response.content)
        assert output.metrics["loss:sum"] > 0 and len(output.loss_fn_outputs) == 1
        listing = httpx.get(f"{second.url}/api/v1/training_runs/{model_id}/checkpoints", timeout=10).json()
        assert [c["tinker_path"] for c in listing["checkpoints"]] == [f"tinker://{model_id}/weights/kept"]
        lost = httpx.post(f"{second.url}/api/v1/get_info", json={"model_id": model_id}, timeout=10)
        assert lost.status_code == 410 and "load_weights from its last checkpoint" in lost.json()["detail"]
    finally:
        second.stop()


def test_checkpoints_list_delete_and_resume_from_state(server, tiny_model_dir: Path) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    client = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=5).result()
    datum = fixed_datum(client.get_tokenizer(), "resume me resume me")
    _train(client, datum, steps=3)
    state_path = client.save_state("mid").result().path
    client.save_weights_for_sampler("mid-sampler").result()
    after_save = client.forward([datum], "cross_entropy").result().metrics["loss:sum"]

    resumed = service.create_training_client_from_state_with_optimizer(state_path).result()
    assert resumed.model_id != client.model_id
    assert resumed.forward([datum], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(after_save, rel=1e-5)
    # the resumed optimizer state continues exactly where the original left off
    np.testing.assert_allclose(_train(resumed, datum, steps=2), _train(client, datum, steps=2), rtol=1e-5)

    rest = tinker.RestClient(base_url=server.url, api_key=API_KEY)
    listed = rest.list_checkpoints(client.model_id).result().checkpoints
    assert sorted(c.checkpoint_id for c in listed) == ["sampler_weights/mid-sampler", "weights/mid"]
    rest.delete_checkpoint_from_tinker_path(state_path).result()
    assert [c.checkpoint_id for c in rest.list_checkpoints(client.model_id).result().checkpoints] == [
        "sampler_weights/mid-sampler"
    ]
    with pytest.raises(Exception, match="no checkpoint"):
        service.create_training_client_from_state(state_path).result()


def test_unload_frees_the_adapter_and_later_calls_are_refused(server) -> None:
    keep, gone = _new_model(server.url, seed=1), _new_model(server.url, seed=2)
    _result(server.url, _post(server.url, "unload_model", json={"model_id": gone})["request_id"])
    refused = httpx.post(
        f"{server.url}/api/v1/get_info", json={"model_id": gone}, headers={"X-API-Key": API_KEY}, timeout=10
    )
    assert refused.status_code == 404 and "was unloaded" in refused.json()["detail"]
    assert _post(server.url, "get_info", json={"model_id": keep})["model_id"] == keep

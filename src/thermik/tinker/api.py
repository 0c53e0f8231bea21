"""What each Tinker endpoint does, on the SDK's own request types; app.py maps routes onto these methods.

Requests are validated with the `tinker` SDK's pydantic types (the schema the SDK publishes). Anything the server
cannot serve is refused with a `UserError` (HTTP 4xx) before it is queued, so a queued request fails only for a
server-side reason.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tinker import types

from thermik.tinker import wire
from thermik.tinker.losses import LossError, required_inputs
from thermik.tinker.service import Job, Service, UserError, ok


@dataclass(frozen=True)
class Served:
    """The one base model: the name clients use, its directory and its limits."""

    name: str
    directory: Path
    arch: str
    vocab_size: int
    max_len: int
    max_rank: int

    def accepts(self, base_model: str) -> bool:
        return base_model in (self.name, str(self.directory), self.directory.name) or (
            base_model.startswith("/") and Path(base_model).resolve() == self.directory
        )


def derived_model_id(session_id: str, model_seq_id: int) -> str:
    """The id the SDK itself derives for a session's n-th training client (create_training_client_from_state)."""
    return f"{session_id}:train:{model_seq_id}"


def train_key(model_id: str, seq_id: int | None) -> str | None:
    """Idempotency key of a training request: the SDK numbers each model's requests (seq_id) once, retries reuse it."""
    return None if seq_id is None else f"train:{model_id}:{seq_id}"


class TinkerAPI:
    def __init__(self, service: Service, served: Served) -> None:
        self.service, self.served = service, served
        self.store, self.trainer = service.store, service.trainer

    # ------------------------------------------------------------ sessions and models
    def create_session(self, req: types.CreateSessionRequest) -> dict[str, Any]:
        session_id = f"session-{uuid.uuid4().hex}"
        self.store.add_session(session_id)
        return {"type": "create_session", "session_id": session_id}

    def heartbeat(self, req: types.SessionHeartbeatRequest) -> dict[str, Any]:
        if not self.store.heartbeat(req.session_id):
            raise UserError(f"unknown session {req.session_id!r}", 404)
        return {"type": "session_heartbeat"}

    def check_base(self, base_model: str | None) -> None:
        if base_model is not None and not self.served.accepts(base_model):
            raise UserError(
                f"base model {base_model!r} is not served here; this server serves {self.served.name!r} "
                f"(also accepted: {str(self.served.directory)!r})"
            )

    def create_model(self, req: types.CreateModelRequest) -> dict[str, Any]:
        self.check_base(req.base_model)
        if req.lora_config is None:
            raise UserError("full fine-tuning is not supported: pass a lora_config (create_lora_training_client)")
        rank = req.lora_config.rank
        if not 1 <= rank <= self.served.max_rank:
            raise UserError(f"LoRA rank must be between 1 and {self.served.max_rank}, got {rank}")
        if req.optimizer_config.type != "adamw":
            raise UserError(f"optimizer {req.optimizer_config.type!r} is not supported; only adamw")
        model_id = derived_model_id(req.session_id, req.model_seq_id)
        lora = req.lora_config.model_dump()
        if lora["seed"] is None:
            lora["seed"] = int.from_bytes(hashlib.sha256(model_id.encode()).digest()[:4], "little") % 2**31

        def run() -> tuple[str, bytes]:
            self.trainer.create(model_id, lora)
            self.store.add_model(model_id, f"create_model:{model_id}", self.served.name, lora)
            return ok({"type": "create_model", "model_id": model_id})

        request_id, _ = self.service.submit(Job("", model_id, "create_model", run=run), f"create_model:{model_id}")
        return {"request_id": request_id, "model_id": model_id}

    def model(self, model_id: str) -> None:
        """Refuse a model id this process does not hold, saying why."""
        if model_id in self.trainer.adapters:
            return
        row = self.store.model(model_id)
        if row is None:
            raise UserError(f"unknown model_id {model_id!r}", 404)
        if row["boot"] == self.store.boot:
            raise UserError(f"model {model_id!r} was unloaded", 404)
        raise UserError(
            f"model {model_id!r} was created before this server restarted and its weights are gone; create a model "
            "and load_weights from its last checkpoint",
            410,
        )

    def get_info(self, req: types.GetInfoRequest) -> dict[str, Any]:
        self.model(req.model_id)
        lora = self.trainer.adapters[req.model_id].lora
        data = {"arch": self.served.arch, "model_name": self.served.name, "tokenizer_id": str(self.served.directory)}
        return {"type": "get_info", "model_data": data, "model_id": req.model_id, "is_lora": True,
                "lora_rank": lora["rank"], "model_name": self.served.name}  # fmt: skip

    def unload(self, req: types.UnloadModelRequest) -> dict[str, Any]:
        self.model(req.model_id)

        def run() -> tuple[str, bytes]:
            self.trainer.unload(req.model_id)
            return ok({"type": "unload_model", "model_id": req.model_id})

        request_id, _ = self.service.submit(Job("", req.model_id, "unload", run=run), f"unload:{req.model_id}")
        return {"request_id": request_id, "model_id": req.model_id}

    # ------------------------------------------------------------ training
    def forward_backward(self, body: bytes, encoding: str) -> dict[str, Any]:
        req = wire.parse_forward_backward(wire.decode_body(body, encoding))
        self.model(req.model_id)
        if not req.data:
            raise UserError("forward_backward needs at least one datum")
        try:
            needed = required_inputs(req.loss_fn)
        except LossError as e:
            raise UserError(str(e)) from e
        for i, datum in enumerate(req.data):
            self._check_datum(i, datum, needed)
        job = Job("", req.model_id, "fwdbwd", fwdbwd=req)
        request_id, _ = self.service.submit(job, train_key(req.model_id, req.seq_id))
        return {"request_id": request_id, "model_id": req.model_id}

    def _check_datum(self, i: int, datum: wire.Datum, needed: tuple[str, ...]) -> None:
        n = len(datum.tokens)
        if n == 0 or n > self.served.max_len:
            raise UserError(f"datum {i}: model_input has {n} tokens; need 1 to {self.served.max_len}")
        missing = [k for k in needed if k not in datum.inputs]
        if missing:
            raise UserError(f"datum {i}: loss_fn_inputs lacks {missing} (has {sorted(datum.inputs)})")
        for key, arr in datum.inputs.items():
            if arr.size != n:
                raise UserError(f"datum {i}: loss_fn_inputs[{key!r}] has {arr.size} values for {n} input tokens")
            if not np.all(np.isfinite(arr)):
                raise UserError(f"datum {i}: loss_fn_inputs[{key!r}] holds NaN or inf")
        for name, ids in (("model_input", datum.tokens), ("target_tokens", datum.inputs["target_tokens"])):
            if ids.min() < 0 or ids.max() >= self.served.vocab_size:
                raise UserError(f"datum {i}: {name} holds ids outside the vocabulary [0, {self.served.vocab_size})")

    def optim_step(self, req: types.OptimStepRequest) -> dict[str, Any]:
        self.model(req.model_id)
        if not isinstance(req.optim_params, types.AdamParams):
            raise UserError("only Adam parameters (adam_params) are supported")
        adam = req.optim_params.model_dump()
        if adam["learning_rate"] < 0 or not 0 <= adam["beta1"] < 1 or not 0 <= adam["beta2"] < 1:
            raise UserError(f"invalid Adam parameters {adam}")

        def run() -> tuple[str, bytes]:
            return ok({"metrics": self.trainer.optim_step(req.model_id, adam)})

        job = Job("", req.model_id, "optim", run=run)
        request_id, _ = self.service.submit(job, train_key(req.model_id, req.seq_id))
        return {"request_id": request_id, "model_id": req.model_id}

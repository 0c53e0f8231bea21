"""Checkpoints (save_weights, save_weights_for_sampler, load_weights, listing, deletion) and sampling endpoints.

Checkpoints live under `<state_dir>/checkpoints/<model id>/<kind>/<name>/` and are named by
`tinker://<model id>/(weights|sampler_weights)/<name>` paths, recorded in SQLite.
"""

from __future__ import annotations

import datetime
import json
import uuid
from pathlib import Path
from typing import Any

from tinker import types

from thermik.atomic import remove_dir
from thermik.tinker.api import TinkerAPI, derived_model_id, train_key
from thermik.tinker.sampler import SampleJob
from thermik.tinker.service import Job, UserError, ok
from thermik.tinker.wire import PROTO, WireError, parse_tinker_path, sample_response, tinker_path


class WeightsAPI:
    def __init__(self, api: TinkerAPI, checkpoint_root: Path) -> None:
        self.api, self.store, self.trainer, self.root = api, api.store, api.trainer, checkpoint_root

    def _submit(self, model_id: str, kind: str, seq_id: int | None, run: Any) -> dict[str, Any]:
        request_id, _ = self.api.service.submit(Job("", model_id, kind, run=run), train_key(model_id, seq_id))
        return {"request_id": request_id, "model_id": model_id}

    def _name(self, name: str | None, seq_id: int | None) -> str:
        name = name or f"step-{seq_id or 0:06d}-{uuid.uuid4().hex[:6]}"
        if "/" in name or name in (".", "..") or not name.strip():
            raise UserError(f"invalid checkpoint name {name!r}: a name holds no '/'")
        return name

    def save_weights(self, req: types.SaveWeightsRequest) -> dict[str, Any]:
        self.api.model(req.model_id)
        name = self._name(req.path, req.seq_id)
        path = tinker_path(req.model_id, "weights", name)
        if self.store.checkpoint_dir(path) is not None and not req.overwrite:
            raise UserError(f"checkpoint {path} exists; pass overwrite=True to replace it")

        def run() -> tuple[str, bytes]:
            directory = self.root / req.model_id / "weights" / name
            size = self.trainer.save_state(req.model_id, directory)
            self.store.add_checkpoint(path, req.model_id, "training", name, str(directory), size)
            return ok({"type": "save_weights", "path": path})

        return self._submit(req.model_id, "save", req.seq_id, run)

    def save_for_sampler(self, req: types.SaveWeightsForSamplerRequest) -> dict[str, Any]:
        self.api.model(req.model_id)
        ephemeral = req.path is None
        name = self._name(req.path, req.seq_id) if not ephemeral else f"ephemeral-{uuid.uuid4().hex[:12]}"
        path = tinker_path(req.model_id, "sampler_weights", name)

        def run() -> tuple[str, bytes]:
            directory = self.root / req.model_id / "sampler_weights" / name
            size = self.trainer.save_sampler(req.model_id, directory)
            self.store.add_checkpoint(path, req.model_id, "sampler", name, str(directory), size)
            if not ephemeral:
                return ok({"type": "save_weights_for_sampler", "path": path})
            sid = self.store.add_sampling_session(f"sampling-{uuid.uuid4().hex}", path, path, self.api.served.name)
            return ok({"type": "save_weights_for_sampler", "sampling_session_id": sid})

        return self._submit(req.model_id, "save_sampler", req.seq_id, run)

    def resolve(self, path: str, kind: str) -> Path:
        """The directory of checkpoint `path`, which must be of `kind` (weights | sampler_weights)."""
        try:
            _, have, _ = parse_tinker_path(path)
        except WireError as e:
            raise UserError(str(e)) from e
        directory = self.store.checkpoint_dir(path)
        if have != kind:
            raise UserError(f"{path} is a {have} checkpoint; this call needs a {kind} one")
        if directory is None or not Path(directory).is_dir():
            raise UserError(f"no checkpoint {path} on this server", 404)
        return Path(directory)

    def load_weights(self, req: types.LoadWeightsRequest) -> dict[str, Any]:
        directory = self.resolve(req.path, "weights")
        if req.model_id is None:
            return self._create_from_state(req, directory)
        self.api.model(req.model_id)

        def run() -> tuple[str, bytes]:
            self.trainer.load_state(req.model_id, directory, req.optimizer)
            return ok({"type": "load_weights", "path": req.path, "model_id": req.model_id})

        return self._submit(req.model_id, "load", req.seq_id, run)

    def _create_from_state(self, req: types.LoadWeightsRequest, directory: Path) -> dict[str, Any]:
        """A new model with the checkpoint's LoRA config and weights (`create_training_client_from_state`)."""
        if req.session_id is None or req.model_seq_id is None:
            raise UserError("load_weights needs model_id, or session_id and model_seq_id to create a model")
        self.api.check_base(req.base_model)
        model_id = derived_model_id(req.session_id, req.model_seq_id)
        lora = json.loads((directory / "lora.json").read_text())

        def run() -> tuple[str, bytes]:
            self.trainer.create(model_id, lora)
            self.trainer.load_state(model_id, directory, req.optimizer)
            self.store.add_model(model_id, f"create_model:{model_id}", self.api.served.name, lora)
            return ok({"type": "load_weights", "path": req.path, "model_id": model_id})

        request_id, _ = self.api.service.submit(Job("", model_id, "load", run=run), f"create_model:{model_id}")
        return {"request_id": request_id, "model_id": model_id}

    def list_checkpoints(self, model_id: str) -> dict[str, Any]:
        if self.store.model(model_id) is None:
            raise UserError(f"unknown training run {model_id!r}", 404)
        checkpoints = [
            {"checkpoint_id": f"{'weights' if c['kind'] == 'training' else 'sampler_weights'}/{c['name']}",
             "checkpoint_type": c["kind"], "tinker_path": c["tinker_path"], "size_bytes": c["size_bytes"],
             "time": datetime.datetime.fromtimestamp(c["created"], datetime.UTC).isoformat()}
            for c in self.store.checkpoints(model_id)
        ]  # fmt: skip
        return {"checkpoints": checkpoints}

    def training_run(self, model_id: str) -> dict[str, Any]:
        row = self.store.model(model_id)
        if row is None:
            raise UserError(f"unknown training run {model_id!r}", 404)
        now = datetime.datetime.now(datetime.UTC).isoformat()
        return {"training_run_id": model_id, "base_model": row["base_model"], "model_owner": "local", "is_lora": True,
                "corrupted": model_id not in self.trainer.adapters, "lora_rank": row["lora"]["rank"],
                "last_request_time": now}  # fmt: skip

    def sampler(self, sampler_id: str) -> dict[str, Any]:
        found = self.store.sampling_session(sampler_id)
        if found is None:
            raise UserError(f"unknown sampler {sampler_id!r}", 404)
        return {"sampler_id": sampler_id, "base_model": found[1], "model_path": found[0]}

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> dict[str, Any]:
        path = f"tinker://{model_id}/{checkpoint_id}"
        directory = self.store.checkpoint_dir(path)
        if directory is None:
            raise UserError(f"no checkpoint {path} on this server", 404)
        self.store.delete_checkpoint(path)
        remove_dir(Path(directory))
        return {}

    # ------------------------------------------------------------ sampling
    def create_sampling_session(self, req: types.CreateSamplingSessionRequest) -> dict[str, Any]:
        if req.model_path is not None:
            self.resolve(req.model_path, "sampler_weights")
        else:
            if req.base_model is None:
                raise UserError("create_sampling_session needs model_path or base_model")
            self.api.check_base(req.base_model)
        key = f"sampling:{req.session_id}:{req.sampling_session_seq_id}"
        sid = self.store.add_sampling_session(f"sampling-{uuid.uuid4().hex}", key, req.model_path, self.api.served.name)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    def asample(self, req: types.SampleRequest) -> dict[str, Any]:
        model_path = self._sampling_target(req)
        weights = None if model_path is None else str(self.resolve(model_path, "sampler_weights"))
        prompt = req.prompt.to_ints()
        served = self.api.served
        if not 0 < len(prompt) < served.max_len or min(prompt) < 0 or max(prompt) >= served.vocab_size:
            raise UserError(f"the prompt needs 1 to {served.max_len - 1} tokens with ids in [0, {served.vocab_size})")
        if not 1 <= req.num_samples <= 1024:
            raise UserError(f"num_samples must be between 1 and 1024, got {req.num_samples}")
        self._check_sampling_options(req, len(prompt))
        params = req.sampling_params.model_dump()
        job = SampleJob(prompt, req.num_samples, params, bool(req.prompt_logprobs), req.prompt_logprobs_last_n)

        async def work() -> tuple[str, bytes]:
            sequences, prompt_lp = await self.api.service.samplers.sample(weights, job)
            return PROTO, sample_response(sequences, prompt_lp)

        key = (
            None
            if req.sampling_session_id is None or req.seq_id is None
            else f"sample:{req.sampling_session_id}:{req.seq_id}"
        )
        request_id = self.api.service.submit_async("sample", key, {}, work)
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}/{i}" for i in range(req.num_samples)]}

    @staticmethod
    def _check_sampling_options(req: types.SampleRequest, prompt_len: int) -> None:
        unsupported = {
            "topk_prompt_logprobs": req.topk_prompt_logprobs, "topk_sample_logprobs": req.topk_sample_logprobs,
            "prompt_alt_tokens_k": req.prompt_alt_tokens_k, "target_prompt_logprobs": req.target_prompt_logprobs,
        }  # fmt: skip
        asked = sorted(k for k, v in unsupported.items() if v)
        if asked:
            raise UserError(f"this server does not support {asked} in sampling yet")
        last_n = req.prompt_logprobs_last_n
        if last_n is not None and (not req.prompt_logprobs or not 1 <= last_n <= prompt_len - 1):
            raise UserError(
                f"prompt_logprobs_last_n needs prompt_logprobs and 1 <= n <= {prompt_len - 1}; got {last_n}"
            )

    def _sampling_target(self, req: types.SampleRequest) -> str | None:
        if req.sampling_session_id is not None:
            found = self.store.sampling_session(req.sampling_session_id)
            if found is None:
                raise UserError(f"unknown sampling session {req.sampling_session_id!r}", 404)
            return found[0]
        if req.model_path is None:
            if req.base_model is None:
                raise UserError("asample needs a sampling_session_id, a model_path or a base_model")
            self.api.check_base(req.base_model)
        return req.model_path

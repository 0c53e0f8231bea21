"""`thermik tinker`: the FastAPI app (every route a tinker 0.38 client calls, under /api/v1) and its server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pydantic
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from tinker import types

from thermik.models.loading import MAKE_A_MODEL, ModelPathError
from thermik.tinker.api import TinkerAPI
from thermik.tinker.api_weights import WeightsAPI
from thermik.tinker.service import JSON, UserError
from thermik.tinker.wire import WireError

CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,  # plain API keys; no JWT exchange
    "proto_compress_fwdbwd": True,  # the SDK zstd-compresses forward_backward bodies
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


def _handle(call: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
    """Run an endpoint; a refused request becomes a 4xx with a message (FastAPI's {'detail': ...} shape)."""

    async def endpoint(request: Request) -> Response:
        try:
            result = await call(request)
        except UserError as e:
            return JSONResponse({"detail": str(e)}, status_code=e.status)
        except (WireError, pydantic.ValidationError, ValueError) as e:
            return JSONResponse({"detail": f"bad request: {e}"}, status_code=400)
        return result if isinstance(result, Response) else JSONResponse(result)

    return endpoint


def _json(model: type[pydantic.BaseModel], method: Callable[[Any], Any]) -> Callable[[Request], Awaitable[Any]]:
    """An endpoint that validates its JSON body with the SDK's request type `model`, then calls `method`."""

    async def call(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError as e:
            raise UserError(f"the body is not JSON: {e}") from e
        return method(model.model_validate(body))

    return call


def _retrieve(api: TinkerAPI, poll_s: float) -> Callable[[Request], Awaitable[Any]]:
    async def call(request: Request) -> Any:
        req = types.FutureRetrieveRequest.model_validate(await request.json())
        row = await api.service.wait(req.request_id, poll_s)
        if row is None:
            raise UserError(f"unknown request_id {req.request_id!r}", 404)
        if row.status == "pending":
            return {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
        return Response(content=row.payload or b"", media_type=row.content_type or JSON)

    return call


def _auth(api_key: str) -> Callable[[Request, Callable], Awaitable[Response]]:
    async def check(request: Request, call_next: Callable) -> Response:
        open_paths = ("/api/v1/healthz", "/api/v1/client/config")
        if api_key and request.url.path not in open_paths and request.headers.get("x-api-key") != api_key:
            return JSONResponse({"detail": "missing or wrong API key (X-API-Key / TINKER_API_KEY)"}, status_code=401)
        return await call_next(request)

    return check


def build_app(api: TinkerAPI, weights: WeightsAPI, api_key: str = "", poll_s: float = 20.0) -> FastAPI:
    app = FastAPI(title="thermik tinker")
    app.middleware("http")(_auth(api_key))
    served = api.served

    async def constant(value: dict[str, Any]) -> Any:
        return value

    def get(path: str, value: dict[str, Any]) -> None:
        app.add_api_route(f"/api/v1/{path}", _handle(lambda _r: constant(value)), methods=["GET", "POST"])

    model = {"model_name": served.name, "max_context_length": served.max_len, "trainable": True, "sampleable": True}
    capabilities = {"supported_models": [model]}
    get("healthz", {"status": "ok"})
    get("get_server_capabilities", capabilities)
    get("client/config", CLIENT_CONFIG)
    get("client/dynamic_config", {"sample_cancel_enabled": False})
    get("telemetry", {"status": "accepted"})
    get("cancel_future", {})
    routes: dict[str, tuple[type[pydantic.BaseModel], Callable[[Any], Any]]] = {
        "create_session": (types.CreateSessionRequest, api.create_session),
        "session_heartbeat": (types.SessionHeartbeatRequest, api.heartbeat),
        "create_model": (types.CreateModelRequest, api.create_model),
        "get_info": (types.GetInfoRequest, api.get_info),
        "unload_model": (types.UnloadModelRequest, api.unload),
        "optim_step": (types.OptimStepRequest, api.optim_step),
        "save_weights": (types.SaveWeightsRequest, weights.save_weights),
        "save_weights_for_sampler": (types.SaveWeightsForSamplerRequest, weights.save_for_sampler),
        "load_weights": (types.LoadWeightsRequest, weights.load_weights),
        "create_sampling_session": (types.CreateSamplingSessionRequest, weights.create_sampling_session),
        "asample": (types.SampleRequest, weights.asample),
    }
    for path, (model, method) in routes.items():
        app.add_api_route(f"/api/v1/{path}", _handle(_json(model, method)), methods=["POST"])
    _add_special_routes(app, api, weights, poll_s)
    return app


def _add_special_routes(app: FastAPI, api: TinkerAPI, weights: WeightsAPI, poll_s: float) -> None:
    async def forward_backward(request: Request) -> Any:
        body = await request.body()
        return await asyncio.to_thread(api.forward_backward, body, request.headers.get("content-encoding", ""))

    async def checkpoints(request: Request) -> Any:
        return weights.list_checkpoints(request.path_params["model_id"])

    async def delete(request: Request) -> Any:
        return weights.delete_checkpoint(request.path_params["model_id"], request.path_params["checkpoint_id"])

    async def training_run(request: Request) -> Any:
        return weights.training_run(request.path_params["model_id"])

    async def sampler(request: Request) -> Any:
        return weights.sampler(request.path_params["sampler_id"])

    app.add_api_route("/api/v1/forward_backward", _handle(forward_backward), methods=["POST"])
    app.add_api_route("/api/v1/training_runs/{model_id}", _handle(training_run), methods=["GET"])
    app.add_api_route("/api/v1/samplers/{sampler_id}", _handle(sampler), methods=["GET"])
    app.add_api_route("/api/v1/retrieve_future", _handle(_retrieve(api, poll_s)), methods=["POST"])
    app.add_api_route("/api/v1/training_runs/{model_id}/checkpoints", _handle(checkpoints), methods=["GET"])
    app.add_api_route(
        "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}", _handle(delete), methods=["DELETE"]
    )


def model_directory(path: str) -> Path:
    directory = Path(path).resolve()
    if not (directory / "config.json").is_file():
        raise ModelPathError(f"--model.path {path} is not a local Hugging Face model directory (no config.json)",
                             hint=MAKE_A_MODEL)  # fmt: skip
    return directory

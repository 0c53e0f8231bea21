"""The remote backend: InferenceEngine over any OpenAI-compatible server, driven by token ids.

Each `generate` is one `/v1/completions` request whose prompt is the token ids, asking for the sampled
token ids back (`return_token_ids`, vLLM's name; thermik's server answers the same) and one logprob per
token, so nothing is re-tokenized (docs/architecture.md, invariant 1). A request carrying a session id sends it
as the extra field `session_id` to thermik's server (which keeps the episode's cached prefix between turns); other
servers do not get it unless asked (`send_session_ids`). Weight updates write the state dict as safetensors
into a directory the server can read and POST its path to `/update_weights` (thermik's server), or, to a vLLM
server started with VLLM_SERVER_DEV_MODE=1 and thermik's worker extension, ask its workers to reload from that
directory through `/collective_rpc` (`thermik_reload`, see vllm_worker.py) and reset its prefix cache.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from thermik.inference.base import Generation, SamplingParams, StopReason, WeightSource, next_version
from thermik.inference.keepalive_http import KeepAliveClient
from thermik.inference.vllm_worker import RELOAD_METHOD, WORKER_EXTENSION
from thermik.inference.weights import save_state_dict

_FINISH: dict[str | None, StopReason] = {"stop": "stop", "length": "length", "abort": "abort"}
TOKEN_ID_PREFIX = "token_id:"
# A pooled keep-alive connection can be closed by the server just as a request goes out on it (uvicorn closes
# idle connections after 5 s; an RL step's training phase is longer). Such a request did not reach the handler,
# so it is sent again on a fresh connection; other transport errors (timeouts) are not retried.
_RETRIED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
ATTEMPTS = 4
THERMIK_OWNER = "thermik"  # `owned_by` of thermik's /v1/models cards: the server understands `session_id`
VLLM_OWNER = "vllm"  # `owned_by` of vLLM's cards: weights are reloaded through its dev-mode /collective_rpc
KEEPALIVE_EXPIRY_S = 2.0  # below uvicorn's 5 s keep-alive timeout, so the client drops idle connections first


class RemoteError(RuntimeError):
    """The server answered with an error; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"inference server answered {status}: {message}")
        self.status = status


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise RemoteError(200, f"expected logprob tokens as 'token_id:N' (return_tokens_as_token_ids), got {token!r}")
    return int(token[len(TOKEN_ID_PREFIX) :])


def generation_from_choice(choice: dict[str, Any], fallback_version: int, top: int | None = None) -> Generation:
    """A Generation from one `/v1/completions` choice holding token ids and per-token logprobs. With `top` given,
    top_logprobs keep that many most likely ids per position (None for 0): vLLM's also hold the sampled token."""
    lp = choice.get("logprobs") or {}
    logprobs = [float(x) for x in lp.get("token_logprobs") or []]
    ids = choice.get("token_ids")
    if ids is None:  # servers without return_token_ids but with return_tokens_as_token_ids
        ids = [_token_id(t) for t in lp.get("tokens") or []]
    if len(ids) != len(logprobs):
        raise RemoteError(200, f"the server returned {len(ids)} token ids but {len(logprobs)} logprobs")
    tops = lp.get("top_logprobs")
    top_logprobs = None
    if tops and any(tops) and top != 0:
        top_logprobs = [{_token_id(t): float(v) for t, v in (d or {}).items()} for d in tops]
        if top is not None:
            top_logprobs = [dict(sorted(d.items(), key=lambda kv: -kv[1])[:top]) for d in top_logprobs]
    version = int(choice.get("weight_version", fallback_version))
    per_token = choice.get("weight_versions")  # thermik's server: one per token (in-flight weight updates)
    versions = [int(v) for v in per_token] if per_token and len(per_token) == len(ids) else [version] * len(ids)
    return Generation(
        token_ids=[int(t) for t in ids],
        logprobs=logprobs,
        stop_reason=_FINISH.get(choice.get("finish_reason"), "stop"),
        weight_version=version,
        weight_versions=versions,
        top_logprobs=top_logprobs,
    )


class RemoteEngine:
    """InferenceEngine backed by an OpenAI-compatible server (thermik inference, vLLM)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        weights_dir: str | Path | None = None,
        stop_token_ids: Sequence[int] = (),
        timeout_s: float = 600.0,
        max_connections: int = 512,
        send_session_ids: bool | None = None,
    ) -> None:
        """`send_session_ids`: forward `generate`'s session id as the body field `session_id`; None sends it only
        when the server is thermik's own (its /v1/models cards are owned by "thermik"), since other servers may
        refuse or warn about unknown fields."""
        self.base_url = base_url.rstrip("/")
        self.send_session_ids = send_session_ids
        self.model = model or None
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s, self._max_connections = timeout_s, max_connections
        self._own_weights_dir = not weights_dir
        self.weights_dir = Path(weights_dir) if weights_dir else Path(tempfile.mkdtemp(prefix="thermik-weights-"))
        self._client: KeepAliveClient | httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._version = 0
        self._pushed: Path | None = None
        self._owner: str | None = None

    @property
    def weight_version(self) -> int:
        return self._version

    def _http(self) -> KeepAliveClient | httpx.AsyncClient:
        """One client per event loop: pooled connections belong to the loop that opened them. An http:// server
        gets the lean keep-alive client (keepalive_http.py: a fraction of httpx's CPU per request), https httpx."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            connect_s = min(self._timeout_s, 30.0)
            if self.base_url.startswith("http://"):
                self._client = KeepAliveClient(
                    self.base_url, headers=self._headers, timeout_s=self._timeout_s, connect_timeout_s=connect_s,
                    max_connections=self._max_connections, keepalive_expiry_s=KEEPALIVE_EXPIRY_S,
                )  # fmt: skip
            else:
                limits = httpx.Limits(max_connections=self._max_connections,
                                      max_keepalive_connections=self._max_connections,
                                      keepalive_expiry=KEEPALIVE_EXPIRY_S)  # fmt: skip
                self._client = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, limits=limits,
                                                 timeout=httpx.Timeout(self._timeout_s, connect=connect_s))  # fmt: skip
            self._client_loop = loop
        return self._client

    async def _request(self, method: str, path: str, json: dict[str, Any] | None = None) -> dict[str, Any]:
        for attempt in range(ATTEMPTS):
            try:
                resp = await self._http().request(method, path, json=json)
                break
            except _RETRIED as exc:
                if attempt == ATTEMPTS - 1:
                    raise ConnectionError(
                        f"cannot reach the inference server at {self.base_url}{path} after {ATTEMPTS} attempts: "
                        f"{type(exc).__name__} {exc}"
                    ) from exc
                await asyncio.sleep(0.05 * 2**attempt)
            except httpx.HTTPError as exc:
                raise ConnectionError(
                    f"inference server request {self.base_url}{path} failed: {type(exc).__name__} {exc}"
                ) from exc
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:500]
            if 400 <= resp.status_code < 500:
                raise ValueError(f"inference server refused {path} ({resp.status_code}): {message}")
            raise RemoteError(resp.status_code, message)
        return resp.json()

    async def model_name(self) -> str:
        """The configured model name, or the first one the server lists."""
        if self.model is None:
            models = (await self._request("GET", "/v1/models"))["data"]
            if not models:
                raise RemoteError(200, "the server lists no models")
            self.model = str(models[0]["id"])
        return self.model

    async def server_owner(self) -> str:
        """`owned_by` of the server's first /v1/models card: which server this is ("thermik", "vllm", ...)."""
        if self._owner is None:
            cards = (await self._request("GET", "/v1/models")).get("data") or []
            self._owner = str(cards[0].get("owned_by", "")) if cards else ""
        return self._owner

    async def _sends_session_ids(self) -> bool:
        if self.send_session_ids is None:
            self.send_session_ids = await self.server_owner() == THERMIK_OWNER
        return self.send_session_ids

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None = None
    ) -> Generation:
        """One completion by token ids; `session_id` goes to servers that use it (see `send_session_ids`)."""
        body: dict[str, Any] = {
            "model": await self.model_name(),
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "min_p": sampling.min_p,
            "stop_token_ids": sorted(set(self.stop_token_ids) | set(sampling.stop_token_ids)),
            "logprobs": sampling.top_logprobs,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if session_id is not None and await self._sends_session_ids():
            body["session_id"] = session_id
        response = await self._request("POST", "/v1/completions", body)
        return generation_from_choice(response["choices"][0], self._version, sampling.top_logprobs)

    async def update_weights(self, source: WeightSource, version: int | None = None) -> int:
        """Write a state dict under weights_dir (or send a directory as is) and have the server load it (as
        `version`, when given)."""
        if isinstance(source, dict):
            target = self.weights_dir / f"v{self._version + 1:06d}"
            path = await asyncio.to_thread(save_state_dict, source, target)
        else:
            path = Path(source)
        if await self.server_owner() == VLLM_OWNER:
            await self._vllm_reload(path.resolve())
            self._version = next_version(self._version, version)
        else:
            body: dict[str, Any] = {"path": str(path.resolve())}
            if version is not None:
                body["version"] = version
            response = await self._request("POST", "/update_weights", body)
            self._version = int(response.get("weight_version", next_version(self._version, version)))
        if isinstance(source, dict):
            if self._pushed is not None and self._pushed != path:
                shutil.rmtree(self._pushed, ignore_errors=True)  # the server holds the weights now
            self._pushed = path
        return self._version

    async def _vllm_reload(self, path: Path) -> None:
        """vLLM: every worker reloads the weights in place from `path`, then cached prefixes of the old weights are
        dropped. Requests running meanwhile continue on the new weights (their tokens get the new version)."""
        try:
            await self._request(
                "POST", "/collective_rpc", {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(path)}}
            )
        except (ValueError, RemoteError) as exc:
            raise ValueError(
                f"{exc}. Weight updates on a vLLM server need its dev-mode routes and thermik's worker extension: "
                f"start it with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls {WORKER_EXTENSION}, with thermik "
                "importable there (e.g. PYTHONPATH=<thermik>/src); see docs/inference.md"
            ) from exc
        await self._request("POST", "/reset_prefix_cache")

    async def weight_checksums(self) -> dict[str, tuple[str, int]] | None:
        """{name: (dtype, exact checksum)} of the weights the server holds (thermik's server), or None where the
        server cannot report them (vLLM, an engine without readable weights)."""
        if await self.server_owner() != THERMIK_OWNER:
            return None
        try:
            reply = await self._request("GET", "/weight_checksums")
        except ValueError:  # 404: its engine's weights are not readable
            return None
        return {name: (dtype, int(value)) for name, (dtype, value) in reply["checksums"].items()}

    async def refresh_version(self) -> int:
        """Read the server's current weight version."""
        self._version = int((await self._request("GET", "/weight_version"))["weight_version"])
        return self._version

    async def close(self) -> None:
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None
        if self._own_weights_dir:
            shutil.rmtree(self.weights_dir, ignore_errors=True)

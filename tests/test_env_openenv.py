"""OpenEnv environments in-process (`openenv:pkg.mod:Class`) and over the WebSocket of a real `create_fastapi_app`
server on loopback (`openenv+ws://host:port`, and `openenv+wss://` behind TLS): episodes, envs declared without
generic parameters (the action type from step()'s annotation, the app's /schema, env.openenv.action_class), refused
actions, a server gone mid-episode, a server not running, a missing package; then `thermik eval` and 3 `thermik rl`
steps on each."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import cli_env
from env_sources import eval_then_rl
from tinker_support import free_port
from tls_support import make_certificates

from thermik.config.schema import EnvConfig, OpenEnvConfig
from thermik.envs.openenv_env import ActionRefused, parse_action
from thermik.errors import ThermikError
from thermik.tasks.registry import generate_rows, make_env

pytest.importorskip("openenv.core")

TESTS = Path(__file__).resolve().parent
IN_PROCESS = "openenv:openenv_guess:GuessEnv"
PROMPT = [{"role": "system", "content": "Guess."}]
sys.path.insert(0, str(TESTS))  # openenv_guess, as a user's package


def _start(
    log: Path, app: str = "openenv_guess:app", tls: tuple[Path, Path, Path] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """OpenEnv's app `app` under uvicorn on 127.0.0.1 (with TLS: (ca, certificate, key)); waits for /health."""
    port = free_port()
    env = cli_env(PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port)]
    cmd += [] if tls is None else ["--ssl-certfile", str(tls[1]), "--ssl-keyfile", str(tls[2])]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    scheme, verify = ("http", True) if tls is None else ("https", ssl.create_default_context(cafile=tls[0]))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{scheme}://127.0.0.1:{port}/health", timeout=2, verify=verify).status_code == 200:
                return proc, f"openenv+{'ws' if tls is None else 'wss'}://127.0.0.1:{port}"
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the OpenEnv server did not start:\n{log.read_text(errors='replace')}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, name = _start(tmp_path_factory.mktemp("openenv") / "server.log")
    yield name
    _stop(proc)


def _env(name: str, seed: int = 3, **openenv: str):
    options = EnvConfig(name=name, openenv=OpenEnvConfig(**openenv))
    return make_env(name, reward_spec={}, extra_info={"reset": {"seed": seed}}, options=options)


async def _binary_search(name: str, **openenv: str) -> tuple[list[str], float]:
    """Plays an episode by bisection; returns the observations' contents and the final reward."""
    env = _env(name, **openenv)
    messages, _ = await env.ainit(PROMPT)
    seen, low, high = [messages[-1]["content"]], 1, 8
    try:
        for _ in range(4):
            guess = (low + high) // 2
            out = await env.astep(str(guess))
            if out.done:
                return seen, out.reward
            seen.append(out.observations[0]["content"])
            low, high = (guess + 1, high) if "higher" in seen[-1] else (low, guess - 1)
    finally:
        await env.aclose()
    return seen, 0.0


@pytest.mark.parametrize("where", ["in_process", "remote"])
def test_an_episode_plays_to_the_reward(where: str, request: pytest.FixtureRequest) -> None:
    name = IN_PROCESS if where == "in_process" else request.getfixturevalue("server")
    seen, reward = asyncio.run(_binary_search(name))
    assert reward == 1.0
    assert seen[0] == '{"feedback": "Guess a number from 1 to 8."}'
    assert all(("higher" in s) or ("lower" in s) for s in seen[1:])


def _assert_won(name: str, **openenv: str) -> None:
    seen, reward = asyncio.run(_binary_search(name, **openenv))
    assert reward == 1.0 and seen[0] == '{"feedback": "Guess a number from 1 to 8."}'


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, name = _start(tmp_path_factory.mktemp("openenv") / "server.log", "openenv_guess:plain_app")
    yield name
    _stop(proc)


@pytest.mark.parametrize("where", ["in_process", "remote"])
def test_an_env_declared_as_openenvs_examples_do_plays_in_process_and_over_the_websocket(
    where: str, request: pytest.FixtureRequest
) -> None:
    """`class PlainGuessEnv(Environment)`, no generic parameters, the action type in step()'s string annotation."""
    _assert_won(
        "openenv:openenv_guess:PlainGuessEnv" if where == "in_process" else request.getfixturevalue("plain_server")
    )


def test_the_action_type_of_an_env_whose_step_takes_any_action_comes_from_its_apps_schema() -> None:
    """OpenEnv's layout: `environment.py` with step(self, action: Action), `app.py` beside it naming GuessAction."""
    _assert_won("openenv:guess_served.environment:ServedGuessEnv")


def test_an_env_that_names_no_action_type_runs_with_the_setting_and_is_refused_without() -> None:
    name = "openenv:openenv_untyped:UntypedGuessEnv"
    with pytest.raises(ThermikError, match=r"cannot tell UntypedGuessEnv's action type.*--env.openenv.action_class"):
        _env(name)
    _assert_won(name, action_class="openenv_guess:GuessAction")
    with pytest.raises(ThermikError, match=r"action_class = 'openenv_guess:GuessObservation' is not a subclass"):
        _env(name, action_class="openenv_guess:GuessObservation")
    with pytest.raises(ThermikError, match=r"cannot import it"):
        _env(name, action_class="openenv_guess:Nope")
    # a setting that contradicts what the env declares is refused, never silently ignored
    with pytest.raises(ThermikError, match=r"PlainGuessEnv names openenv_guess.GuessAction \(the annotation of its"):
        _env("openenv:openenv_guess:PlainGuessEnv", action_class="openenv.core.env_server.types:Action")


def test_a_server_without_a_schema_needs_the_setting(tmp_path: Path) -> None:
    proc, name = _start(tmp_path / "server.log", "openenv_untyped:schemaless_app")
    try:
        with pytest.raises(ThermikError, match=r"serves no action schema at /schema.*--env.openenv.action_class"):
            _env(name)
        _assert_won(name, action_class="openenv_guess:GuessAction")
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("openenv_tls")
    certificates = make_certificates(folder)
    proc, name = _start(folder / "server.log", "openenv_guess:plain_app", tls=certificates)
    yield name, certificates[0]
    _stop(proc)


def test_wss_checks_the_servers_certificate_against_ca_file_or_ssl_cert_file(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, ca = tls_server
    assert name.startswith("openenv+wss://")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(ThermikError, match=r"no OpenEnv server answers at https://127.0.0.1.*CERTIFICATE.*ca_file"):
        _env(name)  # a certificate nobody said to trust
    _assert_won(name, ca_file=str(ca))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    _assert_won(name)


@pytest.mark.parametrize("where", ["in_process", "remote"])
def test_a_refused_action_is_an_error_observation_and_the_episode_goes_on(
    where: str, request: pytest.FixtureRequest
) -> None:
    name = IN_PROCESS if where == "in_process" else request.getfixturevalue("server")

    async def play() -> list:
        env = _env(name)
        await env.ainit(PROMPT)
        try:
            return [await env.astep("seven"), await env.astep('{"guess": "x"}'), await env.astep("4")]
        finally:
            await env.aclose()

    bad_json, bad_value, fine = asyncio.run(play())
    assert not bad_json.done and bad_json.observations[0]["content"].startswith("error: field 'guess' needs a JSON")
    assert not bad_value.done and bad_value.observations[0]["content"].startswith("error: ")
    assert fine.reward in (0.0, 1.0) and "action_error" not in fine.metadata


def test_json_actions_when_the_schema_has_several_required_fields() -> None:
    schema = {"properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    cfg = OpenEnvConfig()
    assert parse_action('I pick {"a": "x", "b": 2} now', schema, cfg) == {"a": "x", "b": 2}
    with pytest.raises(ActionRefused, match=r"JSON object \(fields: a, b\)"):
        parse_action("x and 2", schema, cfg)
    assert parse_action("x", schema, OpenEnvConfig(action_field="a")) == {"a": "x"}


def test_a_server_gone_mid_episode_fails_the_episode(tmp_path: Path) -> None:
    proc, name = _start(tmp_path / "server.log")

    async def play() -> list:
        env = _env(name)
        await env.ainit(PROMPT)
        first = await env.astep("1")
        _stop(proc)
        gone = await env.astep("2")
        after = await env.astep("3")
        await env.aclose()
        fresh = _env(name)  # a new episode: the reset fails, its first step ends it
        messages, _ = await fresh.ainit(PROMPT)
        return [first, gone, after, messages, await fresh.astep("4")]

    try:
        first, gone, after, messages, fresh = asyncio.run(play())
    finally:
        _stop(proc)
    assert not first.done or first.reward == 1.0
    assert gone.done and gone.reward == 0.0 and name.removeprefix("openenv+") in gone.metadata["env_error"]
    assert after.done and after.reward == 0.0
    assert messages[-1]["content"].startswith("error: ") and fresh.done and fresh.reward == 0.0


def test_a_server_not_running_names_the_url_and_how_to_start_it() -> None:
    port = free_port()
    with pytest.raises(ValueError, match=rf"no OpenEnv server answers at http://127.0.0.1:{port}.*uvicorn .*--port"):
        _env(f"openenv+ws://127.0.0.1:{port}")


def test_bad_names_and_missing_packages_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"cannot import 'Nope' from 'openenv_guess'"):
        _env("openenv:openenv_guess:Nope")
    with pytest.raises(ValueError, match=r"not a subclass of openenv's Environment"):
        _env("openenv:openenv_guess:GuessAction")
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", None)
    with pytest.raises(ValueError, match=r"pip install 'thermik\[openenv\]'"):
        _env("openenv:openenv_guess:OtherEnv")


def test_rows_are_one_reset_seed_each_and_the_splits_never_share_one() -> None:
    train = generate_rows(IN_PROCESS, 50, 0, "train")
    held_out = generate_rows(IN_PROCESS, 50, 0, "eval")
    seeds = [r["extra_info"]["reset"]["seed"] for r in train], [r["extra_info"]["reset"]["seed"] for r in held_out]
    assert len(set(seeds[0])) == 50 and not set(seeds[0]) & set(seeds[1])
    assert train[0]["env_class"] == IN_PROCESS and train[0]["prompt"][0]["role"] == "system"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["in_process", "remote"])
def test_eval_and_rl_run_on_an_openenv_environment(
    where: str, request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path: Path
) -> None:
    name = IN_PROCESS if where == "in_process" else request.getfixturevalue("server")
    eval_then_rl(
        tmp_path, tiny_model_dir, "--env.name", name, "--data.synthetic_train_size", "8",
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )  # fmt: skip

"""Every command over a table of bad inputs, as real `thermik` subprocesses: a non-zero exit, one line on stderr
naming the problem (`thermik <cmd>: ...`), no traceback (docs/reliability.md, "Errors are one line").

A row of CASES is one line: an id, the command line (`{name}` fields are the paths of the `inputs` fixture,
split with shlex) and the fragments the last stderr line must hold; optionally a `setup` run before the command and a
`check` run after it (both given the inputs). Every row fails before heavy work. The rows run concurrently, once
per module (`results`): each pays for its own interpreter and imports, which dominate.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import run_thermik

from thermik import cli
from thermik.errors import ThermikError
from thermik.rollout.step_wise import PrefixBreakError


class Case(NamedTuple):
    id: str
    argv: str
    expect: tuple[str, ...]
    root_skips: bool = False  # root writes through file modes: a read-only directory is not read-only to it
    setup: Callable[[dict[str, str]], None] | None = None
    check: Callable[[dict[str, str]], None] | None = None


def _saved_run(inputs: dict[str, str]) -> None:
    """A run directory whose checkpoint was made with trainer.group_size 2 (the resume rows start it with 4)."""
    from thermik.config import dump_toml, load_config
    from thermik.config.schema import RunConfig

    argv = ["--model.path", inputs["tiny"], "--output_dir", f"{inputs['tmp']}/resumed", "--name", "r"]
    cfg = load_config(RunConfig, [*argv, "--trainer.group_size", "2"])
    (cfg.run_dir / "checkpoints" / "step_3").mkdir(parents=True)
    (cfg.run_dir / "config.toml").write_text(dump_toml(cfg))
    inputs["resumed_config"] = (cfg.run_dir / "config.toml").read_text()


def _config_kept(inputs: dict[str, str]) -> None:
    assert (Path(inputs["tmp"]) / "resumed" / "r" / "config.toml").read_text() == inputs["resumed_config"]


NOT_A_MODEL = ("does not exist", "thermik model init", "thermik model import")
NOT_WRITABLE = ("is not a writable directory",)
CASES = [
    # bad paths
    Case("rl-model-missing", "rl --model.path {tmp}/nope", NOT_A_MODEL),
    Case("rl-model-empty", "rl --model.path ''", ("path is empty", "thermik model init")),
    Case("rl-data-missing", "rl --model.path {tiny} --data.train_path {tmp}/nothere.jsonl", ("not found", "nothere")),
    Case("eval-model-missing", "eval --model.path {tmp}/nope", NOT_A_MODEL),
    Case("sft-train-missing", "sft --model.path {tiny} --train_path {tmp}/nothere.jsonl", ("dataset not found",)),
    Case("sft-train-empty", "sft --model.path {tiny}", ("train_path is empty",)),
    Case("inference-model-missing", "inference --model.path {tmp}/nope", NOT_A_MODEL),
    Case("tinker-model-missing", "tinker --model.path {tmp}/nope", ("not a local Hugging Face model directory",)),
    Case("trainer-model-missing", "trainer --model.path {tmp}/nope", NOT_A_MODEL),
    Case("orchestrator-model-missing", "orchestrator --model.path {tmp}/nope", NOT_A_MODEL),
    Case("replay-not-a-run", "replay {tmp}", ("is not a run directory", "--record")),
    Case(
        "synthesize-conversations-missing",
        "synthesize --from-conversations {tmp}/no.jsonl --out {tmp}/s",
        ("no such file",),
    ),
    # bad formats and malformed rows (file and line)
    Case(
        "rl-format-txt", "rl --model.path {tiny} --data.train_path {data_txt}", ("unsupported dataset format '.txt'",)
    ),
    Case(
        "rl-parquet-garbage",
        "rl --model.path {tiny} --data.train_path {bad_parquet}",
        ("bad.parquet", "not a readable parquet"),
    ),
    Case(
        "rl-row-malformed",
        "rl --model.path {tiny} --data.train_path {rows_bad}",
        ("rows_bad.jsonl line 3", "invalid JSON"),
    ),
    Case("eval-row-malformed", "eval --model.path {tiny} --data.eval_path {rows_bad}", ("rows_bad.jsonl line 3",)),
    Case(
        "sft-row-malformed", "sft --model.path {tiny} --train_path {sft_bad}", ("sft_bad.jsonl line 6", "invalid JSON")
    ),
    Case("sft-eval-format", "sft --model.path {tiny} --train_path {sft_good} --eval_path {data_txt}", ("'.txt'",)),
    Case(
        "synthesize-row-malformed", "synthesize --from-conversations {sft_bad} --out {tmp}/s", ("sft_bad.jsonl line 6",)
    ),
    # models without a chat template
    Case("eval-no-chat-template", "eval --model.path {notmpl}", ("has no chat template", "--model.chat_template")),
    Case("sft-no-chat-template", "sft --model.path {notmpl} --train_path {sft_good}", ("--model.chat_template",)),
    # unreachable or missing servers
    Case(
        "eval-policy-unreachable",
        "eval --policy.base_url http://127.0.0.1:{port}/v1",
        ("cannot reach --policy.base_url",),
    ),
    Case(
        "eval-mcp-command-missing",
        "eval --model.path {tiny} --env.name mcp --env.mcp_servers "
        "'[\"x=thermik-no-such-server --flag\"]' --data.eval_path {mcp_rows}",
        ("'thermik-no-such-server'", "No such file or directory", "env.mcp_servers"),
    ),
    # unknown env names
    Case("rl-env-unknown", "rl --model.path {tiny} --env.name calculatr", ("unknown environment", "'calculator'")),
    Case("eval-env-unknown", "eval --model.path {tiny} --env.name nosuchenv", ("unknown environment 'nosuchenv'",)),
    Case("sft-env-unknown", "sft --model.path {tiny} --train_path {sft_good} --env.name calculatr", ("did you mean",)),
    Case("synthesize-env-unknown", "synthesize --env calculatr --n 2 --out {tmp}/s", ("did you mean 'calculator'",)),
    # read-only output directories (and a file where a directory should be)
    Case("rl-output-readonly", "rl --model.path {tiny} --output_dir {readonly}", NOT_WRITABLE, root_skips=True),
    Case("eval-output-file", "eval --model.path {tiny} --output_dir {afile}", NOT_WRITABLE),
    Case(
        "sft-output-readonly",
        "sft --model.path {tiny} --train_path {sft_good} --output_dir {readonly}",
        NOT_WRITABLE,
        root_skips=True,
    ),
    Case("sft-output-file", "sft --model.path {tiny} --train_path {sft_good} --output_dir {afile}/x", NOT_WRITABLE),
    Case("synthesize-out-file", "synthesize --env calculator --n 2 --out {afile}/x", NOT_WRITABLE),
    Case("model-init-out-not-empty", "model init --preset qwen2-1m --out {notmpl}", ("is not empty", "--overwrite")),
    Case("model-init-out-file", "model init --preset qwen2-1m --out {afile}/x", NOT_WRITABLE),
    Case("tinker-state-file", "tinker --model.path {tiny} --service.state_dir {afile}/x", NOT_WRITABLE),
    # too-small limits, refused before any episode
    Case("eval-input-limit", "eval --model.path {tiny} --rollout.max_input_length 4", ("max_input_length = 4",)),
    Case("rl-input-limit", "rl --model.path {tiny} --rollout.max_input_length 4", ("max_input_length = 4",)),
    # resume under a changed config: refused, config.toml byte for byte as it was
    Case(
        "rl-resume-changed",
        "rl --model.path {tiny} --output_dir {tmp}/resumed --name r --trainer.group_size 4",
        ("trainer.group_size 2 -> 4", "--name NEW"),
        setup=_saved_run,
        check=_config_kept,
    ),
]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def inputs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The bad (and the few good) inputs every row draws from, made once."""
    tmp = tmp_path_factory.mktemp("bad_inputs")
    notmpl = tmp / "notmpl"
    shutil.copytree(tiny_model_dir, notmpl)
    (notmpl / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((notmpl / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (notmpl / "tokenizer_config.json").write_text(json.dumps(config))
    row = {"data_source": "s", "env_class": "calculator", "prompt": [{"role": "user", "content": "1+1"}],
           "reward_spec": {"ground_truth": "2"}, "extra_info": {}}  # fmt: skip
    (tmp / "rows_bad.jsonl").write_text(f"{json.dumps(row)}\n\n{{oops\n")  # line 3: a blank line counts
    (tmp / "mcp_rows.jsonl").write_text(json.dumps({**row, "env_class": "mcp"}) + "\n")
    chat = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    (tmp / "sft_good.jsonl").write_text(json.dumps(chat) + "\n")
    (tmp / "sft_bad.jsonl").write_text(f"{json.dumps(chat)}\n" * 5 + "{not json\n")
    (tmp / "bad.parquet").write_bytes(b"not parquet at all")
    (tmp / "data.txt").write_text("x")
    (tmp / "afile").write_text("a file, not a directory")
    (tmp / "readonly").mkdir()
    (tmp / "readonly").chmod(0o555)
    names = ("rows_bad.jsonl", "mcp_rows.jsonl", "sft_good.jsonl", "sft_bad.jsonl", "bad.parquet", "data.txt")
    paths = {n.replace(".jsonl", "").replace(".", "_"): str(tmp / n) for n in names}
    return {**paths, "tmp": str(tmp), "tiny": str(tiny_model_dir), "notmpl": str(notmpl), "afile": str(tmp / "afile"),
            "readonly": str(tmp / "readonly"), "port": str(_closed_port())}  # fmt: skip


def _skipped(case: Case) -> bool:
    return case.root_skips and os.geteuid() == 0


def _run(case: Case, inputs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cwd = Path(inputs["tmp"]) / "cases" / case.id
    cwd.mkdir(parents=True)
    if case.setup is not None:
        case.setup(inputs)
    argv = shlex.split(case.argv.format(**inputs))
    if argv[0] in ("rl", "eval", "sft", "trainer", "orchestrator") and "--output_dir" not in argv:
        argv += ["--output_dir", str(cwd / "runs")]
    return run_thermik(*argv, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def results(inputs: dict[str, str], request: pytest.FixtureRequest) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every selected row's result (`-k` runs only its rows), the commands run side by side."""
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("case") for item in request.session.items}
    cases = [c for c in CASES if c in selected and not _skipped(c)]
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        done = pool.map(lambda c: _run(c, inputs), cases)
        return {c.id: res for c, res in zip(cases, done, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_input_is_one_line_without_traceback(case: Case, inputs: dict[str, str], results: dict) -> None:
    if _skipped(case):
        pytest.skip("root writes into a read-only directory (the '-output-file' rows check the same path)")
    res, command = results[case.id], shlex.split(case.argv)[0]
    assert res.returncode != 0, res.stdout[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-4000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    message = lines[-1]
    assert message.startswith(f"thermik {command}: "), res.stderr[-2000:]
    for fragment in case.expect:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if case.check is not None:
        case.check(inputs)


def test_a_prefix_break_ends_the_run_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """rollout.step_wise = off and a template that re-renders history: the message names the fix, no traceback."""
    import thermik.runs.local

    def broken(cfg: object) -> None:
        raise PrefixBreakError("turn 2: the next prompt is not an exact extension; set rollout.step_wise = 'on-break'")

    monkeypatch.setattr(thermik.runs.local, "run_rl", broken)
    monkeypatch.setenv("THERMIK_DEBUG", "0")  # recorded, so the teardown removes what `--debug` sets below
    assert issubclass(PrefixBreakError, ThermikError) and issubclass(PrefixBreakError, AssertionError)
    assert cli.main(["rl", "--rollout.step_wise", "off"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "thermik rl: turn 2: the next prompt is not an exact extension; set rollout.step_wise = 'on-break'"
    ]
    with pytest.raises(PrefixBreakError):  # --debug shows the traceback
        cli.main(["rl", "--debug"])


def test_thermik_errors_cross_processes_whole() -> None:
    """A Ray worker's error is pickled to its driver: subclasses whose constructors take other arguments survive."""
    import pickle

    from thermik.envs.registry import UnknownEnvError
    from thermik.models.chat import MissingChatTemplateError
    from thermik.models.loading import ModelPathError

    for error in (UnknownEnvError("calculatr", ["calculator"]), ModelPathError("no dir", hint="make one"),
                  MissingChatTemplateError("m"), PrefixBreakError("turn 2")):  # fmt: skip
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and back.hint == error.hint

"""`thermik monitor`: the JSON API and `--summary` over a run directory, and the page in headless Chromium while a real
`thermik rl` run writes the directory (chart points follow metrics.jsonl, tool calls render, the reward filter)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli_env, run_thermik, thermik_argv
from test_evaluation import scripted_calculator_eval

from thermik.data.dataset import write_rows
from thermik.models.chat import ChatTokenizer
from thermik.models.tokenizer import build_tokenizer
from thermik.rollout.evaluation import write_eval
from thermik.tasks.registry import generate_rows, solve

README_SCREENSHOT = os.environ.get("THERMIK_MONITOR_SCREENSHOT", "")  # set to refresh docs/images/monitor.png


def write_scripted_eval(run: Path) -> list[dict]:
    """Real calculator episodes (real MCP server) of a scripted policy: solved ones with a tool call and result,
    wrong answers; written by the evaluation path as trajectories/eval_scripted.jsonl."""
    chat = ChatTokenizer(build_tokenizer())
    rows = generate_rows("calculator", 2, seed=5, split="eval")
    good = [[m["content"] for m in solve(r) if m["role"] == "assistant"] for r in rows]
    scripts = {r["prompt"][-1]["content"]: [g, g, ["<answer>-99999</answer>"]] for r, g in zip(rows, good, strict=True)}
    result, records = scripted_calculator_eval(chat, scripts, rows, k=3)
    write_eval(run, "scripted", result, records)
    return records


def start_monitor(*runs: Path, log: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        thermik_argv("monitor", *map(str, runs), "--port", "0"), env=cli_env(), stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text()
        if "http://" in text:
            return proc, text.split("thermik monitor: ", 1)[1].split()[0].rstrip("/")
        if proc.poll() is not None:
            raise RuntimeError(f"thermik monitor exited: {text}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("thermik monitor printed no URL")


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "done"
    run.mkdir(parents=True)
    lines = [{"step": s, "timestamp": 1.0 + s, "reward/mean": s / 10, "policy/kl": 0.01 * s} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 6, "rew')  # torn line
    write_scripted_eval(run)
    return run


def test_api_and_summary_read_the_run_directory(finished_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "runs" / "other"
    other.mkdir()
    proc, url = start_monitor(finished_run, other, log=tmp_path / "monitor.log")
    try:
        assert [r["name"] for r in get(f"{url}/api/runs")] == ["done", "other"]  # side by side
        assert get(f"{url}/api/run/1/metrics") == [] and get(f"{url}/api/run/1/trajectories") == []
        assert [r["step"] for r in get(f"{url}/api/run/0/metrics")] == [1, 2, 3, 4, 5]
        assert get(f"{url}/api/run/0/trajectories") == [{"file": "eval_scripted", "kind": "eval"}]
        records = get(f"{url}/api/run/0/trajectories/eval_scripted")
        assert len(records) == 6 and "response_ids" not in records[0] and records[0]["turn_tokens"]
        assert get(f"{url}/api/run/0/evals")["evals"]["eval_scripted"]["k"] == 3
        with urllib.request.urlopen(f"{url}/static/uPlot.iife.min.js", timeout=10) as r:
            assert b"uPlot" in r.read(200_000)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    out = run_thermik("monitor", str(finished_run), "--summary")
    assert out.returncode == 0, out.stderr
    assert "reward/mean" in out.stdout and "eval_scripted" in out.stdout and "wrong_answer" in out.stdout


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    return browser, driver


@pytest.fixture
def browser() -> Iterator[object]:
    binary, driver_path = _chromium()
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1800",
    ):
        options.add_argument(flag)  # fmt: skip
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    yield driver
    driver.quit()


def _file_steps(run: Path) -> int:
    steps = set()
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            steps.add(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            continue
    return len(steps)


@contextlib.contextmanager
def paused(process: subprocess.Popen) -> Iterator[None]:
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_page_in_chromium_while_a_run_trains(browser, tiny_model_dir: Path, tmp_path: Path) -> None:
    write_rows(tmp_path / "train.jsonl", generate_rows("reverse_text", 64, 0, split="train"))
    write_rows(tmp_path / "eval.jsonl", generate_rows("reverse_text", 4, 0, split="eval"))
    run = tmp_path / "runs" / "live"
    run.mkdir(parents=True)
    records = write_scripted_eval(run)
    train = subprocess.Popen(
        thermik_argv(
            "rl", "--model.path", str(tiny_model_dir), "--env.name", "reverse_text", "--env.max_turns", "1",
            "--data.train_path", str(tmp_path / "train.jsonl"), "--data.eval_path", str(tmp_path / "eval.jsonl"),
            "--rollout.max_generate_length", "8", "--trainer.steps", "400", "--trainer.prompts_per_step", "2",
            "--trainer.group_size", "4", "--eval.before", "false", "--eval.size", "4",
            "--monitor.progress", "false", "--monitor.save_trajectories_every", "1", "--checkpoint.every", "0",
            "--output_dir", str(tmp_path / "runs"), "--name", "live",
        ),
        env=cli_env(), stdout=(tmp_path / "rl.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    monitor, url = start_monitor(run, log=tmp_path / "monitor.log")
    try:
        _wait(lambda: (run / "metrics.jsonl").exists() and _file_steps(run) >= 2, 240, "two training steps")
        browser.get(url + "/")
        points = "return window.thermikCharts.reward ? window.thermikCharts.reward.plot.data[0].length : -1"
        # The run is paused (SIGSTOP) while the chart is compared with metrics.jsonl: a run writing a step every
        # fraction of a second would otherwise race the page's polling.
        with paused(train):
            first = _wait(lambda: (n := browser.execute_script(points)) > 0 and n == _file_steps(run) and n, 30,
                          "the reward chart to show every step of metrics.jsonl")  # fmt: skip
        _wait(lambda: _file_steps(run) > first, 120, "the run to write more steps")
        with paused(train):
            _wait(lambda: browser.execute_script(points) == _file_steps(run), 30, "the chart to gain the new steps")
        assert train.poll() is None, "the run should still be training"

        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        Select(browser.find_element(By.ID, "f-file")).select_by_value("eval_scripted")
        _wait(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".traj")) == len(records), 20, "the scripted rollouts")
        calls = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant .tool-call")
        results = browser.find_elements(By.CSS_SELECTOR, ".msg.tool")
        assert calls and "calculate" in calls[0].text and "<tool_call>" in calls[0].text
        assert results and results[0].text.strip() != "tool"
        hover = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant .tok")
        assert hover and hover[0].get_attribute("title").startswith("logprob -0.5")

        evals = browser.find_element(By.ID, "evals").text
        assert "live · eval_scripted (k=3)" in evals and "env/calculator" in evals and "wrong_answer" in evals

        browser.find_element(By.ID, "f-min").send_keys("0.5")
        solved = sum(r["score"] >= 0.5 for r in records)
        _wait(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".traj")) == solved, 10, "the reward filter")
        shown = [float(c.get_attribute("data-reward")) for c in browser.find_elements(By.CSS_SELECTOR, ".traj")]
        assert shown and min(shown) >= 0.5 and 0 < solved < len(records)
        browser.save_screenshot(str(tmp_path / "monitor.png"))
        assert (tmp_path / "monitor.png").stat().st_size > 10_000
        if README_SCREENSHOT:
            browser.find_element(By.ID, "f-min").clear()
            time.sleep(0.5)
            browser.save_screenshot(README_SCREENSHOT)
    finally:
        monitor.terminate()
        train.terminate()
        monitor.wait(timeout=30)
        train.wait(timeout=60)

"""The repo-repair sandbox holds: each test breaks if its guard is removed (tasks/repo_repair/sandbox.py)."""

from __future__ import annotations

import logging
import os
import random
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from thermik.tasks.repo_repair import sandbox as sandbox_module
from thermik.tasks.repo_repair.sandbox import Sandbox, SandboxLimits, bwrap_path, head_tail

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="needs bubblewrap (apt-get install bubblewrap)")


def _processes_with(marker: str) -> list[int]:
    """Host processes whose command line contains `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            found.append(int(proc.name))
    return found


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    return root


@needs_bwrap
def test_the_workspace_is_a_copy_and_is_removed(repo: Path) -> None:
    box = Sandbox(repo)
    result = box.run("cat pkg/__init__.py && echo changed > pkg/__init__.py && pwd")
    assert result.exit_code == 0 and "VALUE = 1" in result.output and "/tmp/repo" in result.output
    assert (box.workspace / "pkg" / "__init__.py").read_text() == "changed\n"
    assert (repo / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"  # the task's repo is untouched
    box.close()
    assert not box.workspace.exists()


@needs_bwrap
def test_no_network_even_to_the_hosts_loopback(repo: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    try:
        with Sandbox(repo) as box:
            result = box.run(f'python -c "{code}"; echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1)')
    finally:
        server.close()
    assert "CONNECTED" not in result.output
    assert "IFACES lo\n" in result.output  # the only interface


@needs_bwrap
def test_no_write_outside_the_workspace_symlinks_included(repo: Path) -> None:
    outside = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="thermik-test-outside-"))
    outside.chmod(0o777)
    try:
        with Sandbox(repo) as box:
            script = (
                f"echo direct > {outside}/direct; ln -s {outside} escape; echo link > escape/via_link; "
                f"ln -s {outside}/via_file_link file_link; echo file > file_link; touch /usr/thermik-test; true"
            )
            box.run(script)
        assert list(outside.iterdir()) == []
        assert not Path("/usr/thermik-test").exists()
    finally:
        for child in outside.iterdir():
            child.unlink()
        outside.rmdir()


def _home_is_hidden(repo: Path, home: Path) -> None:
    secret = home / f".thermik-sandbox-secret-{uuid.uuid4().hex}"
    secret.write_text("TOP-SECRET-VALUE\n")
    secret.chmod(0o644)
    try:
        with Sandbox(repo) as box:
            read = box.run(f"cat {secret}")
            listed = box.run(f"ls -a {home}")
    finally:
        secret.unlink()
    assert "TOP-SECRET-VALUE" not in read.output and read.exit_code != 0
    assert secret.name not in listed.output


@needs_bwrap
def test_no_read_of_the_home_directory(repo: Path) -> None:
    _home_is_hidden(repo, Path.home())


@needs_bwrap
def test_a_home_readable_by_everyone_is_hidden_too(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as root, the sandbox user could not read a 0700 home anyway: a world-readable one (outside /tmp, which
    the sandbox replaces) shows that the home itself is hidden."""
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="thermik-test-home-"))
    home.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    try:
        _home_is_hidden(repo, home)
    finally:
        home.rmdir()


_SPAWN_100 = """
import subprocess
started = []
for _ in range(100):
    try:
        started.append(subprocess.Popen(["sleep", "20"]))
    except OSError:
        break
print("STARTED", len(started))
"""


@needs_bwrap
def test_a_fork_bomb_is_contained(repo: Path) -> None:
    limits = SandboxLimits(wall_s=3, processes=32)
    with Sandbox(repo, limits) as box:
        counted = box.run(f"python -c '{_SPAWN_100}'")
        start = time.monotonic()
        bomb = box.run("bomb() { bomb | bomb & }; bomb; sleep 10")
        uid = box.uid
    assert counted.output.startswith("STARTED ") and int(counted.output.split()[1]) < 32  # not the 100 asked for
    assert bomb.timed_out and time.monotonic() - start < 10
    if uid is not None:  # the kernel takes the namespace down asynchronously
        deadline = time.monotonic() + 5
        while [p for p in Path("/proc").iterdir() if p.name.isdigit() and _uid_of(p) == uid]:
            assert time.monotonic() < deadline, "the fork bomb's processes outlived their sandbox"
            time.sleep(0.05)


def _uid_of(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


@needs_bwrap
def test_a_memory_bomb_is_killed(repo: Path) -> None:
    with Sandbox(repo, SandboxLimits(memory_mb=256, wall_s=20)) as box:
        result = box.run("python -c 'x = bytearray(4 * 1024 ** 3); print(\"ALLOCATED\")'")
    assert "ALLOCATED" not in result.output and "MemoryError" in result.output
    assert result.exit_code != 0 and not result.timed_out


@needs_bwrap
def test_an_infinite_loop_is_killed_at_the_timeout(repo: Path) -> None:
    with Sandbox(repo, SandboxLimits(wall_s=60)) as box:
        start = time.monotonic()
        result = box.run("echo started; while :; do :; done", timeout_s=1.0)
    assert result.timed_out and result.exit_code == -9 and "started" in result.output
    assert 0.9 < time.monotonic() - start < 5
    assert "wall-clock limit" in result.format()


@needs_bwrap
def test_a_daemonised_child_dies_with_its_command_and_episode(repo: Path) -> None:
    marker = f"{random.randint(10**6, 10**7)}.25"
    with Sandbox(repo) as box:
        result = box.run(f"setsid nohup sleep {marker} >/dev/null 2>&1 & disown; echo started")
        assert "started" in result.output and result.seconds < 5
        time.sleep(0.2)
        assert _processes_with(f"sleep {marker}") == []


@needs_bwrap
def test_a_gigabyte_of_output_is_cut_to_head_and_tail(repo: Path) -> None:
    limits = SandboxLimits(max_output_chars=2000, wall_s=120)
    with Sandbox(repo, limits) as box:
        result = box.run("echo FIRST-LINE; yes 0123456789 | head -c 1000000000; echo; echo LAST-LINE")
    assert result.exit_code == 0 and result.output_bytes > 1_000_000_000
    assert result.output.startswith("FIRST-LINE") and result.output.rstrip().endswith("LAST-LINE")
    assert "bytes of output omitted" in result.output and len(result.output) < 2200


def test_head_tail_keeps_both_ends() -> None:
    text = head_tail(b"a" * 50 + b"z" * 50, 1000, 20)
    assert text.startswith("a" * 10) and text.endswith("z" * 10) and "980 bytes" in text


@needs_bwrap
def test_closing_mid_command_kills_it_and_removes_the_workspace(repo: Path) -> None:
    marker = f"{random.randint(10**6, 10**7)}.5"
    box = Sandbox(repo)
    runner = threading.Thread(target=box.run, args=(f"sleep {marker}",))
    runner.start()
    time.sleep(0.3)
    box.close()
    runner.join(timeout=10)
    assert not runner.is_alive() and not box.workspace.exists() and _processes_with(f"sleep {marker}") == []


def _run_unless_closed(box: Sandbox, command: str) -> None:
    try:
        box.run(command)
    except RuntimeError:  # closed before the command started
        assert box.closed


def _episodes_with_random_kills(n: int, repo: Path) -> None:
    rng = random.Random(0)
    workspaces = []
    marker = f"{random.randint(10**6, 10**7)}.75"
    for _ in range(n):
        box = Sandbox(repo, SandboxLimits(wall_s=30))
        workspaces.append(box.workspace)
        command = f"sleep {marker} & setsid sleep {marker} & sleep {marker}"
        runner = threading.Thread(target=_run_unless_closed, args=(box, command))
        runner.start()
        time.sleep(rng.uniform(0, 0.15))
        if rng.random() < 0.5:
            executor = box._executor
            if executor is not None:  # a kill from outside: the bwrap process dies first
                executor.proc.kill()
        box.close()
        runner.join(timeout=5)  # close() ends a running command at once, not at its 30 s wall time
        assert not runner.is_alive()
    time.sleep(0.2)
    assert _processes_with(f"sleep {marker}") == []
    assert [w for w in workspaces if w.exists()] == []


@needs_bwrap
def test_episodes_with_random_kills_leave_nothing_behind(repo: Path) -> None:
    _episodes_with_random_kills(25, repo)


@needs_bwrap
@pytest.mark.slow
def test_200_episodes_with_random_kills_leave_nothing_behind(repo: Path) -> None:
    _episodes_with_random_kills(200, repo)


def test_without_bwrap_unshare_and_rlimits_hold_with_one_warning(
    repo: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_module, "bwrap_path", lambda: None)
    sandbox_module._warn_no_bwrap.cache_clear()
    with caplog.at_level(logging.WARNING), Sandbox(repo, SandboxLimits(wall_s=5, processes=16)) as box:
        assert box.isolation == "unshare"
        result = box.run("tail -n +3 /proc/net/dev | cut -d: -f1; python -c 'bytearray(8 * 1024 ** 3)' 2>&1 | tail -1")
        Sandbox(repo).close()
    assert [r for r in caplog.records if "bubblewrap" in r.getMessage()].__len__() == 1
    assert "apt-get install bubblewrap" in caplog.text
    assert "MemoryError" in result.output and result.output.split()[0] == "lo"


@needs_bwrap
def test_exit_codes_are_the_commands_own_even_when_output_ends_first(repo: Path) -> None:
    with Sandbox(repo, SandboxLimits(wall_s=10)) as box:
        assert {box.run("echo x").exit_code for _ in range(20)} == {0}
        closed_early = box.run("exec >&- 2>&-; sleep 0.5; exit 4")
        killed = box.run("kill -9 $$")
    assert closed_early.exit_code == 4 and not closed_early.timed_out and closed_early.seconds >= 0.5
    assert killed.exit_code == 137

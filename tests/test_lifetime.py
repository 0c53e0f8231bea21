"""No orphans: a process thermik starts dies with its starter, whatever kills the starter (`kill -9` included).

Each test runs a real driver process, records every process under it, SIGKILLs the driver and requires all of them
gone within 10 s: children started through `dying_with_parent` (two levels), trees handed to the reaper (which
outlive their own parent, as Ray's agents do) and a local Ray started by `init_ray`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import cli_env
from orphans import GONE_WITHIN_S, alive, left_after_kill


def _driver(code: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start `code` as a driver process; returns it and its stdout lines up to (without) its line 'ready'."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], env=cli_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        if line.strip() == "ready":
            return proc, lines
        lines.append(line.strip())
    raise AssertionError(f"the driver exited ({proc.wait()}) before it was ready: {lines}")


def test_children_started_dying_with_parent_go_with_a_killed_parent_two_levels_down() -> None:
    driver, lines = _driver("""
        import subprocess, sys
        from thermik.lifetime import dying_with_parent
        middle = '''
        import subprocess, sys, time
        from thermik.lifetime import dying_with_parent
        leaf = subprocess.Popen(dying_with_parent(["sleep", "600"]))
        print(leaf.pid, flush=True)
        time.sleep(600)
        '''
        child = subprocess.Popen(dying_with_parent([sys.executable, "-c", middle]), stdout=subprocess.PIPE, text=True)
        leaf = child.stdout.readline().strip()
        print(child.pid, leaf, sep="\\n", flush=True)
        print("ready", flush=True)
        child.wait()
    """)
    procs = [psutil.Process(int(pid)) for pid in lines]
    assert procs[0].ppid() == driver.pid and procs[1].ppid() == procs[0].pid
    assert left_after_kill(driver, procs) == []


def test_a_sandboxed_program_dies_with_the_process_that_runs_it() -> None:
    """The code sandbox's child (behind `unshare -r` where it works, which clears an inherited parent-death signal)
    goes with a killed parent, although its wall clock (kept by that parent) is far off."""
    driver, _ = _driver("""
        import threading, time
        from thermik.tasks.code.sandbox_runner import SandboxLimits, run_python
        limits = SandboxLimits(wall_s=600, cpu_s=600)
        threading.Thread(target=run_python, args=("import time; time.sleep(600)", limits), daemon=True).start()
        time.sleep(2)
        print("ready", flush=True)
        time.sleep(600)
    """)
    procs = psutil.Process(driver.pid).children(recursive=True)
    assert any("time.sleep(600)" in " ".join(p.cmdline()) or "resource" in " ".join(p.cmdline()) for p in procs)
    assert left_after_kill(driver, procs) == []


def test_the_reaper_ends_recorded_trees_that_outlive_their_killed_parent() -> None:
    # `sh` and its two `sleep`s know nothing of the driver: only the reaper can end them.
    driver, _ = _driver("""
        import subprocess, time
        from thermik.lifetime import start_reaper
        tree = subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600"])
        start_reaper([tree.pid])
        time.sleep(1.5)  # the reaper records the tree twice a second
        print("ready", flush=True)
        time.sleep(600)
    """)
    procs = psutil.Process(driver.pid).children(recursive=True)
    assert sum(p.name() == "sleep" for p in procs) == 2 and any("lifetime.py" in " ".join(p.cmdline()) for p in procs)
    assert left_after_kill(driver, procs) == []  # the reaper too: its work done, it exits


def test_the_reaper_leaves_by_itself_when_its_processes_end_first() -> None:
    driver, _ = _driver("""
        import subprocess, time
        from thermik.lifetime import start_reaper
        tree = subprocess.Popen(["sleep", "1"])
        start_reaper([tree.pid])
        print("ready", flush=True)
        tree.wait()
        time.sleep(600)
    """)
    try:
        reaper = [p for p in psutil.Process(driver.pid).children() if "lifetime.py" in " ".join(p.cmdline())]
        assert len(reaper) == 1
        deadline = time.monotonic() + GONE_WITHIN_S
        while alive(reaper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(reaper) and driver.poll() is None  # it left while the driver still runs
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_ray_driver_leaves_no_ray_process() -> None:
    """`kill -9` of a driver that started a local Ray (agents, a worker) leaves none of Ray's processes."""
    driver, _ = _driver("""
        import os, time
        import ray
        from thermik.config.schema import DistributedConfig
        from thermik.distributed.launch import init_ray
        init_ray(DistributedConfig(), num_cpus=1)
        assert ray.get(ray.remote(lambda: os.getpid()).remote()) != os.getpid()
        time.sleep(1.5)  # the reaper records the raylet's agents and workers twice a second
        print("ready", flush=True)
        time.sleep(600)
    """)
    procs = psutil.Process(driver.pid).children(recursive=True)
    names = " ".join(p.name() + " " + " ".join(p.cmdline()) for p in procs)
    assert "raylet" in names and "ray::DashboardAgent" in names and "ray::RuntimeEnvAgent" in names, names
    assert left_after_kill(driver, procs) == []

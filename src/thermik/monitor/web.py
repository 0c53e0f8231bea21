"""`thermik monitor RUN [RUN...]`: a page on loopback with a run's curves, rollouts and evaluation tables.

It reads the run directory only (metrics.jsonl, trajectories/*.jsonl, eval_*.json, aggregated_results.jsonl), so it
works on a live run, a finished one and a copy. FastAPI serves a JSON API and one static page; the charts are uPlot
(MIT, vendored in `static/`, served from here: nothing is fetched from the internet). docs/evaluation.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from thermik.monitor.metrics import read_metrics

STATIC = Path(__file__).with_name("static")
_TRAJ_FILE = re.compile(r"^[A-Za-z0-9_.-]+$")
_HEAVY = ("prompt_ids", "response_ids", "loss_mask", "rollout_logprobs", "weight_versions", "rewards", "turn_spans")
"""Token-level lists of step dumps the viewer does not show (turn_tokens carries the sampled tokens' logprobs)."""


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a jsonl file another process may be writing: a torn last line is skipped."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _order(path: Path) -> tuple[int, str]:
    digits = re.findall(r"\d+", path.stem)
    return (int(digits[-1]) if digits else -1, path.stem)


def list_trajectories(run: Path) -> list[dict[str, Any]]:
    """The trajectory files of a run: training steps (step_<n>) and evaluations (eval_*), in step order."""
    files = sorted((run / "trajectories").glob("*.jsonl"), key=_order)
    return [{"file": f.stem, "kind": "eval" if f.stem.startswith("eval") else "step"} for f in files]


def read_trajectories(run: Path, name: str) -> list[dict[str, Any]]:
    if not _TRAJ_FILE.match(name):
        raise ValueError(f"bad trajectory file name {name!r}")
    path = run / "trajectories" / f"{name}.jsonl"
    return [{k: v for k, v in r.items() if k not in _HEAVY} for r in _jsonl(path)]


def read_evals(run: Path) -> dict[str, Any]:
    """Every eval_<label>.json (and eval.json), aggregated_results.jsonl and the --steps table of a run."""
    evals = {}
    for path in sorted(run.glob("eval*.json"), key=_order):
        try:
            evals[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue  # being written
    agg = run / "aggregated_results.jsonl"
    table = run / "eval_steps.md"
    return {
        "evals": evals,
        "aggregated": _jsonl(agg) if agg.exists() else [],
        "steps_table": table.read_text() if table.exists() else "",
    }


def read_run_metrics(run: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of the run (or of its trainer/ process in a split run)."""
    for path in (run / "metrics.jsonl", run / "trainer" / "metrics.jsonl"):
        if path.exists():
            return read_metrics(path)
    return []


def build_app(runs: list[Path]) -> Any:
    """The FastAPI app over `runs` (run directories), addressed by their index."""
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    app = FastAPI(title="thermik monitor", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def run_dir(i: int) -> Path:
        if not 0 <= i < len(runs):
            raise HTTPException(404, f"no run {i}; {len(runs)} runs")
        return runs[i]

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/api/runs")
    def api_runs() -> list[dict[str, Any]]:
        return [{"id": i, "name": p.name, "path": str(p)} for i, p in enumerate(runs)]

    @app.get("/api/run/{i}/metrics")
    def api_metrics(i: int) -> list[dict[str, Any]]:
        return read_run_metrics(run_dir(i))

    @app.get("/api/run/{i}/trajectories")
    def api_trajectory_files(i: int) -> list[dict[str, Any]]:
        return list_trajectories(run_dir(i))

    @app.get("/api/run/{i}/trajectories/{name}")
    def api_trajectories(i: int, name: str) -> list[dict[str, Any]]:
        try:
            return read_trajectories(run_dir(i), name)
        except (ValueError, FileNotFoundError) as e:
            raise HTTPException(404, str(e)) from None

    @app.get("/api/run/{i}/evals")
    def api_evals(i: int) -> dict[str, Any]:
        return read_evals(run_dir(i))

    return app


def serve(runs: list[Path], host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve until interrupted; port 0 picks a free one. The URL is printed first (tests and users read it)."""
    import socket

    import uvicorn

    missing = [str(r) for r in runs if not r.is_dir()]
    if missing:
        raise SystemExit(f"thermik monitor: not a directory: {', '.join(missing)}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them: the printed URL works at once
    server = uvicorn.Server(uvicorn.Config(build_app(runs), log_level="warning"))
    url = f"http://{host}:{sock.getsockname()[1]}/"
    print(f"thermik monitor: {url} ({', '.join(r.name for r in runs)})", flush=True)
    server.run(sockets=[sock])

"""Where a model call's time goes, through the capture endpoint and through thermik's agent loop: the episodes of
`capture_overhead.py` (same model, harness process, endpoint and engine), one batch per side, with each call's
steps timed (perf_counter, one clock across processes) and the engine's iterations counted.

Capture, per call: the harness sends (the SDK builds the request) -> the endpoint receives it -> its handler starts
-> the engine is called (body parsed, prompt rendered) -> queued -> admitted (prefill starts) -> prefilled ->
finished (last token sampled) -> the handler resumes -> the response is written -> sent -> the harness has it.
The agent loop: the engine is called -> queued -> admitted -> prefilled -> finished -> the loop resumes -> its next
call. Medians per step over all calls of the batch, then the engine's iterations (with a prefill or decode only),
their rows, and the engine thread's CPU against its busy wall time.

It times by wrapping the engine's, the queue's and the routes' methods in this process only: a probe, not a
product path. Run: `python benchmarks/capture_latency.py [--model DIR | --preset qwen2-1m] [--episodes 16]
[--turns 4] [--tokens 24] [--switch-interval MS]` (the options of capture_overhead.py).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import capture_overhead as co

from thermik.capture import registry
from thermik.capture import routes as capture_routes
from thermik.inference.embedded import loop as engine_loop
from thermik.inference.embedded import prefill, request_queue, requests

now = time.perf_counter
EVENTS: defaultdict[str | None, list[tuple[str, float]]] = defaultdict(list)  # episode (session) -> (step, time)
ITERATIONS: list[tuple[float, float, float, bool, int]] = []  # start, end, thread CPU, prefilled, rows running
CAPTURE_STEPS = ["send", "received", "handler", "call", "queued", "admitted", "prefilled", "finished", "resumed",
                 "written", "sent", "harness has it"]  # fmt: skip
LOOP_STEPS = ["call", "queued", "admitted", "prefilled", "finished", "resumed"]


def wrap(owner: Any, name: str, before: Any = None, after: Any = None) -> None:
    """Replace owner.name with a wrapper calling before(self, *args) and after(self, *args) around it."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(self: Any, *args: Any) -> Any:
        before and before(self, *args)
        try:
            return inner(self, *args)
        finally:
            after and after(self, *args)

    setattr(owner, name, wrapper)


def stamp(attribute: str) -> Any:
    def mark(_: Any, reqs: list[Any], *__: Any) -> None:
        for r in reqs:
            setattr(r, attribute, now())

    return mark


def finished(req: Any, *_: Any) -> None:
    if not req.future.done():
        for step in ("queued", "admitted", "prefilled"):
            EVENTS[req.session_id].append((step, getattr(req, step, float("nan"))))
        EVENTS[req.session_id].append(("finished", now()))


def iteration(loop: Any) -> None:
    loop.timed_start = (now(), time.thread_time(), loop.prefill.counters.batches)


def iteration_done(loop: Any) -> None:
    start, cpu, batches = loop.timed_start
    prefilled = loop.prefill.counters.batches > batches
    ITERATIONS.append((start, now(), time.thread_time() - cpu, prefilled, len(loop.scheduler.running())))


def instrument() -> None:
    wrap(request_queue.RequestQueue, "put", stamp("queued"))
    wrap(prefill.PrefillPlanner, "admit", stamp("admitted"), stamp("prefilled"))
    wrap(requests.Request, "finish", finished)
    wrap(engine_loop.SchedulerLoop, "iterate", iteration, iteration_done)
    chat = capture_routes.CaptureRoutes.chat

    @functools.wraps(chat)
    async def timed_chat(self: Any, episode_id: str, request: Any) -> Any:
        EVENTS[episode_id].append(("handler", now()))
        return await chat(self, episode_id, request)

    capture_routes.CaptureRoutes.chat = timed_chat  # type: ignore[method-assign]
    mount = capture_routes.mount

    def timed_mount(app: Any, routes: Any) -> None:
        mount(app, routes)
        app.add_middleware(Timing)

    registry.mount = timed_mount  # what Capture.mount calls


class Timing:
    """ASGI middleware: when an episode's request arrives, and when its response's last body is written and sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or "/episodes/" not in scope["path"]:
            return await self.app(scope, receive, send)
        episode = scope["path"].split("/episodes/")[1].split("/")[0]
        EVENTS[episode].append(("received", now()))

        async def timed_send(message: dict[str, Any]) -> None:
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if last:
                EVENTS[episode].append(("written", now()))
            await send(message)
            if last:
                EVENTS[episode].append(("sent", now()))

        await self.app(scope, receive, timed_send)


def timed_engine(engine: Any) -> None:
    generate = type(engine).generate

    async def timed(self: Any, prompt_ids: list[int], sampling: Any, session_id: str | None = None) -> Any:
        EVENTS[session_id].append(("call", now()))
        try:
            return await generate(self, prompt_ids, sampling, session_id)
        finally:
            EVENTS[session_id].append(("resumed", now()))

    type(engine).generate = timed


def report(side: str, steps: list[str], wall: float) -> None:
    """Median ms of each step over the batch's calls, then the engine's iterations."""
    spans: defaultdict[str, list[float]] = defaultdict(list)
    for events in EVENTS.values():
        calls: list[dict[str, float]] = []
        for step, t in sorted(events, key=lambda e: e[1]):
            if step == steps[0]:
                calls.append({})
            if calls:
                calls[-1].setdefault(step, t)
        for call in calls:
            for a, b in itertools.pairwise(steps):
                if a in call and b in call:
                    spans[f"{a} -> {b}"].append(1000 * (call[b] - call[a]))
        for first, second in itertools.pairwise(calls):
            spans[f"{steps[-1]} -> next {steps[0]}"].append(1000 * (second[steps[0]] - first[steps[-1]]))
    calls_timed = len(spans[f"{steps[0]} -> {steps[1]}"])
    print(f"{side}: batch wall time {1000 * wall:.0f} ms; per call (median ms of {calls_timed} calls):")
    for span, ms in spans.items():
        print(f"  {span:>32}: {statistics.median(ms):7.2f}")
    busy = sum(end - start for start, end, *_ in ITERATIONS)
    with_prefill = [1000 * (end - start) for start, end, _, p, _ in ITERATIONS if p]
    decode_only = [1000 * (end - start) for start, end, _, p, _ in ITERATIONS if not p]
    print(f"  engine: {len(ITERATIONS)} iterations ({len(with_prefill)} with a prefill, median "
          f"{statistics.median(with_prefill or [0]):.1f} ms; {len(decode_only)} decode only, median "
          f"{statistics.median(decode_only or [0]):.1f} ms), {statistics.mean(r for *_, r in ITERATIONS):.1f} rows "
          f"running on average; busy {1000 * busy:.0f} ms, its thread's CPU "
          f"{1000 * sum(c for _, _, c, *_ in ITERATIONS):.0f} ms")  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    instrument()
    engine, tokenizer = co.load_engine(args.model, seed=0, num_threads=args.threads)
    timed_engine(engine)
    chat, harnesses = co.ChatTokenizer(tokenizer), co.HarnessProcess(timed=True)
    async with co.serve_capture(engine, tokenizer, "policy", max_model_len=2048) as capture:
        if args.switch_interval is not None:
            sys.setswitchinterval(args.switch_interval / 1000)
        print(f"GIL switch interval {1000 * sys.getswitchinterval():g} ms")
        sides = {"agent loop": (lambda s: co.agent_loop_side(engine, chat, args, s), LOOP_STEPS),
                 "capture": (lambda s: co.capture_side(harnesses, capture, args, s), CAPTURE_STEPS)}  # fmt: skip
        for seed, (name, (side, steps)) in enumerate([*sides.items(), *sides.items()]):
            EVENTS.clear()
            ITERATIONS.clear()
            start = now()
            await side(seed // 2)
            for base_url, step, t in harnesses.log if name == "capture" else ():
                EVENTS[base_url.split("/episodes/")[1].split("/")[0]].append((step, t))
            if seed >= 2:  # the first of each side warms up
                report(name, steps, now() - start)
    harnesses.close()
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main(co.parse(__doc__)))  # --rounds is not used: one batch a side

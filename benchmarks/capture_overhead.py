"""What capture costs: the same episodes played by thermik's own agent loop (rollout/agent_loop.py, token ids straight
to the engine) and by an openai SDK harness through the capture endpoint (thermik.capture), in one run.

Each episode is a multi-turn chat: the model answers, the environment answers back with a user turn, for up to
--turns turns (a reply cut at --tokens ends the episode on both sides). Both sides sample with the same seeds from
the same embedded engine over the same model. The capture side's harnesses run in a process of their own, as thermik
runs a harness (agent.command, agent.entrypoint), all episodes at once over one SDK connection pool; this process
serves their endpoints (HTTP on loopback, request parsing, the prompt from the recorded tokens, the sample
bookkeeping) in the rollout's event loop. All --episodes run concurrently, as a rollout batch does.

Each round plays both sides back to back, their order alternating, so machine load hits both alike: the round's
ratio (capture / agent loop wall time) is paired, and the median of the rounds' ratios is the result (target: within
1.05). CPU time per episode, this process's (engine, agent loop or endpoint) and the harness process's, shows the
cost apart from waiting on a loaded machine. The agent loop re-tokenizes a turn whose text does not re-render to the
same prefix (an untrained model's broken characters): it then starts a new sample, where capture keeps extending its
tokens; the sample counts show how often. An untrained --preset model never ends a turn itself, so its eos row is
tilted first (--eos-scale, see `ending_turns`) to make the episodes multi-turn.

Run: `python benchmarks/capture_overhead.py [--model DIR | --preset qwen2-1m] [--episodes 16] [--turns 4]
[--tokens 24] [--rounds 5] [--switch-interval MS]`. Besides the ratio it prints the latency capture adds per model
call and the ratio that makes at larger turn costs (`per_call`).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import openai

from thermik.capture import Capture, serve_capture
from thermik.config.schema import SamplingConfig
from thermik.envs.base import Env, StepOutput
from thermik.inference.server.run import load_engine
from thermik.models.chat import ChatTokenizer
from thermik.models.presets import init_model
from thermik.rollout.agent_loop import LoopLimits, run_episode

SEED_STRIDE = 7919  # the agent loop's per-turn seed offset (seed + 7919 * turn)


class ChatEnv(Env):
    """Answers every turn with a user message; done after `turns` turns."""

    def __init__(self, turns: int) -> None:
        self.turns, self.taken = turns, 0

    def step(self, action: str) -> StepOutput:
        self.taken += 1
        done = self.taken >= self.turns
        return StepOutput([] if done else [{"role": "user", "content": f"Go on ({self.taken})."}], 0.0, done)


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are brief."}, {"role": "user", "content": f"Tell me about {i}."}]


async def agent_loop_side(
    engine: Any, chat: ChatTokenizer, args: argparse.Namespace, seed: int
) -> tuple[int, int, float]:
    """(sampled tokens, samples, model calls, 0: no harness process) of the batch."""
    limits = LoopLimits(max_turns=args.turns, max_input_length=1536, max_generate_length=args.tokens,
                        max_sequence_length=2048)  # fmt: skip
    trajs = await asyncio.gather(*(
        run_episode(engine, ChatEnv(args.turns), chat, prompt(i), limits, SamplingConfig(), seed=seed + 1000 * i)
        for i in range(args.episodes)
    ))  # fmt: skip
    return (*counts(trajs), 0.0)


async def play(sdk: openai.AsyncOpenAI, client: dict[str, str], i: int, seed: int, turns: int, tokens: int,
               log: list[tuple[str, str, float]] | None = None) -> None:  # fmt: skip
    """One episode as a user's harness plays it: the openai SDK's chat loop against the episode's base URL. `log`
    gets (base URL, "send" | "harness has it", perf_counter time) around each call (capture_latency.py)."""
    api = sdk.with_options(base_url=client["base_url"], api_key=client["api_key"])
    env, messages = ChatEnv(turns), prompt(i)
    for turn in range(turns):
        if log is not None:
            log.append((client["base_url"], "send", time.perf_counter()))
        reply = await api.chat.completions.create(model=client["model"], messages=messages, max_tokens=tokens,
                                                  seed=seed + SEED_STRIDE * turn)  # fmt: skip
        if log is not None:
            log.append((client["base_url"], "harness has it", time.perf_counter()))
        text = reply.choices[0].message.content or ""
        out = env.step(text)
        if out.done or reply.choices[0].finish_reason != "stop":
            break
        messages = [*messages, {"role": "assistant", "content": text}, *out.observations]


def harness_worker(conn: Connection, timed: bool) -> None:
    """The harness process: plays each batch of episodes it is sent, concurrently, and answers its CPU seconds (and,
    `timed`, each call's send and receive times). Its SDK clients share one connection pool (an SDK client's TLS
    context is the harness's cost)."""

    async def serve() -> None:
        async with openai.AsyncOpenAI(base_url="http://127.0.0.1", api_key="unused", max_retries=0) as sdk:
            while (batch := conn.recv()) is not None:
                start, log = time.process_time(), [] if timed else None
                await asyncio.gather(*(play(sdk, *episode, log) for episode in batch))
                conn.send((time.process_time() - start, log or []))

    asyncio.run(serve())


class HarnessProcess:
    """The harnesses in a process of their own, as thermik runs them (agent.command and agent.entrypoint run beside
    the rollout, never in its process): this process does the endpoint's work, not the SDK's."""

    def __init__(self, timed: bool = False) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=harness_worker, args=(child, timed), daemon=True)
        self.process.start()
        self.log: list[tuple[str, str, float]] = []

    async def play(self, batch: list[tuple[Any, ...]]) -> float:
        """The harness process's CPU seconds for the batch; `log`: its calls' times when timed (see `play`)."""
        self.conn.send(batch)
        cpu, self.log = await asyncio.to_thread(self.conn.recv)
        return cpu

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=30)


async def capture_side(
    harnesses: HarnessProcess, capture: Capture, args: argparse.Namespace, seed: int
) -> tuple[int, int, float]:
    """(sampled tokens, samples, model calls, the harness process's CPU seconds) of the batch."""
    handles = [capture.open() for _ in range(args.episodes)]
    batch = [(h.client_config(), i, seed + 1000 * i, args.turns, args.tokens) for i, h in enumerate(handles)]
    harness_cpu = await harnesses.play(batch)
    trajs = [capture.close(h.id) for h in handles]
    return (*counts(trajs), harness_cpu)


def counts(trajs: list[Any]) -> tuple[int, int, int]:
    """(sampled tokens, samples, model calls) of a batch's episodes."""
    return (sum(t.num_generated_tokens for t in trajs), sum(len(t.samples) for t in trajs),
            sum(t.num_turns for t in trajs))  # fmt: skip


Side = Callable[[int], Awaitable[tuple[int, int, int, float]]]


async def main(args: argparse.Namespace) -> None:
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1000)
    engine, tokenizer = load_engine(args.model, seed=0, num_threads=args.threads)
    chat = ChatTokenizer(tokenizer)
    harnesses = HarnessProcess()
    load = os.getloadavg()[0]
    async with serve_capture(engine, tokenizer, "policy", max_model_len=2048) as capture:
        sides: dict[str, Side] = {"agent loop": lambda s: agent_loop_side(engine, chat, args, s),
                                  "capture": lambda s: capture_side(harnesses, capture, args, s)}  # fmt: skip
        rounds = await play_rounds(sides, args)
    harnesses.close()
    await engine.close()
    report(args, rounds, (load, os.getloadavg()[0]))


async def play_rounds(sides: dict[str, Side], args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """Per side, each round's wall time; CPU per episode of this process, of its event loop's thread (the agent
    loop's or the endpoint's own work, not the engine's) and of the harness process; the counts."""
    for side in sides.values():  # warm-up: first-call costs (template probe, kernels, connections)
        await side(0)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name in list(sides) if r % 2 == 0 else list(reversed(sides)):
            start, start_cpu, start_loop = time.perf_counter(), time.process_time(), time.thread_time()
            tokens, samples, calls, harness_cpu = await sides[name](1 + r)
            rounds[name].append({"wall": time.perf_counter() - start, "tokens": tokens, "samples": samples,
                                 "calls": calls,
                                 "cpu": (time.process_time() - start_cpu) / args.episodes,
                                 "loop_cpu": (time.thread_time() - start_loop) / args.episodes,
                                 "harness_cpu": harness_cpu / args.episodes})  # fmt: skip
    return rounds


def report(args: argparse.Namespace, rounds: dict[str, list[dict[str, float]]], load: tuple[float, float]) -> None:
    print(
        f"{args.episodes} episodes x <= {args.turns} turns x <= {args.tokens} tokens, {args.rounds} rounds, "
        f"load average {load[0]:.1f} -> {load[1]:.1f}, GIL switch interval {1000 * sys.getswitchinterval():g} ms"
    )
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}
    for name, m in median.items():
        harness = f", harness process {1000 * m['harness_cpu']:.1f} ms" if m["harness_cpu"] else ""
        print(f"  {name:>10}: {m['wall']:.3f} s rollout wall time; CPU per episode: this process "
              f"{1000 * m['cpu']:.1f} ms, its event loop {1000 * m['loop_cpu']:.1f} ms{harness} "
              f"(medians; {m['tokens']:.0f} sampled tokens, {m['samples']:.0f} samples, {m['calls']:.0f} model "
              "calls)")  # fmt: skip
    ratios = [c["wall"] / a["wall"] for c, a in zip(rounds["capture"], rounds["agent loop"], strict=True)]
    print(f"rounds' capture / agent loop: {' '.join(f'{r:.3f}' for r in ratios)}")
    cpu_ratio = median["capture"]["cpu"] / median["agent loop"]["cpu"]
    endpoint = (median["capture"]["loop_cpu"] - median["agent loop"]["loop_cpu"]) / median["agent loop"]["cpu"]
    print(f"capture / agent loop = {statistics.median(ratios):.3f} median of the rounds (target <= 1.05); "
          f"this process's CPU {cpu_ratio:.3f}; the endpoint's extra event-loop CPU is {100 * endpoint:.1f} % of "
          "the agent loop side's process CPU")  # fmt: skip
    per_call(args, rounds, median)


def per_call(args: argparse.Namespace, rounds: dict[str, list[dict[str, float]]], median: dict) -> None:
    """The overhead as a fixed cost per model call, and the ratio it makes at other turn costs.

    The episodes run concurrently and each one's calls run one after another, so the wall time a round adds is
    (calls per episode) x (what capture adds to one call's latency). `turn` is the agent loop side's wall time per
    call; a larger model or longer turns raise it, the added latency stays: the ratio at turn cost T is
    1 + added / T."""
    added = statistics.median(
        (c["wall"] - a["wall"]) / (a["calls"] / args.episodes)
        for c, a in zip(rounds["capture"], rounds["agent loop"], strict=True)
    )
    turn = median["agent loop"]["wall"] / (median["agent loop"]["calls"] / args.episodes)
    requests = median["capture"]["calls"] / args.episodes  # per episode
    endpoint = (median["capture"]["loop_cpu"] - median["agent loop"]["loop_cpu"]) / requests
    harness = median["capture"]["harness_cpu"] / requests
    print(f"per model call: capture adds {1000 * added:.1f} ms of latency (median of the rounds) to a turn of "
          f"{1000 * turn:.1f} ms here; CPU per request: the endpoint {1000 * endpoint:.2f} ms in the rollout's event "
          f"loop, the openai SDK {1000 * harness:.2f} ms in the harness process")  # fmt: skip
    projected = ", ".join(f"{t:g} s: {1 + added / t:.3f}" for t in (0.25, 0.5, 1, 2, 4))
    print(f"capture / agent loop at a turn cost of {projected}; within 1.05 from {added / 0.05:.2f} s a turn")


def ending_turns(model_dir: Path, eos_scale: float) -> None:
    """Make an untrained model end its turns: its eos row (tied to the embedding) is pointed along the mean of its
    final hidden states, so eos gets a logit of about `eos_scale` x 1.9 where others have a spread of ~1.1: most turns
    end by eos within --tokens, and episodes run several turns (an untrained model would fill every turn to its
    limit, and a length cut ends the episode)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos = int(model.config.eos_token_id)
    ids = torch.randint(0, model.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states[-1].reshape(-1, model.config.hidden_size)
        direction = hidden.mean(0) / hidden.mean(0).norm()
        model.get_output_embeddings().weight[eos] = eos_scale * direction
    model.save_pretrained(model_dir)


def parse(description: str | None = __doc__) -> argparse.Namespace:
    """The options, shared with capture_latency.py; `model` is a directory (a fresh --preset without --model)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--preset", default="qwen2-1m")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="the engine's threads (0: all cores); one keeps a "
                        "loaded machine from stalling its kernels' threads")  # fmt: skip
    parser.add_argument("--switch-interval", type=float, default=None, help="the interpreter's GIL switch interval "
                        "in ms (default: Python's 5); the engine thread and the event loop share the GIL")  # fmt: skip
    parser.add_argument("--eos-scale", type=float, default=2.0, help="with --preset: how soon turns end (0: never)")
    args = parser.parse_args()
    if args.model is None:
        args.model = init_model(args.preset, Path(tempfile.mkdtemp()) / args.preset, seed=0)
        if args.eos_scale:
            ending_turns(args.model, args.eos_scale)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))

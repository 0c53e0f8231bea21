"""The embedded engine (the default backend): continuous batching over a slot KV cache, in this process.

A scheduler thread owns the model. Each iteration it admits queued requests into cache slots, prefilling
only what no slot holds yet: the n samples of a group share one prefill, prompts admitted together forward the
prefix they share once (one system prompt), and a session's next turn (or any prompt that extends a cached
sequence) prefills only its new tokens. Then it runs one decode step for every
running sequence. A finished sequence frees its slot for the next request at once (continuous batching).
Weight updates take the model lock between two steps: running sequences continue on the new weights (their
cached keys/values stay as the old weights made them, as in PipelineRL) and every token records the weight
version that produced it; cached prefixes of finished requests and parked sessions are dropped.

The cache has a byte budget (`kv_cache_gb`). A request is admitted only while every running request could reach
its longest length (prompt + max_tokens) within it, so a running batch never needs more than the budget; the
queue waits instead. Idle slots (finished requests' prefixes, parked sessions) give way first: least recently used
ones are reused or evicted, and a parked session whose slot was evicted re-prefills its next turn.

Models the native forward does not cover fall back to `HFEngine` (static batches on transformers) with a
warning; see `embedded_engine`.

The parts, one job each:

| module | job |
|---|---|
| engine.py | `EmbeddedEngine`, the public API: checks and queues requests, weight updates, sessions, close |
| request_queue.py | the queue callers put requests in, and the scheduler thread that serves it |
| loop.py | the scheduler thread's iterations: admit and prefill, then one decode step, under the model lock |
| scheduler.py | admission within the KV cache budget, placement in slots, eviction of idle slots |
| prefill.py | prefill planning: shared prompts, cached and donated prefixes, padded forwards within the budget |
| decode.py | the decode step (native forward, or the fixed-shape step of decode_graphs.py) |
| records.py | sampling records: next token, logprobs, weight version, stop reasons |
| requests.py | a request, a slot, the work counters |
| build.py | `embedded_engine`: native when the model is supported, else `HFEngine` |
"""

from thermik.inference.embedded.build import embedded_engine
from thermik.inference.embedded.engine import EmbeddedEngine
from thermik.inference.embedded.prefill import MIN_SHARED_PREFIX
from thermik.inference.embedded.requests import Detokenize
from thermik.inference.embedded.scheduler import INITIAL_CACHE_LEN

__all__ = ["INITIAL_CACHE_LEN", "MIN_SHARED_PREFIX", "Detokenize", "EmbeddedEngine", "embedded_engine"]

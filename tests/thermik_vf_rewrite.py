"""A verifiers v1 harness for the tests (run in the verifiers venv, never imported by thermik) whose conversation
is rewritten mid-episode, as a compaction or a sub-agent does: the model answers the task, then answers it again
in a fresh context that quotes its first reply. verifiers records the two contexts as two trainable branches of one
trace. Harness id `thermik-vf-rewrite` (verifiers imports this module from the path); it runs its loop in-process,
every model call through verifiers' interception endpoint, as verifiers' Harness contract allows.
"""

from __future__ import annotations

from openai import AsyncOpenAI
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult


class RewriteConfig(HarnessConfig):
    pass


class RewriteHarness(Harness[RewriteConfig]):
    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        _, prompt = self.resolve_prompt(data)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret)
        try:
            first = await client.chat.completions.create(
                model=ctx.model, messages=[{"role": "user", "content": prompt}]
            )
            said = (first.choices[0].message.content or "")[:40]
            restarted = [{"role": "user", "content": f"Before, you said {said!r}. {prompt}"}]
            await client.chat.completions.create(model=ctx.model, messages=restarted)
        finally:
            await client.close()
        return ProgramResult(0, "", "")


__all__ = ["RewriteHarness"]

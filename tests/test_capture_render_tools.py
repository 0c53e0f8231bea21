"""`env.render_tools = false` with an agent harness: the capture keeps the request's tool schemas out of the prompt
(a model warmed up without them, as the calculator recipe's, sees the prompt it was trained on)."""

from __future__ import annotations

from pathlib import Path

from thermik.capture.episode import Episode, EpisodeLimits
from thermik.models.chat import ChatTokenizer
from thermik.models.loading import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calculate", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
MESSAGES = [{"role": "system", "content": "Use the calculate tool."}, {"role": "user", "content": "What is 2+3?"}]


def _prompt(chat: ChatTokenizer, render_tools: bool) -> str:
    episode = Episode(chat, EpisodeLimits(render_tools=render_tools))
    episode.begin(MESSAGES, TOOLS, "request-1", retry=False)
    return chat.tokenizer.decode(episode.prompt_ids())


def test_tool_schemas_stay_out_of_the_prompt_when_render_tools_is_off(tiny_model_dir: Path) -> None:
    chat = ChatTokenizer(load_tokenizer(tiny_model_dir))
    with_tools, without = _prompt(chat, True), _prompt(chat, False)
    assert "Evaluate arithmetic." in with_tools and "Evaluate arithmetic." not in without
    assert without == chat.tokenizer.decode(chat.encode(chat.render(MESSAGES, None)))


def test_env_render_tools_reaches_the_harness_episodes_capture_limits() -> None:
    """The run's env.render_tools travels from the env factory to each harness episode's capture limits."""
    from thermik.agents.episode import episode_limits
    from thermik.agents.harness_env import harness_env_factory
    from thermik.config.agent import AgentConfig
    from thermik.config.model import SamplingConfig
    from thermik.envs.base import Env
    from thermik.rollout.agent_loop import LoopLimits

    class Plain(Env):
        tools = None

        def step(self, action: str) -> None:
            raise AssertionError

    limits = LoopLimits(max_turns=3, max_input_length=64, max_generate_length=16, max_sequence_length=128)
    for render_tools in (True, False):
        make = harness_env_factory(lambda row: Plain(), AgentConfig(entrypoint="agent:run"), render_tools)
        env = make({"prompt": []})
        assert episode_limits(env, limits, SamplingConfig(), None).render_tools is render_tools

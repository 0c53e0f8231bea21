"""A verifiers v1 taskset for the tests (run in the verifiers venv, never imported by thermik): repeat a word.

The taskset id is `thermik-vf-echo` (verifiers imports the module `thermik_vf_echo` from the path); the reward is
the similarity of the reply to the word, so a tiny model gets a signal.
"""

from __future__ import annotations

import difflib

import verifiers.v1 as vf

WORDS = ["cat", "dog", "sun", "map", "cup", "pen", "box", "hat", "key", "egg", "ink", "jam", "log", "net", "owl", "pig"]


class EchoData(vf.TaskData):
    answer: str = ""


class EchoTask(vf.Task[EchoData]):
    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        return difflib.SequenceMatcher(None, trace.last_reply, self.data.answer).ratio()


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = 64


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        words = [WORDS[i % len(WORDS)] + str(i // len(WORDS)) for i in range(self.config.num_tasks)]
        return [EchoTask(EchoData(prompt=f"Say {w}", answer=w), self.config.task) for w in words]


__all__ = ["EchoTaskset"]

"""The custom agent and environment against a scripted model (what a user's own test looks like)."""

import asyncio

from examples.custom_agent.agent import RetryAgent
from realhf.api.cli_args import AgentConfig, EnvConfig, GenerationHyperparameters
from realhf.api.env import EnvFactory
from realhf.system.episode import run_group
from realhf.system.generation_client import GenerationResult

ROW = {"query_id": "q1", "prompt": "Q: 2+3?\nA:", "solutions": [" 2+3=5\n#### 5"]}


class Model:
    """Answers with the next scripted text, one token per character."""

    def __init__(self, answers):
        self.answers = list(answers)

    async def generate(self, qid, input_ids, gconfig, group_size=1):
        ids = [ord(c) for c in self.answers.pop(0)]
        return GenerationResult(ids, [-1.0] * len(ids), [0] * len(ids), "stop", 1)


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def rewards(answers, group_size):
    async def main():
        envs = EnvFactory(EnvConfig(type="examples.custom_agent.agent:ExactAnswerEnv"))
        traj = await run_group(
            RetryAgent(AgentConfig()),
            ROW,
            [1, 2],
            qid="q1@0",
            client=Model(answers),
            envs=envs,
            gconfig=GenerationHyperparameters(),
            tokenizer=CharTokenizer(),
            agent_config=AgentConfig(),
            group_size=group_size,
        )
        return [s.reward for s in traj.samples], traj

    return asyncio.run(main())


def test_right_at_once_right_on_retry_and_wrong_twice():
    assert rewards([" #### 5"], 1)[0] == [1.0]
    assert rewards([" #### 4", " #### 5"], 1)[0] == [0.5]
    got, traj = rewards([" #### 4", " #### 6"], 1)
    assert got == [-1.0]
    # The retry prompt is in the sample, off the loss.
    feedback = "\nWrong. Try again.\nA:"
    assert "".join(map(chr, traj.samples[0].output_ids)) == " #### 4" + feedback + " #### 6"
    assert traj.samples[0].mask().tolist() == [1] * 7 + [0] * len(feedback) + [1] * 7

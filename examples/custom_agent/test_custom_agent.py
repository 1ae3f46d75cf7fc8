"""The custom agent and environment against scripted answers (what a user's own test looks like)."""

from examples.custom_agent.agent import ExactAnswerEnv, RetryAgent
from realhf.testing import ScriptedModel, run_episode

ROW = {"query_id": "q1", "prompt": "Q: 2+3?\nA:", "solutions": [" 2+3=5\n#### 5"]}


def sample(answers):
    """The one sample of an episode whose model answers `answers` in turn, and the tokenizer (the
    tiny model's: one token per character, but for a few pairs such as "in")."""
    model = ScriptedModel(answers)
    return run_episode(RetryAgent, ROW, env=ExactAnswerEnv, model=model).samples[0], model.tokenizer


def test_right_at_once_right_on_retry_and_wrong_twice():
    assert sample([" #### 5"])[0].reward == 1.0
    assert sample([" #### 4", " #### 5"])[0].reward == 0.5
    wrong, tokenizer = sample([" #### 4", " #### 6"])
    assert wrong.reward == -1.0
    # The retry prompt is in the sample, off the loss.
    feedback = "\nWrong. Try again.\nA:"
    assert tokenizer.decode(wrong.output_ids) == " #### 4" + feedback + " #### 6"
    n_feedback = len(tokenizer(feedback, add_special_tokens=False)["input_ids"])
    assert wrong.mask().tolist() == [1] * 7 + [0] * n_feedback + [1] * 7


def test_the_tiny_model_runs_a_whole_episode_in_process():
    out = run_episode(RetryAgent, ROW, env=ExactAnswerEnv, model="tiny", max_new_tokens=16)
    s = out.samples[0]
    assert s.reward in (1.0, 0.5, -1.0)
    assert len(s.output_ids) == len(s.logprobs) == len(s.versions) and len(out.prompt_ids) == len(ROW["prompt"])

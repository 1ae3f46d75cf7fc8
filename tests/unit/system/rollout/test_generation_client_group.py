"""A group's samples in one /generate (sampling_params.n), and SGLang's string weight versions.

Real HTTP: the real manager app and the fake SGLang server (tests/helpers/fake_sglang.py), which
answers n > 1 with a list of n and reports its weight version as a string, as SGLang does.
"""

import asyncio
import time

import pytest

from helpers.fake_sglang import fake_logprob, fake_token
from helpers.manager_harness import fake_servers, running_manager, set_version
from realhf.api.agent import Agent
from realhf.api.cli_args import EnvConfig, GenerationHyperparameters
from realhf.api.env import EnvFactory
from realhf.system.rollout.episode import run_group
from realhf.system.rollout.generation_client import GenerationClient, parse_generate_response
from realhf.system.streams.http_json import GenerationError

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("nr")]


def expected_continuation(prompt, versions, vocab_size=64):
    """The tokens the fake server produces, given the version behind each one."""
    seq, out = list(prompt), []
    for v in versions:
        seq.append(fake_token(len(seq), seq[-1], v, vocab_size))
        out.append(seq[-1])
    return out


def test_weight_versions_are_read_as_sglangs_strings_and_older_servers_integers():
    def version(v):
        answer = {"output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}, "weight_version": v}}
        answer["meta_info"]["output_token_logprobs"] = [[-0.1, 5, None]]
        return parse_generate_response("http://s", answer)[3]

    assert [version("3"), version(3), version("default"), version(None), version(True)] == [3, 3, None, None, None]


def test_versions_that_changed_during_a_request_are_read_per_token():
    def answer(changes, n=5):
        meta = {"finish_reason": {"type": "length"}, "weight_version": "7", "weight_version_changes": changes}
        meta["output_token_logprobs"] = [[-0.1, 5, None]] * n
        return {"output_ids": [5] * n, "meta_info": meta}

    assert parse_generate_response("http://s", answer([[0, "6"], [3, "7"]]))[3] == [6, 6, 6, 7, 7]
    assert parse_generate_response("http://s", answer([[0, "5"], [1, "6"], [4, "7"]]))[3] == [5, 6, 6, 6, 7]
    for bad in ([[1, "6"]], [[0, "6"], [3, "x"]], [[0, "6"], ["a", "7"]], [[0, "6"], [4, "7"], [2, "8"]]):
        with pytest.raises(GenerationError, match="malformed weight_version_changes"):
            parse_generate_response("http://s", answer(bad))


def _group(m_url, qid, prompt, gconfig, n, **client_kw):
    async def main():
        async with GenerationClient(m_url, **client_kw) as client:
            assert (await client.manager.allocate_rollout(qid, 0))[0]
            results = await client.generate_group(qid, prompt, gconfig, n=n, one_request=True)
            await client.manager.finish_rollout(qid, True)
            return results, client

    return asyncio.run(main())


def test_one_request_asks_for_the_group_with_n_and_splits_the_answer():
    gconfig = GenerationHyperparameters(max_new_tokens=24)
    with fake_servers(1) as (server,), running_manager([server.url], max_head_offpolicyness=10) as m:
        results, client = _group(m.url, "q", [5, 6, 7], gconfig, 4)
        assert server.n_generate == 1 and server.requests[0]["sampling_params"]["n"] == 4
        want = expected_continuation([5, 6, 7], [0] * 24)
        for r in results:
            assert r.output_ids == want and r.logprobs == [fake_logprob(t) for t in want]
            assert r.versions == [0] * 24 and r.finish_reason == "length" and r.n_requests == 1


def test_samples_that_need_more_go_on_one_by_one_chunks_and_aborts():
    gconfig = GenerationHyperparameters(max_new_tokens=40)
    with fake_servers(1) as (server,), running_manager([server.url], max_head_offpolicyness=10) as m:
        # Chunks of 16: the group's first 16 tokens in one request, then 2 more per sample.
        results, _ = _group(m.url, "q", [5, 6, 7], gconfig, 3, new_tokens_per_chunk=16)
        assert server.n_generate == 1 + 3 * 2
        assert all(r.output_ids == expected_continuation([5, 6, 7], [0] * 40) for r in results)
        assert all(r.n_requests == 3 for r in results)


def test_a_weight_update_during_the_group_request_resumes_each_sample_at_the_new_version(tmp_path):
    gconfig = GenerationHyperparameters(max_new_tokens=48)
    with (
        fake_servers(1, token_delay=0.01) as (server,),
        running_manager([server.url], run_dir=str(tmp_path), max_head_offpolicyness=10) as m,
    ):

        async def main():
            async with GenerationClient(m.url) as client:
                await client.manager.allocate_rollout("q", 0)
                task = asyncio.create_task(client.generate_group("q", [5, 6, 7], gconfig, n=3, one_request=True))
                await asyncio.sleep(0.2)
                set_version(1)
                return await task, client.n_aborts

        t0 = time.monotonic()
        results, n_aborts = asyncio.run(main())
        assert time.monotonic() - t0 < 15
        assert n_aborts == 3 and server.n_generate == 1 + 3
        for r in results:
            k = r.versions.index(1)
            assert 0 < k < 48 and r.versions == [0] * k + [1] * (48 - k)
            assert r.output_ids == expected_continuation([5, 6, 7], r.versions)


class OneAnswer(Agent):
    one_generation_per_episode = True

    async def run_episode(self, row, gen, env):
        if row.get("skip_first") and gen is row["first_gen"].setdefault("gen", gen):
            return None  # an episode that ends without generating: the others must not wait for it
        c = await gen()
        return float(len(c.output_ids))


class TwoAnswers(OneAnswer):
    one_generation_per_episode = False


class Tok:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _run_group(m_url, agent, row, group_size, one_request, qid="q"):
    from realhf.api.cli_args import AgentConfig

    async def main():
        envs = EnvFactory(EnvConfig(type="none"))
        async with GenerationClient(m_url) as client:
            assert (await client.manager.allocate_rollout(qid, 0))[0]
            try:
                return await asyncio.wait_for(
                    run_group(
                        agent,
                        row,
                        [5, 6, 7],
                        qid=qid,
                        client=client,
                        envs=envs,
                        gconfig=GenerationHyperparameters(max_new_tokens=8),
                        tokenizer=Tok(),
                        agent_config=AgentConfig(),
                        group_size=group_size,
                        one_request=one_request,
                    ),
                    30,
                )
            finally:
                await client.manager.finish_rollout(qid, True)
                await envs.aclose()

    return asyncio.run(main())


def test_run_group_sends_one_request_for_an_agent_that_generates_once_and_only_when_asked():
    with fake_servers(1) as (server,), running_manager([server.url], max_head_offpolicyness=10) as m:
        traj = _run_group(m.url, OneAnswer(), {}, 4, one_request=True)
        assert server.n_generate == 1 and len(traj.samples) == 4 and traj.metadata["n_requests"] == 4
        assert all(list(s.output_ids) == expected_continuation([5, 6, 7], [0] * 8) for s in traj.samples)
        _run_group(m.url, OneAnswer(), {}, 4, one_request=False, qid="q2")  # the default: a request per sample
        assert server.n_generate == 1 + 4
        _run_group(m.url, TwoAnswers(), {}, 4, one_request=True, qid="q3")  # the agent does not allow it
        assert server.n_generate == 1 + 4 + 4
        # An episode that ends without generating: the other three go as one request.
        traj = _run_group(m.url, OneAnswer(), {"skip_first": True, "first_gen": {}}, 4, one_request=True, qid="q4")
        assert server.n_generate == 1 + 4 + 4 + 1 and len(traj.samples) == 3
        assert server.requests[-1]["sampling_params"]["n"] == 3

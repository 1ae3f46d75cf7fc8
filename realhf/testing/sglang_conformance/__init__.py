"""SGLang conformance: the request and answer shapes of every SGLang endpoint realhf uses (and of
/get_server_info, which SGLang's own clients read), written
down from SGLang's own source for one named release (`fixtures.SGLANG`), and a suite that checks a
running server against them (docs/scaling.md, "Is this server SGLang enough?").

    python -m realhf.testing.sglang_conformance --url http://127.0.0.1:30000   # read-only checks
    ... --control --weights --model-path <the server's model folder>            # + pause, weights

    fixtures.py   ENDPOINTS (method, request shape, answers), EXAMPLES, SGLANG (release, source)
    schema.py     the shape language and `mismatches(value, shape)`
    suite.py      `run_suite(url, ...)`: the examples, and realhf's weight-update clients through a
                  recording proxy (recorder.py)

realhf's clients are tested against the same shapes, and the built-in server answers every example
(tests/unit/testing/test_sglang_conformance.py).
"""

from realhf.testing.sglang_conformance.fixtures import ENDPOINTS, EXAMPLES, SGLANG
from realhf.testing.sglang_conformance.schema import mismatches
from realhf.testing.sglang_conformance.suite import Outcome, check_answer, check_request, run_suite

__all__ = ["ENDPOINTS", "EXAMPLES", "SGLANG", "mismatches", "Outcome", "check_answer", "check_request", "run_suite"]

"""The user's line of an error (realhf.base.user_code): the innermost frame that is neither
realhf's nor the standard library's or an installed package's, and whether the user's code
raised the error or realhf code it called did."""

import json
import os
import traceback

from realhf.base.user_code import LIBRARY_DIRS, REALHF_DIR, ErrorReport, is_user_file, pick_user_frame

STDLIB = next(d for d in LIBRARY_DIRS if os.path.exists(os.path.join(d, "json", "decoder.py")))
USER = "/home/me/project/my_agent.py"


def frame(filename, line=1, name="f"):
    return traceback.FrameSummary(filename, line, name, line=None)


def as_realhf(source: str) -> dict:
    """Functions whose frames sit in realhf's package (compiled under a file name there)."""
    scope = {}
    exec(compile(source, os.path.join(REALHF_DIR, "system", "pretend.py"), "exec"), scope)
    return scope


def test_the_innermost_frame_outside_realhf_and_the_libraries_is_the_users():
    frames = [
        frame(USER.replace("my_agent", "main"), 3, "main"),
        frame(os.path.join(REALHF_DIR, "system", "episode.py"), 181, "run_episode"),
        frame(USER, 12, "run_episode"),
        frame(os.path.join(STDLIB, "json", "decoder.py"), 355, "raw_decode"),
    ]
    picked, by_user = pick_user_frame(frames)
    assert (picked.filename, picked.lineno, by_user) == (USER, 12, True)  # raised in a library it called


def test_an_error_raised_by_realhf_code_the_user_called_only_passes_through_the_users_line():
    frames = [frame(USER, 12, "run_episode"), frame(os.path.join(REALHF_DIR, "system", "generation_client.py"), 90)]
    picked, by_user = pick_user_frame(frames)
    assert (picked.lineno, by_user) == (12, False)


def test_realhf_and_library_frames_alone_name_no_user_line():
    assert pick_user_frame(
        [frame(os.path.join(REALHF_DIR, "x.py")), frame(os.path.join(STDLIB, "asyncio", "tasks.py"))]
    ) == (None, False)
    assert not is_user_file("<frozen importlib._bootstrap>") and not is_user_file("<string>")
    assert is_user_file(USER)


def parse(text):
    return json.loads(text)  # the user's line: json raises below it


def test_a_real_error_is_reported_with_its_type_message_and_the_users_file_and_line():
    line = parse.__code__.co_firstlineno + 1
    try:
        parse("{")
    except ValueError as e:
        report = ErrorReport.of(e)
    assert report.type == "JSONDecodeError" and report.message.startswith("Expecting property name")
    assert report.where.endswith(f"test_user_code.py:{line} in parse") and report.by_user
    assert report.one_line() == f"JSONDecodeError: {report.message} at {report.where}"
    assert "Traceback (most recent call last)" in report.traceback
    assert ErrorReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_a_users_error_that_realhf_wrapped_is_found_through_the_chain():
    realhf = as_realhf(
        "def call(fn):\n"
        "    try:\n"
        "        return fn()\n"
        "    except KeyError as e:\n"
        "        raise RuntimeError('the agent failed') from e\n"
    )

    def agent():
        return {}["tgt"]

    try:
        realhf["call"](agent)
    except RuntimeError as e:
        report = ErrorReport.of(e)
    line = agent.__code__.co_firstlineno + 1
    assert (report.type, report.message, report.by_user) == ("RuntimeError", "the agent failed", True)
    assert report.where.endswith(f"test_user_code.py:{line} in agent")


def test_an_error_realhf_raised_under_the_users_call_says_so():
    realhf = as_realhf("def generate():\n    raise ConnectionError('no server')\n")

    def agent():
        return realhf["generate"]()

    try:
        agent()
    except ConnectionError as e:
        report = ErrorReport.of(e)
    assert not report.by_user
    assert report.one_line().startswith("ConnectionError: no server (raised in realhf, called from ")


def test_the_same_error_at_the_same_line_has_one_fingerprint_and_other_messages_share_the_site():
    a = ErrorReport("KeyError", "'tgt'", "a.py:3 in f", True)
    assert a.fingerprint == ErrorReport("KeyError", "'tgt'", "a.py:3 in f", True, "another traceback").fingerprint
    b = ErrorReport("KeyError", "'src'", "a.py:3 in f", True)
    assert a.fingerprint != b.fingerprint and a.site == b.site

"""scripts/slowest_tests.py: the slowest tests over all lanes' JUnit reports, and the waits nearest their timeouts."""

import json

from scripts.slowest_tests import main, tight_waits
from scripts.slowest_tests import test_times as times_of

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.a" name="test_fast" time="0.5"/>
<testcase classname="tests.unit.a" name="test_slow" time="12.0"/>
</testsuite></testsuites>"""


def test_the_lanes_reports_are_merged_slowest_first_and_a_cut_off_one_is_skipped(tmp_path, capsys):
    (tmp_path / "unit.xml").write_text(REPORT)
    (tmp_path / "system.xml").write_text(REPORT.replace("tests.unit.a", "tests.system.b").replace("12.0", "30.0"))
    (tmp_path / "checks.xml").write_text(REPORT[:60])  # a lane killed while writing its report
    paths = [str(tmp_path / f"{lane}.xml") for lane in ("checks", "unit", "system")]
    assert [(t, lane) for t, lane, _ in times_of(paths)] == [
        (30.0, "system"),
        (12.0, "unit"),
        (0.5, "unit"),
        (0.5, "system"),
    ]
    assert main([*paths, "--top", "2"]) == 0
    out = capsys.readouterr()
    assert "the 2 slowest of 4 tests (43 s in all)" in out.out
    assert out.out.index("tests.system.b::test_slow") < out.out.index("tests.unit.a::test_slow")
    assert "test_fast" not in out.out and "no timings from" in out.err


def test_by_file_sums_each_files_tests_and_top_0_prints_all(tmp_path, capsys):
    report = REPORT.replace("tests.unit.a", "tests.unit.test_a").replace(
        "</testsuite>",
        '<testcase classname="tests.unit.test_b.TestX" name="test_c" time="3.0"/></testsuite>',
    )
    (tmp_path / "unit.xml").write_text(report)
    assert main([str(tmp_path / "unit.xml"), "--by-file", "--top", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "the 2 slowest of 2 files" in lines[0]
    assert "12.5 s" in lines[1] and lines[1].endswith("tests.unit.test_a")
    assert "3.0 s" in lines[2] and lines[2].endswith("tests.unit.test_b")


def test_each_tests_tightest_wait_is_printed_nearest_its_timeout_first(tmp_path, capsys):
    def prop(took, timeout, what):
        return (
            f"<properties><property name=\"tightest_wait\" value='{json.dumps([took, timeout, what])}'/></properties>"
        )

    report = f"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.system.a" name="test_run" time="40.0">{prop(36.0, 60, "run r to its end")}</testcase>
<testcase classname="tests.system.a" name="test_steps" time="20.0">{prop(9.0, 600, "2 train steps")}</testcase>
<testcase classname="tests.system.a" name="test_none" time="1.0"/>
</testsuite></testsuites>"""
    (tmp_path / "system.xml").write_text(report)
    waits = tight_waits([str(tmp_path / "system.xml")])
    assert [(share, what) for share, _, _, what, _, _ in waits] == [(0.6, "run r to its end"), (0.015, "2 train steps")]
    assert main([str(tmp_path / "system.xml"), "--waits", "1"]) == 0
    out = capsys.readouterr().out
    assert "the 1 waits nearest their timeouts" in out
    assert " 60%   36.0 s of 60 s  system  tests.system.a::test_run: run r to its end" in out
    assert "2 train steps" not in out
    assert main([str(tmp_path / "system.xml"), "--waits", "0"]) == 0
    assert "nearest their timeouts" not in capsys.readouterr().out

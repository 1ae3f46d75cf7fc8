"""scripts/slowest_tests.py: the slowest tests over all lanes' JUnit reports."""

from scripts.slowest_tests import main
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

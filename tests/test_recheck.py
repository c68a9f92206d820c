"""benchmarks/checks/recheck_learning.py's figure of a run and its verdict, against the definitions written out by hand."""

from __future__ import annotations

from benchmarks.checks import recheck_learning as recheck


def test_last_tenth_weights_each_row_by_the_episodes_that_ended_since_the_row_before(tmp_path):
    csv = tmp_path / "progress.csv"
    csv.write_text(
        "global_step,wall_time_s,sps,episodes,return_mean\n"
        "500,1,1,4,10.0\n"  # before the last tenth: left out
        "900,2,1,5,20.0\n"  # step 900 of 1000 is not past 90%: left out
        "950,3,1,8,30.0\n"  # 3 episodes at 30
        "980,4,1,8,\n"  # none ended
        "1000,5,1,9,70.0\n"
    )  # 1 episode at 70
    assert recheck.last_tenth(csv) == (3 * 30.0 + 70.0) / 4


def test_a_figure_holds_while_the_intervals_overlap_and_moves_when_they_part():
    assert recheck.interval([5.0, 5.0, 5.0]) == (5.0, 5.0, 5.0)
    assert recheck.verdict([490, 495, 500], [480, 500, 499]) == "holds"
    assert recheck.verdict([490, 495, 500], [200, 260, 330]) == "MOVED"
    assert recheck.verdict([490], [200, 260]) == "-"  # one seed has no interval

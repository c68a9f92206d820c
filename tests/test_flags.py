"""experiments/flags.py: the one-line refusal of the experiments/ command lines, and flags checked by the script's
own parser (RL_CHECK_ONLY) without starting or writing anything."""

from __future__ import annotations

import pytest

from experiments import flags
from tests.helpers import ROOT

PPO = ROOT / "algos" / "ppo_atari.py"

# A stand-in script (no torch: milliseconds) that records each check it gets and refuses `--bad`, as a script's
# parser would; it also says whether it was asked to check only.
FAKE = """
import os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "|" + os.environ.get("RL_CHECK_ONLY", "") + "\\n")
if "--bad" in sys.argv:
    print("error: --bad is bad", file=sys.stderr)
    sys.exit(2)
if "--crash" in sys.argv:
    raise RuntimeError("boom")
"""


def test_parser_refuses_in_one_line_without_usage(capsys):
    p = flags.Parser(prog="x")
    p.add_argument("root")
    p.add_argument("--n", type=int)
    p.add_argument("--how", choices=["mean", "iqm"])
    for argv in ([], ["r", "--n", "1.5"], ["r", "--how", "median"], ["r", "--nope"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2
        assert err.startswith("error: ") and err.count("\n") == 1, err  # no usage block


def test_check_only_is_the_name_shared_run_reads():
    from shared.run import CHECK_ONLY

    assert flags.CHECK_ONLY == CHECK_ONLY


def test_refusals_ask_each_distinct_check_once_and_report_by_index(tmp_path, monkeypatch):
    """The fake script runs as a subprocess per distinct check."""
    script, log = tmp_path / "fake.py", tmp_path / "log"
    script.write_text(FAKE)
    monkeypatch.setenv("FAKE_LOG", str(log))
    checks = [(script, ["--a"]), (script, ["--bad"]), (script, ["--a"]), (script, ["--bad"]), (script, ["--crash"])]
    got = flags.refusals(checks, jobs=2)
    assert [i for i, _ in got] == [1, 3, 4]
    assert got[0][1] == got[1][1] == "--bad is bad"
    assert "exit 1" in got[2][1] and "RuntimeError: boom" in got[2][1]
    calls = sorted(log.read_text().splitlines())
    assert calls == ["--a|1", "--bad|1", "--crash|1"]  # deduplicated, each with RL_CHECK_ONLY set


def test_a_missing_script_is_a_refusal_not_a_traceback(tmp_path):
    """python (a subprocess) cannot open the file: a refusal saying so."""
    reason = flags.refusal(tmp_path / "no_such.py", [])
    assert reason is not None and "No such file" in reason, reason


def test_a_script_checks_its_flags_and_writes_nothing(tmp_path):
    """ppo_atari's own parser and checks, under RL_CHECK_ONLY: a bad seed refused in its words, good flags
    accepted, and the run folder given with --out-dir never made (two subprocesses, torch imported in each; the
    launcher's tests check more of the scripts' refusals)."""
    out = tmp_path / "not" / "made"
    ok = ["--preset", "cartpole", "--out-dir", str(out), "--run-name", "r"]
    got = flags.refusals([(PPO, [*ok, "--seed", "-1"]), (PPO, ok)])
    assert [i for i, _ in got] == [0], got
    assert got[0][1].startswith("--seed"), got
    assert list(tmp_path.iterdir()) == []

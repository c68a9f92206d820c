"""The unit tier holds only in-process tests: tests/conftest.py follows what a test calls into the tests' own
helpers, so a test that starts a script through a helper (tests/test_syncs.py's ``count``) is not ``unit``."""

from __future__ import annotations

import subprocess
import sys

from tests import helpers, test_syncs
from tests.conftest import starts_a_script


def _script_helper():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


def _indirect():
    return _script_helper()


def fake_run():
    return 1


def _uses_fake_run():
    return fake_run() + 1


def test_a_helper_that_starts_a_script_is_followed_through_every_call():
    assert starts_a_script(_script_helper, set())
    assert starts_a_script(_indirect, set())
    assert starts_a_script(test_syncs.test_the_loop_never_waits_on_the_device_between_rows, set())


def test_a_name_that_only_ends_like_a_starting_call_starts_nothing():
    assert not starts_a_script(_uses_fake_run, set())
    assert not starts_a_script(fake_run, set())


def test_the_in_process_refusal_helper_is_unit_and_run_is_not():
    """tests/helpers.py's ``refusal`` calls a script's main() in this process: the bad-argument tests built on it
    are unit tests (its docstring must not read as a call that starts a script); ``run`` starts one."""
    assert not starts_a_script(helpers.refusal, set())
    assert starts_a_script(helpers.run, set())

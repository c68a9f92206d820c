"""Checks that pass or fail, run by hand or by a slow test: a long run's growth, the torch range, the scripts' size,
the cheap learning figures re-measured."""

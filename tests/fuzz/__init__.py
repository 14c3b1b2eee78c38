"""Fuzzing of every parser of outside bytes (see tests/test_fuzz.py); the seed corpus is in
``corpus/``, made by :mod:`tests.fuzz.seeds`."""

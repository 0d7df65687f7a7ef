"""The job registry: the decorator form and the explicit form register a builder."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from pollux_opt.runtime import get_job, job_names
from solvers import InvalidProblem

USER_MODULE = """
from pollux_opt.runtime import training_job

@training_job(name="{name}", init_batch_size=16, max_batch_size=256, target=0.5)
def build(ctx):
    raise NotImplementedError
"""


def test_training_job_decorator_registers_a_builder_while_its_module_loads(tmp_path, monkeypatch):
    name = "decorated-user-job"
    (tmp_path / "user_jobs_mod.py").write_text(textwrap.dedent(USER_MODULE.format(name=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("user_jobs_mod")
    try:
        spec = get_job(name)
        assert name in job_names()
        assert spec.builder == "user_jobs_mod:build"
        assert spec.init_batch_size == 16 and spec.max_batch_size == 256
        assert module.build.__name__ == "build"
    finally:
        sys.modules.pop("user_jobs_mod", None)


def test_unknown_job_names_the_registered_ones():
    with pytest.raises(InvalidProblem, match=r"unknown job 'no-such-job'; registered jobs: \["):
        get_job("no-such-job")

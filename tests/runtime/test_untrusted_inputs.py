"""What files may make the runtime run: builders (the trust model of
``pollux_opt.runtime.spec``), checkpoint payloads and names that become paths."""

from __future__ import annotations

import importlib
import json
import pickle
import sys
import textwrap

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.records.files import safe_name
from pollux_opt.runtime import ElasticJob, JobSpec, get_job
from pollux_opt.runtime.checkpoint import load_payload, save_checkpoint
from pollux_opt.runtime.spec import BUILTIN_JOBS_MODULE, check_declared_builder, resolve_builder
from pollux_opt.workloads import Workload
from pollux_opt.workloads.load import load_workload

#: The refusal every standard-library builder gets, wherever it is named.
STDLIB_REFUSAL = (
    "builder {path!r} is refused: module {top!r} is part of Python's standard library; a builder "
    "must be a function of the built-in jobs or of a module your code or workload declares"
)
STDLIB_BUILDERS = ["builtins:print", "os:system", "subprocess:run", "os.path:join", "importlib:import_module"]

#: A user's job module that defines a builder without registering it.
USER_MODULE = """
def build(ctx):
    raise NotImplementedError
"""


def _refusal(path: str) -> str:
    import re

    return re.escape(STDLIB_REFUSAL.format(path=path, top=path.partition(":")[0].split(".")[0]))


def _workload(builder: str | None = None, **fields) -> dict:
    job = {"id": "a", "kind": "digits-cnn", "arrival_s": 0, "replicas": 1, "batch_size": 32}
    if builder is not None:
        job["spec"] = {"builder": builder}
    return {"name": "w", "jobs": [job], **fields}


def _user_module(tmp_path, monkeypatch, name: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# ------------------------------------------------------------------ builders
@pytest.mark.parametrize("path", STDLIB_BUILDERS)
def test_a_standard_library_builder_is_refused_wherever_it_is_named(path):
    base = get_job("digits-cnn")
    with pytest.raises(InvalidProblem, match=_refusal(path)):
        base.replace(builder=path)
    with pytest.raises(InvalidProblem, match=_refusal(path)):
        resolve_builder(path)
    saved = json.loads(base.to_json()) | {"builder": path}  # a job.json's spec, edited
    with pytest.raises(InvalidProblem, match=_refusal(path)):
        JobSpec.from_json(json.dumps(saved))
    with pytest.raises(InvalidProblem, match="workload job 'a': " + _refusal(path)):
        Workload.from_json(_workload(path)).check()


def test_a_builtin_function_object_is_refused_too():
    # exec rather than print: a library may replace builtins.print in this process (Ray's shutdown does).
    with pytest.raises(InvalidProblem, match=_refusal("builtins:exec")):
        JobSpec(name="x", builder=exec, init_batch_size=1, max_batch_size=2, target=1.0)


def test_a_workload_file_naming_builtins_print_never_calls_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: calls.append(a))
    path = tmp_path / "w.json"
    path.write_text(json.dumps(_workload("builtins:print")))
    with pytest.raises(InvalidProblem, match="workload job 'a': " + _refusal("builtins:print")):
        load_workload(path)
    assert calls == []


def test_a_workload_may_name_builtin_and_declared_builders_only(tmp_path, monkeypatch):
    builtin = f"{BUILTIN_JOBS_MODULE}:build_synth_regress"
    assert Workload.from_json(_workload(builtin)).jobs[0].job_spec().builder == builtin
    with pytest.raises(InvalidProblem, match=r"workload job 'a': builder 'pollux_opt\.cli\.main:main' is not "
                                             r"from a declared module; list its module in the workload's 'imports'"):
        Workload.from_json(_workload("pollux_opt.cli.main:main")).check()
    module = _user_module(tmp_path, monkeypatch, "untrusted_inputs_user_jobs")
    with pytest.raises(InvalidProblem, match="is not from a declared module"):
        Workload.from_json(_workload(f"{module}:build")).check()
    try:
        workload = Workload.from_json(_workload(f"{module}:build", imports=[module]))
        assert module in sys.modules
        check_declared_builder(f"{module}:build", where="test")  # declared: not refused
        assert workload.jobs[0].job_spec().builder == f"{module}:build"
        assert Workload.from_json(workload.to_json()) == workload  # imports round-trip (a run's config.json)
    finally:
        sys.modules.pop(module, None)


@pytest.mark.parametrize("imports, message", [
    (["os"], r"imports entry 'os' is refused: module 'os' is part of Python's standard library"),
    (["builtins"], r"imports entry 'builtins' is refused: module 'builtins' is part of Python's standard library"),
    (["no_such_module_xyz"], r"imports entry 'no_such_module_xyz' cannot be imported"),
    (["../evil"], r"imports entry must be a dotted module name, got '\.\./evil'"),
    ("json", r"imports must be a list of module names, got 'json'"),
])
def test_workload_imports_are_checked(imports, message):
    with pytest.raises(InvalidProblem, match=message):
        Workload.from_json(_workload(imports=imports))


def test_a_workload_without_imports_writes_none():
    """The config.json of a run without imports stays as it was (a resume compares it)."""
    assert "imports" not in Workload.from_json(_workload()).to_json()


def test_resuming_a_job_json_checks_its_builder(tmp_path, monkeypatch):
    ElasticJob("digits-cnn", tmp_path / "a").close()
    job_json = tmp_path / "a" / "job.json"
    saved = json.loads(job_json.read_text())

    def tamper(builder: str) -> None:
        spec = json.loads(saved["spec"]) | {"builder": builder}
        job_json.write_text(json.dumps(saved | {"spec": json.dumps(spec, sort_keys=True)}))

    tamper("builtins:print")
    with pytest.raises(InvalidProblem, match=_refusal("builtins:print")):
        ElasticJob.from_workdir(tmp_path / "a")
    module = _user_module(tmp_path, monkeypatch, "untrusted_inputs_resumed_jobs")
    tamper(f"{module}:build")
    with pytest.raises(InvalidProblem, match=r"job\.json in '.*a': builder 'untrusted_inputs_resumed_jobs:build' "
                                             r"is not from a declared module"):
        ElasticJob.from_workdir(tmp_path / "a")
    assert module not in sys.modules  # refused before anything was imported


def test_registering_a_job_declares_its_module(tmp_path, monkeypatch):
    module = _user_module(tmp_path, monkeypatch, "untrusted_inputs_registered_jobs")
    try:
        build = importlib.import_module(module).build
        with pytest.raises(InvalidProblem, match="is not from a declared module"):
            check_declared_builder(f"{module}:build", where="test")
        JobSpec(name="registered-x", builder=build, init_batch_size=1, max_batch_size=2, target=1.0)
        check_declared_builder(f"{module}:build", where="test")  # a function object passed by code is code
    finally:
        sys.modules.pop(module, None)


# --------------------------------------------------------------- checkpoints
class _Payload:
    """Unpickling this runs ``_mark`` (what an attacker's pickle would do)."""

    def __reduce__(self):
        return (_mark, ("unpickled",))


_MARKS: list[str] = []


def _mark(text: str) -> str:
    _MARKS.append(text)
    return text


def test_a_checkpoint_holding_a_pickled_object_is_refused_without_running_it(tmp_path):
    pytest.importorskip("torch")
    # save_checkpoint records the payload's true SHA-256: the digest check passes.
    info = save_checkpoint(tmp_path, 7, {"runtime": {"step": 7}, "evil": _Payload()}, {"progress": 7.0})
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_payload(info)  # torch.load(weights_only=True): tensors and plain containers only
    assert _MARKS == []  # the object's reduce function never ran


# --------------------------------------------------------------------- names
@pytest.mark.parametrize("name", ["../victim", "..", ".", "/etc", "a/b", "", "-x", "x" * 256])
def test_safe_name_refuses_what_is_not_one_path_component(name):
    with pytest.raises(InvalidProblem, match=r"run name must be"):
        safe_name("run name", name)


def test_safe_name_admits_job_and_application_names():
    for name in ("digits-cnn", "cifar10", "ncf-3", "a.b_c", "x" * 255):
        assert safe_name("run name", name) == name


def test_workload_names_become_safe_file_names():
    with pytest.raises(InvalidProblem, match=r"workload name must be letters, digits, .*got '\.\./x'"):
        Workload.from_json({**_workload(), "name": "../x"})



def test_a_jobs_module_replaces_another_jobs_of_its_name_but_never_the_processes_own(tmp_path, monkeypatch):
    from pollux_opt.runtime.spec import import_from

    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"job_module_{tmp_path.name.replace('-', '_')}"
    for i in (1, 2):
        folder = tmp_path / f"job{i}"
        folder.mkdir()
        (folder / f"{name}.py").write_text(f"VERSION = {i}\n")
        (folder / "numpy.py").write_text("raise AssertionError('imported')\n")
    try:
        assert import_from(name, str(tmp_path / "job1")).VERSION == 1
        assert import_from(name, str(tmp_path / "job2")).VERSION == 2  # another job's module of that name: afresh
        numpy = sys.modules["numpy"]
        with pytest.raises(InvalidProblem, match=r"module 'numpy' is loaded in this process .* rename the job's"):
            import_from("numpy", str(tmp_path / "job1"))
        assert sys.modules["numpy"] is numpy
    finally:
        sys.modules.pop(name, None)

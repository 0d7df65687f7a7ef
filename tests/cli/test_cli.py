"""The command line's own commands: version, listings, and cluster flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pollux_opt
from pollux_opt.cli import main
from pollux_opt.runtime import job_names
from pollux_opt.scheduling.policies import registered_policies
from pollux_opt.workloads import WORKLOAD_SETS


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"pollux-opt {pollux_opt.__version__}"


def test_list_names_every_registered_policy_job_kind_and_workload_set(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {(line.split()[0], line.split()[1]) for line in lines}
    expected = (
        {("policy", name) for name in registered_policies()}
        | {("job", name) for name in job_names()}
        | {("workload", name) for name in WORKLOAD_SETS}
    )
    assert listed == expected
    assert any(line.startswith("policy") and "optimus" in line and "needs: oracle" in line for line in lines)


def test_list_of_one_kind_names_only_that_kind(capsys):
    assert main(["list", "policies"]) == 0
    kinds = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert kinds == {"policy"}


@pytest.mark.parametrize("flags", [["--nodes", "0"], ["--cpus", "0"]])
def test_zero_nodes_or_cpus_is_an_error_not_the_default(flags, tmp_path, capsys):
    code = main(["run", "--workload", "mixed", "--policy", "pollux", "--out", str(tmp_path / "r"), *flags])
    assert code == 2
    assert "must be an integer" in capsys.readouterr().err
    assert not (tmp_path / "r" / "config.json").exists()


#: Modules that ``import pollux_opt`` must leave unloaded: the backends and the optional extras.
HEAVY_MODULES = ("pollux_opt.backends.local", "pollux_opt.backends.sim", "pollux_opt.runtime", "torch", "ray", "jax")


def test_top_level_api_is_small_and_lazy():
    """``import pollux_opt`` (in a fresh interpreter) loads no backend and no extra;
    every name of ``__all__`` resolves, the backends' entry points to their own objects."""
    assert len(pollux_opt.__all__) <= 16
    code = ("import sys, pollux_opt\n"
            f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
            "from pollux_opt import *\n"
            "from pollux_opt.backends import local, sim\n"
            "print(run_workload is local.run_workload, simulate is sim.simulate)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "True True"]


def test_a_missing_extra_is_one_line_naming_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed
    rc = main(["run", "--backend", "ray", "--workload", "mixed", "--quick", "--policy", "pollux",
               "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "pip install 'pollux-opt[ray]'" in err and "Traceback" not in err

"""The MILP written as LP and MPS files: another solver reading them finds the solver's optimum."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from solvers import InvalidProblem, solve
from solvers.milp import MODEL_FORMATS, write_model
from solvers.milp.solve import utility_sum
from solvers.testing import edge_problems, random_problem

#: Where the measured Pollux rounds live (read from there, never copied here).
ANCHORS = Path(__file__).resolve().parents[2].parent / "shared" / "anchors" / "pollux-ga-rounds"
#: Relative tolerance between the file's optimum and the solver's (both HiGHS at gap 0).
RTOL = 1e-9


def _highs_optimum(path: Path) -> float:
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return float(h.getInfo().objective_function_value)


PROBLEMS = [
    ("random_slots", random_problem(3, num_nodes=4, cpus_per_node=4, num_jobs=6)),
    ("random_layers", random_problem(4, num_nodes=4, cpus_per_node=4, num_jobs=6, interference_avoidance=False)),
    ("random_p0", random_problem(5, num_nodes=8, cpus_per_node=2, num_jobs=8, p=0.0, weighted=True)),
] + [(n, p) for n, p in edge_problems() if n in ("holes", "shared_multi_node", "invalid_current")]


@pytest.mark.parametrize("suffix", MODEL_FORMATS)
@pytest.mark.parametrize(("name", "problem"), PROBLEMS, ids=lambda v: v if isinstance(v, str) else "")
def test_highs_reading_the_written_model_finds_the_solvers_optimum(tmp_path, suffix, name, problem):
    result = solve(problem, "milp", mip_gap=0.0)
    path = write_model(problem, tmp_path / f"model{suffix}")
    assert math.isclose(_highs_optimum(path), utility_sum(problem, result.placement), rel_tol=RTOL, abs_tol=1e-9)


def test_writing_a_model_names_rows_and_variables_after_the_formulation(tmp_path):
    text = write_model(PROBLEMS[0][1], tmp_path / "model.lp").read_text()
    assert "one_choice(" in text and "flow(" in text and "y(0)" in text


def test_an_unknown_model_suffix_is_refused(tmp_path):
    with pytest.raises(InvalidProblem, match=r"suffix must be one of \('.lp', '.mps'\), got '.txt'"):
        write_model(PROBLEMS[0][1], tmp_path / "model.txt")
    with pytest.raises(InvalidProblem, match="problem must be a solvers.Problem, got dict"):
        write_model({}, tmp_path / "model.lp")


@pytest.mark.skipif(not ANCHORS.is_dir(), reason=f"measured Pollux rounds not found at {ANCHORS}")
def test_allocate_write_flag_writes_the_instances_model(tmp_path, capsys):
    from pollux_opt.cli.main import main

    path = sorted(ANCHORS.glob("*.json"))[0]
    instance = tmp_path / "instance.json"
    instance.write_text(json.dumps(json.loads(path.read_text())["instance"]))
    assert main(["allocate", str(instance), "--write", str(tmp_path / "model.mps")]) == 0
    answer = json.loads(capsys.readouterr().out)
    from pollux_opt.model import parse_instance, to_problem

    inst = parse_instance(json.loads(instance.read_text()))
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    exact = solve(problem, "milp", mip_gap=0.0)
    assert answer["status"] in ("optimal", "feasible")
    assert math.isclose(_highs_optimum(tmp_path / "model.mps"), utility_sum(problem, exact.placement), rel_tol=RTOL)

"""Field domains: what each admits, the one phrasing of their errors, and the
fields' normalisation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from pollux_opt.model import Cluster, Job, Node
from pollux_opt.model.domains import (
    NAME,
    REQUIRED,
    Boolean,
    Choice,
    Integer,
    Keyed,
    Real,
    Text,
    check,
    check_fields,
    domain_field,
)
from solvers import InvalidProblem


@pytest.mark.parametrize(
    "domain, good, bad, message",
    [
        (Integer(ge=1), [1, np.int64(7)], [0, True, 1.0, "1"], r"n must be an integer >= 1, got 0"),
        (Integer(ge=0, le=3, none=True), [None, 0, 3], [4, -1], r"n must be an integer in \[0, 3\] or None, got 4"),
        (Real(gt=0, unit="seconds"), [0.5, 2], [0, float("inf"), False], r"n must be a finite number of seconds > 0, got 0"),
        (Real(finite=False), [float("inf")], [float("nan"), True], r"n must be a number, got nan"),
        (Boolean(), [True, False], [0, 1, "true"], r"n must be true or false, got 0"),
        (Text(), ["a"], ["", None, 3], r"n must be a non-empty string, got ''"),
        (NAME, ["cifar10-0", "a.b_c"], ["-a", "a b", "a\n"], r"n must be letters, digits, '\.', '_' or '-' "
                                                              r"\(not starting with a symbol\), got '-a'"),
        (Choice((1, 2)), [1, 2], [True, 2.0, 3, "1"], r"n must be one of \[1, 2\], got True"),
        (Keyed(Real(ge=0)), [0, {"a": 1.0}], [-1, {"a": -1}], r"n must be a finite number >= 0, got -1"),
    ],
)
def test_each_domain_admits_its_values_and_names_a_bad_one(domain, good, bad, message):
    for value in good:
        assert domain.accepts(value) or value is None
        check("n", value, domain)
    for value in bad:
        assert not domain.accepts(value)
        with pytest.raises(InvalidProblem):
            check("n", value, domain)
    with pytest.raises(InvalidProblem, match=f"^{message}$"):
        check("n", bad[0], domain)


def test_a_mapping_of_a_keyed_domain_is_checked_entry_by_entry():
    with pytest.raises(InvalidProblem, match=r"^delay\['ncf'\] must be a finite number >= 0, got -1$"):
        check("delay", {"bert": 1.0, "ncf": -1}, Keyed(Real(ge=0)))
    assert check("delay", None, Keyed(Real(ge=0), none=True)) is None


def test_integers_are_returned_and_stored_as_python_ints():
    assert type(check("n", np.int32(3), Integer())) is int

    @dataclass(frozen=True)
    class Sized:
        name: str = domain_field(REQUIRED, Text())
        size: int = domain_field(1, Integer(ge=1))
        scale: float = domain_field(1, Real())

        def __post_init__(self) -> None:
            check_fields(self, prefix="sized: ")

    sized = Sized("x", np.int64(4))
    assert type(sized.size) is int and sized.size == 4 and type(sized.scale) is int
    with pytest.raises(TypeError):
        Sized()  # REQUIRED: no default
    with pytest.raises(InvalidProblem, match=r"^sized: size must be an integer >= 1, got 0$"):
        Sized("x", 0)


def test_check_fields_can_check_named_fields_only():
    @dataclass
    class Pair:
        a: int = domain_field(0, Integer(ge=0))
        b: int = domain_field(0, Integer(ge=0))

    check_fields(Pair(0, -1), names=("a",))
    with pytest.raises(InvalidProblem, match=r"^b must be an integer >= 0, got -1$"):
        check_fields(Pair(0, -1))


def test_node_and_job_ids_must_be_strings_and_counts_become_ints():
    with pytest.raises(InvalidProblem, match=r"^node id must be a non-empty string, got None$"):
        Node(None, 4)
    with pytest.raises(InvalidProblem, match=r"^job id must be a non-empty string, got None$"):
        Job(None, {(1, 1): 1.0}, max_replicas=1)
    node = Node("n0", np.int64(4))
    job = Job("a", {(1, 1): 1.0}, max_replicas=np.int64(2), placement={"n0": np.int64(1)})
    assert type(node.cpus) is int and type(job.max_replicas) is int and type(job.placement["n0"]) is int
    with pytest.raises(InvalidProblem, match=r"^num_nodes must be an integer in \[1, 2147483647\], got True$"):
        Cluster.uniform(True, 4)

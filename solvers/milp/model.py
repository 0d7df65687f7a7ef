r"""Stage 4 of the MILP: the Pyomo model over one packing graph, one named rule per constraint family.

Indices: jobs j; options o of job j(o) (:class:`~solvers.milp.options.OptionTable`),
each K_o replicas on a node count in [lo_o, hi_o] of node type t_o; running jobs j in KEEP
whose current shape is allowed; holding nodes n with states t and arcs a of
the packing graph (:mod:`solvers.milp.packing`).

Variables
    y[o] in {0,1}   job j(o) is (re)started in option o;
    k[j] in {0,1}   running job j keeps its placement;
    z[j] in {0,1}   job j, which has some choice, holds nothing;
    g[j,m] in Z>=0  nodes on which multi-node job j puts m replicas (per multi
                    pair (j, t) with node types; with interference avoidance,
                    else its segment arcs play this role);
    h[n,t] in {0,1} holding node n is in state t;
    f[a] in Z>=0    nodes whose path uses arc a.

Constraints (one named Pyomo rule each)
    one_choice      sum_o y[o] + k[j] + z[j] = 1
    nodes_at_least  sum_m g[j,m] >= sum_o lo_o y[o]    (== when every lo_o = hi_o)
    nodes_at_most   sum_m g[j,m] <= sum_o hi_o y[o]
    multi_replicas  sum_m m g[j,m] = sum_o K_o y[o]
    segments        sum_j g[j,m] = sum_{multi arcs a of size m} f[a]            (per type t: pairs and arcs of t)
    single_items    sum_{o: hi_o = 1, K_o = k} y[o] = sum_{item arcs a of size k} f[a]  (per type t)
    one_state       sum_t h[n,t] = 1
    residual        sum_t r_t h[n,t] + sum_j cur[j,n] k[j] = cap_n
    slot            sum_{t: l_t} h[n,t] = sum_{j multi-node in KEEP} k[j]
    flow            out - in - sum_{t entering at v} h[n,t] = non-holding nodes entering at v

With node types the rules of one multi-node job (nodes_at_least,
nodes_at_most, multi_replicas) are per multi pair (j, t) over its options of
type t, and segments and single_items are indexed (t, m) and (t, k); without
types their indices are m and k, as above.
Objective.  ``M_p = (sum_j w_j (x_j + eps)^p / W)^(1/p)`` is monotone in
``U = sum_j w_j u(x_j)`` (``u`` from :func:`solvers.utility`), and each job
takes exactly one option, keep, or nothing, each of constant ``u``, so U is
linear:

    max  U = sum_j w_j u(0) + sum_o w_j (u(s_o f_j) - u(0)) y[o] + sum_j w_j (u(s0_j) - u(0)) k[j]

with f_j the restart factor (1 for a job that holds nothing), s0_j the
speedup of the current placement.  The model states it against each job's
best offered worth ``ref_j`` instead of ``w_j u(0)`` (same optimum), so that
the value of a good solution is a sum of small numbers.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from ..problem import Problem
from .options import OptionTable, option_table
from .packing import ITEM, MULTI, PackingGraph, choosing_jobs, packing_graph
from .structure import JobSets, ModelStructure, NodeSets

__all__ = ["ModelStructure", "Terms", "build_model", "objective_coefficients", "pyomo_model", "rule_families"]


def build_model(problem: Problem, offered: np.ndarray | None = None):
    """Build the Pyomo model of ``problem`` (pure: same arguments, same model).

    Args:
        problem: the allocation problem.
        offered: bool[O] options of :func:`~solvers.milp.options.option_table`
            the model may choose (default: all of them, which makes the model
            exact on its own).

    Returns:
        (model, table, graph): the ``pyomo.environ.ConcreteModel``, the
        problem's :class:`~solvers.milp.options.OptionTable`, and the
        :class:`~solvers.milp.packing.PackingGraph` that decodes the model.
    """
    table = option_table(problem)
    offered = np.ones(table.job.size, dtype=bool) if offered is None else offered
    graph = packing_graph(problem, table, offered)
    return pyomo_model(problem, table, graph), table, graph


def pyomo_model(problem: Problem, table: OptionTable, graph: PackingGraph, structure: "ModelStructure | None" = None):
    """The Pyomo model over the options ``graph.opt`` (see the module docstring).

    ``structure`` is :meth:`ModelStructure.of` the same arguments (computed
    when None): the rules read nothing else, so models of equal structures
    differ in their objective only.

    Built with Python's garbage collector paused (Pyomo's ``PauseGC``, as its
    writers do): the many small expression objects otherwise trigger full
    collections that cost four times the build itself on 5000 columns.
    """
    import pyomo.environ as pyo
    from pyomo.common.gc_manager import PauseGC

    with PauseGC():
        s = ModelStructure.of(problem, table, graph) if structure is None else structure
        m = pyo.ConcreteModel(name="pollux_allocation")
        _add_variables(m, s)
        y, k, z, h, f = (list(getattr(m, name).values()) for name in ("y", "k", "z", "h", "f"))
        terms = Terms(y=y, k=k, z=z, g=m.g, h=h, f=f, linear=_linear, skip=pyo.Constraint.Skip)
        for name, index, rule in rule_families(s, terms):
            m.add_component(name, pyo.Constraint(index, rule=_pyomo_rule(rule)))
        coefs = objective_coefficients(problem, table, graph)
        m.U = pyo.Objective(rule=lambda m: _utility_sum(m, coefs), sense=pyo.maximize)
        return m


def _pyomo_rule(rule):
    """A rule of :func:`rule_families` as a Pyomo constraint rule (Pyomo unpacks tuple indices)."""
    return lambda m, *i: rule(i[0] if len(i) == 1 else i)


class Terms(NamedTuple):
    """What the rules read of the model's variables, and how they write a row.

    Pyomo's variables and ``LinearExpression`` for the Pyomo model; column
    tokens and a row recorder for :func:`solvers.milp.compiled.assemble`.
    """

    y: Sequence  # y[o]
    k: Sequence  # k[keep position]
    z: Sequence  # z[z position]
    g: Mapping  # g[(multi pair position, segment size)]
    h: Sequence  # h[t]
    f: Sequence  # f[a]
    linear: Callable  # linear(coefs, variables) -> an expression supporting ==, >= and <= with a number
    skip: object  # what a rule returns for an index without a row


def rule_families(s: "ModelStructure", v: Terms) -> list:
    """(name, index, rule) of every constraint family, in the model's order; ``rule(i)`` is one row."""
    return _job_rules(s.jobs, s.nodes, v) + _packing_rules(s.jobs, s.nodes, s.slots, v)


class _Objective(NamedTuple):
    """U = constant + y_coef . y + k_coef . k + z_coef . z (see the module docstring)."""

    constant: float
    y_coef: list
    k_coef: list
    z_coef: list


def objective_coefficients(problem: Problem, table: OptionTable, graph: PackingGraph) -> _Objective:
    """Coefficients against each job's best offered worth ``ref_j`` (u(0) is -1e12 at p = -4)."""
    offered_job = np.concatenate([table.job[graph.opt], table.keep])
    offered_worth = np.concatenate([table.worth[graph.opt], table.keep_worth])
    ref = table.idle_worth.copy()
    np.maximum.at(ref, offered_job, offered_worth)
    choosing = choosing_jobs(problem, table, graph)
    return _Objective(
        constant=float(ref.sum()),
        y_coef=(table.worth[graph.opt] - ref[table.job[graph.opt]]).tolist(),
        k_coef=(table.keep_worth - ref[table.keep]).tolist(),
        z_coef=(table.idle_worth[choosing] - ref[choosing]).tolist(),
    )


def _add_variables(m, s: ModelStructure) -> None:
    """The variables y, k, z, g, h, f of the module docstring, in this order."""
    import pyomo.environ as pyo

    jobs = s.jobs
    m.y = pyo.Var(range(jobs.num_opts), domain=pyo.Binary)  # job runs in option o (moved or started)
    m.k = pyo.Var(range(jobs.num_keep), domain=pyo.Binary)  # running job keeps its placement
    m.z = pyo.Var(range(jobs.num_z), domain=pyo.Binary)  # job that could run holds nothing
    count = {"domain": pyo.NonNegativeIntegers, "bounds": (0, s.num_nodes)}
    m.g = pyo.Var(jobs.seg_index, **count)  # nodes on which multi-node job i puts s replicas
    m.h = pyo.Var(range(s.num_states), domain=pyo.Binary)  # holding node is in state t
    m.f = pyo.Var(range(s.num_arcs), **count)  # nodes whose path uses arc a


def _job_rules(jobs: JobSets, nodes: NodeSets, v: "Terms") -> list:
    """Rules one_choice, nodes_at_least, nodes_at_most, multi_replicas (one row per job)."""
    y, k, z, f, g, skip = v.y, v.k, v.z, v.f, v.g, v.skip
    _linear = v.linear
    lo, hi, reps, multi_opts, fixed_nodes = jobs.lo, jobs.hi, jobs.reps, jobs.multi_opts, jobs.fixed_nodes
    z_pos, keep_pos, opts_of_job, seg_max = jobs.z_pos, jobs.keep_pos, jobs.opts_of_job, jobs.seg_max
    known = {}  # multi pair -> its segments (three rules read them)

    def segments_of(i):  # (size, variable) of multi-node job i's segments
        segs = known.get(i)
        if segs is None:
            if jobs.shared_segments:
                segs = [(s, g[i, s]) for s in range(1, seg_max[i] + 1)]
            else:
                kind = jobs.multi_type[i]
                arcs_by = nodes.arcs_by
                segs = [(s, f[a]) for s in range(1, seg_max[i] + 1) for a in arcs_by.get((MULTI, s, i, kind), ())]
            known[i] = segs
        return segs

    def one_choice(j):  # sum_o y[o] + k[j] + z[j] = 1
        at = z_pos[j]
        if at < 0:
            return skip
        terms = [y[o] for o in opts_of_job[j]]
        terms.append(z[at])
        if keep_pos[j] >= 0:
            terms.append(k[keep_pos[j]])
        return _linear([1] * len(terms), terms) == 1

    def nodes_at_least(i):  # sum_s g[j,s] >= sum_o lo_o y[o]  (= when lo = hi)
        segs, opts = [v for _, v in segments_of(i)], multi_opts[i]
        expr = _linear([1] * len(segs) + [-lo[o] for o in opts], segs + [y[o] for o in opts])
        return expr == 0 if fixed_nodes[i] else expr >= 0

    def nodes_at_most(i):  # sum_s g[j,s] <= sum_o hi_o y[o]
        if fixed_nodes[i]:
            return skip
        segs, opts = [v for _, v in segments_of(i)], multi_opts[i]
        return _linear([1] * len(segs) + [-hi[o] for o in opts], segs + [y[o] for o in opts]) <= 0

    def multi_replicas(i):  # sum_s s g[j,s] = sum_o K_o y[o]
        sizes, segs = zip(*segments_of(i))
        opts = multi_opts[i]
        return _linear(list(sizes) + [-reps[o] for o in opts], list(segs) + [y[o] for o in opts]) == 0

    return [
        ("one_choice", range(jobs.num_jobs), one_choice),
        ("nodes_at_least", range(jobs.num_multi), nodes_at_least),
        ("nodes_at_most", range(jobs.num_multi), nodes_at_most),
        ("multi_replicas", range(jobs.num_multi), multi_replicas),
    ]


def _packing_rules(jobs: JobSets, nodes: NodeSets, slots: bool, v: "Terms") -> list:
    """Rules segments, single_items, one_state, residual, slot and flow (the packing graph)."""
    y, k, h, f, g, skip = v.y, v.k, v.h, v.f, v.g, v.skip
    _linear = v.linear
    states_of_node, kept_here, arcs_by = nodes.states_of_node, nodes.kept_here, nodes.arcs_by
    state_res, state_slot, holding_capacity = nodes.state_res, nodes.state_slot, nodes.holding_capacity

    def segments(key):  # sum_j g[j,s] = sum_{multi arcs a of size s} f[a]  (of type t: key (t, s))
        t, s = key if jobs.typed else (0, key)
        gs = [g[i, s] for i in range(jobs.num_multi) if s <= jobs.seg_max[i] and jobs.multi_type[i] == t]
        arcs = arcs_by.get((MULTI, s, -1, t), ())
        return _linear([1] * len(gs) + [-1] * len(arcs), gs + [f[a] for a in arcs]) == 0

    def single_items(key):  # sum_{o: single, K_o = k} y[o] = sum_{item arcs a of size k} f[a]  (of type t)
        t, size = key if jobs.typed else (0, key)
        opts, arcs = jobs.singles_of_size[key], arcs_by.get((ITEM, size, -1, t), ())
        return _linear([1] * len(opts) + [-1] * len(arcs), [y[o] for o in opts] + [f[a] for a in arcs]) == 0

    def one_state(i):  # sum_t h[n,t] = 1
        states = states_of_node[i]
        return _linear([1] * len(states), [h[t] for t in states]) == 1

    def residual(i):  # sum_t r_t h[n,t] + sum_j cur[j,n] k[j] = cap_n
        states, kept = states_of_node[i], kept_here[i]
        coefs = [state_res[t] for t in states] + [c for _, c, _ in kept]
        terms = [h[t] for t in states] + [k[q] for q, _, _ in kept]
        return _linear(coefs, terms) == holding_capacity[i]

    def slot(i):  # sum_{t: slot taken} h[n,t] = sum_{j multi-node, kept on n} k[j]
        kept = [k[q] for q, _, multi in kept_here[i] if multi]
        if not kept:
            return skip
        taken = [h[t] for t in states_of_node[i] if state_slot[t]]
        return _linear([1] * len(taken) + [-1] * len(kept), taken + kept) == 0

    def flow(i):  # sum_{out of v} f[a] - sum_{into v} f[a] - sum_{t entering v} h[t] = free nodes at v
        vertex = nodes.vertices[i]
        outs, ins, states = nodes.arcs_out[i], nodes.arcs_in[i], nodes.states_at.get(vertex, ())
        coefs = [1] * len(outs) + [-1] * (len(ins) + len(states))
        terms = [f[a] for a in outs] + [f[a] for a in ins] + [h[t] for t in states]
        return _linear(coefs, terms) == nodes.free_supply.get(vertex, 0)

    num_holding = len(states_of_node)
    return [
        ("segments", jobs.segment_keys, segments),
        ("single_items", jobs.item_sizes, single_items),
        ("one_state", range(num_holding), one_state),
        ("residual", range(num_holding), residual),
        ("slot", range(num_holding) if slots else [], slot),
        ("flow", range(len(nodes.vertices)), flow),
    ]


def _utility_sum(m, coefs: _Objective):
    """max U = sum_j ref_j + sum_o (w u_o - ref_j) y[o] + ... k[j] + (w u(0) - ref_j) z[j]."""
    y, k, z = (list(v.values()) for v in (m.y, m.k, m.z))
    return _linear(coefs.y_coef + coefs.k_coef + coefs.z_coef, y + k + z, constant=coefs.constant)


def _linear(coefs: list, variables: list, constant: float = 0.0):
    """``constant + sum_i coefs[i] * variables[i]`` as one Pyomo ``LinearExpression``.

    Built directly from the coefficient lists: about five times faster than
    ``sum(c * v ...)``, which creates and extends an expression per term.
    """
    from pyomo.core.expr.numeric_expr import LinearExpression

    return LinearExpression(constant=constant, linear_coefs=coefs, linear_vars=variables)

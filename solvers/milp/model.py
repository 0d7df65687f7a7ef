r"""Stage 4 of the MILP: the Pyomo model over one packing graph, and its standard form.

Indices: jobs j; options o of job j(o) (:class:`~solvers.milp.options.OptionTable`),
each K_o replicas on a node count in [lo_o, hi_o]; running jobs j in KEEP
whose current shape is allowed; holding nodes n with states t and arcs a of
the packing graph (:mod:`solvers.milp.packing`).

Variables
    y[o] in {0,1}   job j(o) is (re)started in option o;
    k[j] in {0,1}   running job j keeps its placement;
    z[j] in {0,1}   job j, which has some choice, holds nothing;
    g[j,m] in Z>=0  nodes on which multi-node job j puts m replicas (with
                    interference avoidance; else its segment arcs play this role);
    h[n,t] in {0,1} holding node n is in state t;
    f[a] in Z>=0    nodes whose path uses arc a.

Constraints (one named Pyomo rule each)
    one_choice      sum_o y[o] + k[j] + z[j] = 1
    nodes_at_least  sum_m g[j,m] >= sum_o lo_o y[o]    (== when every lo_o = hi_o)
    nodes_at_most   sum_m g[j,m] <= sum_o hi_o y[o]
    multi_replicas  sum_m m g[j,m] = sum_o K_o y[o]
    segments        sum_j g[j,m] = sum_{multi arcs a of size m} f[a]
    single_items    sum_{o: hi_o = 1, K_o = k} y[o] = sum_{item arcs a of size k} f[a]
    one_state       sum_t h[n,t] = 1
    residual        sum_t r_t h[n,t] + sum_j cur[j,n] k[j] = cap_n
    slot            sum_{t: l_t} h[n,t] = sum_{j multi-node in KEEP} k[j]
    flow            out - in - sum_{t entering at v} h[n,t] = non-holding nodes entering at v

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

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..problem import Problem
from .options import OptionTable, option_table
from .packing import ITEM, MULTI, PackingGraph, choosing_jobs, groups, packing_graph

__all__ = ["StandardForm", "build_model", "pyomo_model", "standard_form"]


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


def pyomo_model(problem: Problem, table: OptionTable, graph: PackingGraph):
    """The Pyomo model over the options ``graph.opt`` (see the module docstring).

    Built with Python's garbage collector paused (Pyomo's ``PauseGC``, as its
    writers do): the many small expression objects otherwise trigger full
    collections that cost four times the build itself on 5000 columns.
    """
    import pyomo.environ as pyo
    from pyomo.common.gc_manager import PauseGC

    with PauseGC():
        jobs = _JobSets.of(problem, table, graph)
        nodes = _NodeSets.of(problem, table, graph)
        m = pyo.ConcreteModel(name="pollux_allocation")
        _add_variables(m, jobs, graph, problem.num_nodes)
        _add_job_rules(m, jobs, nodes)
        _add_packing_rules(m, jobs, nodes, graph.slots)
        coefs = _objective_coefficients(problem, table, graph)
        m.U = pyo.Objective(rule=lambda m: _utility_sum(m, coefs), sense=pyo.maximize)
        return m


@dataclass(frozen=True)
class _JobSets:
    """Job-side index lists the rules read (plain Python lists, positions into the model's variables)."""

    num_jobs: int
    num_opts: int
    num_keep: int
    num_multi: int
    keep_pos: list  # job -> position among keeps, -1 if none
    z_pos: list  # job -> position among z variables, -1 if it has no choice
    num_z: int
    opts_of_job: list  # job -> its offered options
    multi_opts: list  # multi-node job position -> its multi-node options
    fixed_nodes: list  # multi-node job position -> every option has lo = hi
    lo: list  # option -> fewest nodes
    hi: list  # option -> most nodes
    reps: list  # option -> replicas K
    seg_max: list  # multi-node job position -> largest segment on one node
    seg_index: list  # (job position, segment size) of the g variables
    shared_segments: bool  # g variables exist (segments share the multi arcs)
    item_sizes: list  # replica counts of single-node options
    singles_of_size: dict  # K -> single-node options of K replicas

    @staticmethod
    def of(problem: Problem, table: OptionTable, graph: PackingGraph) -> "_JobSets":
        o_job, o_reps, o_lo, o_hi = (a[graph.opt] for a in (table.job, table.reps, table.lo, table.hi))
        num_multi = graph.multi_jobs.size
        keep_pos = np.full(problem.num_jobs, -1, dtype=np.int64)
        keep_pos[table.keep] = np.arange(table.keep.size)
        multi_pos = np.full(problem.num_jobs, num_multi, dtype=np.int64)
        multi_pos[graph.multi_jobs] = np.arange(num_multi)
        is_multi = o_hi > 1
        multi_opts = groups(np.where(is_multi, multi_pos[o_job], num_multi), num_multi)
        seg_max = graph.seg_max.tolist()
        shared_segments = graph.slots and graph.layers > 1
        seg_index = [(i, s) for i in range(num_multi) for s in range(1, seg_max[i] + 1)]
        item_sizes = np.unique(o_reps[~is_multi]).tolist()
        choosing = choosing_jobs(problem, table, graph)
        z_pos = np.full(problem.num_jobs, -1, dtype=np.int64)
        z_pos[choosing] = np.arange(choosing.size)
        return _JobSets(
            num_jobs=problem.num_jobs,
            num_opts=graph.opt.size,
            num_keep=table.keep.size,
            num_multi=num_multi,
            keep_pos=keep_pos.tolist(),
            z_pos=z_pos.tolist(),
            num_z=choosing.size,
            opts_of_job=groups(o_job, problem.num_jobs),
            multi_opts=multi_opts,
            fixed_nodes=[bool(np.all(o_lo[o] == o_hi[o])) for o in multi_opts],
            lo=o_lo.tolist(),
            hi=o_hi.tolist(),
            reps=o_reps.tolist(),
            seg_max=seg_max,
            seg_index=seg_index if shared_segments else [],
            shared_segments=shared_segments,
            item_sizes=item_sizes,
            singles_of_size={k: np.flatnonzero(~is_multi & (o_reps == k)).tolist() for k in item_sizes},
        )


@dataclass(frozen=True)
class _NodeSets:
    """Node-side index lists the rules read: arcs by kind and vertex, node states, kept jobs."""

    arcs_by: dict  # (kind, size, job position) -> arcs
    vertices: list  # vertices with outgoing arcs, sorted
    arcs_out: list  # vertex position -> arcs leaving it
    arcs_in: list  # vertex position -> arcs entering it
    free_supply: dict  # vertex -> non-holding nodes entering there
    states_of_node: list  # holding node position -> its states
    state_res: list  # state -> residual r_t
    state_slot: list  # state -> slot taken l_t
    states_at: dict  # vertex -> states entering there
    kept_here: list  # holding node position -> (keep position, replicas there, multi-node)
    holding_capacity: list  # holding node position -> cap_n

    @staticmethod
    def of(problem: Problem, table: OptionTable, graph: PackingGraph) -> "_NodeSets":
        arcs_by = defaultdict(list)
        for a, key in enumerate(zip(graph.arc_kind.tolist(), graph.arc_size.tolist(), graph.arc_job.tolist())):
            arcs_by[key].append(a)
        vertices = np.unique(graph.arc_tail)
        head_pos = np.searchsorted(vertices, graph.arc_head)
        inside = head_pos < vertices.size
        inside[inside] = vertices[head_pos[inside]] == graph.arc_head[inside]
        state_res, state_slot = graph.state_res.tolist(), graph.state_slot.tolist()
        states_at = defaultdict(list)
        for t, (res, taken) in enumerate(zip(state_res, state_slot)):
            if res > 0:
                states_at[graph.entry(res, taken)].append(t)
        keep_multi = (table.keep_nodes > 1).tolist()
        kept_here = [
            [(q, int(problem.current[table.keep[q], n]), keep_multi[q]) for q in np.flatnonzero(column > 0).tolist()]
            for n, column in zip(graph.holding.tolist(), problem.current[table.keep][:, graph.holding].T)
        ]
        return _NodeSets(
            arcs_by=arcs_by,
            vertices=vertices.tolist(),
            arcs_out=groups(np.searchsorted(vertices, graph.arc_tail), vertices.size),
            arcs_in=groups(np.where(inside, head_pos, vertices.size), vertices.size),
            free_supply=graph.free_supply,
            states_of_node=groups(graph.state_node, graph.holding.size),
            state_res=state_res,
            state_slot=state_slot,
            states_at=states_at,
            kept_here=kept_here,
            holding_capacity=[int(problem.capacity[n]) for n in graph.holding],
        )


class _Objective(NamedTuple):
    """U = constant + y_coef . y + k_coef . k + z_coef . z (see the module docstring)."""

    constant: float
    y_coef: list
    k_coef: list
    z_coef: list


def _objective_coefficients(problem: Problem, table: OptionTable, graph: PackingGraph) -> _Objective:
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


def _add_variables(m, jobs: _JobSets, graph: PackingGraph, num_nodes: int) -> None:
    """The variables y, k, z, g, h, f of the module docstring, in this order (the column order)."""
    import pyomo.environ as pyo

    m.y = pyo.Var(range(jobs.num_opts), domain=pyo.Binary)  # job runs in option o (moved or started)
    m.k = pyo.Var(range(jobs.num_keep), domain=pyo.Binary)  # running job keeps its placement
    m.z = pyo.Var(range(jobs.num_z), domain=pyo.Binary)  # job that could run holds nothing
    count = {"domain": pyo.NonNegativeIntegers, "bounds": (0, num_nodes)}
    m.g = pyo.Var(jobs.seg_index, **count)  # nodes on which multi-node job i puts s replicas
    m.h = pyo.Var(range(graph.state_node.size), domain=pyo.Binary)  # holding node is in state t
    m.f = pyo.Var(range(graph.arc_tail.size), **count)  # nodes whose path uses arc a


def _add_job_rules(m, jobs: _JobSets, nodes: _NodeSets) -> None:
    """Rules one_choice, nodes_at_least, nodes_at_most, multi_replicas (one row per job)."""
    import pyomo.environ as pyo

    y, k, z, f = (list(v.values()) for v in (m.y, m.k, m.z, m.f))
    lo, hi, reps, multi_opts, fixed_nodes = jobs.lo, jobs.hi, jobs.reps, jobs.multi_opts, jobs.fixed_nodes

    def segments_of(i):  # (size, variable) of multi-node job i's segments
        if jobs.shared_segments:
            return [(s, m.g[i, s]) for s in range(1, jobs.seg_max[i] + 1)]
        return [(s, f[a]) for s in range(1, jobs.seg_max[i] + 1) for a in nodes.arcs_by[MULTI, s, i]]

    def one_choice(m, j):  # sum_o y[o] + k[j] + z[j] = 1
        if jobs.z_pos[j] < 0:
            return pyo.Constraint.Skip
        terms = [y[o] for o in jobs.opts_of_job[j]] + [z[jobs.z_pos[j]]]
        terms += [k[jobs.keep_pos[j]]] if jobs.keep_pos[j] >= 0 else []
        return _linear([1] * len(terms), terms) == 1

    def nodes_at_least(m, i):  # sum_s g[j,s] >= sum_o lo_o y[o]  (= when lo = hi)
        segs, opts = [v for _, v in segments_of(i)], multi_opts[i]
        expr = _linear([1] * len(segs) + [-lo[o] for o in opts], segs + [y[o] for o in opts])
        return expr == 0 if fixed_nodes[i] else expr >= 0

    def nodes_at_most(m, i):  # sum_s g[j,s] <= sum_o hi_o y[o]
        if fixed_nodes[i]:
            return pyo.Constraint.Skip
        segs, opts = [v for _, v in segments_of(i)], multi_opts[i]
        return _linear([1] * len(segs) + [-hi[o] for o in opts], segs + [y[o] for o in opts]) <= 0

    def multi_replicas(m, i):  # sum_s s g[j,s] = sum_o K_o y[o]
        sizes, segs = zip(*segments_of(i))
        opts = multi_opts[i]
        return _linear(list(sizes) + [-reps[o] for o in opts], list(segs) + [y[o] for o in opts]) == 0

    m.one_choice = pyo.Constraint(range(jobs.num_jobs), rule=one_choice)
    m.nodes_at_least = pyo.Constraint(range(jobs.num_multi), rule=nodes_at_least)
    m.nodes_at_most = pyo.Constraint(range(jobs.num_multi), rule=nodes_at_most)
    m.multi_replicas = pyo.Constraint(range(jobs.num_multi), rule=multi_replicas)


def _add_packing_rules(m, jobs: _JobSets, nodes: _NodeSets, slots: bool) -> None:
    """Rules segments, single_items, one_state, residual, slot and flow (the packing graph)."""
    import pyomo.environ as pyo

    y, k, h, f = (list(v.values()) for v in (m.y, m.k, m.h, m.f))
    states_of_node, kept_here, arcs_by = nodes.states_of_node, nodes.kept_here, nodes.arcs_by

    def segments(m, s):  # sum_j g[j,s] = sum_{multi arcs a of size s} f[a]
        gs = [m.g[i, s] for i in range(jobs.num_multi) if s <= jobs.seg_max[i]]
        arcs = arcs_by[MULTI, s, -1]
        return _linear([1] * len(gs) + [-1] * len(arcs), gs + [f[a] for a in arcs]) == 0

    def single_items(m, size):  # sum_{o: single, K_o = k} y[o] = sum_{item arcs a of size k} f[a]
        opts, arcs = jobs.singles_of_size[size], arcs_by[ITEM, size, -1]
        return _linear([1] * len(opts) + [-1] * len(arcs), [y[o] for o in opts] + [f[a] for a in arcs]) == 0

    def one_state(m, i):  # sum_t h[n,t] = 1
        return _linear([1] * len(states_of_node[i]), [h[t] for t in states_of_node[i]]) == 1

    def residual(m, i):  # sum_t r_t h[n,t] + sum_j cur[j,n] k[j] = cap_n
        coefs = [nodes.state_res[t] for t in states_of_node[i]] + [c for _, c, _ in kept_here[i]]
        terms = [h[t] for t in states_of_node[i]] + [k[q] for q, _, _ in kept_here[i]]
        return _linear(coefs, terms) == nodes.holding_capacity[i]

    def slot(m, i):  # sum_{t: slot taken} h[n,t] = sum_{j multi-node, kept on n} k[j]
        kept = [k[q] for q, _, multi in kept_here[i] if multi]
        if not kept:
            return pyo.Constraint.Skip
        taken = [h[t] for t in states_of_node[i] if nodes.state_slot[t]]
        return _linear([1] * len(taken) + [-1] * len(kept), taken + kept) == 0

    def flow(m, i):  # sum_{out of v} f[a] - sum_{into v} f[a] - sum_{t entering v} h[t] = free nodes at v
        v = nodes.vertices[i]
        outs, ins, states = nodes.arcs_out[i], nodes.arcs_in[i], nodes.states_at.get(v, ())
        coefs = [1] * len(outs) + [-1] * (len(ins) + len(states))
        terms = [f[a] for a in outs] + [f[a] for a in ins] + [h[t] for t in states]
        return _linear(coefs, terms) == nodes.free_supply.get(v, 0)

    num_holding = len(states_of_node)
    m.segments = pyo.Constraint(sorted({s for _, s in jobs.seg_index}), rule=segments)
    m.single_items = pyo.Constraint(jobs.item_sizes, rule=single_items)
    m.one_state = pyo.Constraint(range(num_holding), rule=one_state)
    m.residual = pyo.Constraint(range(num_holding), rule=residual)
    m.slot = pyo.Constraint(range(num_holding) if slots else [], rule=slot)
    m.flow = pyo.Constraint(range(len(nodes.vertices)), rule=flow)


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


class StandardForm(NamedTuple):
    """A compiled model: maximise ``c @ x + offset`` s.t. ``row_lo <= A x <= row_up``, ``col_lo <= x <= col_up``."""

    c: np.ndarray  # float64[columns]
    offset: float
    A: object  # scipy.sparse csr [rows, columns]
    row_lo: np.ndarray  # float64[rows]
    row_up: np.ndarray  # float64[rows]
    col_lo: np.ndarray  # float64[columns]
    col_up: np.ndarray  # float64[columns]
    integrality: np.ndarray  # int32[columns], 1 for integer columns
    columns: list  # the Pyomo variable of each column


def standard_form(model) -> StandardForm:
    """Compile a Pyomo model to arrays with Pyomo's ``LinearStandardFormCompiler``."""
    from pyomo.common.enums import ObjectiveSense
    from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

    info = LinearStandardFormCompiler().write(model, mixed_form=True, set_sense=ObjectiveSense.maximize)
    ncol = len(info.columns)
    c = np.asarray(info.c.toarray()).reshape(-1)[:ncol] if ncol else np.zeros(0)
    offset = float(np.asarray(info.c_offset).reshape(-1)[0]) if len(info.c_offset) else 0.0
    rhs = np.asarray(info.rhs, dtype=np.float64)
    sense = np.array([mult for _, mult in info.rows], dtype=np.int64)
    row_lower = np.where(sense <= 0, rhs, -np.inf)
    row_upper = np.where(sense >= 0, rhs, np.inf)
    col_lower = np.array([v.lb if v.lb is not None else -np.inf for v in info.columns], dtype=np.float64)
    col_upper = np.array([v.ub if v.ub is not None else np.inf for v in info.columns], dtype=np.float64)
    integrality = np.array([1 if v.is_integer() else 0 for v in info.columns], dtype=np.int32)
    return StandardForm(
        c, offset, info.A.tocsr(), row_lower, row_upper, col_lower, col_upper, integrality, info.columns
    )

"""The index lists the MILP's rules read: one round's model up to its objective.

:class:`ModelStructure` holds plain Python lists (positions into the
model's variables, see :mod:`solvers.milp.model`) derived from the problem,
its option table and the round's packing graph.  The rules of
:func:`~solvers.milp.model.rule_families` read nothing else, so two rounds
with equal structures have the same variables, rows, matrix and bounds;
:meth:`ModelStructure.key` names a structure for
:class:`~solvers.milp.compiled.StructureCache`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..problem import Problem
from .options import OptionTable
from .packing import PackingGraph, choosing_jobs, entry_vertices, groups
from .states import kept_pieces

__all__ = ["JobSets", "ModelStructure", "NodeSets"]


class ModelStructure(NamedTuple):
    """Everything the model's variables and rules read: the model up to its objective.

    Two models with equal structures have the same variables, rows, matrix
    and bounds; :meth:`key` names a structure for
    :class:`~solvers.milp.compiled.StructureCache`.
    """

    jobs: "JobSets"
    nodes: "NodeSets"
    slots: bool  # interference avoidance (the slot rows)
    num_states: int  # h variables
    num_arcs: int  # f variables
    num_nodes: int  # upper bound of the g and f variables

    @staticmethod
    def of(problem: Problem, table: OptionTable, graph: PackingGraph) -> "ModelStructure":
        return ModelStructure(
            JobSets.of(problem, table, graph),
            NodeSets.of(problem, table, graph),
            bool(graph.slots),
            int(graph.state_node.size),
            int(graph.arc_tail.size),
            int(problem.num_nodes),
        )

    def key(self) -> bytes:
        """SHA-256 of the pickled structure: equal keys, equal structures (up to a hash collision)."""
        import hashlib
        import pickle

        return hashlib.sha256(pickle.dumps(tuple(self), protocol=pickle.HIGHEST_PROTOCOL)).digest()


@dataclass(frozen=True)
class JobSets:
    """Job-side index lists the rules read (plain Python lists, positions into the model's variables)."""

    num_jobs: int
    num_opts: int
    num_keep: int
    num_multi: int  # multi pairs (job, type)
    keep_pos: list  # job -> position among keeps, -1 if none
    z_pos: list  # job -> position among z variables, -1 if it has no choice
    num_z: int
    opts_of_job: list  # job -> its offered options
    multi_opts: list  # multi pair position -> its multi-node options
    fixed_nodes: list  # multi pair position -> every option has lo = hi
    lo: list  # option -> fewest nodes
    hi: list  # option -> most nodes
    reps: list  # option -> replicas K
    seg_max: list  # multi pair position -> largest segment on one node
    seg_index: list  # (multi pair position, segment size) of the g variables
    shared_segments: bool  # g variables exist (segments share the multi arcs)
    item_sizes: list  # keys of the single_items rows: K, or (type, K) with node types
    singles_of_size: dict  # item key -> single-node options of K replicas (of that type)
    multi_type: list  # multi pair position -> node type
    segment_keys: list  # keys of the segments rows: size m, or (type, m) with node types
    typed: bool  # the problem has node types (row keys carry the type)

    @staticmethod
    def of(problem: Problem, table: OptionTable, graph: PackingGraph) -> "JobSets":
        o_job, o_reps, o_lo, o_hi = (a[graph.opt] for a in (table.job, table.reps, table.lo, table.hi))
        o_type = table.type[graph.opt]
        num_multi = graph.multi_jobs.size
        keep_pos = np.full(problem.num_jobs, -1, dtype=np.int64)
        keep_pos[table.keep] = np.arange(table.keep.size)
        types = problem.num_types
        pair_key = graph.multi_jobs * types + graph.multi_type
        at = np.minimum(np.searchsorted(pair_key, o_job * types + o_type), max(num_multi - 1, 0))
        is_multi = o_hi > 1
        pair_of = np.where(is_multi, at, num_multi)
        multi_opts = groups(pair_of, num_multi)
        ranged = np.zeros(num_multi + 1, dtype=bool)  # a pair with an option of lo < hi
        np.logical_or.at(ranged, pair_of, o_lo != o_hi)
        seg_max = graph.seg_max.tolist()
        shared_segments = graph.slots and num_multi > 0
        seg_index = [(i, s) for i in range(num_multi) for s in range(1, seg_max[i] + 1)]
        typed = problem.typed
        multi_type = graph.multi_type.tolist()
        if typed:
            item_sizes = sorted(set(zip(o_type[~is_multi].tolist(), o_reps[~is_multi].tolist())))
            singles = {key: [] for key in item_sizes}
            for o in np.flatnonzero(~is_multi).tolist():
                singles[(int(o_type[o]), int(o_reps[o]))].append(o)
            segment_keys = sorted({(multi_type[i], s) for i, s in seg_index})
        else:
            item_sizes = np.unique(o_reps[~is_multi]).tolist()
            singles = {k: np.flatnonzero(~is_multi & (o_reps == k)).tolist() for k in item_sizes}
            segment_keys = sorted({s for _, s in seg_index})
        choosing = choosing_jobs(problem, table, graph)
        z_pos = np.full(problem.num_jobs, -1, dtype=np.int64)
        z_pos[choosing] = np.arange(choosing.size)
        return JobSets(
            num_jobs=problem.num_jobs,
            num_opts=graph.opt.size,
            num_keep=table.keep.size,
            num_multi=num_multi,
            keep_pos=keep_pos.tolist(),
            z_pos=z_pos.tolist(),
            num_z=choosing.size,
            opts_of_job=groups(o_job, problem.num_jobs),
            multi_opts=multi_opts,
            fixed_nodes=(~ranged[:num_multi]).tolist(),
            lo=o_lo.tolist(),
            hi=o_hi.tolist(),
            reps=o_reps.tolist(),
            seg_max=seg_max,
            seg_index=seg_index if shared_segments else [],
            shared_segments=shared_segments,
            item_sizes=item_sizes,
            singles_of_size=singles,
            multi_type=multi_type,
            segment_keys=segment_keys if shared_segments else [],
            typed=typed,
        )


@dataclass(frozen=True)
class NodeSets:
    """Node-side index lists the rules read: arcs by kind and vertex, node states, kept jobs."""

    arcs_by: dict  # (kind, size, multi pair position, type) -> arcs
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
    def of(problem: Problem, table: OptionTable, graph: PackingGraph) -> "NodeSets":
        arcs_by = defaultdict(list)
        keys = zip(graph.arc_kind.tolist(), graph.arc_size.tolist(), graph.arc_job.tolist(), graph.arc_type.tolist())
        for a, key in enumerate(keys):
            arcs_by[key].append(a)
        vertices = np.unique(graph.arc_tail)
        head_pos = np.searchsorted(vertices, graph.arc_head)
        inside = head_pos < vertices.size
        inside[inside] = vertices[head_pos[inside]] == graph.arc_head[inside]
        state_res, state_slot = graph.state_res.tolist(), graph.state_slot.tolist()
        states_at = defaultdict(list)
        entering = np.flatnonzero(graph.state_res > 0)
        at = entry_vertices(graph, graph.state_res[entering], graph.state_slot[entering], graph.state_type[entering])
        for v, t in zip(at.tolist(), entering.tolist()):
            states_at[v].append(t)
        kept_here = kept_pieces(problem, table)[1]  # of the nodes graph.holding
        return NodeSets(
            arcs_by=dict(arcs_by),
            vertices=vertices.tolist(),
            arcs_out=groups(np.searchsorted(vertices, graph.arc_tail), vertices.size),
            arcs_in=groups(np.where(inside, head_pos, vertices.size), vertices.size),
            free_supply=graph.free_supply,
            states_of_node=groups(graph.state_node, graph.holding.size),
            state_res=state_res,
            state_slot=state_slot,
            states_at=dict(states_at),
            kept_here=kept_here,
            holding_capacity=problem.capacity[graph.holding].tolist(),
        )

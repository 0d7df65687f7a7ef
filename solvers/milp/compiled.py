"""Stage 4b of the MILP: the model as arrays for HiGHS, assembled from the rules and kept per structure.

The Pyomo model of :mod:`solvers.milp.model` is the one statement of the
formulation; HiGHS takes arrays.  Building the Pyomo expressions and
compiling them back with Pyomo's ``LinearStandardFormCompiler``
(:func:`compile_model`) took about two thirds of a small solve, so the solve
path does neither: :func:`assemble` runs the very rule functions of
:func:`~solvers.milp.model.rule_families` over column tokens and writes the
arrays the compiler would write, to the bit (tests/solvers/test_compiled.py
compares the two on random, edge and restricted models).

What those arrays are depends on the round's
:class:`~solvers.milp.structure.ModelStructure` (variables, rows, matrix,
bounds) and, besides, on its objective coefficients only.
:func:`compiled_model` keeps each assembled structure in a bounded
least-recently-used :class:`StructureCache` keyed by a digest of the whole
structure (:meth:`~solvers.milp.structure.ModelStructure.key`), and on a later
round of the same structure writes that round's coefficients into the
cached columns.  One exception is checked: the compiler drops a column
without matrix entries whose objective coefficient is zero, so a cached
structure serves only coefficients that drop the same columns
(:meth:`CompiledModel.fits`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
import numpy as np

from ..problem import Problem
from .model import Terms, objective_coefficients, rule_families
from .structure import ModelStructure
from .options import OptionTable
from .packing import PackingGraph

__all__ = [
    "STRUCTURE_CACHE_SIZE",
    "VARIABLES",
    "CompiledModel",
    "StructureCache",
    "assemble",
    "compile_model",
    "compiled_model",
]

#: Names of the model's variable components (see :mod:`solvers.milp.model`).
VARIABLES = ("y", "k", "z", "g", "h", "f")

#: Structures a :class:`~solvers.milp.solve.MilpSolver` keeps by default.  A scheduler's consecutive rounds
#: repeat a few recent structures (same jobs, same placement, same offer);
#: the largest benchmark model (2048 CPUs, 1000 jobs, ~20 000 columns) takes
#: about 2 MiB compiled, so the cache stays under ~100 MiB even then.
STRUCTURE_CACHE_SIZE = 48


@dataclass(frozen=True)
class CompiledModel:
    """One round's model as arrays, and where each variable of the Pyomo model went.

    Maximise ``c @ x + offset`` s.t. ``row_lo <= A x <= row_up`` and
    ``col_lo <= x <= col_up``, ``x`` integer where ``integrality`` is 1.
    Everything but ``c`` and ``offset`` is the structure's and shared
    between the rounds that use it (never written to).
    """

    c: np.ndarray  # float64[columns]
    offset: float
    A: object  # scipy.sparse csr [rows, columns]
    row_lo: np.ndarray  # float64[rows]
    row_up: np.ndarray  # float64[rows]
    col_lo: np.ndarray  # float64[columns]
    col_up: np.ndarray  # float64[columns]
    integrality: np.ndarray  # int32[columns], 1 for integer columns
    index: dict  # variable name -> int64[entries] column of each entry (model order), -1 if compiled away
    g_keys: tuple  # keys (multi-node job position, segment size) of the g entries, in model order
    objective_only: np.ndarray  # bool[columns] the column has no matrix entry (kept by its objective coefficient)

    @property
    def num_columns(self) -> int:
        return int(self.c.size)

    @property
    def num_rows(self) -> int:
        return int(self.A.shape[0])

    def column_vector(self, values: dict) -> np.ndarray:
        """float64[num_columns] of variable values by name (``g`` a dict keyed like
        ``model.g``, missing keys 0); entries compiled away are dropped."""
        x = np.zeros(self.num_columns)
        for name in VARIABLES:
            vals = np.array([values["g"].get(key, 0.0) for key in self.g_keys]) if name == "g" else values[name]
            cols = self.index[name]
            x[cols[cols >= 0]] = np.asarray(vals, dtype=np.float64)[cols >= 0]
        return x

    def fits(self, coefs) -> bool:
        """True when the compiler, given objective ``coefs``, keeps exactly this model's columns."""
        for name, values in zip(("y", "k", "z"), (coefs.y_coef, coefs.k_coef, coefs.z_coef)):
            values = np.asarray(values, dtype=np.float64)
            cols = self.index[name]
            if np.any(values[cols < 0] != 0):
                return False  # a dropped column would now be kept
            kept = cols >= 0
            if np.any(self.objective_only[cols[kept]] & (values[kept] == 0)):
                return False  # a column kept by its coefficient alone would now be dropped
        return True

    def with_objective(self, coefs) -> "CompiledModel":
        """This structure with objective ``coefs`` (:func:`~solvers.milp.model.objective_coefficients`)."""
        c = np.zeros(self.num_columns)
        for name, values in zip(("y", "k", "z"), (coefs.y_coef, coefs.k_coef, coefs.z_coef)):
            cols = self.index[name]
            kept = cols >= 0
            c[cols[kept]] = np.asarray(values, dtype=np.float64)[kept]
        return replace(self, c=c, offset=float(coefs.constant))


class _Row:
    """A row's linear expression over column tokens, as the rules write it (``linear(coefs, tokens)``)."""

    __slots__ = ("coefs", "tokens")
    __hash__ = None

    def __init__(self, coefs, tokens) -> None:
        self.coefs, self.tokens = coefs, tokens

    def __eq__(self, rhs):
        return self, rhs, rhs

    def __ge__(self, rhs):
        return self, rhs, None

    def __le__(self, rhs):
        return self, None, rhs


_SKIP = object()


def _tokens(s: ModelStructure) -> tuple[Terms, np.ndarray]:
    """Column tokens of every variable entry (y, k, z, g, h, f in model order) and each variable's first token."""
    jobs = s.jobs
    sizes = [jobs.num_opts, jobs.num_keep, jobs.num_z, len(jobs.seg_index), s.num_states, s.num_arcs]
    base = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    y, k, z, g, h, f = (range(base[i], base[i + 1]) for i in range(len(VARIABLES)))
    g_map = dict(zip(jobs.seg_index, g))
    return Terms(y=y, k=k, z=z, g=g_map, h=h, f=f, linear=_Row, skip=_SKIP), np.asarray(base)


def assemble(s: ModelStructure, coefs) -> CompiledModel:
    """The array model of structure ``s`` with objective ``coefs``, from the rules themselves.

    Runs the rules of :func:`~solvers.milp.model.rule_families` over column
    tokens instead of Pyomo variables and writes what Pyomo's
    ``LinearStandardFormCompiler`` would (``mixed_form``, columns in the
    order the compiler meets their variables, entries merged per row, rows
    without terms and columns without entries dropped), without building
    Pyomo objects; tests/solvers/test_compiled.py pins the two equal.
    """
    terms, base = _tokens(s)
    tokens, coefs_of_rows, lengths, row_lo, row_up = [], [], [], [], []  # every row's terms end to end
    for _, index, rule in rule_families(s, terms):
        for i in index:
            row = rule(i)
            if row is _SKIP:
                continue
            expr, lo, up = row
            tokens += expr.tokens
            coefs_of_rows += expr.coefs
            lengths.append(len(expr.tokens))
            row_lo.append(lo)
            row_up.append(up)
    tok = np.asarray(tokens, dtype=np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    order = _component_order(base, tok, starts)
    rows = merged_rows(tokens, coefs_of_rows, tok, starts, (row_lo, row_up), int(base[-1]))
    return _arrays(s, coefs, base, order, rows)


def merged_rows(
    tokens: list, coefs: list, tok: np.ndarray, starts: np.ndarray, bounds: tuple, num_tokens: int
) -> tuple:
    """(indptr, columns, coefficients, row_lo, row_up) of the rows whose terms lie end to end in ``tokens``, ``coefs``.

    ``tok`` is ``tokens`` as int64, ``starts`` where each row's terms begin,
    ``bounds`` the rows' (lower, upper) bounds (None: none), tokens < ``num_tokens``.
    Each row as :func:`merge_row` makes it; rows left without terms are dropped
    (:func:`_check_constant_row`).  Rows of distinct tokens and non-zero
    coefficients (most) are taken as they are, the others merged one by one.
    """
    row_lo = np.array([-np.inf if b is None else b for b in bounds[0]], dtype=np.float64)
    row_up = np.array([np.inf if b is None else b for b in bounds[1]], dtype=np.float64)
    num_rows = starts.size
    lengths = np.diff(np.append(starts, tok.size))
    row = np.repeat(np.arange(num_rows), lengths)
    val = np.asarray(coefs, dtype=np.float64)
    key = np.sort(row * max(num_tokens, 1) + tok)
    special = np.zeros(num_rows, dtype=bool)
    special[key[1:][key[1:] == key[:-1]] // max(num_tokens, 1)] = True  # a token twice in the row
    special[row[val == 0]] = True
    special[lengths == 0] = True
    if not special.any():
        return np.append(0, np.cumsum(lengths)), tok, val, row_lo, row_up
    plain = ~special[row]
    merged_row, merged_tok, merged_val = [], [], []  # the special rows' terms, merged
    ends = np.append(starts, tok.size).tolist()
    for r in np.flatnonzero(special).tolist():
        lo, hi = ends[r], ends[r + 1]
        row_cols, row_vals = merge_row(coefs[lo:hi], tokens[lo:hi])
        if not row_cols:
            _check_constant_row(bounds[0][r], bounds[1][r])
        merged_row += [r] * len(row_cols)
        merged_tok += row_cols
        merged_val += row_vals
    row = np.concatenate([row[plain], np.asarray(merged_row, dtype=np.int64)])
    tok = np.concatenate([tok[plain], np.asarray(merged_tok, dtype=np.int64)])
    val = np.concatenate([val[plain], np.asarray(merged_val, dtype=np.float64)])
    by = np.argsort(row, kind="stable")  # a row's terms come from one part, in their order
    count = np.bincount(row, minlength=num_rows)
    kept = count > 0
    indptr = np.append(0, np.cumsum(count[kept]))
    return indptr, tok[by], val[by], row_lo[kept], row_up[kept]


def merge_row(coefs, tokens) -> tuple:
    """(columns, coefficients) of one row: a token's entries summed, in first-met order.

    A token first met with a zero coefficient is left out there (as the compiler does).
    """
    if len(set(tokens)) == len(tokens) and all(coefs):
        return tokens, coefs  # the common row: distinct tokens, no zero coefficient
    merged: dict = {}
    for c, t in zip(coefs, tokens):
        if t in merged:
            merged[t] += c
        elif c:
            merged[t] = c
    return list(merged.keys()), list(merged.values())


def _component_order(base: np.ndarray, tokens: np.ndarray, starts: np.ndarray) -> list:
    """Variable components in the order the compiler meets them: y, k and z (the objective
    lists them first, when there are options), then the others by the first row using them,
    several first met in one row in component order.  ``tokens`` int64[T] are every row's
    tokens end to end, ``starts`` int64[rows] where each row's begin."""
    order = [0, 1, 2] if base[3] else []
    if not tokens.size:
        return order
    comp = np.searchsorted(base, tokens, side="right") - 1
    row = np.searchsorted(starts, np.arange(comp.size), side="right") - 1
    never = np.iinfo(np.int64).max
    first_row = np.full(len(VARIABLES), never, dtype=np.int64)
    np.minimum.at(first_row, comp, row)
    ranked = np.lexsort((np.arange(len(VARIABLES)), first_row)).tolist()
    return order + [c for c in ranked if first_row[c] != never and c not in order]


def _check_constant_row(lo, up) -> None:
    """A row without terms is dropped if 0 satisfies it, as Pyomo's compiler does; else the model is infeasible."""
    if (lo is not None and lo > 0) or (up is not None and up < 0):
        from pyomo.common.errors import InfeasibleConstraintException

        raise InfeasibleConstraintException("model contains a trivially infeasible constraint")


def _arrays(s: ModelStructure, coefs, base: np.ndarray, order: list, rows: tuple) -> CompiledModel:
    """The :class:`CompiledModel` of recorded ``rows`` (token columns), columns by component ``order``."""
    import scipy.sparse as sp

    indptr, cols, vals, row_lo, row_up = rows
    num_tokens = int(base[-1])
    obj = np.zeros(num_tokens)
    obj[base[0] : base[3]] = np.concatenate([np.asarray(c, dtype=np.float64) for c in coefs[1:]])
    A = sp.csr_matrix(
        (np.asarray(vals, dtype=np.float64), np.asarray(cols, dtype=np.int64), np.asarray(indptr, dtype=np.int64)),
        shape=(len(indptr) - 1, num_tokens),
    )
    A.eliminate_zeros()  # entries that cancelled within a row
    nnz = np.bincount(A.indices, minlength=num_tokens)
    active = (nnz > 0) | (obj != 0)
    token_order = np.concatenate([np.arange(base[c], base[c + 1]) for c in order] + [np.zeros(0, np.int64)])
    token_order = token_order[active[token_order]]
    column = np.full(num_tokens, -1, dtype=np.int64)
    column[token_order] = np.arange(token_order.size)
    # Every token with an entry is active: renumbering the indices is A[:, token_order], sorted per row.
    indices = column[A.indices].astype(A.indices.dtype)
    A = sp.csr_matrix((A.data, indices, A.indptr), shape=(A.shape[0], token_order.size))
    A.sort_indices()
    upper = np.full(num_tokens, float(s.num_nodes))
    upper[: base[3]] = 1.0  # y, k, z binary
    upper[base[4] : base[5]] = 1.0  # h binary
    return CompiledModel(
        c=obj[token_order],
        offset=0 + float(coefs.constant),
        A=A,
        row_lo=np.asarray(row_lo, dtype=np.float64),
        row_up=np.asarray(row_up, dtype=np.float64),
        col_lo=np.zeros(token_order.size),
        col_up=upper[token_order],
        integrality=np.ones(token_order.size, dtype=np.int32),
        index={name: column[base[i] : base[i + 1]] for i, name in enumerate(VARIABLES)},
        g_keys=tuple(s.jobs.seg_index),
        objective_only=nnz[token_order] == 0,
    )


def compile_model(model) -> CompiledModel:
    """Compile a Pyomo model of :func:`~solvers.milp.model.pyomo_model` with Pyomo's ``LinearStandardFormCompiler``."""
    from pyomo.common.enums import ObjectiveSense
    from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

    info = LinearStandardFormCompiler().write(model, mixed_form=True, set_sense=ObjectiveSense.maximize)
    columns = info.columns
    ncol = len(columns)
    rhs = np.asarray(info.rhs, dtype=np.float64)
    sense = np.array([mult for _, mult in info.rows], dtype=np.int64)
    pos = {id(v): i for i, v in enumerate(columns)}
    A = info.A.tocsr()
    return CompiledModel(
        c=np.asarray(info.c.toarray()).reshape(-1)[:ncol] if ncol else np.zeros(0),
        offset=float(np.asarray(info.c_offset).reshape(-1)[0]) if len(info.c_offset) else 0.0,
        A=A,
        row_lo=np.where(sense <= 0, rhs, -np.inf),
        row_up=np.where(sense >= 0, rhs, np.inf),
        col_lo=np.array([v.lb if v.lb is not None else -np.inf for v in columns], dtype=np.float64),
        col_up=np.array([v.ub if v.ub is not None else np.inf for v in columns], dtype=np.float64),
        integrality=np.array([1 if v.is_integer() else 0 for v in columns], dtype=np.int32),
        index={
            name: np.array([pos.get(id(v), -1) for v in getattr(model, name).values()], dtype=np.int64)
            for name in VARIABLES
        },
        g_keys=tuple(model.g.keys()),
        objective_only=np.bincount(A.indices, minlength=ncol) == 0,
    )


class StructureCache:
    """A thread-safe least-recently-used map from structure keys to compiled models.

    Args:
        maxsize: structures kept (0 keeps none: every round compiles).
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = int(maxsize)
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> CompiledModel | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: bytes, compiled: CompiledModel) -> None:
        if self.maxsize <= 0:
            return
        with self._lock:
            self._entries[key] = compiled
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


def compiled_model(
    problem: Problem, table: OptionTable, graph: PackingGraph, cache: StructureCache
) -> tuple[CompiledModel, bool]:
    """The compiled model of one round, and whether its structure came from ``cache``.

    On a miss the arrays are assembled from the rules (:func:`assemble`) and
    stored under the structure's key.  ``StructureCache(0)`` compiles every round.
    """
    from pyomo.common.gc_manager import PauseGC

    with PauseGC():  # many small lists: full collections would cost more than building them
        structure = ModelStructure.of(problem, table, graph)
    coefs = objective_coefficients(problem, table, graph)
    key = structure.key() if cache.maxsize > 0 else b""
    cached = cache.get(key) if cache.maxsize > 0 else None
    if cached is not None and cached.fits(coefs):
        return cached.with_objective(coefs), True
    compiled = assemble(structure, coefs)
    if compiled.fits(coefs):
        cache.put(key, compiled)
    return compiled, False

"""A stream-stream equi-join in SQL, read from Spark's analysed plan as the Python API's ``Join``.

    Project [Filter] Join(kind, a.k = b.k [AND ...]) side side

Each side is one declared table, under an alias, optionally in a subquery that filters it
(``FROM (SELECT * FROM events WHERE kind = 'auction') a``). The join keeps both sides' rows per
key (the global window: an incremental join) and emits joined rows as partners arrive, an outer
side's row padded with NULLs until its first partner comes (then retracted). Each result column
is computed on the side it reads, in the side's row-level SQL, and the result row is those
columns side by side.

For an inner join a condition on one side, in ``WHERE`` or ``ON``, filters that side first (the
same rows). For an outer join it does not: SQL keeps a row its ``ON`` condition rejects, padded.
So an outer join's sides are filtered in subqueries, and any other condition is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceflow_compute.dataflow.joins import JoinKind
from onceflow_compute.sql.ddl import Table
from onceflow_compute.sql.text import SqlError

KINDS = {"Inner": JoinKind.INNER, "LeftOuter": JoinKind.LEFT, "RightOuter": JoinKind.RIGHT, "FullOuter": JoinKind.FULL}


@dataclass(frozen=True)
class Side:
    table: Table
    inner_alias: str  # the name the subquery's filter reads the table by
    alias: str  # the name the join's expressions read the side by
    inner_filter: str | None  # the subquery's WHERE
    filters: tuple[str, ...]  # an inner join's conditions on this side alone
    keys: tuple[str, ...]  # this side's expression of each ON equality, in order
    outputs: tuple[tuple[int, str], ...]  # (result column's position, its SQL) computed on this side


@dataclass(frozen=True)
class JoinSpec:
    how: JoinKind
    left: Side
    right: Side
    columns: tuple[str, ...]  # the result columns, in SELECT order


def children(node: Any) -> list[Any]:
    items = node.children()
    return [items.apply(i) for i in range(items.size())]


def seq(items: Any) -> list[Any]:
    return [items.apply(i) for i in range(items.size())]


def conjuncts(condition: Any) -> list[Any]:
    if condition.nodeName() == "And":
        return [c for child in children(condition) for c in conjuncts(child)]
    return [condition]


def map_join(top: Any, where: Any | None, join: Any, tables: dict[str, Table]) -> tuple[JoinSpec, tuple[tuple[str, Any], ...]]:
    """The join, and the SELECT list as (name, expression) for the caller's type checks."""
    kind = KINDS.get(join.joinType().toString())
    if join.joinType().toString() == "Cross" or not join.condition().isDefined():
        raise SqlError("a join without ON is refused: a stream joined with no equality pairs every row with every row, forever")
    if kind is None:
        raise SqlError(f"a {join.joinType().toString()} join is not supported (JOIN, LEFT, RIGHT and FULL OUTER JOIN are)")
    sides = [_side(child, tables) for child in children(join)]
    output_sets = [child.outputSet() for child in children(join)]

    def side_of(expression: Any) -> int | None:
        """0 or 1: the side all of ``expression``'s columns come from; None: both (or none)."""
        references = seq(expression.references().toSeq())
        owners = {i for r in references for i, outputs in enumerate(output_sets) if outputs.contains(r)}
        return owners.pop() if len(owners) == 1 else None

    keys: list[list[str]] = [[], []]
    filters: list[list[str]] = [[], []]
    for condition in conjuncts(join.condition().get()):
        if condition.nodeName() == "EqualTo":
            left, right = children(condition)
            owners = (side_of(left), side_of(right))
            if owners in ((0, 1), (1, 0)):
                pair = (left, right) if owners == (0, 1) else (right, left)
                keys[0].append(pair[0].sql())
                keys[1].append(pair[1].sql())
                continue
        owner = side_of(condition)
        if owner is None or kind is not JoinKind.INNER:
            raise SqlError(_other_condition(condition, kind))
        filters[owner].append(condition.sql())
    if not keys[0]:
        raise SqlError("a join needs an equality between the two sides in ON (a.k = b.k): without one every row pairs with every row")
    if where is not None:
        for condition in conjuncts(where):
            owner = side_of(condition)
            if owner is None or kind is not JoinKind.INNER:
                raise SqlError(_other_condition(condition, kind))
            filters[owner].append(condition.sql())
    outputs: list[list[tuple[int, str]]] = [[], []]
    columns: list[str] = []
    named: list[tuple[str, Any]] = []
    for position, expression in enumerate(seq(top.projectList())):
        name, inner = (expression.name(), expression.child()) if expression.nodeName() == "Alias" else (expression.name(), expression)
        owner = side_of(inner)
        if owner is None:
            raise SqlError(f"result column {name} = {inner.sql()}: each column of a join's result is computed from one side "
                           "(a constant or an expression over both is not yet supported)")
        outputs[owner].append((position, inner.sql()))
        columns.append(name)
        named.append((name, inner))
    built = [
        Side(s.table, s.inner_alias, s.alias, s.inner_filter, tuple(filters[i]), tuple(keys[i]), tuple(outputs[i]))
        for i, s in enumerate(sides)
    ]
    return JoinSpec(kind, built[0], built[1], tuple(columns)), tuple(named)


def _other_condition(condition: Any, kind: JoinKind) -> str:
    if kind is JoinKind.INNER:
        return (f"{condition.sql()}: a join's condition is an equality between the sides, or a condition on one side; "
                "a condition over both sides is not supported")
    return (f"{condition.sql()}: an outer join keeps the rows a condition rejects (padded with NULLs), so filter a side in a "
            "subquery instead: FROM (SELECT * FROM t WHERE ...) a LEFT JOIN ...")


def _side(node: Any, tables: dict[str, Table]) -> Side:
    """``SubqueryAlias a <- [Project of columns] <- [Filter] <- SubqueryAlias t <- View``."""
    spine, at = [], node
    while at.nodeName() != "View":
        spine.append(at)
        below = children(at)
        if len(below) != 1:
            raise SqlError("a join of more than two tables, or of a join, is not yet supported")
        at = below[0]
    names = [n.nodeName() for n in spine]
    aliases = [n.alias() for n in spine if n.nodeName() == "SubqueryAlias"]
    declared = {name.lower(): t for name, t in tables.items()}
    table = declared.get(aliases[-1].lower()) if aliases else None
    if table is None:
        raise SqlError(f"a side of the join reads none of the declared tables ({', '.join(tables)})")
    inner_filter = None
    for each in spine:
        if each.nodeName() == "Filter":
            if inner_filter is not None:
                raise SqlError("one WHERE per side's subquery")
            inner_filter = each.condition().sql()
        elif each.nodeName() == "Project":
            if any(e.nodeName() != "AttributeReference" for e in seq(each.projectList())):
                raise SqlError("a side's subquery selects columns as they are (SELECT *, or names); compute in the outer SELECT")
        elif each.nodeName() != "SubqueryAlias":
            raise SqlError(f"a side of a join is a table or SELECT ... FROM table WHERE ...; this one has {each.nodeName()} ({names})")
    return Side(table, aliases[-1], aliases[0], inner_filter, (), (), ())

"""What compute ships to Spark's executors for a job: its module, and the modules of the user
combiners it folds with (which may live in packages of their own)."""

from __future__ import annotations

import pyarrow as pa

from onceflow_compute.api import Aggregation, Combine, Count
from onceflow_compute.engine.shipping import modules_to_ship


class _Distinct:
    def init(self):  # noqa: ANN201 - the Combiner protocol
        return []

    def add(self, acc, value):  # noqa: ANN001, ANN201
        return sorted(set(acc) | {value})

    def merge(self, a, b):  # noqa: ANN001, ANN201
        return sorted(set(a) | set(b))

    def result(self, acc):  # noqa: ANN001, ANN201
        return len(acc)


def _job(*combiners: object) -> Aggregation:
    return Aggregation(
        name="j", schema=pa.schema([pa.field("k", pa.string()), pa.field("v", pa.string())]), key="k",
        aggregates=(Count("count"), *(Combine("v", name=f"c{i}", combiner=c) for i, c in enumerate(combiners))),  # type: ignore[arg-type]
    )


def test_the_job_module_and_each_combiners_module_are_shipped_once() -> None:
    assert modules_to_ship("myjobs.sales", _job()) == ["myjobs.sales"]
    assert modules_to_ship("myjobs.sales", _job(_Distinct(), _Distinct())) == ["myjobs.sales", __name__]


def test_a_combiner_from_a_script_is_not_looked_up_as_a_package() -> None:
    main_combiner = type("Scripted", (_Distinct,), {"__module__": "__main__"})()
    assert modules_to_ship("myjobs.sales", _job(main_combiner)) == ["myjobs.sales"]

"""The user's job code, shipped to Spark's executors: on a cluster they run their own Python
processes that have onceflow-compute and its dependencies installed, but not the user's job
package. Built-in jobs (``onceflow_compute.jobs``) need nothing shipped."""

from __future__ import annotations

import importlib.util
import tempfile
import zipfile
from pathlib import Path

BUILTIN_PACKAGE = "onceflow_compute"


def shippable(module_name: str) -> Path | None:
    """The top-level package directory (or single-file module) that holds ``module_name``;
    None for a built-in job or a module that cannot be found."""
    top = module_name.split(".", 1)[0]
    if top == BUILTIN_PACKAGE:
        return None
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None


def modules_to_ship(job_module: str, job: object) -> list[str]:
    """The job's module, and the module of each user combiner the job folds with: a combiner
    may live in a package of its own, which the executors lack as much as the job's."""
    modules = [job_module]
    for aggregate in getattr(job, "aggregates", ()):
        combiner = getattr(aggregate, "combiner", None)
        if combiner is not None and type(combiner).__module__ not in ("__main__", "builtins"):
            modules.append(type(combiner).__module__)
    return list(dict.fromkeys(modules))


def archive(source: Path, into: Path | None = None) -> Path:
    """A single-file module as it is; a package as a zip with the package at its root, which
    Spark puts on the executors' sys.path (``addPyFile``, ``addArtifacts(pyfile=True)``)."""
    if source.is_file():
        return source
    into = into or Path(tempfile.mkdtemp(prefix="onceflow-ship-"))
    target = into / f"{source.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(source.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zipped.write(path, Path(source.name) / path.relative_to(source))
    return target

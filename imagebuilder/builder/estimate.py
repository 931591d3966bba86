"""How long a planned build's steps took when the benchmarks measured one like it (issue 61): a dry run says about
how long each step will take, labelled as an estimate and with where it was measured.

The figures are ``bench/results.json``'s (``bench/run.py`` writes it; docs/benchmarks.md shows it): a bare-metal
build from a disk image, by each engine and architecture, and the node check. A checkout has the file; an installed
package does not, and a build the benchmarks did not measure (an ISO install, a platform's VM) gets no estimate:
nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imagebuilder.core import paths
from imagebuilder.core.errors import ImageBuilderError
from imagebuilder.core.files import load_json_object

if TYPE_CHECKING:
    from imagebuilder.plan.model import BuildPlan

#: the results file, in a checkout
RESULTS = "bench/results.json"


@dataclass(frozen=True)
class Estimate:
    steps: tuple[tuple[str, float], ...]
    #: where and when it was measured: "2026-11-30 on x86_64, 2 cores (tcg)"
    measured: str

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.steps)

    def describe(self) -> str:
        parts = ", ".join(f"{step} {_span(seconds)}" for step, seconds in self.steps)
        return f"about {_span(self.total)} ({parts}): measured {self.measured}, an estimate"


def _span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def results() -> dict[str, Any] | None:
    """``bench/results.json`` of this checkout, or None (an installed package, or a file that is not the bench's)."""
    root = paths.checkout_root()
    path = root / RESULTS if root else None
    if path is None or not path.is_file():
        return None
    try:
        return load_json_object(path, "benchmark results")
    except ImageBuilderError:
        return None


def _measured(data: dict[str, Any], accelerator: object) -> str:
    return f"{data.get('date', '?')} on {data.get('machine', '?')} ({accelerator or '?'})"


def build_estimate(plan: BuildPlan, image_based: bool) -> Estimate | None:
    """The measured steps of a build like ``plan`` (a build from a disk image, ``image_based``, by its engine and
    for its architecture), or None when the benchmarks measured none like it."""
    data = results()
    if data is None or not image_based:
        return None
    section = data.get("engines") if plan.arch == "amd64" else data.get(plan.arch)
    steps = section.get(f"{plan.engine}_steps") if isinstance(section, dict) else None
    if not isinstance(steps, dict) or not all(isinstance(v, int | float) for v in steps.values()):
        return None
    accelerator = data.get("engines", {}).get("accelerator") if isinstance(data.get("engines"), dict) else None
    return Estimate(tuple((str(k), float(v)) for k, v in steps.items()), _measured(data, accelerator))


def demo_estimate() -> Estimate | None:
    """The demo's measured parts: the build (its base image reused) and the node check of the release built from
    source (the first demo also builds Kubernetes from source, which the benchmarks do not time)."""
    data = results()
    if data is None:
        return None
    e2e, nodes = data.get("e2e"), data.get("nodes")
    if not isinstance(e2e, dict) or not isinstance(nodes, dict):
        return None
    build, check = e2e.get("build_wall_s"), nodes.get("amd64_s")
    if not isinstance(build, int | float) or not isinstance(check, int | float):
        return None
    return Estimate((("build", float(build)), ("node check", float(check))), _measured(data, e2e.get("accelerator")))

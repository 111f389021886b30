"""A finished run's step time and wall time, predicted beside measured (`hpc-grpo report`), and the calibration
`report --calibrate` records from it for plan (runstate.calibration).

The prediction is what plan says for the run's frozen spec now, from the cluster's calibration of the engine if
another run recorded one, else the reference GPU run's model; a run is never predicted from its own line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpc_grpo.common.yamlio import SpecError
from hpc_grpo.config.resolve import load_frozen
from hpc_grpo.runstate import calibration, layout
from hpc_grpo.runstate.calibration import Calibration, Timing

if TYPE_CHECKING:
    from hpc_grpo.config.models import ModelShape
    from hpc_grpo.config.spec import RunSpec


@dataclass(frozen=True, slots=True)
class RunTiming:
    measured: Timing
    step_s: float | None  # predicted
    startup_s: float  # predicted (measured on this cluster, or the model's fixed start-up)
    source: str  # where the predicted step time comes from

    @property
    def wall_s(self) -> float | None:
        """Predicted training wall for the steps the run logged."""
        return None if self.step_s is None else self.startup_s + self.measured.steps * self.step_s

    def lines(self) -> list[str]:
        m = self.measured
        if self.step_s is None:
            return [f"  step time: {m.step_s:.3g} s measured (median of {m.steps} steps); no prediction "
                    f"({self.source}): `hpc-grpo report RUN --calibrate` records this run's for plan"]
        ratio = m.step_s / self.step_s
        out = [f"  step time: {m.step_s:.3g} s measured (median of {m.steps} steps), {self.step_s:.3g} s predicted "
               f"(x{ratio:.2f}; {self.source})"]
        if m.wall_s is not None and self.wall_s is not None:
            out.append(f"  training wall: {m.wall_s:.0f} s measured, {self.wall_s:.0f} s predicted "
                       f"(x{m.wall_s / self.wall_s:.2f}; start-up {self.startup_s:.0f} s predicted"
                       + (f", {m.startup_s:.0f} s measured)" if m.startup_s is not None else ")"))
        return out

    def as_dict(self) -> dict[str, object]:
        m = self.measured
        return {"measured": {"step_s": m.step_s, "startup_s": m.startup_s, "wall_s": m.wall_s, "steps": m.steps},
                "predicted": {"step_s": self.step_s, "startup_s": self.startup_s, "wall_s": self.wall_s},
                "source": self.source}


def _spec_and_shape(run_dir: Path) -> tuple[RunSpec, ModelShape | None]:
    from hpc_grpo.config.models import resolve_shape

    spec = load_frozen(layout.spec_file(run_dir))
    try:
        shape = resolve_shape(spec.recipe.model.path)
    except ValueError:
        shape = None
    return spec, shape


def run_timing(run_dir: Path) -> RunTiming | None:
    """Measured and predicted timing; None when the run logged no step time or has no readable spec."""
    from hpc_grpo.planning.cost import step_time_source
    from hpc_grpo.planning.schedule import STARTUP_S, predict_step

    measured = calibration.measure(run_dir)
    if measured is None or not layout.spec_file(run_dir).is_file():
        return None
    try:
        spec, shape = _spec_and_shape(run_dir)
    except SpecError:
        return None
    if shape is None:
        return RunTiming(measured, None, float(STARTUP_S), "the model's shape is unknown here")
    step_s, startup_s, source = predict_step(spec, shape, exclude_run=run_dir.name)
    if step_s is None:
        source = f"no step-time model for the {spec.recipe.engine} engine without a calibration on this cluster"
    elif not source:
        source = step_time_source(spec)
    return RunTiming(measured, step_s, float(STARTUP_S) if startup_s is None else startup_s, source)


def calibrate(run_dir: Path) -> tuple[Path, Calibration]:
    """Record the run's measured timing as its cluster's calibration for its engine. SpecError when the run has
    nothing to measure."""
    from hpc_grpo.planning.schedule import estimate_step_s

    measured = calibration.measure(run_dir)
    if measured is None:
        raise SpecError(f"{run_dir} has no step time in its metrics: calibrate from a run that trained some steps",
                        key="--calibrate")
    spec, shape = _spec_and_shape(run_dir)
    if shape is None:
        raise SpecError(f"the model of {run_dir} ({spec.recipe.model.path}) has no known shape here, so its step "
                        "time cannot scale to other runs: calibrate from a run whose model folder is readable",
                        key="--calibrate")
    cal = Calibration(spec.cluster.name, spec.recipe.engine, run_dir.name, calibration.today(), measured.step_s,
                      measured.startup_s, estimate_step_s(spec, shape))
    return calibration.record(spec.cluster.runs_root_path(), cal), cal

"""The simulator's forward and backward time of each layer of a model on one GPU (no tensor or
context parallelism), beside the profile's FLOPs and bytes in `partita profile`."""
from __future__ import annotations

from dataclasses import dataclass

from partita.planner.errors import PartitaError


@dataclass(frozen=True, kw_only=True)
class LayerPrediction:
    """Predicted (fwd_s, bwd_s) per layer on one GPU, or why there is none."""
    gpu: str | None = None
    times: tuple[tuple[float, float], ...] | None = None
    reason: str = ""


def predict_layers(scenario, micro_batch: int, catalog_file: str | None) -> LayerPrediction:
    """The simulator's compute model, layer by layer, on the scenario's GPU (tp = cp = 1). A model
    with no transformer dims, or a system the catalog (shipped, plus `catalog_file`) lacks, gets a
    reason instead: profiling itself needs no hardware."""
    dims = scenario.model.resolve()
    if dims is None:
        return LayerPrediction(reason="a module: model has no transformer dims for the simulator")
    try:
        from partita.planner.catalog import load_catalog
        from partita.simulator.calibration import load_calibration
        gpu = load_catalog(catalog_file).system(scenario.cluster.system).gpu
        return LayerPrediction(gpu=gpu.name, times=_layer_times(
            dims, micro_batch, scenario.training.precision, gpu, load_calibration()))
    except PartitaError as exc:
        return LayerPrediction(reason=str(exc).split(" (valid:")[0])


def _layer_times(dims, micro_batch: int, precision: str, gpu,
                 cal) -> tuple[tuple[float, float], ...]:
    from partita.planner.costmodel import layer_params
    from partita.simulator.compute import embedding_times, head_times, layer_times

    out = []
    for _, kind, _ in layer_params(dims):
        if kind == "embedding":
            t = embedding_times(dims, micro_batch, 1, False, 1, precision, gpu, cal)
        elif kind == "head":
            t = head_times(dims, micro_batch, 1, False, 1, precision, gpu, cal)
        else:
            t = layer_times(dims, micro_batch, 1, False, 1, precision, "none", gpu, cal,
                            decoder=kind == "decoder")
        out.append((t.fwd_s, t.bwd_s))
    return tuple(out)

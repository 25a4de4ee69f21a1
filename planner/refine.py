"""The plan search's last step: the ILP split of a good plan, kept where the simulator agrees.

`refine_stages(candidate, ...)` builds the plan's partition problem (planner.layergraph) on its
GPU, solves it (planner.partition: HiGHS, else CBC) and times the split with the search's
`evaluate`; the result joins the candidates, so the ranking decides between even and ILP splits.
The pipeline link is the slower of the two neighbour kinds the plan uses: NVLink/NVSwitch inside a
node, the node's network share per GPU between nodes.
"""
from __future__ import annotations

from partita.planner.candidates import layout_of
from partita.planner.errors import PartitaError
from partita.planner.layergraph import plan_problem
from partita.planner.partition import solve
from partita.planner.stages import chunk_ranges, with_default_stages


def link_bytes_per_s(system, gpus: int, pipeline: int) -> float | None:
    """Bytes/s of one pipeline send: intra-node while the whole job fits one node, else the
    node's network bandwidth shared by its GPUs (each sends to its neighbour at once); None where
    the catalog does not know the link (the split is then not refined)."""
    intra = system.intra.bytes_per_s or system.gpu.pcie_bytes_per_s
    if gpus <= system.gpus_per_node or pipeline == 1:
        return intra
    inter = system.inter.bytes_per_s
    if intra is None or inter is None:
        return None
    return min(intra, inter / system.gpus_per_node)


def refine_stages(cand, *, spec, catalog, run, time_limit_s: float = 20.0):
    """(the refined candidate or None, a line naming the solver and its status)."""
    if cand.pipeline * cand.virtual_stages <= 1:
        return None, ""
    sc = cand.scenario
    system = catalog.system(cand.system)
    t = sc.training
    link = link_bytes_per_s(system, cand.gpus, cand.pipeline)
    if link is None:
        return None, f"ILP split not used: {system.name}'s link bandwidth is not in the catalog"
    try:
        problem = plan_problem(spec.dims, t, sc.parallel, memory_bytes=system.gpu.memory_bytes,
                               peak_flops=system.gpu.peak(t.precision),
                               link_bytes_per_s=link,
                               optimize=spec.optimize, time_limit_s=time_limit_s)
        split = solve(problem)
    except PartitaError as exc:
        return None, f"ILP split not used: {exc}"
    current = tuple(tuple(r) for r in chunk_ranges(
        spec.dims.total_layers, with_default_stages(sc.parallel, spec.dims)))
    text = f"{split.solver}, {split.status}" + (f", gap {split.gap:.2%}" if split.gap else "")
    if split.ranges == current:
        return None, text + ", same split as the default"
    new = run.add(layout_of(cand), schedule=cand.schedule, virtual=cand.virtual_stages,
                  grad_reduce=cand.grad_reduce, stages=split.ranges, split=f"ilp ({text})")
    return new, text

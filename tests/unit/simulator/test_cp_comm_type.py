"""`parallel.cp_comm_type`: how context parallelism moves K and V. p2p (the default) passes blocks
around a ring beside the attention; all_gather (Llama 3's) gathers them before the attention and
reduce-scatters their gradients after it, on the critical path."""
from __future__ import annotations

import pytest
import yaml

from partita.cli import main
from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.scenario import parse_scenario
from partita.simulator.calibration import load_calibration
from partita.simulator.context import resolve
from partita.simulator.network import Group, build_topology, collective
from partita.simulator.step import simulate


def doc(**parallel) -> dict:
    d = {"name": "cp",
         "model": {"arch": "llama", "layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8,
                   "ffn_hidden": 14336,
                   "seq_len": 65536, "vocab": 32000},
         "cluster": {"system": "dgx-h100", "gpus": 32},
         "training": {"global_batch": 4, "micro_batch": 1, "precision": "bf16"},
         "parallel": {"tensor": 8, "context": 4, "data": 1, "sequence_parallel": True}}
    d["parallel"].update(parallel)
    return d


def test_it_round_trips_and_defaults_to_the_ring():
    assert parse_scenario(doc()).parallel.cp_comm_type == "p2p"
    s = parse_scenario(doc(cp_comm_type="all_gather"))
    assert s.parallel.cp_comm_type == "all_gather"
    assert s.to_dict()["parallel"]["cp_comm_type"] == "all_gather"
    assert parse_scenario(s.to_dict()) == s
    assert "cp_comm_type" not in parse_scenario(doc()).to_dict()["parallel"]


def test_the_gather_is_exposed_where_the_ring_hides_its_transfers():
    catalog = load_catalog()
    ring = simulate(parse_scenario(doc()), catalog)
    gather = simulate(parse_scenario(doc(cp_comm_type="all_gather")), catalog)
    assert gather.breakdown_s["cp_comm"] > ring.breakdown_s.get("cp_comm", 0.0)
    # per block and micro-batch (4 of them): the forward's all-gather of every rank's K and V and
    # the backward's reduce-scatter of their gradients, over the context-parallel group
    ctx = resolve(parse_scenario(doc(cp_comm_type="all_gather")), catalog)
    topo = build_topology(ctx.system, load_calibration())
    shape = ctx.placement.cp_group()
    group = Group(shape.n, shape.per_node, concurrent=shape.per_node * shape.sharing)
    kv = 2 * 2 * 1 * 65536 // 4 * 8 * 128 / 8           # K and V of a rank's tokens, one KV head
    per_block = (collective("all_gather", "auto", kv * 4, group, topo)
                 + collective("reduce_scatter", "auto", kv * 4, group, topo))
    assert gather.breakdown_s["cp_comm"] == pytest.approx(4 * 8 * per_block, rel=1e-6)


def test_without_context_parallelism_it_changes_nothing():
    """It names how context parallelism moves K and V wherever there is some: a scenario without
    it (or one `partita plan` is to choose the degree for) takes the key, at no cost."""
    catalog = load_catalog()
    one = [simulate(parse_scenario(doc(context=1, data=4, cp_comm_type=kind)), catalog)
           for kind in ("p2p", "all_gather")]
    assert one[0].step_time_s == one[1].step_time_s
    assert "cp_comm" not in one[1].breakdown_s


@pytest.mark.parametrize("parallel, message", [
    ({"cp_comm_type": "ring"}, "parallel.cp_comm_type: expected one of p2p, all_gather, got 'ring'"),
    ({"cp_comm_type": ["all_gather"]}, "parallel.cp_comm_type: expected one of p2p, all_gather, got a list"),
])
def test_a_bad_value_is_one_line_naming_the_key(tmp_path, capsys, parallel, message):
    with pytest.raises(PartitaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_scenario(doc(**parallel))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc(**parallel)))
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]

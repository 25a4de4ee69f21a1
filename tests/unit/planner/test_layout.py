"""Megatron-Core's pipeline layout strings (`parallel.layout`) and chunks without blocks."""
from __future__ import annotations

import json

import pytest
import yaml

from partita.cli import main
from partita.planner.catalog import load_catalog
from partita.planner.errors import PartitaError
from partita.planner.layout import MAX_EXPANDED, LayoutError, layout_stages, unroll
from partita.planner.scenario import parse_scenario
from partita.simulator.step import simulate

BASE = {
    "name": "t",
    "model": {"arch": "llama", "layers": 6, "hidden": 256, "heads": 8, "ffn_hidden": 704,
              "seq_len": 128, "vocab": 32000},
    "cluster": {"system": "dgx-h100", "gpus": 4},
    "training": {"global_batch": 16, "micro_batch": 1, "precision": "bf16"},
    "parallel": {"pipeline": 2, "data": 2, "schedule": "interleaved-1f1b"},
}


def doc(**parallel):
    d = json.loads(json.dumps(BASE))
    d["parallel"].update(parallel)
    return d


def test_unroll_follows_megatron():
    # megatron/core/transformer/pipeline_parallel_layer_layout.py parse_str_to_list's examples
    assert unroll("xy(ab|cd|ef)*2,pq") == "xyab|cd|efab|cd|efpq"
    assert unroll("(ab)*3") == "ababab"
    assert unroll("ab,(cd|)*2") == "abcd|cd|"
    assert unroll("(|ab)*2,cd") == "|ab|abcd"
    assert unroll("Et*3|(tt|)*2,tL") == "Ettt|tt|tt|tL"


def test_llama3_layout_one_block_per_chunk_embedding_and_head_alone():
    stages = layout_stages("E|(t|)*126,L", 16)
    assert len(stages) == 128
    assert stages[0] == (0, 0) and stages[-1] == (126, 126)
    assert all(b - a == 1 for a, b in stages[1:-1])


@pytest.mark.parametrize("text, message", [
    ("Et|m|L", "'m' (MTP layers are not modelled); valid symbols: E (the embedding)"),
    ("E|x|L", "chunk 1 ('x') has 'x'; valid symbols"),
    ("tE|L", "the embedding E must come once, first in the first chunk"),
    ("EE|tL", "the embedding E must come once"),
    ("E|t", "the head and loss L must come once, last in the last chunk"),
    ("E|t|tL", "3 chunks, not a multiple of parallel.pipeline (2)"),
    ("E|(t|)*9999999,L", f"at most {MAX_EXPANDED}"),
    ("Et*9999999|L", f"at most {MAX_EXPANDED}"),
    ("E" + "t" * 20000 + "|L", "20003 characters, at most 10000"),
])
def test_bad_layouts_say_why(text, message):
    with pytest.raises(LayoutError) as err:
        layout_stages(text, 2)
    assert message in str(err.value)


def test_scenario_layout_gives_stages_and_virtual_stages_and_round_trips():
    s = parse_scenario(doc(layout="E|ttt|ttt|L"))
    assert s.parallel.stages == ((0, 0), (0, 3), (3, 6), (6, 6))
    assert s.parallel.virtual_stages == 2
    again = parse_scenario(s.to_dict())
    assert again.parallel == s.parallel and again.to_dict()["parallel"]["layout"] == "E|ttt|ttt|L"


@pytest.mark.parametrize("parallel, message", [
    ({"layout": "E|ttt|ttt|L", "stages": [[0, 3], [3, 6]]},
     "parallel.layout: give parallel.layout or parallel.stages, not both"),
    ({"layout": "E|ttt|ttt|L", "virtual_stages": 3},
     "parallel.virtual_stages: the layout has 4 chunks, 2 per pipeline rank; virtual_stages says 3"),
    ({"layout": "E|tt|ttt|L"}, "parallel.layout has 5 transformer blocks (t), but the model has 6"),
    ({"layout": "E|(t|)*6,L", "schedule": "1f1b"},
     "parallel.virtual_stages: only for schedule interleaved-1f1b (schedule is 1f1b), got 4"),
    ({"layout": 7}, "parallel.layout: expected a Megatron-Core layout string"),
    ({"layout": "E|ttt|tttL"}, "parallel.layout: 3 chunks, not a multiple of parallel.pipeline (2)"),
    ({"stages": [[0, 3], [3, 2]], "schedule": "1f1b"},
     "0 <= start <= stop (a chunk may hold no block), got [3, 2]"),
])
def test_bad_layout_documents_name_the_key(parallel, message):
    with pytest.raises(PartitaError) as err:
        parse_scenario(doc(**parallel), origin="f.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_layout_needs_the_pipeline_size():
    d = doc(layout="E|ttt|ttt|L")
    del d["parallel"]["pipeline"]
    with pytest.raises(PartitaError, match="parallel.layout: needs parallel.pipeline"):
        parse_scenario(d)


def test_chunks_without_blocks_simulate_as_their_stages_do():
    """A layout and the same ranges given as `stages` time the same step; the embedding-only and
    head-only chunks hold no block, and taking the embedding and the head out of the block chunks
    leaves those chunks' parameters to their blocks."""
    catalog = load_catalog()
    by_layout = simulate(parse_scenario(doc(layout="E|ttt|ttt|L")), catalog)
    by_stages = simulate(parse_scenario(doc(stages=[[0, 0], [0, 3], [3, 6], [6, 6]],
                                            virtual_stages=2)), catalog)
    assert by_layout.step_time_s == by_stages.step_time_s
    even = simulate(parse_scenario(doc(virtual_stages=2)), catalog)     # Ettt-ish: 2 blocks a chunk
    assert by_layout.step_time_s != even.step_time_s
    memory = by_layout.details["stage_memory_bytes"]
    assert len(memory) == 2 and all(sum(kinds.values()) > 0 for kinds in memory)


def test_a_bad_layout_is_one_error_line_naming_file_and_key(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc(layout="E|tmt|ttt|L")))
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: parallel.layout: chunk 1")
    assert "valid symbols: E (the embedding), t (a transformer block), L" in err[0]

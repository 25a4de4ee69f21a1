"""Property: no scenario or catalog document, however malformed or hostile, gets a traceback.

Hypothesis writes scenario and catalog files (valid ones, ones with a value swapped for an extreme
or wrongly typed one, keys added or dropped, whole sections replaced, and raw hostile bytes:
binary, UTF-16, deep nesting, duplicate keys, alias bombs) and runs `partita.cli.main` in-process.
Every run must end with exit status 0, 1 or 2, no traceback (an exception escaping `main` fails
the test with its own), within a time bound, and on failure with exactly one line `error: ...`
on stderr. Memory: batches of generated scenarios also run in one subprocess under RLIMIT_AS
(and the documents that once exhausted the machine in tests/integration/cli/test_hostile_limits.py).
"""
from __future__ import annotations

import contextlib
import io
import json
import resource
import subprocess
import sys
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partita.cli import main

SCENARIO = {
    "name": "h",
    "model": {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 1000},
    "cluster": {"system": "p4d.24xlarge", "gpus": 8},
    "training": {"global_batch": 16, "micro_batch": 1, "precision": "bf16", "recompute": "none"},
    "parallel": {"tensor": 2, "pipeline": 2, "data": 2, "schedule": "1f1b"},
}
SCENARIO_KEYS = {
    "": ["name", "model", "cluster", "training", "parallel", "bogus"],
    "model": ["arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab",
              "decoder_layers", "head_dim", "preset", "hf_config", "module", "lyers"],
    "cluster": ["system", "gpus", "nodes", "gpus_per_node", "inter_node_gbps", "intra_node_gbps"],
    "training": ["global_batch", "micro_batch", "precision", "recompute", "optimizer", "framework"],
    "parallel": ["tensor", "pipeline", "data", "context", "schedule", "virtual_stages", "zero",
                 "stages", "sequence_parallel"],
}
CATALOG_GPU = {"name": "hx-gpu", "memory_gib": 16, "mem_bw_GBps": 900,
               "peak_dense_tflops": {"fp32": 15, "bf16": 120}, "pcie_unidir_GBps": 32,
               "nvlink_unidir_GBps": 150, "source": ["test"]}
CATALOG_SYSTEM = {"name": "hx-node", "kind": "onprem", "gpu": "hx-gpu", "gpus_per_node": 8,
                  "intra_node": {"kind": "nvswitch", "unidir_GBps": 150, "latency_us": 3},
                  "inter_node": {"kind": "infiniband", "nics": 4, "nic_gbps": 200, "latency_us": 5},
                  "source": ["test"]}
CATALOG_KEYS = {
    "gpus": ["name", "memory_gib", "mem_bw_GBps", "peak_dense_tflops", "measured_matmul_tflops",
             "pcie_unidir_GBps", "nvlink_unidir_GBps", "source", "memry_gib"],
    "systems": ["name", "kind", "gpu", "gpus_per_node", "intra_node", "inter_node", "price",
                "host_memory_gib", "source"],
}
MEMORY_LIMIT = 3 * 2**30    # address space of a checked subprocess (torch alone maps ~1.5 GiB)
SECONDS_PER_RUN = 20         # far above the slowest valid document here (under 1 s)

EXTREMES = [0, -1, 1, 3, 2**31, 2**63, 10**9, 100_000, 4e12, 1e30, 1.0e300, -1e-12, 1e-12, 0.5,
            "1e30", "4e12", "fp8", "fp32", "gpipe", "interleaved-1f1b", "dgx-h100", "p3.16xlarg",
            "gpt2-xl", "os:system", "sys:exit", "builtins:breakpoint", "\x00", "é" * 3, "",
            [], {}, [[0, 2], [2, 4]], [[0, 1e30]], {"model_type": "gpt2", "n_layers": 4},
            {"model_type": "gpt2", "n_layer": None}, {"model_type": "llama"}]
values = st.one_of(
    st.sampled_from(EXTREMES),
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.none(), st.booleans(),
    st.lists(st.integers(min_value=-3, max_value=10**6), max_size=3),
    st.recursive(st.integers(0, 3), lambda inner: st.lists(inner, max_size=2)
                 | st.dictionaries(st.sampled_from(["a", "b", "kind"]), inner, max_size=2),
                 max_leaves=6),
)


def edits(keys: dict[str, list[str]]):
    """A list of (section, key, value | DROP) changes to apply to a document."""
    section = st.sampled_from(sorted(keys))
    one = section.flatmap(lambda s: st.tuples(st.just(s), st.sampled_from(keys[s]),
                                              st.one_of(values, st.just(DROP))))
    return st.lists(one, min_size=0, max_size=4)


DROP = object()


def apply(doc: dict, changes) -> dict:
    doc = json.loads(json.dumps(doc))
    for section, key, value in changes:
        target = doc if section == "" else doc.get(section)
        if not isinstance(target, dict):
            continue
        if value is DROP:
            target.pop(key, None)
        else:
            target[key] = value
    return doc


def serialise(doc, form: str) -> tuple[bytes, str]:
    """(file bytes, suffix) of a document as YAML or JSON (NaN / Infinity as Python writes them)."""
    if form == "json":
        return json.dumps(doc, allow_nan=True).encode(), ".json"
    return yaml.safe_dump(doc, allow_unicode=True).encode(), ".yaml"


HOSTILE_BYTES = [
    ("[" * 5000 + "]" * 5000).encode(), b"a: " + b"[" * 200 + b"]" * 200,
    "model: {arch: gpt}\nmodel: {arch: t5}\n".encode(), yaml.safe_dump(SCENARIO).encode("utf-16"),
    b"\xff\xfe\x00\x00", b"\x00" * 64, "name: caf\xe9\n".encode("latin-1"), b"",
    b"a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + b"".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi")),
    b'{"model": {"layers": 1' + b"0" * 5000 + b"}}", b"!!python/object:os.system {}\n",
    b"--- !!binary |\n  AAAA\n",
]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`partita ARGV` in this process: (exit status, stdout, stderr); argparse's exit is status 2."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:           # argparse usage errors only
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def check_outcome(argv: list[str]) -> int:
    start = time.perf_counter()
    code, out, err = run_cli(argv)
    assert time.perf_counter() - start < SECONDS_PER_RUN, argv
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err and "Traceback" not in out
    if code == 1:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert len(lines[0]) < 2000, "one readable line"
    if code == 0:                       # a result, and no NaN or infinity in it
        assert out.strip() and "NaN" not in out and "Infinity" not in out
    return code


COMMON = settings(max_examples=80, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])


@COMMON
@given(changes=edits(SCENARIO_KEYS), form=st.sampled_from(["yaml", "json"]),
       command=st.sampled_from(["simulate", "simulate-json", "profile"]))
def test_any_scenario_document_gets_a_result_or_one_error_line(tmp_path_factory, changes, form,
                                                                command):
    data, suffix = serialise(apply(SCENARIO, changes), form)
    path = tmp_path_factory.mktemp("s") / f"s{suffix}"
    path.write_bytes(data)
    argv = {"simulate": ["simulate", str(path)], "simulate-json": ["simulate", "--json", str(path)],
            "profile": ["profile", str(path), "--json"]}[command]
    check_outcome(argv)


@settings(COMMON, max_examples=40)
@given(changes=edits(CATALOG_KEYS), form=st.sampled_from(["yaml", "json"]))
def test_any_catalog_document_gets_a_result_or_one_error_line(tmp_path_factory, changes, form):
    doc = {"gpus": [dict(CATALOG_GPU)], "systems": [dict(CATALOG_SYSTEM)]}
    for section, key, value in changes:
        entry = doc[section][0]
        if value is DROP:
            entry.pop(key, None)
        else:
            entry[key] = value
    data, suffix = serialise(doc, form)
    folder = tmp_path_factory.mktemp("c")
    path = folder / f"c{suffix}"
    path.write_bytes(data)
    scenario = folder / "s.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "cluster": {"system": "hx-node", "gpus": 8}}))
    check_outcome(["catalog", "show", "hx-node", "--catalog", str(path)])
    check_outcome(["simulate", str(scenario), "--catalog", str(path)])


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("data", HOSTILE_BYTES, ids=range(len(HOSTILE_BYTES)))
def test_hostile_bytes_get_one_error_line(tmp_path, data, suffix):
    path = tmp_path / f"f{suffix}"
    path.write_bytes(data)
    assert check_outcome(["simulate", str(path)]) == 1
    assert check_outcome(["catalog", "list", "--catalog", str(path)]) == 1


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=96), suffix=st.sampled_from([".yaml", ".json"]))
def test_random_bytes_get_a_result_or_one_error_line(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("r") / f"f{suffix}"
    path.write_bytes(data)
    check_outcome(["simulate", str(path)])


def _memory_limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(batch=st.lists(st.tuples(edits(SCENARIO_KEYS), st.sampled_from(["yaml", "json"])),
                      min_size=15, max_size=15))
def test_generated_documents_stay_within_bounded_memory(tmp_path_factory, batch):
    """A batch of generated scenarios in one `simulate --json` process under RLIMIT_AS: a result
    or one error per file, never a MemoryError or a kill."""
    folder = tmp_path_factory.mktemp("m")
    files = []
    for i, (changes, form) in enumerate(batch):
        data, suffix = serialise(apply(SCENARIO, changes), form)
        files.append(folder / f"s{i}{suffix}")
        files[-1].write_bytes(data)
    done = subprocess.run([sys.executable, "-m", "partita", "simulate", "--json", *map(str, files)],
                          capture_output=True, text=True, timeout=300, preexec_fn=_memory_limited)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["file"] for line in lines] == [str(f) for f in files]
    assert all(("error" in line) != ("step_time_s" in line) for line in lines)


def test_a_batch_of_json_simulations_gives_one_line_per_bad_file(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(SCENARIO))
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(yaml.safe_dump(SCENARIO).encode("utf-16"))
    code, out, err = run_cli(["simulate", "--json", str(good), str(bad), str(good)])
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and err == "" and len(lines) == 3
    assert lines[1] == {"file": str(bad), "error": f"{bad}: is UTF-16 text; save it as UTF-8"}
    assert "step_time_s" in lines[0] and "step_time_s" in lines[2]


@pytest.mark.parametrize("text", ["not: [closed", "model: 1\nmodel: 2\n"])
def test_yaml_problems_name_the_line(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    code, _, err = run_cli(["simulate", str(path)])
    assert code == 1 and err.startswith(f"error: {path}: invalid YAML at line ")

"""Sizes and files that once exhausted the machine or hung: each is one error line, in bounded
time and memory (the subprocess cases run under RLIMIT_AS, so an unbounded allocation fails the
test instead of the machine)."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
import yaml

from partita.cli import main

BASE = {
    "model": {"arch": "gpt", "layers": 4, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 1000},
    "cluster": {"system": "p4d.24xlarge", "gpus": 8},
    "training": {"global_batch": 16, "micro_batch": 1},
    "parallel": {"tensor": 1, "pipeline": 2, "data": 4},
}
MEMORY_LIMIT = 3 * 2**30       # address space of a checked subprocess (torch alone maps ~1.5 GiB)


def changed(section: str, key: str, value) -> dict:
    doc = json.loads(json.dumps(BASE))
    doc[section][key] = value
    return doc


def one_error(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("section, key, value, message", [
    ("model", "layers", 1e30, "model.layers: must be <= 1,024 (partita's limit), got 1e+30"),
    ("model", "hidden", 2**40, "model.hidden: must be <= 1,048,576"),
    ("training", "global_batch", 4.0e12, "training.global_batch: must be <= 16,777,216"),
    ("parallel", "pipeline", 100000, "parallel.pipeline: must be <= 4,096"),
    ("cluster", "gpus", 10**9, "cluster.gpus: must be <= 1,048,576"),
    ("cluster", "nodes", 10**9, "cluster.nodes: must be <= 131,072"),
    ("cluster", "inter_node_gbps", 1e300, "cluster.inter_node_gbps: must be <= 1e+06"),
])
def test_sizes_have_limits_named_in_the_error(tmp_path, capsys, section, key, value, message):
    doc = changed(section, key, value)
    if key == "nodes":
        del doc["cluster"]["gpus"]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    line = one_error(capsys, ["simulate", str(path)])
    assert line.startswith(f"error: {path}: ") and message in line


def test_pipeline_steps_per_step_are_bounded(tmp_path, capsys):
    doc = changed("training", "global_batch", 1 << 24)
    doc["parallel"] = {"tensor": 1, "pipeline": 8, "data": 1}
    doc["cluster"]["gpus"] = 8
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    line = one_error(capsys, ["simulate", str(path)])
    assert "more than partita's limit of 1,000,000; use a larger training.micro_batch" in line


def test_nodes_times_gpus_per_node_is_bounded(tmp_path, capsys):
    doc = json.loads(json.dumps(BASE))
    doc["cluster"] = {"system": "p4d.24xlarge", "nodes": 131072, "gpus_per_node": 1024}
    doc.pop("parallel")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = main(["simulate", str(path)])
    assert code == 1 and capsys.readouterr().err.startswith("error: ")


def test_hugging_face_sizes_are_bounded(tmp_path, capsys):
    doc = json.loads(json.dumps(BASE))
    doc["model"] = {"hf_config": {"model_type": "gpt2", "n_layer": 10**6, "n_embd": 64, "n_head": 4}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert "model.hf_config: layers = 1,000,000 is more than partita's limit of 1,024" in \
        one_error(capsys, ["simulate", str(path)])


def test_fewer_layers_than_stages_says_so(tmp_path, capsys):
    doc = changed("model", "layers", 1)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    line = one_error(capsys, ["simulate", str(path)])
    assert "exceeds the model's 1 layers" in line and "give parallel.stages" not in line


# ---- files -------------------------------------------------------------------------------------

def test_fifo_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "s.yaml"
    os.mkfifo(fifo)
    assert one_error(capsys, ["simulate", str(fifo)]) == \
        f"error: {fifo}: is a FIFO (named pipe), not a regular file (partita reads regular files only)"


def test_device_file_is_refused_unread(tmp_path, capsys):
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    assert "is a character device, not a regular file" in one_error(capsys, ["simulate", str(link)])
    assert one_error(capsys, ["simulate", "/dev/zero"]) == (
        "error: /dev/zero: is a character device, not a regular file (partita reads regular files only)")


def test_oversized_file_is_refused_before_reading(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as fh:            # sparse: no disk used
        fh.truncate(17 * 2**20)
    assert "larger than partita's limit of 16,777,216 bytes" in one_error(capsys, ["simulate", str(path)])


def test_symlink_loop_and_dangling_link_are_named(tmp_path, capsys):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    assert one_error(capsys, ["simulate", str(loop)]) == f"error: {loop}: a loop of symbolic links"
    dangling = tmp_path / "d.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    assert "which does not exist" in one_error(capsys, ["simulate", str(dangling)])
    assert "a loop of symbolic links" in one_error(capsys, ["catalog", "list", "--catalog", str(loop)])


@pytest.mark.parametrize("data, message", [
    ("caf\xe9: 1\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at line 1, column 4)"),
    (yaml.safe_dump(BASE).encode("utf-16"), "is UTF-16 text; save it as UTF-8"),
    (b"model:\x00", "a NUL byte at line 1, column 7: a binary file"),
    (b"[" * 100 + b"]" * 100, "nested deeper than partita's limit of 32 levels"),
    (b"model: 1\nmodel: 2\n", "invalid YAML at line 2: duplicate key 'model' (first at line 1)"),
])
def test_bad_text_is_one_line(tmp_path, capsys, data, message):
    path = tmp_path / "s.yaml"
    path.write_bytes(data)
    assert message in one_error(capsys, ["simulate", str(path)])


def test_duplicate_json_key(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text('{"cluster": {"gpus": 8, "gpus": 16}}')
    assert "duplicate key 'gpus'" in one_error(capsys, ["simulate", str(path)])


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_limited(argv: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partita", *argv], capture_output=True, text=True,
                          timeout=120, preexec_fn=_limited, cwd=cwd)


def test_documents_that_once_exhausted_memory_fail_in_bounded_memory(tmp_path):
    """`layers: 1e30` reached 24 GB before; now every such file is one line under 3 GiB."""
    files = []
    for name, section, key, value in [("layers", "model", "layers", 1e30),
                                      ("batch", "training", "global_batch", 4.0e12),
                                      ("pipe", "parallel", "pipeline", 100000)]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(changed(section, key, value)))
        files.append(str(path))
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefghi", "bcdefghij")))
    files.append(str(bomb))
    done = run_limited(["simulate", "--json", *files], tmp_path)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert [line["file"] for line in lines] == files and all("error" in line for line in lines)
    assert "more than 2,000,000 values" in lines[-1]["error"]

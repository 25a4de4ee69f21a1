"""`model.module` runs the user's code: last, found beside the scenario (never in the current
directory), and whatever it does (raise, SystemExit, breakpoint, return a non-module) is one
error line naming the file and the key."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from partita.cli import main

USER_CODE = """\
import sys
import torch

def seq():
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))

def quits():
    sys.exit(0)

def fails():
    raise SystemExit(3)

def stops():
    breakpoint()

def number():
    return 3

def needs(arg):
    return arg

def raises():
    raise RuntimeError("first line\\nsecond line")
"""


def scenario(folder, module: str, system: str = "p4d.24xlarge", **extra) -> str:
    doc = {"model": {"module": module, "seq_len": 8, "vocab": 50},
           "cluster": {"system": system, "gpus": 1}, "training": {"global_batch": 1, **extra}}
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.fixture
def beside(tmp_path):
    """A scenario folder holding the user's module file `hx_user_models.py`."""
    (tmp_path / "hx_user_models.py").write_text(USER_CODE)
    yield tmp_path
    sys.modules.pop("hx_user_models", None)


def one_error(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), captured
    return lines[0]


def test_module_beside_the_scenario_is_found_from_any_directory(beside, monkeypatch, capsys,
                                                                  tmp_path_factory):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    assert main(["profile", scenario(beside, "hx_user_models:seq"), "--json"]) == 0
    assert '"total_params"' in capsys.readouterr().out


@pytest.mark.parametrize("function, message", [
    ("quits", "calling 'hx_user_models:quits' raised SystemExit: exit status 0"),
    ("fails", "calling 'hx_user_models:fails' raised SystemExit: exit status 3"),
    ("stops", "'hx_user_models:stops' returned NoneType, expected a torch.nn.Module"),
    ("number", "'hx_user_models:number' returned int, expected a torch.nn.Module"),
    ("needs", "'hx_user_models:needs' must be callable with no arguments"),
    ("raises", "calling 'hx_user_models:raises' raised RuntimeError: first line"),
    ("missing", "'hx_user_models' has no function 'missing'"),
])
def test_whatever_the_code_does_is_one_line(beside, capsys, function, message):
    path = scenario(beside, f"hx_user_models:{function}")
    assert one_error(capsys, ["profile", path]) == f"error: {path}: model.module: {message}"


@pytest.mark.parametrize("target", ["os:system", "os:abort", "builtins:breakpoint", "sys:exit",
                                    "tempfile:mkdtemp", "json:dumps", "subprocess:Popen"])
def test_builtins_and_the_standard_library_are_not_called(tmp_path, capsys, target):
    path = scenario(tmp_path, target)
    assert one_error(capsys, ["profile", path]) == (
        f"error: {path}: model.module: {target!r} is part of Python's standard library, not a "
        "function that builds a torch.nn.Module")


def test_the_rest_of_the_scenario_is_checked_first(beside, capsys):
    """An unknown system or unsupported precision stops before the module is imported."""
    (beside / "hx_user_models.py").write_text("raise SystemExit('imported!')\n")
    path = scenario(beside, "hx_user_models:seq", system="p4d.24xlarg")
    assert "cluster.system: unknown system 'p4d.24xlarg'" in one_error(capsys, ["profile", path])
    path = scenario(beside, "hx_user_models:seq", system="p3.16xlarge")
    assert "training.precision: precision 'bf16' is not supported" in one_error(capsys, ["profile", path])
    assert "hx_user_models" not in sys.modules


def test_current_directory_is_not_searched(tmp_path, monkeypatch, capsys, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    (cwd / "hx_cwd_models.py").write_text(USER_CODE)
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend("")
    path = scenario(tmp_path, "hx_cwd_models:seq")
    assert "cannot import 'hx_cwd_models'" in one_error(capsys, ["profile", path])


def test_python_dash_m_does_not_import_from_the_current_directory(tmp_path):
    """`python -m partita` puts the current directory first on sys.path; partita takes it off."""
    (tmp_path / "yaml.py").write_text("raise SystemExit('the current directory was imported')\n")
    done = subprocess.run([sys.executable, "-m", "partita", "simulate", "gpt2-xl-p3", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and "step_time_s" in done.stdout, done.stderr

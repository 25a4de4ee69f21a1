"""benchmarks/plot_crossval.py: the figure of the stored leave-one-source-out predictions, and its
command line (a flag is a usage error, not a file name)."""
from __future__ import annotations

import pytest


def test_writes_the_figure_where_asked(tmp_path, capsys):
    from benchmarks import plot_crossval
    out = tmp_path / "loso.png"
    assert plot_crossval.main([str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Leave-one-source-out (" in capsys.readouterr().out


def test_an_unknown_flag_is_a_usage_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from benchmarks import plot_crossval
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        plot_crossval.main(["--out", "x.png"])
    assert exit_.value.code == 2 and "unrecognized arguments: --out" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())

"""README's two set-up commands are exactly what CI runs."""
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[3]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", setup, flags=re.S)]


def test_readme_has_two_setup_commands():
    cmds = readme_commands()
    assert len(cmds) == 2
    assert "pip install torch==2.13.0" in cmds[0] and "partita simulate" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_readme_commands_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for cmd in readme_commands():
        assert cmd in ci, f"{cmd!r} is not a line of .ci/run"

"""The README's two commands stay true: CI runs exactly the test command."""

import re

from conftest import ROOT


def commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_two_commands_and_ci_runs_the_second():
    setup_and_run, test = commands()
    assert "pip install torch==2.13.0" in setup_and_run and "mpirl launch jobs/cartpole.toml" in setup_and_run
    assert "pytest" in test
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines()

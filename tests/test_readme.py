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


def test_the_readme_links_every_docs_page_and_every_link_resolves():
    """Studies and tables live in docs/, one page per family; the README is the page a new user reads."""
    readme = (ROOT / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(f"(docs/{name})" in readme for name in pages), pages
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", path.read_text()):
            assert (path.parent / target).is_file(), f"{path.name} links {target}, which does not exist"


def test_distql_documents_what_its_semantics_do_on_sparse_rewards():
    page = " ".join((ROOT / "docs" / "distql.md").read_text().split())
    assert "**Sparse rewards.**" in page and "FrozenLake8x8-v1" in page and "`distql.epsilon = 1.0`" in page
    assert all(f"| `{variant}` | {eps}" in page for variant in ("source", "textbook") for eps in ("0.1", "1.0"))

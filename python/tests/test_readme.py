"""The Python examples of python/README.md (the section the main README carries) run as written."""

import re
import textwrap

import pytest

from conftest import REPO

README = REPO / "python" / "README.md"


def blocks():
    text = README.read_text()
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


def test_there_are_examples():
    assert len(blocks()) >= 2


@pytest.mark.parametrize("index", range(2))
def test_readme_example_runs(index):
    pytest.importorskip("torchvision")
    from deformconv.torch import restore_torchvision

    namespace = {}
    try:
        exec(compile(blocks()[index], f"{README}:python block {index}", "exec"), namespace)
        tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
        for t in tests:
            t()
        if index == 0:
            assert namespace["out"].shape == (64, 16, 14, 14)
            assert namespace["x"].grad is not None and namespace["offset"].grad is not None
        else:
            assert tests, "the Hypothesis example defines a test"
    finally:
        restore_torchvision()


def test_the_main_readme_shows_only_tested_examples():
    """README.md's Python section repeats the first example: it must be text of this file."""
    main = (REPO / "README.md").read_text()
    shown = re.findall(r"```python\n(.*?)```", main, re.S)
    assert shown, "README.md has a Python example"
    for block in shown:
        assert block in README.read_text(), block[:200]

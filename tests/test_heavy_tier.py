"""The heavy tier's list names tests that exist: a renamed test or case would otherwise drop out
of the list silently and come back into CI's time."""

import ast
import os

from conftest import heavy_tier

HERE = os.path.dirname(__file__)


def test_heavy_tier_names_existing_tests():
    ids = heavy_tier()
    assert ids
    for nodeid in sorted(ids):
        path, _, name = nodeid.partition("::")
        func = name.split("[")[0]
        full = os.path.join(HERE, path)
        assert os.path.isfile(full), nodeid
        with open(full) as f:
            tree = ast.parse(f.read())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert func in names, nodeid
        assert ("[" in name) == name.endswith("]"), nodeid

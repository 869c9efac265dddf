"""The agent keeps pandas out of its process (pyarrow would import it on the first list conversion)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from aaco.agent.cli.runner import keep_pandas_out
keep_pandas_out()
import pyarrow as pa
pa.array([1, 2]); pa.table({"x": ["a"]})
print("pandas" in sys.modules)
try:
    import pandas  # still importable on purpose: only pyarrow's opportunistic import is avoided
    print("importable")
except ImportError:
    print("not installed")
"""


def test_pyarrow_conversions_do_not_import_pandas():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=60)
    lines = out.stdout.split()
    assert lines[0] == "False"
    assert lines[1] in ("importable", "not")


def test_importing_the_agent_does_not_import_pandas():
    """Nothing converts a Python list to Arrow at import time (that would import pandas before it is kept out)."""
    modules = "aaco.agent.service, aaco.agent.cli, aaco.agent.config, aaco.analyzers.registry, aaco.agent.sources"
    check = f"import sys\nimport {modules}\nprint('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False"]

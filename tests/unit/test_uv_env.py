"""tools/uv_env.py: uv gets the package sources pip is configured with (else it goes to PyPI for a CUDA torch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import uv_env  # noqa: E402

LISTING = """global.extra-index-url='file:///a/simple file:///b/simple'
global.find-links='/opt/wheels'
global.constraint='/etc/pip/constraints.txt'
install.find-links='/srv/wheels'
:env:.index-url='https://mirror.example/simple'
global.index-url='https://pypi.org/simple'
global.timeout='60'
"""


def test_pip_precedence_env_over_install_over_global() -> None:
    got = uv_env.pip_settings(LISTING)
    assert got["find-links"] == "/srv/wheels"  # install beats global
    assert got["index-url"] == "https://mirror.example/simple"  # PIP_INDEX_URL beats a later global line
    assert got["extra-index-url"] == "file:///a/simple file:///b/simple"


def test_exports_in_uvs_names_and_separators() -> None:
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "/w1 /w2",
           "PIP_EXTRA_INDEX_URL": "file:///a/simple file:///b/simple", "PIP_TIMEOUT": "9"}
    env.pop("PIP_CONSTRAINT", None)
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "uv_env.py")], capture_output=True, text=True,
                         env=env, check=True).stdout
    lines = set(out.splitlines())
    assert "export UV_FIND_LINKS=/w1,/w2" in lines  # uv wants commas between find-links
    assert "export UV_EXTRA_INDEX_URL='file:///a/simple file:///b/simple'" in lines
    assert not any("TIMEOUT" in ln for ln in lines)  # only the package sources are passed on

"""Print `export` lines that give uv the package sources pip is configured with here.

uv reads its own settings, not pip's: on a site whose pip.conf (or PIP_* variables) names a mirror, a folder of
wheels or a constraints file, uv would otherwise go to PyPI and pick other builds (a CUDA torch of several GB where
the site pins its CPU wheel). tools/setup-env.sh evaluates the output before it installs with uv.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's setting -> (uv's variable, the separator uv expects between several values)
UV_VARIABLES = {
    "index-url": ("UV_DEFAULT_INDEX", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
}
# pip's precedence among the sections `pip config list` prints: its environment variables win
RANK = {"global": 0, "install": 1, ":env:": 2}


def pip_settings(listing: str) -> dict[str, str]:
    """The effective value of each setting in `pip config list`'s output (lines `section.name='value'`)."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in RANK and RANK[section] >= chosen.get(name, (-1, ""))[0]:
            chosen[name] = (RANK[section], value.strip().strip("'\""))
    return {name: value for name, (_, value) in chosen.items()}


def main() -> None:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=False).stdout
    for name, value in pip_settings(listing).items():
        if name in UV_VARIABLES:
            var, sep = UV_VARIABLES[name]
            print(f"export {var}={shlex.quote(sep.join(value.split()))}")


if __name__ == "__main__":
    main()

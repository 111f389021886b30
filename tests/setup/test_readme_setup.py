"""The README's Set up, as a newcomer types it: a fresh clone, a bare PATH, a fresh HOME, the README's own bash blocks
run in order in one shell. It checks the promises the README makes there: the quickstart ends with the report file
and the lines that say how to reach the command and what the demo's reward means, its console output fits on two
screens, and after the activation line `hpc-grpo` is on PATH from the clone's .venv.

Slow (a fresh .venv with torch's CPU build, lm-eval and trl from PyPI, then the 24-step tiny run: 15-30 minutes):
not in tools/run-tests.sh's phases; select it with `pytest -m readme_setup tests/setup` (needs PyPI; GSM8K from
../shared/data/gsm8k beside the checkout, as on an offline machine).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_grpo import __version__
from tests.conftest import REPO, require_gsm8k

pytestmark = pytest.mark.readme_setup

BARE_PATH = "/usr/local/bin:/usr/bin:/bin"
TWO_SCREENS = 2 * 50  # console lines the quickstart may print after its installs (pip's own output excluded)


def setup_blocks(readme: str) -> list[str]:
    """The bash blocks of the README's Set up section that a newcomer runs first: up to the tests' block."""
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [b for b in blocks if "run-tests.sh" not in b]


def test_the_setup_blocks_are_the_quickstart_then_the_activation() -> None:
    blocks = setup_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert blocks[0].strip() == "bash tools/quickstart.sh"
    assert "source .venv/bin/activate" in blocks[1] and "hpc-grpo --version" in blocks[1]


def test_readme_setup_in_a_fresh_clone_with_a_bare_path(tmp_path: Path) -> None:
    gsm8k = require_gsm8k()
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "hpc-grpo"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "shared" / "data" / "gsm8k").symlink_to(gsm8k)  # where the quickstart looks on an offline machine
    home = tmp_path / "home"
    home.mkdir()
    blocks = setup_blocks((clone / "README.md").read_text(encoding="utf-8"))
    marker = "=== hpc-grpo readme setup: after the quickstart ==="
    script = "set -euo pipefail\n" + blocks[0] + f"echo '{marker}'\n" + "".join(blocks[1:]) + "command -v hpc-grpo\n"
    env = {"PATH": BARE_PATH, "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb", "COLUMNS": "80"}
    # One stream, as a terminal shows it: hpc-grpo's status lines (the cluster it chose, ...) go to stderr.
    proc = subprocess.run(["bash", "-c", script], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=3600, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:]
    quickstart, after = proc.stdout.split(marker)
    assert f"source {clone}/.venv/bin/activate" in quickstart  # the quickstart's last lines say how to reach the CLI
    assert "what the reward means: reward 0.1 = the format bonus alone" in " ".join(quickstart.split())
    reports = list((clone / "runs").glob("tiny-gsm8k-*/report.png"))
    assert len(reports) == 1 and reports[0].stat().st_size > 0, list((clone / "runs").glob("*"))
    assert (home / "hpc-grpo-data" / "gsm8k" / "trl" / "train.jsonl").is_file()  # where Set up says data goes
    assert (home / ".cache" / "hpc-grpo" / "tiny-qwen2").is_dir()  # and the tiny model
    assert after.splitlines()[-2:] == [f"hpc-grpo {__version__}", str(clone / ".venv" / "bin" / "hpc-grpo")]
    # The run's own console: from the submit on (the installs before it are pip's).
    run_lines = quickstart[quickstart.index("cluster: local"):].splitlines()
    assert len(run_lines) <= TWO_SCREENS, "\n".join(run_lines)

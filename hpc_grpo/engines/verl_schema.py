"""Compose rendered overrides against verl's real Hydra config, where verl's YAMLs are installed.

The engine's truth beats ours: a key verl would reject at start-up is rejected here, on the
login node. Only verl's config folder is needed (`pip install --no-deps verl hydra-core
omegaconf`); `import verl` itself would pull torch and ray, so the folder is found by spec.
"""

from __future__ import annotations

import importlib.util
import re
import warnings
from pathlib import Path

from hpc_grpo.findings import Finding, error

_OVERRIDE_RE = re.compile(r"Could not override '([^']+)'")
_APPEND_RE = re.compile(r"Could not append to config\. An item is already at '([^']+)'")


def verl_config_dir() -> Path | None:
    """verl/trainer/config of the installed verl, without importing verl."""
    try:
        found = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    folder = Path(list(found.submodule_search_locations)[0]) / "trainer" / "config"
    if not folder.is_dir() or importlib.util.find_spec("hydra") is None:
        return None
    return folder


def verl_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl")
    except PackageNotFoundError:
        return None


def compose_check(config_name: str, overrides: list[str], config_dir: Path) -> list[Finding]:
    """Compose like verl's main_ppo would; each rejected key becomes an error finding naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    findings: list[Finding] = []
    remaining = list(overrides)
    # Hydra stops at the first bad key: drop it and compose again, so all are reported at once.
    for _ in range(len(overrides) + 1):
        GlobalHydra.instance().clear()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                    compose(config_name=config_name, overrides=remaining)
            return findings
        except HydraException as exc:
            text = str(exc)
            m = _OVERRIDE_RE.search(text) or _APPEND_RE.search(text)
            bad = m.group(1) if m else ""
            culprit = next((o for o in remaining if o.split("=", 1)[0].lstrip("+~") == bad), None)
            if culprit is None:
                culprit = next((o for o in remaining if o.split("=", 1)[0] in text), None)
            first_line = text.strip().splitlines()[0]
            key = bad or (culprit.split("=", 1)[0] if culprit else config_name)
            if m and _APPEND_RE.search(text):
                fix = f"use ++{bad}=... to overwrite an existing key, or drop the '+'"
            elif m:
                fix = f"check the spelling against verl's config, or use +{bad}=... to add a new key on purpose"
            else:
                fix = "see the Hydra message"
            findings.append(error(f"engine.{key}", f"verl's config rejects it: {first_line}", fix))
            if culprit is None:
                return findings
            remaining.remove(culprit)
        finally:
            GlobalHydra.instance().clear()
    return findings

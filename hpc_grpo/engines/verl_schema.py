"""Compose rendered overrides against verl's real Hydra config, where verl's YAMLs are installed.

The engine's truth beats ours: a key verl would reject at start-up is rejected here, on the
login node. Only verl's config folder is needed (`pip install --no-deps verl hydra-core
omegaconf`); `import verl` itself would pull torch and ray, so the folder is found by spec.

Speed: importing Hydra and composing costs more than all of plan's other checks together. The
composed config's key tree depends only on verl's YAMLs, so it is composed once per verl version
and config hash (sha256 of every YAML file) and cached as JSON in the user cache folder. An override
list the cached tree accepts is accepted without Hydra; anything it cannot decide (config-group
choices, interpolations, deletions, a dict replaced by a scalar) and anything it would reject goes
through the real compose, so every rejection is Hydra's own message (tests/unit/test_schema_cache.py
checks the two side by side).
"""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import importlib.util
import json
import os
import re
import warnings
from pathlib import Path

from hpc_grpo.common.atomic import write_text_atomic
from hpc_grpo.common.findings import Finding, error

_OVERRIDE_RE = re.compile(r"Could not override '([^']+)'")
_APPEND_RE = re.compile(r"Could not append to config\. An item is already at '([^']+)'")
_STRUCT_RE = re.compile(r"Key '([^']+)' is not in struct")


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


def cache_file(kind: str, config_name: str, config_dir: Path) -> Path:
    """A JSON cache in the user cache folder, keyed by verl's version, the config and its YAML files' hash."""
    digest = hashlib.sha256()
    for f in sorted(config_dir.rglob("*.yaml")):
        digest.update(str(f.relative_to(config_dir)).encode() + b"\0" + f.read_bytes() + b"\0")
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpc-grpo"
    return root / f"{kind}-{verl_version() or 'unknown'}-{config_name}-{digest.hexdigest()[:16]}.json"


def _cache_file(config_name: str, config_dir: Path) -> Path:
    return cache_file("verl-keys", config_name, config_dir)


def key_tree(config_name: str, config_dir: Path) -> dict[str, str]:
    """Every dotted path of the composed config -> "dict", "list" or "value" (cached, see the module doc)."""
    cache = _cache_file(config_name, config_dir)
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        pass
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                cfg = OmegaConf.to_container(compose(config_name=config_name), resolve=False)
    finally:
        GlobalHydra.instance().clear()
    tree: dict[str, str] = {}

    def walk(node: object, prefix: str) -> None:
        kind = "dict" if isinstance(node, dict) else "list" if isinstance(node, list) else "value"
        if prefix:
            tree[prefix] = kind
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))

    walk(cfg, "")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, json.dumps(tree))
    except OSError:
        pass  # a read-only home: compose every time
    return tree


_SIMPLE_KEY = re.compile(r"^(\+\+|\+)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*\Z")


def accepted_by_tree(overrides: list[str], tree: dict[str, str], config_dir: Path) -> bool:
    """True when Hydra would certainly accept every override (same rules as its struct-mode apply):
    `key=v` needs an existing key, `+key=v` a missing one, `++key=v` either; no parent may be a
    non-dict. A `{...}` value is never judged here: Hydra merges it into the node and checks its keys in struct mode
    (`override_config={attn_implementation:eager}` is refused there); a `[...]` value only replaces a list.
    False means "not sure": the caller composes for real."""
    groups = {p.name for p in config_dir.iterdir() if p.is_dir()}
    for item in overrides:
        key, sep, value = item.partition("=")
        shape = "dict" if value.lstrip().startswith("{") else "list" if value.lstrip().startswith("[") else "value"
        if not sep or not _SIMPLE_KEY.match(key) or "${" in value or shape == "dict":
            return False
        bare = key.lstrip("+")
        if "." not in bare and bare in groups:
            return False  # a config-group choice changes the tree itself
        parts = bare.split(".")
        for n in range(1, len(parts)):
            kind = tree.get(".".join(parts[:n]))
            if kind is None:
                break
            if kind != "dict":
                return False
        kind = tree.get(bare)
        if key.startswith("++"):
            if kind not in (None, shape):
                return False
            continue
        if key.startswith("+"):
            if kind is not None:
                return False
            continue
        if kind != shape:  # missing, or a value of another shape than the node's
            return False
    return True


def compose_check(config_name: str, overrides: list[str], config_dir: Path) -> list[Finding]:
    """Compose like verl's main_ppo would; each rejected key becomes an error finding naming it, and so does a
    `+` key that is a typo of a key verl has (Hydra adds it; verl never reads it).

    The cached key tree answers first; only what it cannot accept for sure is composed."""
    tree = key_tree(config_name, config_dir)
    typos = plus_typos(overrides, tree)
    typo_keys = {f.key for f in typos}
    rest = [o for o in overrides if f"engine.{o.split('=', 1)[0].lstrip('+')}" not in typo_keys]
    if accepted_by_tree(rest, tree, config_dir):
        return typos
    return typos + hydra_compose_check(config_name, rest, config_dir)


# A new key this close to an existing one (difflib's ratio) is taken for a typo: clip_ratio_hgh vs clip_ratio_high
# is 0.97, actr vs actor 0.89, and num_cpus beside an existing num_gpus (0.88) is flagged too (`++` adds it on
# purpose); names that merely share a stem (max_num_seqs vs max_model_len, 0.40) stay well below.
TYPO_RATIO = 0.85


def _children(tree: dict[str, str], parent: str) -> list[str]:
    depth = parent.count(".") + 1 if parent else 0
    return [k.rsplit(".", 1)[-1] for k in tree
            if k.count(".") == depth and (not parent or k.startswith(parent + "."))]


def plus_typos(overrides: list[str], tree: dict[str, str]) -> list[Finding]:
    """`+key=v` (adding a key verl's config lacks) where a key verl has differs by a letter or two at the first
    missing step: Hydra adds it without a word, and verl never reads it."""
    found: list[Finding] = []
    for item in overrides:
        key, _, value = item.partition("=")
        if not key.startswith("+") or key.startswith("++") or key[1:] in tree:
            continue
        parts = key[1:].split(".")
        n = next(i for i in range(len(parts) + 1) if i == len(parts) or ".".join(parts[: i + 1]) not in tree)
        parent = ".".join(parts[:n])
        if n == len(parts) or (parent and tree.get(parent) != "dict"):
            continue
        close = difflib.get_close_matches(parts[n], _children(tree, parent), n=1, cutoff=TYPO_RATIO)
        if not close:
            continue
        real = ".".join([*parts[:n], close[0], *parts[n + 1:]])
        found.append(error(
            f"engine.{key[1:]}",
            f"'{item}' adds a new key, and verl's config has '{real}' ('{parts[n]}' vs '{close[0]}'): a new key this "
            "close to an existing one is almost always a typo: Hydra adds it, and verl does not read a key it does not "
            "know, so the setting would have no effect (where verl builds a dataclass from the section, plan reports "
            "its start-up failure instead)",
            f"set {real}={value} (no '+' for an existing key); to add the new key on purpose, write "
            f"++{key[1:]}={value}"))
    return found


def closest_key(key: str, tree: dict[str, str]) -> str | None:
    """The real key a rejected one most likely meant: the closest sibling name, else the closest whole key."""
    parent, _, last = key.rpartition(".")
    close = difflib.get_close_matches(last, _children(tree, parent), n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    close = difflib.get_close_matches(key, list(tree), n=1, cutoff=0.8)
    return close[0] if close else None


def hydra_compose_check(config_name: str, overrides: list[str], config_dir: Path) -> list[Finding]:
    """The real compose (Hydra stops at the first bad key: it is dropped and composed again)."""
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
            struct = _STRUCT_RE.search(f"{text}\n{exc.__cause__ or ''}")  # Hydra chains OmegaConf's reason
            if struct:  # a {...} value with a key the node lacks: Hydra names it on a later line
                first_line += f" {struct.group(0)}"
            dict_value = culprit is not None and culprit.split("=", 1)[1].lstrip().startswith("{")
            if m and _APPEND_RE.search(text):
                fix = f"use ++{bad}=... to overwrite an existing key, or drop the '+'"
            elif m and struct and dict_value:  # the {...} value holds the key the node lacks
                fix = (f"add the new key on its own with a '+': +{bad}.{struct.group(1)}=... (one override per new key), "
                       "or check its spelling against verl's config")
            elif m:
                real = closest_key(bad, key_tree(config_name, config_dir))
                value = culprit.split("=", 1)[1] if culprit else "..."
                fix = (f"did you mean {real}={value}? To" if real else "check the spelling against verl's config; to") + \
                    f" add a new key on purpose, use +{bad}={value}"
            else:
                fix = "see the Hydra message"
            typed = f"'{culprit}': " if culprit else ""
            findings.append(error(f"engine.{key}", f"{typed}verl's config rejects it: {first_line}", fix))
            if culprit is None:
                return findings
            remaining.remove(culprit)
        finally:
            GlobalHydra.instance().clear()
    return findings


def composed_leaves(config_name: str, overrides: list[str], config_dir: Path) -> dict[str, object]:
    """The config main_ppo would run with these overrides, as dotted path -> value (lists whole, interpolations
    resolved where they resolve). Raises Hydra's error for an override verl's config refuses.

    Remembered per process: an import composes the same override sets several times (the defaults, each round of
    settling), and one composition is a second of CPU. The caller gets its own copy."""
    return copy.deepcopy(_composed_leaves(config_name, tuple(overrides), str(config_dir)))


@functools.lru_cache(maxsize=128)
def _composed_leaves(config_name: str, overrides: tuple[str, ...], config_dir: str) -> dict[str, object]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                cfg = compose(config_name=config_name, overrides=list(overrides))
        try:
            tree = OmegaConf.to_container(cfg, resolve=True)
        except Exception:  # an interpolation that needs verl's runtime resolvers: compare it unresolved
            tree = OmegaConf.to_container(cfg, resolve=False)
    finally:
        GlobalHydra.instance().clear()
    leaves: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            leaves[prefix] = node

    walk(tree, "")
    return leaves

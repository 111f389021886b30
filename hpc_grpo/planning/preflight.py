"""Preflight: what must hold on the real machines before a job is queued (what a GPU job otherwise finds
out minutes in, or never).

plan shows these as warnings (a login node may not see everything yet); submit makes every one an error, so a job
that would die minutes in, or pend forever, is refused with nothing queued and nothing written. Checks:
- model: a local folder has config.json and tokenizer files; a Hub id is in the local HF cache when the profile says
  compute nodes are `offline`;
- data: train/val files exist and carry the columns the engine reads (parquet footer via pyarrow, or the first jsonl
  line; never the data itself);
- runs root: exists or can be created, is writable, has room for the checkpoints kept plus one being written, says
  what the checkpoint lock uses on Lustre/NFS (from /proc/mounts: nothing is written), and for
  nodes > 1 lies under one of the profile's `shared_paths` (node-local folders such as /tmp: verl #625, every rank
  writes its own shard and the shards must meet in one folder);
- the job's interpreter: it imports what the engine's job imports (hpc_grpo.planning.interpreter; cached per
  interpreter), or says why it cannot be tried here (a container, env modules);
- Slurm (through hpc_grpo.cluster.slurm only): MaxTime, nodes with the GPUs/CPUs/memory asked (GRES), account and qos in
  sacctmgr's associations, and `sbatch --test-only` (queues nothing) for whatever else no node can satisfy.
The W&B credential check stays in plan.check_environment; no check here reads a secret's value.
"""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

from hpc_grpo.common.findings import READ_FIX, Finding, Severity, Make, cannot_read, error, has_errors, info, warning
from hpc_grpo.config.models import ModelShape
from hpc_grpo.planning.disk import check_disk
from hpc_grpo.planning.interpreter import check_interpreter
from hpc_grpo.config.spec import RunSpec


# A tokenizer is loadable from a folder with one of these sets (fast tokenizer, BPE vocab+merges, sentencepiece).
TOKENIZER_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))
# Folders that are per node on every cluster we know (the profile's shared_paths can still claim them).
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/local", "/scratch/local", "/localscratch")


def run_preflight(spec: RunSpec, shape: ModelShape | None, findings: list[Finding], for_submit: bool) -> list[Finding]:
    """plan's one call: the other checks' findings with better cluster advice, plus every preflight finding."""
    make: Make = error if for_submit else warning
    out = advise_clusters(spec, findings)
    if spec.recipe.launch.driver:
        out.append(info("launch.driver", "the engine's driver is replaced: model and data files are the replacement's "
                        "business and were not checked"))
    else:
        out += check_model(spec, make)
        out += check_data(spec, make)
    out += check_runs_root(spec, shape, make)
    out += check_interpreter(spec, make, refused=has_errors(out))
    if spec.cluster.scheduler == "slurm":
        refused = {f.key for f in findings if f.severity is Severity.ERROR}  # the profile already refuses these
        out += [f for f in check_slurm(spec, make, for_submit) if f.key not in refused]
    return out


# ------------------------------------------------------------------------------------------------------ model
def hf_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def in_hf_cache(repo_id: str) -> bool:
    """A snapshot of the model with its config.json is in the cache (what from_pretrained offline needs)."""
    snapshots = hf_cache_dir() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any((s / "config.json").is_file() for s in snapshots.iterdir())


def has_tokenizer(folder: Path) -> bool:
    return any(all((folder / f).is_file() for f in names) for names in TOKENIZER_SETS)


def check_model(spec: RunSpec, make: Make) -> list[Finding]:
    path = spec.recipe.model.path
    folder = Path(path)
    local = folder.is_absolute() or path.startswith(".") or folder.exists()
    if local:
        if not folder.exists():
            if folder.name.startswith("tiny"):
                return [info("model.path", f"{folder} does not exist yet: the job builds the tiny model there")]
            return [make("model.path", f"model folder {folder} does not exist",
                         "point model.path at a Hugging Face model folder, or download it first "
                         "(huggingface-cli download ID --local-dir DIR)")]
        missing = [] if (folder / "config.json").is_file() else ["config.json"]
        if not has_tokenizer(folder):
            missing.append("tokenizer files (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model)")
        if missing:
            return [make("model.path", f"model folder {folder} has no {' and no '.join(missing)}",
                         "copy the model's tokenizer into the folder (save_pretrained of model and tokenizer), "
                         "or point model.path at a complete folder")]
        return []
    if spec.cluster.offline and not in_hf_cache(path):
        return [make("model.path", f"{path!r} is a Hub id, compute nodes of '{spec.cluster.name}' are offline, and it "
                     f"is not in the Hugging Face cache {hf_cache_dir()}",
                     f"download it on the login node first (huggingface-cli download {path}), or set model.path to a "
                     "local folder")]
    return []


# ------------------------------------------------------------------------------------------------------- data
def read_columns(path: Path) -> tuple[list[str] | None, str]:
    """(column names, how they were read) from the file's schema, not its rows. None: unreadable or not checked."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            return None, "pyarrow is not installed, so the parquet columns were not read"
        try:
            return list(pq.read_schema(path).names), "parquet footer"
        except OSError as exc:  # pyarrow's IOError for a file it may not open
            return None, cannot_read(path, exc)
        except Exception as exc:  # pyarrow raises ArrowInvalid and OSError kinds for a broken file
            return None, f"not a readable parquet file ({exc})"
    try:
        with path.open("rb") as fh:
            first = fh.readline(1 << 20).strip()
    except OSError as exc:
        return None, cannot_read(path, exc)
    try:
        row = json.loads(first) if first else None
    except ValueError as exc:
        return None, f"its first line is not JSON ({exc})"
    if not isinstance(row, dict):
        return None, "its first line is not a JSON object"
    return list(row), "first jsonl line"


def check_data(spec: RunSpec, make: Make) -> list[Finding]:
    from hpc_grpo.engines import get_engine

    out: list[Finding] = []
    traits = get_engine(spec.recipe.engine).traits
    need = traits.data_columns
    d = spec.recipe.data
    for key, path in [(k, Path(f)) for k, files in (("train_files", d.train_list), ("val_files", d.val_list))
                      for f in files]:
        if path.is_dir():
            out.append(make(f"data.{key}", f"{path} is a folder, not a data file",
                            f"point data.{key} at the {traits.data_suffix} file "
                            "inside it"))
            continue
        if not path.is_file():
            command = "`hpc-grpo data gsm8k --out DIR`" if "gsm8k" in str(path) else \
                "the `hpc-grpo data` command of its task (`hpc-grpo data --help`)"
            out.append(make(f"data.{key}", f"{path} does not exist here",
                            f"run {command} and point data.* at its files, or fix the path"))
            continue
        cols, how = read_columns(path)
        if cols is None:
            sev = info if how.startswith("pyarrow") else make
            fix = "" if sev is info else READ_FIX if how.startswith(f"{path} cannot be read") else \
                "write it with `hpc-grpo data`"
            out.append(sev(f"data.{key}", how if how.startswith(str(path)) else f"{path}: {how}", fix))
            continue
        missing = [" or ".join(alts) for alts in need if not any(c in cols for c in alts)]
        if missing:
            out.append(make(f"data.{key}", f"{path} has no column {', '.join(missing)} needed by the "
                            f"{spec.recipe.engine} engine ({how}: {', '.join(cols) or 'none'})",
                            f"use the {traits.data_layout} files `hpc-grpo data gsm8k` writes"))
    return out


# -------------------------------------------------------------------------------------------------- runs root
def _under(path: Path, roots: list[Path]) -> Path | None:
    return next((r for r in roots if path == r or r in path.parents), None)


def node_local(path: Path) -> str | None:
    """The node-local prefix the path lies under (also $TMPDIR), or None."""
    prefixes = list(NODE_LOCAL)
    if os.environ.get("TMPDIR"):
        prefixes.append(os.environ["TMPDIR"])
    hit = _under(path, [Path(p) for p in prefixes])
    return str(hit) if hit else None


def mount_of(path: Path, mounts: Path = Path("/proc/mounts")) -> tuple[str, str, str] | None:
    """(mount point, filesystem type, options) of the mount holding `path`, from the mount table; None unread."""
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):  # the deepest; the last of equals (overmounts)
            best = (point, fields[2], fields[3])
    return best


def check_lock_filesystem(root: Path, existing: Path, mounts: Path = Path("/proc/mounts")) -> list[Finding]:
    """Say what the checkpoint lock relies on where flock may not work across nodes (Lustre, NFS). Read from
    the mount table, not probed: plan writes nothing, and the runs root may not exist yet."""
    mount = mount_of(existing, mounts)
    if mount is None:
        return []
    point, fstype, options = mount
    if fstype != "lustre" and not fstype.startswith("nfs"):
        return []
    flock = ""
    if fstype == "lustre":
        opts = options.split(",")
        flock = (", flock" if "flock" in opts else ", localflock: flock is per node" if "localflock" in opts
                 else ", no flock")
    return [info("cluster.runs_root", f"runs root {root} is on {fstype} ({point}{flock}): the run's checkpoint "
                 "lock (saves, prune, resume preparation, reader leases) is a lock file created with O_EXCL and "
                 "a lease its holder refreshes, not flock, so it holds across nodes there")]


def check_runs_root(spec: RunSpec, shape: ModelShape | None, make: Make) -> list[Finding]:
    c = spec.cluster
    root = c.runs_root_path()
    out: list[Finding] = []
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    if existing == Path("/") != root and c.scheduler != "local":
        # None of the runs root's folders is on this machine: it is the cluster's filesystem, not this one's `/`.
        return [info("cluster.runs_root", f"runs root {root}: not checked here (no folder of it exists on this "
                     "machine): whether it is writable and has room for the kept checkpoints is checked when plan "
                     "runs where the cluster's filesystems are mounted (its login node)"),
                *check_shared(spec, root, make)]
    if not existing.is_dir():
        return [make("cluster.runs_root", f"{existing} is not a folder, so {root} cannot be created",
                     "set cluster.runs_root to a folder you own")]
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "is not writable" if existing == root else f"cannot be created ({existing} is not writable)"
        return [make("cluster.runs_root", f"runs root {root} {verb}", "set cluster.runs_root to a folder you can write")]
    mount = mount_of(existing)
    out += check_disk(spec, shape, existing, make, f"{mount[0]}, {mount[1]}" if mount else "")
    out += check_lock_filesystem(root, existing)
    return out + check_shared(spec, root, make)


def check_shared(spec: RunSpec, root: Path, make: Make) -> list[Finding]:
    """A multi-node run's runs root must be a folder every node sees (the profile's shared_paths), not node-local."""
    c, r = spec.cluster, spec.recipe
    out: list[Finding] = []
    if r.resources.nodes > 1:
        shared = c.shared_path_list()
        if _under(root, shared):
            return out
        local = node_local(root)
        listed = ", ".join(map(str, shared)) or "none"
        if local or shared:
            why = f"is under the node-local {local}" if local else "is not under the profile's shared_paths"
            out.append(make("cluster.runs_root", f"{r.resources.nodes} nodes, but runs root {root} {why} "
                            f"(shared: {listed}); every rank writes checkpoint shards there and they must meet in one "
                            "folder (verl #625)",
                            "set cluster.runs_root under a shared filesystem"
                            + (f" such as {shared[0]}" if shared else "") + ", or add it to the profile's shared_paths "
                            "if every node really sees it"))
        else:
            out.append(warning("cluster.runs_root", f"{r.resources.nodes} nodes, and cluster '{c.name}' names no "
                               f"shared_paths: {root} was not checked to be seen by every node",
                               "list the cluster's shared filesystems in the profile's shared_paths"))
    return out


# ------------------------------------------------------------------------------------------------------ Slurm
def _plan_talks_to_it(spec: RunSpec) -> bool:
    """plan runs the Slurm checks only where they mean something: this machine's Slurm is the profile's cluster."""
    from hpc_grpo.cluster import slurm

    return bool(spec.cluster.slurm_cluster_name) and slurm.cluster_name() == spec.cluster.slurm_cluster_name


def check_slurm(spec: RunSpec, make: Make, for_submit: bool) -> list[Finding]:
    from hpc_grpo.cluster import sbatch, slurm

    if not for_submit and not _plan_talks_to_it(spec):
        return [info("cluster", f"Slurm checks of '{spec.cluster.name}' (MaxTime, GRES, account, sbatch --test-only) "
                     "run at submit, on a machine that talks to that cluster")]
    res = spec.recipe.resources
    partition = sbatch.request(spec).partition  # the recipe's, else the profile's
    try:
        limits = slurm.partition_limits(partition)
        nodes = slurm.partition_nodes(limits.name)
    except slurm.SlurmError as exc:
        return [make("resources.partition", f"cannot ask Slurm about partition {partition or '(default)'}: {exc}",
                     "check the partition name (`sinfo -s`) and that this machine's Slurm is the right cluster "
                     "(SLURM_CONF)")]
    where = f"partition {limits.name}"
    out: list[Finding] = []
    if limits.max_time_min is not None and res.time_min > limits.max_time_min:
        out.append(make("resources.time", f"time {res.time} ({res.time_min} min) asked; {where} allows "
                        f"{limits.max_time_min} min (MaxTime)",
                        f"use resources.time<={limits.max_time_min}: the run resumes from its checkpoints after each "
                        "time limit"))
    gpus, cpus = spec.gpus_per_node, spec.cpus_per_task
    mem_mb = (res.mem_gb or 0) * 1024
    if res.nodes > limits.nodes:
        out.append(make("resources.nodes", f"{res.nodes} nodes asked; {where} has {limits.nodes}",
                        f"use resources.nodes<={limits.nodes}"))
    most_gpus, most_cpus, most_mem = (max((getattr(n, a) for n in nodes), default=0)
                                      for a in ("gpus", "cpus", "mem_mb"))
    # (key, asked, the most a node has, the request, what the nodes have, the largest value of the key that fits)
    for key, asked, most, request, have, fits in (
            ("resources.gpus_per_node", gpus, most_gpus, f"{gpus} GPUs per node", f"{most_gpus} (GRES)", most_gpus),
            ("resources.cpus_per_task", cpus, most_cpus, f"{cpus} CPUs per task", f"{most_cpus}", most_cpus),
            ("resources.mem_gb", mem_mb, most_mem, f"{res.mem_gb} GB per node", f"{most_mem} MB", most_mem // 1024)):
        if asked > most:
            out.append(make(key, f"{request} asked; {where} nodes have {have}", f"use {key}<={fits}"))
    if not out:
        fit = [n for n in nodes if n.gpus >= gpus and n.cpus >= cpus and n.mem_mb >= mem_mb]
        if len(fit) < res.nodes:
            out.append(make("resources.nodes", f"{res.nodes} nodes asked with {gpus} GPUs, {cpus} CPUs and "
                            f"{res.mem_gb or 0} GB each; only {len(fit)} node(s) of {where} have all of that",
                            "ask for fewer nodes or less per node"))
    out += check_association(spec, make)
    if any(f.severity is Severity.ERROR or f.severity is Severity.WARNING for f in out):
        return out  # sbatch would only repeat it, less clearly
    from hpc_grpo.launch import render  # jinja2: only where the script is rendered

    try:
        answer = slurm.test_only(render.render_sbatch(spec))
        out.append(info("resources", f"sbatch --test-only (nothing queued): {answer.removeprefix('sbatch: ')}"))
    except slurm.SlurmError as exc:
        reason = exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else str(exc)
        out.append(make("resources", f"Slurm would never start this job: sbatch --test-only says {reason!r}",
                        "change resources.* (nodes, gpus_per_node, mem_gb, time, partition) to what the partition "
                        "has: `sinfo -N -o '%N %G %m %c %l'` lists it"))
    return out


def check_association(spec: RunSpec, make: Make) -> list[Finding]:
    from hpc_grpo.cluster import slurm

    r, c = spec.recipe, spec.cluster
    account, qos = r.resources.account or c.account, r.resources.qos or c.qos
    if not account and not qos:
        return []
    user = pwd.getpwuid(os.getuid()).pw_name  # Slurm goes by the uid, not by $USER
    assoc = slurm.associations(user, c.slurm_cluster_name)
    if assoc is None:
        return [warning("resources.account", "sacctmgr did not answer: account and qos were not checked",
                        "check them with `sacctmgr show assoc where user=$USER`")]
    accounts = sorted({a for a, _ in assoc if a})
    out: list[Finding] = []
    if account and account not in accounts:
        out.append(make("resources.account", f"account {account!r} is not one of user {user}'s: sacctmgr lists "
                        f"{', '.join(accounts) or 'none'}", f"use resources.account={accounts[0]}" if accounts else
                        "ask the cluster's admins for an association"))
    if qos:
        allowed = sorted({q for a, qs in assoc for q in qs if not account or a == account})
        if qos not in allowed:
            out.append(make("resources.qos", f"qos {qos!r} is not allowed for user {user}"
                            + (f" under account {account}" if account else "") + f": sacctmgr lists "
                            f"{', '.join(allowed) or 'none'}",
                            f"use resources.qos={allowed[0]}" if allowed else "drop resources.qos"))
    return out


# ---------------------------------------------------------------------------------------------- cluster advice
RESOURCE_KEYS = ("resources.nodes", "resources.gpus_per_node", "resources.time", "resources.cpus_per_task",
                 "resources.mem_gb")


def profiles_that_can(spec: RunSpec) -> list[str]:
    """Known cluster profiles on which this recipe, as asked, passes the resource checks."""
    from hpc_grpo.config import registry
    from hpc_grpo.common.findings import has_errors
    from hpc_grpo.config.layout import layout_of
    from hpc_grpo.planning.resources import check_resources
    from hpc_grpo.config.resolve import load_raw
    from hpc_grpo.config.cluster import Cluster
    from hpc_grpo.common.yamlio import SpecError

    names = []
    for name in registry.list_names("clusters"):
        if name == spec.cluster.name:
            continue
        try:
            data, _ = load_raw("clusters", name)
            data.setdefault("name", name)
            other = spec.model_copy(update={"cluster": Cluster.model_validate(data)})
        except (SpecError, ValueError):
            continue
        if not has_errors(check_resources(other, layout_of(other))):
            names.append(name)
    return names


def advise_clusters(spec: RunSpec, findings: list[Finding]) -> list[Finding]:
    """Resource errors whose fix would be nonsense on this cluster (`gpus_per_node<=0` for a GPU recipe on local)
    name the profiles that can run the recipe instead; other findings pass through unchanged."""
    bad = [f for f in findings if f.severity is Severity.ERROR and f.key in RESOURCE_KEYS]
    if not bad:
        return list(findings)
    can = profiles_that_can(spec)
    hint = (f"run it on a cluster that has this: {', '.join(f'cluster={n}' for n in can)} (`hpc-grpo clusters` lists "
            "them)") if can else "no known cluster profile has this: add one under clusters/ (`hpc-grpo clusters`)"
    gpu_less = spec.cluster.gpus_per_node == 0
    out = []
    for f in findings:
        if f in bad:
            nonsense = gpu_less and f.key == "resources.gpus_per_node" or spec.cluster.scheduler == "local" and \
                f.key == "resources.nodes"
            f = type(f)(f.severity, f.key, f.message, hint if nonsense or not f.fix else f"{f.fix}; or {hint}")
        out.append(f)
    return out

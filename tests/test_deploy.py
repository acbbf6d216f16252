"""The Docker deployment (docker/, docker-compose.yml), checked without a Docker engine: the compose file and the
Dockerfiles are parsed and held to the deployment's rules, and docker/index-job.sh runs for real on a tiny
collection (the image runs the same script with the same ``aheadrank`` commands)."""

from __future__ import annotations

import fnmatch
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILES = {"cpu": REPO / "docker" / "Dockerfile.cpu", "cuda": REPO / "docker" / "Dockerfile.cuda"}
INDEX_JOB = REPO / "docker" / "index-job.sh"
HEALTH_PATH = "/ready"


# ---- helpers --------------------------------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: str(v) for k, v in env.items()}


def argv(value) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value or []]


def cli_commands() -> dict:
    import typer

    from aheadrank.cli import app

    return typer.main.get_command(app).commands


def option_names(command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments and blank lines dropped."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        keyword, _, args = (buf + line).partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    assert not buf, f"{path.name}: dangling line continuation"
    return out


def stages(path: Path) -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """Global ARG defaults (before the first FROM) and the instructions of each stage (FROM first)."""
    global_args: dict[str, str] = {}
    result: list[list[tuple[str, str]]] = []
    for keyword, args in instructions(path):
        if keyword == "FROM":
            result.append([])
        if not result:
            if keyword == "ARG":
                name, _, default = args.partition("=")
                global_args[name] = default
            continue
        result[-1].append((keyword, args))
    return global_args, result


def from_image(args: str, global_args: dict[str, str]) -> tuple[str, str | None]:
    """(image with global ARGs substituted, stage name) of a FROM line."""
    words = [w for w in args.split() if not w.startswith("--")]
    image = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0])
    name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
    return image, name


def exec_form(args: str) -> list[str]:
    """A JSON (exec-form) argument list: shell form would make Docker run it through /bin/sh."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def env_instructions(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage:
        if keyword == "ENV":
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def copies(stage: list[tuple[str, str]]) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage) of each COPY/ADD."""
    out = []
    for keyword, args in stage:
        if keyword not in ("COPY", "ADD"):
            continue
        words = shlex.split(args)
        flags = {w.split("=", 1)[0]: w.partition("=")[2] for w in words if w.startswith("--")}
        rest = [w for w in words if not w.startswith("--")]
        if rest and rest[0].startswith("["):
            rest = exec_form(args[args.index("[") :])
        out.append((rest[:-1], rest[-1], flags.get("--from")))
    return out


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern.lstrip("/")) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        if not pattern.startswith("!")
        for prefix in prefixes
    )


def aheadrank_calls() -> list[tuple[str, list[str], str]]:
    """(subcommand, argv, where) of every ``aheadrank`` invocation in the compose file and in index-job.sh."""
    calls = []
    for name, service in services().items():
        entrypoint, command = argv(service.get("entrypoint")), argv(service.get("command"))
        if entrypoint and entrypoint[0] != "aheadrank":
            continue  # the index job: its script's calls are collected below
        args = (entrypoint[1:] if entrypoint else []) + (command or ["serve"])  # image: ENTRYPOINT aheadrank
        calls.append((args[0], args[1:], f"docker-compose.yml service {name}"))
    script = re.sub(r"\\\n", " ", INDEX_JOB.read_text())
    for line in script.splitlines():
        match = re.match(r"\s*(?:exec\s+)?aheadrank\s+([a-z0-9-]+)(.*)", line)
        if match:
            calls.append((match.group(1), match.group(2).split(), "docker/index-job.sh"))
    return calls


def check_calls(calls, commands) -> None:
    for sub, args, where in calls:
        assert sub in commands, f"{where}: `aheadrank {sub}` is not a command ({sorted(commands)})"
        unknown = {a.split("=")[0] for a in args if a.startswith("--")} - option_names(commands[sub])
        assert not unknown, f"{where}: `aheadrank {sub}` has no option {sorted(unknown)}"


# ---- docker-compose.yml -----------------------------------------------------------------------------------


def test_compose_services_and_volume():
    data = compose()
    svc = data["services"]
    assert set(svc) == {"index", "reranker", "reranker-gpu"}
    assert "aheadrank-data" in data["volumes"]

    index = svc["index"]
    assert index["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert argv(index["entrypoint"]) == ["bash", "/app/docker/index-job.sh"]
    assert index["restart"] == "no"  # a quoted "no": bare `no` is YAML false
    assert "aheadrank-data:/data" in index["volumes"]
    assert env_of(index)["AHEADRANK_DATA"] == "/data"

    for name, dockerfile in (("reranker", "Dockerfile.cpu"), ("reranker-gpu", "Dockerfile.cuda")):
        service = svc[name]
        assert service["build"]["dockerfile"] == f"docker/{dockerfile}"
        assert argv(service["command"]) == ["serve", "/data/build"]  # the index job's $AHEADRANK_DATA/build
        assert service["depends_on"]["index"]["condition"] == "service_completed_successfully"
        assert service["restart"] == "unless-stopped"
        assert env_of(service)["AHEADRANK_HOST"] == "0.0.0.0"
        mounts = [v for v in service["volumes"] if str(v).split(":")[1] == "/data"]
        assert mounts == ["aheadrank-data:/data:ro"], f"{name}: the volume must be mounted read-only"
    assert svc["reranker"]["image"] != svc["reranker-gpu"]["image"]
    assert env_of(svc["reranker-gpu"])["AHEADRANK_DEVICE"] == "cuda"
    assert env_of(svc["reranker-gpu"])["AHEADRANK_BATCH_SIZE"] == "1024"

    for service in svc.values():  # builds point into the repository
        assert (REPO / service["build"]["context"] / service["build"]["dockerfile"]).is_file()


def test_compose_ports_bound_to_localhost():
    published = {}
    for name, service in services().items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
                published[name] = str(port["published"])
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is not bound to 127.0.0.1"
                published[name] = str(port).split(":")[1]
    assert published == {"reranker": "8080", "reranker-gpu": "8081"}


def test_compose_gpu_only_under_gpu_profile():
    for name, service in services().items():
        devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if "gpu" in service.get("profiles", []):
            assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}], name
        else:
            assert not devices, f"{name} reserves a GPU outside the gpu profile"
            assert "cuda" not in service.get("build", {}).get("dockerfile", ""), name
    assert services()["reranker-gpu"]["profiles"] == ["gpu"]


def test_compose_healthchecks_probe_ready():
    for name, service in services().items():
        check = service.get("healthcheck", {})
        if name == "index":
            assert check.get("disable") is True  # a job: the image's /ready probe does not apply
            continue
        test = check["test"]
        assert test[0] == "CMD" and test[1] == "python", test
        assert HEALTH_PATH in test[-1] and "127.0.0.1" in test[-1]
        compile(test[-1], f"{name} healthcheck", "exec")


def test_compose_and_job_call_existing_commands():
    commands = cli_commands()
    calls = aheadrank_calls()
    assert [sub for sub, _, where in calls if where == "docker/index-job.sh"] == ["build"]
    check_calls([c for c in calls if c[0] != "serve"], commands)


def test_compose_serve_command_exists():
    calls = [c for c in aheadrank_calls() if c[0] == "serve"]
    assert len(calls) == 2
    check_calls(calls, cli_commands())


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        try:
            ok = (
                subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "gpu"])
def test_docker_compose_config(profile):
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` plugin and no docker-compose binary on PATH")
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE), *profile, "config", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# ---- Dockerfiles ------------------------------------------------------------------------------------------


def test_dockerignore_keeps_local_state_out():
    patterns = dockerignore()
    for path in (".venv", ".git", ".demo", "work", "runs", "bench/results", "tests/__pycache__"):
        assert ignored(path, patterns), f".dockerignore lets {path} into the build context"


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_shape(kind):
    path = DOCKERFILES[kind]
    global_args, all_stages = stages(path)
    assert len(all_stages) >= 2, f"{path.name}: not multi-stage"
    final = all_stages[-1]
    image, _ = from_image(final[0][1], global_args)
    names = [from_image(stage[0][1], global_args)[1] for stage in all_stages]
    if kind == "cpu":
        assert image == "python:3.11-slim"
    else:
        base = image if image.startswith("nvidia/cuda:") else None
        parent = names.index(image) if image in names else None  # FROM a shared earlier stage
        if parent is not None:
            base = from_image(all_stages[parent][0][1], global_args)[0]
        assert base and base.startswith("nvidia/cuda:"), f"{path.name}: runtime is not on an nvidia/cuda base"

    def last(keyword: str) -> str:
        found = [args for k, args in final if k == keyword]
        assert found, f"{path.name}: no {keyword} in the final stage"
        return found[-1]

    user = last("USER").split(":")[0]
    assert user not in ("root", "0"), f"{path.name}: runs as root"
    assert user == "aheadrank"
    run_lines = " ".join(args for k, args in final if k == "RUN")
    assert "--uid 10001" in run_lines and "chown aheadrank:aheadrank /data" in run_lines
    assert last("WORKDIR") == "/app"
    assert last("EXPOSE").split() == ["8080"]
    assert exec_form(last("ENTRYPOINT")) == ["aheadrank"]
    assert exec_form(last("CMD")) == ["serve"]

    health = last("HEALTHCHECK")
    options, _, cmd = health.partition("CMD ")
    assert "--start-period" in options
    probe = exec_form(cmd)
    assert probe[:2] == ["python", "-c"] and "urllib" in probe[2] and HEALTH_PATH in probe[2]
    compile(probe[2], f"{path.name} HEALTHCHECK", "exec")

    env = env_instructions(final)
    expected = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "AHEADRANK_HOST": "0.0.0.0",
        "AHEADRANK_PORT": "8080",
    }
    if kind == "cuda":
        expected["AHEADRANK_DEVICE"] = "cuda"
    assert {k: env.get(k) for k in expected} == expected
    # AHEADRANK_BATCH_SIZE (candidates per scoring pass) is set for the GPU service only (compose), never image-wide
    assert "AHEADRANK_BATCH_SIZE" not in env
    assert env["PATH"].startswith("/opt/venv/bin:")

    final_copies = copies(final)
    assert (["/opt/venv"], "/opt/venv", "builder") in final_copies, f"{path.name}: no /opt/venv from builder"
    assert "builder" in names
    assert any(src == ["docker/"] and dst == "/app/docker/" for src, dst, frm in final_copies if not frm)


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_installs_torch_before_the_project(kind):
    path = DOCKERFILES[kind]
    pinned = re.search(r"^torch==(\S+)$", (REPO / "requirements" / "constraints.txt").read_text(), re.M)
    assert pinned, "requirements/constraints.txt does not pin torch"
    version = pinned.group(1)
    assert version == "2.13.0"
    _, all_stages = stages(path)
    builder = next(s for s in all_stages if any("/opt/venv" in a for k, a in s if k == "RUN"))
    runs = [args for keyword, args in builder if keyword == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if f"torch=={version}" in r)
    project_at = next(i for i, r in enumerate(runs) if "-c requirements/constraints.txt" in r)
    assert torch_at < project_at
    assert "--index-url" in runs[torch_at] and "${TORCH_INDEX_URL}" in runs[torch_at]
    arg = [a for k, a in builder if k == "ARG" and a.startswith("TORCH_INDEX_URL=")]
    assert arg and arg[0].startswith("TORCH_INDEX_URL=https://download.pytorch.org/whl/")
    assert arg[0].endswith("/cpu") == (kind == "cpu")
    assert "pip install -c requirements/constraints.txt ." in runs[project_at] or re.search(
        r"pip install -c requirements/constraints\.txt '\.\[\w+\]'", runs[project_at]
    )


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_copies_exist_in_the_context(kind):
    patterns = dockerignore()
    _, all_stages = stages(DOCKERFILES[kind])
    sources = [src for stage in all_stages for srcs, _, frm in copies(stage) if not frm for src in srcs]
    assert {"pyproject.toml", "requirements/", "aheadrank/", "rankers/", "store/", "indexer/"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), f"{DOCKERFILES[kind].name}: COPY {src}: not in the repository"
        assert not ignored(src.rstrip("/"), patterns), f"COPY {src}: excluded by .dockerignore"


# ---- docker/index-job.sh, for real ------------------------------------------------------------------------

WORDS = (
    "protein cell cancer tumour gene expression patient clinical trial risk therapy dose mouse model signal "
    "pathway receptor binding membrane virus infection immune response vaccine blood pressure heart disease"
).split()


def write_beir(path: Path, n_docs: int = 30, n_queries: int = 6, train: bool = True) -> Path:
    rng = random.Random(7)
    docs = {f"d{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) for i in range(n_docs)}
    path.mkdir(parents=True)
    with open(path / "corpus.jsonl", "w") as f:
        for docid, text in docs.items():
            f.write(json.dumps({"_id": docid, "title": "", "text": text}) + "\n")
    qrels = []
    with open(path / "queries.jsonl", "w") as f:
        for q in range(n_queries):
            docid = f"d{q * 3}"
            f.write(json.dumps({"_id": f"q{q}", "text": " ".join(docs[docid].split()[:4])}) + "\n")
            qrels.append(f"q{q}\t{docid}\t1")
    if train:
        (path / "qrels").mkdir()
        (path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    return path


def write_passages(path: Path, n_docs: int = 60) -> Path:
    """A plain JSONL of passages without titles or judgments: the label-free journey."""
    rng = random.Random(11)
    lines = []
    for i in range(n_docs):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(7, 12))) for _ in range(3)]
        lines.append(json.dumps({"id": f"p{i}", "contents": ". ".join(sentences) + "."}))
    path.write_text("\n".join(lines) + "\n")
    return path


def job_env(data: Path, collection: Path, base: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AHEADRANK_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        AHEADRANK_DATA=str(data),
        AHEADRANK_COLLECTION=str(collection),
        AHEADRANK_BASE=str(
            base
        ),  # `aheadrank build --base`, as every other AHEADRANK_* the job passes through
        AHEADRANK_TRAIN_STEPS="2",
        AHEADRANK_MAX_QUERIES="30",
        AHEADRANK_PROGRESS="false",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


def run_job(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(INDEX_JOB)], env=env, cwd=REPO, capture_output=True, text=True, timeout=480
    )


def job_log(result: subprocess.CompletedProcess) -> str:
    return f"rc {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"


def compose_build_dir(data: Path) -> Path:
    """The build directory the compose rerankers serve (`serve /data/build`), under ``data`` instead of /data."""
    args = argv(services()["reranker"]["command"])
    assert args[0] == "serve" and len(args) == 2 and args[1].startswith("/data/"), args
    return data / Path(args[1]).relative_to("/data")


def assert_build(build: Path, n_docs: int) -> dict:
    """A finished build: every stage recorded, a Lucene index, a complete store bound to the checkpoint."""
    from aheadrank.rankers import read_fingerprint
    from aheadrank.store.manifest import read_manifest

    from aheadrank.build import STAGES, paths, read_record

    record = read_record(build)
    assert record is not None and list(record.stages) == list(STAGES), record
    p = paths(build)
    assert any(f.name.startswith("segments_") for f in p["lucene"].iterdir())
    fingerprint = json.loads((p["checkpoint"] / "fingerprint.json").read_text())["sha256"]
    assert read_fingerprint(p["checkpoint"]) == fingerprint
    manifest = read_manifest(p["store"])
    assert manifest.complete and manifest.spec.fingerprint == fingerprint
    assert manifest.n_docs == n_docs
    return record.stages


def test_the_index_job_builds_the_ranker_aheadrank_build_builds_by_default():
    """Compose serves the score the README promises: the job's default ranker is `aheadrank build`'s (it was tk,
    whose label-free build serves below the fusion on Vaswani, while the README's numbers are MORES's)."""
    import inspect

    from aheadrank.cli.build import build_cmd

    default = inspect.signature(build_cmd).parameters["ranker"].default.default
    compose = re.findall(r"AHEADRANK_RANKER: \$\{AHEADRANK_RANKER:-([^}]*)\}", COMPOSE.read_text())
    job = re.findall(r'RANKER="\$\{AHEADRANK_RANKER:-([^}]*)\}"', INDEX_JOB.read_text())
    assert compose == [default] and job == [default], (compose, job, default)


def test_index_job_is_executable_bash():
    assert os.access(INDEX_JOB, os.X_OK)
    text = INDEX_JOB.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert subprocess.run(["bash", "-n", str(INDEX_JOB)], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_index_job_builds_label_free_resumes_and_is_served(tmp_path, tiny_base):
    from aheadrank.rankers.training import state_file
    from aheadrank.services.process import ServeProcess

    from aheadrank.build import STAGES, label_free_weights, paths
    from aheadrank.priors import read_priors

    collection = write_passages(tmp_path / "passages.jsonl")
    data = tmp_path / "data"
    build = compose_build_dir(data)
    env = job_env(data, collection, tiny_base, AHEADRANK_RANKER="tk")

    # a job cut off after the queries stage (the same build, stopped there)
    cut = subprocess.run(
        ["aheadrank", "build", "--collection", str(collection), "--out", str(build), "--ranker", "tk"]
        + ["--steps", "2", "--until", "queries"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    # not "serve it": `aheadrank serve` refuses an unfinished build
    assert "stopped before the dense stage (--until queries)" in cut.stdout and "serve it" not in cut.stdout
    first = run_job(env)
    assert first.returncode == 0, job_log(first)
    assert f"serve it: aheadrank serve {build}" in first.stdout, job_log(first)
    assert "label-free: no qrels/train.tsv" in first.stdout, job_log(first)
    for stage in ("collection", "bm25", "queries"):
        assert f"[{stage}] done before" in first.stdout, job_log(first)
    assert "[train] done before" not in first.stdout
    assert "UNTRAINED" not in first.stdout + first.stderr
    stages = assert_build(build, 60)
    assert stages["queries"]["pseudo_queries"] >= 20 and stages["train"]["steps"] == 2
    ckpt = paths(build)["checkpoint"]
    assert not state_file(ckpt).exists() and "[train] removed its resumable state" in first.stdout
    config = json.loads((ckpt / "config.json").read_text())
    # AHEADRANK_RANKER=tk without judgments: TK over every layer of the base (aheadrank.build.LABEL_FREE_VARIANTS)
    layers = json.loads((tiny_base / "config.json").read_text())["num_hidden_layers"]
    assert (config["kind"], config["tk_base"], config["tk_layers"]) == ("tk", True, layers)
    assert stages["train"]["variant"] == f"tk-{layers}l-base"
    # neural 1/6, BM25 and bi-encoder 5/12 each, and the best of the passages' two sentence windows as the bi-encoder
    assert read_priors(ckpt).weights == label_free_weights("tk", window=True)

    # a finished volume: every stage skipped, nothing rewritten (not a wall-clock bound)
    outputs = (ckpt / "fingerprint.json", ckpt / "priors.json", paths(build)["store"] / "manifest.json")
    stamps = {f: f.stat().st_mtime_ns for f in outputs}
    second = run_job(env)
    assert second.returncode == 0, job_log(second)
    assert sum(f"[{s}] done before" in second.stdout for s in STAGES) == len(STAGES), job_log(second)
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps

    # another ranker on the finished volume: one clear error, nothing mixed in
    other = run_job({**env, "AHEADRANK_RANKER": "mores"})
    assert other.returncode == 2, job_log(other)
    assert (
        "other settings" in other.stderr
        and "ranker: built with" in other.stderr
        and "Traceback" not in other.stderr
    )
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps

    # the compose reranker's command serves what the job built
    command = argv(services()["reranker"]["command"])[1:]
    serve_args = [str(build) if a.startswith("/data/") else a for a in command]
    server = ServeProcess(
        serve_args,
        tmp_path / "serve.log",
        env={"AHEADRANK_THREADS": "1", "OMP_NUM_THREADS": "1"},
        clean_env=True,
    )
    try:
        server.wait_ready(180)
        import httpx

        r = httpx.post(
            server.url + "/v1/rerank", json={"query": "heart disease risk", "depth": 10}, timeout=60
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["results"] and body["scoring"] == "neural+bm25+dense+window", body
        assert all(
            x["neural_score"] is not None and x["window_score"] is not None for x in body["results"]
        ), body
    finally:
        assert server.stop(60) == 0, server.log_tail()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_index_job_trains_on_judgments_when_the_collection_has_them(tmp_path, tiny_base):
    collection = write_beir(tmp_path / "beir")
    data = tmp_path / "data"
    # the collection judges 6 queries: under the default minimum (200) auto would build it label-free; the job passes
    # AHEADRANK_MIN_JUDGED_QUERIES through to the build, as every AHEADRANK_* variable
    env = job_env(
        data,
        collection,
        tiny_base,
        AHEADRANK_RANKER="mores-1ib-s2",
        AHEADRANK_PROGRESS="true",
        AHEADRANK_MIN_JUDGED_QUERIES="6",
    )
    result = run_job(env)
    assert result.returncode == 0, job_log(result)
    assert "labels auto" in result.stdout and "[labels]" not in result.stdout, job_log(result)
    stages = assert_build(compose_build_dir(data), 30)
    assert {
        k: v for k, v in stages["queries"].items() if k not in ("seconds", "peak_rss_mb", "peak_anon_mb")
    } == {"judged_split": "train"}
    assert stages["priors"]["fitted_on"]["split"] == "train"
    assert stages["priors"]["fitted_on"]["passage_aggregation"] == "first+max"  # a judged build's (measured)
    # its log (docker compose logs) reads line by line: progress lines, not a bar redrawn with carriage returns
    assert "\r" not in result.stderr and "index: 100%" in result.stderr, job_log(result)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_index_job_stops_its_build_and_keeps_what_is_done(tmp_path, tiny_base):
    """SIGTERM to the job (docker compose stop) reaches the build, which stops as on Ctrl-C (exit 130) and keeps
    its finished stages; nothing is left running. The job's shell died and left the build running, orphaned (a
    rerun was refused: "another build is writing"), and as a container's PID 1 it would have ignored the signal."""
    import signal

    collection = write_passages(tmp_path / "passages.jsonl")
    data = tmp_path / "data"
    env = job_env(data, collection, tiny_base)
    job = subprocess.Popen(
        ["bash", str(INDEX_JOB)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        for line in job.stdout:
            lines.append(line)
            if line.startswith("[bm25] ...") or len(lines) > 200:
                break
        job.send_signal(signal.SIGTERM)
        rest, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    said = "".join(lines) + rest
    assert job.returncode == 130, said
    assert "interrupted: what is done is kept" in said, said
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_holds(p, str(data))]
    assert left == [], left
    from aheadrank.build import read_record

    assert "collection" in read_record(compose_build_dir(data)).stages


def _cmdline_holds(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def test_index_job_rejects_bad_settings(tmp_path):
    env = job_env(tmp_path / "data", tmp_path / "missing", tmp_path)
    result = run_job(env)
    assert result.returncode == 2 and "does not exist" in result.stderr, job_log(result)
    (tmp_path / "c.tsv").write_text("d1\tsome text\n")
    env["AHEADRANK_COLLECTION"] = str(tmp_path / "c.tsv")
    result = run_job({**env, "AHEADRANK_RANKER": "x"})
    assert result.returncode == 2 and "AHEADRANK_RANKER" in result.stderr, job_log(result)
    for steps in ("0", "ten"):  # 0 would serve an untrained ranker as a third of the score
        result = run_job({**env, "AHEADRANK_TRAIN_STEPS": steps})
        assert result.returncode == 2, job_log(result)
        assert "[index-job] error: AHEADRANK_TRAIN_STEPS must be" in result.stderr, job_log(result)
    assert not (tmp_path / "data").exists()  # refused before anything was written

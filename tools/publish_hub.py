#!/usr/bin/env python3
"""Publish the built kernel tree (``make build``) to the Hugging Face kernel Hub.

Dry run by default (``make publish-dry-run``): validates the build by loading it with
``kernels.get_local_kernel``, then prints the plan (repo, branches, every file with its
size) and uploads nothing. ``--push`` uploads:

* branch ``v<version>``: ``build/torch-*/**`` (the variants), ``benchmarks/**`` and the card
  as ``README.md``, in one commit;
* branch ``main``: the card as ``README.md``.

The repo is created (type ``kernel``) if needed. An existing ``v<version>`` branch is never
overwritten without ``--force`` (users pinned to ``version=<N>`` would silently get new
code); with ``--force`` files that the new build no longer has are deleted from the branch.
``--push`` needs a token (``HF_TOKEN``, ``hf auth login``, or ``--token``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_hub  # noqa: E402  (sibling module: the build.toml reader)

ROOT = build_hub.ROOT
REPO_TYPE = "kernel"
SKIP_PARTS = ("__pycache__",)


class PublishError(Exception):
    """The build cannot be published as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Upload:
    local: Path
    path_in_repo: str
    revision: str
    size: int


@dataclass(frozen=True)
class Plan:
    repo_id: str
    version: int
    branch: str
    uploads: tuple[Upload, ...]

    def files(self, revision: str) -> list[Upload]:
        return [u for u in self.uploads if u.revision == revision]

    def describe(self) -> str:
        lines = [f"repo:    {self.repo_id} (type {REPO_TYPE}), created if missing"]
        for revision in (self.branch, "main"):
            files = self.files(revision)
            total = sum(u.size for u in files)
            lines.append(f"branch {revision}: {len(files)} files, {total} bytes")
            for u in files:
                lines.append(f"  {u.size:>9}  {u.path_in_repo}")
        return "\n".join(lines)


def _files(base: Path) -> list[Path]:
    return sorted(
        (p for p in base.rglob("*") if p.is_file()
         and not any(part in SKIP_PARTS for part in p.relative_to(base).parts)
         and p.suffix not in (".pyc", ".pyo")),
        key=lambda p: p.relative_to(base).as_posix(),
    )


def make_plan(build_dir: Path, repo_id: str, version: int) -> Plan:
    """Map the local build tree onto the Hub layout (bytecode never uploaded)."""
    branch = f"v{version}"
    variants = sorted(p for p in build_dir.glob("torch-*") if p.is_dir())
    if not variants:
        raise PublishError(f"{build_dir} holds no torch-* variant; run `make build` first")
    card = build_dir / "CARD.md"
    if not card.is_file():
        raise PublishError(f"{card} is missing; run `make build` first")
    uploads = []
    for variant in variants:
        for path in _files(variant):
            rel = path.relative_to(build_dir).as_posix()
            uploads.append(Upload(path, f"build/{rel}", branch, path.stat().st_size))
    bench = build_dir / "benchmarks"
    if bench.is_dir():
        for path in _files(bench):
            uploads.append(Upload(path, f"benchmarks/{path.relative_to(bench).as_posix()}", branch, path.stat().st_size))
    for revision in (branch, "main"):
        uploads.append(Upload(card, "README.md", revision, card.stat().st_size))
    return Plan(repo_id, version, branch, tuple(uploads))


def validate_build(build_dir: Path, repo_id: str, version: int) -> str:
    """Check every variant's metadata and digest, then load the build for this host.

    Returns a one-line summary. Raises PublishError on any problem.
    """
    from kernels import get_local_kernel
    from kernels._rust import Digest, DigestAlgorithm, DigestValidationError, Metadata

    problems = []
    for variant in sorted(p for p in build_dir.glob("torch-*") if p.is_dir()):
        try:
            metadata = Metadata.read_from_file(variant / "metadata.json")
        except ValueError as err:
            problems.append(f"{variant.name}: {err}")
            continue
        backend = variant.name.removeprefix("torch-")
        raw = json.loads((variant / "metadata.json").read_text())
        if raw.get("backend", {}).get("type") != backend:
            problems.append(f"{variant.name}: metadata backend {raw.get('backend')} does not match the folder")
        if metadata.version != version:
            problems.append(f"{variant.name}: metadata version {metadata.version} != build.toml version {version}")
        if backend != "neuron" and "nki" in metadata.python_depends:
            problems.append(f"{variant.name}: python-depends {metadata.python_depends} lists nki outside neuron")
        if f'_OP_NAMESPACE = "{metadata.id}"' not in (variant / "_ops.py").read_text():
            problems.append(f"{variant.name}: _ops.py does not use the namespace {metadata.id}")
        if metadata.digest is None:
            problems.append(f"{variant.name}: metadata.json has no digest")
        else:
            try:
                metadata.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, variant))
            except DigestValidationError as err:
                problems.append(f"{variant.name}: files differ from the metadata digest: {err}")
    card = (build_dir / "CARD.md").read_text() if (build_dir / "CARD.md").is_file() else ""
    if f'get_kernel("{repo_id}", version={version}' not in card:
        problems.append(f"CARD.md was not generated for {repo_id} v{version}; rebuild with `--repo-id {repo_id}`")
    if problems:
        raise PublishError("the build is not valid:\n  " + "\n  ".join(problems))
    try:
        module = get_local_kernel(build_dir)
    except Exception as err:  # any load failure blocks the upload
        raise PublishError(f"kernels.get_local_kernel({build_dir}) failed: {type(err).__name__}: {err}") from err
    names = list(getattr(module, "__all__", []))
    missing = [n for n in names if not hasattr(module, n)]
    if not names or missing:
        raise PublishError(f"loaded {module.__name__} but __all__={names} (missing: {missing})")
    return f"loaded {module.__name__} with kernels.get_local_kernel: {len(names)} public names"


def stale_files(build_dir: Path, config, root: Path = ROOT) -> list[str]:
    """Files of the build that differ from the sources it is built from (``root``), or are
    missing from them or from it: a build older than the tree would upload old code. Empty
    when the build is current."""
    sources = build_hub.collect_sources(root, config)
    generated = {"_ops.py", "metadata.json", "nki_src/__init__.py"}
    wanted = dict(sources.package)        # every variant holds the same copied files
    wanted.update({f"nki_src/{rel}": data for rel, data in sources.nki.items()})
    stale = []
    for variant in sorted(p for p in build_dir.glob("torch-*") if p.is_dir()):
        built = {f.relative_to(variant).as_posix() for f in _files(variant)} - generated
        for rel in sorted(built | set(wanted)):
            path = variant / rel
            if rel not in wanted:
                stale.append(f"{variant.name}/{rel}: no longer in the sources")
            elif not path.is_file() or path.read_bytes() != wanted[rel]:
                stale.append(f"{variant.name}/{rel}: differs from the sources")
    for name, data in sorted(sources.benchmarks.items()):
        path = build_dir / "benchmarks" / name
        if not path.is_file() or path.read_bytes() != data:
            stale.append(f"benchmarks/{name}: differs from the sources")
    return stale


def _default_api_factory(token: str):
    from huggingface_hub import HfApi

    return HfApi(token=token)


def _resolve_token(token: str | None) -> str | None:
    if token:
        return token
    from huggingface_hub import get_token

    return get_token()


def push(api, plan: Plan, *, force: bool, log: Callable[[str], None] = print) -> None:
    """Upload ``plan`` with ``api`` (an ``HfApi`` or a test double)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    api.create_repo(plan.repo_id, repo_type=REPO_TYPE, exist_ok=True)
    refs = api.list_repo_refs(plan.repo_id, repo_type=REPO_TYPE)
    exists = plan.branch in {b.name for b in refs.branches}
    if exists and not force:
        raise PublishError(
            f"{plan.repo_id} already has branch {plan.branch}; users pinned to version={plan.version} "
            f"would get different code. Bump [general] version in build.toml, or pass --force to overwrite."
        )
    deletions = []
    if exists:
        stale = set(api.list_repo_files(plan.repo_id, revision=plan.branch, repo_type=REPO_TYPE))
        stale -= {u.path_in_repo for u in plan.files(plan.branch)} | {".gitattributes"}
        deletions = [CommitOperationDelete(path_in_repo=p) for p in sorted(stale)]
    else:
        api.create_branch(plan.repo_id, branch=plan.branch, repo_type=REPO_TYPE, exist_ok=True)
    for revision in (plan.branch, "main"):
        operations = [CommitOperationAdd(path_in_repo=u.path_in_repo, path_or_fileobj=str(u.local))
                      for u in plan.files(revision)]
        if revision == plan.branch:
            operations += deletions
        api.create_commit(
            plan.repo_id,
            operations=operations,
            commit_message=f"nki-kernels v{plan.version}" + (" (README)" if revision == "main" else ""),
            repo_type=REPO_TYPE,
            revision=revision,
        )
        log(f"pushed {len(operations)} operations to {plan.repo_id}@{revision}")


def main(argv: list[str] | None = None, *, api_factory=_default_api_factory,
         validate: Callable[[Path, str, int], str] = validate_build) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path, default=build_hub.DEFAULT_OUT, help="default: build/")
    parser.add_argument("--repo-id", help="default: build.toml [general.hub] repo-id")
    parser.add_argument("--push", action="store_true", help="upload (default: dry run, print the plan)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing v<version> branch")
    parser.add_argument("--without-report", action="store_true",
                        help="push a card without the modeled table (`make demo` before `make build` puts it in)")
    parser.add_argument("--token", help="Hugging Face token (default: HF_TOKEN / `hf auth login`)")
    parser.add_argument("--config", type=Path, default=ROOT / "build.toml")
    args = parser.parse_args(argv)
    try:
        config = build_hub.read_config(args.config)
        repo_id = args.repo_id or config.repo_id
        token = None
        if args.push:
            token = _resolve_token(args.token)
            if not token:
                raise PublishError(
                    "--push needs a Hugging Face token with write access: set HF_TOKEN, run "
                    "`hf auth login`, or pass --token. Nothing was uploaded."
                )
        plan = make_plan(args.build_dir, repo_id, config.version)
        print(validate(args.build_dir, repo_id, config.version))
        stale = stale_files(args.build_dir, config)
        if stale:
            raise PublishError(f"{args.build_dir} is older than the sources ({len(stale)} files); run `make build` "
                               "again. Nothing was uploaded:\n  " + "\n  ".join(stale[:20]))
        print(plan.describe())
        if build_hub.NO_REPORT_NOTE in (args.build_dir / "CARD.md").read_text(encoding="utf-8"):
            if args.push and not args.without_report:
                raise PublishError("CARD.md has no modeled table (run `make demo`, then `make build`), so the Hub "
                                   "page would show no figures; pass --without-report to push it anyway. Nothing "
                                   "was uploaded.")
            print("warning: CARD.md has no modeled table (run `make demo`, then `make build`); --push refuses "
                  "it without --without-report")
        if not args.push:
            print("dry run: nothing uploaded. Re-run with --push to upload"
                  + (" (--force to overwrite an existing version)." if not args.force else "."))
            return 0
        push(api_factory(token), plan, force=args.force)
        print(f"published: get_kernel({repo_id!r}, version={config.version})")
        return 0
    except (PublishError, build_hub.BuildError) as err:
        print(f"publish_hub: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

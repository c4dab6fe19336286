"""tools/publish_hub.py: the dry-run plan and the refusals, with a fake HfApi (no network)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from .conftest import ROOT

REPO_ID = "nki-kernels/nki-kernels"


class FakeHfApi:
    """Records calls; ``branches`` are the refs the fake repo already has."""

    def __init__(self, branches=("main",), files=()):
        self.branches = list(branches)
        self.files = list(files)
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def list_repo_refs(self, repo_id, **kwargs):
        self.calls.append(("list_repo_refs", repo_id, kwargs))
        return SimpleNamespace(branches=[SimpleNamespace(name=b) for b in self.branches])

    def list_repo_files(self, repo_id, **kwargs):
        self.calls.append(("list_repo_files", repo_id, kwargs))
        return list(self.files)

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def create_commit(self, repo_id, operations, **kwargs):
        ops = [(type(op).__name__, op.path_in_repo) for op in operations]
        self.calls.append(("create_commit", repo_id, dict(kwargs, operations=ops)))

    def names(self):
        return [c[0] for c in self.calls]

    def commits(self):
        return {c[2]["revision"]: c[2]["operations"] for c in self.calls if c[0] == "create_commit"}


@pytest.fixture
def no_token(monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)


def _run(publish_hub, argv, api=None, validate=None):
    factory_calls = []

    def factory(token):
        factory_calls.append(token)
        if api is None:
            raise AssertionError("the Hub API must not be used")
        return api

    kwargs = {"api_factory": factory}
    if validate is not None:
        kwargs["validate"] = validate
    return publish_hub.main(argv, **kwargs), factory_calls


def test_dry_run_prints_the_plan_and_uploads_nothing(publish_hub, default_build, capsys, no_token):
    out, summary = default_build
    rc, factory_calls = _run(publish_hub, ["--build-dir", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and factory_calls == []
    assert f"loaded _nki_kernels_cpu_{summary['id']} with kernels.get_local_kernel" in text
    assert f"repo:    {REPO_ID} (type kernel)" in text
    plan = publish_hub.make_plan(out, REPO_ID, 1)
    for upload in plan.uploads:
        assert f"{upload.size:>9}  {upload.path_in_repo}" in text
    v1 = {u.path_in_repo for u in plan.files("v1")}
    assert "README.md" in v1 and "build/torch-cpu/metadata.json" in v1 and "build/torch-neuron/_ops.py" in v1
    assert {u.path_in_repo for u in plan.files("main")} == {"README.md"}
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in v1)  # loading wrote bytecode; never uploaded
    assert "dry run: nothing uploaded" in text


def test_plan_maps_the_build_onto_the_hub_layout(publish_hub, default_build):
    out, _ = default_build
    plan = publish_hub.make_plan(out, REPO_ID, 1)
    assert plan.branch == "v1"
    local = {u.local.relative_to(out).as_posix(): u.path_in_repo for u in plan.files("v1")}
    for rel, in_repo in local.items():
        if rel.startswith("torch-"):
            assert in_repo == f"build/{rel}"
        elif rel.startswith("benchmarks/"):
            assert in_repo == rel
        else:
            assert (rel, in_repo) == ("CARD.md", "README.md")


def test_push_without_a_token_fails_clearly(publish_hub, default_build, capsys, no_token):
    out, _ = default_build
    validated = []
    rc, factory_calls = _run(publish_hub, ["--build-dir", str(out), "--push"],
                             validate=lambda *a: validated.append(a) or "ok")
    err = capsys.readouterr().err
    assert rc == 1 and factory_calls == [] and validated == []
    assert "needs a Hugging Face token" in err and "HF_TOKEN" in err and "Nothing was uploaded" in err


def test_push_uploads_the_version_branch_and_the_card(publish_hub, default_build, capsys):
    out, _ = default_build
    api = FakeHfApi(branches=["main"])
    rc, factory_calls = _run(publish_hub, ["--build-dir", str(out), "--push", "--token", "hf_fake", "--without-report"], api=api)
    assert rc == 0, capsys.readouterr().err
    assert factory_calls == ["hf_fake"]
    assert api.names() == ["create_repo", "list_repo_refs", "create_branch", "create_commit", "create_commit"]
    assert api.calls[0][2] == {"repo_type": "kernel", "exist_ok": True}
    assert api.calls[2][2] == {"branch": "v1", "repo_type": "kernel", "exist_ok": True}
    plan = publish_hub.make_plan(out, REPO_ID, 1)
    commits = api.commits()
    assert sorted(p for _, p in commits["v1"]) == sorted(u.path_in_repo for u in plan.files("v1"))
    assert commits["main"] == [("CommitOperationAdd", "README.md")]
    assert all(c[2].get("repo_type") == "kernel" for c in api.calls if c[0] != "create_branch")


def test_push_refuses_to_overwrite_an_existing_version(publish_hub, default_build, capsys):
    out, _ = default_build
    api = FakeHfApi(branches=["main", "v1"])
    rc, _ = _run(publish_hub, ["--build-dir", str(out), "--push", "--token", "hf_fake", "--without-report"], api=api)
    err = capsys.readouterr().err
    assert rc == 1
    assert "already has branch v1" in err and "--force" in err
    assert "create_commit" not in api.names() and "create_branch" not in api.names()


def test_push_force_replaces_an_existing_version(publish_hub, default_build):
    out, _ = default_build
    stale = "build/torch-cpu/removed_op.py"
    api = FakeHfApi(branches=["main", "v1"], files=[".gitattributes", "README.md", stale])
    rc, _ = _run(publish_hub, ["--build-dir", str(out), "--push", "--force", "--token", "hf_fake", "--without-report"], api=api)
    assert rc == 0
    assert "create_branch" not in api.names()
    v1 = api.commits()["v1"]
    assert ("CommitOperationDelete", stale) in v1
    assert ("CommitOperationDelete", ".gitattributes") not in v1


def test_an_invalid_build_is_never_uploaded(publish_hub, default_build, tmp_path, capsys):
    out, _ = default_build
    broken = tmp_path / "build"
    shutil.copytree(out, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "torch-neuron" / "activations.py").write_text("# edited after the build\n")
    api = FakeHfApi()
    rc, _ = _run(publish_hub, ["--build-dir", str(broken), "--push", "--token", "hf_fake", "--without-report"], api=api)
    err = capsys.readouterr().err
    assert rc == 1 and api.calls == []
    assert "torch-neuron: files differ from the metadata digest" in err and "activations.py" in err


def test_a_build_older_than_the_sources_is_never_uploaded(publish_hub, build_hub, default_build, tmp_path, capsys):
    # a build that is valid in itself (its digest matches its files) but made from other
    # sources than the tree's: here, a copy of the tree with one edited module
    old_root = tmp_path / "tree"
    for rel in ("torch_ext/nki_kernels", "kernels", "benchmarks"):
        shutil.copytree(ROOT / rel, old_root / rel, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "build.toml", old_root / "build.toml")
    layers = old_root / "torch_ext" / "nki_kernels" / "layers.py"
    layers.write_text(layers.read_text() + "\n# an older version of this module\n")
    out = tmp_path / "build"
    build_hub.build(out, root=old_root, api=default_build[1]["api"])
    api = FakeHfApi()
    rc, _ = _run(publish_hub, ["--build-dir", str(out), "--push", "--token", "hf_fake", "--without-report"], api=api)
    err = capsys.readouterr().err
    assert rc == 1 and api.calls == []
    assert "is older than the sources" in err
    assert "torch-cpu/layers.py: differs from the sources" in err and "torch-neuron/layers.py" in err
    # the tree's own build is current
    assert publish_hub.stale_files(default_build[0], build_hub.read_config(ROOT / "build.toml")) == []


def test_card_for_another_repo_is_refused(publish_hub, default_build, capsys):
    out, _ = default_build
    api = FakeHfApi()
    rc, _ = _run(publish_hub, ["--build-dir", str(out), "--repo-id", "someone/else", "--push", "--token", "t"], api=api)
    assert rc == 1 and api.calls == []
    assert "rebuild with `--repo-id someone/else`" in capsys.readouterr().err


def test_missing_build_is_reported(publish_hub, tmp_path, capsys):
    rc, _ = _run(publish_hub, ["--build-dir", str(tmp_path / "nothing")])
    assert rc == 1 and "run `make build` first" in capsys.readouterr().err


def test_publish_dry_run_command(default_build):
    # What `make publish-dry-run` runs (without the network: a dry run never contacts the Hub).
    out, _ = default_build
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "publish_hub.py"), "--build-dir", str(out)],
        capture_output=True, text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
                                                        "HOME": str(out.parent)},
    )
    assert result.returncode == 0, result.stderr
    assert "branch v1:" in result.stdout and "dry run: nothing uploaded" in result.stdout


def test_a_card_without_the_modeled_table_is_pushed_only_when_asked(publish_hub, build_hub, default_build,
                                                                    tmp_path, capsys):
    # the Hub page would show no figures: the dry run warns, --push refuses unless told
    out = tmp_path / "build"
    build_hub.build(out, report=None, api=default_build[1]["api"])
    assert build_hub.NO_REPORT_NOTE in (out / "CARD.md").read_text()
    rc, _ = _run(publish_hub, ["--build-dir", str(out)])
    assert rc == 0 and "warning: CARD.md has no modeled table" in capsys.readouterr().out
    api = FakeHfApi(branches=["main"])
    rc, _ = _run(publish_hub, ["--build-dir", str(out), "--push", "--token", "hf_fake"], api=api)
    assert rc == 1 and "pass --without-report" in capsys.readouterr().err
    assert api.calls == []
    rc, _ = _run(publish_hub, ["--build-dir", str(out), "--push", "--token", "hf_fake", "--without-report"], api=api)
    assert rc == 0 and "create_commit" in api.names()

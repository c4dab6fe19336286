"""The Hub tree written by tools/build_hub.py: contents, metadata, namespace, reproducibility.

These tests read files only (no import of the built package).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kernels._rust import Backend, Build, Digest, DigestAlgorithm, Metadata

from .conftest import ROOT

PACKAGE = ROOT / "torch_ext" / "nki_kernels"
VARIANTS = ("torch-cpu", "torch-neuron")


def _tree(base: Path) -> dict[str, bytes]:
    return {
        p.relative_to(base).as_posix(): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _sources(base: Path, pattern: str = "*") -> dict[str, bytes]:
    return {
        p.relative_to(base).as_posix(): p.read_bytes()
        for p in sorted(base.rglob(pattern))
        if p.is_file() and "__pycache__" not in p.relative_to(base).parts and p.suffix != ".pyc"
    }


# ------------------------------------------------------------------------------ build.toml

def test_build_toml_is_valid_edition_5_for_kernel_builder(build_hub):
    build = Build.open(ROOT)  # kernel-builder's own parser and validator, shipped in `kernels`
    assert build.general.backends == [Backend.CPU, Backend.Neuron]
    config = build_hub.read_config(ROOT / "build.toml")
    assert (config.name, config.version, config.license) == ("nki-kernels", 1, "Apache-2.0")
    assert config.backends == ("cpu", "neuron")
    assert config.python_depends == {"cpu": (), "neuron": ("nki",)}
    assert re.fullmatch(r"[\w.-]+/nki-kernels", config.repo_id)


@pytest.mark.parametrize(
    "edit, message",
    [
        (("edition = 5", "edition = 4"), "edition=4"),
        (('backends = ["cpu", "neuron"]', 'backends = ["cpu", "cuda"]'), "backends="),
        (('python-depends = ["nki"]', 'python-depends = ["nki", "numpy"]'), "['numpy'] not allowed"),
        (('name = "nki-kernels"', 'name = "NKI_kernels"'), "kebab-case"),
        (("[torch-noarch]", ""), "[torch-noarch]"),
        # keys of kernel-builder's schema this builder does not read: refused, never dropped
        (('license = "Apache-2.0"', 'license = "Apache-2.0"\npython-depends = ["einops"]'),
         "[general] python-depends in"),
        (('license = "Apache-2.0"', 'license = "Apache-2.0"\nupstream = "x/y"'), "[general] upstream in"),
        (('repo-id = ', 'branch = "dev"\nrepo-id = '), "[general.hub] branch in"),
        (('python-depends = ["nki"]', 'python-depends = ["nki"]\nkernel-depends = []'),
         "[general.neuron] kernel-depends in"),
        (("[torch-noarch]", "[torch-noarch]\nsrc = []\n[kernel.x]\nbackend = \"cpu\""), "[kernel] in"),
        # the values kernels and the Hub read: a version >= 1, a license, an owner/name repo id
        (("version = 1", "version = 0"), "version"),
        (('license = "Apache-2.0"', 'license = ""'), "license"),
        (('repo-id = "nki-kernels/nki-kernels"', 'repo-id = "not a repo"'), "repo-id"),
        # a value where a table belongs: a BuildError, not an AttributeError
        (('backends = ["cpu", "neuron"]', 'backends = ["cpu", "neuron"]\ncpu = "x"'), "[general.cpu] in"),
    ],
)
def test_build_rejects_bad_config(build_hub, tmp_path, edit, message):
    text = (ROOT / "build.toml").read_text()
    assert edit[0] in text
    (tmp_path / "build.toml").write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(build_hub.BuildError, match=re.escape(message)):
        build_hub.read_config(tmp_path / "build.toml")


def test_build_rejects_bad_id_and_out(build_hub, tmp_path):
    with pytest.raises(build_hub.BuildError, match=r"--id='Bad_Id'"):
        build_hub.build(tmp_path / "b", unique_id="Bad_Id", api={})
    # a valid prefix is not enough: the id becomes part of a torch op namespace
    with pytest.raises(build_hub.BuildError, match=r"--id='abc-X'"):
        build_hub.build(tmp_path / "b", unique_id="abc-X", api={})
    with pytest.raises(build_hub.BuildError, match="would overwrite"):
        build_hub.build(ROOT, unique_id="x", api={})


# ------------------------------------------------------------------------------ contents

def test_tree_layout(default_build):
    out, summary = default_build
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["CARD.md", *VARIANTS] + (["benchmarks"] if (out / "benchmarks").exists() else [])
    )
    assert re.fullmatch(r"[0-9a-f]{10}", summary["id"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_shipped_copies_equal_sources(default_build, variant):
    out, _ = default_build
    shipped = _tree(out / variant)
    package = {k: v for k, v in _sources(PACKAGE).items() if k != "_ops.py"}
    nki = {f"nki_src/{k}": v for k, v in _sources(ROOT / "kernels", "*.py").items()}
    generated = {"_ops.py", "metadata.json", "nki_src/__init__.py"}
    # Every source file is shipped byte for byte; nothing else ships but the generated files.
    assert {k: shipped.get(k) for k in package} == package
    assert {k: shipped.get(k) for k in nki} == nki
    assert set(shipped) == set(package) | set(nki) | generated


def test_shipped_benchmarks_equal_sources(default_build):
    out, _ = default_build
    sources = {p.name: p.read_bytes() for p in sorted((ROOT / "benchmarks").glob("benchmark*.py"))}
    shipped = _sources(out / "benchmarks") if (out / "benchmarks").exists() else {}
    assert shipped == sources


@pytest.mark.parametrize("backend", ["cpu", "neuron"])
def test_metadata(default_build, backend):
    out, summary = default_build
    variant = out / f"torch-{backend}"
    raw = json.loads((variant / "metadata.json").read_text())
    assert sorted(raw) == sorted(["name", "id", "version", "license", "backend", "python-depends", "digest"])
    assert raw["name"] == "nki-kernels"
    assert raw["id"] == f"_nki_kernels_{backend}_{summary['id']}"
    assert raw["version"] == 1
    assert raw["license"] == "Apache-2.0"
    assert raw["backend"] == {"type": backend}
    assert raw["python-depends"] == (["nki"] if backend == "neuron" else [])
    # kernels' own parser accepts it, and the digest matches the files as kernels hashes them.
    metadata = Metadata.read_from_file(variant / "metadata.json")
    assert metadata.id == raw["id"] and metadata.name.python_name == "nki_kernels"
    assert metadata.backend.backend_type == (Backend.Neuron if backend == "neuron" else Backend.CPU)
    metadata.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, variant))
    assert sorted(raw["digest"]["files"]) == sorted(set(_tree(variant)) - {"metadata.json"})


def test_digest_detects_a_changed_file(default_build, tmp_path):
    import shutil

    from kernels._rust import DigestValidationError

    out, _ = default_build
    copy = tmp_path / "torch-cpu"
    shutil.copytree(out / "torch-cpu", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "references.py").write_text((copy / "references.py").read_text() + "\n# edited\n")
    metadata = Metadata.read_from_file(copy / "metadata.json")
    with pytest.raises(DigestValidationError, match="references.py"):
        metadata.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, copy))


# ------------------------------------------------------------------------------ op namespace

@pytest.mark.parametrize("backend", ["cpu", "neuron"])
def test_generated_ops_module(default_build, backend):
    out, summary = default_build
    ns = f"_nki_kernels_{backend}_{summary['id']}"
    text = (out / f"torch-{backend}" / "_ops.py").read_text()
    assert f'_OP_NAMESPACE = "{ns}"' in text
    # The generated module offers every name the development _ops.py offers.
    def names(source: str) -> set[str]:
        tree = ast.parse(source)
        found = set()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found.add(node.name)
            elif isinstance(node, ast.Assign):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        return found

    assert names((PACKAGE / "_ops.py").read_text()) <= names(text)
    assert {"ops", "add_op_namespace_prefix"} <= names(text)


REGISTRATION_CALLS = {"custom_op", "define", "Library", "impl", "register_fake", "triton_op"}


def test_every_op_registration_goes_through_the_namespace_prefix():
    """No shipped module registers an op under a literal name (it would collide across builds)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in REGISTRATION_CALLS and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}({node.args[0].value!r})")
    assert offenders == [], "register ops with add_op_namespace_prefix(...): " + ", ".join(offenders)


# ------------------------------------------------------------------------------ reproducibility

def test_two_builds_are_byte_identical(build_hub, default_build, tmp_path):
    out, summary = default_build
    again = build_hub.build(tmp_path / "build")  # a full build, card introspection included
    assert again["id"] == summary["id"]
    assert _tree(tmp_path / "build") == _tree(out)


def test_id_override_changes_only_the_generated_files(build_hub, default_build, build_with_id):
    out, summary = default_build
    other = build_with_id("reproid")
    a, b = _tree(out), _tree(other)
    assert set(a) == set(b)
    changed = sorted(k for k in a if a[k] != b[k])
    assert changed == [f"{v}/{f}" for v in VARIANTS for f in ("_ops.py", "metadata.json")]
    assert b"_nki_kernels_cpu_reproid" in b["torch-cpu/_ops.py"]


def test_content_id_follows_the_sources(build_hub):
    config = build_hub.read_config(ROOT / "build.toml")
    sources = build_hub.collect_sources(ROOT, config)
    toml = (ROOT / "build.toml").read_bytes()
    base = build_hub.content_id(toml, sources)
    assert base == build_hub.content_id(toml, sources)
    edited = dict(sources.nki)
    name = sorted(edited)[0]
    edited[name] = edited[name] + b"\n"
    assert build_hub.content_id(toml, build_hub.Sources(sources.package, edited, sources.benchmarks)) != base
    # the package's own sources too (the torch ops, the simulator): mutation testing found
    # them dropped from the hash unnoticed
    package = dict(sources.package)
    name = sorted(package)[0]
    package[name] = package[name] + b"\n"
    assert build_hub.content_id(toml, build_hub.Sources(package, sources.nki, sources.benchmarks)) != base
    assert build_hub.content_id(toml.replace(b"version = 1", b"version = 2"), sources) != base


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-out", "relative-out"])
def test_make_build_command_writes_build_dir(tmp_path, relative):
    # a relative --out resolved twice (the card's introspection runs in the build folder)
    # and failed with a half-written tree until session 68
    out = tmp_path / "cli-build"
    report = tmp_path / "report.md"
    report.write_text("# Modeled report\n\n| op | modeled µs |\n|---|---|\n| gelu | 3.25 |\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_hub.py"), "--out", "cli-build" if relative else str(out),
         "--id", "cli", "--repo-id", "me/other", "--report", str(report)],
        capture_output=True, text=True, cwd=tmp_path if relative else ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "_nki_kernels_cpu_cli" in result.stdout and "_nki_kernels_neuron_cli" in result.stdout
    assert not list(out.rglob("__pycache__"))  # the card's introspection writes no bytecode
    assert (out / "CARD.md").is_file() and (out / "torch-cpu" / "metadata.json").is_file()
    card = (out / "CARD.md").read_text()          # the flags reach the card
    assert 'get_kernel("me/other"' in card and "| gelu | 3.25 |" in card


# ------------------------------------------------------------------------------ card

def test_card(default_build):
    out, summary = default_build
    card = (out / "CARD.md").read_text()
    assert card.startswith("---\nlibrary_name: kernels\n")
    assert f'get_kernel("{summary["repo_id"]}", version=1' in card
    functions = [e for e in summary["api"]["public"] if e["kind"] == "function"]
    assert functions, "the package exports no function"
    for entry in functions:
        assert f"### `{entry['name']}(" in card
        assert entry["doc"] and entry["doc"] in card  # the docstring carries the shape/dtype limits
    for entry in summary["api"]["layers"]:
        assert f"### `layers.{entry['name']}`" in card
    assert "Benchmarks (modeled)" in card and "not measurements" in card
    report = ROOT / "out" / "report" / "report.md"
    if report.is_file():
        assert summary["report"]
    else:
        assert "make demo" in card
    assert "Running the tests on a Trainium host" in card
    # the Hub's front matter takes SPDX ids in lower case; versions are v<major> branches
    assert "\nlicense: apache-2.0\n" in card
    assert 'revision="v1"' in card                      # build.toml: version = 1


def test_card_embeds_the_modeled_report(build_hub, tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# Modeled report\n\n| op | modeled µs |\n|---|---|\n| gelu | 1.0 |\n")
    api = {"doc": "doc", "public": [{"name": "gelu", "kind": "function", "doc": "GELU.", "signature": "(x)"}], "layers": []}
    config = build_hub.read_config(ROOT / "build.toml")
    card = build_hub.render_card(config, api, report.read_text(), [])
    assert "### Modeled report" in card and "| gelu | 1.0 |" in card
    assert card.index("## Benchmarks (modeled)") < card.index("### Modeled report")

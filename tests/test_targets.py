"""The target seam: the registry, the protocols, identities in traces, known-findings modes."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from caches.protocol import PROTOCOLS, protocol_ops
from caches.target import FIND, Identity, Target, TargetUnavailable, content_hash, git_commit
from state_machines import targets as registry_mod
from state_machines.cli import main
from state_machines.run import Run
from state_machines.trace import load_trace
from caches.adapters.reference.target import TARGET as REFERENCE
from state_machines.variants import all_variants, get_variant

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_registers_exactly_the_builtin_targets():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "entry-points"]["kvcheck.targets"]
    assert declared == registry_mod.BUILTIN


def test_installed_entry_points_list_kvchecks_own_targets():
    found = {ep.name: ep.value for ep in entry_points(group=registry_mod.GROUP)}
    for name, value in registry_mod.BUILTIN.items():
        assert found.get(name) == value


def test_every_variant_has_the_reference_target_first():
    for spec in all_variants().values():
        assert spec.targets[0] == "reference"
        assert spec.name in REFERENCE.builders


@pytest.mark.parametrize("variant", sorted(PROTOCOLS))
def test_protocol_declares_exactly_the_op_table(variant):
    spec = get_variant(variant)
    assert sorted(protocol_ops(variant)) == sorted(n for n in spec.ops.names()
                                                   if n != "quiesce")


@pytest.mark.parametrize("variant", sorted(PROTOCOLS))
def test_reference_subjects_satisfy_their_protocol(variant):
    spec = get_variant(variant)
    subject = spec.make_subject(spec.regimes[0], device="cpu")
    assert isinstance(subject, PROTOCOLS[variant])


def test_unknown_and_broken_targets_are_refused_by_name(monkeypatch):
    """A plug-in whose module does not import is listed with the reason and refused by name;
    it is registered as an entry point, the way an installed package registers one, so the
    check runs whether kvcheck itself is installed or not."""
    from importlib import metadata

    real = metadata.entry_points
    broken = metadata.EntryPoint("broken", "no_such_module_xyz:TARGET", registry_mod.GROUP)

    def entry_points(**kw):
        found = list(real(**kw))
        return found + [broken] if kw.get("group") == registry_mod.GROUP else found

    monkeypatch.setattr(registry_mod.metadata, "entry_points", entry_points)
    registry_mod.registry.cache_clear()
    try:
        reg = registry_mod.registry()
        assert reg["broken"].target is None and "ModuleNotFoundError" in reg["broken"].error
        assert reg["reference"].target is REFERENCE  # the built-in ones still load
        with pytest.raises(registry_mod.UnknownTarget, match="could not be loaded"):
            registry_mod.get_target("broken")
        with pytest.raises(registry_mod.UnknownTarget, match="unknown target 'nope'"):
            registry_mod.get_target("nope")
        assert "unknown target" in registry_mod.unavailable_reason("nope")
    finally:
        registry_mod.registry.cache_clear()


def test_a_broken_entry_point_is_reported_not_fatal():
    entry = registry_mod._entry("x", "json:dumps", "test")
    assert entry.target is None and "not a caches.target.Target" in entry.error
    entry = registry_mod._entry("y", "caches.adapters.reference.target:TARGET", "test")
    assert entry.target is REFERENCE and entry.error is None
    # an install made before the reference target moved beside the others still loads it
    entry = registry_mod._entry("y", "state_machines.variants:REFERENCE", "test")
    assert entry.target is REFERENCE and entry.error is None


def test_unavailable_target_raises_before_building():
    built = []
    t = Target("ghost", "ghost", "never here", {"radix": lambda *a, **k: built.append(1)},
               unavailable=lambda src: "ghost is not installed")
    with pytest.raises(TargetUnavailable, match="not installed"):
        t.build("radix", {})
    assert not built
    with pytest.raises(ValueError, match="takes no --src"):
        replace(t, unavailable=lambda src: None).build("radix", {}, src="/tmp")


def test_identity_label_and_json_round_trip():
    ident = Identity("sglang", "0.5.12.post1", "sha256:0123456789abcdef")
    assert ident.label() == "sglang-0.5.12.post1-01234567"
    assert Identity.from_json(ident.to_json()) == ident
    assert Identity.from_json({"engine": 1}) is None


def test_content_hash_changes_with_the_source(tmp_path):
    f = tmp_path / "cache.py"
    f.write_text("x = 1\n")
    a = content_hash([f])
    f.write_text("x = 2\n")
    assert content_hash([f]) != a and a.startswith("sha256:")


def test_git_commit_reads_head_of_this_checkout():
    commit = git_commit(ROOT)
    if (ROOT / ".git").exists():
        assert commit is not None and len(commit) == 40
        int(commit, 16)


def test_a_snapshot_inside_another_work_tree_is_identified_by_its_files(tmp_path):
    """A source folder that sits inside some git work tree (``shared/`` symlinked into one)
    is not that tree's commit: only a checkout's own root is identified by its commit."""
    import subprocess

    repo = tmp_path / "outer"
    (repo / "snap").mkdir(parents=True)
    (repo / "snap" / "m.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    head = git_commit(repo)
    assert head
    assert git_commit(repo / "snap") is None  # no walk up into the outer tree
    link = tmp_path / "shared"
    link.symlink_to(repo)
    assert git_commit(link / "snap") is None


def test_traces_record_identity_and_known_findings(tmp_path):
    spec = get_variant("radix")
    run = Run(spec, spec.check_params({}), "R1", device="cpu", known_findings=FIND)
    trace = run.trace()
    assert trace.identity == REFERENCE.identity()
    assert trace.identity.engine == "kvcheck"
    path = trace.save(tmp_path)
    raw = json.loads(path.read_text())
    assert raw["known_findings"] == "find" and raw["target_identity"]["engine"] == "kvcheck"
    again = load_trace(path)
    assert again.identity == trace.identity and again.known_findings == "find"


def test_upstream_trace_name_carries_the_target_and_its_source(tmp_path):
    spec = get_variant("radix")
    trace = Run(spec, spec.check_params({}), device="cpu").trace()
    trace.target = "sglang"
    trace.identity = Identity("sglang", "0.5.12.post1", "sha256:aaaaaaaabbbb")
    a = trace.name()
    assert a.startswith("radix-sglang-sglang-0.5.12.post1-aaaaaaaa-")
    trace.identity = Identity("sglang", "0.5.12.post1", "sha256:ccccccccdddd")
    assert trace.name() != a  # two sources never share a trace name


@pytest.mark.parametrize("field,value,message", [
    ("known_findings", "maybe", "known_findings"),
    ("target_identity", {"engine": "x"}, "target_identity"),
    ("src", 7, "'src'"),
    ("target", "nope", "unknown target 'nope'"),
])
def test_trace_loader_rejects_bad_seam_fields(tmp_path, capsys, field, value, message):
    src = next((ROOT / "tests" / "regressions").glob("radix-*.json"))
    raw = json.loads(src.read_text())
    raw[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    assert main(["replay", str(bad)]) == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_unknown_target_and_src_without_checkout(capsys, tmp_path):
    assert main(["fuzz", "radix", "--target", "nope", "--max-examples", "1"]) == 2
    assert "unknown target 'nope'" in capsys.readouterr().err
    assert main(["fuzz", "radix", "--src", str(tmp_path), "--max-examples", "1"]) == 2
    assert "takes no --src" in capsys.readouterr().err


def test_list_shows_targets_with_origin_and_usability(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "targets (entry-point group kvcheck.targets):" in out
    assert "reference" in out and "usable here" in out
    assert registry_mod.registry()["reference"].value in out  # where it was loaded from
    assert "sglang" in out


def test_coverage_and_check_take_a_target(capsys):
    assert main(["--profile", "ci", "check", "radix", "--depth", "1",
                 "--target", "reference"]) == 0
    assert main(["coverage", "radix", "--target", "nope", "--max-examples", "1"]) == 2
    assert "unknown target" in capsys.readouterr().err


# -- known findings one by one -------------------------------------------------------------------
@pytest.mark.parametrize("text, normal", [("decline", "decline"), ("find", "find"),
                                          ("find=f1", "find=F1"), ("find=R2, F1,R2", "find=F1,R2")])
def test_known_findings_settings_normalise(text, normal):
    from caches.target import parse_known_findings

    assert parse_known_findings(text) == normal


@pytest.mark.parametrize("text", ["maybe", "find=", "find=F1;R2", "decline=F1", ""])
def test_malformed_known_findings_setting_is_refused(text):
    from caches.target import parse_known_findings

    with pytest.raises(ValueError):
        parse_known_findings(text)


def test_finds_drives_only_the_named_findings():
    from caches.target import finds

    assert finds("find", "F1") and not finds("decline", "F1")
    assert finds("find=F1,R2", "R2") and not finds("find=F1", "R2")


def test_target_checks_finding_ids_per_variant():
    t = Target(name="t", engine="e", summary="", builders={"radix": lambda *a, **k: None},
               findings={"radix": ("F1", "R2")})
    assert t.known_findings("radix", "find=r2") == "find=R2"
    with pytest.raises(ValueError, match=r"no known finding F7 .*known: F1, R2"):
        t.known_findings("radix", "find=F7")
    assert t.known_findings("radix", "find=F1,F7", strict=False) == "find=F1"
    assert t.known_findings("radix", "find=F7", strict=False) == "decline"


@pytest.mark.parametrize("cmd", [["fuzz", "radix"], ["coverage", "radix"],
                                 ["gate", "--replay-only"], ["nightly", "--budget", "1"]])
def test_cli_refuses_an_unknown_finding_id_in_one_line(capsys, cmd, tmp_path):
    code = main(cmd + ["--known-findings", "find=Q9"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Q9" in err, err


def test_trace_records_a_per_finding_setting(tmp_path):
    spec = get_variant("radix")
    run = Run(spec, spec.check_params({}), None, device="cpu", known_findings="find=F1")
    path = run.trace().save(tmp_path)
    assert load_trace(path).known_findings == "find=F1"

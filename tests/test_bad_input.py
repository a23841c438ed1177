"""Bad input never gets a traceback: every wrong argument, name, number, path or trace field is
exit 2 with one clear line; a fuzz of the trace loader over mutated real traces only ever
exits 0, 1 or 2.  Run through the real entry point (``state_machines.cli.main``, and a few
real ``python -m state_machines`` processes)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from state_machines.cli import main

REGRESSIONS = sorted(Path("tests/regressions").glob("*.json"))
RADIX = json.loads(Path("tests/regressions/radix-25986a889f.json").read_text())


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.strip().splitlines()
    assert lines and lines[0].startswith("kvcheck: error: "), err
    assert len(lines) <= 2 and "usage:" not in err, err  # one line (+ a hint), no usage block
    for needle in needles:
        assert needle in err, (needle, err)


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["fuzz", "radix", "--budget", "nan"], "--budget"),
    (["fuzz", "radix", "--budget", "inf"], "--budget"),
    (["fuzz", "radix", "--budget", "1e400"], "--budget"),
    (["fuzz", "radix", "--budget", "-1"], "--budget"),
    (["fuzz", "radix", "--budget", "0"], "--budget"),
    (["fuzz", "radix", "--budget", "soon"], "--budget"),
    (["fuzz", "radix", "--max-examples", "-1"], "--max-examples"),
    (["fuzz", "radix", "--max-examples", "0"], "--max-examples"),
    (["fuzz", "radix", "--max-examples", "2.5"], "--max-examples"),
    (["fuzz", "radix", "--max-examples", "9" * 5000], "--max-examples"),
    (["fuzz", "radix", "--max-examples", "5", "--budget", "5"], "not allowed with"),
    (["fuzz", "radix", "--seed", "1e5"], "--seed"),
    (["fuzz", "radix", "--device", "mps"], "mps"),
    (["fuzz", "radix", "--device", "meta"], "meta"),
    (["fuzz", "radix", "--device", "toaster"], "toaster"),
    (["fuzz", "radix", "--device", "cuda:99"], "cuda:99"),
    (["fuzz", "radix", "--page-size", "0"], "page_size"),
    (["fuzz", "radix", "--page-size", "100000"], "page_size"),
    (["fuzz", "radix", "--param", "nope=1"], "nope"),
    (["fuzz", "radix", "--param", "page_size=abc"], "not an integer"),
    (["fuzz", "radix", "--param", "page_size"], "NAME=VALUE"),
    (["fuzz", "radix", "--target", "nope"], "unknown target"),
    (["fuzz", "radix", "--fault", "H1"], "belongs to variant"),
    (["fuzz", "radix", "--fault", "Q7"], "unknown fault"),
    (["fuzz", "nope"], "unknown variant"),
    (["fuzz"], "variant"),
    (["explode"], "invalid choice"),
    ([], "command"),
    (["--profile", "nope", "list"], "--profile"),
    (["--op-deadline", "-1", "list"], "--op-deadline"),
    (["--op-deadline", "nan", "list"], "--op-deadline"),
    (["--op-deadline", "inf", "list"], "--op-deadline"),
    (["nightly", "--budget", "nan"], "--budget"),
    (["nightly", "--budget", "inf"], "--budget"),
    (["nightly", "--workers", "0"], "--workers"),
    (["nightly", "--workers", "-3"], "--workers"),
    (["nightly", "--variant", "nope"], "unknown variant"),
    (["nightly", "--fault", "Q7"], "unknown fault"),
    (["nightly", "--database", "ftp://example.org/db"], "ftp"),
    (["nightly", "--database", "http://example.org/db"], "http"),
    (["nightly", "--github-artifact", "no-slash"], "OWNER/REPO"),
    (["check", "radix", "--max-states", "-1"], "--max-states"),
    (["check", "radix", "--max-states", "0"], "--max-states"),
    (["check", "radix", "--depth", "-1"], "--depth"),
    (["check", "radix", "--fault", "H1"], "belongs to variant"),
    (["check", "radix", "--param", "pool_pages=-4"], "pool_pages"),
    (["check", "--fault", "R1"], "needs a variant"),
    (["bench", "--seeds", "0"], "--seeds"),
    (["bench", "--examples", "0"], "--examples"),
    (["bench", "nope"], "unknown variant"),
    (["coverage", "radix", "--budget", "nan"], "--budget"),
    (["coverage", "radix", "--max-examples", "-5"], "--max-examples"),
    (["coverage", "nope"], "unknown variant"),
    (["faults", "--variant", "nope"], "unknown variant"),
    (["faults", "--max-examples", "0"], "--max-examples"),
    (["faults", "--engine", "native", "--budget", "0"], "--budget"),
    (["faults", "--engine", "native", "--max-examples", "5"], "--max-examples"),
    (["gate", "--variant", "nope"], "unknown variant"),
    (["gate", "--max-examples", "0"], "--max-examples"),
    (["gate", "--replay-only", "--corpus", "nonexistent-dir"], "no such directory"),
    (["diff", "radix", "--target", "reference"], "nothing to compare"),
    (["list", "--src", "nonexistent-dir"], "no such directory"),
    (["fuzz", "radix", "--param", "fast_finish=1"], "unknown parameter(s) ['fast_finish']"),
    (["diff", "radix", "--target", "nope"], "unknown target 'nope'"),
    (["replay"], "file"),
    (["replay", "/no/such/trace.json"], "no such file"),
    (["replay", "tests"], "is a directory"),
])
def test_bad_arguments_exit_two_in_one_line(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert_usage_error(code, err, needle)


def test_unusable_output_paths_are_refused_before_the_run(capsys, tmp_path):
    a_file = tmp_path / "README.md"
    a_file.write_text("not a folder\n")
    for argv in (["fuzz", "radix", "--fault", "R1", "--out", a_file],
                 ["fuzz", "radix", "--out", a_file / "sub"],
                 ["check", "radix", "--fault", "R1", "--out", a_file],
                 ["nightly", "--budget", "5", "--out", a_file],
                 ["nightly", "--budget", "5", "--database", a_file],
                 ["nightly", "--budget", "5", "--database", a_file / "db"],
                 ["faults", "--variant", "radix", "--corpus", a_file],
                 ["bench", "radix", "--write", a_file / "bench.md"]):
        code, out, err = run(capsys, *argv)
        assert_usage_error(code, err, str(a_file))
        assert "fuzzing" not in err and "checking" not in err  # refused before any work
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs a /proc file system")
def test_nightly_into_a_place_that_refuses_folders_is_one_line(capsys):
    """/proc refuses a new folder whatever its access bits say (and root passes every bits
    check): the nightly job tries to create its --out before it starts, and says why not."""
    code, _, err = run(capsys, "nightly", "--budget", "5", "--variant", "radix",
                       "--out", "/proc/kvcheck-no-such-dir")
    assert_usage_error(code, err, "/proc/kvcheck-no-such-dir", "cannot write there")


def test_replay_html_to_an_unusable_path(capsys, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(RADIX))
    code, _, err = run(capsys, "replay", trace, "--html", tmp_path)
    assert_usage_error(code, err, "is a directory")
    code, _, err = run(capsys, "replay", trace, "--html", tmp_path / "no" / "such" / "r.html")
    assert_usage_error(code, err, "no such directory")


def test_a_trace_that_cannot_be_written_goes_to_a_temp_dir(tmp_path, capsys):
    from state_machines.trace import Trace
    from state_machines.ops import Op

    blocker = tmp_path / "file"
    blocker.write_text("")
    trace = Trace("radix", {"page_size": 1, "pool_pages": 16}, [Op("insert", {"tokens": [1]})])
    path = trace.save(blocker)  # a file where the folder should be: cannot write there
    err = capsys.readouterr().err
    assert path.exists() and path.parent != blocker and str(path) in err
    assert json.loads(path.read_text())["ops"] == [{"op": "insert", "tokens": [1]}]


# -- trace files ----------------------------------------------------------------------------------
def mutated(**changes):
    data = copy.deepcopy(RADIX)
    for key, value in changes.items():
        if value is DELETE:
            data.pop(key, None)
        else:
            data[key] = value
    return json.dumps(data)


DELETE = object()
WRONG_TYPES = [None, True, 0, 1.5, "x", [], ["R1"], {}, {"a": 1}]


def _field_cases():
    cases = []
    for field, good_types in (("format", (str,)), ("version", (int,)), ("variant", (str,)),
                              ("params", (dict,)), ("ops", (list,)), ("fault", (str, type(None))),
                              ("target", (str,)), ("violation", (dict, type(None))),
                              ("meta", (dict, type(None)))):
        for value in WRONG_TYPES:
            if isinstance(value, good_types) and not isinstance(value, bool):
                continue
            cases.append(pytest.param(mutated(**{field: value}), field,
                                      id=f"{field}={json.dumps(value)}"))
    return cases


@pytest.mark.parametrize("content, needle", _field_cases())
def test_every_trace_field_of_a_wrong_type_is_exit_two(capsys, tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, _, err = run(capsys, "replay", path)
    assert_usage_error(code, err, str(path))
    if needle not in ("format", "version"):  # those two say "not a kvcheck trace" / "version"
        assert needle in err


BAD_TRACES = {
    "violation without property": mutated(violation={"message": "m", "step": 1}),
    "violation property not a string": mutated(violation={"property": 3, "step": 1}),
    "violation message not a string": mutated(violation={"property": "p", "message": [1]}),
    "violation step not an int": mutated(violation={"property": "p", "step": "1"}),
    "fault as a list": mutated(fault=["R1"]),
    "target as a list": mutated(target=["reference"]),
    "target sglang without its environment": mutated(target="sglang"),
    "unknown target": mutated(target="no-such-engine"),
    "a target without the variant": mutated(target="vllm"),
    "unknown fault": mutated(fault="Z9"),
    "another variant's fault": mutated(fault="H1"),
    "unknown variant": mutated(variant="nope"),
    "param unknown": mutated(params={"nope": 1}),
    "param a string": mutated(params={"page_size": "4"}),
    "param a float": mutated(params={"page_size": 4.0}),
    "param a bool": mutated(params={"page_size": True}),
    "param huge": mutated(params={"page_size": 10**30}),
    "param negative": mutated(params={"page_size": -4}),
    "op not an object": mutated(ops=[1]),
    "op name not a string": mutated(ops=[{"op": 1}]),
    "op unknown": mutated(ops=[{"op": "explode"}]),
    "op missing argument": mutated(ops=[{"op": "insert"}]),
    "op extra argument": mutated(ops=[{"op": "insert", "tokens": [1], "x": 1}]),
    "tokens not a list": mutated(ops=[{"op": "insert", "tokens": "abc"}]),
    "token a float": mutated(ops=[{"op": "insert", "tokens": [1.5]}]),
    "token negative": mutated(ops=[{"op": "insert", "tokens": [-1]}]),
    "token huge": mutated(ops=[{"op": "insert", "tokens": [2**40]}]),
    "token a bool": mutated(ops=[{"op": "insert", "tokens": [True]}]),
    "version a string": mutated(version="1"),
    "version true": mutated(version=True),
    "version missing": mutated(version=DELETE),
    "format missing": mutated(format=DELETE),
    "variant missing": mutated(variant=DELETE),
    "a list": "[]",
    "null": "null",
    "a number": "1",
    "a string": '"kvcheck-trace"',
    "empty": "",
    "truncated": mutated()[:-20],
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "a 5,000-digit integer": mutated()[:-1] + ', "x": ' + "9" * 5000 + "}",
    "NaN param": mutated()[:-1].replace('"pool_pages": 16', '"pool_pages": NaN') + "}",
    "Infinity param": mutated().replace('"pool_pages": 16', '"pool_pages": Infinity'),
}


@pytest.mark.parametrize("content", list(BAD_TRACES.values()), ids=list(BAD_TRACES))
@pytest.mark.parametrize("html", [False, True], ids=["text", "html"])
def test_bad_trace_is_exit_two_in_one_line(capsys, tmp_path, content, html):
    path = tmp_path / "bad.json"
    path.write_text(content)
    extra = ["--html", tmp_path / "r.html"] if html else []
    code, _, err = run(capsys, "replay", path, *extra)
    assert_usage_error(code, err, str(path))
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("target, needle", [("no-such-engine", "unknown target 'no-such-engine'"),
                                            ("vllm", "vllm")])
def test_a_trace_for_an_unknown_target_names_it(capsys, tmp_path, target, needle):
    path = tmp_path / "bad.json"
    path.write_text(mutated(target=target))
    code, _, err = run(capsys, "replay", path)
    assert_usage_error(code, err, str(path), needle)


def test_non_utf8_trace_is_exit_two(capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"format": "\xff\xfe"}')
    code, _, err = run(capsys, "replay", path)
    assert_usage_error(code, err, "cannot read")


def test_one_bad_trace_among_several_runs_none(capsys, tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps({**RADIX, "violation": None}))
    bad.write_text("{")
    code, out, err = run(capsys, "replay", good, bad)
    assert_usage_error(code, err, str(bad))
    assert "replaying" not in out


# -- a Hypothesis fuzz of the loader over mutated real traces ------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(["R1", "H1", "sglang", "reference", "radix",
                                              "insert", "admit", "quiesce", "page_size"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                              max_size=4),
    max_leaves=8)


@st.composite
def mutated_traces(draw):
    data = copy.deepcopy(json.loads(draw(st.sampled_from(REGRESSIONS)).read_text()))
    for _ in range(draw(st.integers(1, 3))):
        # walk to a random container, then replace, delete or add one entry in it
        node = data
        while True:
            kids = (list(node.items()) if isinstance(node, dict) else list(enumerate(node)))
            containers = [k for k, v in kids if isinstance(v, (dict, list)) and v]
            if not containers or draw(st.booleans()):
                break
            node = node[draw(st.sampled_from(containers))]
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "add" or not keys:
            if isinstance(node, dict):
                node[draw(st.sampled_from(["op", "tokens", "rid", "n", "fault", "x"]))] = \
                    draw(JSON)
            else:
                node.append(draw(JSON))
        elif action == "delete":
            del node[draw(st.sampled_from(keys))]
        else:
            node[draw(st.sampled_from(keys))] = draw(JSON)
    return data


@pytest.fixture
def _keep_profiles(monkeypatch):
    # main() (re)registers and loads a Hypothesis profile; inside @given that is deprecated
    monkeypatch.setattr("state_machines.profiles.load_profile", lambda name=None: name)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=mutated_traces())
def test_mutated_real_traces_exit_zero_one_or_two(data, tmp_path_factory, capsys,
                                                  _keep_profiles):
    path = tmp_path_factory.mktemp("mut") / "t.json"
    path.write_text(json.dumps(data))
    code = main(["replay", str(path)])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 2:
        assert err.startswith("kvcheck: error: ") and len(err.strip().splitlines()) <= 2, err


# -- a few real processes -------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["fuzz", "radix", "--budget", "nan"],
    ["fuzz", "radix", "--device", "mps"],
    ["nightly", "--budget", "inf"],
    ["gate", "--replay-only", "--corpus", "nonexistent-dir"],
    ["replay", "DEEP"],
    ["replay", "SGLANG"],
])
@pytest.mark.slow  # one kvcheck process per case
def test_real_processes_exit_two_without_a_traceback(tmp_path, argv):
    deep, sglang = tmp_path / "deep.json", tmp_path / "sglang.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    sglang.write_text(mutated(target="sglang"))
    argv = [{"DEEP": str(deep), "SGLANG": str(sglang)}.get(a, a) for a in argv]
    p = subprocess.run([sys.executable, "-m", "state_machines", *argv], capture_output=True,
                       text=True, timeout=120)
    assert_usage_error(p.returncode, p.stderr)


# -- bad names and URLs are refused before any work ------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["nightly", "--budget", "5", "--database", "ftp://x/y"],
    ["nightly", "--variant", "nope"],
    ["nightly", "--target", "nope"],
    ["gate", "--variant", "nope"],
    ["gate", "--target", "nope"],
    ["fuzz", "nope"],
    ["fuzz", "radix", "--target", "nope"],
])
@pytest.mark.slow  # one kvcheck process per case
def test_bad_names_leave_nothing_behind(tmp_path, argv):
    """Run in an empty folder: exit 2, one line on stderr, and the folder still empty (no
    ``kvcheck-nightly/``, no traces folder, no example database)."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "state_machines", *argv], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=env)
    assert_usage_error(p.returncode, p.stderr, "nope" if "nope" in argv else "ftp")
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert sorted(os.listdir(tmp_path)) == []


def test_light_name_lists_match_the_registries():
    """The names checked before any import are the registries' own names, in their order."""
    from state_machines.targets import registry, target_names
    from state_machines.variant_names import NAMES
    from state_machines.variants import SPECS

    assert NAMES == tuple(SPECS)
    assert target_names() == list(registry())


def test_names_known_refuses_only_unknown_names():
    from state_machines.commands.common import UsageError, names_known

    names_known(["radix", "block-hash"], "reference")
    with pytest.raises(UsageError, match="unknown variant 'nope'"):
        names_known(["radix", "nope"])
    with pytest.raises(UsageError, match="unknown target 'nope'"):
        names_known([], "nope")

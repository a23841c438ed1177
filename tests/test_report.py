"""``kvcheck report`` without an engine: its error paths (exit 2, one line), and the recorder
that writes a driver's calls as code, on a small fake engine module -- the recorded lines,
executed against a fresh object, must leave it in the state the recorded run left."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from state_machines.call_recorder import CallRecorder, ReportError
from state_machines.trace import load_trace
from tests.test_bad_input import assert_usage_error, run

FINDING = Path("tests/upstream_findings/sglang-radix-F1-unmatched-unlock.json")
REFERENCE = {"format": "kvcheck-trace", "version": 1, "variant": "radix",
             "params": {"page_size": 1, "pool_pages": 16},
             "ops": [{"op": "insert", "tokens": [0]}, {"op": "insert", "tokens": [0, 0]}]}


# -- error paths -------------------------------------------------------------------------------
def test_missing_trace(capsys, tmp_path):
    code, _, err = run(capsys, "report", tmp_path / "nope.json")
    assert_usage_error(code, err, "no such file")


def test_not_a_trace(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "report", bad)
    assert_usage_error(code, err, "not valid JSON")


def test_reference_trace_has_nothing_upstream(capsys, tmp_path):
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(REFERENCE))
    code, _, err = run(capsys, "report", path, "--out", tmp_path / "out")
    assert_usage_error(code, err, "reference cache")
    assert not (tmp_path / "out").exists()


def test_unknown_target(capsys, tmp_path):
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(REFERENCE))
    code, _, err = run(capsys, "report", path, "--target", "nosuch")
    assert_usage_error(code, err, "nosuch")


def test_bad_out_dir(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, "report", FINDING, "--out", blocker / "sub")
    assert_usage_error(code, err, "--out")


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None,
                    reason="sglang is installed in this Python")
def test_target_not_installed_names_the_env(capsys, tmp_path):
    code, _, err = run(capsys, "report", FINDING, "--out", tmp_path)
    assert_usage_error(code, err, "target sglang cannot be used here", "ci/upstream/setup.sh")
    assert not list(tmp_path.iterdir())


def test_a_fault_trace_and_a_target_without_reporter_are_refused(tmp_path):
    from state_machines.report import build_report

    path = tmp_path / "ref.json"
    path.write_text(json.dumps({**REFERENCE, "fault": "R1"}))
    with pytest.raises(ReportError, match="catalogued fault R1"):
        build_report(load_trace(path))
    path.write_text(json.dumps(REFERENCE))
    with pytest.raises(ReportError, match="no reporter for variant 'radix'"):
        build_report(load_trace(path))  # kvcheck's reference subject has no report_setup


# -- the recorder, on a fake engine ------------------------------------------------------------
FAKE_ENGINE = '''
import dataclasses


@dataclasses.dataclass
class Key:
    tokens: list
    salt: str = ""


class Node:
    def __init__(self, parent=None):
        self.parent, self.children, self.lock = parent, {}, 0


class Tree:
    def __init__(self, size):
        self.size, self.root, self.log = size, Node(), []

    def insert(self, key):
        node = self.root
        for t in key.tokens:
            node = node.children.setdefault(t, Node(node))
            self._touch(node)
        return node

    def _touch(self, node):  # an internal call: never recorded
        self.log.append("touch")

    def unlock(self, node):
        node.lock -= 1
        return node.lock

    def refuse(self, n):
        raise ValueError(n)
'''


@pytest.fixture
def engine(tmp_path, monkeypatch):
    (tmp_path / "kvr_fake_engine.py").write_text(FAKE_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import kvr_fake_engine

    yield kvr_fake_engine
    sys.modules.pop("kvr_fake_engine", None)


def test_recorded_calls_replay_to_the_same_state(engine):
    tree = engine.Tree(4)
    rec = CallRecorder()
    rec.instrument(tree, "tree")
    rec.name(tree.root, "tree.root")
    tree.insert(engine.Key([9]))  # not recording: not written
    rec.active = True
    leaf = tree.insert(engine.Key([1, 2], salt="s"))
    assert tree.unlock(leaf.parent) == -1  # a node reached by walking: written as its path
    tree.size = 5
    with pytest.raises(ValueError):
        tree.refuse(3)
    rec.active = False
    rec.restore()
    assert type(tree) is engine.Tree
    codes = [line.code for line in rec.lines]
    assert codes == ["v1 = tree.insert(Key(tokens=[1, 2], salt='s'))",
                     "tree.unlock(tree.root.children[1])  # -> -1",
                     "tree.size = 5",
                     "tree.refuse(3)"]
    assert [line.raised for line in rec.lines] == [None, None, None, "ValueError"]
    assert rec.imports == {"kvr_fake_engine": {"Key"}}
    # the lines (but the failing call) on a fresh tree in the same start state
    fresh = engine.Tree(4)
    fresh.insert(engine.Key([9]))
    scope = {"tree": fresh, "Key": engine.Key}
    for code in codes[:-1]:
        exec(code, scope)
    shape = lambda n: (n.lock, {k: shape(c) for k, c in n.children.items()})  # noqa: E731
    assert shape(fresh.root) == shape(tree.root) and fresh.size == tree.size == 5
    assert fresh.log == tree.log  # the engine's internal calls ran the same


def test_recorder_refuses_a_kvcheck_object(engine):
    from caches.request import Req

    tree = engine.Tree(4)
    rec = CallRecorder()
    rec.instrument(tree, "tree")
    rec.active = True
    with pytest.raises(ReportError, match="not an engine object"):
        tree.unlock(Req(1, [0]))
    rec.restore()

"""The wheel carries the trace corpus: ``tests/regressions/*.json`` and
``tests/upstream_findings/*.json`` are copied into ``state_machines/corpus/`` when the wheel is
built, so that an installed ``kvcheck gate`` replays them from any directory.  The traces stay
where they are in git (one copy); ``state_machines/regressions.py`` finds either place."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CORPUS = ("regressions", "upstream_findings")


class BuildPyWithCorpus(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own tests/ folders
        dest = Path(self.build_lib, "state_machines", "corpus")
        shutil.rmtree(dest, ignore_errors=True)  # no stale trace from an earlier build
        for name in CORPUS:
            traces = sorted((ROOT / "tests" / name).glob("*.json"))
            if not traces:
                raise SystemExit(f"setup.py: no traces in tests/{name}: the wheel would "
                                 "carry no corpus")
            (dest / name).mkdir(parents=True)
            for path in traces:
                shutil.copyfile(path, dest / name / path.name)


setup(cmdclass={"build_py": BuildPyWithCorpus})

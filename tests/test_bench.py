"""``kvcheck bench``'s report renders every section and the command that produced it (the
measurements themselves are a benchmark, not a test: nothing here times anything)."""

from state_machines.bench import format_extra, markdown


def test_markdown_report_has_every_table_and_the_command():
    result = {
        "profile": "ci", "hypothesis_ceiling": 2500.0,
        "rows": [{"variant": "radix", "params": {"page_size": 1}, "steps": 100,
                  "machine_steps_per_s": 900.0, "checked_steps_per_s": 9000.0,
                  "bare_ops_per_s": 30000.0, "check_cost": 3.3}],
        "faults": [{"variant": "radix", "fault": "R1", "name": "add-leaf-subtracts-parent",
                    "seeds": 5, "caught": 5, "on_property": 5,
                    "median_first_detection_s": 0.4, "median_shrunk_steps": 2,
                    "max_shrunk_steps": 3},
                   {"variant": "radix", "fault": "R9", "name": "never-caught", "seeds": 5,
                    "caught": 0, "on_property": 0, "median_first_detection_s": None,
                    "median_shrunk_steps": None, "max_shrunk_steps": None}],
        "xdist": [{"workers": n, "items": 2, "examples": 300, "seconds": 10.0 / n,
                   "examples_per_s": 30.0 * n, "ok": True, "command": "python -m pytest"}
                  for n in (1, 2)],
    }
    md = markdown(result, "kvcheck bench radix --write docs/benchmarks.md")
    assert "kvcheck bench radix --write docs/benchmarks.md" in md
    assert "| radix | page_size=1 | 100 | 900 | 9,000 | 30,000 | 3.30x |" in md
    assert "2,500 steps/s" in md
    assert "| radix | R1 add-leaf-subtracts-parent | 5/5 | 5/5 | 0.400 | 2 | 3 |" in md
    assert "| radix | R9 never-caught | 0/5 | 0/5 | - | - | - |" in md
    assert "| 2 | 2 | 300 | 5.0 | 60.0 | yes |" in md
    assert "R9" in format_extra(result) and "xdist -n 2" in format_extra(result)


def test_native_report_shows_where_a_step_goes():
    from state_machines.bench_native import markdown as native_markdown

    row = {"variant": "radix", "regime": "page_size=1", "machine_steps_per_s": 4000.0,
           "native_steps_per_s": 40000.0, "ratio": 10.0,
           "us_per_step": {"machine": 250.0, "native": 25.0, "op": 8.0, "checks": 10.0,
                           "native_engine": 7.0},
           "ratio_if_engine_free": 250.0 / 18.0}
    md = native_markdown({"speed": [row]})
    assert "| radix | page_size=1 | 4,000 | 40,000 | 10.0x |" in md
    assert "| radix | page_size=1 | 250.0 | 25.0 | 8.0 | 10.0 | 7.0 | 13.9x |" in md


def test_step_costs_split_a_replayed_step_into_op_and_checks():
    """The costs come from replaying real walks: both parts are measured."""
    from state_machines.bench_native import step_costs
    from state_machines.variants import get_variant

    spec = get_variant("radix")
    params = spec.check_params(spec.regimes[0])
    costs = step_costs(spec, params, walks=3, first=20)
    assert set(costs) == {"op", "checks"} and costs["op"] > 0 and costs["checks"] > 0


def test_findings_bench_takes_one_variant():
    """``bench --findings VARIANT`` keeps that variant's findings and long faults only
    (``engines=()``: the rows are listed, nothing is run)."""
    from state_machines.bench_findings import LONG_FAULTS, bench_findings, bench_long_faults

    rows = bench_long_faults(engines=(), variant="continuation-state")
    assert [r["finding"] for r in rows] == ["fault P8", "fault C4", "fault C3"]
    assert len(bench_long_faults(engines=())) == len(LONG_FAULTS)
    out = bench_findings(engines=(), variant="continuation-state")
    assert all(r["file"].startswith("tokenspeed-continuation-state-")
               for r in out["rows"])
    assert not any(s["finding"].startswith(("pymllm-", "lightllm-", "sglang-"))
                   for s in out["skipped"])


def test_findings_bench_refuses_an_unknown_variant(capsys):
    from state_machines.cli import main

    assert main(["bench", "--findings", "no-such-variant"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown variant 'no-such-variant'" in err[0]

"""`raftq bench --help` and `python -m raftq.node.bench --help` read whole: every option says what
it does, in full sentences, with its default, and the description says what is measured, how to
read the output and what sepp is. The parsers are built in process (no cluster, no subprocess)."""
from __future__ import annotations

import argparse

import pytest

from raftq.cluster.bench.runner import build_parser as cluster_parser
from raftq.node.bench import build_parser as node_parser

PARSERS = pytest.mark.parametrize("build_parser", [cluster_parser, node_parser], ids=["raftq bench", "node bench"])


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _help(p: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as printed (%(default)s and the like filled in)."""
    return p._get_formatter()._expand_help(action)


@PARSERS
def test_every_option_has_a_whole_help(build_parser):
    """Non-empty, and ends a sentence: with a full stop, so a text cut mid-sentence (or one that
    stops at a parenthesis with nothing after it) fails."""
    p = build_parser()
    for a in _options(p):
        text = _help(p, a) if a.help else ""
        assert text.strip(), f"{a.option_strings[0]} has no help"
        assert text.rstrip().endswith("."), f"{a.option_strings[0]}: {text!r} does not end a sentence"


@PARSERS
def test_every_default_is_stated(build_parser):
    """An option with a value of its own when not given shows it in its help."""
    p = build_parser()
    for a in _options(p):
        if a.default in (None, False, argparse.SUPPRESS):
            continue
        text = _help(p, a)
        assert "default" in text and str(a.default) in text, f"{a.option_strings[0]}: {text!r}"


def test_the_node_bench_description_names_every_figure_it_prints():
    from raftq.node import bench
    p = node_parser()
    text = p.format_help()
    assert p.description.startswith("In-process benchmark") and p.description.strip() in text
    for figure in ("cycle_jobs_per_s", "batch_cycle_jobs_per_s", "reserve_us_at_1k", "bytes_per_job",
                   "snapshot_s_at_100k", "throttle_reserve_us", "bytes_per_schedule", "sweep_ms_at_tick",
                   "keys_reserve_us", "plain_reserve_us", "bytes_per_key", "leak_bytes_per_key"):
        assert figure in p.description, figure
    assert bench.__doc__.splitlines()[0] in text


def test_the_description_explains_the_run_and_its_output():
    p = cluster_parser()
    text = p.format_help()
    description = p.description
    assert "sepp is" in description                          # the workload's name, explained
    for phase in ("enqueue", "drain", "mixed", "batch", "latency"):
        assert f"\n  {phase} " in description, phase
    assert "jobs/s" in description and "Reading the output" in description
    # Every paragraph of prose ends a sentence, and so does every line of the phase list (the
    # list's lead-in ends with a colon).
    for block in description.strip().split("\n\n"):
        lines = block.splitlines()
        items = [line for line in lines if line.startswith("  ")]
        for part in items or [block]:
            assert part.rstrip().endswith("."), part
        if items:
            assert lines[0].rstrip().endswith(":"), lines[0]
    assert description.strip() in text                # printed as written, not re-wrapped

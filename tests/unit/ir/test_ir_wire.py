import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_chains import build_chain, chain_placements, chains
from ir_placed import EXAMPLE_PLACEMENTS, INTRA_PLACEMENTS, build_intra_island

from ir import InvalidArgument, WireError, from_wire, to_wire, verify
from ir.passes import lower, place, route_transfers

pytestmark = pytest.mark.unit


def round_trip(program):
    return from_wire(json.loads(json.dumps(to_wire(program))))


def test_wire_round_trip(example, control_flow):
    assert round_trip(example) == example
    assert round_trip(control_flow) == control_flow


def test_wire_header_and_artifact_bytes(example):
    doc = to_wire(example)
    assert doc["format"] == "isthmus.ir" and doc["version"] == 1
    assert doc["slices"][0] == {"name": "s0", "mesh": [["data", 2], ["model", 2]], "island": "a",
                                "placement": None}
    assert {a["data"] for a in doc["artifacts"]} == {"bGF5ZXI=", "bm9ybQ==", "aGVhZA=="}


def test_unknown_version_is_refused(example):
    doc = to_wire(example) | {"version": 2}
    with pytest.raises(WireError, match=r"\$\.version: expected version 1 .*found 2"):
        from_wire(doc)
    with pytest.raises(WireError, match=r"\$\.format: expected 'isthmus.ir', found 'pickle'"):
        from_wire(to_wire(example) | {"format": "pickle"})


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("graph", "nodes", 2, "attrs", "outs", 0, "aval", "dtype"), "float99",
         r"\$\.graph\.nodes\[2\]\.attrs\.outs\[0\]\.aval: .*unknown dtype 'float99'"),
        (("graph", "nodes", 0, "attrs", "type", "aval", "shape", 1), "16",
         r"\$\.graph\.nodes\[0\]\.attrs\.type\.aval\.shape\[1\]: expected an integer, found '16'"),
        (("graph", "nodes", 4, "op"), "teleport", r"\$\.graph\.nodes\[4\]\.op: expected an op in"),
        (("slices", 1, "mesh"), {"x": 4}, r"\$\.slices\[1\]\.mesh: expected a list"),
        (("artifacts", 0, "data"), "!!", r"\$\.artifacts\[0\]\.data: expected base64 bytes"),
        (("graph", "nodes", 3, "inputs", 0), "two", r"\$\.graph\.nodes\[3\]: .*name matching"),
    ],
)
def test_malformed_fields_name_the_json_path(example, path, value, message):
    doc = copy.deepcopy(to_wire(example))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(InvalidArgument, match=message):
        from_wire(doc)


def test_missing_field_names_the_path(example):
    doc = to_wire(example)
    del doc["graph"]["nodes"][1]["attrs"]["type"]["slice"]
    with pytest.raises(WireError, match=r"\$\.graph\.nodes\[1\]\.attrs\.type: expected a field 'slice'"):
        from_wire(doc)


def test_not_an_object():
    with pytest.raises(WireError, match=r"\$: expected an object with field 'format', found \[\]"):
        from_wire([])


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([4, 8]))
def test_random_chains_round_trip_through_wire(steps, width):
    program = build_chain(steps, width)
    verify(program)
    assert round_trip(program) == program


def test_placed_routed_and_partitioned_programs_round_trip(example):
    routed = route_transfers(place(example, EXAMPLE_PLACEMENTS))
    intra = lower(build_intra_island(), INTRA_PLACEMENTS)
    for program in (routed, lower(example, EXAMPLE_PLACEMENTS), intra):
        assert round_trip(program) == program


def test_placement_route_send_and_recv_on_the_wire(example):
    doc = to_wire(lower(example, EXAMPLE_PLACEMENTS))
    devices = [["b0", 0], ["b0", 1], ["b0", 2], ["b0", 3]]
    assert doc["slices"][1]["placement"] == {"island": "b", "devices": devices}
    send, recv = doc["graph"]["nodes"][4:6]
    assert send == {"op": "send", "inputs": ["%3"], "outputs": [], "attrs": {"to": ["b0"], "tag": "t0"}}
    assert recv["outputs"] == ["%4"] and recv["attrs"]["sources"] == ["a0"] and recv["attrs"]["tag"] == "t0"
    routed = to_wire(route_transfers(place(example, EXAMPLE_PLACEMENTS)))
    assert routed["graph"]["nodes"][4]["attrs"]["route"] == "dcn"
    assert to_wire(example)["graph"]["nodes"][4]["attrs"]["route"] is None


def test_documents_without_placement_or_route_still_read(example):
    doc = copy.deepcopy(to_wire(example))
    for s in doc["slices"]:
        del s["placement"]
    del doc["graph"]["nodes"][4]["attrs"]["route"]
    assert from_wire(doc) == example


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("slices", 0, "placement", "devices", 1), ["a0"],
         r"\$\.slices\[0\]\.placement\.devices\[1\]: expected a pair \[host, local device index\]"),
        (("slices", 0, "placement", "devices", 1, 1), -1, r"\$\.slices\[0\]\.placement: placement: expected"),
        (("slices", 1, "placement", "island"), "a",
         r"\$\.slices\[1\]: slice s1: expected a placement on island b"),
        (("graph", "nodes", 4, "attrs", "to"), 7, r"\$\.graph\.nodes\[4\]\.attrs\.to: expected a list"),
        (("graph", "nodes", 5, "attrs", "tag"), "t 0", r"\$\.graph\.nodes\[5\]\.attrs: recv from a0: tag"),
    ],
)
def test_malformed_placed_fields_name_the_json_path(example, path, value, message):
    doc = copy.deepcopy(to_wire(lower(example, EXAMPLE_PLACEMENTS)))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(InvalidArgument, match=message):
        from_wire(doc)


def test_bad_route_names_the_json_path(example):
    doc = copy.deepcopy(to_wire(example))
    doc["graph"]["nodes"][4]["attrs"]["route"] = "warp"
    with pytest.raises(WireError, match=r"\$\.graph\.nodes\[4\]\.attrs: transfer to .*expected a route in"):
        from_wire(doc)


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([4, 8]), st.booleans())
def test_random_lowered_chains_round_trip_through_wire(steps, width, split):
    program = lower(build_chain(steps, width), chain_placements(split))
    assert round_trip(program) == program


def test_a_send_and_recv_naming_one_host_as_older_documents_do_still_read(example):
    doc = to_wire(lower(example, EXAMPLE_PLACEMENTS))
    send, recv = doc["graph"]["nodes"][4:6]
    send["attrs"]["to"] = "b0"
    recv["attrs"]["source"] = recv["attrs"].pop("sources")[0]
    assert from_wire(doc) == lower(example, EXAMPLE_PLACEMENTS)


def test_hostile_documents_fail_by_path_not_by_the_stack():
    """Loops nested past the bound, a huge list and a value nested past the interpreter's
    recursion limit each fail as a WireError naming where."""
    graph: dict = {"nodes": []}
    for _ in range(40):  # (a loop's cond is read before the loop is checked)
        graph = {"nodes": [{"op": "while", "inputs": [], "outputs": [],
                            "attrs": {"cond": graph, "body": {"nodes": []}}}]}
    doc = {"format": "isthmus.ir", "version": 1, "slices": [], "artifacts": [], "graph": graph}
    with pytest.raises(WireError, match="nested more than 16 deep"):
        from_wire(doc)
    wide = dict(doc, graph={"nodes": [{}] * 100_001})
    with pytest.raises(WireError, match=r"\$\.graph\.nodes: 100001 entries; at most 100000"):
        from_wire(wide)
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(WireError, match=r"\$\.slices\[0\]: expected an object"):
        from_wire(dict(doc, slices=[deep]))

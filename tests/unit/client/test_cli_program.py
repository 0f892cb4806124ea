"""`isthmus program show`: a saved program printed as text, bad files named."""

import json

import pytest

from client.cli import main
from ir import Aval, ProgramBuilder, parse_program, to_wire

pytestmark = pytest.mark.unit


def test_show_prints_the_text_form(tmp_path, capsys):
    b = ProgramBuilder()
    s = b.slice("s", {"x": 2}, island="a")
    x = b.arg(Aval((4,), "float32"), ("x",), s)
    (y,) = b.compute("double", b"double", s, [x], [(Aval((4,), "float32"), ("x",))])
    b.result(y)
    program = b.build()
    path = tmp_path / "p.json"
    path.write_text(json.dumps(to_wire(program)))
    main(["program", "show", str(path)])
    assert parse_program(capsys.readouterr().out, program.artifacts) == program


def test_show_names_a_bad_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"format": "nope"}')
    with pytest.raises(SystemExit, match=r"isthmus program: \$\.format: expected 'isthmus.ir'"):
        main(["program", "show", str(path)])
    with pytest.raises(SystemExit, match="not a readable JSON file"):
        main(["program", "show", str(tmp_path / "missing.json")])


def test_program_show_plans_prints_each_hosts_state_machine(tmp_path, capsys):
    from test_trace_control_flow import SMALL, F, X, trace

    import client as isthmus

    program, _ = trace(lambda x: isthmus.while_loop(SMALL, F, F(x)), X)
    path = tmp_path / "loop.json"
    path.write_text(json.dumps(to_wire(program)))
    main(["program", "show", str(path), "--plans"])
    out = capsys.readouterr().out
    assert "host a0:" in out and "next_iteration" in out and "switch" in out


def test_demo_refuses_a_step_count_below_one_and_a_server_that_does_not_answer(monkeypatch):
    monkeypatch.delenv("ISTHMUS_ADDRESS", raising=False)
    with pytest.raises(SystemExit, match="--steps: expected at least 1, got 0"):
        main(["demo", "--steps", "0"])
    # asked for that server: not an embedded one in its place
    with pytest.raises(SystemExit, match=r"no Isthmus server answers at http://127\.0\.0\.1:9"):
        main(["demo", "--address", "http://127.0.0.1:9", "--steps", "1"])

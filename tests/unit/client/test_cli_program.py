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

"""Random linear chains of computes and transfers, for the IR round-trip and lowering property tests."""

from hypothesis import strategies as st

from ir import Aval, Placement, Program, ProgramBuilder


def chains() -> st.SearchStrategy[list[tuple[str, int, int]]]:
    """Steps of a linear chain: ('compute' | 'transfer', slice index, spec choice)."""
    step = st.tuples(st.sampled_from(["compute", "transfer"]), st.integers(0, 2), st.integers(0, 2))
    return st.lists(step, max_size=12)


MESHES = ({"x": 2}, {"a": 2, "b": 2}, {"y": 1})


def build_chain(steps: list[tuple[str, int, int]], width: int) -> Program:
    b = ProgramBuilder()
    names = [b.slice(f"s{i}", mesh, island="a" if i < 2 else None) for i, mesh in enumerate(MESHES)]
    aval = Aval((4, width), "float32")

    def spec(slice_index: int, choice: int) -> tuple:
        axes = list(MESHES[slice_index])
        return ((None, None), (axes[0], None), (None, axes[-1]))[choice]

    where, value = 0, b.arg(aval, spec(0, 1), names[0])
    for k, (kind, target, choice) in enumerate(steps):
        if kind == "transfer":
            where, value = target, b.transfer(value, spec(target, choice), names[target])
        else:
            (value,) = b.compute(f"f{k}", f"f{k % 3}".encode(), names[where], [value],
                                 [(aval, spec(where, choice))])
    b.result(value)
    return b.build()


def chain_placements(split: bool) -> dict[str, Placement]:
    """s0 and s1 on island a, on host a0 (their transfers local) or, if `split`, on a0 and a1;
    s2 on island b."""
    return {
        "s0": Placement("a", (("a0", 0), ("a0", 1))),
        "s1": Placement("a", tuple(("a1" if split else "a0", i) for i in range(2, 6))),
        "s2": Placement("b", (("b0", 0),)),
    }

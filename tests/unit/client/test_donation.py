import pytest

from client.buffer import Buffer
from client.donation import Donated
from client.statics import Statics
from ir import Aval, InvalidArgument, NotFound, Spec

pytestmark = pytest.mark.unit


class Released:
    """The session's side of a buffer, recording releases (nothing else is asked here)."""

    def __init__(self):
        self.ids = []

    def release(self, buffer_id):
        self.ids.append(buffer_id)


def buffer(futures, name):
    return Buffer(futures, name, "s-0", Aval((2,), "float32"), Spec(()))


def step(state, batch, n=1, *, lr=0.1):
    return state


def test_numbers_and_names_follow_jax_jit_and_statics_cannot_be_donated():
    assert Donated.of(step, 0, None, Statics()) == Donated((0,), ("state",))
    assert Donated.of(step, None, "batch", Statics()) == Donated((1,), ("batch",))
    assert Donated.of(step, (0, 1), None, Statics()) == Donated((0, 1), ("state", "batch"))
    with pytest.raises(InvalidArgument, match=r"argument 'n' is static"):
        Donated.of(step, 2, None, Statics.of(step, 2, None))
    with pytest.raises(InvalidArgument, match=r"donate_argnums: expected ints"):
        Donated.of(step, "state", None, Statics())


def test_the_buffers_of_donated_arguments_are_chosen_by_position_and_name():
    f = Released()
    a, b, c, d = (buffer(f, f"b-{i}") for i in range(4))
    donated = Donated((0, -1), ("lr",))
    chosen = donated.buffers(({"w": a, "n": 3}, b, c), {"lr": d})
    assert [x.id for x in chosen] == ["b-0", "b-2", "b-3"]  # numpy arrays and scalars are no buffers
    assert Donated().buffers((a,), {}) == []


def test_a_donated_buffer_passed_twice_in_one_call_is_refused_as_jax_jit_refuses_it():
    f = Released()
    a, b = buffer(f, "b-0"), buffer(f, "b-1")
    cases = ((Donated((0,)), (a, a)), (Donated((0, 1)), (a, a)), (Donated((1,)), ({"w": a}, [a])))
    for donated, args in cases:
        with pytest.raises(InvalidArgument, match=r"buffer b-0 is donated and passed more than once"):
            donated.buffers(args, {})
    with pytest.raises(InvalidArgument, match=r"buffer b-0 is donated"):
        Donated((), ("lr",)).buffers((a,), {"lr": a})
    assert [x.id for x in Donated((0,)).buffers((a, b), {})] == ["b-0"]  # another buffer beside it
    assert Donated((0,)).buffers((b, a, a), {})[0].id == "b-1"  # the one passed twice is not donated
    assert f.ids == []  # a refusal takes nothing


def test_a_deleted_buffer_is_released_once_and_refuses_every_use():
    f = Released()
    x = buffer(f, "b-7")
    assert not x.is_deleted()
    x.delete()
    x.delete()
    assert x.is_deleted() and f.ids == ["b-7"]
    for use in (x.numpy, x.result, x.ready, x.live):
        with pytest.raises(NotFound, match=r"buffer b-7 \(float32\[2\]\) has been deleted"):
            use()
    del x
    assert f.ids == ["b-7"]  # dropping it releases nothing more

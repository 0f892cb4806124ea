import functools

import pytest

from client.statics import NONE, Statics, numbered
from ir import InvalidArgument

pytestmark = pytest.mark.unit


def f(x, n, *, mode="a"):
    return x


def test_numbers_are_named_and_names_numbered_as_jax_jit_does():
    assert Statics.of(f, 1, None) == Statics((1,), ("n",))
    assert Statics.of(f, None, "n") == Statics((1,), ("n",))
    assert Statics.of(f, None, ("mode",)) == Statics((), ("mode",))  # keyword-only: no number
    assert not Statics.of(f, None, None)
    assert Statics.of(functools.partial(f, 1), 0, None) == Statics((0,), ("n",))


def test_split_takes_the_static_values_out_and_join_puts_them_back():
    statics = Statics((1, -1), ("mode",))
    args, kwargs = ("x", 3, "y", (4, 5)), {"mode": "b", "w": "z"}
    dynamic, dynamic_kw, key = statics.split(args, kwargs)
    assert dynamic == ("x", "y") and dynamic_kw == {"w": "z"}
    assert key == (((1, 3), (3, (4, 5))), (("mode", "b"),), (int, tuple, str))
    assert Statics.join(dynamic, dynamic_kw, key) == (args, kwargs)
    assert Statics().split(args, kwargs) == (args, kwargs, NONE)


def test_static_values_equal_but_of_other_types_are_other_signatures_as_in_jax_jit():
    statics = Statics((1,), ("n",))
    keys = [statics.split(("x", n), {})[2] for n in (1, 1.0, True)]
    assert len(set(keys)) == 3  # 1 == 1.0 == True, and they hash alike
    assert statics.split(("x", (1, 2)), {})[2] == statics.split(("x", (1.0, 2.0)), {})[2]  # as jax.jit


def test_an_unhashable_static_value_is_refused_by_position():
    with pytest.raises(InvalidArgument, match=r"static argument 1: a list is not hashable"):
        Statics((1,), ()).split(("x", [1, 2]), {})


def test_an_array_like_static_value_is_refused_though_it_hashes():
    class Remote:  # as a `Buffer`: hashed by identity, an array to JAX
        __jax_array__ = property(lambda self: None)

    with pytest.raises(InvalidArgument, match=r"static argument 'n': a Remote is an array.*dynamic"):
        Statics((), ("n",)).split(("x",), {"n": Remote()})


@pytest.mark.parametrize("kind", ["static", "donate"])
def test_argnums_past_the_positional_arguments_are_refused_as_jax_jit_refuses_them(kind):
    def g(x, y=1):
        return x

    def spread(*xs):
        return xs

    assert numbered(g, (1, -2), None, kind)[0] == (1, -2)
    for bad in (2, -3):
        with pytest.raises(InvalidArgument, match=rf"{kind}_argnums=\({bad},\), but g takes only 2"):
            numbered(g, bad, None, kind)
    assert numbered(spread, 5, None, kind)[0] == (5,)  # *args: any number may be given

"""Static arguments of a jitted function, as `jax.jit`'s `static_argnums` / `static_argnames`.

A static argument is not an array: its value is part of the function's signature (one
export per value, so it must be hashable) and is bound into the exported function, which
sees it as the plain Python value. The other arguments are the dynamic ones: the positional
ones with the static positions taken out (so `in_specs` is a prefix of those), and the
keyword ones without the static names. Numbers given without names are named from the
function's signature, and names numbered, as `jax.jit` does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ir import InvalidArgument

# The static values by position and by name, and their types: as in `jax.jit`, values that
# compare equal but differ in type (2 and 2.0, 1 and True) are different signatures.
StaticKey = tuple[tuple[tuple[int, Any], ...], tuple[tuple[str, Any], ...], tuple[type, ...]]
NONE: StaticKey = ((), (), ())


def _tuple(x: Any, kind: type, field: str) -> tuple[Any, ...]:
    if x is None:
        return ()
    items = (x,) if isinstance(x, kind) else tuple(x)
    if not all(isinstance(i, kind) for i in items):
        raise InvalidArgument(f"{field}: expected {kind.__name__}s, got {x!r}")
    return items


def numbered(fn: Callable[..., Any], argnums: int | Iterable[int] | None,
             argnames: str | Iterable[str] | None, kind: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """`{kind}_argnums` and `{kind}_argnames` as `jax.jit` takes them: numbers given without
    names are named from the function's signature, and names numbered."""
    nums, names = _tuple(argnums, int, f"{kind}_argnums"), _tuple(argnames, str, f"{kind}_argnames")
    if not nums and not names:
        return (), ()
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: taken as given
        return nums, names
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    count = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if not any(p.kind == p.VAR_POSITIONAL for p in params):  # as jax.jit refuses them
        outside = [i for i in nums if not -count <= i < count]
        if outside:
            raise InvalidArgument(f"{kind}_argnums={nums}, but {getattr(fn, '__name__', 'the function')} "
                                  f"takes only {count} positional arguments")
    if argnums is None:  # numbered from the names
        nums = tuple(i for i, name in enumerate(positional) if name in names)
    if argnames is None:  # named from the numbers
        names = tuple(name for i, name in enumerate(positional) if i in nums)
    return nums, names


@dataclass(frozen=True)
class Statics:
    argnums: tuple[int, ...] = ()
    argnames: tuple[str, ...] = ()

    @classmethod
    def of(cls, fn: Callable[..., Any], argnums: int | Iterable[int] | None,
           argnames: str | Iterable[str] | None) -> Statics:
        return cls(*numbered(fn, argnums, argnames, "static"))

    def __bool__(self) -> bool:
        return bool(self.argnums or self.argnames)

    def split(self, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[tuple[Any, ...], dict[str, Any], StaticKey]:
        """The dynamic arguments, and the static values as a hashable key."""
        if not self:
            return args, kwargs, NONE
        nums = {i if i >= 0 else len(args) + i for i in self.argnums}
        positional = tuple((i, args[i]) for i in sorted(nums) if 0 <= i < len(args))
        named = tuple(sorted((k, v) for k, v in kwargs.items() if k in self.argnames))
        for where, value in (*positional, *named):
            if hasattr(type(value), "__jax_array__"):  # a `Buffer`: hashed by identity, yet an array
                raise InvalidArgument(f"static argument {where!r}: a {type(value).__name__} is an array, "
                                      "which is no static value (jax.jit refuses an array there as "
                                      "unhashable); pass it as a dynamic argument")
            try:
                hash(value)
            except TypeError:
                raise InvalidArgument(f"static argument {where!r}: a {type(value).__name__} is not "
                                      "hashable, and a static value is part of the signature") from None
        dynamic = tuple(a for i, a in enumerate(args) if i not in nums)
        types = tuple(type(v) for _, v in (*positional, *named))
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self.argnames}
        return dynamic, dynamic_kwargs, (positional, named, types)

    @staticmethod
    def join(args: tuple[Any, ...], kwargs: dict[str, Any], key: StaticKey
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments as the function takes them: the static values put back."""
        if key == NONE:
            return args, kwargs
        at, rest = dict(key[0]), iter(args)
        positional = tuple(at[i] if i in at else next(rest) for i in range(len(args) + len(at)))
        return positional, {**kwargs, **dict(key[1])}

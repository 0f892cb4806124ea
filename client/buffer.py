"""`Buffer`: a future of an array held on the executors.

A buffer exists the moment the call that makes it is queued: its id is the client's own
choice, and its shape, dtype, sharding and slice are known from the computation's
signature, so nothing waits for the server. The data moves only when asked for. A `Buffer`
can be passed to another call without being fetched. When the last reference to it goes
away, its release joins the client's queue (after every call that read it); `delete()`
releases it at once (so does donating it to a call, `Client.jit`'s `donate_argnums`), and
any later use of it raises `NotFound`, as JAX raises for a deleted array.

A buffer talks only to its `Futures` (the client's session), through the narrow interface
below; it never sees the `Client`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from client.arrays import PLAIN, Shaped, View
from client.context import current_trace, jitted_here
from client.slices import Slice
from ir import Aval, InvalidArgument, IsthmusError, NotFound, Spec, parse_dtype


def _closed_over(buffer: Buffer) -> InvalidArgument | None:
    """The error reading `buffer` raises in a jitted function being traced (`client.context`)."""
    fn = jitted_here()
    if fn is None:
        return None
    return InvalidArgument(f"{fn}: it closes over buffer {buffer.id} ({buffer.aval}): a jitted function "
                           "reads a buffer only as an argument; pass it as one")


def _refused(op: str) -> Callable[..., Any]:
    def refused(self: Buffer, *other: Any) -> Any:
        raise _closed_over(self) or InvalidArgument(
            f"buffer {self.id}: {op} is not done on a buffer, whose value is on the executors; do it "
            "inside a jitted function (c.jit), or fetch the value with .numpy()")
    return refused


# dunder name -> (symbol, the operation on JAX arrays): the operators a buffer runs
BINARY: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "add": ("+", operator.add), "sub": ("-", operator.sub), "mul": ("*", operator.mul),
    "truediv": ("/", operator.truediv), "floordiv": ("//", operator.floordiv), "mod": ("%", operator.mod),
    "pow": ("**", operator.pow), "matmul": ("@", operator.matmul), "and": ("&", operator.and_),
    "or": ("|", operator.or_), "xor": ("^", operator.xor), "lshift": ("<<", operator.lshift),
    "rshift": (">>", operator.rshift), "eq": ("==", operator.eq), "ne": ("!=", operator.ne),
    "lt": ("<", operator.lt), "le": ("<=", operator.le), "gt": (">", operator.gt), "ge": (">=", operator.ge),
    "divmod": ("divmod", divmod),
}
# `jax.Array` methods and properties a buffer runs (`Buffer.astype`, `.T`): their arguments
# are static (axes, shapes, dtypes), part of the computation
METHODS = ("astype", "view", "reshape", "transpose", "squeeze", "ravel", "flatten", "swapaxes", "sum",
           "mean", "max", "min", "prod", "std", "var", "argmax", "argmin", "all", "any", "cumsum", "cumprod",
           "clip", "round", "conj", "copy", "dot", "sort", "argsort", "take", "diagonal")
PROPERTIES = ("T", "mT", "real", "imag")
UNARY: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "neg": ("unary -", operator.neg), "pos": ("unary +", operator.pos), "abs": ("abs", operator.abs),
    "invert": ("~", operator.invert),
}


class Futures(Protocol):
    """What a `Buffer` asks of the session that made it."""

    client_id: str  # the client it is a session of (a client may have several)
    slices: dict[str, Slice]  # the client's slices, by id
    deleted_slices: dict[str, None]  # the newest slices the client deleted, with their buffers

    def release(self, buffer_id: str) -> None: ...
    def wait(self, buffer: Buffer) -> None: ...
    def ready(self, buffer: Buffer) -> bool: ...
    def fetch(self, buffer: Buffer) -> bytes: ...
    def prefetch(self, buffer: Buffer) -> None: ...
    def check_open(self) -> None: ...
    def put(self, array: np.ndarray, slice_id: str, spec: Spec, view: View = PLAIN) -> Buffer: ...
    def operate(self, symbol: str, op: Callable[..., Any], operands: tuple[Any, ...]) -> Any: ...
    def index(self, buffer: Buffer, key: Any) -> Buffer: ...
    def method(self, buffer: Buffer, name: str, args: tuple[Any, ...] | None,
               kwargs: dict[str, Any]) -> Buffer: ...


class Buffer(Shaped):
    __slots__ = ("__weakref__", "_deleted", "_futures", "_value", "_view", "aval", "error", "id",
                 "known_ready", "slice_id", "spec")
    __array_priority__ = 100  # numpy defers its operators to a buffer's (`np.ones(4) + b`), as to JAX's
    aval: Aval  # (a slot: `Shaped.aval` made a plain attribute)

    def __init__(self, futures: Futures, buffer_id: str, slice_id: str, aval: Aval, spec: Spec,
                 view: View = PLAIN) -> None:
        self._futures = futures
        self.id = buffer_id
        self.slice_id = slice_id
        self.aval = aval  # of the data the executors hold: for typed keys, their key data
        self.spec = spec
        self._view = view  # weakly typed (as JAX types a Python scalar), or typed PRNG keys
        self._value: np.ndarray | None = None
        self._deleted = False
        # Set when the server refused the submission that makes it (or it could not be sent).
        self.error: IsthmusError | None = None
        self.known_ready = False  # the server said it exists (waiting for it needs no request)

    def __del__(self) -> None:
        # A plain method, not weakref.finalize: this runs once per call on the hot path.
        if getattr(self, "_deleted", True):  # (unset: it was never made whole)
            return
        try:
            self._futures.release(self.id)
        except Exception:  # interpreter shutdown: nothing left to tell
            pass

    def delete(self) -> None:
        """Release the value now (after every call already queued that reads it), as
        `jax.Array.delete` frees an array; using the buffer afterwards raises `NotFound`."""
        if not self._deleted:
            self._deleted = True
            self._value = None
            self._futures.release(self.id)

    def donate(self) -> None:
        """Given to a call that takes it over (`client.donation`): unusable here, and freed
        by the server with the call, once the call is accepted (no release of its own)."""
        self._deleted = True
        self._value = None

    def undonate(self) -> None:
        """The call it was donated to was refused: it is the caller's again."""
        self._deleted = False

    def is_deleted(self) -> bool:
        """Whether it was deleted, donated, or freed with its slice (`Slice.delete`)."""
        return self._deleted or self._freed_with_slice()

    def _freed_with_slice(self) -> bool:
        return self.slice_id in getattr(self._futures, "deleted_slices", ())

    def live(self, reader: object = None) -> Buffer:
        """This buffer, to be read by a call (of the session `reader`); `NotFound` if it was
        deleted, `InvalidArgument` if another session made it (one freed with its slice is
        the server's to refuse, on the call's futures). Each session orders its own calls
        and releases; another's (of this client, or another) may release it, or not yet
        have sent the call that makes it, before this one's call arrives."""
        if self._deleted:
            raise NotFound(f"buffer {self.id} ({self.aval}) has been deleted (donated to a call, "
                           "or .delete()): as in JAX, a donated argument cannot be used again")
        if reader is not None and reader is not self._futures:
            owner = getattr(self._futures, "client_id", None)
            same = owner is not None and owner == getattr(reader, "client_id", None)
            whose = ("another session's of the same client (another connect() with its secret)" if same
                     else "another client's")
            raise InvalidArgument(
                f"buffer {self.id} ({self.aval}) is {whose}: a session's functions read the buffers it "
                "made only. Fetch it (.numpy()) and pass the array, or make it with this session")
        return self

    @property
    def shown(self) -> View:
        """How the client shows its value: weakly typed, typed PRNG keys, or plainly."""
        return self._view

    @property
    def key(self) -> str | None:
        """The implementation of the typed PRNG keys it holds, or None."""
        return self._view.key

    @property
    def sharding(self) -> NamedSharding:
        """The buffer's sharding, as `jax.Array.sharding`: its spec over its slice's mesh
        (the slice's `AbstractMesh`: the devices are the server's). `.sharding.spec` is the
        spec; JAX's functions that make arrays like another (`jnp.zeros_like`) read it."""
        s = self._futures.slices.get(self.slice_id)
        if s is None:
            raise NotFound(f"buffer {self.id}: its slice {self.slice_id} is not one of this client's "
                           "(deleted, or made by another session)")
        return NamedSharding(s.abstract_mesh, PartitionSpec(*self.spec.entries))

    def ready(self) -> bool:
        """True once the value exists or has failed; never waits for the computation."""
        live = self.live()
        return self.known_ready or self._futures.ready(live)

    def result(self) -> Buffer:
        """Block until the value exists; raise the error (`RemoteError` with the remote cause,
        or the server's refusal of the call that makes it) if it failed."""
        live = self.live()
        if not self.known_ready:
            self._futures.wait(live)
        return self

    def block_until_ready(self) -> Buffer:
        """`result()` by JAX's name for it, so `jax.block_until_ready(tree)` waits for buffers."""
        return self.result()

    def copy_to_host_async(self) -> None:
        """Ask for the value to be fetched with others asked for likewise, as
        `jax.device_get(tree)` asks of every leaf before it reads them: the session fetches
        them together, in a few requests, when the first is read."""
        if self._value is None and not self._deleted:
            self._futures.prefetch(self)

    def item(self) -> Any:
        """The value of a one-element buffer as a Python scalar (fetched)."""
        return self.numpy().item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.numpy())

    def __complex__(self) -> complex:
        return complex(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __bool__(self) -> bool:
        """The value's truth, as for a JAX array (fetched; one element only)."""
        return bool(self.numpy())

    def __index__(self) -> int:
        """An integer scalar as an index (`operator.index`, `range(n)`), as for a JAX array."""
        return operator.index(self.numpy())

    def __getitem__(self, key: Any) -> Buffer:
        """`x[i]`, `x[:4]`, `x[..., 0]` on the executors, on the buffer's slice (`client.eager`)."""
        _eager_here(self, "indexing")
        return self._futures.index(self, key)

    def __round__(self, ndigits: int | None = None) -> Buffer:
        """`round(x)`, `round(x, 2)`: on the executors, as `round` rounds a JAX array (to an
        integer dtype without `ndigits`)."""
        _eager_here(self, "round()")
        return self._futures.method(self, "__round__", (ndigits,), {})

    def __str__(self) -> str:
        """The value, as `str` of a JAX array shows it (`print(loss)`): fetched. `repr` names
        the buffer without fetching."""
        return str(self.keys() if self.key is not None else self.numpy())

    def __format__(self, spec: str) -> str:
        """`f"{loss:.4f}"` and `f"{loss}"` format the value as for a JAX array: a scalar as
        its numpy scalar (a float32 as the Python float it is), an array as numpy does."""
        if self.key is not None:
            return format(str(self), spec)
        value = self.numpy()
        return format(value if value.ndim else value[()], spec)

    def numpy(self) -> np.ndarray:
        """Fetch the value (once) as a numpy array; raise as `result` does if it failed.
        Typed keys have no numpy form (as in JAX): `keys()` fetches them."""
        if self.key is not None:
            raise TypeError(f"buffer {self.id} holds PRNG keys ({self.dtype}{list(self.shape)}), which "
                            "have no numpy form: .keys() fetches them as a JAX key array")
        return self._data()

    def keys(self) -> Any:
        """Fetch typed PRNG keys as a JAX key array (as `jax.random.key` makes them)."""
        if self.key is None:
            raise TypeError(f"buffer {self.id} holds {self.aval}, not PRNG keys: .numpy() fetches it")
        return jax.random.wrap_key_data(jnp.asarray(self._data()), impl=self.key)

    def _data(self) -> np.ndarray:
        if (error := _closed_over(self)) is not None:  # (not fetched: JAX formats it in its errors)
            raise error
        live = self.live()
        if self._freed_with_slice():  # (its value may have been fetched before)
            raise NotFound(f"buffer {self.id!r} was freed with its slice {self.slice_id}, deleted")
        if self._value is None:
            return self.fetched(self._futures.fetch(live))
        self._futures.check_open()  # a value fetched before the client closed is refused too
        return self._value

    @property
    def has_value(self) -> bool:
        """Whether the value was fetched already (and is held here)."""
        return self._value is not None

    def fetched(self, data: bytes) -> np.ndarray:
        """Keep the value's bytes, fetched (by the session, with others' maybe)."""
        value = np.frombuffer(data, dtype=parse_dtype(self.aval.dtype)).reshape(self.aval.shape)
        value.flags.writeable = False
        self._value = value
        self.known_ready = True
        return value

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if self.key is not None:
            # `jax.device_get(tree)` takes what this returns: keys come back as JAX's key
            # arrays, as from jax.device_get of keys. numpy refuses them (as in JAX).
            return self.keys()
        value = self.numpy()
        return value.astype(dtype) if dtype is not None else np.array(value) if copy else value

    @property
    def __jax_array__(self) -> Callable[[], Any]:
        """JAX's protocol for array-likes: the value as a local `jax.Array` (fetched), which
        `jnp.asarray(buffer)`, `jnp.stack(xs)` and a local array's operators compute on, in
        this process. JAX refuses it where it traces (`jnp.sum`, a local `jax.jit`), naming
        `jnp.array`. Asked for while a jitted function is traced, it raises that a buffer is
        read there only as an argument."""
        if (error := _closed_over(self)) is not None:
            raise error
        return self._local

    def _local(self) -> Any:
        return self.keys() if self.key is not None else jnp.asarray(self.numpy())

    def __copy__(self) -> Buffer:
        """The buffer itself: its value never changes, so a copy may share it (as JAX's
        arrays, immutable, may be shared)."""
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Buffer:
        """A new buffer of the same value on the same slice, whose life is its own (deleting
        or donating either leaves the other): fetched and uploaded again, through the client."""
        return self._futures.put(self._data(), self.slice_id, self.spec, self._view)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its value (fetched): a numpy array, or typed keys as a JAX key array.
        Unpickled, it is a local array; `c.put` places it again."""
        if self.key is not None:
            return _keys, (self._data(), self.key)
        return np.asarray, (self.numpy(),)

    def __repr__(self) -> str:
        if self.key is None:
            return f"Buffer({self.id}, {self.aval}, {self.spec}, slice={self.slice_id})"
        keys = f"{self.dtype}[{','.join(map(str, self.shape))}]"  # as `.shape` and `.dtype` say
        return f"Buffer({self.id}, {keys} keys={self.key} as {self.aval}, {self.spec}, slice={self.slice_id})"


def _operator(symbol: str, op: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    """An operator run on the executors, on the buffer's slice (`client.eager`)."""
    def apply(self: Buffer, *other: Any) -> Any:
        _eager_here(self, symbol)
        if symbol == "**" and not reflected and type(other[0]) is int:
            # a Python int exponent is static, as in JAX: x * x for x ** 2, and an integer
            # array's negative power refused
            return self._futures.method(self, "__pow__", other, {})
        operands = (other[0], self) if reflected else (self, *other)
        return self._futures.operate(symbol, op, operands)
    return apply


def _method(name: str) -> Callable[..., Any]:
    def method(self: Buffer, *args: Any, **kwargs: Any) -> Buffer:
        _eager_here(self, f".{name}()")
        return self._futures.method(self, name, args, kwargs)
    method.__name__ = name
    method.__doc__ = f"`jax.Array.{name}`, run on the executors, on the buffer's slice (`client.eager`)."
    return method


def _property(name: str) -> property:
    def get(self: Buffer) -> Buffer:
        _eager_here(self, f".{name}")
        return self._futures.method(self, name, None, {})
    return property(get, doc=f"`jax.Array.{name}`, run on the executors (`client.eager`).")


def _eager_here(buffer: Buffer, what: str) -> None:
    """Refuse an operation on a buffer where it would not run as asked: in a jitted function
    being traced (it reads a buffer only as an argument), or in a program being traced (it
    would run outside the program)."""
    if (error := _closed_over(buffer)) is not None:
        raise error
    if current_trace() is not None:
        raise InvalidArgument(f"buffer {buffer.id}: {what} on a buffer inside @program would run outside it, "
                              "as it is traced; do it inside a jitted function (c.jit)")


# Operators and some of `jax.Array`'s methods run on the executors (`client.eager`),
# as JAX runs them op by op on an array (set after the class: a buffer is hashed by identity
# still). Item assignment, iteration and `.at[...]` are refused by name: a buffer's value is
# on the executors, not here.
for _name in METHODS:
    setattr(Buffer, _name, _method(_name))
for _name in PROPERTIES:
    setattr(Buffer, _name, _property(_name))
for _name, (_symbol, _op) in BINARY.items():
    setattr(Buffer, f"__{_name}__", _operator(_symbol, _op))
    if _name not in ("eq", "ne", "lt", "le", "gt", "ge"):  # (Python reflects those itself)
        setattr(Buffer, f"__r{_name}__", _operator(_symbol, _op, reflected=True))
for _name, (_symbol, _unary) in UNARY.items():
    setattr(Buffer, f"__{_name}__", _operator(_symbol, _unary))
for _symbol, _name in (("item assignment", "setitem"), ("iteration", "iter")):
    setattr(Buffer, f"__{_name}__", _refused(_symbol))


def _at(self: Buffer) -> Any:
    # An AttributeError, as before it was named, so that `hasattr(x, "at")` stays False.
    raise AttributeError(f"buffer {self.id} has no .at[...]: its value is on the executors; update it "
                         "inside a jitted function (c.jit), or fetch the value with .numpy()")


Buffer.at = property(_at)  # type: ignore[attr-defined]


def _keys(data: np.ndarray, impl: str) -> Any:
    return jax.random.wrap_key_data(jnp.asarray(data), impl=impl)

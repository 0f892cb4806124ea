"""Reverse mode as a pass over the IR: a program and the positions of the arguments to
differentiate in, to a program that computes the forward pass and then the cotangents,
through the same lowering, scheduler and executors as any other.

Contract:
- `reverse(program, wrt, rules)` takes a program whose first result is a scalar of an
  inexact dtype (the loss; the others are auxiliary values, not differentiated) and returns
  one with the same arguments whose results are the loss, the auxiliary values, then the
  gradient of the loss in each argument of `wrt`, of that argument's type.
- Each computation's VJP comes from `rules` (`Rules.vjp`): a forward computation that also
  returns its residuals, and a backward one that takes the residuals and its outputs'
  cotangents and returns its inputs'. The pass owns nothing of JAX: it only wires what the
  rules give. A computation with no input that depends on a `wrt` argument, or no output
  that the loss depends on, is copied as it is, its artifact and bits unchanged.
- A transfer's transpose is a transfer back, to the operand's slice and spec. A value read
  by several nodes gets the sum of its cotangents (`Rules.add`). A cotangent nothing
  contributed to is a symbolic zero until a node needs it as a value (`Rules.zeros`); the
  loss is seeded with `Rules.ones`.
- A `cond`'s transpose is a `cond` on the same predicate (`branches.py`): each branch is
  differentiated on its own, its forward returning, besides its results, the residuals its
  backward reads (zeros in the place of the other branches' residuals, so that every branch
  has the same result types), and the backward branch taken is the forward one's.
- A `while`'s transpose is a `REPEAT` that runs the forward's trip count backwards
  (`loops.py`): the forward loop saves its trip count on its hosts as it exits and pushes,
  per iteration, the forward values the backward reads (`PUSH`); the backward takes the
  count back and pops them, last first (`POP`). Loops and branches nest, in each other and
  in themselves.
- `wrt` arguments and a loss that are not of an inexact dtype are refused
  (`NotDifferentiable`).
- Pure: it builds the new program with `ProgramBuilder`, so every node is type-checked as
  it is added and the result is verified.
"""

from __future__ import annotations

from collections.abc import Sequence

from ir.autodiff import branches as _branches  # noqa: F401  (registers the cond rules)
from ir.autodiff import loops as _loops  # noqa: F401  (registers the while rules)
from ir.autodiff.sweep import NotDifferentiable, Rules, Stacks, Sweep, Vjp, inexact
from ir.builder import ProgramBuilder
from ir.program import Program
from ir.verify import value_types

__all__ = ["NotDifferentiable", "Rules", "Vjp", "inexact", "reverse"]


def reverse(program: Program, wrt: Sequence[int], rules: Rules, stacks: str = "g") -> Program:
    """`program`'s loss, auxiliary results and gradients in the arguments `wrt` (see the module)."""
    graph, positions = program.graph, tuple(wrt)
    args, results = graph.args, graph.results
    if not results:
        raise NotDifferentiable("grad: the program has no result (the loss is its first)")
    if len(set(positions)) != len(positions) or not all(0 <= k < len(args) for k in positions):
        raise NotDifferentiable(f"grad: wrt: expected distinct argument positions below {len(args)}, "
                                f"got {list(positions)}")
    types = value_types(program)  # (verifies it)
    for k in positions:
        if not inexact(types[args[k]]):
            raise NotDifferentiable(f"grad: argument {k} ({args[k]}, {types[args[k]]}) is not of an inexact "
                                    "dtype: only floating and complex arguments have gradients")
    loss = results[0]
    if types[loss].aval.shape != () or not inexact(types[loss]):
        raise NotDifferentiable(f"grad: the loss ({loss}, {types[loss]}) must be a scalar of an inexact "
                                "dtype")
    b = ProgramBuilder(dict(program.slice_table), dict(program.artifact_table))
    sweep = Sweep(graph, (program.slice_table, frozenset(program.artifact_table)), rules, b, Stacks(stacks))
    active = sweep.active({args[k] for k in positions}, {loss})
    sweep.forward(active)
    sweep.start_backward(b, lambda v: v)
    if loss in active:
        sweep.seed(loss, sweep.constant(rules.ones(types[loss]), types[loss], "grad_ones"))
    sweep.backward(active)
    grads = [sweep.cotangent(args[k]) for k in positions]
    b.result(*(sweep.renamed[v] for v in results), *grads)
    return b.build()

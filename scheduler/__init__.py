"""Per-island gang scheduling: one island-wide order for every computation.

Today every host runs its requests in one submission order that the server fixes, and
slices live on one host, so no two hosts can disagree on an order. The gang scheduler
that orders multi-host slices across tenants, with FIFO and proportional-share policies,
lands here with multi-host islands.
"""

__all__: list[str] = []

"""Progressive rollouts across the fleet: a group's new revision goes out wave by wave, each
wave gated on the status its clusters' agents report, halted (and reverted) when too many fail.

- :mod:`hub.rollout.model`: the strategy, as the fleet repo writes it (``rollout:``);
- :mod:`hub.rollout.plan`: wave arithmetic (selectors, counts, percentages of the remaining);
- :mod:`hub.rollout.content`: a group's entries on a cluster (its *variant*), and plans with a
  group's entries replaced;
- :mod:`hub.rollout.state`: rollouts as recorded in git (``refs/fleetlet/rollouts`` in shard 0);
- :mod:`hub.rollout.evaluate`: each cluster's verdict from what its agent reported;
- :mod:`hub.rollout.advance`: one rollout's next state (waves, budget, soak, halt, revert) and
  the operator's actions (promote, pause, resume, abort);
- :mod:`hub.rollout.controller`: a publish that starts rollouts, and one step of every rollout,
  each a signed, incremental publication landing together with the new state.

See docs/rollouts.md.
"""

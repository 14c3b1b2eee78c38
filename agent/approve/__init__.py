"""Approvals: a group's next move as a BundleDeploymentRequest with a preview, decided by a
person or by the cluster's ApprovalPolicy, enforced by the API server (see docs/approvals.md).

- :mod:`agent.approve.gate`: the "request approval" step of a move;
  :mod:`agent.approve.approvals` what it works with (:class:`~agent.approve.approvals.Approvals`)
  and what a waiting group waits on;
- :mod:`agent.approve.request`: this agent's requests (found by their pins, created,
  superseded, pruned);
- :mod:`agent.approve.preview`: the preview (per object, bounded diffs), from a live dry run
  or from two renderings; :mod:`agent.approve.diff` and :mod:`agent.approve.security` its
  parts;
- :mod:`agent.approve.policy`: the ApprovalPolicies (CEL rules over the preview);
- :mod:`agent.approve.decide`: approving or denying as a user (``fleetlet approve|deny``);
- :mod:`agent.approve.command`: the ``fleetlet preview|approve|deny`` commands;
- :mod:`agent.approve.summary`: what the status document carries of the requests;
- :mod:`agent.approve.admission`: the ValidatingAdmissionPolicy and roles that make the API
  server enforce who decides (installed with the agent).
"""

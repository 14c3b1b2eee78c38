"""The outputs read back from the cluster after a run, as the agent publishes them.

Part of :mod:`agent.api.models`; written by :mod:`agent.report.outputs`.
"""

# api_field() returns a dataclasses.field() (with our metadata); ruff cannot tell.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from agent.api.models._patterns import DNS_LABEL, DNS_LABEL_TEXT, OUTPUT_NAME, RUN_ID
from agent.api.models._references import SecretKeyReference
from agent.api.validation import ApiObject, Rule, api_field

# --- outputs -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputValue(ApiObject):
    """One output: its value as text, or (sensitive) a reference to the Secret key holding it."""

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.value) != has(self.secretRef)",
            expected="exactly one of value or secretRef",
            check=lambda o: (o.value is None) != (o.secret_ref is None),
        ),
        Rule(
            cel="self.sensitive == has(self.secretRef)",
            expected="secretRef for a sensitive output and value for the others",
            check=lambda o: o.sensitive == (o.secret_ref is not None),
            field="sensitive",
        ),
    )

    name: str = api_field(
        "Name of the output (as declared in the bundle).",
        pattern=OUTPUT_NAME,
        max_length=63,
        expected="an output name",
    )
    sensitive: bool = api_field("Whether the value is kept only in a Secret.", default=False)
    value: str | None = api_field(
        "The value (non-sensitive outputs).", default=None, max_length=32768
    )
    secret_ref: SecretKeyReference | None = api_field(
        "Where the value is (sensitive outputs): a Secret key in the agent's namespace.",
        default=None,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleOutputsSpec(ApiObject):
    """The outputs of a bundle's latest successful run. Written by the agent only."""

    bundle_deployment: str = api_field(
        "Name of the BundleDeployment (also the name of this object).",
        pattern=DNS_LABEL,
        expected=DNS_LABEL_TEXT,
        max_length=63,
    )
    run_id: str = api_field(
        "The run the values come from.", pattern=RUN_ID, max_length=128, expected="a run id"
    )
    serial: int = api_field("Serial of the set that run applied.", minimum=1)
    updated_at: datetime = api_field("When the values were read.")
    outputs: tuple[OutputValue, ...] = api_field(
        "The outputs, by name.", default=(), max_items=64, list_type="map", list_keys=("name",)
    )

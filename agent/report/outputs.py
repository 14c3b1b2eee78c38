"""A bundle's outputs: values read from the cluster after each successful run (Porter-style).

Three steps, in this order, after a run succeeded:

1. :func:`read_outputs` reads every declared output (``name``, object, ``fieldPath``,
   ``sensitive``) from the live objects, as the bundle's identity. Strings are taken as they
   are, other values as canonical JSON (RFC 8785); a field of a Secret's ``data`` (or
   ``stringData``, which the API server stores in ``data``) is base64-decoded and must be UTF-8
   text. Every output is read before anything is reported: one :class:`OutputError` names each
   output that failed, its object and field, and why.

   Two rules hold whatever the bundle declares. An output read from a **Secret is sensitive,
   always**: it is treated as ``sensitive: true`` even when declared otherwise (forced rather
   than refused, so a declaration cannot leak a Secret and a harmless one does not fail a run
   that already succeeded; any field of a Secret may hold its data, the
   ``last-applied-configuration`` annotation for one). And a bundle reads **only what it may
   see**: as its ServiceAccount, what the API server lets that account read; without one (as
   the agent itself), only objects the bundle applied (labelled ``fleetlet.io/bundle=<bundle>``),
   never the agent's own state, another bundle's objects or their outputs.
2. :meth:`OutputsWriter.write` keeps the cluster's view in sync with that run: the bundle's
   cluster-scoped ``BundleOutputs`` object (named like the bundle) holds the non-sensitive
   values in clear and, for sensitive ones, a ``secretRef`` to a key of ONE Secret per bundle in
   the agent's namespace (``fleetlet-outputs-<bundle>``, type ``fleetlet.io/outputs``, labelled
   ``fleetlet.io/outputs-of=<bundle>``), whose key is the output's name. Both are written whole
   by server-side apply: an output no longer declared disappears from both.
3. :func:`status_outputs` gives the status document's form (what leaves the cluster):
   non-sensitive values in clear, sensitive ones sealed to the hub's public key or ``omitted``
   when the agent has none. A clear sensitive value never leaves the cluster, and a sealed one
   is bound to its cluster, bundle, output name and run, and signed by the agent's sealing key
   when it has one (:mod:`agent.report.seal`).

Values hold at most :data:`MAX_VALUE_BYTES` (UTF-8) each and :data:`MAX_TOTAL_BYTES` together:
they must fit the ``BundleOutputs`` schema, a Secret and the bounded status document.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import nacl.public
import rfc8785

from agent.api.models import (
    GROUP_VERSION,
    BundleOutputsSpec,
    Output,
    SecretKeyReference,
)
from agent.api.models import OutputValue as BundleOutputValue
from agent.api.status import OutputValue as StatusOutputValue
from agent.api.validation import from_dict, to_dict
from agent.errors import PermanentError, ValidationError
from agent.health.checks import MISSING, field_value
from agent.kube import (
    STATE_FIELD_MANAGER,
    ApiNotServedError,
    ConflictError,
    ForbiddenError,
    KubeApiError,
    KubeClient,
    Object,
    ObjectRef,
)
from agent.render.plain import BUNDLE_LABEL
from agent.report.bundles import MANAGED_LABEL
from agent.report.logs import mask
from agent.report.seal import OutputPlace, sensitive_output

KIND = "BundleOutputs"
SECRET_PREFIX = "fleetlet-outputs-"
SECRET_TYPE = "fleetlet.io/outputs"
OUTPUTS_OF_LABEL = "fleetlet.io/outputs-of"
MAX_VALUE_BYTES = 32768
"""Per value: the ``value`` bound of the BundleOutputs and status schemas (characters; UTF-8
bytes are never fewer), and it still fits a sealed box under the status schema's bound."""
MAX_TOTAL_BYTES = 128 * 1024
"""All values of one bundle together: one bundle's outputs must not crowd the others out of
the status document (256 KiB), nor approach an object's size limit in the cluster."""

# A path into a Secret's data: ``.data...``, ``.stringData...`` or the quoted forms.
_SECRET_DATA = re.compile(r"\A(?:\.(?:data|stringData)|\['(?:data|stringData)'\])(?=\.|\[|\Z)")


@dataclass(frozen=True, slots=True)
class ReadOutput:
    """One output's value as read from the cluster, before it is written anywhere.

    ``repr`` never shows the value of a sensitive output (it may end up in a log).
    """

    name: str
    value: str
    sensitive: bool = False

    def __repr__(self) -> str:
        shown = "<hidden>" if self.sensitive else repr(self.value)
        return f"ReadOutput(name={self.name!r}, value={shown}, sensitive={self.sensitive})"


@dataclass(frozen=True, slots=True)
class OutputFailure:
    """Why one output could not be read: its name, its object (``Kind ns/name``), the field
    path and what was wrong. Never contains the value."""

    output: str
    target: str
    field_path: str
    problem: str

    def __str__(self) -> str:
        return f"output {self.output} ({self.target} {self.field_path}): {self.problem}"


class OutputError(PermanentError):
    """Declared outputs could not be read; ``failures`` names every one, not only the first."""

    reason = "OutputFailed"

    def __init__(self, failures: Sequence[OutputFailure]) -> None:
        self.failures = tuple(failures)
        count = len(self.failures)
        head = "1 output cannot be read" if count == 1 else f"{count} outputs cannot be read"
        super().__init__(f"{head}: " + "; ".join(str(f) for f in self.failures))


class _Problem(Exception):
    """What is wrong with one output (internal: becomes an OutputFailure)."""


def _target(kind: str, name: str, namespace: str | None) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def _is_secret(api_version: str, kind: str) -> bool:
    return api_version == "v1" and kind == "Secret"


def render_value(value: Any) -> str:
    """A field's value as text: strings as they are, anything else as canonical JSON
    (RFC 8785: ``42``, ``true``, ``null``, ``["a","b"]``, ``{"a":1,"b":2}``).

    Raises ValueError when the value has no canonical JSON form (an integer beyond 2**53, a
    non-finite number).
    """
    if isinstance(value, str):
        return value
    try:
        return rfc8785.dumps(value).decode("utf-8")
    except (rfc8785.CanonicalizationError, TypeError, UnicodeError) as exc:
        raise ValueError(f"the value has no canonical JSON form ({exc})") from exc


def decode_secret_value(encoded: Any) -> str:
    """A Secret ``data`` value (base64) as UTF-8 text.

    Raises ValueError when it is not a base64 string or the bytes are not UTF-8 text (never
    showing the bytes: they are secret).
    """
    if not isinstance(encoded, str):
        raise ValueError("the Secret value is not a base64 string")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("the Secret value is not valid base64") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"the Secret value is {len(raw)} bytes of binary data, not UTF-8 text "
            f"(first invalid byte at offset {exc.start}); outputs are text"
        ) from exc


def output_text(obj: Mapping[str, Any], output: Output) -> str:
    """The text of ``output`` read from ``obj``, the live object it names.

    For a Secret a path into ``data`` (or ``stringData``) reads the base64-decoded value; a
    path to the whole ``data`` gives a JSON object of the decoded values.

    Raises OutputError (one failure naming the output) when the field is missing, a Secret
    value is not base64 UTF-8 text, the value has no canonical JSON form or exceeds
    :data:`MAX_VALUE_BYTES`.
    """
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    ref = output.object
    target = _target(ref.kind, ref.name, namespace if isinstance(namespace, str) else None)
    try:
        return _text(obj, output)
    except _Problem as exc:
        raise OutputError(
            [OutputFailure(output.name, target, output.field_path, str(exc))]
        ) from None


def _text(obj: Mapping[str, Any], output: Output) -> str:
    path = output.field_path
    secret = _is_secret(output.object.api_version, output.object.kind)
    match = _SECRET_DATA.match(path) if secret else None
    if match:
        # stringData is write-only: the API server stores (and returns) it in data.
        path = ".data" + path[match.end() :]
    try:
        value = field_value(obj, path)
    except ValueError as exc:
        raise _Problem(str(exc)) from None
    if value is MISSING:
        raise _Problem("no such field")
    try:
        if match and path == ".data":
            if not isinstance(value, Mapping):
                raise ValueError("the Secret's data is not an object")
            text = render_value({k: decode_secret_value(v) for k, v in value.items()})
        elif match:
            text = decode_secret_value(value)
        else:
            text = render_value(value)
    except ValueError as exc:
        raise _Problem(str(exc)) from None
    size = len(text.encode("utf-8"))
    if size > MAX_VALUE_BYTES:
        raise _Problem(f"the value is {size} bytes; an output holds at most {MAX_VALUE_BYTES}")
    return text


def read_outputs(
    kube: KubeClient,
    outputs: Sequence[Output],
    *,
    default_namespace: str | None,
    owner: str | None = None,
) -> list[ReadOutput]:
    """Read every output in ``outputs`` (in order) from the cluster through ``kube`` (the
    bundle's identity). An object named without a namespace, of a namespaced kind, is looked
    up in ``default_namespace`` (the bundle's target namespace). Each object is fetched once
    however many outputs read it. With ``owner`` (a bundle read as the agent itself, without
    a ServiceAccount of its own) only objects that bundle applied may be read. An output read
    from a Secret is sensitive, whatever it declares.

    Raises OutputError naming every output that failed (object missing, field missing, read
    forbidden, not the owner's object, API not served, no namespace, a value not text or too
    large, the values together over :data:`MAX_TOTAL_BYTES`); ApiUnavailableError (temporary)
    when the API server cannot answer.
    """
    fetched: dict[ObjectRef, Object | str | None] = {}
    failures: list[OutputFailure] = []
    values: list[ReadOutput] = []
    total = 0
    for output in outputs:
        ref = output.object
        target = _target(ref.kind, ref.name, ref.namespace or default_namespace)
        try:
            located = _locate(kube, output, default_namespace)
            target = _target(ref.kind, ref.name, located.namespace)
            if located not in fetched:
                fetched[located] = _fetch(kube, located)
            obj = fetched[located]
            if isinstance(obj, str):
                raise _Problem(obj)
            if obj is None:
                raise _Problem("the object does not exist")
            if owner is not None:
                _check_owner(obj, owner)
            text = _text(obj, output)
        except _Problem as exc:
            failures.append(OutputFailure(output.name, target, output.field_path, str(exc)))
            continue
        total += len(text.encode("utf-8"))
        if total > MAX_TOTAL_BYTES:
            failures.append(
                OutputFailure(
                    output.name,
                    target,
                    output.field_path,
                    f"the outputs together exceed {MAX_TOTAL_BYTES} bytes ({total} with this one)",
                )
            )
            continue
        sensitive = output.sensitive or _is_secret(ref.api_version, ref.kind)
        if sensitive:
            mask(text)  # read into this process: never in a log line from now on
        values.append(ReadOutput(output.name, text, sensitive))
    if failures:
        raise OutputError(failures)
    return values


def _check_owner(obj: Object, owner: str) -> None:
    """Raise _Problem unless ``obj`` is one the bundle ``owner`` applied."""
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    found = labels.get(BUNDLE_LABEL) if isinstance(labels, Mapping) else None
    if found != owner:
        raise _Problem(
            f"bundle {owner} did not apply it ({BUNDLE_LABEL}={found or '(none)'}): a bundle "
            "without a ServiceAccount reads only its own objects; name one that may read it"
        )


def _locate(kube: KubeClient, output: Output, default_namespace: str | None) -> ObjectRef:
    """The object ``output`` names, with its namespace settled. Raises _Problem."""
    ref = output.object
    try:
        namespaced = kube.is_namespaced(ref.api_version, ref.kind)
    except KubeApiError as exc:
        raise _Problem(_refusal(exc, ObjectRef.of(ref))) from None
    if not namespaced:
        return ObjectRef(ref.api_version, ref.kind, ref.name)
    namespace = ref.namespace or default_namespace
    if not namespace:
        raise _Problem(
            f"{ref.kind} is namespaced: name a namespace (the bundle has no target namespace)"
        )
    return ObjectRef(ref.api_version, ref.kind, ref.name, namespace)


def _fetch(kube: KubeClient, ref: ObjectRef) -> Object | str | None:
    """The live object, None when missing, or what went wrong (kept: other outputs may read
    the same object). ApiUnavailableError propagates."""
    try:
        return kube.get(ref)
    except KubeApiError as exc:
        return _refusal(exc, ref)


def _refusal(exc: KubeApiError, ref: ObjectRef) -> str:
    if isinstance(exc, ForbiddenError):
        return f"reading it is forbidden: {exc.server_message}"
    if isinstance(exc, ApiNotServedError):
        return f"the API server does not serve kind {ref.kind} in {ref.api_version}"
    return f"the API server refused to read it ({exc.reason}): {exc.server_message}"


# --- in the cluster: BundleOutputs and the Secret of sensitive values ----------------------


def secret_name(bundle: str) -> str:
    """The Secret of the agent's namespace holding ``bundle``'s sensitive output values."""
    return SECRET_PREFIX + bundle


class OutputsWriter:
    """Writes each bundle's ``BundleOutputs`` (cluster-scoped, named like the bundle) and the
    Secret of its sensitive values in ``agent_namespace``, as field manager ``fleetlet``.

    The agent is the only writer: each write states the whole desired content and takes over
    anything another manager changed. Content the agent no longer declares is removed, also
    when another manager co-owns it (the object is then re-created).
    """

    def __init__(self, *, kube: KubeClient, agent_namespace: str) -> None:
        self.kube = kube
        self.agent_namespace = agent_namespace

    def _outputs_ref(self, bundle: str) -> ObjectRef:
        return ObjectRef(GROUP_VERSION, KIND, bundle)

    def _secret_ref(self, bundle: str) -> ObjectRef:
        return ObjectRef("v1", "Secret", secret_name(bundle), self.agent_namespace)

    def write(
        self,
        *,
        bundle: str,
        run_id: str,
        serial: int,
        values: Sequence[ReadOutput],
        now: datetime,
    ) -> None:
        """Make ``bundle``'s BundleOutputs and Secret hold exactly ``values`` (from run
        ``run_id`` of set ``serial``, read at ``now``). The Secret is written first, so the
        BundleOutputs never references a key it does not hold yet; with no sensitive value it
        is deleted. With no value at all both are deleted (a bundle without outputs has no
        BundleOutputs).

        Raises ValidationError (a bad bundle name, run id or serial, duplicate output names:
        nothing is written), ApiNotServedError (the BundleOutputs CRD is not installed),
        ForbiddenError, InvalidError, ConflictError, ApiUnavailableError.
        """
        if not values:
            self.delete(bundle)
            return
        name = secret_name(bundle)
        spec = BundleOutputsSpec(
            bundle_deployment=bundle,
            run_id=run_id,
            serial=serial,
            updated_at=now,
            outputs=tuple(
                BundleOutputValue(
                    name=v.name,
                    sensitive=True,
                    secret_ref=SecretKeyReference(name=name, key=v.name),
                )
                if v.sensitive
                else BundleOutputValue(name=v.name, value=v.value)
                for v in values
            ),
        )
        secret = {
            v.name: base64.b64encode(v.value.encode("utf-8")).decode("ascii")
            for v in values
            if v.sensitive
        }
        if secret:
            self._apply_exactly(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": name,
                        "namespace": self.agent_namespace,
                        "labels": {
                            OUTPUTS_OF_LABEL: bundle,
                            "app.kubernetes.io/name": "fleetlet",
                        },
                    },
                    "type": SECRET_TYPE,
                    "data": secret,
                },
                lambda live: dict(live.get("data") or {}) == secret,
            )
        else:
            self.kube.delete(self._secret_ref(bundle))
        expected = _normal(from_dict(BundleOutputsSpec, to_dict(spec)))  # as stored
        self._apply_exactly(
            {
                "apiVersion": GROUP_VERSION,
                "kind": KIND,
                "metadata": {
                    "name": bundle,
                    "labels": {MANAGED_LABEL: self.agent_namespace, OUTPUTS_OF_LABEL: bundle},
                },
                "spec": to_dict(spec),
            },
            lambda live: _spec_of(live) == expected,
        )

    def _apply_exactly(self, body: Mapping[str, Any], exact: Callable[[Object], bool]) -> None:
        """Apply ``body`` (forced); when the object then still holds content another manager
        co-owns (server-side apply keeps a field some other manager also owns), delete that
        very object and apply again. ``exact(live)`` tells whether the object is as desired."""
        live = self.kube.apply(body, field_manager=STATE_FIELD_MANAGER, force=True)
        if exact(live):
            return
        uid = (live.get("metadata") or {}).get("uid")
        # ConflictError: replaced meanwhile (another uid); the apply below settles it.
        with contextlib.suppress(ConflictError):
            self.kube.delete(body, uid=uid if isinstance(uid, str) else None)
        self.kube.apply(body, field_manager=STATE_FIELD_MANAGER, force=True)

    def read(self, bundle: str) -> BundleOutputsSpec | None:
        """The BundleOutputs spec of ``bundle`` as in the cluster, None when there is none.

        Raises ValidationError when the object does not follow the schema, the KubeClient's
        errors.
        """
        live = self.kube.get(self._outputs_ref(bundle))
        if live is None:
            return None
        return from_dict(
            BundleOutputsSpec, live.get("spec"), origin=f"{KIND} {bundle}", path="spec"
        )

    def delete(self, bundle: str) -> None:
        """Remove ``bundle``'s BundleOutputs and its Secret (a bundle removed from the set, or
        declaring no output any more); nothing to do when they are gone.

        Raises ForbiddenError, ApiUnavailableError, and ApiNotServedError when the
        BundleOutputs CRD is not installed.
        """
        self.kube.delete(self._outputs_ref(bundle))
        self.kube.delete(self._secret_ref(bundle))


def _normal(spec: BundleOutputsSpec) -> BundleOutputsSpec:
    """``spec`` with its outputs by name (their order in the object does not matter)."""
    return replace(spec, outputs=tuple(sorted(spec.outputs, key=lambda o: o.name)))


def _spec_of(live: Mapping[str, Any]) -> BundleOutputsSpec | None:
    """The live object's spec, normalised; None when it does not follow the schema."""
    try:
        return _normal(from_dict(BundleOutputsSpec, live.get("spec")))
    except ValidationError:
        return None


# --- leaving the cluster: the status document ---------------------------------------------


def status_outputs(
    values: Sequence[ReadOutput],
    *,
    hub_key: nacl.public.PublicKey | None,
    cluster: str,
    bundle: str,
    run_id: str,
    sealing_key: nacl.public.PrivateKey | None = None,
) -> tuple[StatusOutputValue, ...]:
    """The status document's form of ``values`` (run ``run_id`` of ``bundle`` on
    ``cluster``): non-sensitive values in clear, sensitive ones sealed to ``hub_key`` for
    their place (by the agent's ``sealing_key``), or ``omitted`` when ``hub_key`` is None."""
    return tuple(
        sensitive_output(
            v.value,
            hub_key,
            place=OutputPlace(cluster=cluster, bundle=bundle, output=v.name, run=run_id),
            sender=sealing_key,
        )
        if v.sensitive
        else StatusOutputValue(name=v.name, value=v.value)
        for v in values
    )


__all__ = [
    "KIND",
    "MAX_TOTAL_BYTES",
    "MAX_VALUE_BYTES",
    "OUTPUTS_OF_LABEL",
    "SECRET_PREFIX",
    "SECRET_TYPE",
    "OutputError",
    "OutputFailure",
    "OutputsWriter",
    "ReadOutput",
    "decode_secret_value",
    "output_text",
    "read_outputs",
    "render_value",
    "secret_name",
    "status_outputs",
]


class OutputsStage:
    """The outputs step of a run, as the reconciler calls it: read (as the bundle's
    identity), write to the cluster (as the agent), give the status document's form."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        agent_namespace: str,
        cluster: str,
        hub_key: nacl.public.PublicKey | None,
        sealing_key: nacl.public.PrivateKey | None = None,
        settle: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``cluster`` and ``sealing_key`` (the agent's own, see :mod:`agent.report.seal`)
        bind and sign what is sealed to ``hub_key``. ``settle``: how long to keep re-reading
        outputs that cannot be read yet. Healthy does not mean every field is filled: a
        service-account token, a load balancer's address are written by controllers a moment
        later."""
        self.writer = OutputsWriter(kube=kube, agent_namespace=agent_namespace)
        self.cluster = cluster
        self.hub_key = hub_key
        self.sealing_key = sealing_key
        self.settle = settle
        self.sleep = sleep

    def collect(
        self,
        *,
        bundle: str,
        outputs: Sequence[Output],
        reader: KubeClient,
        default_namespace: str | None,
        run_id: str,
        serial: int,
        now: datetime,
    ) -> tuple[StatusOutputValue, ...]:
        """After a successful run: read ``outputs`` with ``reader`` and keep the cluster's
        BundleOutputs in sync (none declared: any left from before are deleted). A ``reader``
        that is the agent itself (the bundle names no ServiceAccount) reads only objects the
        bundle applied.

        Raises OutputError (naming every output that failed, after ``settle`` seconds of
        retries), ApiUnavailableError, the KubeClient's errors of the writes.
        """
        as_itself = reader.impersonate == self.writer.kube.impersonate
        owner = bundle if as_itself else None
        deadline = time.monotonic() + self.settle
        while True:
            try:
                values = read_outputs(
                    reader, outputs, default_namespace=default_namespace, owner=owner
                )
                break
            except OutputError:
                if time.monotonic() >= deadline:
                    raise
                self.sleep(0.5)
        self.writer.write(bundle=bundle, run_id=run_id, serial=serial, values=values, now=now)
        return status_outputs(
            values,
            hub_key=self.hub_key,
            cluster=self.cluster,
            bundle=bundle,
            run_id=run_id,
            sealing_key=self.sealing_key,
        )

    def forget(self, bundle: str) -> None:
        """A bundle left the set: delete its BundleOutputs and Secret."""
        self.writer.delete(bundle)

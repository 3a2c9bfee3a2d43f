"""The Envoy ext_proc v3 wire: ``ProcessingRequest`` in as a typed ``Message``, ``ProcessingResponse``
messages out. The only module that touches the generated protobuf classes (PyPI ``xds-protos``,
generated from envoyproxy/data-plane-api; ``grpcio`` for the service stubs).

Messages and fields (``envoy/service/ext_proc/v3/external_processor.proto``):

- ``ProcessingRequest``: one of ``request_headers`` / ``response_headers`` (``HttpHeaders``:
  ``headers.headers[]`` of ``HeaderValue{key, value, raw_value}``, lower-case keys, Envoy fills
  ``raw_value``; ``end_of_stream``), ``request_body`` / ``response_body`` (``HttpBody{body,
  end_of_stream}``), ``request_trailers`` / ``response_trailers``; ``metadata_context``
  (``filter_metadata``: namespace -> ``Struct``) and, in the first message, ``protocol_config``
  (the filter's ``request_body_mode`` / ``response_body_mode``).
- ``ProcessingResponse``: one of ``request_headers`` / ``response_headers`` (``HeadersResponse``),
  ``request_body`` / ``response_body`` (``BodyResponse``), ``*_trailers`` (``TrailersResponse``),
  ``immediate_response`` (``ImmediateResponse{status.code, headers, body, details}``); plus
  ``dynamic_metadata`` (a ``Struct`` whose top-level keys are namespaces). A headers or body
  response carries a ``CommonResponse{header_mutation{set_headers[], remove_headers[]},
  body_mutation{body | streamed_response{body, end_of_stream}}, clear_route_cache}``.

Gateway API Inference Extension names read and written here (its endpoint picker protocol,
``docs/proposals/004-endpoint-picker-protocol``): the subset hint
``filter_metadata["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"]`` (a list of
``ip:port``, or one comma-separated string; an entry without a port means every port of that IP)
and the served endpoint ``filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]``.

The proxy's side is here too (``headers_request``, ``body_request``, ``stub``, ``as_dict``): the
tests and ``scripts/bench_ext_proc.py`` drive the server with the messages Envoy sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format, struct_pb2

#: Namespaces and keys of the endpoint picker protocol.
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
DESTINATION_KEY = "x-gateway-destination-endpoint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"

Kind = Literal["request_headers", "request_body", "request_trailers", "response_headers", "response_body",
               "response_trailers", "none"]
Phase = Literal["request", "response"]
#: Body send modes (``ProcessingMode.BodySendMode``) by name.
BodyMode = Literal["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED", "GRPC"]
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
#: Largest body chunk sent back in one streamed response, bytes: the reference endpoint picker uses
#: 62,000 because some proxies limit a gRPC message to 64 KiB (GAIE ``pkg/common/envoy/chunking.go``).
MAX_CHUNK_BYTES = 62_000


@dataclass(frozen=True)
class Message:
    """One ``ProcessingRequest``, read: its ``kind``; ``headers`` (lower-case name -> value, for the
    two headers kinds); ``body`` bytes; ``end_of_stream``; the proxy's ``subset`` hint (``None``
    when absent, else its ``ip:port``/``ip`` entries) and ``served`` endpoint (``ip:port``) from
    the metadata; the body modes of ``protocol_config`` (None when the message carries none)."""

    kind: Kind
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    end_of_stream: bool = False
    subset: tuple[str, ...] | None = None
    served: str | None = None
    request_body_mode: BodyMode | None = None
    response_body_mode: BodyMode | None = None


def _header_map(http_headers: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in getattr(getattr(http_headers, "headers", None), "headers", ()):
        raw = h.raw_value
        out[str(h.key).lower()] = raw.decode("utf-8", "replace") if raw else str(h.value)
    return out


def _entries(struct: object, key: str) -> tuple[str, ...] | None:
    """Subset entries from the ``key`` of a metadata ``Struct``: a list of strings (other items ignored), or
    one comma-separated string; None when the key is absent (read from the ``Value`` directly, not through
    ``json_format``: half the time)."""
    fields = struct.fields  # type: ignore[attr-defined]  # a protobuf Struct
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        items = [value.string_value]
    elif kind == "list_value":
        items = [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    else:
        return ()
    return tuple(p.strip() for item in items for p in item.split(",") if p.strip())


def read(request: object) -> Message:
    """The ``Message`` of a ``ProcessingRequest``."""
    kind: Kind = request.WhichOneof("request") or "none"  # type: ignore[attr-defined]  # a protobuf message
    subset: tuple[str, ...] | None = None
    served = None
    meta = request.metadata_context.filter_metadata  # type: ignore[attr-defined]
    if SUBSET_NAMESPACE in meta:
        subset = _entries(meta[SUBSET_NAMESPACE], SUBSET_KEY)
    if LB_NAMESPACE in meta:
        served = (_entries(meta[LB_NAMESPACE], SERVED_KEY) or (None,))[0]
    modes: tuple[BodyMode | None, BodyMode | None] = (None, None)
    if request.HasField("protocol_config"):  # type: ignore[attr-defined]
        cfg = request.protocol_config  # type: ignore[attr-defined]
        name = processing_mode_pb2.ProcessingMode.BodySendMode.Name
        modes = (name(cfg.request_body_mode), name(cfg.response_body_mode))
    headers: dict[str, str] = {}
    body, eos = b"", False
    if kind in ("request_headers", "response_headers"):
        part = getattr(request, kind)
        headers, eos = _header_map(part), bool(part.end_of_stream)
    elif kind in ("request_body", "response_body"):
        part = getattr(request, kind)
        body, eos = bytes(part.body), bool(part.end_of_stream)
    elif kind in ("request_trailers", "response_trailers"):
        eos = True
    return Message(kind, headers, body, eos, subset, served, modes[0], modes[1])


# -- responses ------------------------------------------------------------------------------------

def _mutation(set_headers: Mapping[str, str], remove: Sequence[str]) -> object:
    return pb.HeaderMutation(
        set_headers=[base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                                                append_action=_OVERWRITE) for k, v in set_headers.items()],
        remove_headers=list(remove))


def _metadata(values: Mapping[str, Mapping[str, str]] | None) -> object | None:
    if not values:
        return None
    s = struct_pb2.Struct()
    s.update({ns: dict(kv) for ns, kv in values.items()})
    return s


def headers_response(phase: Phase, set_headers: Mapping[str, str] | None = None,
                     remove: Sequence[str] = (), *, clear_route_cache: bool = False,
                     metadata: Mapping[str, Mapping[str, str]] | None = None) -> object:
    """A ``ProcessingResponse`` answering the ``phase``'s headers: header mutations, ``clear_route_cache``
    (Envoy re-matches the route on the mutated headers) and ``dynamic_metadata`` (namespace -> key -> value)."""
    common = pb.CommonResponse(header_mutation=_mutation(set_headers or {}, remove), clear_route_cache=clear_route_cache)
    return pb.ProcessingResponse(**{f"{phase}_headers": pb.HeadersResponse(response=common)},
                                 dynamic_metadata=_metadata(metadata))


def streamed_body(phase: Phase, body: bytes, end_of_stream: bool) -> list[object]:
    """``ProcessingResponse`` messages sending ``body`` back in FULL_DUPLEX_STREAMED mode: chunks of at most
    ``MAX_CHUNK_BYTES`` (at least one), ``end_of_stream`` on the last."""
    chunks = [body[i:i + MAX_CHUNK_BYTES] for i in range(0, len(body), MAX_CHUNK_BYTES)] or [b""]
    out: list[object] = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        mutation = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream and last))
        common = pb.CommonResponse(body_mutation=mutation)
        out.append(pb.ProcessingResponse(**{f"{phase}_body": pb.BodyResponse(response=common)}))
    return out


def body_response(phase: Phase, body: bytes | None = None,
                  set_headers: Mapping[str, str] | None = None, remove: Sequence[str] = (), *,
                  clear_route_cache: bool = False, metadata: Mapping[str, Mapping[str, str]] | None = None) -> object:
    """A ``ProcessingResponse`` answering one body message (BUFFERED or STREAMED modes): the body replaced
    when ``body`` is given, header mutations (honoured in BUFFERED mode), ``clear_route_cache``, metadata."""
    common = pb.CommonResponse(header_mutation=_mutation(set_headers or {}, remove), clear_route_cache=clear_route_cache,
                               body_mutation=None if body is None else pb.BodyMutation(body=body))
    return pb.ProcessingResponse(**{f"{phase}_body": pb.BodyResponse(response=common)}, dynamic_metadata=_metadata(metadata))


def trailers_response(phase: Phase) -> object:
    """A ``ProcessingResponse`` letting the ``phase``'s trailers through unchanged."""
    return pb.ProcessingResponse(**{f"{phase}_trailers": pb.TrailersResponse()})


def immediate_response(status: int, body: bytes, headers: Mapping[str, str] | None = None, details: str = "") -> object:
    """A ``ProcessingResponse`` that answers the client at once with HTTP ``status`` and ``body``
    (Envoy sends it; the upstream is never called); ``details`` goes to ``%RESPONSE_CODE_DETAILS%``."""
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), headers=_mutation(headers or {}, ()), body=body, details=details))


# -- the proxy's side (tests and scripts/bench_ext_proc.py drive the server with these) ------------

def _struct_metadata(metadata: Mapping[str, Mapping[str, object]] | None) -> object:
    meta = base_pb2.Metadata()
    for ns, values in (metadata or {}).items():
        meta.filter_metadata[ns].update(dict(values))
    return meta


def headers_request(phase: Phase, headers: Mapping[str, str], end_of_stream: bool = False, *,
                    metadata: Mapping[str, Mapping[str, object]] | None = None,
                    body_modes: tuple[BodyMode, BodyMode] | None = None) -> object:
    """The ``ProcessingRequest`` Envoy sends for the ``phase``'s headers (values in ``raw_value``, as
    Envoy does), with ``metadata_context.filter_metadata`` and, for the first message of a stream,
    ``protocol_config`` (request and response body modes)."""
    hmap = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()])
    cfg = None
    if body_modes is not None:
        mode = processing_mode_pb2.ProcessingMode.BodySendMode.Value
        cfg = pb.ProtocolConfiguration(request_body_mode=mode(body_modes[0]), response_body_mode=mode(body_modes[1]))
    return pb.ProcessingRequest(**{f"{phase}_headers": pb.HttpHeaders(headers=hmap, end_of_stream=end_of_stream)},
                                metadata_context=_struct_metadata(metadata), protocol_config=cfg)


def body_request(phase: Phase, body: bytes, end_of_stream: bool, *,
                 metadata: Mapping[str, Mapping[str, object]] | None = None) -> object:
    """The ``ProcessingRequest`` Envoy sends for one chunk of the ``phase``'s body."""
    return pb.ProcessingRequest(**{f"{phase}_body": pb.HttpBody(body=body, end_of_stream=end_of_stream)},
                                metadata_context=_struct_metadata(metadata))


def as_dict(response: object) -> dict[str, object]:
    """A ``ProcessingResponse`` as JSON-like data (protobuf's JSON mapping: camelCase field names,
    bytes in base64), for tests and logs."""
    out: dict[str, object] = json_format.MessageToDict(response)  # type: ignore[arg-type]  # a protobuf message
    return out


def add_servicer(servicer: object, server: object) -> None:
    """Register ``servicer`` (an object with the ``Process`` stream handler) as ``ExternalProcessor`` on a gRPC server."""
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(servicer, server)


def stub(channel: object) -> object:
    """An ``ExternalProcessor`` client stub on a gRPC channel (what Envoy is to the server)."""
    return external_processor_pb2_grpc.ExternalProcessorStub(channel)

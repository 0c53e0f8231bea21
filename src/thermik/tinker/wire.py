"""The Tinker wire format: protobuf bodies (the SDK's own `tinker_public.proto` messages), zstd, tinker:// paths.

Requests: `/forward_backward` sends a `ForwardBackwardRequest` protobuf, optionally zstd-compressed
(`Content-Encoding: zstd`). Responses of `retrieve_future` for `ForwardBackwardOutput` and `SampleResponse` go back
as protobuf (the SDK asks with `Accept: application/x-protobuf` and accepts nothing else for those two types).
Tensors travel as raw little-endian bytes: tokens int32, logprobs float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import zstandard
from tinker.proto import tinker_public_pb2 as pb

PROTO = "application/x-protobuf"
MAX_BODY_BYTES = 512 * 1024 * 1024

_NUMPY = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
_STOP = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


class WireError(ValueError):
    """A request body that does not follow the schema; answered with HTTP 400."""


@dataclass(frozen=True)
class Datum:
    """One training example: input tokens [T] and the loss inputs, each a flat array of length T."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class FwdBwdRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    forward_only: bool
    data: list[Datum]
    config: dict[str, float | str] = field(default_factory=dict)


def decode_body(body: bytes, encoding: str) -> bytes:
    """The request body with its `Content-Encoding` (identity or zstd) undone."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise WireError(f"unsupported Content-Encoding {encoding!r}; this server accepts zstd or none")
    try:
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_BODY_BYTES)
    except zstandard.ZstdError as e:
        raise WireError(f"the zstd body could not be decompressed: {e}") from e


def tensor_to_numpy(msg: pb.Tensor) -> np.ndarray:
    """A proto `Tensor` (dense, or sparse CSR as the SDK sends 2-D torch inputs) as a dense numpy array."""
    if msg.dtype not in _NUMPY:
        raise WireError(f"unsupported tensor dtype {msg.dtype}")
    dtype, shape = _NUMPY[msg.dtype], tuple(msg.shape)
    if not msg.HasField("sparse_csr"):
        arr = np.frombuffer(msg.dense, dtype=dtype)
        return arr.reshape(shape) if shape else arr
    if len(shape) != 2:
        raise WireError(f"a sparse CSR tensor must be 2-D, got shape {list(shape)}")
    csr = msg.sparse_csr
    dense = np.zeros(shape, dtype=dtype)
    crow, col = np.frombuffer(csr.crow_indices, np.int64), np.frombuffer(csr.col_indices, np.int64)
    values = np.frombuffer(csr.values, dtype=dtype)
    for row in range(shape[0]):
        dense[row, col[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
    return dense


def _datum(msg: pb.Datum, index: int) -> Datum:
    pieces = []
    for chunk in msg.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise WireError(f"datum {index}: only encoded_text chunks are supported (got {chunk.WhichOneof('chunk')})")
        pieces.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    tokens = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)
    inputs = {name: tensor_to_numpy(t) for name, t in msg.loss_fn_inputs.items()}
    return Datum(tokens=tokens, inputs=inputs)


def parse_forward_backward(body: bytes) -> FwdBwdRequest:
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf raises its own DecodeError
        raise WireError(f"the body is not a ForwardBackwardRequest protobuf: {e}") from e
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = [_datum(d, i) for i, d in enumerate(msg.data)]
    return FwdBwdRequest(msg.model_id, int(msg.seq_id), msg.loss_fn, bool(msg.forward_only), data, config)


def _batched(arrays: list[np.ndarray], dtype: int) -> pb.BatchedTensor:
    itemsize = np.dtype(_NUMPY[dtype]).itemsize
    offsets = np.cumsum([0] + [a.size * itemsize for a in arrays]).astype(np.int64)
    data = b"".join(np.ascontiguousarray(a, dtype=_NUMPY[dtype]).tobytes() for a in arrays)
    return pb.BatchedTensor(data=data, offsets=offsets.tobytes(), dtype=dtype)


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A `ForwardBackwardOutput` protobuf: one `ArrayRecord` holding every datum's float32 outputs."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    if outputs:
        record = msg.loss_fn_outputs.add(num_datums=len(outputs))
        for name in outputs[0]:
            record.fields[name].CopyFrom(_batched([o[name] for o in outputs], pb.DTYPE_FLOAT32))
    return msg.SerializeToString()


@dataclass(frozen=True)
class Sequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def sample_response(sequences: list[Sequence], prompt_logprobs: list[float] | None) -> bytes:
    """A `SampleResponse` protobuf; prompt_logprobs[0] is NaN on the wire for 'no logprob' (the SDK maps it to None)."""
    msg = pb.SampleResponse()
    for seq in sequences:
        msg.sequences.add(
            stop_reason=_STOP[seq.stop_reason],
            tokens=np.asarray(seq.tokens, np.int32).tobytes(),
            logprobs=np.asarray(seq.logprobs, np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    return msg.SerializeToString()


def tinker_path(run_id: str, kind: str, name: str) -> str:
    """`tinker://<run>/weights/<name>` (training state) or `tinker://<run>/sampler_weights/<name>`."""
    return f"tinker://{run_id}/{kind}/{name}"


def parse_tinker_path(path: str) -> tuple[str, str, str]:
    """(run id, kind, name) of a tinker:// path; kind is `weights` or `sampler_weights`."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not all(parts):
        raise WireError(f"invalid checkpoint path {path!r}; expected tinker://<run>/(weights|sampler_weights)/<name>")
    return parts[0], parts[1], parts[2]

"""Where records go. Each backend is one small module; see :mod:`advmon.sinks.base`."""

from advmon.sinks.base import Sink, SinkLike, sink_name
from advmon.sinks.jsonl import JsonlSink, read_jsonl

__all__ = ["JsonlSink", "Sink", "SinkLike", "read_jsonl", "sink_name"]

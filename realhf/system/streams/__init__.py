"""The transports between workers: ZMQ push/pull and request/reply streams, JSON over HTTP."""

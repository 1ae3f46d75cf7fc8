"""The generation-server manager: admission under the staleness rule, routing, server health, weight updates."""

"""One home for a workload's lifecycle: its phases, its allocations' phases, why it waits or stops, the events
that record each step, and the transition functions that are the only way a phase changes.

`phases` and `events` use the standard library only, so the client, the CLI and the wire models import them
without the server; `transitions` works on the store's rows and is the server's."""

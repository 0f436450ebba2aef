"""The simulator: replays clusters through the same core.schedule() the control plane calls."""

"""The live control plane: snapshot → core.schedule() → persist → apply through the backend → reconcile."""

"""Use cases shared by the API (and any other edge): each takes a session and the caller, checks rights,
and returns wire models or raises a ServiceError with a reason."""

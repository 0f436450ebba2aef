"""Wire models: what the API accepts and answers. They depend on pydantic and the lifecycle's enums only, so the
client and the CLI import them without the server; api, services, client and cli all import them from here."""
